//! End-to-end: membership from service discovery through the real Envoy. The filter
//! lists no worker; Envoy learns the engines from a watched EDS file and the collector
//! pushes what Envoy knows. An engine listed later takes traffic; an engine dropped
//! from the file takes no new request (its conversation moves, with no error), and
//! after the grace period the filter forgets it.

use e2e::support::{header, post, WAIT};
use llm_demo::discovery::{DiscoveryFleet, DiscoverySpec};
use serde_json::{json, Value};

fn completion(prompt: &str) -> Value {
    json!({"model": "mock", "prompt": prompt, "max_tokens": 2})
}

#[test]
fn engines_join_and_leave_through_envoys_service_discovery() {
    let mut f = DiscoveryFleet::start(&DiscoverySpec {
        workers: 2,
        engine_args: Vec::new(),
        plugin_config: json!({"leave_grace_ms": 1500}),
        // Two worker threads: every VM must follow the pushed list.
        envoy_concurrency: 2,
        collector_interval_ms: 100,
        dir: None,
    })
    .unwrap_or_else(|e| panic!("cannot start the discovery fleet: {e:#}"));
    let known = |n: u64| move |k: u64, leaving: u64| k == n && leaving == 0;
    f.wait_workers(WAIT, known(2))
        .unwrap_or_else(|e| panic!("{e:#}"));
    let listener = f.envoy.listener;
    let doc = "a long shared document the conversation keeps returning to. ".repeat(30);
    let turn = |n: usize| completion(&format!("{doc} turn {n}"));
    let first = post(listener, "/v1/completions", &turn(0));
    assert_eq!(first.status, 200, "{first:?}");
    let home = header(&first, "x-engine-worker");

    f.add("w2").unwrap();
    f.wait_workers(WAIT, known(3))
        .unwrap_or_else(|e| panic!("w2 never joined: {e:#}"));
    let mut to_new = 0;
    for i in 0..40 {
        let r = post(
            listener,
            "/v1/completions",
            &completion(&format!("opener {i}: a question nobody asked before {i}")),
        );
        assert_eq!(r.status, 200, "{r:?}");
        to_new += usize::from(header(&r, "x-engine-worker") == "w2");
    }
    assert!(to_new > 0, "the joined engine takes new conversations");
    let again = post(listener, "/v1/completions", &turn(1));
    assert_eq!(
        (
            header(&again, "x-engine-worker"),
            header(&again, "x-llm-router-decision")
        ),
        (home.clone(), "cache_hit".to_string()),
        "a join moves no conversation"
    );

    f.remove(&home).unwrap();
    f.wait_workers(WAIT, |_, leaving| leaving == 1)
        .unwrap_or_else(|e| panic!("{home} never started leaving: {e:#}"));
    for n in 2..12 {
        let r = post(listener, "/v1/completions", &turn(n));
        assert_eq!(r.status, 200, "turn {n} after {home} left: {r:?}");
        assert_ne!(
            header(&r, "x-engine-worker"),
            home,
            "turn {n}: a leaving engine takes no new request"
        );
    }
    f.wait_workers(WAIT, known(2))
        .unwrap_or_else(|e| panic!("{home} was never removed after the grace: {e:#}"));
    let last = post(listener, "/v1/completions", &turn(12));
    assert_eq!(last.status, 200, "{last:?}");
    assert_eq!(
        header(&last, "x-llm-router-decision"),
        "cache_hit",
        "the conversation settled on its new engine"
    );
}
