//! End-to-end: several Envoy replicas share routing state through NATS. Each replica
//! is a real Envoy with the filter, beside its `llm-bridge`; the bus is a real
//! `nats-server` (`envoy/get-nats` installs it; these tests skip, saying so, only
//! when it cannot be found). A prefix routed on one replica is matched on another,
//! a replica that starts late catches up from its peers, and a bus that goes away
//! stops nothing: every request is still answered, the filter's stats show the
//! peers gone, and the replicas converge again when it returns.
//!
//! The bus admits only the fleet: batches forged without the fleet key, captured
//! and played back, or altered on the way, published on the real nats-server,
//! change no replica's state and are counted by the bridges; a bridge joins a NATS
//! server that requires a user and password with them, and without them (or
//! without a fleet key) stops at once saying why, and one that knows its nkey with
//! its seed and not with another; and one joins a server over TLS
//! trusting the private CA it is given, and not without it.
//!
//! Needs the filter built (`cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm`) and the binaries (`cargo build -p engine-mock -p llm-bridge`).

use bytes::Bytes;
use e2e::support::{header, post, wait_until};
use llm_bridge::envelope::{FleetKey, Kind, Stamp};
use llm_bridge::fleet::{boot_nonce, now_ms, Sealer};
use llm_demo::fleet::{FleetSpec, TempDir};
use llm_demo::process::{spawn, spawn_until};
use llm_demo::replicas::{nats_server_bin, random_secret, Nats, Replica, Replicas};
use llm_router::support::metric_names as names;
use serde_json::json;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

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

/// The series of the bridge's refusals for `reason`.
fn refused(reason: &str) -> String {
    format!("llm_bridge_messages_refused{{reason=\"{reason}\"}}")
}

fn bridge_stat(r: &Replica, series: &str) -> u64 {
    r.bridge
        .as_ref()
        .expect("sharing is on: every replica has a bridge")
        .stat(series)
        .unwrap_or(0)
}

/// The envelope's stamp fields start after magic, version, kind, the sender's
/// length and the sender; the sequence number is the second u64.
fn seq_low_byte(msg: &[u8]) -> usize {
    7 + msg[6] as usize + 15
}

#[test]
fn forged_replayed_and_altered_batches_change_nothing_and_are_counted() {
    let Some(rs) = replicas(2) else { return };
    let (a, b) = (&rs.replicas[0], &rs.replicas[1]);
    wait_for("the replicas to see each other", &rs, || {
        stat(a, names::REPLICA_PEERS) == 1 && stat(b, names::REPLICA_PEERS) == 1
    });
    let access = rs.access.clone().expect("sharing is on");
    let key = std::fs::read_to_string(&access.fleet_key_file).expect("the fleet key file");
    let key = FleetKey::new(key.trim().as_bytes().to_vec(), "llm-router");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    // The client's handles are dropped inside the runtime, after the test.
    let _in_runtime = rt.enter();
    // An eavesdropper with bus access (the NATS token) but not the fleet key.
    let (bus, mut sub) = rt.block_on(async {
        let bus = async_nats::ConnectOptions::with_token(access.nats_token().unwrap())
            .connect(access.url.as_str())
            .await
            .expect("the test connects to the bus");
        let sub = bus.subscribe("llm-router.ops").await.expect("subscribe");
        bus.flush().await.expect("flush");
        (bus, sub)
    });

    // Replica a routes a prefix; the batch carrying it passes the eavesdropper.
    let p = prompt("captured");
    route(a, &p);
    wait_for("replica b to import a's insert", &rs, || {
        stat(b, names::REPLICA_OPS_IMPORTED) >= 1
    });
    let captured: Vec<Bytes> = rt.block_on(async {
        use futures_util::StreamExt;
        let mut out = Vec::new();
        // What arrived so far, and a moment more (a keeps publishing its loads).
        let deadline = tokio::time::Instant::now() + Duration::from_millis(500);
        while let Ok(Some(msg)) = tokio::time::timeout_at(deadline, sub.next()).await {
            if key
                .open(&msg.payload)
                .is_ok_and(|(h, _)| h.sender == a.name)
            {
                out.push(msg.payload);
            }
        }
        out
    });
    assert!(!captured.is_empty(), "the eavesdropper saw a's batches");
    let k = captured.len() as u64;

    let imported = |r: &Replica| stat(r, names::REPLICA_OPS_IMPORTED);
    let before = (imported(a), imported(b));
    let reasons = ["replayed", "unauthenticated", "malformed", "wrong_kind"];
    let counts = |r: &Replica| reasons.map(|why| bridge_stat(r, &refused(why)));
    let b_before = counts(b);
    let a_unauthenticated = bridge_stat(a, &refused("unauthenticated"));

    // Replayed: every captured batch again, as it was.
    let mut attack: Vec<(&str, Bytes)> = captured
        .iter()
        .map(|m| ("llm-router.ops", m.clone()))
        .collect();
    for m in &captured {
        // Altered: a byte of the batch, or the sequence number to pass as new.
        let mut body = m.to_vec();
        let n = body.len();
        body[n - 33] ^= 0x01;
        attack.push(("llm-router.ops", body.into()));
        let mut seq = m.to_vec();
        seq[seq_low_byte(m)] = seq[seq_low_byte(m)].wrapping_add(100);
        attack.push(("llm-router.ops", seq.into()));
        // Forged: the same batch sealed under another key, as a's, fresh.
        let (_, batch) = key.open(m).expect("captured from the fleet");
        let wrong = FleetKey::new(random_secret(32).into_bytes(), "llm-router");
        let forged = Sealer::new(wrong, &a.name, boot_nonce().unwrap());
        attack.push((
            "llm-router.ops",
            forged.seal(Kind::Ops, Stamp::default(), &batch, now_ms()).1,
        ));
        // Forged: the bare batch, as a bridge without envelopes sent it.
        attack.push(("llm-router.ops", batch));
    }
    // A catch-up ask from outside, and a batch moved onto the catch-up subject.
    let outsider = Sealer::new(
        FleetKey::new(random_secret(32).into_bytes(), "llm-router"),
        "outsider",
        1,
    );
    attack.push((
        "llm-router.catchup",
        outsider
            .seal(Kind::Ask, Stamp::default(), b"_INBOX.x", now_ms())
            .1,
    ));
    attack.push(("llm-router.catchup", captured[0].clone()));
    rt.block_on(async {
        for (subject, msg) in attack {
            bus.publish(subject, msg).await.expect("publish");
        }
        bus.flush().await.expect("flush");
    });

    let expected = [k, 3 * k + 1, k, 1];
    wait_for(
        "replica b's bridge to refuse every attack message",
        &rs,
        || {
            let now = counts(b);
            (0..reasons.len()).all(|i| now[i] - b_before[i] >= expected[i])
        },
    );
    let after = counts(b);
    for (i, why) in reasons.iter().enumerate() {
        assert_eq!(
            after[i] - b_before[i],
            expected[i],
            "replica b refused exactly the attack's `{why}` messages"
        );
    }
    // Its own batches played back, a drops as echoes; the rest it refuses too.
    wait_for(
        "replica a's bridge to refuse the altered and forged ones",
        &rs,
        || bridge_stat(a, &refused("unauthenticated")) - a_unauthenticated > 3 * k,
    );
    // Give any message that slipped through time to reach the filters.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        (imported(a), imported(b)),
        before,
        "no forged, replayed or altered batch changed a replica's routing state"
    );

    // The fleet's own batches still pass: the attack moved no guard.
    let q = prompt("after the attack");
    let (owner, _) = route(a, &q);
    wait_for("replica b to import a's next insert", &rs, || {
        imported(b) > before.1
    });
    let (worker, decision) = route(b, &format!("{q} and more"));
    assert_eq!(
        (worker.as_str(), decision.as_str()),
        (owner.as_str(), "cache_hit"),
        "sharing goes on after the attack"
    );
}

/// A bridge for a replica whose Envoy is not there (the bus is what is tested),
/// with `extra` flags; its log is `dir/<name>.log`.
fn bridge_cmd(name: &str, nats: &Nats, extra: &[&str]) -> Command {
    let dead_envoy = format!(
        "http://127.0.0.1:{}/llm-router/replicas",
        llm_demo::process::free_port().unwrap()
    );
    let mut cmd = Command::new(llm_demo::paths::bin_path("llm-bridge").expect("llm-bridge built"));
    cmd.args([
        "--envoy-url",
        &dead_envoy,
        "--token",
        "t",
        "--replica",
        name,
        "--nats",
        &nats.url(),
    ])
    .args(extra);
    cmd
}

/// Runs a bridge that must stop by itself; its exit status and log.
fn bridge_stops(dir: &Path, name: &str, cmd: Command) -> (std::process::ExitStatus, String) {
    let log = dir.join(format!("{name}.log"));
    let mut guard = spawn(name, cmd, &log).expect("start llm-bridge");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = guard.exited() {
            return (status, std::fs::read_to_string(&log).unwrap_or_default());
        }
        assert!(
            Instant::now() < deadline,
            "{name} should have stopped; its log:\n{}",
            llm_demo::envoy::tail(&log)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_bridge_joins_a_bus_that_requires_credentials_and_stops_clearly_without_them() {
    if let Err(e) = nats_server_bin() {
        eprintln!("SKIPPED: {e:#}");
        return;
    }
    let tmp = TempDir::new("llm-bus-auth").expect("a temp dir");
    let dir = tmp.0.as_path();
    let password = random_secret(16);
    let nats = Nats::start(dir, &["--user", "bridge", "--pass", &password]).expect("nats-server");
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let key = write("fleet.key", &random_secret(32));
    let good = write("good.pass", &password);
    let bad = write("bad.pass", "not-the-password");

    let metrics = llm_demo::process::free_addr().unwrap();
    let cmd = bridge_cmd(
        "right",
        &nats,
        &[
            "--nats-user",
            "bridge",
            "--nats-password-file",
            &good,
            "--fleet-key-file",
            &key,
            "--listen",
            &metrics.to_string(),
        ],
    );
    let log = dir.join("right.log");
    let (guard, ()) = spawn_until("llm-bridge", cmd, &log, Duration::from_secs(30), |l| {
        l.starts_with("llm-bridge started").then_some(())
    })
    .expect("the bridge with the right credentials starts");
    let bridge = llm_demo::replicas::Bridge { guard, metrics };
    assert!(
        wait_until(|| bridge.stat("llm_bridge_bus_connected").unwrap_or(0) == 1),
        "the bridge with the right user and password is on the bus; its log:\n{}",
        llm_demo::envoy::tail(&log)
    );

    for (name, extra) in [
        ("no-credentials", vec!["--fleet-key-file", key.as_str()]),
        (
            "wrong-password",
            vec![
                "--nats-user",
                "bridge",
                "--nats-password-file",
                bad.as_str(),
                "--fleet-key-file",
                key.as_str(),
            ],
        ),
    ] {
        let (status, log) = bridge_stops(dir, name, bridge_cmd(name, &nats, &extra));
        assert!(!status.success(), "{name}: the bridge fails ({status})");
        assert!(
            log.contains("refused this bridge's credentials"),
            "{name}: the bridge says the bus refused its credentials; its log:\n{log}"
        );
    }
    let (status, log) = bridge_stops(
        dir,
        "no-fleet-key",
        bridge_cmd(
            "no-fleet-key",
            &nats,
            &["--nats-user", "bridge", "--nats-password-file", &good],
        ),
    );
    assert_eq!(
        status.code(),
        Some(2),
        "a bridge without a fleet key does not start"
    );
    assert!(
        log.contains("--fleet-key-file") && log.contains("--insecure-no-fleet-key"),
        "it names the flag, and the way to run without one; its log:\n{log}"
    );
}

#[test]
fn a_bridge_joins_a_bus_over_tls_trusting_the_ca_it_is_given() {
    if let Err(e) = nats_server_bin() {
        eprintln!("SKIPPED: {e:#}");
        return;
    }
    let tmp = TempDir::new("llm-bus-tls").expect("a temp dir");
    let dir = tmp.0.as_path();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let pki = llm_test_pki::private_ca("llm-bridge test CA");
    let (ca, cert, cert_key) = (pki.ca_pem, pki.cert_pem, pki.key_pem);
    let (ca, cert, cert_key) = (
        write("ca.pem", &ca),
        write("server.pem", &cert),
        write("server.key", &cert_key),
    );
    let token = random_secret(16);
    let token_file = write("nats.token", &token);
    let key = write("fleet.key", &random_secret(32));
    let nats = Nats::start(
        dir,
        &[
            "--tls",
            "--tlscert",
            &cert,
            "--tlskey",
            &cert_key,
            "--auth",
            &token,
        ],
    )
    .expect("nats-server with TLS");
    let tls_url = format!("tls://127.0.0.1:{}", nats.port);
    let start = |name: &str, extra: &[&str]| {
        let metrics = llm_demo::process::free_addr().unwrap();
        let mut cmd = bridge_cmd(name, &nats, extra);
        cmd.args(["--nats", &tls_url, "--nats-token-file", &token_file])
            .args(["--fleet-key-file", &key, "--listen", &metrics.to_string()]);
        let log = dir.join(format!("{name}.log"));
        let (guard, ()) = spawn_until("llm-bridge", cmd, &log, Duration::from_secs(30), |l| {
            l.starts_with("llm-bridge started").then_some(())
        })
        .expect("the bridge starts");
        (llm_demo::replicas::Bridge { guard, metrics }, log)
    };
    let (trusting, log) = start("trusting", &["--nats-ca", &ca]);
    assert!(
        wait_until(|| trusting.stat("llm_bridge_bus_connected").unwrap_or(0) == 1),
        "the bridge given the CA is on the bus over TLS; its log:\n{}",
        llm_demo::envoy::tail(&log)
    );
    let (untrusting, log) = start("untrusting", &[]);
    assert!(
        wait_until(|| untrusting.stat("llm_bridge_connect_failures").unwrap_or(0) >= 2),
        "the bridge without the CA counts its failed connections; its log:\n{}",
        llm_demo::envoy::tail(&log)
    );
    assert!(
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("bus: cannot connect")),
        "and says so; its log:\n{}",
        llm_demo::envoy::tail(&log)
    );
    assert_eq!(
        untrusting.stat("llm_bridge_bus_connected").unwrap(),
        0,
        "a server certificate from a CA the bridge was not given is not trusted"
    );
}

#[test]
fn a_bridge_joins_a_bus_that_knows_its_nkey_and_not_with_another() {
    if let Err(e) = nats_server_bin() {
        eprintln!("SKIPPED: {e:#}");
        return;
    }
    let tmp = TempDir::new("llm-bus-nkey").expect("a temp dir");
    let dir = tmp.0.as_path();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (known, stranger) = (nkeys::KeyPair::new_user(), nkeys::KeyPair::new_user());
    let conf = write(
        "nats.conf",
        &format!(
            "authorization {{ users = [ {{ nkey: \"{}\" }} ] }}\n",
            known.public_key()
        ),
    );
    let nats = Nats::start(dir, &["-c", &conf]).expect("nats-server with nkey users");
    let key = write("fleet.key", &random_secret(32));
    let known_seed = write("known.nk", &known.seed().unwrap());
    let stranger_seed = write("stranger.nk", &stranger.seed().unwrap());
    let not_a_seed = write("garbage.nk", "SUnot-a-seed");

    let metrics = llm_demo::process::free_addr().unwrap();
    let cmd = bridge_cmd(
        "known",
        &nats,
        &[
            "--nats-nkey-file",
            &known_seed,
            "--fleet-key-file",
            &key,
            "--listen",
            &metrics.to_string(),
        ],
    );
    let log = dir.join("known.log");
    let (guard, ()) = spawn_until("llm-bridge", cmd, &log, Duration::from_secs(30), |l| {
        l.starts_with("llm-bridge started").then_some(())
    })
    .expect("the bridge with the known nkey starts");
    let bridge = llm_demo::replicas::Bridge { guard, metrics };
    assert!(
        wait_until(|| bridge.stat("llm_bridge_bus_connected").unwrap_or(0) == 1),
        "the bridge whose nkey the server knows is on the bus; its log:\n{}",
        llm_demo::envoy::tail(&log)
    );
    for (name, seed, says) in [
        (
            "stranger",
            &stranger_seed,
            "refused this bridge's credentials",
        ),
        ("garbage", &not_a_seed, "does not hold a valid nkey seed"),
    ] {
        let cmd = bridge_cmd(
            name,
            &nats,
            &["--nats-nkey-file", seed, "--fleet-key-file", &key],
        );
        let (status, log) = bridge_stops(dir, name, cmd);
        assert!(!status.success(), "{name}: the bridge fails ({status})");
        assert!(
            log.contains(says),
            "{name}: the bridge says `{says}`; its log:\n{log}"
        );
    }
}
