//! End-to-end: engine mocks publish their KV cache events as vLLM 0.34 does, the
//! collector follows them (`--kv-events`), and its block index of each engine agrees
//! with what the engine's cache holds, through traffic that fills and evicts the
//! caches and a cache reset; and it answers which engine holds a prompt
//! (`POST /kv/match`) as the engines' caches do (issue 54).
//!
//! Prints what it saw: `cargo test -p e2e --test kv_events -- --nocapture`.

use e2e::support::{header, post, start, wait_for};
use llm_demo::admin::Response;
use llm_demo::fleet::FleetSpec;
use serde_json::{json, Value};
use std::net::SocketAddr;

/// The leading blocks engine `w` holds in a `/kv/match` answer (`None`: its index
/// is not whole).
fn held(m: &Value, w: &str) -> Option<u64> {
    m["engines"][w]["held_blocks"].as_u64()
}

/// Distinct warm-up completions: the KV events an engine publishes for one tell a
/// collector the engine is there (an engine's index is whole from the first batch
/// the collector hears; one published before it subscribed is replayed once a
/// later one shows the gap).
#[derive(Default)]
struct WarmUps(std::cell::Cell<usize>);

impl WarmUps {
    fn next(&self) -> Value {
        self.0.set(self.0.get() + 1);
        let prompt = format!("warm-up {} ", self.0.get()).repeat(8);
        json!({"model": "mock", "max_tokens": 2, "prompt": prompt})
    }
}

/// Whether a `/kv/match` answer vouches for every engine it names (each index
/// whole).
fn all_whole(m: &Value) -> bool {
    m["engines"]
        .as_object()
        .is_some_and(|e| e.values().all(|engine| engine["index"] == "whole"))
}

/// Sends `body` to `path` on `addr` and checks it was answered by `engine` as a
/// cache hit, whatever the policy's reason (`what` names the request in a
/// failure); the response.
fn hit_on(addr: SocketAddr, path: &str, body: &Value, engine: &str, what: &str) -> Response {
    let r = post(addr, path, body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        (
            header(&r, "x-engine-worker"),
            header(&r, "x-llm-router-decision")
        ),
        (engine.to_string(), "cache_hit".to_string()),
        "{what}"
    );
    r
}

#[test]
fn the_collectors_index_of_each_engine_is_what_its_cache_holds() {
    let f = start(&FleetSpec {
        workers: 2,
        // 32 blocks of 64 chars: the traffic below fills and evicts them, on both
        // engines (round robin: the subject is the index, not the routing).
        engine_args: vec!["--cache-blocks".into(), "32".into()],
        plugin_config: json!({"policy": "round_robin"}),
        collector_interval_ms: Some(100),
        kv_events: true,
        ..FleetSpec::default()
    });
    let send = |from: u64, n: u64| {
        for i in from..from + n {
            let tag = format!("{:016x} ", (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
            let body = json!({"model": "mock", "max_tokens": 2, "prompt": tag.repeat(30)});
            let r = post(f.envoy.listener, "/v1/completions", &body);
            assert_eq!(r.status, 200, "{r:?}");
        }
    };
    let agree = |full: bool| {
        let blocks = f.kv_blocks().unwrap_or_default();
        blocks.len() == 2
            && blocks
                .values()
                .all(|(indexed, held)| indexed == held && (!full || *held == 32))
    };
    // The collector subscribes as it starts; what an engine published before it
    // joined comes from the engine's replay buffer.
    send(0, 40);
    wait_for("the index agrees with full, evicting caches", &f, || {
        agree(true)
    });
    println!("after 40 prompts: {:?}", f.kv_blocks().unwrap());

    // w0's cache is reset: AllBlocksCleared empties its index, w1's stays.
    let w0 = f.engine("w0").unwrap().addr;
    assert_eq!(
        post(w0, "/admin/reset_prefix_cache", &json!({})).status,
        200
    );
    wait_for("w0's index emptied", &f, || {
        f.kv_blocks()
            .is_ok_and(|b| b.get("w0") == Some(&(0, 0)) && b.get("w1") == Some(&(32, 32)))
    });
    send(40, 10);
    wait_for("the index agrees again", &f, || agree(false));
    println!("after the reset and 10 more: {:?}", f.kv_blocks().unwrap());
}

/// The collector tokenizes a request as the engine mocks do, hashes its blocks as
/// vLLM does, and answers, per engine, how many of its leading blocks the engine's
/// KV events say it holds: the engine that served the prompt holds every full block,
/// the other none, and after that engine's cache is reset, none either.
#[test]
fn the_collector_answers_which_engine_holds_a_prompt() {
    let f = start(&FleetSpec {
        workers: 2,
        collector_interval_ms: Some(100),
        kv_events: true,
        ..FleetSpec::default()
    });
    let body = json!({
        "model": "mock",
        "max_tokens": 2,
        "messages": [
            {"role": "system", "content": "You answer questions about one long manual. ".repeat(20)},
            {"role": "user", "content": "Which page covers the gearbox?"},
        ],
    });
    let path = "/v1/chat/completions";
    let warm = WarmUps::default();
    wait_for("both engines heard", &f, || {
        let r = post(f.envoy.listener, "/v1/completions", &warm.next());
        r.status == 200
            && f.kv_match(path, &body).is_ok_and(|(_, m)| {
                m["engines"].as_object().is_some_and(|e| e.len() == 2) && all_whole(&m)
            })
    });
    let r = post(f.envoy.listener, path, &body);
    assert_eq!(r.status, 200, "{r:?}");
    let owner = header(&r, "x-engine-worker");
    let other = if owner == "w0" { "w1" } else { "w0" };
    wait_for("the owner's blocks indexed", &f, || {
        f.kv_match(path, &body).is_ok_and(|(status, m)| {
            status == 200 && held(&m, &owner) == m["blocks"].as_u64() && held(&m, other) == Some(0)
        })
    });
    let (_, m) = f.kv_match(path, &body).unwrap();
    println!("after one request: {m}");
    // "system: " + 880 chars + "\n" + "user: " + 30 chars + "\n": 926 chars, 232 tokens
    // of 4 chars, 14 full blocks of 16.
    assert_eq!(
        (m["tokens"].as_u64(), m["blocks"].as_u64()),
        (Some(232), Some(14))
    );
    assert_eq!(m["engines"][&owner]["index"], "whole");

    // A prompt that shares only the system prompt: its leading blocks.
    let mut follow_up = body.clone();
    follow_up["messages"][1]["content"] = json!("And which one covers the brakes, exactly?");
    let (status, m) = f.kv_match(path, &follow_up).unwrap();
    assert_eq!(status, 200);
    let shared = held(&m, &owner).unwrap();
    assert!(
        (1..m["blocks"].as_u64().unwrap()).contains(&shared),
        "the system prompt's blocks only: {m}"
    );

    let addr = f.engine(&owner).unwrap().addr;
    assert_eq!(
        post(addr, "/admin/reset_prefix_cache", &json!({})).status,
        200
    );
    wait_for("the reset heard", &f, || {
        f.kv_match(path, &body)
            .is_ok_and(|(_, m)| held(&m, &owner) == Some(0))
    });

    // What the collector cannot match it says, and the router keeps its tree.
    let (status, m) = f.kv_match("/v1/embeddings", &body).unwrap();
    assert_eq!(status, 400, "{m}");
    assert!(
        m["error"].as_str().unwrap().contains("/v1/embeddings"),
        "{m}"
    );
    let (status, _) = f.kv_match(path, &json!({"messages": 3})).unwrap();
    assert_eq!(status, 400);
}

/// `kv_match`: the filter asks the collector which engines hold each prompt and
/// follows them. Prompts are put in engines' caches behind the router's back (sent
/// to the engines straight), so its tree knows none of them: through Envoy each goes
/// to the engine holding it, a cache hit. With the collector gone, requests are
/// still routed, by the tree, and the filter counts them unanswered.
#[test]
fn the_filter_follows_the_engine_that_holds_a_prompt() {
    follows_the_engine_that_holds_a_prompt("cache_aware");
}

/// The same under the default policy, whose predictions price what the engines hold.
#[test]
fn the_default_policy_follows_the_engine_that_holds_a_prompt() {
    follows_the_engine_that_holds_a_prompt("predicted_ttft");
}

fn follows_the_engine_that_holds_a_prompt(policy: &str) {
    let mut f = start(&FleetSpec {
        workers: 3,
        collector_interval_ms: Some(100),
        kv_events: true,
        // A collector on a loaded machine may take longer than the default 25 ms.
        plugin_config: json!({"policy": policy, "kv_match": {"timeout_ms": 2000}}),
        ..FleetSpec::default()
    });
    let path = "/v1/chat/completions";
    let prompt = |i: usize| {
        json!({
            "model": "mock",
            "max_tokens": 2,
            "messages": [
                {"role": "system", "content": format!("Manual {i}: ").repeat(60)},
                {"role": "user", "content": "Which page covers the gearbox?"},
            ],
        })
    };
    let names = ["w0", "w1", "w2"];
    let warm = WarmUps::default();
    wait_for("every engine heard", &f, || {
        let body = warm.next();
        names
            .iter()
            .all(|w| post(f.engine(w).unwrap().addr, "/v1/completions", &body).status == 200)
            && f.kv_match(path, &prompt(0))
                .is_ok_and(|(_, m)| names.iter().all(|w| held(&m, w).is_some()))
    });
    for i in 0..6 {
        let addr = f.engine(names[i % 3]).unwrap().addr;
        assert_eq!(post(addr, path, &prompt(i)).status, 200);
    }
    wait_for("every engine's blocks indexed", &f, || {
        (0..6).all(|i| {
            f.kv_match(path, &prompt(i)).is_ok_and(|(_, m)| {
                let whole = names.iter().all(|w| held(&m, w).is_some());
                whole && held(&m, names[i % 3]) == m["blocks"].as_u64()
            })
        })
    });
    for i in 0..6 {
        let what = format!("prompt {i} goes where the engine holds it");
        hit_on(f.envoy.listener, path, &prompt(i), names[i % 3], &what);
    }
    let stat = |name: &str| f.envoy.filter_stat(name).unwrap_or(0);
    wait_for("the decisions counted", &f, || {
        stat("llm_router_kv_match_ranked") >= 6
    });
    println!(
        "ranked {}, partial {}, unanswered {}",
        stat("llm_router_kv_match_ranked"),
        stat("llm_router_kv_match_partial"),
        stat("llm_router_kv_match_unanswered")
    );

    // The collector stops: no answer, and each request is routed by the tree (which
    // recorded the six above where they went).
    drop(f.collector.take());
    for i in 0..6 {
        let what = format!("prompt {i} by the tree");
        hit_on(f.envoy.listener, path, &prompt(i), names[i % 3], &what);
    }
    wait_for("the unanswered questions counted", &f, || {
        stat("llm_router_kv_match_unanswered") >= 6
    });
}

/// `kv_match` across Envoy replicas that share nothing (no bus): a conversation's
/// turn that reaches a replica whose tree never saw it goes where the first turn
/// went, because the engines' KV events say where its prefix is.
#[test]
fn replicas_without_a_bus_agree_through_the_engines() {
    replicas_agree_through_the_engines("cache_aware");
}

/// The same under the default policy.
#[test]
fn replicas_without_a_bus_agree_through_the_engines_under_the_default_policy() {
    replicas_agree_through_the_engines("predicted_ttft");
}

fn replicas_agree_through_the_engines(policy: &str) {
    let spec = FleetSpec {
        workers: 4,
        collector_interval_ms: Some(100),
        kv_events: true,
        // A collector on a loaded machine may take longer than the default 25 ms.
        plugin_config: json!({"policy": policy, "kv_match": {"timeout_ms": 2000}}),
        ..FleetSpec::default()
    };
    let r = llm_demo::replicas::Replicas::start(&spec, 2, false)
        .unwrap_or_else(|e| panic!("cannot start the replicas: {e:#}"));
    let (a, b) = (r.replicas[0].envoy.listener, r.replicas[1].envoy.listener);
    let path = "/v1/chat/completions";
    let turn = |i: usize, turns: usize| {
        let mut messages = vec![
            json!({"role": "system", "content": format!("Conversation {i}: you answer about one manual. ").repeat(12)}),
        ];
        for t in 0..turns {
            messages.push(
                json!({"role": "user", "content": format!("question {t} of conversation {i}")}),
            );
            if t + 1 < turns {
                messages.push(json!({"role": "assistant", "content": format!("answer {t}")}));
            }
        }
        json!({"model": "mock", "max_tokens": 2, "messages": messages})
    };
    // Each replica's collector follows every engine once it has heard each (an
    // engine's batch sent before a subscription took hold is replayed with its
    // next one): warm-ups straight to the engines until replica b's says so.
    let b_dir = r.dir.join(&r.replicas[1].name);
    let warm = WarmUps::default();
    let whole = || {
        let body = warm.next();
        r.engines
            .iter()
            .all(|e| post(e.addr, "/v1/completions", &body).status == 200)
            && llm_demo::fleet::kv_match_in(&b_dir, path, &turn(0, 1))
                .is_ok_and(|(_, m)| all_whole(&m))
    };
    assert!(
        e2e::support::wait_until(whole),
        "replica b's collector heard every engine"
    );
    let mut homes = Vec::new();
    for i in 0..8 {
        let r = post(a, path, &turn(i, 1));
        assert_eq!(r.status, 200, "{r:?}");
        homes.push(header(&r, "x-engine-worker"));
    }
    // The second turns go to replica b, whose tree has none of them; the engines'
    // events reach its collector a moment after the first turns were answered.
    let heard = |i: usize, home: &str| {
        llm_demo::fleet::kv_match_in(&b_dir, path, &turn(i, 1)).is_ok_and(|(_, m)| {
            m["blocks"].as_u64().is_some_and(|b| b > 0)
                && m["engines"][home]["held_blocks"] == m["blocks"]
        })
    };
    assert!(
        e2e::support::wait_until(|| homes.iter().enumerate().all(|(i, h)| heard(i, h))),
        "replica b's collector heard where every first turn went"
    );
    for (i, home) in homes.iter().enumerate() {
        let what = format!("conversation {i} stays on its engine");
        hit_on(b, path, &turn(i, 2), home, &what);
    }
    // Counted as the routing thread hands its counters over (every 100 ms).
    let ranked = || r.filter_stat_sum("llm_router_kv_match_ranked").unwrap_or(0);
    assert!(
        e2e::support::wait_until(|| ranked() >= 8),
        "the engines decided the second turns: {}",
        ranked()
    );
    println!("homes {homes:?}; decisions by the engines: {}", ranked());
}

/// The whole loop on a model's tokenizer: the engine mocks read prompts with a
/// `tokenizer.json` and chat template (`--tokenizer`), as vLLM does, and publish
/// the model's token ids; the collector reads requests with the same files
/// (`--kv-tokenizer`). A prompt cached behind the router's back is then matched in
/// full, and the router sends it to that engine, which serves it from its cache.
#[test]
fn the_loop_runs_on_a_models_tokenizer_and_chat_template() {
    let tmp = llm_demo::fleet::TempDir::new("llm-model").unwrap();
    let words: Vec<String> = (0..300).map(|i| format!("word{i}")).collect();
    // A model the test builds: a word-level tokenizer.json over `words`, and a
    // tokenizer_config.json with Zephyr's chat template.
    let template = engine_model::model_tokenizer::fixture::TEMPLATE;
    engine_model::model_tokenizer::fixture::write_model_dir(&tmp.0, &words, Some(template))
        .unwrap();
    let model = tmp.0.to_string_lossy().into_owned();
    let f = start(&FleetSpec {
        workers: 2,
        collector_interval_ms: Some(100),
        kv_events: true,
        engine_args: vec!["--tokenizer".into(), model.clone()],
        collector_args: vec!["--kv-tokenizer".into(), model],
        plugin_config: json!({"policy": "cache_aware", "kv_match": {"timeout_ms": 2000}}),
        ..FleetSpec::default()
    });
    let path = "/v1/chat/completions";
    // 100 words of system prompt: with the template's tokens, 6 full blocks of 16.
    let prompt = |i: usize| {
        let system: Vec<&str> = (0..100)
            .map(|w| words[(w * 7 + i * 13) % 300].as_str())
            .collect();
        json!({"model": "mock", "max_tokens": 2, "messages": [
            {"role": "system", "content": system.join(" ")},
            {"role": "user", "content": format!("word{i} word{}", i + 1)},
        ]})
    };
    let w1 = f.engine("w1").unwrap().addr;
    for i in 0..4 {
        assert_eq!(post(w1, path, &prompt(i)).status, 200);
    }
    wait_for("w1's blocks of every prompt indexed", &f, || {
        (0..4).all(|i| {
            f.kv_match(path, &prompt(i)).is_ok_and(|(_, m)| {
                m["blocks"].as_u64().is_some_and(|b| b >= 6)
                    && held(&m, "w1") == m["blocks"].as_u64()
                    && held(&m, "w0") == Some(0)
            })
        })
    });
    let (_, m) = f.kv_match(path, &prompt(0)).unwrap();
    println!("the collector on the model's tokenizer: {m}");
    for i in 0..4 {
        let r = hit_on(
            f.envoy.listener,
            path,
            &prompt(i),
            "w1",
            &format!("prompt {i}"),
        );
        let cached = e2e::support::cached_tokens(&r);
        assert!(cached >= 96, "served from w1's cache: {cached} tokens");
    }
}
