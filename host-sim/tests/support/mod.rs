//! Helpers shared by host-sim's integration tests (`mod support;` in each test binary):
//! the compiled filters (the real `llm_router.wasm`, or host-sim's own test guest), a
//! host built the way these tests run the filter, request bodies, and a routed
//! exchange. Each binary uses a subset, hence `dead_code` is allowed here.
//!
//! The real filter is not built by the tests (a nested cargo build would contend for
//! the shared target dir): build it first with
//! `cargo build -p llm-router --target wasm32-wasip1 --profile wasm` (`tests/run` does
//! it), or point `LLM_ROUTER_WASM` at a build elsewhere.

#![allow(dead_code)]

use host_sim::{Filter, Host, HostBuilder, RequestSpec, StreamHandle, StreamOutcome};
use llm_router::support::header_names::EXPLAIN_HEADER;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The request header the filter routes by (`target: cluster`).
pub const CLUSTER_HEADER: &str = "x-llm-router-cluster";
/// The filter's default sync window (`sync_batch_ms`): a thread sees what the
/// others did at its first request this long after its last sync.
pub const SYNC_WINDOW_MS: u64 = llm_router::config::DEFAULT_SYNC_BATCH_MS;

/// The real routing filter, compiled once per test binary.
pub fn filter() -> Filter {
    static FILTER: OnceLock<Filter> = OnceLock::new();
    FILTER
        .get_or_init(|| {
            let path = host_sim::require_built_filter();
            Filter::load(&path).unwrap_or_else(|e| panic!("loading {}: {e:#}", path.display()))
        })
        .clone()
}

/// host-sim's own small test guest (host-sim/test-guest), built for wasm32-wasip1 on
/// first use into target/host-sim-test-guest (offline first, then online).
pub fn guest_wasm() -> PathBuf {
    static WASM: OnceLock<PathBuf> = OnceLock::new();
    WASM.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let target = dir.join("../target/host-sim-test-guest");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let build = |offline: bool| {
            let mut cmd = Command::new(&cargo);
            cmd.args([
                "build",
                "--release",
                "--target",
                "wasm32-wasip1",
                "--manifest-path",
            ])
            .arg(dir.join("test-guest/Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS");
            if offline {
                cmd.arg("--offline");
            }
            cmd.status().is_ok_and(|s| s.success())
        };
        assert!(
            build(true) || build(false),
            "building host-sim/test-guest failed"
        );
        target.join("wasm32-wasip1/release/host_sim_test_guest.wasm")
    })
    .clone()
}

/// The test guest, compiled once per test binary.
pub fn guest_filter() -> Filter {
    static FILTER: OnceLock<Filter> = OnceLock::new();
    FILTER
        .get_or_init(|| Filter::load(guest_wasm()).expect("load test guest"))
        .clone()
}

/// A host for the real filter as Envoy runs it here: `config`, `vms` worker threads,
/// `seed`, the clusters `proxy_http_call` may reach, and
/// `allow_on_headers_stop_iteration: true` (the filter reads the body to route).
pub fn builder<S: AsRef<str>>(config: &str, vms: usize, seed: u64, clusters: &[S]) -> HostBuilder {
    Host::builder_for(&filter())
        .plugin_config(config.as_bytes().to_vec())
        .vms(vms)
        .seed(seed)
        .clusters(clusters)
        .allow_on_headers_stop_iteration(true)
}

/// [`builder`], built; panics with the config and the filter's error if it refuses it.
pub fn host<S: AsRef<str>>(config: &str, vms: usize, seed: u64, clusters: &[S]) -> Host {
    build(builder(config, vms, seed, clusters), config)
}

/// Builds `builder` for `config`, or panics naming the config and the error.
pub fn build(builder: HostBuilder, config: &str) -> Host {
    builder
        .build()
        .unwrap_or_else(|e| panic!("building the host with {config}: {e:#}"))
}

/// `{"policy":"cache_aware","workers":[w0..wn-1 on engine_0..]<extra>}`: the
/// host's mechanics (sync, relay, counts, the gate) are tested under
/// `cache_aware`, whose decisions follow the tree alone, unless `extra` names a
/// policy (`predicted_ttft`, the default, has its own suite: ttft.rs).
pub fn fleet_config(n: usize, extra: &str) -> String {
    let workers: Vec<String> = (0..n)
        .map(|i| format!(r#"{{"name":"w{i}","cluster":"engine_{i}"}}"#))
        .collect();
    let policy = if extra.contains(r#""policy""#) {
        ""
    } else {
        r#""policy":"cache_aware","#
    };
    format!(r#"{{{policy}"workers":[{}]{extra}}}"#, workers.join(","))
}

/// The clusters of [`fleet_config`]'s workers.
pub fn fleet_clusters(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("engine_{i}")).collect()
}

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap()
}

/// A chat body whose messages alternate user/assistant turns.
pub fn chat(model: &str, turns: &[&str]) -> Vec<u8> {
    chat_with_system(model, None, turns)
}

/// A conversation's turns up to `turn` (0-based): each earlier question with its
/// answer, then the new question, as [`chat_with_system`] takes them.
pub fn conversation_turns(
    turn: usize,
    question: impl Fn(usize) -> String,
    answer: impl Fn(usize) -> String,
) -> Vec<String> {
    let mut turns = Vec::new();
    for t in 0..=turn {
        turns.push(question(t));
        if t < turn {
            turns.push(answer(t));
        }
    }
    turns
}

/// Conversation `conversation` at `turn` (0-based): a system prompt shared by no
/// other conversation, then its turns.
pub fn conversation(conversation: usize, turn: usize) -> Vec<u8> {
    let system = format!(
        "conversation {conversation}: {}",
        "you are a careful assistant. ".repeat(10)
    );
    let turns = conversation_turns(
        turn,
        |t| format!("question {t} of {conversation}"),
        |t| format!("answer {t}"),
    );
    chat_with_system("m", Some(&system), &turns)
}

/// A chat body: an optional system prompt, then turns alternating user/assistant.
pub fn chat_with_system(model: &str, system: Option<&str>, turns: &[impl AsRef<str>]) -> Vec<u8> {
    let system = system.map(|s| format!(r#"{{"role":"system","content":{}}}"#, json_str(s)));
    let msgs: Vec<String> = system
        .into_iter()
        .chain(turns.iter().enumerate().map(|(i, t)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            format!(r#"{{"role":"{role}","content":{}}}"#, json_str(t.as_ref()))
        }))
        .collect();
    format!(
        r#"{{"model":"{model}","stream":false,"messages":[{}]}}"#,
        msgs.join(",")
    )
    .into_bytes()
}

/// A completions body.
pub fn completion(model: &str, prompt: &str) -> Vec<u8> {
    format!(r#"{{"model":"{model}","prompt":{}}}"#, json_str(prompt)).into_bytes()
}

/// Pushes a stats snapshot on `vm` with a bearer `token`; returns the status and body
/// of the filter's own answer.
pub fn push(host: &mut Host, vm: usize, token: &str, body: &str) -> (u32, String) {
    let auth = format!("Bearer {token}");
    let mut spec = RequestSpec::post_json("/llm-router/stats", body.as_bytes().to_vec());
    spec.headers.push(("authorization", &auth));
    let out = host.vm(vm).request(spec).expect("push runs");
    let reply = out
        .local_response
        .expect("the filter answers pushes itself");
    (
        reply.status,
        String::from_utf8_lossy(&reply.body).into_owned(),
    )
}

/// Sends `spec` on `vm`; returns the cluster the filter chose and the outcome (the
/// stream stays open).
pub fn open(host: &mut Host, vm: usize, mut spec: RequestSpec<'_>) -> (String, StreamOutcome) {
    // The tests read the decision off the response, so they ask for it.
    spec.headers.push((EXPLAIN_HEADER, "1"));
    let out = host.vm(vm).request(spec).expect("request runs");
    let cluster = out
        .header(CLUSTER_HEADER)
        .unwrap_or_else(|| panic!("routed: no routing header in {out:?}"))
        .to_string();
    (cluster, out)
}

/// The upstream answers 200 `{}` and the stream ends; returns the decision reason the
/// filter put on the response, if any.
pub fn answer(host: &mut Host, vm: usize, handle: StreamHandle) -> Option<String> {
    let resp = host
        .vm(vm)
        .respond(handle, 200, &[("content-type", "application/json")], b"{}")
        .expect("response runs");
    let reason = resp.header("x-llm-router-reason").map(str::to_string);
    host.vm(vm).finish(handle).expect("stream ends");
    reason
}

/// [`open`] then [`answer`]: returns the cluster and the decision reason, if any.
pub fn route(host: &mut Host, vm: usize, spec: RequestSpec<'_>) -> (String, Option<String>) {
    let (cluster, out) = open(host, vm, spec);
    (cluster, answer(host, vm, out.handle))
}

/// A routed completion of `prompt` for model `m` on `vm`; see [`route`].
pub fn route_completion(host: &mut Host, vm: usize, prompt: &str) -> (String, Option<String>) {
    let spec = RequestSpec::post_json("/v1/completions", completion("m", prompt));
    route(host, vm, spec)
}

/// A counter or gauge that must be defined (`wasmcustom.NAME`).
pub fn metric(host: &Host, name: &str) -> u64 {
    host.metric(name)
        .unwrap_or_else(|| panic!("metric {name} is not defined: {:?}", host.metrics()))
}

/// The filter's counter or gauge `wasmcustom.{name}`, 0 while undefined.
pub fn stat(host: &Host, name: &str) -> u64 {
    host.metric(&format!("wasmcustom.{name}")).unwrap_or(0)
}

/// The outstanding prefill every VM's row of the in-flight table declares, as
/// shared data holds it (riding in the ring's head after the sequence number and
/// the generation; per row the VM, its time and its entry count, fixed-width, then
/// per entry a name and three counts as LEB128 varints): requests prefilling and
/// their chars, summed over the rows.
pub fn outstanding_prefill(host: &Host) -> (u64, u64) {
    let head = host.shared_data("llm_router.ring.head").unwrap_or_default();
    let mut r = Cursor(head.get(16..).unwrap_or_default());
    let (mut prefilling, mut chars) = (0, 0);
    for _row in 0..r.fixed(4) {
        let (_vm, _at_ms, entries, _len) = (r.fixed(8), r.fixed(8), r.fixed(4), r.fixed(4));
        for _entry in 0..entries {
            let name_len = r.varint() as usize;
            r.take(name_len);
            let (_requests, p, c) = (r.varint(), r.varint(), r.varint());
            prefilling += p;
            chars += c;
        }
    }
    (prefilling, chars)
}

/// A reader over shared data the tests decode; a short value fails the test.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let (got, rest) = self.0.split_at(n);
        self.0 = rest;
        got
    }

    /// `n` bytes, little-endian.
    fn fixed(&mut self, n: usize) -> u64 {
        self.take(n)
            .iter()
            .rev()
            .fold(0, |v, b| v << 8 | u64::from(*b))
    }

    /// An unsigned LEB128 varint.
    fn varint(&mut self) -> u64 {
        let mut v = 0;
        for shift in (0..64).step_by(7) {
            let byte = self.fixed(1);
            v |= (byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                break;
            }
        }
        v
    }
}
