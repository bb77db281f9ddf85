//! `soak`: does memory stay flat under long churn? Envoy's resident memory and each
//! Wasm VM's linear memory over many requests (100k by default) of traffic built to
//! make anything that leaks grow (see `churn`): many conversations and system
//! prompts (the trees fill their budget and evict), one-off model names, client
//! disconnects, an engine frozen and thawed at intervals.
//!
//! It starts the demo's fleet (engine mocks that answer at once, the collector,
//! Envoy with the built filter; `llm_demo::fleet`), drives closed-loop load with
//! `llm-load`'s library in intervals of `--every` requests, and after each prints a
//! table row: requests, time, errors, Envoy's RSS, and each VM's memory and tree
//! chars (the filter's `llm_router_vm.<id>.*` gauges). Then the verdict (see
//! `memory`) and the whole run as JSON on the last line. Exit 0 when flat, 3 when
//! memory grew past the bound after the warm-up, 2 when it could not run.
//!
//! `benches/soak` builds what it needs and runs this.

mod churn;
mod memory;

use anyhow::{Context, Result};
use churn::{disconnect_all, Churn, Freezer};
use clap::Parser;
use llm_demo::fleet::{Fleet, FleetSpec};
use llm_load::cli::Replay;
use memory::{Sample, Verdict};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "soak",
    about = "Envoy's and each Wasm VM's memory over a long run of churning traffic"
)]
struct Args {
    /// Requests in all (disconnected ones included).
    #[arg(long, default_value_t = 100_000)]
    requests: usize,
    /// A table row every this many requests.
    #[arg(long, default_value_t = 10_000)]
    every: usize,
    /// Growth is measured from the first row at or past this many requests.
    #[arg(long, default_value_t = 20_000)]
    warm_up: usize,
    /// The verdict's bound: growth after the warm-up, in percent.
    #[arg(long, default_value_t = 10.0)]
    bound_pct: f64,
    /// Envoy `--concurrency` (one Wasm VM per worker thread, plus the main thread's).
    #[arg(long, default_value_t = 2)]
    threads: u32,
    /// Engine mocks (workers).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Requests in flight.
    #[arg(long, default_value_t = 16)]
    connections: usize,
    /// The filter's `max_total_tree_chars`: small enough that the trees reach it
    /// within the warm-up.
    #[arg(long, default_value_t = 4_000_000)]
    tree_budget: u64,
    /// Distinct system prompts (conversation `c` uses prompt `c % N`).
    #[arg(long, default_value_t = 2_000)]
    system_prompts: usize,
    #[arg(long, default_value_t = 1_500)]
    system_prompt_chars: usize,
    #[arg(long, default_value_t = 300)]
    user_chars: usize,
    /// Turns per conversation.
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Every Nth request asks for a model of its own.
    #[arg(long, default_value_t = 20)]
    junk_every: usize,
    /// Every Nth request streams.
    #[arg(long, default_value_t = 4)]
    stream_every: usize,
    /// Every Nth request is a client disconnect.
    #[arg(long, default_value_t = 50)]
    disconnect_every: usize,
    /// The last engine is frozen (SIGSTOP) this often, in seconds (0: never) ...
    #[arg(long, default_value_t = 20)]
    freeze_every_s: u64,
    /// ... for this long, then thawed.
    #[arg(long, default_value_t = 3)]
    freeze_s: u64,
    /// The filter's `route_in` (`one_vm` or `every_vm`; unset: its default), to
    /// compare what the trees cost where they live.
    #[arg(long)]
    route_in: Option<String>,
    /// The route's idle timeout: a frozen engine's requests end after it (504).
    #[arg(long, default_value_t = 2_000)]
    idle_timeout_ms: u64,
}

const MIB: f64 = 1024.0 * 1024.0;

fn row(s: &Sample, ids: &[String]) -> String {
    let per_vm = |f: &dyn Fn(&memory::Vm) -> String| {
        ids.iter()
            .map(|id| s.vms.get(id).map_or("-".to_string(), f))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "| {} | {:.0} | {:.0} | {} | {:.1} | {} | {} |",
        s.requests,
        s.elapsed_s,
        s.requests as f64 / s.elapsed_s.max(1e-9),
        s.errors,
        s.envoy_rss_bytes as f64 / MIB,
        per_vm(&|v| format!("{:.1}", v.memory_bytes as f64 / MIB)),
        per_vm(&|v| format!("{:.2}", v.tree_chars as f64 / 1e6)),
    )
}

fn sample(fleet: &Fleet, requests: usize, errors: usize, started: Instant) -> Result<Sample> {
    Ok(Sample {
        requests,
        elapsed_s: started.elapsed().as_secs_f64(),
        errors,
        envoy_rss_bytes: llm_bench::envoy_memory::rss(fleet.envoy.pid())?,
        vms: llm_bench::envoy_memory::vm_gauges(&fleet.envoy.stats()?),
    })
}

fn verdict_line(v: Option<&Verdict>, a: &Args) -> String {
    let Some(v) = v else {
        return format!(
            "verdict: none (no row after the warm-up at {} requests)",
            a.warm_up
        );
    };
    let vms: Vec<String> = v
        .vm_growth_pct
        .iter()
        .map(|(id, g)| format!("{id} {g:+.1}%"))
        .collect();
    format!(
        "verdict: {} after the warm-up ({} requests), bound +{}%: Envoy RSS {:+.1}%, VM memory {}{}",
        if v.flat { "FLAT" } else { "GROWING" },
        v.warm_requests,
        a.bound_pct,
        v.rss_growth_pct,
        vms.join(", "),
        if v.new_vms.is_empty() {
            String::new()
        } else {
            format!("; VMs reloaded since: {}", v.new_vms.join(", "))
        }
    )
}

fn run(a: &Args) -> Result<bool> {
    let churn = Churn {
        turns: a.turns,
        system_prompts: a.system_prompts,
        system_prompt_chars: a.system_prompt_chars,
        user_chars: a.user_chars,
        junk_every: a.junk_every,
        stream_every: a.stream_every,
        disconnect_every: a.disconnect_every,
    };
    let spec = FleetSpec {
        workers: a.workers.max(2),
        // Answers at once; 4 output tokens so streams have a few chunks.
        engine_args: [
            "--ttft-ms",
            "1",
            "--tpot-ms",
            "0",
            "--prefill-us-per-token",
            "0",
            "--output-tokens",
            "4",
        ]
        .map(String::from)
        .to_vec(),
        plugin_config: {
            let mut c = json!({
                "max_total_tree_chars": a.tree_budget,
                "eviction_interval_ms": 10_000,
                "rng_seed": 1,
            });
            if let Some(route_in) = &a.route_in {
                c["route_in"] = json!(route_in);
            }
            c
        },
        envoy_concurrency: a.threads,
        collector_interval_ms: Some(500),
        route_idle_timeout_ms: Some(a.idle_timeout_ms),
        ..FleetSpec::default()
    };
    let fleet = Fleet::start(&spec).context("starting the fleet")?;
    let rt = tokio::runtime::Runtime::new()?;
    let frozen = fleet.engines.last().context("no engine")?;
    let freezer = (a.freeze_every_s > 0).then(|| {
        Freezer::start(
            frozen.guard.id(),
            Duration::from_secs(a.freeze_every_s),
            Duration::from_secs(a.freeze_s),
        )
    });
    eprintln!(
        "soak: {} requests, Envoy --concurrency {}, {} engines ({} frozen every {} s for {} s), logs in {}",
        a.requests,
        a.threads,
        fleet.engines.len(),
        frozen.name,
        a.freeze_every_s,
        a.freeze_s,
        fleet.dir.display()
    );
    let replay = Replay::closed_loop(&fleet.url(), a.connections.max(1), Duration::from_secs(60));
    let started = Instant::now();
    // Every VM reports on its first tick (`sync_interval_ms`, 1 s by default).
    let deadline = started + Duration::from_secs(30);
    let mut first = loop {
        let s = sample(&fleet, 0, 0, started)?;
        if s.vms.len() > a.threads as usize || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    first.elapsed_s = 0.0;
    let ids: Vec<String> = first.vms.keys().cloned().collect();
    println!(
        "\n| requests | s | mean req/s | errors | Envoy RSS MiB | VM memory MiB ({}) | VM tree M chars |",
        ids.join(", ")
    );
    println!("|---|---|---|---|---|---|---|");
    println!("{}", row(&first, &ids));
    let started = Instant::now();
    let mut errors = 0;
    let mut disconnects = 0;
    let mut samples = vec![first];
    let mut done = 0;
    while done < a.requests {
        let next = (done + a.every.max(1)).min(a.requests);
        let batch = churn.batch(done..next);
        let (records, made) = rt.block_on(async {
            tokio::join!(
                replay.records(batch.items),
                disconnect_all(fleet.envoy.listener, batch.disconnects)
            )
        });
        errors += records.iter().filter(|r| !r.is_ok()).count();
        disconnects += made;
        done = next;
        let s = sample(&fleet, done, errors, started)?;
        println!("{}", row(&s, &ids));
        samples.push(s);
    }
    let freezes = freezer.as_ref().map_or(0, Freezer::freezes);
    drop(freezer);
    let v = memory::verdict(&samples, a.warm_up, a.bound_pct);
    println!("\n{}", verdict_line(v.as_ref(), a));
    let rows: Vec<_> = samples
        .iter()
        .map(|s| {
            json!({
                "requests": s.requests,
                "elapsed_s": s.elapsed_s,
                "errors": s.errors,
                "envoy_rss_bytes": s.envoy_rss_bytes,
                "vms": s.vms.iter().map(|(id, v)| (id.clone(), json!({
                    "memory_bytes": v.memory_bytes, "tree_chars": v.tree_chars
                }))).collect::<serde_json::Map<_, _>>(),
            })
        })
        .collect();
    println!(
        "{}",
        json!({"soak": {
            "requests": a.requests,
            "errors": errors,
            "disconnects": disconnects,
            "freezes": freezes,
            "threads": a.threads,
            "tree_budget_chars": a.tree_budget,
            "warm_up": a.warm_up,
            "bound_pct": a.bound_pct,
            "flat": v.as_ref().map(|v| v.flat),
            "rss_growth_pct": v.as_ref().map(|v| v.rss_growth_pct),
            "vm_growth_pct": v.as_ref().map(|v| v.vm_growth_pct.clone()),
            "samples": rows,
        }})
    );
    Ok(v.is_some_and(|v| v.flat))
}

fn main() {
    let args = Args::parse();
    match run(&args) {
        Ok(true) => {}
        Ok(false) => std::process::exit(3),
        Err(e) => {
            eprintln!("soak: {e:#}");
            std::process::exit(2);
        }
    }
}
