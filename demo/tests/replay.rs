//! The demo and `host-sim replay` agree: the same workload through the real Envoy
//! with engine mocks (`llm-demo`) and through the same filter in host-sim's virtual
//! time routes every request to the same worker with the same cache outcome.
//!
//! Needs the filter, host-sim, the engine mock, the collector and Envoy (`tests/run`
//! builds them).

mod common;

/// `host-sim replay` on the demo's default workload at concurrency 1 routes every
/// request where `envoy/demo --concurrency 1` does: same per-worker counts, decisions
/// and engine-reported cached tokens. Latencies, push counts and `sync.applied` (when
/// Envoy's main-thread VM last ticked before the stats were read) depend on time.
/// So does every decision of `predicted_ttft` (the default), which learns the
/// engines' speeds from what it measures: both runs use `cache_aware`, whose
/// decisions follow the tree alone.
#[test]
fn replay_matches_the_demo_at_concurrency_1() {
    let envoy = demo_and_replay(&[], &[]);
    assert_eq!(envoy["requests"], 180, "the demo's default workload");
}

/// The same with prefill/decode disaggregation (2 prefill + 2 decode engines): the
/// same pairs, the same prefill engines doing the same work, the same cache hits.
#[test]
fn replay_matches_the_demo_with_pd_at_concurrency_1() {
    let extra = ["pd_pairs", "pd_kv_failures", "prefill_per_worker"];
    let envoy = demo_and_replay(&["--pd"], &extra);
    assert_eq!(envoy["requests"], 186, "the demo's default PD workload");
    assert_eq!(envoy["pd_pairs"], 186, "every pair met");
}

/// The policy both runs route by: one whose decisions do not depend on time.
const POLICY: [&str; 2] = ["--policy", "cache_aware"];

/// Runs `envoy/demo --concurrency 1 --baseline none` and `host-sim replay` with the
/// same `flags` on its workload, and checks that they agree on the routing keys of
/// the summary line plus `extra`; returns the demo's line.
fn demo_and_replay(flags: &[&str], extra: &[&str]) -> serde_json::Value {
    let dir = llm_demo::fleet::TempDir::new("llm-replay-vs-demo").expect("temp dir");
    let mut demo = std::process::Command::new(env!("CARGO_BIN_EXE_llm-demo"));
    demo.args(POLICY)
        .args(["--concurrency", "1", "--baseline", "none", "--dir"])
        .arg(&dir.0)
        .args(flags);
    let envoy = common::run(demo).2;
    let host_sim = llm_demo::paths::bin_path("host-sim").expect("cargo build -p host-sim");
    let mut replay = std::process::Command::new(host_sim);
    replay
        .args([
            "replay",
            "--concurrency",
            "1",
            "--baseline",
            "none",
            "--workload",
        ])
        .arg(dir.0.join("workload.jsonl"))
        .arg("--wasm")
        .arg(llm_demo::paths::wasm_path().expect("the filter is built"))
        .args(POLICY)
        .args(flags);
    let sim = common::run(replay).2;
    let keys = [
        "requests",
        "errors",
        "per_worker",
        "decisions",
        "prompt_tokens",
        "cached_tokens",
        "policy",
        "workers",
        "envoy_concurrency",
    ];
    for key in keys.iter().chain(extra) {
        assert_eq!(
            sim[key], envoy[key],
            "{key}: host-sim replay (left) vs envoy/demo (right)"
        );
    }
    envoy
}
