//! Dead and frozen engines out of rotation, on the real filter in virtual time: a
//! refused connection takes its worker out on every VM at once, and resets, idle
//! timeouts and the engine's 5xx after a run of 5 in a row, within a cap on the
//! pool's share out (Envoy's outlier detection defaults); a failure after a
//! request the client made unusual (a body the filter cannot read, or over
//! `health.judged_body_bytes`) counts for nothing; the lease-holding VM probes a
//! down worker and a good probe brings it back, later each time it is taken out
//! again; the collector's `reachable: false` takes it out and its reaching the
//! engine again brings it back; a client that hangs up or a 4xx takes nobody out.
//!
//! Issue 14, failure 2: after one of 4 engines died, requests kept going to it (it
//! looked least loaded with nothing in flight). Here it gets none of the next 80.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{Host, RequestSpec};

/// Envoy's response flag bits (`response.flags`).
const UF: u64 = 0x20;
const UC: u64 = 0x40;
const DC: u64 = 0x4000;
const SI: u64 = 0x10000;

const CONNECT_FAILURE: &str = "upstream_reset_before_response_started{connection_failure}";

fn host(vms: usize, extra: &str) -> Host {
    let config = support::fleet_config(
        4,
        &format!(
            r#","stats_token":"tok","stale_after_ms":60000,"sync_interval_ms":1000,
                "overload":{{"probe_interval_ms":1000,"probe_timeout_ms":500}}{extra}"#
        ),
    );
    support::host(&config, vms, 7, &support::fleet_clusters(4))
}

fn stat(h: &Host, name: &str) -> u64 {
    support::stat(h, &format!("llm_router_{name}"))
}

/// Opens a completion of `prompt` on `vm`; returns the chosen cluster and stream.
fn open(h: &mut Host, vm: usize, prompt: &str) -> (String, host_sim::StreamHandle) {
    let spec = RequestSpec::post_json("/v1/completions", support::completion("m", prompt));
    let (cluster, out) = support::open(h, vm, spec);
    (cluster, out.handle)
}

/// Every VM routes `n` fresh prompts (answered 200) that share no prefix worth a
/// cache hit, so each goes least-load with random ties; how many went to `cluster`.
fn routed_to(h: &mut Host, tag: &str, n: usize, cluster: &str) -> usize {
    let mut hits = 0;
    for vm in 0..h.vm_count() {
        for i in 0..n {
            let seed = tag
                .bytes()
                .fold(7u64, |a, b| a.wrapping_mul(31) + u64::from(b));
            let key = seed.wrapping_mul(1_000_003) + (vm * 1_000 + i) as u64;
            let prompt = format!("{:016x} {tag}", key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            hits += usize::from(support::route_completion(h, vm, &prompt).0 == cluster);
        }
    }
    hits
}

/// Routes on VM 0 until a request lands on a worker, then fails it with `flags`
/// and `details`; returns that worker's cluster.
fn fail_one(h: &mut Host, status: u32, flags: u64, details: &str) -> String {
    let (cluster, handle) = open(h, 0, "the request that meets a dead engine");
    h.vm(0)
        .fail_upstream(handle, status, flags, details)
        .expect("failure runs");
    cluster
}

/// Routes bodies made by `body` (from a counter) on VM 0 until `times` land on
/// `cluster`, and fails those with `failure` (status, flags, details); the requests
/// landing elsewhere are answered 200.
fn fail_on(h: &mut Host, cluster: &str, body: &Body, times: usize, failure: (u32, u64, &str)) {
    let mut failed = 0;
    for i in 0..400 {
        if failed == times {
            return;
        }
        let spec = RequestSpec::post_json("/v1/completions", body(i));
        let (landed, out) = support::open(h, 0, spec);
        if landed == cluster {
            let (status, flags, details) = failure;
            h.vm(0)
                .fail_upstream(out.handle, status, flags, details)
                .unwrap();
            failed += 1;
        } else {
            support::answer(h, 0, out.handle);
        }
    }
    assert_eq!(failed, times, "requests that landed on {cluster}");
}

/// Makes the `i`th request's body.
type Body = dyn Fn(usize) -> Vec<u8>;

const RESET: (u32, u64, &str) = (
    503,
    UC,
    "upstream_reset_before_response_started{connection_termination}",
);

/// The one pending probe, which must go to `cluster`; answers it with `status`.
fn answer_probe(h: &mut Host, cluster: &str, status: u32) {
    let calls = h.pending_http_calls();
    assert_eq!(calls.len(), 1, "one probe in flight: {calls:?}");
    assert_eq!(calls[0].cluster, cluster, "the down worker is probed");
    h.answer_http_call(calls[0].token, status, &[], b"{}")
        .expect("probe answered");
}

#[test]
fn a_refused_connection_takes_the_worker_out_on_every_vm_until_a_probe_answers() {
    let mut h = host(4, "");
    let dead = fail_one(&mut h, 503, UF, CONNECT_FAILURE);
    assert_eq!(stat(&h, "health_down"), 1);
    assert_eq!(stat(&h, "upstream_failures"), 1);
    assert_eq!(
        routed_to(&mut h, "after", 20, &dead),
        0,
        "no VM routes to the dead worker (80 fresh requests)"
    );
    // The lease holder probes it; a failed probe keeps it out.
    h.advance_time(1000).unwrap();
    answer_probe(&mut h, &dead, 503);
    assert_eq!(
        routed_to(&mut h, "still", 10, &dead),
        0,
        "a failed probe keeps it out"
    );
    h.advance_time(1000).unwrap();
    answer_probe(&mut h, &dead, 200);
    assert_eq!(stat(&h, "health_recovered"), 1);
    assert!(
        routed_to(&mut h, "back", 20, &dead) > 0,
        "after a good probe it takes traffic again"
    );
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "health_down_now"), 0);
}

#[test]
fn a_failure_takes_its_worker_out_before_the_client_sees_it() {
    // The client has the router's 503 and sends its next request before the failed
    // stream completes (`proxy_on_log`): the worker is already out.
    let mut h = host(1, "");
    let (dead, handle) = open(&mut h, 0, "the request that meets a dead engine");
    // Every other worker holds a request too: the failed one's own in flight does
    // not keep the next requests off it.
    let mut held = Vec::new();
    for i in 0..200 {
        if held.len() == 3 {
            break;
        }
        let (cluster, other) = open(&mut h, 0, &format!("{i:04} a request held elsewhere"));
        if cluster == dead || held.iter().any(|(c, _)| *c == cluster) {
            support::answer(&mut h, 0, other);
        } else {
            held.push((cluster, other));
        }
    }
    assert_eq!(held.len(), 3, "one request held on each other worker");
    h.vm(0)
        .fail_upstream_headers(handle, 503, UF, CONNECT_FAILURE)
        .unwrap();
    assert_eq!(routed_to(&mut h, "next", 20, &dead), 0, "already out");
    h.vm(0).finish(handle).unwrap();
    for (_, other) in held {
        support::answer(&mut h, 0, other);
    }
    // Counters reach the host on the VM's tick.
    h.advance_time(1000).unwrap();
    assert_eq!(
        (stat(&h, "health_down"), stat(&h, "upstream_failures")),
        (1, 1),
        "judged once"
    );
}

#[test]
fn resets_timeouts_and_5xx_take_a_worker_out_after_five_in_a_row_but_clients_and_4xx_never() {
    // (status, flags, details, goes down after five)
    let cases: [(u32, u64, &str, bool); 6] = [
        (
            503,
            UC,
            "upstream_reset_before_response_started{connection_termination}",
            true,
        ),
        (408, SI, "stream_idle_timeout", true),
        (500, 0, "via_upstream", true),
        (503, 0, "via_upstream", true),
        (0, DC, "downstream_remote_disconnect", false),
        (429, 0, "via_upstream", false),
    ];
    for (status, flags, details, down) in cases {
        let mut h = host(2, "");
        let target = "engine_2";
        for n in 1..=5 {
            let mut landed = false;
            for i in 0..400 {
                let body = support::completion("m", &format!("{n} {i} request"));
                let spec = RequestSpec::post_json("/v1/completions", body);
                let (cluster, out) = support::open(&mut h, 0, spec);
                if cluster != target {
                    support::answer(&mut h, 0, out.handle);
                    continue;
                }
                if details == "via_upstream" {
                    h.vm(0).respond(out.handle, status, &[], b"{}").unwrap();
                    h.vm(0).finish(out.handle).unwrap();
                } else if flags == DC {
                    h.vm(0).reset(out.handle).unwrap();
                } else {
                    h.vm(0)
                        .fail_upstream(out.handle, status, flags, details)
                        .unwrap();
                }
                landed = true;
                break;
            }
            assert!(landed, "a request landed on {target}");
            let want = u64::from(down && n == 5);
            assert_eq!(
                stat(&h, "health_down"),
                want,
                "{status} {flags:#x} {details}: {n} in a row, out = {want}"
            );
        }
        let hits = routed_to(&mut h, "next", 20, target);
        assert_eq!(
            hits == 0,
            down,
            "{status} {flags:#x} {details}: out of rotation = {down} ({hits} of 40 went there)"
        );
    }
}

#[test]
fn a_served_request_ends_a_run_of_failures() {
    let mut h = host(1, "");
    let body = |i| support::completion("m", &format!("{i} a fresh prompt"));
    fail_on(&mut h, "engine_1", &body, 4, RESET);
    // One request served by engine_1 clears its four.
    let mut served = false;
    for i in 0..400 {
        let prompt = format!(
            "{:016x} served",
            (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        );
        let (cluster, _) = support::route_completion(&mut h, 0, &prompt);
        if cluster == "engine_1" {
            served = true;
            break;
        }
    }
    assert!(served, "a request landed on engine_1");
    fail_on(&mut h, "engine_1", &body, 4, RESET);
    assert_eq!(
        stat(&h, "health_down"),
        0,
        "4, a success, 4: never 5 in a row"
    );
    fail_on(&mut h, "engine_1", &body, 1, RESET);
    assert_eq!(stat(&h, "health_down"), 1, "the fifth in a row");
}

#[test]
fn a_run_of_failures_takes_out_at_most_the_pools_cap_but_a_refused_connect_always() {
    let mut h = host(2, "");
    let body = |i| support::completion("m", &format!("{i} any"));
    fail_on(&mut h, "engine_0", &body, 5, RESET);
    assert_eq!(
        stat(&h, "health_down"),
        1,
        "the first of four may go (10%, at least one)"
    );
    fail_on(&mut h, "engine_3", &body, 12, RESET);
    assert_eq!(
        stat(&h, "health_down"),
        1,
        "a second of four would be 50%: it stays in rotation"
    );
    assert_eq!(
        stat(&h, "health_capped"),
        8,
        "the 5th to the 12th failure in a row were held by the cap"
    );
    assert!(routed_to(&mut h, "capped", 20, "engine_3") > 0);
    fail_one_on(&mut h, "engine_3");
    assert_eq!(
        stat(&h, "health_down"),
        2,
        "a refused connect is the engine's: out whatever the cap"
    );
    assert_eq!(routed_to(&mut h, "after", 20, "engine_3"), 0);
}

/// Fails one request on `cluster` with a refused connection.
fn fail_one_on(h: &mut Host, cluster: &str) {
    let body = |i| support::completion("m", &format!("{i} meets a refused connect"));
    fail_on(h, cluster, &body, 1, (503, UF, CONNECT_FAILURE));
}

#[test]
fn failures_after_a_body_the_client_made_unusual_are_the_clients() {
    // Chat messages of numbers sent to `/v1/completions`, where `messages` is not
    // what the engine reads: no text the filter can read, so routed by load.
    let numbers = |i: usize| format!(r#"{{"model":"m","messages":[{i},0,0,0]}}"#).into_bytes();
    // A readable body over `judged_body_bytes`.
    let big = |i: usize| support::completion("m", &format!("{i} {}", "long prompt ".repeat(200)));
    let bodies: [(&Body, &str); 2] = [(&numbers, "unreadable"), (&big, "oversized")];
    for (body, what) in bodies {
        let mut h = host(2, r#","health":{"judged_body_bytes":1000}"#);
        for w in 0..4 {
            fail_on(&mut h, &format!("engine_{w}"), body, 8, RESET);
        }
        assert_eq!(
            stat(&h, "health_down"),
            0,
            "{what}: 8 resets on every engine, none counted"
        );
        assert_eq!(
            stat(&h, "upstream_failures"),
            32,
            "{what}: still counted as failed upstreams"
        );
        assert_eq!(
            stat(&h, "upstream_failures_unjudged"),
            32,
            "{what}: each counted as the client's"
        );
        for w in 0..4 {
            assert!(
                routed_to(&mut h, &format!("{what}{w}"), 20, &format!("engine_{w}")) > 0,
                "{what}: engine_{w} still in rotation"
            );
        }
        fail_on(&mut h, "engine_1", body, 1, (503, UF, CONNECT_FAILURE));
        assert_eq!(
            stat(&h, "health_down"),
            1,
            "{what}: a refused connect counts whatever the request"
        );
    }
}

#[test]
fn re_ejection_backs_off() {
    let mut h = host(1, r#","health":{"backoff_ms":10000}"#);
    let dead = fail_one(&mut h, 503, UF, CONNECT_FAILURE);
    h.advance_time(1000).unwrap();
    answer_probe(&mut h, &dead, 200);
    assert_eq!(stat(&h, "health_recovered"), 1, "the first time, one probe");
    fail_one_on(&mut h, &dead);
    assert_eq!(stat(&h, "health_down"), 2);
    h.advance_time(1000).unwrap();
    answer_probe(&mut h, &dead, 200);
    h.advance_time(1000).unwrap();
    assert_eq!(
        routed_to(&mut h, "held", 20, &dead),
        0,
        "out again soon after: held 10 s whatever the probes"
    );
    for _ in 0..10 {
        h.advance_time(1000).unwrap();
        if let Some(call) = h.pending_http_calls().first() {
            h.answer_http_call(call.token, 200, &[], b"{}").unwrap();
        }
    }
    assert_eq!(
        stat(&h, "health_recovered"),
        2,
        "back after the longer hold"
    );
    assert!(routed_to(&mut h, "back", 20, &dead) > 0);
}

#[test]
fn the_collectors_unreachable_takes_a_worker_out_until_it_reaches_it_again() {
    let mut h = host(2, "");
    let push = |h: &mut Host, w1: &str| {
        let body = format!(
            r#"{{"workers":[{{"name":"w0","num_waiting":5}},{w1},{{"name":"w2","num_waiting":5}},{{"name":"w3","num_waiting":5}}]}}"#
        );
        assert_eq!(support::push(h, 0, "tok", &body).0, 200);
    };
    push(
        &mut h,
        r#"{"name":"w1","reachable":false,"error":"refused"}"#,
    );
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "health_down_now"), 1);
    assert_eq!(routed_to(&mut h, "a", 20, "engine_1"), 0);
    answer_probe(&mut h, "engine_1", 200);
    assert_eq!(
        routed_to(&mut h, "b", 10, "engine_1"),
        0,
        "a good probe is not enough while the collector cannot reach it"
    );
    // The collector reaches it again: back at the next tick, no probe needed (and,
    // its queue the shortest, it takes the traffic).
    push(&mut h, r#"{"name":"w1","num_waiting":0}"#);
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "health_down_now"), 0);
    assert!(routed_to(&mut h, "c", 20, "engine_1") > 0);
}

#[test]
fn a_reachable_report_alone_brings_back_a_worker_out_for_a_refused_connect() {
    let mut h = host(2, "");
    let dead = fail_one(&mut h, 503, UF, CONNECT_FAILURE);
    let index = &dead["engine_".len()..];
    h.advance_time(1).unwrap();
    let lines: Vec<String> = (0..4)
        .map(|i| {
            let waiting = if i.to_string() == index { 0 } else { 5 };
            format!(r#"{{"name":"w{i}","num_waiting":{waiting}}}"#)
        })
        .collect();
    let body = format!(r#"{{"workers":[{}]}}"#, lines.join(","));
    assert_eq!(support::push(&mut h, 0, "tok", &body).0, 200);
    h.advance_time(1000).unwrap();
    assert_eq!(
        stat(&h, "health_recovered"),
        1,
        "the collector connected after it went out"
    );
    assert!(routed_to(&mut h, "c", 20, &dead) > 0);
}

#[test]
fn all_down_never_chooses_a_worker_whose_last_connect_failed_while_others_may_answer() {
    // Envoy and the collector up before the engines: every worker reported
    // unreachable, so all are down.
    let mut h = host(2, "");
    let all_unreachable = r#"{"workers":[{"name":"w0","reachable":false},{"name":"w1","reachable":false},{"name":"w2","reachable":false},{"name":"w3","reachable":false}]}"#;
    assert_eq!(support::push(&mut h, 0, "tok", all_unreachable).0, 200);
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "health_down_now"), 4);
    // Engine 3 never comes up: its first request meets a refused connect.
    fail_one_on(&mut h, "engine_3");
    for vm in 0..2 {
        for i in 0..20 {
            let spec = RequestSpec::post_json(
                "/v1/completions",
                support::completion("m", &format!("burst {vm} {i}")),
            );
            let (cluster, out) = support::open(&mut h, vm, spec);
            assert_ne!(
                cluster, "engine_3",
                "request {i} on vm {vm} went to the refused engine"
            );
            // The others answer: a served request brings its worker back.
            support::answer(&mut h, vm, out.handle);
        }
    }
    h.advance_time(1000).unwrap();
    assert!(
        stat(&h, "health_down_now") < 4,
        "a worker that served a request is back"
    );
    // The collector reaches the three engines that came up.
    let three_up = r#"{"workers":[{"name":"w0"},{"name":"w1"},{"name":"w2"},{"name":"w3","reachable":false}]}"#;
    assert_eq!(support::push(&mut h, 0, "tok", three_up).0, 200);
    h.advance_time(1000).unwrap();
    assert_eq!(
        stat(&h, "health_down_now"),
        1,
        "the engines that came up are back; the dead one is not"
    );
}

#[test]
fn a_stream_cut_after_its_headers_counts_as_a_failure() {
    // One failure in a row is enough here.
    let mut h = host(2, r#","health":{"consecutive_failures":1}"#);
    let (cluster, handle) = open(&mut h, 1, "a long generation");
    h.vm(1).respond_headers(handle, 200, &[]).unwrap();
    h.vm(1)
        .fail_upstream(
            handle,
            200,
            0x10,
            "upstream_reset_after_response_started{remote_reset}",
        )
        .unwrap();
    assert_eq!(routed_to(&mut h, "next", 20, &cluster), 0);
}

#[test]
fn a_fleet_all_down_is_still_routed_and_says_so() {
    let mut h = host(1, "");
    let mut dead = std::collections::BTreeSet::new();
    for i in 0..40 {
        if dead.len() == 4 {
            break;
        }
        let (cluster, handle) = open(&mut h, 0, &format!("req {i}"));
        h.vm(0)
            .fail_upstream(handle, 503, UF, CONNECT_FAILURE)
            .unwrap();
        dead.insert(cluster);
    }
    assert_eq!(dead.len(), 4, "every worker failed once");
    let (_, reason) = support::route_completion(&mut h, 0, "anyone there?");
    assert_eq!(reason.as_deref(), Some("all_down"));
}

#[test]
fn health_off_takes_nobody_out() {
    let mut h = host(1, r#","health":{"enabled":false}"#);
    let cluster = fail_one(&mut h, 503, UF, CONNECT_FAILURE);
    assert!(routed_to(&mut h, "x", 40, &cluster) > 0);
    assert_eq!(stat(&h, "health_down"), 0);
}

/// Issue 14, failure 5: a request whose engine was dead still left its text in the
/// tree under that worker. Now the worker keeps only what it held before it.
#[test]
fn a_request_no_engine_served_leaves_no_tree_entry_under_its_worker() {
    let mut h = host(2, "");
    let first = "a conversation's first turn, long enough to matter ".repeat(3);
    let second = format!("{first}and its second turn, which meets a dead engine");
    let (owner, _) = support::route_completion(&mut h, 0, &first);
    let matched = |h: &Host| stat(h, &format!("worker.w{}.matched_chars", &owner[7..]));
    // The second turn follows its first to the same worker, whose engine died.
    let (again, handle) = open(&mut h, 0, &second);
    assert_eq!(again, owner, "cache hit on the first turn's owner");
    h.vm(0)
        .fail_upstream(handle, 503, UF, CONNECT_FAILURE)
        .unwrap();
    assert_eq!(stat(&h, "unserved"), 1, "counted as unserved");
    h.advance_time(1000).unwrap();
    answer_probe(&mut h, &owner, 200);
    // Back in rotation: the same second turn, on the other VM, still finds the
    // first turn under its worker, and no more than that.
    let before = matched(&h);
    let spec = RequestSpec::post_json("/v1/completions", support::completion("m", &second));
    let (cluster, out) = support::open(&mut h, 1, spec);
    assert_eq!(cluster, owner, "what it served before is still its own");
    // Its counters reach the host when the VM holds no request.
    support::answer(&mut h, 1, out.handle);
    assert_eq!(
        matched(&h) - before,
        first.chars().count() as u64,
        "the failed request's own text was forgotten on every VM"
    );
    // A request that was served is recorded: the next one matches all of it.
    let before = matched(&h);
    support::route_completion(&mut h, 0, &second);
    assert_eq!(matched(&h) - before, second.chars().count() as u64);
}

#[test]
fn messages_of_numbers_get_the_filters_400_at_every_size_and_no_engine_is_asked() {
    let mut h = host(2, r#","max_body_bytes":4000"#);
    let numbers = |n: usize| {
        let zeros = vec!["0"; n].join(",");
        format!(r#"{{"model":"m","messages":[{zeros}]}}"#).into_bytes()
    };
    let mut bodies: Vec<(Vec<u8>, &str)> = [1, 10, 1_900]
        .into_iter()
        .map(|n| (numbers(n), "messages[0] must be an object"))
        .collect();
    bodies.push((
        br#"{"messages":[{"role":"user","content":"hi"},{},7],"model":"m"}"#.to_vec(),
        "messages[2] must be an object",
    ));
    bodies.push((
        br#"{"model":"m","messages":"hi"}"#.to_vec(),
        "messages must be an array",
    ));
    for vm in [0, 1] {
        for (body, rule) in &bodies {
            let len = body.len();
            let spec = RequestSpec::post_json("/v1/chat/completions", body.clone());
            let out = h.vm(vm).request(spec).expect("request runs");
            let reply = out
                .local_response
                .unwrap_or_else(|| panic!("{len} bytes: the filter answers itself"));
            assert_eq!(reply.status, 400, "{len} bytes");
            let text = String::from_utf8_lossy(&reply.body).into_owned();
            assert!(
                text.contains(rule),
                "{len} bytes: the element and the rule, at every size: {text}"
            );
            assert!(
                reply
                    .headers
                    .iter()
                    .any(|(k, v)| k == "x-llm-router-reason" && v == "invalid_body"),
                "{len} bytes: the reason header: {:?}",
                reply.headers
            );
            assert!(!out.continued, "{len} bytes: no engine is asked");
        }
    }
    assert_eq!(stat(&h, "health_down"), 0);
    assert_eq!(stat(&h, "upstream_failures"), 0, "no upstream was tried");
    // The same messages sent where `messages` is not read are routed by load.
    let spec = RequestSpec::post_json("/v1/completions", numbers(10));
    let (_, out) = support::open(&mut h, 0, spec);
    assert!(out.local_response.is_none(), "routed on /v1/completions");
}

#[test]
fn a_body_past_max_body_bytes_gets_the_filters_413_at_every_size() {
    let mut h = host(2, r#","max_body_bytes":4000"#);
    let numbers = |n: usize| {
        let zeros = vec!["0"; n].join(",");
        format!(r#"{{"model":"m","messages":[{zeros}]}}"#).into_bytes()
    };
    for n in [2_001, 5_000, 50_000] {
        let body = numbers(n);
        let len = body.len();
        let spec = RequestSpec::post_json("/v1/chat/completions", body);
        let out = h.vm(0).request(spec).expect("request runs");
        let reply = out
            .local_response
            .unwrap_or_else(|| panic!("{len} bytes: the filter answers itself"));
        assert_eq!(reply.status, 413, "{len} bytes");
        let text = String::from_utf8_lossy(&reply.body).into_owned();
        assert!(
            text.contains("request body too large: body_too_large"),
            "{len} bytes: the same message at every size: {text}"
        );
    }
    let out = h
        .vm(0)
        .request(RequestSpec::post_json(
            "/v1/chat/completions",
            numbers(1_900),
        ))
        .expect("request runs");
    assert_eq!(
        out.local_response.map(|r| r.status),
        Some(400),
        "3830 bytes: within the bound, the filter's 400 (the test above)"
    );
    assert_eq!(stat(&h, "health_down"), 0);
}
