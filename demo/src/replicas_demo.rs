//! `envoy/demo --envoys N`: the workload spread round robin over N Envoy replicas (a
//! new connection per request, so a conversation's consecutive turns land on
//! different replicas), once with the replicas sharing routing state through NATS
//! (`llm-bridge` beside each) and once without, beside the usual run through one
//! Envoy. `--bus-outage` adds a shared run whose middle third runs with the bus
//! stopped. The report compares the engines' cached token ratios; the last stdout
//! line is one JSON object.

use anyhow::{bail, Result};
use llm_demo::envoy::Target;
use llm_demo::replicas::Replicas;
use llm_load::cli::Replay;
use llm_load::record::Record;
use llm_load::stats::{summarize, Summary};
use llm_load::workload::WorkItem;
use llm_router::support::metric_names as names;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

use crate::{fleet_spec, main_router, run_policy, Args};

/// One replicated run.
struct ReplicasRun {
    label: String,
    summary: Summary,
    /// Peer inserts imported, over all replicas.
    imported: u64,
    /// `kv_match`'s outcomes over all replicas, by counter name.
    kv_match: Vec<(&'static str, u64)>,
}

/// How the run treats the bus.
#[derive(Clone, Copy, PartialEq)]
enum Sharing {
    Off,
    On,
    /// On, with the bus stopped during the middle third.
    Outage,
}

impl Sharing {
    fn label(self) -> &'static str {
        match self {
            Sharing::Off => "replicas, no sharing",
            Sharing::On => "replicas, sharing",
            Sharing::Outage => "replicas, sharing, bus stopped mid-run",
        }
    }

    fn dir(self) -> &'static str {
        match self {
            Sharing::Off => "replicas-alone",
            Sharing::On => "replicas-shared",
            Sharing::Outage => "replicas-outage",
        }
    }
}

fn run_replicas(
    args: &Args,
    items: &[WorkItem],
    rt: &tokio::runtime::Runtime,
    sharing: Sharing,
) -> Result<ReplicasRun> {
    let target = match args.target.as_str() {
        "cluster" => Target::Cluster,
        "endpoint" => Target::Endpoint,
        other => bail!("--target must be cluster or endpoint, got {other}"),
    };
    let spec = fleet_spec(args, args.policy(), false, target, sharing.dir())?;
    eprintln!(
        "llm-demo: starting {} Envoy replicas ({}) over {} engine mocks",
        args.envoys,
        sharing.label(),
        args.workers
    );
    let mut replicas = Replicas::start(&spec, args.envoys, sharing != Sharing::Off)?;
    let urls = replicas.urls();
    let replay = |part: &[WorkItem]| -> Vec<Record> {
        let replay = Replay::closed_loop(
            &urls[0],
            args.concurrency,
            Duration::from_secs_f64(args.timeout_s),
        )
        .spread_over(&urls);
        rt.block_on(replay.records(part.to_vec()))
    };
    let started = Instant::now();
    let records = if sharing == Sharing::Outage {
        // Thirds of the workload in order (turns are interleaved session by session,
        // so each third holds turns of every conversation).
        let third = items.len().div_ceil(3).max(1);
        let mut records = Vec::new();
        for (i, part) in items.chunks(third).enumerate() {
            match i {
                1 => {
                    eprintln!("llm-demo: stopping the bus for the middle third");
                    replicas.nats_mut()?.stop();
                }
                2 => {
                    eprintln!("llm-demo: the bus is back");
                    replicas.nats_mut()?.resume()?;
                }
                _ => {}
            }
            records.extend(replay(part));
        }
        records
    } else {
        replay(items)
    };
    let summary = summarize(&records, started.elapsed());
    Ok(ReplicasRun {
        label: sharing.label().to_string(),
        summary,
        imported: replicas.filter_stat_sum(names::REPLICA_OPS_IMPORTED)?,
        kv_match: names::KV_MATCH_COUNTERS
            .into_iter()
            .map(|n| Ok((n, replicas.filter_stat_sum(n)?)))
            .collect::<Result<_>>()?,
    })
}

/// Runs one Envoy, then the replicas with and without sharing; returns whether
/// every request succeeded.
pub fn run(args: &Args, items: &[WorkItem], rt: &tokio::runtime::Runtime) -> Result<bool> {
    let one = run_policy(args, &main_router(args), None, items, rt)?;
    let mut runs = vec![
        run_replicas(args, items, rt, Sharing::On)?,
        run_replicas(args, items, rt, Sharing::Off)?,
    ];
    if args.bus_outage {
        runs.push(run_replicas(args, items, rt, Sharing::Outage)?);
    }
    let base = one.summary.cached_token_ratio;
    let vs_one = |r: f64| if base > 0.0 { r / base } else { 0.0 };
    println!(
        "== {} requests, policy {}, {} engine mocks; replicas get requests round robin, a new connection each ==",
        items.len(),
        args.policy(),
        args.workers
    );
    println!(
        "  {:<40} {:>8} {:>7} {:>13} {:>9} {:>9}",
        "run", "requests", "errors", "cached ratio", "vs one", "imported"
    );
    println!(
        "  {:<40} {:>8} {:>7} {:>13.3} {:>9.3} {:>9}",
        "one Envoy", one.summary.requests, one.summary.errors, base, 1.0, "-"
    );
    for r in &runs {
        println!(
            "  {:<40} {:>8} {:>7} {:>13.3} {:>9.3} {:>9}",
            format!("{} x {}", args.envoys, r.label),
            r.summary.requests,
            r.summary.errors,
            r.summary.cached_token_ratio,
            vs_one(r.summary.cached_token_ratio),
            r.imported
        );
        if r.kv_match.iter().any(|(_, n)| *n > 0) {
            let counts: Vec<String> = r
                .kv_match
                .iter()
                .map(|(name, n)| format!("{} {n}", name.trim_start_matches("llm_router_")))
                .collect();
            println!("    {}", counts.join(", "));
        }
    }
    let errors = one.summary.errors + runs.iter().map(|r| r.summary.errors).sum::<usize>();
    let line: Value = json!({
        "envoys": args.envoys,
        "policy": args.policy(),
        "one_envoy": {"cached_token_ratio": base, "errors": one.summary.errors},
        "replicas": runs.iter().map(|r| json!({
            "run": r.label,
            "requests": r.summary.requests,
            "errors": r.summary.errors,
            "cached_token_ratio": r.summary.cached_token_ratio,
            "vs_one_envoy": vs_one(r.summary.cached_token_ratio),
            "imported_ops": r.imported,
        })).collect::<Vec<_>>(),
    });
    println!("{line}");
    Ok(errors == 0)
}
