//! End-to-end: `predicted_ttft` through the real Envoy 1.40, in front of engine mocks
//! with one running slot each and slow prefill, so queueing is real: a burst of
//! conversations sharing one long system prompt spreads over the fleet instead of
//! herding onto the prompt's first holder, and each conversation's later turns stay
//! on its worker with real engine cache hits.
//!
//! Needs the filter built (`cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm`) and Envoy installed (`envoy/get-envoy`); `tests/run` does both.

use e2e::support::{cached_tokens, conversation, header, post, start};
use llm_demo::admin::Response;
use llm_demo::fleet::FleetSpec;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

fn system() -> String {
    "You are the support assistant of a large shop; answer briefly. ".repeat(60)
}

fn chat(session: usize, turn: usize) -> Value {
    conversation(
        &system(),
        turn,
        |t| {
            format!(
                "session {session} question {t}: {}",
                "please explain the details ".repeat(8)
            )
        },
        |t| {
            format!(
                "answer {t} for session {session}: {}",
                "a careful answer ".repeat(8)
            )
        },
    )
}

/// The first turns of `n` conversations, sent at once.
fn burst(listener: std::net::SocketAddr, n: usize) -> Vec<Response> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|session| {
                s.spawn(move || post(listener, "/v1/chat/completions", &chat(session, 0)))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("request thread"))
            .collect()
    })
}

#[test]
fn a_hot_prefix_spreads_and_conversations_stay_with_their_cache() {
    let f = start(&FleetSpec {
        workers: 4,
        // Costs are learned from real timings, which a loaded CI machine makes noisy:
        // a generous stay factor keeps a conversation with its history whatever a
        // noisy per-char cost says; the bounded-load cap still spreads the burst.
        plugin_config: json!({"policy": "predicted_ttft", "stay_factor": 10.0}),
        engine_args: vec![
            "--max-running=1".into(),
            "--prefill-us-per-token=400".into(),
        ],
        ..FleetSpec::default()
    });
    let listener = f.envoy.listener;
    // 12 conversations start at once.
    let first = burst(listener, 12);
    let mut home = BTreeMap::new();
    for (session, r) in first.iter().enumerate() {
        assert_eq!(r.status, 200, "{r:?}");
        assert_eq!(
            header(r, "x-llm-router-worker"),
            header(r, "x-engine-worker"),
            "router and engine agree"
        );
        let predicted: f64 = header(r, "x-llm-router-predicted-ttft-ms")
            .parse()
            .expect("the predicted TTFT is a number of ms");
        assert!(predicted >= 0.0);
        home.insert(session, header(r, "x-engine-worker").to_string());
    }
    let used: BTreeSet<&String> = home.values().collect();
    assert!(
        used.len() >= 3,
        "the hot prefix is replicated, not herded onto its first holder: {home:?}"
    );
    // Later turns, one at a time: each conversation stays where its history is,
    // and its engine really serves the history from cache.
    for turn in 1..3 {
        for session in 0..12 {
            let r = post(listener, "/v1/chat/completions", &chat(session, turn));
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(
                header(&r, "x-engine-worker"),
                home[&session],
                "session {session} turn {turn} stays"
            );
            assert_eq!(header(&r, "x-llm-router-decision"), "cache_hit");
            assert_eq!(header(&r, "x-llm-router-reason"), "ttft_cache");
            assert!(
                cached_tokens(&r) > 0,
                "the engine reports a prefix cache hit: {r:?}"
            );
        }
    }
    let hits = f
        .envoy
        .filter_stat("llm_router_decisions_cache_hit")
        .unwrap();
    let misses = f
        .envoy
        .filter_stat("llm_router_decisions_cache_miss")
        .unwrap();
    assert_eq!(hits + misses, 36, "one decision per routed request");
    assert!(hits >= 24, "every later turn is a hit: {hits}");
}

/// PD with `prefill_policy: predicted_ttft`: the prefill pool is where the cache and
/// the prefill queue are, so the policy places prefills; a burst spreads over both
/// prefill engines, later turns keep their prefill worker with real cache hits, and
/// every pair still meets by room.
#[test]
fn in_pd_the_prefill_pool_spreads_a_burst_and_keeps_conversations() {
    let f = start(&FleetSpec {
        pd: Some((2, 2)),
        plugin_config: json!({"prefill_policy": "predicted_ttft", "stay_factor": 10.0}),
        engine_args: vec![
            "--max-running=1".into(),
            "--prefill-us-per-token=400".into(),
        ],
        ..FleetSpec::default()
    });
    let listener = f.envoy.listener;
    let first = burst(listener, 8);
    let mut home = BTreeMap::new();
    for (session, r) in first.iter().enumerate() {
        assert_eq!(r.status, 200, "{r:?}");
        let prefill = header(r, "x-llm-router-prefill-worker").to_string();
        assert_eq!(
            header(r, "x-engine-prefill-worker"),
            prefill,
            "the decode engine got its KV from the prefill worker the router chose"
        );
        assert!(prefill.starts_with('p'), "{prefill}");
        let predicted: f64 = header(r, "x-llm-router-predicted-ttft-ms")
            .parse()
            .expect("the prefill decision's predicted TTFT is a number of ms");
        assert!(predicted >= 0.0);
        home.insert(session, prefill);
    }
    let used: BTreeSet<&String> = home.values().collect();
    assert_eq!(
        used.len(),
        2,
        "the burst uses both prefill engines: {home:?}"
    );
    for turn in 1..3 {
        for session in 0..8 {
            let r = post(listener, "/v1/chat/completions", &chat(session, turn));
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(
                header(&r, "x-llm-router-prefill-worker"),
                home[&session],
                "session {session} turn {turn} keeps its prefill worker"
            );
            assert_eq!(header(&r, "x-llm-router-decision"), "cache_hit");
            assert_eq!(header(&r, "x-llm-router-reason"), "ttft_cache");
            assert!(
                cached_tokens(&r) > 0,
                "the prefill engine served the history from cache: {r:?}"
            );
        }
    }
    let pairs: u64 = f
        .engine_counter("decode", "engine_mock:pd_pairs_total")
        .expect("decode metrics")
        .values()
        .sum();
    assert_eq!(pairs, 24, "every request's pair met by room");
    assert_eq!(
        f.envoy
            .filter_stat("llm_router_pd_prefill_failures")
            .unwrap(),
        0
    );
}
