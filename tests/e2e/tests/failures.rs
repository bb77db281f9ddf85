//! End-to-end: dead and frozen engines out of rotation through the real Envoy 1.40.
//! Eight clients keep 4 engine mocks busy; one engine is
//! SIGKILLed (or SIGSTOPped) mid-run. The filter learns of the failure from the
//! finished stream (`response.flags`: refused connection, reset, idle timeout) and
//! takes the worker out on every Envoy thread at once on a refused connection, or
//! after a run of resets or timeouts (5 in a row, the shipped default); the prober
//! brings it back when it answers. Without that, a killed engine would keep getting requests (it
//! looks least loaded with nothing in flight) and a frozen one would hold them for
//! ever.
//!
//! Prints the measured numbers (the book's "Failures" page quotes them):
//! `cargo test -p e2e --test failures -- --nocapture`.

use e2e::support::{signal, start, wait_for, EXPLAINED_JSON};
use llm_demo::admin;
use llm_demo::fleet::{Fleet, FleetSpec};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const CLIENTS: usize = 8;
/// The route's idle timeout in these tests: what ends a frozen engine's requests.
const IDLE_TIMEOUT_MS: u64 = 2000;

/// One finished request as the client saw it.
#[derive(Debug, Clone)]
struct Record {
    start: Instant,
    end: Instant,
    status: u16,
    worker: String,
    /// Envoy's answer says the connection was refused (`UF`): the failure that
    /// takes a dead engine out at once (the resets of the requests in flight on it
    /// only count toward a run).
    refused: bool,
}

/// Closed-loop load: `CLIENTS` threads, each sending its next completion (a prompt
/// of its own, so they spread) as the last one ends, until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Vec<Record>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(addr: SocketAddr) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let seq = Arc::new(AtomicUsize::new(0));
        let threads = (0..CLIENTS)
            .map(|c| {
                let (stop, records, seq) = (stop.clone(), records.clone(), seq.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        let n = seq.fetch_add(1, Ordering::Relaxed);
                        let body = json!({"model": "mock", "max_tokens": 4,
                            "prompt": format!("client {c} request {n}: {}", "words ".repeat(n % 13))});
                        let start = Instant::now();
                        let r = admin::request(
                            addr,
                            "POST",
                            "/v1/completions",
                            EXPLAINED_JSON,
                            body.to_string().as_bytes(),
                        );
                        let (status, worker, refused) = match &r {
                            Ok(r) => (
                                r.status,
                                r.header("x-llm-router-worker").unwrap_or("").to_string(),
                                r.body.contains("connection failure"),
                            ),
                            Err(_) => (0, String::new(), false),
                        };
                        records.lock().unwrap().push(Record {
                            start,
                            end: Instant::now(),
                            status,
                            worker,
                            refused,
                        });
                    }
                })
            })
            .collect();
        Load {
            stop,
            records,
            threads,
        }
    }

    fn done(&self) -> usize {
        self.records.lock().unwrap().len()
    }

    fn wait_done(&self, fleet: &Fleet, n: usize) {
        wait_for(&format!("{n} requests done"), fleet, || self.done() >= n);
    }

    fn stop(self) -> Vec<Record> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        Arc::try_unwrap(self.records).unwrap().into_inner().unwrap()
    }
}

fn fleet() -> Fleet {
    start(&FleetSpec {
        workers: 4,
        // Requests last long enough to be in flight when an engine goes.
        engine_args: vec!["--ttft-ms".into(), "40".into()],
        plugin_config: json!({"overload": {"probe_interval_ms": 300, "probe_timeout_ms": 1000}}),
        // Two Envoy threads: the failure seen on one must take the worker out on both.
        envoy_concurrency: 2,
        route_idle_timeout_ms: Some(IDLE_TIMEOUT_MS),
        ..FleetSpec::default()
    })
}

/// Requests to `victim` in flight at `at` (started before, ended after).
fn in_flight_at(records: &[Record], victim: &str, at: Instant) -> usize {
    records
        .iter()
        .filter(|r| r.worker == victim && r.start <= at && r.end > at)
        .count()
}

#[test]
fn a_killed_engine_leaves_rotation_at_once() {
    let f = fleet();
    let stat = |name: &str| f.envoy.filter_stat(name).unwrap();
    let victim = "w1";
    let load = Load::start(f.envoy.listener);
    load.wait_done(&f, 80);
    let killed_at = Instant::now();
    signal(f.engine(victim).unwrap().guard.id(), "-KILL");
    wait_for("the dead worker to be taken out", &f, || {
        stat("llm_router_health_down") >= 1
    });
    let after = load.done();
    load.wait_done(&f, after + 300);
    let records = load.stop();

    let failed: Vec<&Record> = records.iter().filter(|r| r.status != 200).collect();
    // The requests in flight on the engine are reset; the first refused connect
    // takes it out.
    let first_failure = failed.iter().filter(|r| r.refused).map(|r| r.end).min();
    let in_flight = in_flight_at(&records, victim, killed_at);
    // What arrived between the kill and the first refused connect coming back: the
    // detection interval.
    let arrived = first_failure.map_or(0, |t| {
        records
            .iter()
            .filter(|r| r.start >= killed_at && r.start <= t)
            .count()
    });
    println!(
        "kill 1 of 4 engines under load ({CLIENTS} clients, {} requests): {} failed; \
         {in_flight} were in flight on it, {arrived} arrived within the detection interval",
        records.len(),
        failed.len()
    );
    assert!(
        failed.iter().all(|r| r.worker == victim),
        "only the dead worker's requests fail: {failed:?}"
    );
    assert!(
        failed.len() <= in_flight + arrived,
        "failed {} > in flight {in_flight} + arrived {arrived}",
        failed.len()
    );
    // Once a failure came back, nothing more goes to the dead engine (a margin for
    // the failure's own stream to end in Envoy after its answer left).
    let settled = first_failure.unwrap() + Duration::from_millis(500);
    let later: Vec<&Record> = records.iter().filter(|r| r.start > settled).collect();
    assert!(later.len() >= 100, "enough requests after detection");
    assert!(
        later.iter().all(|r| r.status == 200 && r.worker != victim),
        "after detection every request succeeds elsewhere"
    );
}

#[test]
fn a_frozen_engine_times_out_leaves_rotation_and_comes_back_when_it_thaws() {
    let f = fleet();
    let stat = |name: &str| f.envoy.filter_stat(name).unwrap();
    let victim = "w2";
    let pid = f.engine(victim).unwrap().guard.id();
    let load = Load::start(f.envoy.listener);
    load.wait_done(&f, 80);
    let frozen_at = Instant::now();
    signal(pid, "-STOP");
    wait_for("the frozen worker to be taken out", &f, || {
        stat("llm_router_health_down") >= 1
    });
    let after = load.done();
    load.wait_done(&f, after + 120);
    signal(pid, "-CONT");
    wait_for("the thawed worker's probe to bring it back", &f, || {
        stat("llm_router_health_recovered") >= 1
    });
    let back = load.done();
    load.wait_done(&f, back + 80);
    let records = load.stop();

    let failed: Vec<&Record> = records.iter().filter(|r| r.status != 200).collect();
    let longest = records
        .iter()
        .map(|r| r.end - r.start)
        .max()
        .unwrap_or_default();
    let in_flight = in_flight_at(&records, victim, frozen_at);
    println!(
        "SIGSTOP 1 of 4 engines under load ({CLIENTS} clients, {} requests, idle timeout \
         {IDLE_TIMEOUT_MS} ms): {} failed ({in_flight} in flight on it); longest request {} ms",
        records.len(),
        failed.len(),
        longest.as_millis()
    );
    assert!(
        failed.iter().all(|r| r.worker == victim),
        "only the frozen worker's requests fail: {failed:?}"
    );
    // A timeout takes the worker out on the run's fifth failure in a row, not the
    // first: each client can have one request caught by the freeze, and a client
    // whose request was among the run's first four may send its next one to the
    // worker still in rotation, and have it caught too.
    let run = llm_router::config::DEFAULT_CONSECUTIVE_FAILURES as usize;
    assert!(failed.len() < CLIENTS + run, "{} failed", failed.len());
    // No request hangs past the idle timeout (a generous margin for a loaded machine).
    assert!(
        longest < Duration::from_millis(IDLE_TIMEOUT_MS + 8000),
        "a request hung {} ms",
        longest.as_millis()
    );
    let thawed_share = records
        .iter()
        .rev()
        .take(40)
        .filter(|r| r.worker == victim && r.status == 200)
        .count();
    assert!(thawed_share > 0, "the thawed worker takes traffic again");
}
