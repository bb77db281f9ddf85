//! End-to-end PD: the real Envoy with the filter in front of prefill and decode
//! engine mocks that meet by `bootstrap_room` on the prefill mock's bootstrap
//! server, exactly as SGLang engines do. A pair only completes if the filter gave
//! both the same room and the decode the chosen prefill's bootstrap address.

use e2e::support::{cached_tokens, conversation, header, post, start, EXPLAINED_JSON};
use llm_demo::admin;
use llm_demo::fleet::{Fleet, FleetSpec};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn pd_fleet(prefill: usize, decode: usize, engine_args: &[&str], plugin: Value) -> Fleet {
    let spec = FleetSpec {
        pd: Some((prefill, decode)),
        engine_args: engine_args.iter().map(|s| s.to_string()).collect(),
        plugin_config: plugin,
        ..FleetSpec::default()
    };
    start(&spec)
}

fn chat(session: usize, turn: usize) -> Value {
    let system =
        format!("Session {session} 助手 🚀. ") + &"Keep the answers short and exact. ".repeat(25);
    let mut body = conversation(
        &system,
        turn,
        |t| format!("question {t} of session {session}"),
        |t| format!("answer {t}"),
    );
    body["max_tokens"] = json!(4);
    body
}

fn pairs(f: &Fleet) -> u64 {
    f.engine_counter("decode", "engine_mock:pd_pairs_total")
        .expect("decode metrics")
        .values()
        .sum()
}

#[test]
fn pairs_meet_by_room_and_each_conversation_keeps_its_prefill_worker() {
    let f = pd_fleet(2, 2, &[], json!({}));
    let mut requests = 0;
    for session in 0..4 {
        let mut owner: Option<String> = None;
        for turn in 0..4 {
            let r = post(
                f.envoy.listener,
                "/v1/chat/completions",
                &chat(session, turn),
            );
            requests += 1;
            assert_eq!(r.status, 200, "{r:?}");
            let prefill = header(&r, "x-llm-router-prefill-worker").to_string();
            assert_eq!(
                header(&r, "x-engine-prefill-worker"),
                prefill,
                "the decode engine got its KV from the prefill worker the router chose"
            );
            assert_eq!(
                header(&r, "x-engine-worker"),
                header(&r, "x-llm-router-worker")
            );
            assert!(header(&r, "x-engine-worker").starts_with('d'));
            match &owner {
                None => owner = Some(prefill),
                Some(o) => {
                    assert_eq!(
                        &prefill, o,
                        "session {session} turn {turn} keeps its prefill worker"
                    );
                    assert_eq!(header(&r, "x-llm-router-decision"), "cache_hit");
                    assert!(
                        cached_tokens(&r) > 0,
                        "the prefill engine's cache served it: {r:?}"
                    );
                }
            }
        }
    }
    assert_eq!(pairs(&f), requests, "every request's pair met by room");
    assert_eq!(
        f.envoy.filter_stat("llm_router_pd_pairs").unwrap(),
        requests
    );
    assert_eq!(
        f.envoy
            .filter_stat("llm_router_pd_prefill_failures")
            .unwrap(),
        0
    );
}

#[test]
fn batches_and_streams_pass_through_the_pair() {
    let f = pd_fleet(2, 2, &[], json!({}));
    let batch = json!({"model": "mock", "prompt": ["first prompt", "second prompt", "third"], "max_tokens": 2});
    let r = post(f.envoy.listener, "/v1/completions", &batch);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(pairs(&f), 3, "one room per prompt, each met");
    let mut stream = chat(9, 0);
    stream["stream"] = json!(true);
    let r = post(f.envoy.listener, "/v1/chat/completions", &stream);
    assert_eq!(r.status, 200, "{r:?}");
    assert!(
        r.body.contains("data: [DONE]"),
        "the stream arrives whole: {}",
        r.body
    );
    assert_eq!(pairs(&f), 4);
}

#[test]
fn a_prefill_that_fails_or_times_out_answers_the_client_before_the_decode_gives_up() {
    // Decode engines would wait 60 s for KV; the client must not.
    let mut f = pd_fleet(
        1,
        1,
        &["--kv-wait-ms=60000"],
        json!({"prefill_timeout_ms": 500}),
    );
    let slow = f.engine("p0").expect("p0").addr;
    admin::post(slow, "/admin/latency", r#"{"ttft_ms": 5000}"#).expect("slow down p0");
    let started = Instant::now();
    let r = post(f.envoy.listener, "/v1/chat/completions", &chat(0, 0));
    assert_eq!(r.status, 504, "{r:?}");
    assert_eq!(header(&r, "x-llm-router-reason"), "prefill_timeout");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "answered at the prefill timeout, not the decode's KV wait"
    );
    // The prefill engine goes away: Envoy cannot connect, the client gets a 502.
    f.engines.retain(|e| e.name != "p0");
    let r = post(f.envoy.listener, "/v1/chat/completions", &chat(1, 0));
    assert_eq!(r.status, 502, "{r:?}");
    assert_eq!(header(&r, "x-llm-router-reason"), "prefill_error");
    assert_eq!(header(&r, "x-llm-router-prefill-worker"), "p0");
    assert!(r.body.contains("prefill worker p0 failed"), "{}", r.body);
    assert_eq!(
        f.envoy
            .filter_stat("llm_router_pd_prefill_failures")
            .unwrap(),
        2
    );
}

#[test]
fn a_body_that_cannot_carry_a_room_is_refused_with_a_reason() {
    let f = pd_fleet(1, 1, &[], json!({}));
    let r = admin::request(
        f.envoy.listener,
        "POST",
        "/v1/completions",
        EXPLAINED_JSON,
        b"[\"not an object\"]",
    )
    .unwrap();
    assert_eq!(r.status, 400, "{r:?}");
    assert_eq!(header(&r, "x-llm-router-reason"), "body_not_json_object");
    assert_eq!(pairs(&f), 0);
}

/// `envoy/envoy-pd.yaml` as shipped (ports and the .wasm path rewritten) in front of
/// 2 prefill and 2 decode mocks.
#[test]
fn the_shipped_pd_config_routes_pairs() {
    let dir = llm_demo::fleet::TempDir::new("llm-example-pd").unwrap();
    let roster = [
        ("p0", "prefill"),
        ("p1", "prefill"),
        ("d0", "decode"),
        ("d1", "decode"),
    ];
    let engines: Vec<_> = roster
        .iter()
        .map(|(name, pool)| llm_demo::fleet::start_engine_in(name, pool, &[], &dir.0).unwrap())
        .collect();
    let envoy = llm_demo::fleet::launch_example("envoy/envoy-pd.yaml", &engines, &dir.0)
        .unwrap_or_else(|e| panic!("{e:#}"));
    let mut owner = None;
    for turn in 0..3 {
        let r = admin::request(
            envoy.listener,
            "POST",
            "/v1/chat/completions",
            EXPLAINED_JSON,
            chat(0, turn).to_string().as_bytes(),
        )
        .unwrap();
        assert_eq!(r.status, 200, "{r:?}");
        let prefill = header(&r, "x-engine-prefill-worker").to_string();
        assert_eq!(header(&r, "x-llm-router-prefill-worker"), prefill);
        assert_eq!(owner.get_or_insert(prefill.clone()), &prefill, "sticks");
    }
}
