//! End-to-end: engine mocks publish their KV cache events as vLLM 0.34 does, the
//! collector follows them (`--kv-events`), and its block index of each engine agrees
//! with what the engine's cache holds, through traffic that fills and evicts the
//! caches and a cache reset (issue 54).
//!
//! Prints what it saw: `cargo test -p e2e --test kv_events -- --nocapture`.

use e2e::support::{post, start, wait_for};
use llm_demo::fleet::FleetSpec;
use serde_json::json;

#[test]
fn the_collectors_index_of_each_engine_is_what_its_cache_holds() {
    let f = start(&FleetSpec {
        workers: 2,
        // 32 blocks of 64 chars: the traffic below fills and evicts them.
        engine_args: vec!["--cache-blocks".into(), "32".into()],
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
