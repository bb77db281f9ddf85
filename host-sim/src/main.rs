//! `host-sim` CLI: run the filter's `.wasm` in host-sim without Envoy.
//!
//! `host-sim run --wasm F --config C --body FILE [--path P]` sends one request and prints the
//! outcome as JSON: whether it went upstream, the decision headers (request headers the
//! filter added, changed or removed), any local response, HTTP calls, logs and metrics.
//!
//! `host-sim check-config C [--wasm F]` loads the filter with plugin configuration C
//! (a file, or inline JSON) and reports whether the filter's own validation accepts
//! it, printing the filter's error (which names the field and the rule) when not.
//!
//! `host-sim replay --workload W [--wasm F] [--config C] [--workers N] [--vms T]
//! [--concurrency C] [--policy P]` replays a workload through the filter against a
//! simulated engine fleet in virtual time and prints `envoy/demo`'s report, whose last
//! line is the same JSON; the flags mean what the demo's do.
//!
//! `host-sim wasi-run MODULE.wasm [ARGS...]` runs a WASI preview1 command module (e.g. a
//! libtest binary from `cargo test --target wasm32-wasip1`) and exits with its exit code;
//! it is the cargo runner for that target (`.cargo/config.toml`).

mod wasi_run;

use anyhow::{Context as _, Result};
use clap::{Parser, Subcommand};
use host_sim::{Host, LocalResponse, RequestSpec, StreamOutcome};
use serde_json::{json, Map, Value};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "host-sim",
    about = "Run a proxy-wasm filter like Envoy 1.40, without Envoy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send one request through the filter and print the outcome as JSON.
    Run(RunArgs),
    /// Validate a plugin configuration with the filter's own validation.
    CheckConfig(CheckConfigArgs),
    /// Replay a workload through the filter against a simulated engine fleet, in
    /// virtual time, and print `envoy/demo`'s summary (same last-line JSON).
    Replay(ReplayArgs),
    /// Run a WASI preview1 command module (`_start`), e.g. a wasm32-wasip1 test binary,
    /// passing ARGS through; exits with the module's exit code.
    WasiRun(WasiRunArgs),
}

#[derive(clap::Args)]
struct CheckConfigArgs {
    /// Plugin configuration: a file, or inline JSON if it starts with '{'.
    config: String,
    /// The filter's .wasm; defaults to the workspace's built filter.
    #[arg(long)]
    wasm: Option<PathBuf>,
}

/// `envoy/demo`'s flags, with the same meaning and defaults.
#[derive(clap::Args)]
struct ReplayArgs {
    /// The filter's .wasm; defaults to the workspace's built filter.
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// A JSON object merged over the demo's plugin configuration, like the demo's
    /// `--filter-config` (a file, or inline JSON if it starts with '{').
    #[arg(long)]
    config: Option<String>,
    /// The JSONL workload (`llm-load generate`; the demo writes `.demo/workload.jsonl`).
    #[arg(long)]
    workload: PathBuf,
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
    /// Routing policy: cache_aware, round_robin, random, power_of_two.
    #[arg(long, default_value = "cache_aware")]
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
    #[arg(long, default_value_t = 100.0)]
    prefill_us_per_token: f64,
    /// Engine fixed time to first token.
    #[arg(long, default_value_t = 0.0)]
    ttft_ms: f64,
    /// Engine time per output token after the first.
    #[arg(long, default_value_t = 0.0)]
    decode_ms_per_token: f64,
    /// Engine concurrent requests at most (0: unlimited), like `--engine-arg=--max-running=N`.
    #[arg(long, default_value_t = 0)]
    max_running: usize,
}

#[derive(clap::Args)]
struct WasiRunArgs {
    /// The module (.wasm).
    module: PathBuf,
    /// Arguments for the module (its argv[0] is the module path).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The filter's .wasm (e.g. target/wasm32-wasip1/wasm/llm_router.wasm).
    #[arg(long)]
    wasm: PathBuf,
    /// Plugin configuration: a file, or inline JSON if it starts with '{'.
    #[arg(long)]
    config: String,
    /// File holding the request body (e.g. an OpenAI chat-completions JSON).
    #[arg(long)]
    body: PathBuf,
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Request method.
    #[arg(long, default_value = "POST")]
    method: String,
    /// Extra request header, `name:value` (repeatable).
    #[arg(long = "header", value_name = "NAME:VALUE")]
    headers: Vec<String>,
    /// Cluster known to Envoy (repeatable), for proxy_http_call.
    #[arg(long = "cluster", value_name = "NAME")]
    clusters: Vec<String>,
    /// Body chunks the request arrives in.
    #[arg(long, default_value_t = 1)]
    chunks: usize,
    /// Number of VMs (worker threads); the request goes to VM 0.
    #[arg(long, default_value_t = 1)]
    vms: usize,
    /// Seed of the random generators.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Plugin name.
    #[arg(long, default_value = "llm_router")]
    plugin_name: String,
    /// Envoy's allow_on_headers_stop_iteration plugin option (needed by filters that pause
    /// headers to read the body).
    #[arg(long)]
    allow_on_headers_stop_iteration: bool,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn pairs(headers: &[(String, String)]) -> Value {
    Value::Array(
        headers
            .iter()
            .map(|(k, v)| json!(format!("{k}: {v}")))
            .collect(),
    )
}

fn local_json(local: &LocalResponse) -> Value {
    json!({
        "status": local.status,
        "headers": pairs(&local.headers),
        "body": text(&local.body),
        "details": local.details,
    })
}

fn decision(input: &[(String, String)], out: &StreamOutcome) -> (Value, Vec<String>) {
    let mut changed = Map::new();
    for (k, v) in &out.request_headers {
        if !input.iter().any(|(ik, iv)| ik == k && iv == v) {
            changed.insert(k.clone(), json!(v));
        }
    }
    let removed = input
        .iter()
        .filter(|(k, _)| out.header(k).is_none())
        .map(|(k, _)| k.clone())
        .collect();
    (Value::Object(changed), removed)
}

/// A `--config` value: inline JSON when it starts with '{', else a file to read.
fn read_config(arg: &str) -> Result<Vec<u8>> {
    if arg.trim_start().starts_with('{') {
        Ok(arg.as_bytes().to_vec())
    } else {
        std::fs::read(arg).with_context(|| format!("reading {arg}"))
    }
}

/// Loads the filter with the config; the filter's `on_configure` is the judge.
fn check_config(args: CheckConfigArgs) -> Result<Value> {
    let config = read_config(&args.config)?;
    let wasm = args.wasm.unwrap_or_else(host_sim::built_filter_path);
    match Host::builder(&wasm).plugin_config(config).build() {
        Ok(_) => Ok(json!({"valid": true})),
        Err(e) => {
            eprintln!("invalid plugin config ({}):\n{e:#}", wasm.display());
            std::process::exit(2);
        }
    }
}

/// Runs the demo's main run and baseline in host-sim; prints the demo's report.
fn replay(args: ReplayArgs) -> Result<Value> {
    use engine_model::engine::EngineSpec;
    use engine_model::latency::Latency;
    use llm_load::run::{self, PdCounts, RunResult};
    let extra: Option<Value> = match &args.config {
        Some(c) => Some(serde_json::from_slice(&read_config(c)?).context("--config is not JSON")?),
        None => None,
    };
    let config = |policy: &str, no_gate: bool| {
        run::plugin_config(
            run::policy_key(args.pd.pd),
            policy,
            &args.policy,
            extra.as_ref(),
            no_gate,
            args.seed,
        )
    };
    let items = llm_load::workload::load_workload(&args.workload)?;
    let wasm = args
        .wasm
        .clone()
        .unwrap_or_else(host_sim::built_filter_path);
    let filter = host_sim::Filter::load(&wasm)?;
    let pd = args.pd.pools();
    let engines = args.pd.engines(args.workers);
    let sim = host_sim::replay::Replay {
        workers: args.workers,
        pd,
        vms: args.vms,
        concurrency: args.concurrency,
        engine: EngineSpec {
            max_running: args.max_running,
            latency: Latency {
                ttft_ms: args.ttft_ms,
                prefill_us_per_token: args.prefill_us_per_token,
                decode_ms_per_token: args.decode_ms_per_token,
            },
            ..EngineSpec::default()
        },
        collector_interval_ms: (args.collector_interval_ms > 0)
            .then_some(args.collector_interval_ms),
    };
    let run = |policy: &str, no_gate: bool| -> Result<RunResult> {
        let label = if no_gate {
            format!("{policy}+no_gate")
        } else {
            policy.to_string()
        };
        eprintln!(
            "host-sim replay: {} requests, {label}, {engines} engines, {} VM(s), concurrency {}",
            items.len(),
            args.vms,
            args.concurrency
        );
        let done = sim.run(&filter, &config(policy, no_gate)?, &items)?;
        let mut result = RunResult::new(label, done.summary, |name| done.host.metric(name));
        if args.pd.pd {
            PdCounts {
                pairs: done.fleet.pd_pairs,
                kv_failures: done.fleet.pd_kv_failures,
                prefill_failures: done
                    .host
                    .metric("wasmcustom.llm_router_pd_prefill_failures")
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
    let main_run = run(&args.policy, false)?;
    let baseline_name = match &args.baseline {
        Some(b) => b.clone(),
        None => run::default_baseline(&config(&args.policy, false)?).to_string(),
    };
    let baseline = match baseline_name.as_str() {
        "none" => None,
        "no_gate" => Some(run(&args.policy, true)?),
        p if p == args.policy => None,
        p => Some(run(p, false)?),
    };
    run::print_report(&main_run, baseline.as_ref(), args.vms as u32, engines, None);
    Ok(Value::Null)
}

fn run(args: RunArgs) -> Result<Value> {
    let config = read_config(&args.config)?;
    let body =
        std::fs::read(&args.body).with_context(|| format!("reading {}", args.body.display()))?;
    let mut host = Host::builder(&args.wasm)
        .plugin_config(config)
        .plugin_name(&args.plugin_name)
        .vms(args.vms)
        .seed(args.seed)
        .clusters(&args.clusters)
        .allow_on_headers_stop_iteration(args.allow_on_headers_stop_iteration)
        .build()?;
    let mut headers: Vec<(String, String)> = vec![
        (":method".into(), args.method.clone()),
        (":path".into(), args.path.clone()),
        (":authority".into(), "host-sim".into()),
        (":scheme".into(), "http".into()),
        ("content-type".into(), "application/json".into()),
        ("content-length".into(), body.len().to_string()),
    ];
    for h in &args.headers {
        let (k, v) = h
            .split_once(':')
            .with_context(|| format!("--header {h:?} is not NAME:VALUE"))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let spec = RequestSpec {
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        body: body.clone(),
        body_chunks: args.chunks,
    };
    let out = host.vm(0).request(spec)?;
    let (decision_headers, removed) = decision(&headers, &out);
    let calls: Vec<Value> = out
        .http_calls
        .iter()
        .map(|c| {
            json!({
                "token": c.token,
                "cluster": c.cluster,
                "headers": pairs(&c.headers),
                "body": text(&c.body),
            })
        })
        .collect();
    let logs: Vec<Value> = host
        .all_logs()
        .iter()
        .map(|l| json!({"vm": l.vm, "level": l.level, "source": l.source, "message": l.message}))
        .collect();
    let stalled = !out.continued && out.local_response.is_none();
    let note = match (stalled, args.allow_on_headers_stop_iteration) {
        (false, _) => "",
        (true, false) if !out.headers_forwarded && out.http_calls.is_empty() => {
            "the filter holds the request: Pause from on_request_headers is \
             StopAllIterationAndWatermark in Envoy (no body callback until the filter \
             continues); try --allow-on-headers-stop-iteration"
        }
        (true, _) => "the filter holds the request (waiting for an HTTP call or a continue)",
    };
    Ok(json!({
        "continued": out.continued,
        "stalled": stalled,
        "note": note,
        "headers_forwarded": out.headers_forwarded,
        "decision_headers": decision_headers,
        "removed_headers": removed,
        "request_headers": pairs(&out.request_headers),
        "request_body_changed": out.request_body != body,
        "local_response": out.local_response.as_ref().map(local_json),
        "clear_route_cache": out.clear_route_cache,
        "foreign_calls": out.foreign_calls,
        "http_calls": calls,
        "logs": logs,
        "metrics": host.metrics(),
    }))
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run(args),
        Command::CheckConfig(args) => check_config(args),
        Command::Replay(args) => replay(args),
        Command::WasiRun(args) => match wasi_run::run(&args.module, &args.args) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("host-sim wasi-run: {e:#}");
                std::process::exit(1);
            }
        },
    };
    match result {
        Ok(Value::Null) => {}
        Ok(value) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_else(|e| e.to_string())
            );
        }
        Err(e) => {
            eprintln!("host-sim: {e:#}");
            std::process::exit(1);
        }
    }
}
