//! The queue gate and the stats push endpoint on the real filter, in virtual time:
//! pushes arrive as requests on the stats path (as the collector sends them through
//! Envoy's stats listener), requests are routed on what was pushed, and samples go
//! stale as the clock moves.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{Host, RequestSpec};
use llm_router_push::{Push, WorkerStats};
use support::push;

fn host(vms: usize, extra: &str) -> Host {
    let config = format!(
        r#"{{"policy":"cache_aware","workers":[{{"name":"w0","cluster":"c0"}},{{"name":"w1","cluster":"c1"}},{{"name":"w2","cluster":"c2"}}],
            "stats_token":"tok","stale_after_ms":3000{extra}}}"#
    );
    support::host(&config, vms, 5, &["c0", "c1", "c2"])
}

/// A push of w0..w2's queues, each with one request running.
fn queues(waiting: [u64; 3]) -> String {
    let workers = waiting
        .iter()
        .enumerate()
        .map(|(i, &w)| WorkerStats {
            num_waiting: Some(w),
            num_running: Some(1),
            ..WorkerStats::reachable(Some(format!("w{i}")), None)
        })
        .collect();
    let push: Push = Push::new(workers);
    serde_json::to_string(&push).unwrap()
}

/// Routes a completion; returns (cluster, reason).
fn route(host: &mut Host, vm: usize, prompt: &str) -> (String, String) {
    let (cluster, reason) = support::route_completion(host, vm, prompt);
    (cluster, reason.unwrap_or_default())
}

const DOC: &str = "a shared document that every turn starts with, long enough to own";

#[test]
fn a_push_on_one_thread_gates_routing_on_every_thread() {
    let mut h = host(3, r#","worker_queue_limit":2"#);
    let (owner, _) = route(&mut h, 0, DOC);
    let owner_index: usize = owner[1..].parse().unwrap();
    let mut waiting = [0; 3];
    waiting[owner_index] = 2;
    assert_eq!(push(&mut h, 1, "tok", &queues(waiting)).0, 200);
    let (diverted, reason) = route(&mut h, 2, &format!("{DOC}Alpha"));
    assert_eq!(
        reason, "cache_worker_queued",
        "VM 2 sees the push made on VM 1"
    );
    assert_ne!(diverted, owner);
    // The diverted turn was recorded under its new worker, which now holds the
    // document too and is not queued: the next turn, on another VM (a sync window
    // later, as a turn comes after an answer), hits it there.
    h.advance_time(support::SYNC_WINDOW_MS).unwrap();
    let (cluster, reason) = route(&mut h, 0, &format!("{DOC}Bravo"));
    assert_eq!((cluster, reason.as_str()), (diverted, "cache_hit"));
    assert_eq!(
        h.metric("wasmcustom.llm_router_decisions_cache_worker_queued"),
        Some(1)
    );
    assert_eq!(
        h.metric("wasmcustom.llm_router_stats_pushes_accepted"),
        Some(1)
    );
}

#[test]
fn a_push_reaches_a_thread_inside_its_sync_window() {
    let mut h = host(2, r#","worker_queue_limit":2,"sync_batch_ms":50"#);
    let (owner, reason) = route(&mut h, 0, DOC);
    assert_eq!(reason, "cache_miss");
    let owner_index: usize = owner[1..].parse().unwrap();
    let (cluster, reason) = route(&mut h, 0, &format!("{DOC}Alpha"));
    assert_eq!((&cluster, reason.as_str()), (&owner, "cache_hit"));
    let mut waiting = [0; 3];
    waiting[owner_index] = 2;
    assert_eq!(push(&mut h, 1, "tok", &queues(waiting)).0, 200);
    // VM 0 synced a moment ago and will not again for 50 ms, but the push rang the
    // tables' bell, which every request listens to.
    let (diverted, reason) = route(&mut h, 0, &format!("{DOC}Bravo"));
    assert_eq!(reason, "cache_worker_queued", "VM 0 sees the push at once");
    assert_ne!(diverted, owner);
}

#[test]
fn samples_gate_while_fresh_and_fail_open_once_stale() {
    for (age_ms, expected) in [(2_999, "cache_worker_queued"), (3_000, "cache_hit")] {
        let mut h = host(1, r#","worker_queue_limit":2"#);
        let (owner, _) = route(&mut h, 0, DOC);
        let owner_index: usize = owner[1..].parse().unwrap();
        let mut waiting = [0; 3];
        waiting[owner_index] = 9;
        push(&mut h, 0, "tok", &queues(waiting));
        h.advance_time(age_ms).unwrap();
        let (cluster, reason) = route(&mut h, 0, &format!("{DOC}Alpha"));
        assert_eq!(
            reason, expected,
            "sample aged {age_ms} ms (stale_after_ms 3000)"
        );
        if expected == "cache_hit" {
            assert_eq!(
                cluster, owner,
                "a stale sample is no sample: the gate fails open"
            );
        }
    }
}

#[test]
fn refused_pushes_change_nothing() {
    let mut h = host(1, r#","worker_queue_limit":2,"stats_max_bytes":512"#);
    let (owner, _) = route(&mut h, 0, DOC);
    let all_queued = queues([9, 9, 9]);
    assert_eq!(push(&mut h, 0, "wrong", &all_queued).0, 401);
    assert_eq!(push(&mut h, 0, "", &all_queued).0, 401);
    let (status, body) = push(
        &mut h,
        0,
        "tok",
        r#"{"workers":[{"name":"w0","num_waiting":1},{"name":"nope"}]}"#,
    );
    assert_eq!(status, 400);
    assert!(body.contains("unknown worker `nope`"), "{body}");
    let (status, body) = push(
        &mut h,
        0,
        "tok",
        &format!(r#"{{"workers":[],"pad":"{}"}}"#, "x".repeat(600)),
    );
    assert_eq!(status, 413, "{body}");
    assert_eq!(push(&mut h, 0, "tok", "[1,2").0, 400);
    assert_eq!(
        h.metric("wasmcustom.llm_router_stats_pushes_rejected"),
        Some(5)
    );
    assert_eq!(
        h.metric("wasmcustom.llm_router_stats_pushes_accepted"),
        Some(0)
    );
    let (cluster, reason) = route(&mut h, 0, &format!("{DOC} turn"));
    assert_eq!(
        (cluster, reason.as_str()),
        (owner, "cache_hit"),
        "no refused push was stored"
    );
    // The gate was blind all along, and says so.
    assert!(
        h.metric("wasmcustom.llm_router_queue_gate_inert")
            .unwrap_or(0)
            >= 2
    );
    assert!(h
        .logs(0)
        .iter()
        .any(|l| l.message.contains("queue gate is inert")));
}

#[test]
fn pushes_are_not_routed_without_a_token_configured() {
    let config = r#"{"workers":[{"name":"w0","cluster":"c0"}]}"#;
    let mut h = support::host(config, 1, 0, &["c0"]);
    let out = h
        .vm(0)
        .request(RequestSpec::post_json("/llm-router/stats", b"{}".to_vec()))
        .unwrap();
    assert!(
        out.local_response.is_none(),
        "without stats_token the path is plain traffic"
    );
    assert_eq!(out.header("x-llm-router-cluster"), Some("c0"));
}
