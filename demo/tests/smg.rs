//! The demo with SGLang's model gateway as a baseline, end to end: SMG 1.13.0 from
//! PyPI in front of the engine mocks, beside Envoy's ring hash, in one table.
//!
//! Ignored by default: the first run installs SMG with pip (the network). Run it with
//! `cargo test -p llm-demo --test smg -- --ignored` after building the filter, the
//! engine mock and the collector (`envoy/demo` builds them); `SMG_BIN` names an
//! installed `smg` instead.

mod common;

use serde_json::Value;

#[test]
#[ignore = "installs smg from PyPI on first use; run with --ignored"]
fn smg_routes_the_same_workload_beside_ring_hash_and_is_stopped_after() {
    let dir = llm_demo::fleet::TempDir::new("llm-demo-smg").expect("temp dir");
    let mut demo = std::process::Command::new(env!("CARGO_BIN_EXE_llm-demo"));
    demo.args(["--workers", "2", "--sessions", "5", "--turns", "3"])
        .args(["--baseline", "ring_hash,smg", "--dir"])
        .arg(&dir.0);
    let (stdout, stderr, line) = common::run(demo);
    let policies: Vec<&str> = line["baselines"]
        .as_array()
        .expect("every baseline under `baselines`")
        .iter()
        .map(|b| b["policy"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(policies, ["ring_hash", "smg-1.13.0"]);
    let smg = &line["baselines"][1];
    assert_eq!(smg["requests"], line["requests"], "the same workload");
    assert_eq!(smg["errors"], 0, "SMG answered every request");
    let served: u64 = smg["per_worker"]
        .as_object()
        .expect("per-engine counts")
        .values()
        .filter_map(Value::as_u64)
        .sum();
    assert_eq!(
        Some(served),
        smg["requests"].as_u64(),
        "every answer came from an engine mock"
    );
    assert!(
        smg["cached_tokens"].as_u64() > Some(0),
        "SMG's affinity shows in the engines' caches: {smg}"
    );
    let table: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("== side by side"))
        .skip(2)
        .take(3)
        .collect();
    let routers: Vec<&str> = table
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let main = line["policy"].as_str().expect("the main run's router");
    assert_eq!(routers, [main, "ring_hash", "smg-1.13.0"], "{stdout}");
    // SMG's address, from the progress line of its run, no longer answers.
    let smg_url = stderr
        .lines()
        .skip_while(|l| !l.contains("starting smg"))
        .find_map(|l| l.split(" through http://").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("the SMG run's address on stderr");
    let addr: std::net::SocketAddr = smg_url.parse().expect("host:port");
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "SMG at {addr} was stopped with the demo"
    );
}
