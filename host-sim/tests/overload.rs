//! Latency-aware overload flags on the real filter, in virtual time: latencies
//! arrive as collector pushes, the lease-holding VM flags and probes, probes are
//! answered (or time out) by the test, and every VM routes around the flagged set.
//! Also: lease takeover, hot reload of thresholds, and switching it all off.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{Host, HttpCall, RequestSpec};
use llm_router::support::header_names::EXPLAIN_HEADER;

const LEASE_KEY: &str = "llm_router.overload.lease";

fn config(overload: &str) -> String {
    format!(
        r#"{{"policy":"cache_aware","workers":[{{"name":"w0","cluster":"c0"}},{{"name":"w1","cluster":"c1"}},{{"name":"w2","cluster":"c2"}}],
            "stats_token":"tok","stale_after_ms":60000,"sync_interval_ms":1000,
            "overload":{{"probe_interval_ms":1000,"probe_timeout_ms":500,"probe_successes_to_recover":2{overload}}}}}"#
    )
}

fn host(vms: usize, overload: &str) -> Host {
    support::host(&config(overload), vms, 3, &["c0", "c1", "c2"])
}

/// Pushes w1's TTFT p90 (the others fast) on VM 0.
fn push_w1_ttft(h: &mut Host, ttft_p90_s: f64) {
    let body = format!(
        r#"{{"workers":[{{"name":"w0","ttft_p90_s":0.1}},{{"name":"w1","ttft_p90_s":{ttft_p90_s}}},{{"name":"w2","ttft_p90_s":0.1}}]}}"#
    );
    assert_eq!(support::push(h, 0, "tok", &body).0, 200);
}

/// Routes a completion on `vm`; returns the cluster.
fn route(h: &mut Host, vm: usize, prompt: &str) -> String {
    support::route_completion(h, vm, prompt).0
}

fn stat(h: &Host, name: &str) -> u64 {
    support::stat(h, &format!("llm_router_overload_{name}"))
}

fn probes(h: &Host) -> Vec<HttpCall> {
    h.pending_http_calls()
}

/// The one pending probe, which must be to w1.
fn probe(h: &Host) -> HttpCall {
    let calls = probes(h);
    assert_eq!(calls.len(), 1, "one probe in flight: {calls:?}");
    let call = calls.into_iter().next().unwrap();
    assert_eq!(call.cluster, "c1");
    call
}

/// Every VM routes 20 prompts no tree has seen, sharing too little to be a cache hit
/// (`tag`, a word of its own initial, keeps calls apart); returns whether any went
/// to `cluster`.
fn any_routed_to(h: &mut Host, tag: &str, cluster: &str) -> bool {
    let mut hit = false;
    for vm in 0..h.vm_count() {
        for i in 0..20 {
            hit |= route(h, vm, &format!("{vm}{i}{tag}")) == cluster;
        }
    }
    hit
}

#[test]
fn a_slow_worker_is_flagged_probed_and_recovers_on_a_probe_run() {
    let mut h = host(2, "");
    push_w1_ttft(&mut h, 40.0);
    h.advance_time(1000).unwrap();
    assert_eq!((stat(&h, "entered"), stat(&h, "flagged")), (1, 1));
    assert!(
        !any_routed_to(&mut h, "alpha", "c1"),
        "no VM routes to a flagged worker"
    );

    let call = probe(&h);
    assert_eq!(
        (call.header(":method"), call.header(":path")),
        (Some("POST"), Some("/v1/completions"))
    );
    assert!(call.header(":authority").is_some());
    assert_eq!(call.timeout_ms, 500);
    h.answer_http_call(call.token, 200, &[], b"{}").unwrap();
    h.advance_time(1000).unwrap();
    h.answer_http_call(probe(&h).token, 200, &[], b"{}")
        .unwrap();
    assert_eq!(stat(&h, "recovered"), 0, "probes alone: latency still over");

    // Latency in the grey zone (16..30 s): still not recovered, whatever the probes.
    push_w1_ttft(&mut h, 20.0);
    h.advance_time(1000).unwrap();
    h.answer_http_call(probe(&h).token, 200, &[], b"{}")
        .unwrap();
    assert_eq!(stat(&h, "recovered"), 0, "grey zone keeps the flag");

    // A timeout breaks the run of successes...
    h.advance_time(1000).unwrap();
    assert_eq!(probes(&h).len(), 1);
    h.advance_time(600).unwrap();
    assert_eq!(stat(&h, "probes_failed"), 1, "the probe timed out");
    // ...so with latency now below the recover threshold it takes two more.
    push_w1_ttft(&mut h, 1.0);
    h.advance_time(400).unwrap();
    assert_eq!(stat(&h, "recovered"), 0, "latency alone does not recover");
    h.answer_http_call(probe(&h).token, 200, &[], b"{}")
        .unwrap();
    assert_eq!(stat(&h, "recovered"), 0, "one success after a failure");
    h.advance_time(1000).unwrap();
    h.answer_http_call(probe(&h).token, 200, &[], b"{}")
        .unwrap();
    assert_eq!(stat(&h, "recovered"), 1);
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "flagged"), 0);
    assert!(probes(&h).is_empty(), "a healthy worker is not probed");
    assert!(
        any_routed_to(&mut h, "bravo", "c1"),
        "back in the candidate set"
    );
    assert_eq!(stat(&h, "probes_ok"), 5);
}

#[test]
fn missing_latency_never_flips_a_flag() {
    let mut h = host(1, "");
    push_w1_ttft(&mut h, 40.0);
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "flagged"), 1);
    // A push without latencies (the engine saw no requests in the window) and
    // successful probes: the last verdict (over) stands.
    let mut spec = RequestSpec::post_json(
        "/llm-router/stats",
        br#"{"workers":[{"name":"w1","num_waiting":0,"num_running":0}]}"#.to_vec(),
    );
    spec.headers.push(("authorization", "Bearer tok"));
    h.vm(0).request(spec).unwrap();
    for _ in 0..4 {
        h.answer_http_call(probe(&h).token, 200, &[], b"{}")
            .unwrap();
        h.advance_time(1000).unwrap();
    }
    assert_eq!((stat(&h, "recovered"), stat(&h, "flagged")), (0, 1));
}

#[test]
fn a_lease_whose_holder_stopped_renewing_is_taken_over() {
    let mut h = host(2, "");
    // A holder elsewhere that will never renew, its lease good for 3 s more.
    let until = h.now_ms() + 3000;
    h.set_shared_data(LEASE_KEY, format!("424242:{until}"));
    push_w1_ttft(&mut h, 40.0);
    h.advance_time(2000).unwrap();
    assert_eq!(stat(&h, "entered"), 0, "only the lease holder flags");
    assert!(probes(&h).is_empty(), "only the lease holder probes");
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "entered"), 1, "taken over once expired");
    assert_eq!(probe(&h).cluster, "c1");
    let holder = String::from_utf8(h.shared_data(LEASE_KEY).unwrap()).unwrap();
    assert!(!holder.starts_with("424242:"), "{holder}");
}

#[test]
fn thresholds_hot_reload_and_disabling_clears_every_flag() {
    let mut h = host(2, "");
    push_w1_ttft(&mut h, 20.0);
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "entered"), 0, "20 s is under the default 30 s");
    h.reconfigure(config(r#","ttft_enter_s":10,"ttft_recover_s":5"#))
        .unwrap();
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "entered"), 1, "the new threshold applies");
    assert!(!any_routed_to(&mut h, "charlie", "c1"));

    h.reconfigure(config(r#","enabled":false"#)).unwrap();
    assert!(
        any_routed_to(&mut h, "delta", "c1"),
        "off: no filtering at once"
    );
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "flagged"), 0);
    let n = probes(&h).len();
    h.advance_time(3000).unwrap();
    assert_eq!(probes(&h).len(), n, "off: no new probes");
    assert_eq!(
        h.shared_data("llm_router.overload.flags").as_deref(),
        Some(&b"{}"[..]),
        "no stale flag is left behind"
    );
    // Switched on again: it starts from a clean slate, flagging anew.
    h.reconfigure(config(r#","ttft_enter_s":10,"ttft_recover_s":5"#))
        .unwrap();
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "entered"), 2);
}

#[test]
fn an_all_flagged_fleet_is_still_served_and_says_so() {
    let mut h = host(2, "");
    let mut spec = RequestSpec::post_json(
        "/llm-router/stats",
        br#"{"workers":[{"name":"w0","ttft_p90_s":40},{"name":"w1","ttft_p90_s":40},{"name":"w2","tpot_p90_s":0.5}]}"#
            .to_vec(),
    );
    spec.headers.push(("authorization", "Bearer tok"));
    h.vm(0).request(spec).unwrap();
    h.advance_time(1000).unwrap();
    assert_eq!(stat(&h, "flagged"), 3);
    let mut spec = RequestSpec::post_json(
        "/v1/completions",
        br#"{"model":"m","prompt":"hello"}"#.to_vec(),
    );
    spec.headers.push((EXPLAIN_HEADER, "1"));
    let out = h.vm(1).request(spec).unwrap();
    assert!(out.local_response.is_none(), "routed, not refused");
    let resp = h.vm(1).respond(out.handle, 200, &[], b"{}").unwrap();
    assert_eq!(resp.header("x-llm-router-reason"), Some("all_overloaded"));
    assert_eq!(resp.header("x-llm-router-decision"), Some("all_queued"));
}

#[test]
fn an_invalid_overload_config_is_refused_with_the_field_named() {
    let err = Host::builder(host_sim::require_built_filter())
        .plugin_config(config(r#","ttft_recover_s":31"#).into_bytes())
        .clusters(&["c0", "c1", "c2"])
        .build()
        .err()
        .expect("rejected");
    let all = format!("{err:#}");
    assert!(all.contains("overload.ttft_recover_s"), "{all}");
}
