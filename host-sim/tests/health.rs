//! Dead and frozen engines out of rotation, on the real filter in virtual time: a
//! request whose upstream fails (refused connection, reset, idle timeout, the
//! engine's 5xx) takes its worker out on every VM at once; the lease-holding VM
//! probes it and a good probe brings it back; the collector's `reachable: false`
//! does the same; a client that hangs up or a 4xx takes nobody out.
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
fn resets_timeouts_and_5xx_take_a_worker_out_but_clients_and_4xx_do_not() {
    // (status, flags, details, goes down)
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
        let (cluster, handle) = open(&mut h, 0, "one request");
        if details == "via_upstream" {
            h.vm(0).respond(handle, status, &[], b"{}").unwrap();
            h.vm(0).finish(handle).unwrap();
        } else if flags == DC {
            h.vm(0).reset(handle).unwrap();
        } else {
            h.vm(0)
                .fail_upstream(handle, status, flags, details)
                .unwrap();
        }
        let hits = routed_to(&mut h, "next", 20, &cluster);
        assert_eq!(
            hits == 0,
            down,
            "{status} {flags:#x} {details}: out of rotation = {down} ({hits} of 40 went there)"
        );
    }
}

#[test]
fn a_stream_cut_after_its_headers_counts_as_a_failure() {
    let mut h = host(2, "");
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
fn the_collectors_unreachable_takes_a_worker_out_until_it_is_reachable_and_probed() {
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
    // The engine answered its probe; once the collector reaches it too, it is back
    // (and, its queue the shortest, takes the traffic).
    push(&mut h, r#"{"name":"w1","num_waiting":0}"#);
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "health_down_now"), 0);
    assert!(routed_to(&mut h, "c", 20, "engine_1") > 0);
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
