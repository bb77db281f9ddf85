//! `llm-demo`: engine mocks + Envoy with the filter + a multi-turn workload, then a
//! report. `envoy/demo` builds what is missing and runs this.
//!
//! The run is repeated with a baseline policy (round robin unless `--baseline none`)
//! on a fresh fleet, so the engine-reported cache hit ratio of the two can be
//! compared on the same workload. The last line of stdout is one JSON object.

use anyhow::{bail, Context, Result};
use clap::Parser;
use e2e::envoy::Target;
use e2e::fleet::{Fleet, FleetSpec};
use llm_bench::demo::{self, RunResult};
use llm_bench::generate::{generate, to_jsonl, GenerateConfig};
use llm_bench::workload::{load_workload, WorkItem};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Parser)]
#[command(
    name = "llm-demo",
    about = "Envoy + the llm-router filter + engine mocks, with sample traffic"
)]
struct Args {
    /// Engine mocks to start.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Routing policy: cache_aware, round_robin, random, power_of_two.
    #[arg(long, default_value = "cache_aware")]
    policy: String,
    /// The comparison run on a fresh fleet: a policy name, `no_gate` (this run's
    /// config without `worker_queue_limit`/`saturation_queue_floor`), or `none`.
    /// Default: `no_gate` when the filter config sets the gate, else `round_robin`.
    #[arg(long)]
    baseline: Option<String>,
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
    /// Simulated prefill cost of the engine mocks per uncached prompt token, so
    /// cache hits show in latency as they do on a real engine.
    #[arg(long, default_value_t = 100.0)]
    prefill_us_per_token: f64,
    /// Generated workload: sessions (conversations). Not a multiple of `--workers` by
    /// default: round robin would otherwise pin each session to one worker by
    /// accident, as turns are interleaved session by session.
    #[arg(long, default_value_t = 30)]
    sessions: usize,
    /// Generated workload: turns per session.
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// Generated workload: distinct system prompts.
    #[arg(long, default_value_t = 8)]
    system_prompts: usize,
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
}

/// The run's plugin config: the demo's (see `llm_bench::demo::plugin_config`) with
/// `--filter-config` merged over it.
fn plugin_config(args: &Args, policy: &str, no_gate: bool) -> Result<Value> {
    let extra = match &args.filter_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading --filter-config {}", path.display()))?;
            Some(
                serde_json::from_str::<Value>(&text)
                    .with_context(|| format!("--filter-config {} is not JSON", path.display()))?,
            )
        }
        None => None,
    };
    demo::plugin_config(policy, &args.policy, extra.as_ref(), no_gate, args.seed)
        .with_context(|| format!("--filter-config {:?}", args.filter_config))
}

fn workload(args: &Args) -> Result<Vec<WorkItem>> {
    if let Some(path) = &args.workload {
        return load_workload(path);
    }
    let cfg = GenerateConfig {
        sessions: args.sessions,
        turns: args.turns,
        system_prompts: args.system_prompts,
        system_prompt_chars: args.system_prompt_chars,
        user_chars: args.user_chars,
        seed: args.seed,
        stream_fraction: args.stream_fraction,
        ..GenerateConfig::default()
    };
    let path = args.dir.join("workload.jsonl");
    std::fs::write(&path, to_jsonl(&generate(&cfg))?)
        .with_context(|| format!("writing {}", path.display()))?;
    load_workload(&path)
}

fn run(
    args: &Args,
    policy: &str,
    no_gate: bool,
    items: &[WorkItem],
    rt: &tokio::runtime::Runtime,
) -> Result<RunResult> {
    let label = if no_gate {
        format!("{policy}+no_gate")
    } else {
        policy.to_string()
    };
    let target = match args.target.as_str() {
        "cluster" => Target::Cluster,
        "endpoint" => Target::Endpoint,
        other => bail!("--target must be cluster or endpoint, got {other}"),
    };
    let spec = FleetSpec {
        workers: args.workers,
        engine_args: [format!(
            "--prefill-us-per-token={}",
            args.prefill_us_per_token
        )]
        .into_iter()
        .chain(args.engine_args.iter().cloned())
        .collect(),
        target,
        plugin_config: plugin_config(args, policy, no_gate)?,
        envoy_concurrency: args.envoy_concurrency,
        dir: Some(args.dir.join(&label)),
        collector_interval_ms: Some(args.collector_interval_ms),
    };
    eprintln!(
        "llm-demo: starting {} engine mocks, Envoy ({} thread(s), {label}, target {}) and the collector",
        args.workers, args.envoy_concurrency, args.target
    );
    let fleet = Fleet::start(&spec)?;
    eprintln!(
        "llm-demo: replaying {} requests through {} (concurrency {})",
        items.len(),
        fleet.url(),
        args.concurrency
    );
    let summary = rt.block_on(llm_bench::cli::replay(
        &fleet.url(),
        items.to_vec(),
        args.concurrency,
        Duration::from_secs_f64(args.timeout_s),
    ));
    let stats = fleet.envoy.stats()?;
    Ok(RunResult::new(label, summary, |name| {
        stats.get(name).copied()
    }))
}

fn main() {
    let args = Args::parse();
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
    let main_run = run(args, &args.policy, false, &items, &rt)?;
    let baseline_name = match &args.baseline {
        Some(b) => b.clone(),
        None => demo::default_baseline(&plugin_config(args, &args.policy, false)?).into(),
    };
    let baseline = match baseline_name.as_str() {
        "none" => None,
        "no_gate" => Some(run(args, &args.policy, true, &items, &rt)?),
        p if p == args.policy => None,
        p => Some(run(args, p, false, &items, &rt)?),
    };
    demo::print_report(
        &main_run,
        baseline.as_ref(),
        args.envoy_concurrency,
        args.workers,
        Some(&args.dir.display().to_string()),
    );
    let errors = main_run.summary.errors + baseline.map_or(0, |b| b.summary.errors);
    Ok(errors == 0)
}
