//! Ring hash with a filter in its request path (`--baseline ring_hash+filter` and
//! `ring_hash+floor`), end to end through Envoy: Envoy's ring hash routes every
//! request, the filter in front of it deciding and its choice ignored. Needs the
//! filter, the floor guest, the engine mock and the collector (`tests/run` builds
//! them).

mod common;

use llm_load::workload::load_workload;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// Each conversation's engines in a run: its records' serving engine by the
/// conversation of the workload line each answers.
fn engines_by_conversation(dir: &Path, label: &str) -> BTreeMap<String, BTreeSet<String>> {
    let items = load_workload(&dir.join("workload.jsonl")).expect("the workload");
    let sessions: HashMap<u64, String> = items
        .into_iter()
        .map(|it| (it.line as u64, it.session.expect("a session")))
        .collect();
    let records =
        std::fs::read_to_string(dir.join(format!("{label}.jsonl"))).expect("the run's records");
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in records.lines() {
        let r: Value = serde_json::from_str(line).expect("a record");
        let at = r["line"].as_u64().expect("its workload line");
        let worker = r["worker"].as_str().expect("the serving engine");
        out.entry(sessions[&at].clone())
            .or_default()
            .insert(worker.to_string());
    }
    out
}

/// The sum of a JSON object's counts.
fn total(counts: &Value) -> u64 {
    counts
        .as_object()
        .expect("an object of counts")
        .values()
        .filter_map(Value::as_u64)
        .sum()
}

/// Round robin in the main run spreads each conversation's turns over the engines;
/// with the same round robin filter in ring hash's path, and with the floor there,
/// every conversation stays on one engine (the session hash routes), while the
/// filter still decided every request.
#[test]
fn ring_hash_routes_with_a_filter_in_its_path_that_decides_every_request() {
    let dir = llm_demo::fleet::TempDir::new("llm-demo-ring-hash").expect("temp dir");
    let mut demo = std::process::Command::new(env!("CARGO_BIN_EXE_llm-demo"));
    demo.args(["--policy", "round_robin", "--sessions", "9", "--turns", "4"])
        .args(["--baseline", "ring_hash+filter,ring_hash+floor", "--dir"])
        .arg(&dir.0);
    let line = common::run(demo).2;
    let runs = line["baselines"].as_array().expect("both baselines");
    let labels: Vec<&str> = runs.iter().filter_map(|r| r["policy"].as_str()).collect();
    assert_eq!(labels, ["ring_hash+filter", "ring_hash+floor"]);

    let spread = engines_by_conversation(&dir.0, "round_robin");
    assert!(
        spread.values().any(|engines| engines.len() > 1),
        "round robin moves conversations: {spread:?}"
    );
    for label in labels {
        let held = engines_by_conversation(&dir.0, label);
        assert_eq!(held.len(), 9, "{label}: every conversation answered");
        assert!(
            held.values().all(|engines| engines.len() == 1),
            "{label}: the session hash keeps each conversation on one engine: {held:?}"
        );
    }
    assert_eq!(runs[0]["requests"], 36);
    assert_eq!(
        total(&runs[0]["decisions"]),
        36,
        "the filter in the path decided every request: {}",
        runs[0]
    );
    assert_eq!(
        total(&runs[1]["decisions"]),
        0,
        "the floor is no router: {}",
        runs[1]
    );
}
