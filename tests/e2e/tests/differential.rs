//! The differential suite: every scenario in `tests/e2e/scenarios/` runs through
//! host-sim and through the real Envoy with engine mocks; both must observe the same
//! status, worker, decision and reason at every step, and those must be what the
//! scenario expects. See `e2e::scenario` for the format.
//!
//! Needs the filter, the engine mock and Envoy (`tests/run` builds them).

use e2e::scenario::Scenario;
use std::path::PathBuf;

fn scenarios() -> Vec<(String, Scenario)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let name = p.file_stem().unwrap().to_string_lossy().into_owned();
            let s = Scenario::load(&p).unwrap_or_else(|e| panic!("{e:#}"));
            (name, s)
        })
        .collect()
}

fn differential(name: &str) {
    let (_, scenario) = scenarios()
        .into_iter()
        .find(|(n, _)| n == name)
        .unwrap_or_else(|| panic!("no scenario {name}.json"));
    let wasm = llm_demo::paths::wasm_path().expect("the filter is built");
    let filter = host_sim::Filter::load(&wasm).expect("the filter loads");
    let sim = scenario
        .run_host_sim(&filter)
        .unwrap_or_else(|e| panic!("{name} in host-sim: {e:#}"));
    scenario
        .check(&sim)
        .unwrap_or_else(|e| panic!("{name} ({}) in host-sim: {e:#}", scenario.about));
    let envoy = scenario
        .run_envoy()
        .unwrap_or_else(|e| panic!("{name} in Envoy: {e:#}"));
    for (i, (s, e)) in sim.iter().zip(&envoy).enumerate() {
        assert_eq!(
            s, e,
            "{name} step {i}: host-sim (left) and Envoy (right) differ"
        );
    }
}

#[test]
fn every_scenario_file_has_a_test() {
    let names: Vec<String> = scenarios().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "affinity",
            "bad_input",
            "gate",
            "imbalance",
            "models",
            "overload",
            "pd",
            "pin",
            "stale"
        ]
    );
}

#[test]
fn affinity() {
    differential("affinity");
}

#[test]
fn imbalance() {
    differential("imbalance");
}

#[test]
fn gate() {
    differential("gate");
}

#[test]
fn models() {
    differential("models");
}

#[test]
fn pin() {
    differential("pin");
}

#[test]
fn stale() {
    differential("stale");
}

#[test]
fn pd() {
    differential("pd");
}

#[test]
fn overload() {
    differential("overload");
}

#[test]
fn bad_input() {
    differential("bad_input");
}
