//! `host-sim replay`: the demo's main run and baseline through the filter against a
//! simulated engine fleet in virtual time, printed as `envoy/demo`'s report.

use super::read_config;
use anyhow::{Context as _, Result};
use engine_model::engine::EngineSpec;
use engine_model::latency::non_negative;
use serde_json::Value;
use std::path::PathBuf;

/// `envoy/demo`'s flags, with the same meaning and defaults.
#[derive(clap::Args)]
pub(crate) struct ReplayArgs {
    /// The filter's .wasm; defaults to the workspace's built filter.
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// A JSON object merged over the demo's plugin configuration, like the demo's
    /// `--filter-config` (a file, or inline JSON if it starts with '{'). When it
    /// lists `workers`, the simulated fleet is those workers (their names, clusters,
    /// addresses and pools) instead of the demo's `w0..`.
    #[arg(long)]
    config: Option<String>,
    /// The JSONL workload (`llm-load generate`; the demo writes `.demo/workload.jsonl`).
    #[arg(long, required_unless_present = "family", conflicts_with = "family")]
    workload: Option<PathBuf>,
    /// Replay member SEED of the policy sweep's workload family (`host-sim sweep`)
    /// on its own fleet, as the sweep does: its workload, its engines (slots,
    /// prefill speeds, cache sizes), its concurrency and seed. The engine and fleet
    /// flags below are then the member's, but for how the engines decode (as the
    /// sweep's); `--records-dir` shows where each request went, which the sweep's
    /// summary does not.
    #[arg(long, value_name = "SEED", conflicts_with_all = ["workers", "concurrency", "seed", "max_running", "prefill_us_per_token", "pd"])]
    family: Option<u64>,
    /// Engines in the simulated fleet.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    #[command(flatten)]
    pd: llm_load::fleet::PdArgs,
    /// VMs (Envoy worker threads, the demo's `--envoy-concurrency`).
    #[arg(long, default_value_t = 1)]
    vms: usize,
    /// Requests in flight at most.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Routing policy: predicted_ttft (the filter's default), cache_aware,
    /// round_robin, random, power_of_two.
    #[arg(long, default_value = "predicted_ttft")]
    policy: String,
    /// The comparison run: a policy, `no_gate`, or `none` (default as the demo's).
    #[arg(long)]
    baseline: Option<String>,
    /// The filter's `rng_seed` (the demo passes its `--seed`).
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Simulated collector push interval (virtual ms); 0: no collector.
    #[arg(long, default_value_t = 200)]
    collector_interval_ms: u64,
    /// Engine prefill cost per uncached prompt token (the demo's default).
    #[arg(long, default_value_t = 100.0, value_parser = non_negative)]
    prefill_us_per_token: f64,
    /// Engine fixed time to first token.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    ttft_ms: f64,
    /// Engine time per output token after the first (a `--family` member's engines
    /// too: the family's answer at their first token).
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    decode_ms_per_token: f64,
    /// Tokens in each answer (the engine mock's `--output-tokens`).
    #[arg(long, default_value_t = EngineSpec::DEFAULT_OUTPUT_TOKENS)]
    output_tokens: u32,
    /// Write every request's record (workload line, worker, decision label,
    /// latencies, tokens) to `DIR/<run>.jsonl`, as the demo does in `.demo/`.
    #[arg(long)]
    records_dir: Option<PathBuf>,
    /// Engine concurrent requests at most (0: unlimited), like `--engine-arg=--max-running=N`.
    #[arg(long, default_value_t = 0)]
    max_running: usize,
    /// Engine KV cache size in blocks (of 64 chars), like the mock's `--cache-blocks`:
    /// one value for every engine, or one per engine in order (`256,512,768,1024`:
    /// a fleet whose caches differ). Default: the mock's 4096.
    #[arg(long, value_delimiter = ',')]
    cache_blocks: Vec<usize>,
    /// Engines serve a request whose cached prefix another request is still
    /// prefilling as if it were computed, like the mock's `--no-prefix-wait`
    /// (by default they wait for that prefill, as engines do).
    #[arg(long = "no-prefix-wait", action = clap::ArgAction::SetFalse)]
    prefix_wait: bool,
    /// Print each run's hostcalls a request, by name (what a request costs the
    /// host: in Envoy each one is a V8 exit, and one that returns data an
    /// allocation in the guest too).
    #[arg(long)]
    hostcalls: bool,
}

/// Runs the demo's main run and baseline in host-sim; prints the demo's report and
/// returns how many requests failed (the exit code says whether any did, as the
/// demo's and `llm-load`'s do).
pub(crate) fn replay(args: ReplayArgs) -> Result<usize> {
    use engine_model::latency::Latency;
    use host_sim::sweep::Decode;
    use llm_load::run::{self, PdCounts, RunResult};
    let extra: Option<Value> = match &args.config {
        Some(c) => Some(serde_json::from_slice(&read_config(c)?).context("--config is not JSON")?),
        None => None,
    };
    let member = args.family.map(llm_load::family::Member::draw);
    let items = match (&member, &args.workload) {
        (Some(m), _) => {
            eprintln!(
                "host-sim replay: family member {}: {}",
                m.seed,
                m.describe()
            );
            let jsonl = llm_load::generate::to_jsonl(&llm_load::generate::generate(&m.workload))?;
            llm_load::workload::parse_workload(&jsonl)?
        }
        (None, Some(path)) => llm_load::workload::load_workload(path)?,
        (None, None) => anyhow::bail!("--workload or --family is required"),
    };
    let seed = member.as_ref().map_or(args.seed, |m| m.seed);
    let config = |policy: &str, no_gate: bool| {
        run::plugin_config(
            run::policy_key(args.pd.pd),
            policy,
            &args.policy,
            extra.as_ref(),
            no_gate,
            seed,
        )
    };
    let wasm = args
        .wasm
        .clone()
        .unwrap_or_else(host_sim::built_filter_path);
    let filter = host_sim::Filter::load(&wasm)?;
    let pd = args.pd.pools();
    // A config that lists its workers replays against them; else the demo's fleet.
    let engines = match extra.as_ref().and_then(|c| c.get("workers")) {
        Some(Value::Array(w)) => w.len(),
        _ => args.pd.engines(args.workers),
    };
    let engine = EngineSpec {
        max_running: args.max_running,
        cache_blocks: args
            .cache_blocks
            .first()
            .copied()
            .unwrap_or(EngineSpec::default().cache_blocks),
        // How the engines decode is `Replay::decode`'s, for a family member too.
        latency: Latency {
            ttft_ms: args.ttft_ms,
            prefill_us_per_token: args.prefill_us_per_token,
            ..Latency::default()
        },
        ..EngineSpec::default()
    };
    let sim = member
        .as_ref()
        .map_or_else(
            || host_sim::replay::Replay {
                workers: args.workers,
                pd,
                vms: args.vms,
                concurrency: args.concurrency,
                engine,
                arrival_seed: None,
                engine_specs: match args.cache_blocks.as_slice() {
                    [_, _, ..] => args
                        .cache_blocks
                        .iter()
                        .map(|&cache_blocks| EngineSpec {
                            cache_blocks,
                            ..engine
                        })
                        .collect(),
                    _ => Vec::new(),
                },
                collector_interval_ms: (args.collector_interval_ms > 0)
                    .then_some(args.collector_interval_ms),
            },
            |m| host_sim::sweep::replay_of(m, args.vms),
        )
        .prefix_wait(args.prefix_wait)
        .decode(Decode {
            ms_per_token: args.decode_ms_per_token,
            output_tokens: args.output_tokens,
        });
    let engines = member.as_ref().map_or(engines, |m| m.engines.len());
    let run_policy = |policy: &str, no_gate: bool| -> Result<RunResult> {
        let label = if no_gate {
            format!("{policy}+no_gate")
        } else {
            policy.to_string()
        };
        eprintln!(
            "host-sim replay: {} requests, {label}, {engines} engines, {} VM(s), concurrency {}",
            items.len(),
            args.vms,
            sim.concurrency
        );
        let done = sim.run(&filter, &config(policy, no_gate)?, &items)?;
        if let Some(dir) = &args.records_dir {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            llm_load::record::write_jsonl(&dir.join(format!("{label}.jsonl")), &done.records)?;
        }
        if args.hostcalls {
            print_hostcalls(&label, &done.host.hostcall_counts(), items.len());
        }
        let mut result = RunResult::new(label, done.summary, |name| done.host.metric(name));
        if args.pd.pd {
            PdCounts {
                pairs: done.fleet.pd_pairs,
                kv_failures: done.fleet.pd_kv_failures,
                prefill_failures: done
                    .host
                    .metric(&run::envoy_stat(
                        llm_router::support::metric_names::PD_PREFILL_FAILURES,
                    ))
                    .unwrap_or(0),
                prefill_per_worker: done
                    .fleet
                    .engines
                    .iter()
                    .filter(|e| e.pool == "prefill")
                    .map(|e| {
                        (
                            e.name.clone(),
                            done.fleet.served.get(&e.name).copied().unwrap_or(0),
                        )
                    })
                    .collect(),
            }
            .add_to(&mut result);
        }
        Ok(result)
    };
    let main_run = run_policy(&args.policy, false)?;
    let baseline_name = match &args.baseline {
        Some(b) => b.clone(),
        None => run::default_baseline(&config(&args.policy, false)?).to_string(),
    };
    let baseline = match baseline_name.as_str() {
        "none" => None,
        "no_gate" => Some(run_policy(&args.policy, true)?),
        p if p == args.policy => None,
        p => Some(run_policy(p, false)?),
    };
    run::print_report(&main_run, baseline.as_ref(), args.vms as u32, engines, None);
    Ok(main_run.summary.errors + baseline.map_or(0, |b| b.summary.errors))
}

/// `--hostcalls`: every hostcall's calls a request over the run, the most made first
/// (a count, not a cost: `benches/overhead --callgrind` prices them in Envoy).
fn print_hostcalls(label: &str, counts: &std::collections::BTreeMap<String, u64>, requests: usize) {
    let per = |n: u64| n as f64 / requests.max(1) as f64;
    let mut rows: Vec<_> = counts.iter().collect();
    rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let total: u64 = counts.values().sum();
    println!(
        "hostcalls a request, {label} ({requests} requests): {:.2}",
        per(total)
    );
    for (name, n) in rows {
        println!("  {:>8.2}  {name}", per(*n));
    }
}
