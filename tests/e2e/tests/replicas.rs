//! End-to-end: several Envoy replicas share routing state through NATS. Each replica
//! is a real Envoy with the filter, beside its `llm-bridge`; the bus is a real
//! `nats-server` (`envoy/get-nats` installs it; these tests skip, saying so, only
//! when it cannot be found). A prefix routed on one replica is matched on another,
//! a replica that starts late catches up from its peers, and a bus that goes away
//! stops nothing: every request is still answered, the filter's stats show the
//! peers gone, and the replicas converge again when it returns.
//!
//! Needs the filter built (`cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm`) and the binaries (`cargo build -p engine-mock -p llm-bridge`).

use e2e::support::{header, post, wait_until};
use llm_demo::fleet::FleetSpec;
use llm_demo::replicas::{nats_server_bin, Replica, Replicas};
use llm_router::support::metric_names as names;
use serde_json::json;

/// `n` replicas over 4 engine mocks with sharing on, or `None` (the test skips)
/// when there is no nats-server.
fn replicas(n: usize) -> Option<Replicas> {
    if let Err(e) = nats_server_bin() {
        eprintln!("SKIPPED: {e:#}");
        return None;
    }
    let spec = FleetSpec {
        workers: 4,
        envoy_concurrency: 2,
        ..FleetSpec::default()
    };
    Some(
        Replicas::start(&spec, n, true)
            .unwrap_or_else(|e| panic!("cannot start the replicas: {e:#}")),
    )
}

fn prompt(tag: &str) -> String {
    format!("{tag}: ") + &"a long shared document about caches and replicas. ".repeat(30)
}

/// Sends a completion to `r`; returns (worker, decision).
fn route(r: &Replica, prompt: &str) -> (String, String) {
    let resp = post(
        r.envoy.listener,
        "/v1/completions",
        &json!({"model": "mock", "prompt": prompt, "max_tokens": 4}),
    );
    assert_eq!(resp.status, 200, "{} answered {resp:?}", r.name);
    (
        header(&resp, "x-llm-router-worker"),
        header(&resp, "x-llm-router-decision"),
    )
}

fn stat(r: &Replica, name: &str) -> u64 {
    r.envoy.filter_stat(name).unwrap_or(0)
}

/// Waits for `ok`, or fails with `what` and the replicas' bridge and Envoy logs.
fn wait_for(what: &str, rs: &Replicas, ok: impl Fn() -> bool) {
    if !wait_until(ok) {
        let logs: Vec<String> = rs
            .replicas
            .iter()
            .map(|r| {
                let dir = rs.dir.join(&r.name);
                format!(
                    "--- {} bridge:\n{}\n--- {} envoy:\n{}",
                    r.name,
                    llm_demo::envoy::tail(&dir.join("bridge.log")),
                    r.name,
                    llm_demo::envoy::tail(&r.envoy.log)
                )
            })
            .collect();
        panic!("timed out waiting for {what}\n{}", logs.join("\n"));
    }
}

#[test]
fn two_replicas_converge_without_echo() {
    let Some(rs) = replicas(2) else { return };
    let (a, b) = (&rs.replicas[0], &rs.replicas[1]);
    wait_for(
        "each replica to see the other's in-flight reports",
        &rs,
        || stat(a, names::REPLICA_PEERS) == 1 && stat(b, names::REPLICA_PEERS) == 1,
    );
    let p = prompt("converge");
    let (owner, _) = route(a, &p);
    wait_for("replica b to import a's insert", &rs, || {
        stat(b, names::REPLICA_OPS_IMPORTED) >= 1
    });
    let (worker, decision) = route(b, &format!("{p} and the next turn"));
    assert_eq!(
        (worker.as_str(), decision.as_str()),
        (owner.as_str(), "cache_hit"),
        "the prefix routed on replica a is matched on replica b"
    );
    wait_for("replica a to import b's insert", &rs, || {
        stat(a, names::REPLICA_OPS_IMPORTED) >= 1
    });
    // Let any echo have time to show: several bridge polls and publishes.
    std::thread::sleep(std::time::Duration::from_secs(1));
    for r in [a, b] {
        assert_eq!(
            (
                stat(r, names::REPLICA_OPS_EXPORTED),
                stat(r, names::REPLICA_OPS_IMPORTED)
            ),
            (1, 1),
            "{}: each replica exports its own insert only, and imports the other's once",
            r.name
        );
    }
}

#[test]
fn a_replica_joining_late_catches_up_from_its_peer() {
    let Some(mut rs) = replicas(1) else { return };
    let prompts: Vec<String> = (0..6).map(|i| prompt(&format!("early {i}"))).collect();
    let owners: Vec<String> = prompts
        .iter()
        .map(|p| route(&rs.replicas[0], p).0)
        .collect();
    wait_for(
        "the first replica's bridge to publish its inserts",
        &rs,
        || stat(&rs.replicas[0], names::REPLICA_OPS_EXPORTED) >= prompts.len() as u64,
    );
    rs.add_replica()
        .unwrap_or_else(|e| panic!("cannot start the late replica: {e:#}"));
    let late = &rs.replicas[1];
    wait_for(
        "the late replica to replay its peer's recent inserts",
        &rs,
        || stat(late, names::REPLICA_OPS_IMPORTED) >= prompts.len() as u64,
    );
    for (p, owner) in prompts.iter().zip(&owners) {
        let (worker, decision) = route(late, &format!("{p} and more"));
        assert_eq!(
            (&worker, decision.as_str()),
            (owner, "cache_hit"),
            "the late replica routes `{}` to where the fleet cached it",
            &p[..8]
        );
    }
}

#[test]
fn the_bus_going_away_stops_nothing_and_sharing_resumes() {
    let Some(mut rs) = replicas(2) else { return };
    wait_for("the replicas to see each other", &rs, || {
        rs.replicas
            .iter()
            .all(|r| stat(r, names::REPLICA_PEERS) == 1)
    });
    rs.nats_mut().unwrap().stop();
    // Every request is answered while the bus is down.
    let q = prompt("during the outage");
    let (owner, _) = route(&rs.replicas[0], &q);
    for i in 0..8 {
        route(&rs.replicas[i % 2], &prompt(&format!("outage traffic {i}")));
    }
    wait_for("the filters' stats to show the peers gone", &rs, || {
        rs.replicas
            .iter()
            .all(|r| stat(r, names::REPLICA_PEERS) == 0)
    });
    let imported_before = stat(&rs.replicas[1], names::REPLICA_OPS_IMPORTED);
    rs.nats_mut()
        .unwrap()
        .resume()
        .unwrap_or_else(|e| panic!("cannot restart nats-server: {e:#}"));
    // The inserts held in replica a's ring go out once its bridge reconnects.
    wait_for(
        "replica b to import what a routed during the outage",
        &rs,
        || {
            stat(&rs.replicas[1], names::REPLICA_OPS_IMPORTED) >= imported_before + 5
                && rs
                    .replicas
                    .iter()
                    .all(|r| stat(r, names::REPLICA_PEERS) == 1)
        },
    );
    let (worker, decision) = route(&rs.replicas[1], &format!("{q} and after"));
    assert_eq!(
        (worker.as_str(), decision.as_str()),
        (owner.as_str(), "cache_hit"),
        "a prefix routed during the outage is shared once the bus is back"
    );
}
