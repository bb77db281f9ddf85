//! Helpers every end-to-end test file uses: start a fleet, send a request, read a
//! header, wait for a condition. Each panics with what it was doing, so a failing
//! test says which step failed and (where a fleet is at hand) what Envoy logged.

use llm_demo::admin::{self, Response};
use llm_demo::fleet::{Fleet, FleetSpec};
use llm_demo::process::{self, Guard};
use llm_router::support::header_names::EXPLAIN_HEADER;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long a condition may take to come true: generous, because a loaded 2-core
/// machine is slow and a test must never flake. A failing test pays it once.
pub const WAIT: Duration = Duration::from_secs(60);

/// Starts `spec`'s fleet (engine mocks, collector, Envoy).
pub fn start(spec: &FleetSpec) -> Fleet {
    Fleet::start(spec).unwrap_or_else(|e| panic!("cannot start the fleet: {e:#}"))
}

/// A JSON request's headers, asking for the router's decision headers
/// (`x-llm-router-explain`), which the tests read.
pub const EXPLAINED_JSON: &[(&str, &str)] =
    &[("content-type", "application/json"), (EXPLAIN_HEADER, "1")];

/// `POST path` with a body and extra headers ([`EXPLAINED_JSON`]'s are added).
pub fn send(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: impl AsRef<[u8]>,
) -> Response {
    let mut all = EXPLAINED_JSON.to_vec();
    all.extend_from_slice(headers);
    admin::request(addr, "POST", path, &all, body.as_ref())
        .unwrap_or_else(|e| panic!("POST {path} on {addr}: {e:#}"))
}

/// `POST path` with a JSON body.
pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Response {
    send(addr, path, &[], body.to_string().as_bytes())
}

/// A conversation's chat body for model `mock` at `turn` (0-based): the system
/// prompt, each earlier question with its answer, then the new question. The test
/// says what its questions and answers look like (their length decides how much of
/// a prompt is the conversation's own).
pub fn conversation(
    system: &str,
    turn: usize,
    question: impl Fn(usize) -> String,
    answer: impl Fn(usize) -> String,
) -> Value {
    let mut messages = vec![json!({"role": "system", "content": system})];
    for t in 0..=turn {
        messages.push(json!({"role": "user", "content": question(t)}));
        if t < turn {
            messages.push(json!({"role": "assistant", "content": answer(t)}));
        }
    }
    json!({"model": "mock", "messages": messages})
}

/// The prompt tokens the engine served from its cache, as its answer reports them
/// (`usage.prompt_tokens_details.cached_tokens`; 0 when absent).
pub fn cached_tokens(r: &Response) -> u64 {
    r.json()
        .ok()
        .and_then(|v| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64())
        .unwrap_or(0)
}

/// A response header that must be there.
pub fn header(r: &Response, name: &str) -> String {
    r.header(name)
        .unwrap_or_else(|| panic!("missing {name} in {r:?}"))
        .to_string()
}

/// Polls `ok` until it holds or [`WAIT`] passed; whether it held.
pub fn wait_until(ok: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if ok() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    false
}

/// Waits for `ok`, or fails the test with `what` and the tail of Envoy's log.
pub fn wait_for(what: &str, fleet: &Fleet, ok: impl Fn() -> bool) {
    if !wait_until(ok) {
        panic!(
            "timed out waiting for {what}; envoy log tail:\n{}",
            llm_demo::envoy::tail(&fleet.envoy.log)
        );
    }
}

/// The `overload` settings scaled to test time: a worker is overloaded at a TTFT
/// p90 of 1 s or more, and recovers below 0.5 s after 3 probes in a row (every
/// 200 ms) answered within 400 ms.
pub fn overload_config() -> Value {
    json!({
        "ttft_enter_s": 1.0, "ttft_recover_s": 0.5,
        "tpot_enter_s": 5.0, "tpot_recover_s": 1.0,
        "probe_interval_ms": 200, "probe_timeout_ms": 400,
        "probe_successes_to_recover": 3,
    })
}

/// `path` in the repository (the tests read its shipped files: dashboard, rules).
pub fn repo_path(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// The text of a file in the repository, which must be there.
pub fn repo_file(path: &str) -> String {
    let p = repo_path(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Every `llm_router_*` metric name in `text` (a query, a rule file, a scrape).
pub fn metric_names(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(i) = rest.find("llm_router_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// A regular engine mock named `name` listening on `port` (the one Envoy and the
/// collector were given before it ran), with `args` of its own, once it answers:
/// an engine that comes up late, or again after a restart. A port freed a moment
/// ago can be taken for a while by an outgoing connection's local end (the ports
/// the OS picks for listeners and for connections are one range): an engine that
/// exits at once (it could not bind) is started again.
pub fn engine_on(f: &Fleet, name: &str, port: u16, args: &[&str]) -> Guard {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + WAIT;
    let mut attempt = 0;
    loop {
        let mut cmd = std::process::Command::new(llm_demo::paths::bin_path("engine-mock").unwrap());
        cmd.args([
            "--port",
            &port.to_string(),
            "--worker-id",
            name,
            "--role",
            "regular",
        ]);
        cmd.args(args);
        let log = f.dir.join(format!("engine-{name}-again-{attempt}.log"));
        let mut guard = process::spawn(name, cmd, &log).unwrap();
        while Instant::now() < deadline {
            if admin::get(addr, "/metrics").is_ok_and(|r| r.status == 200) {
                return guard;
            }
            if guard.exited().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        assert!(
            Instant::now() < deadline,
            "engine {name} on port {port} came up (see {})",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(250));
        attempt += 1;
    }
}

/// Sends `sig` (`-KILL`, `-STOP`, `-CONT`) to process `pid`, which must take it.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill {sig} {pid}");
}
