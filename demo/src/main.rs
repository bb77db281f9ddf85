//! `llm-demo`: engine mocks + Envoy with the filter + a multi-turn workload, then a
//! report. `envoy/demo` builds what is missing and runs this.
//!
//! The run is repeated with each baseline router (round robin unless `--baseline`
//! says otherwise) on a fresh fleet, so the engine-reported cache hit ratio and the
//! latencies of all of them can be compared on the same workload, side by side in one
//! table. A baseline can be another policy of the filter, Envoy's own ring hash, or
//! SGLang's model gateway (`smg`, installed from PyPI on first use). The last line of
//! stdout is one JSON object.
//!
//! `--family SEED` runs member SEED of `llm-load`'s workload family (the one `host-sim
//! sweep` runs in virtual time): its workload, its load, and its fleet, each engine
//! mock with its own flags (`family`, `engine_args`).
//!
//! `--slow-worker N` runs the overload schedule instead: the workload in thirds,
//! each paced over `--phase-s`, with engine mock N slow (TTFT 1.5 s) during the
//! middle third, and overload thresholds scaled to that time (see `demo_overload`).
//! The report shows the slow worker's request share per phase and the overload
//! counters from Envoy's stats.
//!
//! `--discovery` runs membership from service discovery instead (`discovery_run`):
//! no worker in the filter's config, engines joining and leaving through Envoy's
//! EDS while the workload runs.

mod discovery_run;

use anyhow::{bail, Context, Result};
use clap::Parser;
use llm_demo::admin;
use llm_demo::envoy::{InPath, Target};
use llm_demo::fleet::{Fleet, FleetSpec};
use llm_demo::{engine_args, family, side_by_side, smg};
use llm_load::cli::Replay;
use llm_load::family::Member;
use llm_load::fleet::PdArgs;
use llm_load::generate::{generate, to_jsonl, GenerateConfig};
use llm_load::html;
use llm_load::record::Record;
use llm_load::run::envoy_stat;
use llm_load::run::{self, PdCounts, RunResult};
use llm_load::stats::{summarize, Summary};
use llm_load::workload::{load_workload, WorkItem};
use llm_router::support::metric_names as names;
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(
    name = "llm-demo",
    version,
    about = "Envoy + the llm-router filter + engine mocks, with sample traffic"
)]
struct Args {
    /// Engine mocks to start.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    #[command(flatten)]
    pd: PdArgs,
    /// Routing policy: predicted_ttft, cache_aware, round_robin, random,
    /// power_of_two. Default: the filter's for the routed pool (with --pd, the
    /// prefill pool's): predicted_ttft.
    #[arg(long)]
    policy: Option<String>,
    /// The comparison runs, each on a fresh fleet, comma-separated: a policy name
    /// (with settings of its own, `policy+key=value+...`, e.g.
    /// `cache_aware+kv_capacity_bound=false`), `no_gate` (this run's config without `worker_queue_limit`/`saturation_queue_floor`),
    /// `ring_hash` (no filter in the request path: Envoy's `RING_HASH` on
    /// `x-session-id`), `ring_hash+filter` (ring hash routes, with this run's filter
    /// deciding in the path, its choice of worker ignored but its own answers (a
    /// queue gate's 429s) kept: what the filter costs apart from where it routes),
    /// `ring_hash+floor` (the same with `llm-floor`, the guest that
    /// only buffers the body, in the path), `smg` (SGLang's model gateway 1.13.0 from
    /// PyPI, `cache_aware`, in front of the same engines), or `none`. E.g.
    /// `--baseline ring_hash,smg`.
    /// Default: `no_gate` when the filter config sets the gate, else `round_robin`.
    #[arg(long, value_delimiter = ',')]
    baseline: Vec<String>,
    /// How often the companion collector scrapes the engines and pushes to the filter.
    #[arg(long, default_value_t = 200)]
    collector_interval_ms: u64,
    /// Envoy worker threads (one Wasm VM each).
    #[arg(long, default_value_t = 1)]
    envoy_concurrency: u32,
    /// A JSON object merged over the demo's plugin configuration (top-level keys
    /// replace the demo's).
    #[arg(long)]
    filter_config: Option<PathBuf>,
    /// `cluster` (a cluster per worker) or `endpoint` (override_host).
    #[arg(long, default_value = "cluster")]
    target: String,
    /// A JSONL workload (see `llm-load`); generated when absent.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Extra argument for every engine mock (repeatable), e.g. `--engine-arg=--max-running=2`.
    #[arg(long = "engine-arg", allow_hyphen_values = true)]
    engine_args: Vec<String>,
    /// Extra argument for one engine mock, `ENGINE=ARG` (repeatable), e.g.
    /// `--engine-arg-for w2=--prefill-us-per-token=400`; it replaces the same flag of
    /// `--engine-arg`, `--prefill-us-per-token` and `--family`.
    #[arg(
        long = "engine-arg-for",
        value_name = "ENGINE=ARG",
        allow_hyphen_values = true,
        value_parser = engine_args::parse_for
    )]
    engine_args_for: Vec<(String, String)>,
    /// Member SEED of `llm-load`'s workload family, as `host-sim sweep` runs it: its
    /// workload, requests in flight, and fleet (engines, each one's running slots,
    /// prefill cost and cache size), instead of the flags that set those.
    #[arg(long, value_name = "SEED", conflicts_with_all = [
        "workload", "workers", "pd", "concurrency", "prefill_us_per_token", "sessions",
        "turns", "system_prompts", "system_prompt_chars", "user_chars", "stream_fraction",
        "slow_worker",
    ])]
    family: Option<u64>,
    /// Simulated prefill cost of the engine mocks per uncached prompt token, so
    /// cache hits show in latency as they do on a real engine.
    #[arg(long, default_value_t = 100.0)]
    prefill_us_per_token: f64,
    /// Generated workload: sessions (conversations). Default: 30, or the next number
    /// that is not a multiple of the routed pool's size (`--workers`, or
    /// `--prefill-workers` with `--pd`): turns are interleaved session by session, so
    /// round robin would otherwise pin each session to one worker by accident.
    #[arg(long)]
    sessions: Option<usize>,
    /// Generated workload: turns per session.
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// Generated workload: distinct system prompts. Default 8; with `--slow-worker`,
    /// one per conversation, so a new conversation is a cache miss that least-load
    /// routing can give to a recovered worker (with shared system prompts, new
    /// conversations follow the prompt's owners, which the slow phase moved away).
    #[arg(long)]
    system_prompts: Option<usize>,
    /// Generated workload: system prompt length in chars.
    #[arg(long, default_value_t = 1500)]
    system_prompt_chars: usize,
    /// Generated workload: user message and reply length in chars.
    #[arg(long, default_value_t = 300)]
    user_chars: usize,
    /// Generated workload: share of streaming requests.
    #[arg(long, default_value_t = 0.25)]
    stream_fraction: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where configs, logs and the workload go.
    #[arg(long, default_value = ".demo")]
    dir: PathBuf,
    /// Per-request timeout in seconds.
    #[arg(long, default_value_t = 120.0)]
    timeout_s: f64,
    /// Make engine mock N (`wN`) slow for the middle third of the run, then healthy
    /// again, with overload flags tuned to the demo's time scale. No baseline run
    /// unless `--baseline` asks for one.
    #[arg(long)]
    slow_worker: Option<usize>,
    /// Engines publish their KV cache events (vLLM's format) and the collector follows
    /// them; the report adds, per engine, the blocks the collector's index holds beside
    /// those its cache holds.
    #[arg(long)]
    kv_events: bool,
    /// With `--slow-worker`: each third of the run is paced over at least this long.
    #[arg(long, default_value_t = 8.0)]
    phase_s: f64,
    /// Membership from service discovery: the filter lists no workers, Envoy reads
    /// the engines from a watched EDS file, the collector pushes what Envoy knows;
    /// mid-run an engine joins and `w0` leaves. No baseline run.
    #[arg(long, conflicts_with_all = ["slow_worker", "baseline", "envoys", "engine_args_for", "family"])]
    discovery: bool,
    /// Several Envoy replicas (N >= 2): the workload spreads round robin over them,
    /// a new connection per request, with sharing through NATS and without, beside
    /// one Envoy (see `replicas_demo`).
    #[arg(long, default_value_t = 1)]
    envoys: usize,
    /// With `--envoys`: one more shared run with the bus stopped for its middle third.
    #[arg(long)]
    bus_outage: bool,
}

impl Args {
    /// The routed pool's policy: `--policy`, else the filter's default for it.
    fn policy(&self) -> &str {
        self.policy.as_deref().unwrap_or(if self.pd.pd {
            llm_router::config::DEFAULT_PREFILL_POLICY.as_str()
        } else {
            llm_router::config::Policy::default().as_str()
        })
    }

    /// Every engine mock's flags: the prefill cost, then `--engine-arg`s.
    fn engine_flags(&self) -> Vec<String> {
        [format!(
            "--prefill-us-per-token={}",
            self.prefill_us_per_token
        )]
        .into_iter()
        .chain(self.engine_args.iter().cloned())
        .collect()
    }

    /// Each engine's own flags, replacing the common ones (`engine_flags`): the family
    /// member's engine shape, then `--engine-arg` (which is for every engine, so it
    /// overrides the member too), then the engine's `--engine-arg-for`.
    fn engine_flags_for(&self) -> BTreeMap<String, Vec<String>> {
        let mut own = self
            .family
            .map(|seed| family::fleet_args(&Member::draw(seed)))
            .unwrap_or_default();
        for args in own.values_mut() {
            *args = engine_args::merged(args, &self.engine_args);
        }
        for (name, arg) in &self.engine_args_for {
            let args = own.entry(name.clone()).or_default();
            *args = engine_args::merged(args, std::slice::from_ref(arg));
        }
        own
    }

    /// These flags with `--family`'s fleet size and requests in flight.
    fn with_family(mut self) -> Self {
        if let Some(seed) = self.family {
            let member = Member::draw(seed);
            self.workers = member.engines.len();
            self.concurrency = member.concurrency;
        }
        self
    }
}

mod replicas_demo;

const DEFAULT_SYSTEM_PROMPTS: usize = 8;

/// The slow worker's injected TTFT: over the demo's enter threshold (1 s) and its
/// probe timeout (0.5 s), so it is flagged and its probes fail while slow.
const SLOW_TTFT_MS: f64 = 1500.0;
/// The collector's p90 window with `--slow-worker`: short against a phase, so the
/// slow phase's samples have aged out when the healthy phase starts.
const SLOW_WINDOW_S: u64 = 2;
/// How long the demo waits, after the last request, for a recovery under way.
const RECOVERY_WAIT: Duration = Duration::from_secs(30);

/// Overload settings at the demo's scale: enter at a TTFT p90 of 1 s, recover
/// below 0.5 s after 3 probes in a row answered within 0.5 s, probing every 250 ms.
/// TPOT thresholds sit far above what the mock produces (no decode delay).
fn demo_overload() -> Value {
    json!({
        "ttft_enter_s": 1.0, "ttft_recover_s": 0.5,
        "tpot_enter_s": 5.0, "tpot_recover_s": 1.0,
        "probe_interval_ms": 250, "probe_timeout_ms": 500,
        "probe_successes_to_recover": 3,
    })
}

const PHASES: [&str; 3] = ["before", "slow", "after"];
const OVERLOAD_STATS: [&str; 6] = [
    names::OVERLOAD_ENTERED,
    names::OVERLOAD_RECOVERED,
    names::OVERLOAD_OWNER_FILTERED,
    names::OVERLOAD_FLAGGED,
    names::OVERLOAD_PROBES_OK,
    names::OVERLOAD_PROBES_FAILED,
];

/// What the slow-worker schedule measured.
struct OverloadRun {
    worker: String,
    /// The slow worker's share of the responses, by phase.
    shares: Vec<(&'static str, f64)>,
    /// `llm_router_overload_*` from Envoy's stats.
    stats: BTreeMap<String, u64>,
}

/// The run's plugin config: the demo's (see `llm_load::run::plugin_config`) with,
/// for `--slow-worker`, overload flags at the demo's scale, `--filter-config`
/// merged over it, and the settings a policy variant carries
/// (`policy+key=value`, `llm_load::run::policy_variant`) over that.
fn plugin_config(args: &Args, policy: &str, no_gate: bool) -> Result<Value> {
    let (policy, settings) = run::policy_variant(policy)?;
    let mut extra = match &args.filter_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --filter-config {}", path.display()))?;
            let Value::Object(map) = serde_json::from_str::<Value>(&text)
                .with_context(|| format!("--filter-config {} is not JSON", path.display()))?
            else {
                bail!("--filter-config {} must hold a JSON object", path.display());
            };
            map
        }
        None => Map::new(),
    };
    if args.slow_worker.is_some() {
        extra.entry("overload").or_insert_with(demo_overload);
    }
    extra.extend(settings);
    run::plugin_config(
        run::policy_key(args.pd.pd),
        policy,
        args.policy(),
        Some(&Value::Object(extra)),
        no_gate,
        args.seed,
    )
}

fn workload(args: &Args) -> Result<Vec<WorkItem>> {
    if let Some(path) = &args.workload {
        return load_workload(path);
    }
    let path = args.dir.join("workload.jsonl");
    if let Some(seed) = args.family {
        let member = Member::draw(seed);
        eprintln!("llm-demo: family member {seed}: {}", member.describe());
        std::fs::write(&path, to_jsonl(&generate(&member.workload))?)
            .with_context(|| format!("writing {}", path.display()))?;
        return load_workload(&path);
    }
    let pool = args.pd.routed_pool(args.workers);
    let sessions = args
        .sessions
        .unwrap_or_else(|| (30..).find(|n| pool < 2 || n % pool != 0).unwrap_or(30));
    let cfg = GenerateConfig {
        sessions,
        turns: args.turns,
        system_prompts: args.system_prompts.unwrap_or(match args.slow_worker {
            Some(_) => sessions,
            None => DEFAULT_SYSTEM_PROMPTS,
        }),
        system_prompt_chars: args.system_prompt_chars,
        user_chars: args.user_chars,
        seed: args.seed,
        stream_fraction: args.stream_fraction,
        ..GenerateConfig::default()
    };
    std::fs::write(&path, to_jsonl(&generate(&cfg))?)
        .with_context(|| format!("writing {}", path.display()))?;
    load_workload(&path)
}

/// The baselines that are no policy of the filter: Envoy's `RING_HASH` on the load
/// tool's session header, with nothing in the request path, with the filter there
/// (deciding as the main run's does, its choice ignored: what the filter costs
/// apart from where it routes), or with the buffer-only floor guest there. The one
/// mapping between the names and what is in the path: a baseline's name is looked
/// up through it, and a run's label is it.
fn ring_hash_name(in_path: InPath) -> &'static str {
    match in_path {
        InPath::Nothing => "ring_hash",
        InPath::Filter => "ring_hash+filter",
        InPath::Floor => "ring_hash+floor",
    }
}

/// The baseline that is another router: SGLang's model gateway.
const SMG: &str = "smg";

/// What routes one run's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Router {
    /// The filter with `policy`; `no_gate`: without the queue gate's knobs.
    Filter { policy: String, no_gate: bool },
    /// Envoy's own session hashing, with what `InPath` names in the request path.
    RingHash(InPath),
    /// SMG in front of the engines, Envoy and the filter idle beside it.
    Smg,
}

impl Router {
    /// The router `name` names, `no_gate` being the main policy without its gate.
    fn named(name: &str, main_policy: &str) -> Router {
        if let Some(in_path) = InPath::ALL.into_iter().find(|p| ring_hash_name(*p) == name) {
            return Router::RingHash(in_path);
        }
        match name {
            SMG => Router::Smg,
            "no_gate" => Router::Filter {
                policy: main_policy.into(),
                no_gate: true,
            },
            p => Router::Filter {
                policy: p.into(),
                no_gate: false,
            },
        }
    }

    /// The run's name in the report and the name of its directory.
    fn label(&self) -> String {
        match self {
            Router::Filter {
                policy,
                no_gate: true,
            } => format!("{policy}+no_gate"),
            Router::Filter { policy, .. } => policy.clone(),
            Router::RingHash(in_path) => ring_hash_name(*in_path).into(),
            Router::Smg => format!("{SMG}-{}", smg::SMG_VERSION),
        }
    }
}

/// The main run's router, `--policy`.
fn main_router(args: &Args) -> Router {
    Router::named(args.policy(), args.policy())
}

/// The baseline runs `--baseline` asks for, in its order: by default `no_gate` when
/// the filter config sets the gate, else `round_robin`, and none with
/// `--slow-worker`; the main run's own router is not run twice.
fn baselines(args: &Args) -> Result<Vec<Router>> {
    let names = match args.baseline.as_slice() {
        [] if args.slow_worker.is_some() => return Ok(Vec::new()),
        [] => vec![run::default_baseline(&plugin_config(args, args.policy(), false)?).to_string()],
        [none] if none == "none" => return Ok(Vec::new()),
        names => names.to_vec(),
    };
    let main = main_router(args);
    let mut out: Vec<Router> = Vec::new();
    for name in &names {
        if name == "none" {
            bail!("--baseline none runs no comparison, so it cannot be listed with others");
        }
        let router = Router::named(name, args.policy());
        if out.contains(&router) {
            bail!("--baseline lists {name} twice");
        }
        if router != main {
            out.push(router);
        }
    }
    Ok(out)
}

fn run_policy(
    args: &Args,
    router: &Router,
    smg_bin: Option<&std::path::Path>,
    items: &[WorkItem],
    rt: &tokio::runtime::Runtime,
) -> Result<RunResult> {
    let label = router.label();
    let target = match (router, args.target.as_str()) {
        (Router::RingHash(in_path), _) => Target::RingHash { in_path: *in_path },
        (_, "cluster") => Target::Cluster,
        (_, "endpoint") => Target::Endpoint,
        (_, other) => bail!("--target must be cluster or endpoint, got {other}"),
    };
    // Where the filter routes no request it only takes the collector's pushes (any
    // valid config does, so it keeps the main run's); in ring hash's request path it
    // decides as the main run does.
    let (filter_policy, no_gate) = match (router, main_router(args)) {
        (Router::Filter { policy, no_gate }, _) => (policy.as_str(), *no_gate),
        (_, Router::Filter { .. }) => (args.policy(), false),
        _ => ("cache_aware", false),
    };
    if *router == Router::Smg && args.pd.pd {
        bail!("the smg baseline routes a regular pool; it does not run with --pd");
    }
    let spec = fleet_spec(args, filter_policy, no_gate, target, &label)?;
    let engines = match args.pd.pools() {
        Some((prefill, decode)) => format!("{prefill} prefill + {decode} decode"),
        None => args.workers.to_string(),
    };
    eprintln!(
        "llm-demo: starting {engines} engine mocks, Envoy ({} thread(s), {label}, target {}) and the collector",
        args.envoy_concurrency, args.target
    );
    let fleet = Fleet::start(&spec)?;
    // Declared after the fleet, so dropped before it: SMG stops before its engines.
    let smg = match router {
        Router::Smg => {
            let bin = smg_bin.context("the smg baseline needs the smg executable")?;
            let workers: Vec<SocketAddr> = fleet.engines.iter().map(|e| e.addr).collect();
            eprintln!(
                "llm-demo: starting smg {} ({}) in front of the engines",
                smg::SMG_VERSION,
                smg::SMG_POLICY
            );
            Some(smg::start(bin, &workers, &fleet.dir)?)
        }
        _ => None,
    };
    let url = smg.as_ref().map_or_else(|| fleet.url(), |s| s.url());
    eprintln!(
        "llm-demo: replaying {} requests through {url} (concurrency {})",
        items.len(),
        args.concurrency
    );
    let started = Instant::now();
    let (records, wall, slow_phases) = match args.slow_worker {
        Some(n) => {
            let (records, wall, phases) = slow_schedule(args, &fleet, &url, n, items, rt)?;
            (
                records,
                wall,
                Some((llm_load::fleet::worker_name(n), phases)),
            )
        }
        None => {
            let replay = Replay::closed_loop(
                &url,
                args.concurrency,
                Duration::from_secs_f64(args.timeout_s),
            );
            let records = rt.block_on(replay.records(items.to_vec()));
            (records, started.elapsed(), None)
        }
    };
    let summary = summarize(&records, wall);
    let charts = args.dir.join(format!("{label}.html"));
    let title = format!("envoy/demo: {label}");
    std::fs::write(&charts, html::page(&title, &summary, &records))
        .with_context(|| format!("writing {}", charts.display()))?;
    llm_load::record::write_jsonl(&args.dir.join(format!("{label}.jsonl")), &records)?;
    let stats = fleet.envoy.settled_stats()?;
    let stat = |name: &str| stats.get(name).copied();
    let mut result = RunResult::new(label, summary, stat);
    result.notes.push(format!("charts: {}", charts.display()));
    if args.kv_events {
        result.notes.push(kv_events_note(&fleet)?);
    }
    if let Some(smg) = &smg {
        result.notes.push(format!(
            "smg {} ({}) routed, Envoy's filter idle; log {}",
            smg::SMG_VERSION,
            smg::SMG_POLICY,
            smg.log.display()
        ));
    }
    if args.pd.pd {
        let pd = PdCounts {
            pairs: fleet
                .engine_counter("decode", "engine_mock:pd_pairs_total")?
                .values()
                .sum(),
            kv_failures: fleet
                .engine_counter("decode", "engine_mock:pd_kv_failures_total")?
                .values()
                .sum(),
            prefill_failures: stat(&envoy_stat(names::PD_PREFILL_FAILURES)).unwrap_or(0),
            prefill_per_worker: fleet.engine_counter("prefill", "vllm:request_success_total")?,
        };
        pd.add_to(&mut result);
    }
    if let Some((worker, phases)) = slow_phases {
        let overload = OverloadRun {
            shares: phases
                .iter()
                .map(|(name, s)| (*name, share(s, &worker)))
                .collect(),
            worker,
            stats: OVERLOAD_STATS
                .iter()
                .map(|m| {
                    let key = m.strip_prefix("llm_router_overload_").unwrap_or(m);
                    (key.to_string(), stat(&envoy_stat(m)).unwrap_or(0))
                })
                .collect(),
        };
        overload.add_to(&mut result);
    }
    Ok(result)
}

/// The fleet of one run (`label` names its directory).
fn fleet_spec(
    args: &Args,
    filter_policy: &str,
    no_gate: bool,
    target: Target,
    label: &str,
) -> Result<FleetSpec> {
    Ok(FleetSpec {
        workers: args.workers,
        pd: args.pd.pools(),
        engine_args: args.engine_flags(),
        engine_args_for: args.engine_flags_for(),
        target,
        plugin_config: plugin_config(args, filter_policy, no_gate)?,
        envoy_concurrency: args.envoy_concurrency,
        dir: Some(args.dir.join(label)),
        collector_interval_ms: Some(args.collector_interval_ms),
        collector_args: match args.slow_worker {
            Some(_) => vec!["--window-s".into(), SLOW_WINDOW_S.to_string()],
            None => Vec::new(),
        },
        route_idle_timeout_ms: None,
        kv_events: args.kv_events,
    })
}

/// Per engine, the blocks the collector indexed from its KV events beside those its
/// cache holds, once they agree (events arrive a moment after the answers) or 5 s on.
fn kv_events_note(fleet: &Fleet) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut blocks = fleet.kv_blocks()?;
    while blocks.values().any(|(indexed, held)| indexed != held) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        blocks = fleet.kv_blocks()?;
    }
    let per: Vec<String> = blocks
        .iter()
        .map(|(name, (indexed, held))| format!("{name} {indexed} of {held}"))
        .collect();
    Ok(format!(
        "KV events: blocks the collector indexed of those each engine holds: {}",
        per.join(", ")
    ))
}

/// `worker`'s share of the responses in `s` (0 when there were none).
fn share(s: &Summary, worker: &str) -> f64 {
    let total: u64 = s.per_worker.values().sum();
    let n = s.per_worker.get(worker).copied().unwrap_or(0);
    if total == 0 {
        0.0
    } else {
        n as f64 / total as f64
    }
}

/// Sets the engine mock's injected TTFT; returns the one it had.
fn set_ttft(addr: SocketAddr, ttft_ms: Option<f64>) -> Result<f64> {
    let body = match ttft_ms {
        Some(ms) => json!({"ttft_ms": ms}),
        None => json!({}),
    };
    let r = admin::post(addr, "/admin/latency", &body.to_string())?;
    if r.status != 200 {
        bail!("engine {addr} refused /admin/latency: {}", r.body);
    }
    r.json()?["ttft_ms"]
        .as_f64()
        .context("/admin/latency answered without ttft_ms")
}

/// Conversations staggered over the run: a session keeps the order of its turns, but
/// the k-th session starts k steps in, so conversations begin and end throughout
/// the run rather than all spanning it. A worker that recovers can then win new
/// conversations; those re-homed while it was slow stay where their cache now is.
fn staggered(items: &[WorkItem]) -> Vec<WorkItem> {
    let mut sessions: HashMap<&str, (usize, usize)> = HashMap::new();
    let mut next_rank = 0;
    let mut keyed: Vec<(usize, usize, &WorkItem)> = items
        .iter()
        .map(|it| {
            let (rank, turn) = match &it.session {
                Some(id) => {
                    let entry = sessions.entry(id.as_str()).or_insert_with(|| {
                        next_rank += 1;
                        (next_rank, 0)
                    });
                    entry.1 += 1;
                    (entry.0, entry.1)
                }
                None => {
                    next_rank += 1;
                    (next_rank, 0)
                }
            };
            (rank + turn, rank, it)
        })
        .collect();
    keyed.sort_by_key(|(step, rank, _)| (*step, *rank));
    keyed.into_iter().map(|(_, _, it)| it.clone()).collect()
}

/// Replays `items` to `url` in chunks of `--concurrency`, paced so the whole takes at
/// least `--phase-s`.
fn paced(args: &Args, url: &str, items: &[WorkItem], rt: &tokio::runtime::Runtime) -> Vec<Record> {
    let chunk = args.concurrency.max(1);
    let chunks = items.len().div_ceil(chunk).max(1);
    let step = Duration::from_secs_f64(args.phase_s.max(0.0) / chunks as f64);
    let start = Instant::now();
    let mut records = Vec::new();
    for (k, part) in items.chunks(chunk).enumerate() {
        let due = start + step * k as u32;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let replay = Replay::closed_loop(
            url,
            args.concurrency,
            Duration::from_secs_f64(args.timeout_s),
        );
        records.extend(rt.block_on(replay.records(part.to_vec())));
    }
    records
}

/// The overload schedule: thirds of the (staggered) workload, engine `slow` slow
/// during the middle one. Returns the whole run's summary and each phase's.
/// The slow-worker schedule's records (send times from the run's start), its wall
/// time, and each phase's summary.
type SlowRun = (Vec<Record>, Duration, Vec<(&'static str, Summary)>);

fn slow_schedule(
    args: &Args,
    fleet: &Fleet,
    url: &str,
    slow: usize,
    items: &[WorkItem],
    rt: &tokio::runtime::Runtime,
) -> Result<SlowRun> {
    let engine = fleet
        .engines
        .get(slow)
        .with_context(|| format!("--slow-worker {slow}: there are {} workers", args.workers))?;
    let normal_ttft = set_ttft(engine.addr, None)?;
    let items = staggered(items);
    let third = items.len().div_ceil(3);
    let started = Instant::now();
    let mut all = Vec::new();
    let mut phases = Vec::new();
    for (name, part) in PHASES.iter().zip(items.chunks(third.max(1))) {
        match *name {
            "slow" => set_ttft(engine.addr, Some(SLOW_TTFT_MS))?,
            "after" => set_ttft(engine.addr, Some(normal_ttft))?,
            _ => normal_ttft,
        };
        eprintln!(
            "llm-demo: phase `{name}`: {} requests over at least {:.0} s, {} {}",
            part.len(),
            args.phase_s,
            engine.name,
            if *name == "slow" { "slow" } else { "healthy" }
        );
        let phase_start = Instant::now();
        let mut records = paced(args, url, part, rt);
        phases.push((*name, summarize(&records, phase_start.elapsed())));
        // Send times count from the run's start, not the phase's.
        let offset_ms = phase_start.duration_since(started).as_secs_f64() * 1000.0;
        for r in &mut records {
            r.start_ms += offset_ms;
        }
        all.extend(records);
    }
    // A recovery under way (probes still running) is let finish, within bounds.
    let deadline = Instant::now() + RECOVERY_WAIT;
    while fleet.envoy.filter_stat(names::OVERLOAD_FLAGGED)? > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((all, started.elapsed(), phases))
}

impl OverloadRun {
    /// The slow worker's report lines and the summary's `overload` object.
    fn add_to(&self, r: &mut RunResult) {
        let p: Vec<String> = self
            .shares
            .iter()
            .map(|(phase, s)| format!("{phase} {:.1}%", 100.0 * s))
            .collect();
        r.notes.push(format!(
            "slow worker {} request share: {}",
            self.worker,
            p.join(", ")
        ));
        let c: Vec<String> = self.stats.iter().map(|(k, v)| format!("{k} {v}")).collect();
        r.notes
            .push(format!("overload flags (Envoy stats): {}", c.join(", ")));
        let stat = |k: &str| self.stats.get(k).copied().unwrap_or(0);
        r.fields.insert(
            "overload".into(),
            json!({
                "entered": stat("entered"),
                "recovered": stat("recovered"),
                "owner_filtered": stat("owner_filtered"),
                "final_flagged": stat("flagged"),
                "probes_ok": stat("probes_ok"),
                "probes_failed": stat("probes_failed"),
                "slow_worker": self.worker,
                "slow_worker_share": self
                    .shares
                    .iter()
                    .map(|(p, s)| (p.to_string(), json!(s)))
                    .collect::<Map<String, Value>>(),
            }),
        );
    }
}

fn main() {
    let args = Args::parse().with_family();
    match real_main(&args) {
        Ok(clean) => std::process::exit(if clean { 0 } else { 3 }),
        Err(e) => {
            eprintln!("llm-demo: setup failed: {e:#}");
            std::process::exit(2);
        }
    }
}

/// Returns whether every request succeeded.
fn real_main(args: &Args) -> Result<bool> {
    std::fs::create_dir_all(&args.dir)?;
    let rt = tokio::runtime::Runtime::new()?;
    let items = workload(args)?;
    if args.envoys > 1 {
        return replicas_demo::run(args, &items, &rt);
    }
    if args.discovery {
        let (result, checks) = discovery_run::run(args, &items, &rt)?;
        run::print_report(
            &result,
            None,
            args.envoy_concurrency,
            args.workers + 1,
            Some(&args.dir.display().to_string()),
        );
        return Ok(checks && result.summary.errors == 0);
    }
    let main = main_router(args);
    let baselines = baselines(args)?;
    // Installed (on first use) before any run, so a failed install costs no run.
    let smg_bin = if [&main]
        .into_iter()
        .chain(&baselines)
        .any(|r| *r == Router::Smg)
    {
        Some(smg::smg_bin()?)
    } else {
        None
    };
    let runs = [&main]
        .into_iter()
        .chain(&baselines)
        .map(|r| run_policy(args, r, smg_bin.as_deref(), &items, &rt))
        .collect::<Result<Vec<_>>>()?;
    print_report(args, &runs);
    let errors: usize = runs.iter().map(|r| r.summary.errors).sum();
    // Every routed request's pair must have met (batches aside, one room each).
    let unpaired = runs
        .iter()
        .filter_map(|r| {
            let pairs = r.fields.get("pd_pairs")?.as_u64()?;
            let routed = r.summary.requests.saturating_sub(r.summary.errors);
            (pairs != routed as u64)
                .then(|| format!("{}: {pairs} pairs for {routed} requests", r.policy))
        })
        .collect::<Vec<_>>();
    for u in &unpaired {
        eprintln!("llm-demo: PD pairs do not match the routed requests ({u})");
    }
    Ok(errors == 0 && unpaired.is_empty())
}

/// Each run's report, the side-by-side table when there was a comparison, where the
/// logs are, then the last-line JSON: the main run's, the first baseline under
/// `baseline` and, with several, every baseline under `baselines`.
fn print_report(args: &Args, runs: &[RunResult]) {
    println!();
    for r in runs {
        print!("{}", r.report());
    }
    if runs.len() > 1 {
        println!("== side by side: the same workload, a fresh fleet each ==");
        print!("{}", side_by_side::table(&runs.iter().collect::<Vec<_>>()));
    }
    println!("logs and configs: {}", args.dir.display());
    let (main, baselines) = runs.split_first().expect("the main run");
    let mut line = run::last_line(
        main,
        baselines.first(),
        args.envoy_concurrency,
        args.pd.engines(args.workers),
    );
    if baselines.len() > 1 {
        line["baselines"] = baselines.iter().map(RunResult::json).collect();
    }
    println!("{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(flags: &[&str]) -> Args {
        Args::try_parse_from(["llm-demo"].iter().chain(flags)).expect("valid flags")
    }

    fn filter(policy: &str, no_gate: bool) -> Router {
        Router::Filter {
            policy: policy.into(),
            no_gate,
        }
    }

    #[test]
    fn the_policy_left_out_is_the_filters_default_for_the_routed_pool() {
        assert_eq!(parse(&[]).policy(), "predicted_ttft");
        assert_eq!(
            parse(&["--pd"]).policy(),
            "predicted_ttft",
            "the prefill pool's"
        );
        assert_eq!(parse(&["--pd", "--policy", "random"]).policy(), "random");
    }

    #[test]
    fn baseline_lists_several_routers_in_order() {
        let args = parse(&["--baseline", "ring_hash,smg,round_robin"]);
        assert_eq!(
            baselines(&args).unwrap(),
            [
                Router::RingHash(InPath::Nothing),
                Router::Smg,
                filter("round_robin", false)
            ]
        );
        let args = parse(&["--baseline", "smg", "--baseline", "no_gate"]);
        assert_eq!(
            baselines(&args).unwrap(),
            [Router::Smg, filter("predicted_ttft", true)],
            "the flag repeats as well as it lists"
        );
    }

    #[test]
    fn one_baseline_and_the_defaults_run_as_before() {
        assert_eq!(
            baselines(&parse(&[])).unwrap(),
            [filter("round_robin", false)],
            "round robin unless the config sets the gate"
        );
        assert_eq!(
            baselines(&parse(&["--slow-worker", "1"])).unwrap(),
            [],
            "the overload schedule compares nothing by default"
        );
        assert_eq!(baselines(&parse(&["--baseline", "none"])).unwrap(), []);
        assert_eq!(
            baselines(&parse(&[
                "--policy",
                "predicted_ttft",
                "--baseline",
                "predicted_ttft,smg"
            ]))
            .unwrap(),
            [Router::Smg],
            "the main run's own router is not run again"
        );
    }

    #[test]
    fn baseline_lists_that_cannot_be_meant_are_refused() {
        let err = baselines(&parse(&["--baseline", "none,smg"])).unwrap_err();
        assert!(err.to_string().contains("none"), "{err}");
        let err = baselines(&parse(&["--baseline", "smg,ring_hash,smg"])).unwrap_err();
        assert!(err.to_string().contains("smg twice"), "{err}");
    }

    #[test]
    fn an_engine_argument_for_one_engine_replaces_the_common_flag() {
        let args = parse(&[
            "--engine-arg=--max-running=2",
            "--engine-arg-for",
            "w2=--prefill-us-per-token=400",
            "--engine-arg-for=w2=--max-running=1",
        ]);
        let spec = fleet_spec(&args, "cache_aware", false, Target::Cluster, "x").unwrap();
        assert_eq!(
            spec.engine_args,
            ["--prefill-us-per-token=100", "--max-running=2"]
        );
        assert_eq!(
            spec.engine_args_for.into_iter().collect::<Vec<_>>(),
            [(
                "w2".to_string(),
                vec![
                    "--prefill-us-per-token=400".to_string(),
                    "--max-running=1".to_string()
                ]
            )]
        );
        assert!(Args::try_parse_from(["llm-demo", "--engine-arg-for", "--max-running=1"]).is_err());
    }

    #[test]
    fn a_family_member_sets_the_fleet_and_the_load() {
        let member = Member::draw(12);
        let args = parse(&["--family", "12", "--engine-arg=--decode-ms-per-token=1"]).with_family();
        assert_eq!(args.workers, member.engines.len());
        assert_eq!(args.concurrency, member.concurrency);
        let own = args.engine_flags_for();
        assert_eq!(own.len(), member.engines.len());
        for (i, shape) in member.engines.iter().enumerate() {
            let flags = &own[&format!("w{i}")];
            assert!(
                flags.contains(&format!(
                    "--prefill-us-per-token={}",
                    shape.prefill_us_per_token
                )),
                "{flags:?}"
            );
            assert!(flags.contains(&format!("--max-running={}", shape.max_running)));
            assert!(
                flags.contains(&"--decode-ms-per-token=1".to_string()),
                "--engine-arg still reaches every engine"
            );
        }
        for clash in ["--workers=3", "--concurrency=3", "--sessions=3", "--pd"] {
            assert!(
                Args::try_parse_from(["llm-demo", "--family", "12", clash]).is_err(),
                "{clash} would contradict the member"
            );
        }
    }

    #[test]
    fn a_family_member_writes_its_own_workload() {
        let dir = std::env::temp_dir().join(format!("llm-demo-family-{}", std::process::id()));
        let args = parse(&["--family", "12", "--dir", dir.to_str().unwrap()]).with_family();
        std::fs::create_dir_all(&dir).unwrap();
        let items = workload(&args).unwrap();
        let w = Member::draw(12).workload;
        assert_eq!(items.len(), w.sessions * w.turns);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn every_router_has_its_own_label() {
        let labels: Vec<String> = [
            filter("cache_aware", false),
            filter("cache_aware", true),
            Router::RingHash(InPath::Nothing),
            Router::RingHash(InPath::Filter),
            Router::RingHash(InPath::Floor),
            Router::Smg,
        ]
        .iter()
        .map(Router::label)
        .collect();
        assert_eq!(
            labels,
            [
                "cache_aware",
                "cache_aware+no_gate",
                "ring_hash",
                "ring_hash+filter",
                "ring_hash+floor",
                "smg-1.13.0"
            ]
        );
    }

    #[test]
    fn ring_hash_runs_with_the_filter_or_the_floor_in_its_path_when_named_so() {
        let args = parse(&["--baseline", "ring_hash+filter,ring_hash+floor,ring_hash"]);
        assert_eq!(
            baselines(&args).unwrap(),
            [
                Router::RingHash(InPath::Filter),
                Router::RingHash(InPath::Floor),
                Router::RingHash(InPath::Nothing)
            ]
        );
    }
}
