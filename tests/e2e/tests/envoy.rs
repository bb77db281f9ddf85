//! End-to-end: the real Envoy 1.40 with the built filter in front of engine mocks.
//!
//! Needs the filter built (`cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm`) and Envoy installed (`envoy/get-envoy`); `tests/run` does both.
//! Every fleet runs on OS-chosen ports and is stopped when its test ends, pass or
//! fail.

use e2e::support::{
    cached_tokens, conversation, header, post, send, start, wait_for, wait_until, EXPLAINED_JSON,
};
use llm_demo::admin::{self, Response};
use llm_demo::envoy::Target;
use llm_demo::fleet::{Fleet, FleetSpec};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};

fn fleet(workers: usize, plugin_config: Value) -> Fleet {
    start(&FleetSpec {
        workers,
        plugin_config,
        ..FleetSpec::default()
    })
}

/// A conversation's body at `turn` (0-based): a system prompt, earlier turns with
/// replies, and a new question.
fn chat(system: &str, session: usize, turn: usize) -> Value {
    conversation(
        system,
        turn,
        |t| {
            format!(
                "session {session} question {t}: {}",
                "please explain the details at length ".repeat(4)
            )
        },
        |t| {
            format!(
                "answer {t} for session {session}: {}",
                "here is a long and careful answer ".repeat(4)
            )
        },
    )
}

fn system_prompt(i: usize) -> String {
    format!("You are assistant number {i}. ") + &"Follow the house rules carefully. ".repeat(20)
}

#[test]
fn conversation_sticks_to_one_worker_with_real_engine_cache_hits() {
    let f = fleet(4, json!({"policy": "cache_aware"}));
    for session in 0..6 {
        let system = system_prompt(session);
        let first = post(
            f.envoy.listener,
            "/v1/chat/completions",
            &chat(&system, session, 0),
        );
        assert_eq!(first.status, 200, "{first:?}");
        let owner = header(&first, "x-engine-worker").to_string();
        assert_eq!(
            header(&first, "x-llm-router-worker"),
            owner,
            "router and engine agree"
        );
        for turn in 1..4 {
            let r = post(
                f.envoy.listener,
                "/v1/chat/completions",
                &chat(&system, session, turn),
            );
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(
                header(&r, "x-engine-worker"),
                owner,
                "session {session} turn {turn} stays"
            );
            assert_eq!(header(&r, "x-llm-router-decision"), "cache_hit");
            assert!(
                cached_tokens(&r) > 0,
                "the engine itself reports a prefix cache hit: {r:?}"
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
    assert_eq!(hits + misses, 24, "one decision per routed request");
    assert_eq!(hits, 18, "every later turn is a hit");
}

#[test]
fn different_prefixes_spread_over_the_fleet() {
    let f = fleet(4, json!({}));
    let mut used = BTreeSet::new();
    for session in 0..64 {
        let r = post(
            f.envoy.listener,
            "/v1/chat/completions",
            &chat(&system_prompt(100 + session), session, 0),
        );
        assert_eq!(r.status, 200);
        used.insert(header(&r, "x-engine-worker").to_string());
    }
    assert_eq!(
        used.len(),
        4,
        "new conversations spread over an idle fleet: {used:?}"
    );
}

#[test]
fn imbalanced_fleet_goes_least_load() {
    // Low thresholds (margin 2) so a handful of slow requests make the owner spill.
    let f = fleet(
        3,
        json!({"policy": "cache_aware", "balance_abs_threshold": 2, "balance_rel_threshold": 1.5}),
    );
    let system = system_prompt(7);
    let first = post(
        f.envoy.listener,
        "/v1/chat/completions",
        &chat(&system, 0, 0),
    );
    let owner = header(&first, "x-engine-worker").to_string();
    let owner_addr = f.engine(&owner).unwrap().addr;
    let slow = admin::post(owner_addr, "/admin/latency", r#"{"ttft_ms": 1500}"#).unwrap();
    assert_eq!(slow.status, 200, "{slow:?}");
    let listener = f.envoy.listener;
    let body = chat(&system, 0, 1).to_string();
    let handles: Vec<_> = (0..6)
        .map(|i| {
            let body = body.clone();
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(150 * i));
                admin::request(
                    listener,
                    "POST",
                    "/v1/chat/completions",
                    EXPLAINED_JSON,
                    body.as_bytes(),
                )
                .unwrap()
            })
        })
        .collect();
    let responses: Vec<Response> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let mut reasons = BTreeMap::new();
    for r in &responses {
        assert_eq!(r.status, 200, "{r:?}");
        *reasons
            .entry(header(r, "x-llm-router-reason").to_string())
            .or_insert(0) += 1;
        if header(r, "x-llm-router-reason") == "imbalanced" {
            assert_ne!(
                header(r, "x-engine-worker"),
                owner,
                "least-load avoids the busy owner"
            );
        }
    }
    assert!(
        reasons.get("cache_hit").copied().unwrap_or(0) >= 1,
        "{reasons:?}"
    );
    assert!(
        reasons.get("imbalanced").copied().unwrap_or(0) >= 1,
        "the owner's in-flight pile-up triggers least-load: {reasons:?}"
    );
}

#[test]
fn endpoint_target_routes_through_override_host() {
    let f = start(&FleetSpec {
        workers: 3,
        target: Target::Endpoint,
        ..FleetSpec::default()
    });
    for session in 0..4 {
        let system = system_prompt(200 + session);
        let mut owner = None;
        for turn in 0..3 {
            let r = post(
                f.envoy.listener,
                "/v1/chat/completions",
                &chat(&system, session, turn),
            );
            assert_eq!(r.status, 200, "{r:?}");
            let engine = header(&r, "x-engine-worker").to_string();
            assert_eq!(
                header(&r, "x-llm-router-worker"),
                engine,
                "override_host honoured the endpoint"
            );
            assert_eq!(
                owner.get_or_insert(engine.clone()),
                &engine,
                "sticks in endpoint mode"
            );
        }
    }
}

#[test]
fn client_cannot_choose_its_upstream() {
    let f = fleet(2, json!({}));
    let body = chat(&system_prompt(300), 0, 0);
    let first = post(f.envoy.listener, "/v1/chat/completions", &body);
    let owner = header(&first, "x-engine-worker").to_string();
    let other = if owner == "w0" { "w1" } else { "w0" };
    for _ in 0..3 {
        let r = send(
            f.envoy.listener,
            "/v1/chat/completions",
            &[("x-llm-router-cluster", &format!("engine_{other}"))],
            body.to_string().as_bytes(),
        );
        assert_eq!(
            header(&r, "x-engine-worker"),
            owner,
            "the client's header was stripped"
        );
    }
}

#[test]
fn streaming_passes_through_with_usage() {
    let f = fleet(2, json!({}));
    let mut body = chat(&system_prompt(400), 0, 0);
    body["stream"] = json!(true);
    let r = post(f.envoy.listener, "/v1/chat/completions", &body);
    assert_eq!(r.status, 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    assert!(r.body.contains("\"usage\""), "{}", r.body);
    assert!(r.body.trim_end().ends_with("data: [DONE]"), "{}", r.body);
    assert!(r.header("x-llm-router-decision").is_some());
}

#[test]
fn completions_and_generate_are_routed_by_prompt() {
    let f = fleet(3, json!({}));
    let prompt = "Once upon a time in a land of caches, ".repeat(20);
    let a = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"model": "mock", "prompt": prompt}),
    );
    let b = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"model": "mock", "prompt": format!("{prompt} and then")}),
    );
    assert_eq!(header(&a, "x-engine-worker"), header(&b, "x-engine-worker"));
    assert_eq!(header(&b, "x-llm-router-decision"), "cache_hit");
    assert!(cached_tokens(&b) > 0);
    let g = post(
        f.envoy.listener,
        "/generate",
        &json!({"text": "sglang style ".repeat(30)}),
    );
    assert_eq!(g.status, 200, "{g:?}");
    assert_eq!(header(&g, "x-llm-router-decision"), "cache_miss");
    assert_eq!(
        header(&g, "x-llm-router-reason"),
        "ttft_cold",
        "nobody holds it"
    );
}

#[test]
fn unreadable_bodies_are_still_routed() {
    let f = fleet(2, json!({}));
    let r = send(
        f.envoy.listener,
        "/v1/chat/completions",
        &[],
        b"{this is not json",
    );
    assert_eq!(header(&r, "x-llm-router-reason"), "unreadable_body");
    assert_eq!(
        r.status, 400,
        "the engine, not the router, rejects the body: {r:?}"
    );
    assert!(
        r.header("x-engine-worker").is_some(),
        "it reached an engine"
    );
    let empty = admin::request(f.envoy.listener, "GET", "/v1/models", &[], b"").unwrap();
    assert_eq!(
        empty.status, 200,
        "a bodiless request is routed too: {empty:?}"
    );
    // Counted by the VM that decided (`route_in: one_vm`: the main thread's),
    // which hands its counters to Envoy on its tick.
    wait_for("both unreadable bodies counted", &f, || {
        f.envoy.filter_stat("llm_router_unreadable_body").ok() == Some(2)
    });
}

/// A body that leaves its API open (two routing fields) is routed by the path the
/// filter reads after the body; a body that contradicts its path is routed by its
/// own shape, and the engine's 400 takes back what it recorded.
#[test]
fn the_path_decides_only_where_the_body_leaves_the_api_open() {
    let f = fleet(2, json!({}));
    let prompt = "A prompt long enough to own its prefix in the tree. ".repeat(20);
    let a = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"model": "mock", "prompt": prompt}),
    );
    assert_eq!(a.status, 200, "{a:?}");
    let b = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({
            "model": "mock",
            "prompt": format!("{prompt} and more"),
            "messages": [{"role": "user", "content": "an unrelated question"}],
        }),
    );
    assert_eq!(b.status, 200, "{b:?}");
    assert_eq!(
        header(&b, "x-llm-router-decision"),
        "cache_hit",
        "routed by its prompt, as its path says: {b:?}"
    );
    assert_eq!(header(&a, "x-engine-worker"), header(&b, "x-engine-worker"));
    let messages = json!([{"role": "user", "content": "sent to the wrong path. ".repeat(20)}]);
    let wrong = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"model": "mock", "messages": messages}),
    );
    assert_eq!(wrong.status, 400, "the engine refuses it: {wrong:?}");
    wait_for("the refused request counted unserved", &f, || {
        f.envoy.filter_stat("llm_router_unserved").ok() == Some(1)
    });
    let right = post(
        f.envoy.listener,
        "/v1/chat/completions",
        &json!({"model": "mock", "messages": messages}),
    );
    assert_eq!(right.status, 200, "{right:?}");
    assert_eq!(
        header(&right, "x-llm-router-decision"),
        "cache_miss",
        "the refused request left nothing recorded: {right:?}"
    );
}

#[test]
fn a_model_no_worker_serves_gets_503_with_a_reason() {
    let f = start(&FleetSpec {
        workers: 1,
        plugin_config: json!({"workers": [{"name": "w0", "cluster": "engine_w0", "models": ["served"]}]}),
        ..FleetSpec::default()
    });
    let r = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"model": "other", "prompt": "hello"}),
    );
    assert_eq!(r.status, 503, "{r:?}");
    assert_eq!(header(&r, "x-llm-router-reason"), "no_worker_for_model");
    let ok = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"model": "served", "prompt": "hello"}),
    );
    assert_eq!(ok.status, 200, "{ok:?}");
    // Counted by the VM that decided, which hands its counters over on its tick.
    wait_for("the refusal counted", &f, || {
        f.envoy.filter_stat("llm_router_no_worker").ok() == Some(1)
    });
    let decisions = f
        .envoy
        .filter_stat("llm_router_decisions_cache_hit")
        .unwrap()
        + f.envoy
            .filter_stat("llm_router_decisions_cache_miss")
            .unwrap();
    assert_eq!(decisions, 1, "no decision is counted for the 503");
}

#[test]
fn decision_reason_and_worker_stats_are_labelled_in_prometheus_output() {
    let f = fleet(2, json!({}));
    post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"prompt": "a prompt"}),
    );
    let r = post(
        f.envoy.listener,
        "/v1/completions",
        &json!({"prompt": "a prompt"}),
    );
    let worker = header(&r, "x-llm-router-worker");
    // Per-worker gauges are written on the filter's tick (sync_interval_ms).
    assert!(
        wait_until(
            || f.envoy.prometheus().unwrap_or_default().contains(&format!(
                "llm_router_worker_inflight{{worker=\"{worker}\"}} 0"
            ))
        ),
        "per-worker gauges: {}",
        f.envoy.prometheus().unwrap_or_default()
    );
    let text = f.envoy.prometheus().unwrap();
    // Labels from the stats_tags rules, with the values the filter counted.
    let value = |series: &str| -> f64 {
        text.lines()
            .find(|l| {
                l.starts_with(series)
                    && l.len() > series.len()
                    && l.as_bytes()[series.len()] == b' '
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
    };
    assert_eq!(value(r#"llm_router_decisions{decision="cache_miss"}"#), 1.0);
    assert_eq!(value(r#"llm_router_decisions{decision="cache_hit"}"#), 1.0);
    assert_eq!(value(r#"llm_router_reasons{reason="ttft_cold"}"#), 1.0);
    assert_eq!(value(r#"llm_router_reasons{reason="ttft_cache"}"#), 1.0);
    assert_eq!(
        value(&format!(r#"llm_router_worker_routed{{worker="{worker}"}}"#)),
        2.0,
        "both requests on the prefix owner"
    );
    let per_worker_hit = text
        .lines()
        .find(|l| {
            l.starts_with("llm_router_worker_decisions{")
                && l.contains(&format!(r#"worker="{worker}""#))
                && l.contains(r#"decision="cache_hit""#)
        })
        .unwrap_or_else(|| panic!("per-worker decisions with both labels:\n{text}"));
    assert!(per_worker_hit.ends_with(" 1"), "{per_worker_hit}");
    let matched = value(&format!(
        r#"llm_router_worker_matched_chars{{worker="{worker}"}}"#
    ));
    let routed = value(&format!(
        r#"llm_router_worker_routed_chars{{worker="{worker}"}}"#
    ));
    assert!(
        matched > 0.0 && matched <= routed,
        "{matched} of {routed} chars matched"
    );
    assert!(
        !text.contains("llm_router_decisions_cache_miss"),
        "the dimension left the name"
    );
}

#[test]
fn an_invalid_plugin_config_is_rejected_with_the_field_named() {
    let err = Fleet::start(&FleetSpec {
        workers: 1,
        plugin_config: json!({"cache_threshold": 7}),
        ..FleetSpec::default()
    });
    let Err(e) = err else {
        panic!("Envoy must refuse a config the filter rejects");
    };
    let msg = format!("{e:#}");
    assert!(
        msg.contains("cache_threshold"),
        "the log names the field: {msg}"
    );
}

/// The example configs users copy must really work: each is started as shipped,
/// with only its ports and the .wasm path rewritten, in front of engine mocks.
#[test]
fn shipped_example_configs_route_for_real() {
    for file in ["envoy/envoy-cluster.yaml", "envoy/envoy-endpoint.yaml"] {
        let dir = llm_demo::fleet::TempDir::new("llm-example").unwrap();
        let engines: Vec<_> = (0..4)
            .map(|i| llm_demo::fleet::start_engine(&format!("w{i}"), &[], &dir.0).unwrap())
            .collect();
        let envoy = llm_demo::fleet::launch_example(file, &engines, &dir.0)
            .unwrap_or_else(|e| panic!("{e:#}"));
        let system = system_prompt(500);
        let mut owner = None;
        for turn in 0..3 {
            let r = admin::request(
                envoy.listener,
                "POST",
                "/v1/chat/completions",
                EXPLAINED_JSON,
                chat(&system, 0, turn).to_string().as_bytes(),
            )
            .unwrap();
            assert_eq!(r.status, 200, "{file}: {r:?}");
            let engine = header(&r, "x-engine-worker").to_string();
            assert_eq!(
                header(&r, "x-llm-router-worker"),
                engine,
                "{file}: the chosen engine served it"
            );
            assert_eq!(
                owner.get_or_insert(engine.clone()),
                &engine,
                "{file}: sticks"
            );
        }
        let text = envoy.prometheus().unwrap();
        assert!(
            text.contains(r#"llm_router_decisions{decision="cache_hit"} 2"#),
            "{file}: its stats_tags label the decisions:\n{text}"
        );
        let owner_name = owner.clone().unwrap_or_default();
        let owner_hits = text.lines().any(|l| {
            l.starts_with("llm_router_worker_decisions{")
                && l.contains(&format!(r#"worker="{owner_name}""#))
                && l.contains(r#"decision="cache_hit""#)
                && l.ends_with(" 2")
        });
        assert!(
            owner_hits,
            "{file}: per-worker decisions carry both labels:\n{text}"
        );
        // The access log is one JSON line per request, with the router's headers
        // (Envoy flushes it on its own schedule).
        let access_log = || -> Vec<Value> {
            std::fs::read_to_string(&envoy.log)
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v.get("decision").is_some())
                .collect()
        };
        wait_until(|| access_log().len() >= 3);
        let lines = access_log();
        assert_eq!(lines.len(), 3, "{file}: one access log line per request");
        assert_eq!(lines[2]["decision"], "cache_hit");
        assert_eq!(
            lines[2]["worker"],
            owner.clone().unwrap_or_default().as_str()
        );
        assert_eq!(lines[2]["status"], 200);
    }
}

/// Eight conversations of five turns (system prompts from `first_prompt` on), each
/// request on a new connection, which Envoy spreads over its threads: every later
/// turn is a cache hit on its first turn's worker, with the engine's cached tokens.
fn conversations_keep_their_worker(f: &Fleet, first_prompt: usize) {
    for session in 0..8 {
        let system = system_prompt(first_prompt + session);
        let first = post(
            f.envoy.listener,
            "/v1/chat/completions",
            &chat(&system, session, 0),
        );
        assert_eq!(first.status, 200, "{first:?}");
        let owner = header(&first, "x-engine-worker").to_string();
        for turn in 1..5 {
            let r = post(
                f.envoy.listener,
                "/v1/chat/completions",
                &chat(&system, session, turn),
            );
            assert_eq!(r.status, 200, "{r:?}");
            assert_eq!(
                header(&r, "x-engine-worker"),
                owner,
                "session {session} turn {turn}"
            );
            assert_eq!(header(&r, "x-llm-router-decision"), "cache_hit");
            assert!(cached_tokens(&r) > 0);
        }
    }
}

/// With 4 Envoy worker threads (4 Wasm VMs) each keeping a replica of the trees
/// (`route_in: every_vm`), a conversation keeps its worker even though its turns
/// arrive on different connections, hence on different threads.
#[test]
fn affinity_holds_across_envoy_worker_threads() {
    let f = start(&FleetSpec {
        workers: 4,
        envoy_concurrency: 4,
        plugin_config: json!({"sync_interval_ms": 50, "route_in": "every_vm"}),
        ..FleetSpec::default()
    });
    conversations_keep_their_worker(&f, 600);
    let stats = f.envoy.stats().unwrap();
    let applied = stats
        .get("wasmcustom.llm_router_sync_applied")
        .copied()
        .unwrap_or(0);
    assert!(
        applied >= 40,
        "every thread applies the shared operations: {applied}"
    );
    assert_eq!(
        stats
            .get("wasmcustom.llm_router_sync_gaps")
            .copied()
            .unwrap_or(0),
        0
    );
    // Every stream ended, so the shared in-flight table drains to zero (the gauge is
    // refreshed on each thread's tick).
    assert!(
        wait_until(|| f.envoy.filter_stat("llm_router_inflight").ok() == Some(0)),
        "in-flight counts leak: {:?}",
        f.envoy.filter_stat("llm_router_inflight")
    );
}

/// `route_in: one_vm` in the real Envoy: one VM (the main thread's) keeps the
/// trees and decides for the 4 worker threads, which ask it over shared queues; a
/// conversation keeps its worker whichever thread its turns arrive on, and the
/// asking threads keep no tree.
#[test]
fn one_vm_routes_for_every_worker_thread() {
    let f = start(&FleetSpec {
        workers: 4,
        envoy_concurrency: 4,
        plugin_config: json!({"route_in": "one_vm"}),
        ..FleetSpec::default()
    });
    conversations_keep_their_worker(&f, 700);
    // Asked and answered (a worker thread whose first request came before the
    // main thread's first tick takes the seat and routes its own), none after the
    // deadline.
    let stat = |name: &str| f.envoy.filter_stat(name).ok();
    let decided = || {
        ["cache_hit", "cache_miss"]
            .map(|d| stat(&format!("llm_router_decisions_{d}")).unwrap_or(0))
            .iter()
            .sum::<u64>()
    };
    assert!(wait_until(|| decided() == 40), "decisions: {}", decided());
    assert!(wait_until(|| stat("llm_router_relay_answered")
        .unwrap_or(0)
        > 0));
    assert_eq!(stat("llm_router_relay_late").unwrap_or(0), 0);
    assert_eq!(stat("llm_router_relay_takeovers").unwrap_or(0), 0);
    // One tree in the Envoy: of the VMs' own gauges, one holds the routed texts.
    assert!(
        wait_until(|| {
            let stats = f.envoy.stats().unwrap_or_default();
            let trees: Vec<u64> = stats
                .iter()
                .filter(|(k, _)| {
                    k.starts_with("wasmcustom.llm_router_vm.") && k.ends_with(".tree_chars")
                })
                .map(|(_, v)| *v)
                .collect();
            trees.len() >= 5 && trees.iter().filter(|t| **t > 0).count() == 1
        }),
        "trees: {:?}",
        f.envoy.stats()
    );
    assert!(
        wait_until(|| stat("llm_router_inflight") == Some(0)),
        "in-flight counts leak: {:?}",
        stat("llm_router_inflight")
    );
}

/// Streams cut off by the client (a reset, not a completion) give their in-flight
/// count back too.
#[test]
fn client_disconnects_do_not_leak_in_flight_counts() {
    let f = start(&FleetSpec {
        workers: 2,
        envoy_concurrency: 2,
        // Engines that answer later than the test ever waits (`WAIT`), so the requests are
        // still in flight whenever the gauge is read, however slow a loaded machine
        // is: with 3 s they sometimes completed before a tick reported all four.
        engine_args: vec!["--ttft-ms=120000".into()],
        plugin_config: json!({"sync_interval_ms": 50}),
        ..FleetSpec::default()
    });
    let body = chat(&system_prompt(700), 0, 0).to_string();
    let conns: Vec<std::net::TcpStream> = (0..4)
        .map(|_| {
            use std::io::Write;
            let mut s = std::net::TcpStream::connect(f.envoy.listener).unwrap();
            write!(
                s,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            )
            .unwrap();
            s
        })
        .collect();
    assert!(
        wait_until(|| f.envoy.filter_stat("llm_router_inflight").ok() == Some(4)),
        "four requests in flight: {:?}",
        f.envoy.filter_stat("llm_router_inflight")
    );
    drop(conns);
    assert!(
        wait_until(|| f.envoy.filter_stat("llm_router_inflight").ok() == Some(0)),
        "reset streams release their counts: {:?}",
        f.envoy.filter_stat("llm_router_inflight")
    );
}
