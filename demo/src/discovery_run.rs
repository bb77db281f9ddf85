//! `--discovery`: membership from service discovery, live. The filter starts with no
//! worker in its config; Envoy learns the engines from a watched EDS file, the
//! collector follows Envoy's pool cluster and pushes the membership. The workload
//! runs in thirds: as the second third starts a new engine is listed, as the last
//! third starts `w0` is dropped, each while requests are in flight. The report says
//! when the filter heard of each change, how much traffic the new worker took, and
//! how many requests went to `w0` after the filter saw it leave (requests already on
//! it finish there; until the filter hears, Envoy's `override_host` falls back to
//! another endpoint for a request sent to the gone address).

use anyhow::Result;
use llm_demo::discovery::{DiscoveryFleet, DiscoverySpec};
use llm_load::cli::Replay;
use llm_load::record::Record;
use llm_load::run::RunResult;
use llm_load::stats::summarize;
use llm_load::workload::WorkItem;
use serde_json::json;
use std::time::{Duration, Instant};

use crate::Args;

/// How long the filter may take to hear of a change: the collector re-reads Envoy's
/// clusters every 10 intervals, then pushes, on a loaded machine.
const CHANGE_DEADLINE: Duration = Duration::from_secs(60);

/// Replays `part` from `offset` into the run, with `change` made once it is under
/// way (so requests are in flight during the change); the records' send times count
/// from the run's start.
fn part_with(
    args: &Args,
    fleet: &mut DiscoveryFleet,
    part: &[WorkItem],
    offset: Duration,
    rt: &tokio::runtime::Runtime,
    change: impl FnOnce(&mut DiscoveryFleet) -> Result<Duration>,
) -> Result<(Vec<Record>, Duration)> {
    let replay = Replay::closed_loop(
        &fleet.url(),
        args.concurrency,
        Duration::from_secs_f64(args.timeout_s),
    );
    let items = part.to_vec();
    let load = rt.spawn(async move { replay.records(items).await });
    let heard = change(fleet)?;
    let mut records = rt.block_on(load)?;
    for r in &mut records {
        r.start_ms += offset.as_secs_f64() * 1000.0;
    }
    Ok((records, heard))
}

pub fn run(
    args: &Args,
    items: &[WorkItem],
    rt: &tokio::runtime::Runtime,
) -> Result<(RunResult, bool)> {
    let overrides = crate::plugin_config(args, args.policy(), false)?;
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
        engine_args: args.engine_flags(),
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
    let third = items.len().div_ceil(3).max(1);
    let parts: Vec<&[WorkItem]> = items.chunks(third).collect();
    let part = |i: usize| parts.get(i).copied().unwrap_or(&[]);
    let started = Instant::now();
    let (mut records, _) = part_with(args, &mut fleet, part(0), Duration::ZERO, rt, |_| {
        Ok(Duration::ZERO)
    })?;
    let join_at = started.elapsed();
    let (more, joined) = part_with(args, &mut fleet, part(1), join_at, rt, |f| {
        f.add(&joiner)?;
        f.wait_workers(CHANGE_DEADLINE, |known, _| known == args.workers as u64 + 1)
    })?;
    records.extend(more);
    eprintln!(
        "llm-demo: {joiner} listed at {:.1} s; the filter knew it {:.1} s later",
        join_at.as_secs_f64(),
        joined.as_secs_f64()
    );
    let leave_at = started.elapsed();
    let (more, left) = part_with(args, &mut fleet, part(2), leave_at, rt, |f| {
        f.remove(&leaver)?;
        f.wait_workers(CHANGE_DEADLINE, |_, leaving| leaving >= 1)
    })?;
    records.extend(more);
    let left_seen_ms = (leave_at + left).as_secs_f64() * 1000.0;
    eprintln!(
        "llm-demo: {leaver} dropped at {:.1} s; the filter stopped routing to it {:.1} s later",
        leave_at.as_secs_f64(),
        left.as_secs_f64()
    );
    let wall = started.elapsed();
    let summary = summarize(&records, wall);
    let after_leave = records
        .iter()
        .filter(|r| r.worker.as_deref() == Some(leaver.as_str()) && r.start_ms > left_seen_ms)
        .count();
    let joiner_took = summary.per_worker.get(&joiner).copied().unwrap_or(0);
    let stats = fleet.envoy.settled_stats()?;
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
