//! End-to-end: latency-aware overload flags through the real Envoy. An engine mock
//! made slow is flagged from the TTFT p90 the collector computes, avoided (its
//! prefix re-homed elsewhere), probed while flagged, and let back in only after it is
//! fast again and its probes succeed.

use e2e::support::{header, overload_config, post, start, wait_for};
use llm_demo::fleet::FleetSpec;
use serde_json::{json, Value};
use std::net::SocketAddr;

const SLOW_TTFT_MS: u64 = 1500;

fn completion(prompt: &str) -> Value {
    json!({"model": "mock", "prompt": prompt, "max_tokens": 2})
}

fn set_ttft(addr: SocketAddr, ms: u64) {
    let r = post(addr, "/admin/latency", &json!({"ttft_ms": ms}));
    assert_eq!(r.status, 200, "{r:?}");
}

#[test]
fn a_slow_worker_is_flagged_avoided_and_let_back_after_its_probes() {
    let f = start(&FleetSpec {
        workers: 3,
        plugin_config: json!({"overload": overload_config()}),
        collector_interval_ms: Some(100),
        collector_args: vec!["--window-s".into(), "3".into()],
        // Several VMs (two workers and the main thread) compete for the prober lease.
        envoy_concurrency: 2,
        ..FleetSpec::default()
    });
    let stat = |name: &str| f.envoy.filter_stat(name).unwrap();
    let doc = "a long shared document about overload and recovery. ".repeat(40);
    let turn = |n: usize| completion(&format!("{doc} turn {n}"));

    let first = post(f.envoy.listener, "/v1/completions", &turn(0));
    assert_eq!(first.status, 200, "{first:?}");
    let owner = header(&first, "x-engine-worker");
    let owner_addr = f.engine(&owner).unwrap().addr;

    // Slow the owner down and let its engine measure it (straight to the engine).
    set_ttft(owner_addr, SLOW_TTFT_MS);
    let slow: Vec<_> = (0..2)
        .map(|i| {
            std::thread::spawn(move || {
                post(
                    owner_addr,
                    "/v1/completions",
                    &completion(&format!("slow {i}")),
                )
            })
        })
        .collect();
    for s in slow {
        assert_eq!(s.join().unwrap().status, 200);
    }
    wait_for("the slow owner to be flagged", &f, || {
        stat("llm_router_overload_entered") == 1 && stat("llm_router_overload_flagged") == 1
    });

    // The owner is avoided: a logical hit becomes a physical miss elsewhere...
    let moved = post(f.envoy.listener, "/v1/completions", &turn(1));
    assert_eq!(moved.status, 200, "{moved:?}");
    let new_home = header(&moved, "x-engine-worker");
    assert_ne!(new_home, owner, "a flagged worker gets no traffic");
    assert_eq!(header(&moved, "x-llm-router-decision"), "cache_miss");
    // Counted by the VM that decided, which hands its counters over on its tick.
    wait_for("the owner's filtering counted", &f, || {
        stat("llm_router_overload_owner_filtered") == 1
    });
    // ...and the prefix now lives there, so the next turn hits the new home.
    let next = post(f.envoy.listener, "/v1/completions", &turn(2));
    assert_eq!(header(&next, "x-engine-worker"), new_home);
    assert_eq!(header(&next, "x-llm-router-decision"), "cache_hit");

    // While slow, its probes time out and it stays flagged.
    wait_for("failed probes", &f, || {
        stat("llm_router_overload_probes_failed") >= 2
    });
    assert_eq!(
        stat("llm_router_overload_probes_ok"),
        0,
        "a slow engine fails its probes"
    );
    assert_eq!(stat("llm_router_overload_flagged"), 1);

    // Fast again: it returns only once its probes succeed.
    set_ttft(owner_addr, 0);
    let fresh = post(
        f.envoy.listener,
        "/v1/completions",
        &completion("right after the fix"),
    );
    if stat("llm_router_overload_recovered") == 0 {
        assert_ne!(
            header(&fresh, "x-engine-worker"),
            owner,
            "still flagged until the probes have succeeded"
        );
    }
    wait_for("the owner to recover", &f, || {
        stat("llm_router_overload_recovered") == 1 && stat("llm_router_overload_flagged") == 0
    });
    assert!(
        stat("llm_router_overload_probes_ok") >= 3,
        "recovery took a run of successful probes"
    );
    let served_by_owner = (0..30)
        .filter(|i| {
            let r = post(
                f.envoy.listener,
                "/v1/completions",
                &completion(&format!("{i} fresh conversation {i}")),
            );
            header(&r, "x-engine-worker") == owner
        })
        .count();
    assert!(
        served_by_owner > 0,
        "the recovered worker takes new work again"
    );
    assert_eq!(stat("llm_router_overload_entered"), 1, "no thrashing");
}
