//! Differential scenarios: one file of steps (requests, stats pushes, time steps,
//! waits) and engine behaviour, run through host-sim and through the real Envoy with
//! engine mocks; both runs must observe the same status, worker, decision, reason
//! and (PD) prefill worker at every step. A scenario's `expect`s then pin what the
//! behaviour is, so a scenario cannot pass by both sides doing the same wrong thing.
//!
//! Format (JSON, `tests/e2e/scenarios/*.json`):
//! ```json
//! {"workers": 3, "config": {"policy": "cache_aware", "worker_queue_limit": 2, "stats_token": "tok"},
//!  "engines": {"decode_ms_per_token": 100},
//!  "steps": [
//!    {"request": {"body": {"model": "mock", "prompt": "..."}, "hold": true}},
//!    {"push": {"workers": [{"name": "@0", "num_waiting": 5, "ttft_p90_s": 5.0}]}},
//!    {"request": {"raw": "not json", "expect": {"decision": "cache_miss"}}},
//!    {"engine": {"worker": "@0", "ttft_ms": 200}},
//!    {"wait": {"stat": "llm_router_overload_flagged", "equals": 1}},
//!    {"advance_ms": 100}]}
//! ```
//! In a push or an `engine` step, `"@N"` names the worker step N went to.
//! `config` is merged over `{"rng_seed": 1}` (tie-breaks replay identically); the
//! fleet adds `workers` (`w0`... on clusters `engine_w0`...) and `target`. With
//! `"pd": [P, D]` the fleet is P prefill and D decode engines (`p0`..., `d0`...; the
//! host-sim ones get made-up bootstrap addresses, the mocks their real ones); a
//! step's worker is then the decode one, and `expect` can also name the prefill
//! worker (`prefill_worker`, `same_prefill_as`, `other_prefill_than`). A request
//! `path` defaults to `/v1/completions` for `prompt` bodies, else chat; the driver sets
//! `max_tokens` (1, or 64 for a `hold`) so that with `decode_ms_per_token` a held
//! request stays in flight on the engine (Envoy) or unanswered (host-sim) until the
//! scenario ends. `engines` sets every engine's behaviour, `engines.workers.wN`
//! overrides one engine's latency, and an `engine` step changes it mid-run (the
//! mock's `POST /admin/latency`), which is what latency-driven behaviour needs.
//!
//! Time: `advance_ms` is virtual in host-sim and a sleep in Envoy, so keep it short;
//! where a condition exists, a `wait` step waits for a filter stat (`equals` or
//! `at_least`) instead: virtual time in host-sim, polling Envoy's admin in Envoy, at
//! most 60 s either way. In host-sim the filter's HTTP calls (PD prefill copies,
//! overload probes from the root context) are served by the simulated fleet
//! ([`host_sim::replay::Calls`]) while virtual time passes, in `advance_ms` and
//! `wait` steps and while a request waits for the calls it made; a call times out
//! when its engine is slower than the call's timeout, as in Envoy.
//!
//! Envoy runs one worker thread: with several, which thread takes a connection is
//! the kernel's choice, not the scenario's. A scenario whose placement of new
//! prompts matters names a policy whose decisions do not depend on time
//! (`cache_aware`): `predicted_ttft`, the default, learns engine speeds from what
//! it measures, real time in Envoy and virtual time in host-sim.

use crate::support::EXPLAINED_JSON;
use anyhow::{bail, Context, Result};
use engine_model::engine::EngineSpec;
use engine_model::latency::Latency;
use host_sim::fleet::SimFleet;
use host_sim::replay::Calls;
use host_sim::{Filter, Host, RequestSpec};
use llm_demo::admin::{self, Response};
use llm_demo::fleet::{Fleet, FleetSpec};
use llm_router::support::header_names::EXPLAIN_HEADER;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

/// One scenario file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// What it shows (for failure messages).
    #[serde(default)]
    pub about: String,
    #[serde(default = "default_workers")]
    pub workers: usize,
    /// Prefill/decode disaggregation: `[prefill, decode]` engines (`p0..`, `d0..`)
    /// instead of `workers` regular ones.
    #[serde(default)]
    pub pd: Option<(usize, usize)>,
    /// Plugin config merged over the scenario defaults.
    #[serde(default)]
    pub config: Value,
    #[serde(default)]
    pub engines: Engines,
    pub steps: Vec<Step>,
}

fn default_workers() -> usize {
    3
}

/// Engine behaviour, as the engine mock's flags of the same names.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Behaviour {
    pub decode_ms_per_token: Option<f64>,
    pub ttft_ms: Option<f64>,
    pub prefill_us_per_token: Option<f64>,
    pub max_running: Option<usize>,
}

/// Every engine's behaviour, with per-worker overrides.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Engines {
    #[serde(flatten)]
    pub all: Behaviour,
    #[serde(default)]
    pub workers: BTreeMap<String, Behaviour>,
}

impl Engines {
    fn get(&self, worker: &str) -> Behaviour {
        let one = self.workers.get(worker).cloned().unwrap_or_default();
        Behaviour {
            decode_ms_per_token: one.decode_ms_per_token.or(self.all.decode_ms_per_token),
            ttft_ms: one.ttft_ms.or(self.all.ttft_ms),
            prefill_us_per_token: one.prefill_us_per_token.or(self.all.prefill_us_per_token),
            max_running: one.max_running.or(self.all.max_running),
        }
    }
}

impl Behaviour {
    fn engine_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        let mut arg = |name: &str, v: Option<String>| {
            if let Some(v) = v {
                args.push(format!("--{name}={v}"));
            }
        };
        arg(
            "decode-ms-per-token",
            self.decode_ms_per_token.map(|v| v.to_string()),
        );
        arg("ttft-ms", self.ttft_ms.map(|v| v.to_string()));
        arg(
            "prefill-us-per-token",
            self.prefill_us_per_token.map(|v| v.to_string()),
        );
        arg("max-running", self.max_running.map(|v| v.to_string()));
        args
    }

    /// The latency part as the mock's `POST /admin/latency` body.
    fn latency_json(&self) -> Value {
        json!({
            "ttft_ms": self.ttft_ms,
            "decode_ms_per_token": self.decode_ms_per_token,
            "prefill_us_per_token": self.prefill_us_per_token,
        })
    }

    /// `latency` with this behaviour's fields applied.
    fn apply(&self, latency: Latency) -> Latency {
        Latency {
            ttft_ms: self.ttft_ms.unwrap_or(latency.ttft_ms),
            prefill_us_per_token: self
                .prefill_us_per_token
                .unwrap_or(latency.prefill_us_per_token),
            decode_ms_per_token: self
                .decode_ms_per_token
                .unwrap_or(latency.decode_ms_per_token),
        }
    }

    fn spec(&self) -> EngineSpec {
        let d = EngineSpec::default();
        EngineSpec {
            max_running: self.max_running.unwrap_or(d.max_running),
            latency: Latency {
                ttft_ms: self.ttft_ms.unwrap_or(d.latency.ttft_ms),
                prefill_us_per_token: self
                    .prefill_us_per_token
                    .unwrap_or(d.latency.prefill_us_per_token),
                decode_ms_per_token: self
                    .decode_ms_per_token
                    .unwrap_or(d.latency.decode_ms_per_token),
            },
            ..d
        }
    }
}

/// One step.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Step {
    Request(Box<RequestStep>),
    /// A stats push (the collector's snapshot), authorized with the config's token.
    Push(Value),
    /// Time passes (host-sim: virtual; Envoy: a sleep, so keep it short).
    AdvanceMs(u64),
    /// One engine's latency changes from now on (the mock's `POST /admin/latency`).
    Engine(EngineStep),
    /// Time passes until a filter stat reaches a value (host-sim: virtual time, at
    /// most 60 s of it; Envoy: polled, at most 60 s); the step fails otherwise.
    Wait(WaitStep),
}

/// A condition on one of the filter's stats.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitStep {
    /// The stat without Envoy's `wasmcustom.` prefix: `llm_router_overload_flagged`.
    pub stat: String,
    /// Wait until it is exactly this...
    pub equals: Option<u64>,
    /// ...or at least this.
    pub at_least: Option<u64>,
}

impl WaitStep {
    fn met(&self, value: u64) -> Result<bool> {
        match (self.equals, self.at_least) {
            (Some(v), None) => Ok(value == v),
            (None, Some(v)) => Ok(value >= v),
            _ => bail!("a wait on {} needs one of `equals`, `at_least`", self.stat),
        }
    }
}

/// How long a `wait` step may take (virtual in host-sim, real in Envoy).
const WAIT_LIMIT_MS: u64 = 60_000;
/// How often a `wait` step looks at the stat.
const WAIT_POLL_MS: u64 = 20;

/// A change of one engine's behaviour.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineStep {
    /// The engine: `w1`, or `@N` for the worker step N went to.
    pub worker: String,
    #[serde(flatten)]
    pub behaviour: Behaviour,
}

/// A client request.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestStep {
    pub path: Option<String>,
    /// A JSON body (the driver sets `max_tokens`).
    pub body: Option<Value>,
    /// A body sent as is (bad input).
    pub raw: Option<String>,
    /// Keep the request in flight until the scenario ends.
    #[serde(default)]
    pub hold: bool,
    #[serde(default)]
    pub expect: Expect,
}

/// What a step must observe (on both sides).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    pub status: Option<u16>,
    pub worker: Option<String>,
    pub decision: Option<String>,
    pub reason: Option<String>,
    /// The worker of an earlier step (its index).
    pub same_worker_as: Option<usize>,
    pub other_worker_than: Option<usize>,
    /// PD: the prefill worker (`x-llm-router-prefill-worker`).
    pub prefill_worker: Option<String>,
    /// PD: the prefill worker of an earlier step (its index).
    pub same_prefill_as: Option<usize>,
    pub other_prefill_than: Option<usize>,
}

/// One field of an observation.
type Field = fn(&Observation) -> &Option<String>;

/// What one step observed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Observation {
    pub status: u16,
    pub worker: Option<String>,
    pub decision: Option<String>,
    pub reason: Option<String>,
    /// PD: the prefill worker of the pair (`worker` is the decode one).
    pub prefill_worker: Option<String>,
}

impl Scenario {
    /// Reads a scenario file.
    pub fn load(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn plugin_config(&self) -> Result<Value> {
        let mut cfg = json!({"rng_seed": 1});
        match &self.config {
            Value::Null => {}
            Value::Object(extra) => {
                for (k, v) in extra {
                    cfg[k] = v.clone();
                }
            }
            _ => bail!("`config` must be an object"),
        }
        Ok(cfg)
    }

    fn token(&self) -> String {
        self.config["stats_token"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn stats_path(&self) -> String {
        self.config["stats_path"]
            .as_str()
            .unwrap_or("/llm-router/stats")
            .to_string()
    }

    /// The bytes and path of a request step (what both sides send).
    fn request(step: &RequestStep) -> Result<(String, Vec<u8>)> {
        let body = match (&step.body, &step.raw) {
            (Some(Value::Object(b)), None) => {
                let mut b = b.clone();
                b.insert("max_tokens".into(), json!(if step.hold { 64 } else { 1 }));
                Value::Object(b).to_string().into_bytes()
            }
            (None, Some(raw)) => raw.clone().into_bytes(),
            _ => bail!("a request has either a JSON object `body` or a `raw` body"),
        };
        let path = step.path.clone().unwrap_or_else(|| {
            match &step.body {
                Some(b) if b.get("prompt").is_some() => "/v1/completions",
                _ => "/v1/chat/completions",
            }
            .to_string()
        });
        Ok((path, body))
    }

    /// Checks the observations against the steps' `expect`s.
    pub fn check(&self, seen: &[Observation]) -> Result<()> {
        for (i, (step, obs)) in self.steps.iter().zip(seen).enumerate() {
            let Step::Request(r) = step else { continue };
            let e = &r.expect;
            let want = |what: &str, want: &Option<String>, got: &Option<String>| -> Result<()> {
                match want {
                    Some(w) if Some(w) != got.as_ref() => {
                        bail!("step {i}: expected {what} {w:?}, saw {got:?} ({obs:?})")
                    }
                    _ => Ok(()),
                }
            };
            if let Some(s) = e.status {
                if s != obs.status {
                    bail!("step {i}: expected status {s}, saw {obs:?}");
                }
            }
            want("worker", &e.worker, &obs.worker)?;
            want("decision", &e.decision, &obs.decision)?;
            want("reason", &e.reason, &obs.reason)?;
            want("prefill worker", &e.prefill_worker, &obs.prefill_worker)?;
            // Step j's worker (or prefill worker) again, or another one.
            let relate = |j: usize, what: &str, field: Field, same: bool| -> Result<()> {
                let Some(theirs) = seen.get(j).filter(|_| j < i).map(field) else {
                    bail!("step {i}: step {j} is not an earlier step");
                };
                let Some(theirs) = theirs else {
                    bail!("step {i}: step {j} saw no {what} to compare with");
                };
                match (field(obs).as_ref() == Some(theirs), same) {
                    (false, true) => {
                        bail!("step {i}: expected the {what} of step {j} ({theirs}), saw {obs:?}")
                    }
                    (true, false) => {
                        bail!("step {i}: expected another {what} than step {j}'s ({theirs}), saw {obs:?}")
                    }
                    _ => Ok(()),
                }
            };
            let worker: Field = |o| &o.worker;
            let prefill: Field = |o| &o.prefill_worker;
            if let Some(j) = e.same_worker_as {
                relate(j, "worker", worker, true)?;
            }
            if let Some(j) = e.other_worker_than {
                relate(j, "worker", worker, false)?;
            }
            if let Some(j) = e.same_prefill_as {
                relate(j, "prefill worker", prefill, true)?;
            }
            if let Some(j) = e.other_prefill_than {
                relate(j, "prefill worker", prefill, false)?;
            }
        }
        Ok(())
    }

    /// Runs the scenario in host-sim (one worker VM plus the main thread's). The
    /// filter's HTTP calls (prefill copies, overload probes) are served by the
    /// simulated fleet in virtual time while time passes: during `advance_ms` and
    /// `wait` steps, and while a request waits for the calls it made.
    pub fn run_host_sim(&self, filter: &Filter) -> Result<Vec<Observation>> {
        let mut fleet = match self.pd {
            Some((prefill, decode)) => SimFleet::pd(prefill, decode, EngineSpec::default()),
            None => SimFleet::demo(self.workers, EngineSpec::default()),
        };
        for e in &mut fleet.engines {
            e.engine = engine_model::engine::Engine::new(self.engines.get(&e.name).spec());
        }
        let mut config = self.plugin_config()?;
        if config.get("workers").is_none() {
            config["workers"] = fleet.workers_config();
        }
        let mut host = Host::builder_for(filter)
            .plugin_config(config.to_string())
            .vms(2)
            .clusters(&fleet.clusters())
            .allow_on_headers_stop_iteration(true)
            .build()?;
        let start = host.now_ms();
        let now = |host: &Host| host.now_ms().saturating_sub(start) as f64;
        let mut calls = Calls::default();
        let mut seen = vec![Observation::default(); self.steps.len()];
        let mut held = Vec::new();
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::AdvanceMs(ms) => {
                    let until = now(&host) + *ms as f64;
                    calls.advance_to(&mut host, &mut fleet, start, until)?;
                }
                Step::Wait(wait) => {
                    let deadline = now(&host) + WAIT_LIMIT_MS as f64;
                    let stat = format!("wasmcustom.{}", wait.stat);
                    while !wait.met(host.metric(&stat).unwrap_or(0))? {
                        if now(&host) >= deadline {
                            bail!("step {i}: {wait:?} not met within {WAIT_LIMIT_MS} virtual ms");
                        }
                        let until = now(&host) + WAIT_POLL_MS as f64;
                        calls.advance_to(&mut host, &mut fleet, start, until)?;
                    }
                    seen[i].status = 200;
                }
                Step::Engine(change) => {
                    let name = resolve_name(&change.worker, &seen);
                    let Some(e) = fleet.engines.iter_mut().find(|e| e.name == name) else {
                        bail!("step {i}: no engine {name}");
                    };
                    if change.behaviour.max_running.is_some() {
                        bail!("step {i}: max_running cannot change while the engine runs");
                    }
                    let latency = change.behaviour.apply(e.engine.spec().latency);
                    e.engine.set_latency(latency);
                }
                Step::Push(snapshot) => {
                    let auth = format!("Bearer {}", self.token());
                    let path = self.stats_path();
                    let snapshot = resolve(snapshot, &seen);
                    let mut spec = RequestSpec::post_json(&path, snapshot.to_string());
                    spec.headers.push(("authorization", &auth));
                    let out = host.vm(0).request(spec)?;
                    seen[i].status = out.local_response.as_ref().map_or(0, |r| r.status as u16);
                    host.vm(0).finish(out.handle)?;
                }
                Step::Request(r) => {
                    let (path, body) = Self::request(r)?;
                    let mut spec = RequestSpec::post_json(&path, body);
                    spec.headers.push((EXPLAIN_HEADER, "1"));
                    let out = host.vm(0).request(spec)?;
                    if let Some(reply) = &out.local_response {
                        seen[i] = observe(reply.status, |h| reply.header(h));
                        continue;
                    }
                    let Some(engine) = fleet.find(
                        out.header("x-llm-router-cluster"),
                        out.header("x-gateway-destination-endpoint"),
                    ) else {
                        bail!("step {i}: routed to no engine: {:?}", out.request_headers);
                    };
                    // A prefill copy reaches its engine first: the decode engine takes
                    // the KV it publishes.
                    calls.schedule(&host, &mut fleet, now(&host));
                    let answer = fleet.serve(engine, now(&host), &path, &out.request_body);
                    // The calls it made (a prefill copy) are answered, or time out,
                    // first: the decode engine answers only once it has the KV.
                    let own: Vec<u32> = out.http_calls.iter().map(|c| c.token).collect();
                    let waiting = |host: &Host| {
                        host.pending_http_calls()
                            .iter()
                            .any(|c| own.contains(&c.token))
                    };
                    let deadline = now(&host) + WAIT_LIMIT_MS as f64;
                    while waiting(&host) {
                        if now(&host) >= deadline {
                            bail!("step {i}: the filter's calls were never answered");
                        }
                        let until = now(&host) + WAIT_POLL_MS as f64;
                        calls.advance_to(&mut host, &mut fleet, start, until)?;
                    }
                    // A failed prefill: the filter answered the client itself.
                    if let Some(reply) = host.vm(0).outcome(out.handle)?.local_response {
                        seen[i] = observe(reply.status, |h| reply.header(h));
                        continue;
                    }
                    if r.hold {
                        held.push((i, out.handle, answer));
                        continue;
                    }
                    let resp = host
                        .vm(0)
                        .respond(out.handle, answer.status, &[], &answer.body)?;
                    host.vm(0).finish(out.handle)?;
                    seen[i] = observe(answer.status, |h| resp.header(h));
                }
            }
        }
        for (i, handle, answer) in held {
            let resp = host
                .vm(0)
                .respond(handle, answer.status, &[], &answer.body)?;
            host.vm(0).finish(handle)?;
            seen[i] = observe(answer.status, |h| resp.header(h));
        }
        Ok(seen)
    }

    /// Runs the scenario through the real Envoy (one worker thread) and engine mocks.
    pub fn run_envoy(&self) -> Result<Vec<Observation>> {
        let engine_args = self.engines.all.engine_args();
        let fleet = Fleet::start(&FleetSpec {
            workers: self.workers,
            pd: self.pd,
            engine_args,
            plugin_config: self.plugin_config()?,
            ..FleetSpec::default()
        })?;
        for (name, behaviour) in &self.engines.workers {
            set_latency(&fleet, name, behaviour)?;
        }
        let envoy = &fleet.envoy;
        let mut seen = vec![Observation::default(); self.steps.len()];
        let mut held = Vec::new();
        let mut routed = 0;
        for (i, step) in self.steps.iter().enumerate() {
            match step {
                Step::AdvanceMs(ms) => std::thread::sleep(Duration::from_millis(*ms)),
                Step::Wait(wait) => {
                    let deadline = Instant::now() + Duration::from_millis(WAIT_LIMIT_MS);
                    while !wait.met(envoy.filter_stat(&wait.stat)?)? {
                        if Instant::now() > deadline {
                            bail!(
                                "step {i}: {wait:?} not met within {WAIT_LIMIT_MS} ms; envoy log tail:\n{}",
                                llm_demo::envoy::tail(&envoy.log)
                            );
                        }
                        std::thread::sleep(Duration::from_millis(WAIT_POLL_MS));
                    }
                    seen[i].status = 200;
                }
                Step::Engine(change) => {
                    let name = resolve_name(&change.worker, &seen);
                    set_latency(&fleet, &name, &change.behaviour)?;
                }
                Step::Push(snapshot) => {
                    let Some(addr) = envoy.stats_listener else {
                        bail!("step {i}: a push needs `stats_token` in the config");
                    };
                    let auth = format!("Bearer {}", self.token());
                    let headers = [
                        ("content-type", "application/json"),
                        ("authorization", auth.as_str()),
                    ];
                    let body = resolve(snapshot, &seen).to_string();
                    let path = self.stats_path();
                    let r = admin::request(addr, "POST", &path, &headers, body.as_bytes())?;
                    seen[i].status = r.status;
                }
                Step::Request(r) => {
                    let (path, body) = Self::request(r)?;
                    let addr = envoy.listener;
                    let send = move || admin::request(addr, "POST", &path, EXPLAINED_JSON, &body);
                    if r.hold {
                        held.push((i, std::thread::spawn(send)));
                        // The next step must see this request routed and in flight.
                        routed += 1;
                        wait_routed(&fleet, routed)?;
                        continue;
                    }
                    let resp = send()?;
                    routed = decisions(&fleet)?;
                    seen[i] = observe_envoy(&resp);
                }
            }
        }
        for (i, thread) in held {
            let resp = thread
                .join()
                .map_err(|_| anyhow::anyhow!("held request panicked"))??;
            seen[i] = observe_envoy(&resp);
        }
        Ok(seen)
    }
}

/// `"@N"`: the worker step N went to; any other name as is.
fn resolve_name(name: &str, seen: &[Observation]) -> String {
    match resolve(&json!(name), seen) {
        Value::String(s) => s,
        _ => String::new(),
    }
}

/// Changes an engine mock's latency at run time; its queue limit is a start flag.
fn set_latency(fleet: &Fleet, name: &str, behaviour: &Behaviour) -> Result<()> {
    if behaviour.max_running.is_some() {
        bail!("engine {name}: max_running is set for all engines, not per engine");
    }
    let Some(engine) = fleet.engine(name) else {
        bail!("no engine {name}");
    };
    let r = admin::post(
        engine.addr,
        "/admin/latency",
        &behaviour.latency_json().to_string(),
    )?;
    if r.status != 200 {
        bail!(
            "engine {name}: /admin/latency answered {}: {}",
            r.status,
            r.body
        );
    }
    Ok(())
}

/// A push with `"@N"` strings replaced by the worker step N was routed to, so a
/// scenario can load the owner of a prefix without knowing which worker it is.
fn resolve(snapshot: &Value, seen: &[Observation]) -> Value {
    match snapshot {
        Value::String(s) => match s.strip_prefix('@').and_then(|n| n.parse::<usize>().ok()) {
            Some(n) => json!(seen.get(n).and_then(|o| o.worker.clone())),
            None => snapshot.clone(),
        },
        Value::Array(items) => Value::Array(items.iter().map(|v| resolve(v, seen)).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (k.clone(), resolve(v, seen)))
                .collect(),
        ),
        other => other.clone(),
    }
}

fn observe<'a>(status: u32, header: impl Fn(&str) -> Option<&'a str>) -> Observation {
    Observation {
        status: status as u16,
        worker: header("x-llm-router-worker").map(str::to_string),
        decision: header("x-llm-router-decision").map(str::to_string),
        reason: header("x-llm-router-reason").map(str::to_string),
        prefill_worker: header("x-llm-router-prefill-worker").map(str::to_string),
    }
}

fn observe_envoy(r: &Response) -> Observation {
    observe(u32::from(r.status), |h| r.header(h))
}

/// Routed requests so far: the sum of the decision counters.
fn decisions(fleet: &Fleet) -> Result<u64> {
    let stats = fleet.envoy.stats()?;
    Ok(stats
        .iter()
        .filter(|(k, _)| k.starts_with("wasmcustom.llm_router_decisions_"))
        .map(|(_, v)| v)
        .sum())
}

/// Waits until Envoy routed `n` requests (a held request reached the filter's
/// decision), for at most 20 s.
fn wait_routed(fleet: &Fleet, n: u64) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while decisions(fleet)? < n {
        if Instant::now() > deadline {
            bail!("Envoy did not route the held request");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}
