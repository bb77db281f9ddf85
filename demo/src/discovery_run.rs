//! `--discovery`: membership from service discovery, live. The filter starts with no
//! worker in its config; Envoy learns the engines from a watched EDS file, the
//! collector follows Envoy's pool cluster and pushes the membership. While the
//! workload runs, a new engine is listed after the first third of the requests and
//! `w0` is dropped after the second third. The report says when the filter heard of
//! each change, how much traffic the new worker took, and how many requests went to
//! `w0` after the filter saw it leave (requests already on it finish there).

use anyhow::Result;
use llm_demo::discovery::{DiscoveryFleet, DiscoverySpec};
use llm_load::cli::Replay;
use llm_load::run::RunResult;
use llm_load::stats::summarize;
use llm_load::workload::WorkItem;
use serde_json::json;
use std::time::{Duration, Instant};

use crate::Args;

/// How long the filter may take to hear of a change: the collector re-reads Envoy's
/// clusters every 10 intervals, then pushes, on a loaded machine.
const CHANGE_DEADLINE: Duration = Duration::from_secs(60);

/// Envoy's count of requests the client listener has taken so far.
fn requests_seen(fleet: &DiscoveryFleet) -> Result<u64> {
    Ok(fleet
        .envoy
        .stats()?
        .get("http.llm.downstream_rq_total")
        .copied()
        .unwrap_or(0))
}

fn wait_requests(fleet: &DiscoveryFleet, n: u64, load: &tokio::task::JoinHandle<Vec<llm_load::record::Record>>) -> Result<()> {
    while requests_seen(fleet)? < n && !load.is_finished() {
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

pub fn run(args: &Args, items: &[WorkItem], rt: &tokio::runtime::Runtime) -> Result<(RunResult, bool)> {
    let overrides = crate::plugin_config(args, &args.policy, false)?;
    // The demo's config lists its own workers; discovery mode lists none.
    let overrides = match overrides {
        serde_json::Value::Object(mut m) => {
            m.remove("workers");
            m.remove("target");
            serde_json::Value::Object(m)
        }
        other => other,
    };
    let spec = DiscoverySpec {
        workers: args.workers,
        engine_args: [format!("--prefill-us-per-token={}", args.prefill_us_per_token)]
            .into_iter()
            .chain(args.engine_args.iter().cloned())
            .collect(),
        plugin_config: overrides,
        envoy_concurrency: args.envoy_concurrency,
        collector_interval_ms: args.collector_interval_ms,
        dir: Some(args.dir.join("discovery")),
    };
    eprintln!(
        "llm-demo: discovery: {} engine mocks listed in a watched EDS file, Envoy ({} thread(s), target endpoint), the collector following Envoy's clusters",
        args.workers, args.envoy_concurrency
    );
    let mut fleet = DiscoveryFleet::start(&spec)?;
    let first = fleet.wait_workers(CHANGE_DEADLINE, |known, _| known == args.workers as u64)?;
    eprintln!(
        "llm-demo: the filter knows {} workers ({:.1} s after start)",
        args.workers,
        first.as_secs_f64()
    );
    let joiner = llm_load::fleet::worker_name(args.workers);
    let leaver = llm_load::fleet::worker_name(0);
    let replay = Replay::closed_loop(
        &fleet.url(),
        args.concurrency,
        Duration::from_secs_f64(args.timeout_s),
    );
    let started = Instant::now();
    let load = rt.spawn({
        let items = items.to_vec();
        async move { replay.records(items).await }
    });
    let total = items.len() as u64;
    let before = requests_seen(&fleet)?;
    wait_requests(&fleet, before + total / 3, &load)?;
    let join_at = started.elapsed();
    fleet.add(&joiner)?;
    let joined = fleet.wait_workers(CHANGE_DEADLINE, |known, _| {
        known == args.workers as u64 + 1
    })?;
    eprintln!(
        "llm-demo: {joiner} listed at {:.1} s; the filter routed to it {:.1} s later",
        join_at.as_secs_f64(),
        joined.as_secs_f64()
    );
    wait_requests(&fleet, before + 2 * total / 3, &load)?;
    let leave_at = started.elapsed();
    fleet.remove(&leaver)?;
    let left = fleet.wait_workers(CHANGE_DEADLINE, |_, leaving| leaving >= 1)?;
    let left_seen_ms = (leave_at + left).as_secs_f64() * 1000.0;
    eprintln!(
        "llm-demo: {leaver} dropped at {:.1} s; the filter stopped routing to it {:.1} s later",
        leave_at.as_secs_f64(),
        left.as_secs_f64()
    );
    let records = rt.block_on(load)?;
    let wall = started.elapsed();
    let summary = summarize(&records, wall);
    let after_leave = records
        .iter()
        .filter(|r| r.worker.as_deref() == Some(leaver.as_str()) && r.start_ms > left_seen_ms)
        .count();
    let joiner_took = summary.per_worker.get(&joiner).copied().unwrap_or(0);
    let stats = fleet.envoy.stats()?;
    let stat = |name: &str| stats.get(name).copied();
    let mut result = RunResult::new("discovery".into(), summary, stat);
    result.notes.push(format!(
        "membership: {joiner} joined after {:.0}% of the requests (the filter heard in {:.1} s) and took {joiner_took}; \
         {leaver} left after {:.0}% (heard in {:.1} s) and took {after_leave} requests sent after that",
        100.0 / 3.0,
        joined.as_secs_f64(),
        200.0 / 3.0,
        left.as_secs_f64()
    ));
    result.fields.insert(
        "discovery".into(),
        json!({
            "joined": joiner,
            "join_heard_s": joined.as_secs_f64(),
            "joined_requests": joiner_took,
            "left": leaver,
            "leave_heard_s": left.as_secs_f64(),
            "left_requests_after_heard": after_leave,
        }),
    );
    let ok = joiner_took > 0 && after_leave == 0;
    if !ok {
        eprintln!(
            "llm-demo: discovery run failed its checks: {joiner} took {joiner_took} requests, {leaver} took {after_leave} after leaving"
        );
    }
    Ok((result, ok))
}
