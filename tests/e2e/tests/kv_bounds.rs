//! End-to-end: with `kv_capacity_bound` (on by default where `predicted_ttft`
//! routes, set here for `cache_aware`), what each engine's KV cache can hold bounds
//! its worker's share of the tree, through the real Envoy, collector and engine mocks
//! (issue 54). The collector
//! reads the mock's `vllm:cache_config_info` and `vllm:prompt_tokens_total`; the
//! filter bounds at 4 chars a token, learns the engine's own from the text it routed
//! over a 20 s window, bounds the small engine's
//! share of the tree to what it can hold, and drops the share when the engine
//! restarts (its counter goes back) with an empty cache, with or without the bound.
//!
//! Prints what it saw: `cargo test -p e2e --test kv_bounds -- --nocapture`.

use e2e::support::{engine_on, header, post, signal, start, wait_for};
use llm_demo::admin::Response;
use llm_demo::fleet::{Fleet, FleetSpec};
use llm_demo::process::Guard;
use serde_json::json;
use std::cell::Cell;

/// Worker `w`'s gauge `field` (`llm_router_worker.<w>.<field>`).
fn gauge(f: &Fleet, w: &str, field: &str) -> u64 {
    f.envoy
        .filter_stat(&format!("llm_router_worker.{w}.{field}"))
        .unwrap_or(0)
}

/// A distinct 400-char completion prompt.
fn prompt(i: u64) -> serde_json::Value {
    let tag = format!("{:016x} ", (i + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    json!({"model": "mock", "max_tokens": 2, "prompt": tag.repeat(25)})
}

/// w0's engine's cache: 16 blocks of 64 chars (16 tokens each), 256 tokens,
/// about 1 KiB of text.
const SMALL_CACHE: [&str; 2] = ["--cache-blocks", "16"];

/// Two workers under `plugin_config` on `envoy_concurrency` Envoy threads, the
/// collector pushing every 100 ms, w0's engine with `SMALL_CACHE`.
fn small_w0_fleet(plugin_config: serde_json::Value, envoy_concurrency: u32) -> Fleet {
    let mut spec = FleetSpec {
        workers: 2,
        plugin_config,
        collector_interval_ms: Some(100),
        envoy_concurrency,
        ..FleetSpec::default()
    };
    spec.engine_args_for.insert(
        "w0".into(),
        SMALL_CACHE.iter().map(|s| s.to_string()).collect(),
    );
    start(&spec)
}

/// Distinct prompts posted in turn (`prompt(n)` the `n`th), each answered 200.
struct Prompts<'f> {
    fleet: &'f Fleet,
    sent: Cell<u64>,
}

impl<'f> Prompts<'f> {
    fn to(fleet: &'f Fleet) -> Self {
        Prompts {
            fleet,
            sent: Cell::new(0),
        }
    }

    fn send(&self) -> Response {
        let r = post(
            self.fleet.envoy.listener,
            "/v1/completions",
            &prompt(self.sent.get()),
        );
        assert_eq!(r.status, 200, "{r:?}");
        self.sent.set(self.sent.get() + 1);
        r
    }
}

#[test]
fn a_small_engine_cache_bounds_its_workers_share_and_a_restart_empties_it() {
    // cache_aware, whose misses go to the least loaded, so the small engine
    // gets its share of the text: the default policy, which bounds too, steers
    // new conversations away from a cache this small, and the window that
    // learns its chars per token would not fill.
    let config = json!({
        "sync_interval_ms": 100,
        "policy": "cache_aware",
        "kv_capacity_bound": true
    });
    let f = small_w0_fleet(config, 2);
    let prompts = Prompts::to(&f);
    // Distinct prompts go where the load is least: both engines get far more text
    // than w0's cache holds. Until a window closes, 4 chars a token: w0 may hold
    // 1024 chars of the tree, w1 its 65536 tokens' worth.
    wait_for("w0's share within the bound at 4 chars a token", &f, || {
        for _ in 0..5 {
            prompts.send();
        }
        gauge(&f, "w0", "kv_bound_chars") == 1024
            && gauge(&f, "w1", "kv_bound_chars") == 65536 * 4
            && gauge(&f, "w0", "tree_chars") <= 1024
            && gauge(&f, "w1", "tree_chars") > 4 * 1024
    });
    assert!(
        gauge(&f, "w0", "tree_chars") > 0,
        "w0 keeps its newest text"
    );
    // A window lasts 20 s and 4096 of the engine's tokens: then chars per token is
    // the engine's own, which the mock counts as a token per 4 chars of prompt.
    wait_for("w0's chars per token learned", &f, || {
        for _ in 0..5 {
            prompts.send();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        gauge(&f, "w0", "chars_per_token_milli") > 0
    });
    let ratio = gauge(&f, "w0", "chars_per_token_milli");
    assert!(
        (3600..=4400).contains(&ratio),
        "chars per token x1000: {ratio}"
    );
    wait_for("w0's share within its learned bound", &f, || {
        let bound = gauge(&f, "w0", "kv_bound_chars");
        bound == 256 * gauge(&f, "w0", "chars_per_token_milli") / 1000
            && gauge(&f, "w0", "tree_chars") <= bound
    });
    println!(
        "{} prompts: w0 learned {ratio} chars per 1000 tokens, holds {} of its bound {}; w1 holds {}",
        prompts.sent.get(),
        gauge(&f, "w0", "tree_chars"),
        gauge(&f, "w0", "kv_bound_chars"),
        gauge(&f, "w1", "tree_chars")
    );

    // w0's engine restarts: its cache is empty, and so is its share of the tree.
    let _again = restart_w0(&f, &SMALL_CACHE);
    // The restarted engine is routed to again, and its share grows anew.
    wait_for("w0 routed to again", &f, || {
        prompts.send();
        gauge(&f, "w0", "tree_chars") > 0
    });
}

#[test]
fn without_the_bound_a_restarted_engines_share_is_dropped_all_the_same() {
    // The bound is on by default under predicted_ttft: turned off here.
    let f = start(&FleetSpec {
        workers: 2,
        plugin_config: json!({"sync_interval_ms": 100, "kv_capacity_bound": false}),
        collector_interval_ms: Some(100),
        ..FleetSpec::default()
    });
    let prompts = Prompts::to(&f);
    // Both engines hold text, and their counters anchored a window each.
    wait_for(
        "both workers hold text, their counters anchored",
        &f,
        || {
            prompts.send();
            gauge(&f, "w0", "tree_chars") > 0
                && gauge(&f, "w1", "tree_chars") > 0
                && f.envoy
                    .filter_stat("llm_router_kv_bounds_shared")
                    .unwrap_or(0)
                    >= 2
        },
    );
    assert_eq!(gauge(&f, "w0", "kv_bound_chars"), 0, "the bound turned off");
    let _again = restart_w0(&f, &[]);
}

/// Kills w0's engine and starts it again on its port with `args`: once the collector
/// reads its counter back at zero, w0 holds nothing of the tree and w1 keeps its share.
fn restart_w0(f: &Fleet, args: &[&str]) -> Guard {
    let w0_engine = f.engine("w0").unwrap();
    let (pid, port) = (w0_engine.guard.id(), w0_engine.addr.port());
    signal(pid, "-KILL");
    let again = engine_on(f, "w0", port, args);
    wait_for("the restart seen and w0's share dropped", f, || {
        f.envoy
            .filter_stat("llm_router_engine_restarts")
            .unwrap_or(0)
            >= 1
            && gauge(f, "w0", "tree_chars") == 0
    });
    assert!(gauge(f, "w1", "tree_chars") > 0, "w1 keeps its share");
    again
}

#[test]
fn the_default_places_new_conversations_where_a_cache_has_room() {
    // The default policy bounds the tree by the engines' caches and weighs each
    // worker's conversations by its engine's room: w0's cache holds 256 tokens,
    // w1's 65536, so once both capacities are stated, new conversations go to w1.
    // The engines are alike, but on a loaded machine their learned speeds are not:
    // with the default load factor a new conversation is placed for balance only
    // among engines predicted within 1.25x of the soonest, and w1, taking most of
    // the work, was once learned slower than that and took none. The room is what
    // this test is about, so balance may cost up to 4x here.
    let f = small_w0_fleet(
        json!({"sync_interval_ms": 100, "decision_headers": true, "load_factor": 3}),
        1,
    );
    let prompts = Prompts::to(&f);
    wait_for("both engines' capacities bound their workers", &f, || {
        prompts.send();
        gauge(&f, "w0", "kv_bound_chars") > 0 && gauge(&f, "w1", "kv_bound_chars") > 0
    });
    let mut on = [0u32; 2];
    for _ in 0..40 {
        match header(&prompts.send(), "x-llm-router-worker").as_str() {
            "w0" => on[0] += 1,
            "w1" => on[1] += 1,
            other => panic!("routed to {other}"),
        }
    }
    println!(
        "40 new conversations after the capacities: w0 {}, w1 {}",
        on[0], on[1]
    );
    assert!(on[1] >= 36, "the small cache took {} of 40", on[0]);
}
