//! One configuration of the overhead benchmark: fake engines, one Envoy per
//! variant (same bootstrap, same plugin config, only the `.wasm` and the policy
//! differ), the warm-up, then the measured phases interleaved across variants.

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use llm_demo::envoy::{self, Envoy, EnvoySpec, Target, Upstream};
use llm_demo::fleet::TempDir;
use llm_demo::paths;
use llm_load::cli::Replay;
use llm_load::fleet::worker_name;
use llm_load::generate::{conversation, GenerateConfig};
use llm_load::record::Record;
use llm_load::run::policy_variant;
use llm_load::workload::{WorkItem, CHAT_PATH};
use llm_router::decision::Label;
use llm_router::support::metric_names as names;
use llm_router_push::{Push, WorkerStats};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::callgrind::Counter;
use crate::canned::{self, Canned};
use crate::cpu;
use llm_bench::envoy_memory;

/// The filter that only buffers and reads the body.
pub const FLOOR: &str = "floor";
/// The floor making, on each request, the hostcalls the router makes whatever it
/// decides (`benches/floor`'s `floor_hostcalls`).
pub const FLOOR_HOSTCALLS: &str = "floor+floor_hostcalls=true";

/// Chars of the user turn that varies per conversation (the rest of a body is one of
/// 8 system prompts).
const USER_CHARS: usize = 300;
const SYSTEM_PROMPTS: usize = 8;
/// Warm-up text is capped at this many bytes (10k conversations of 4 KiB): larger
/// bodies get fewer warm conversations.
const WARM_BYTES: usize = 10_000 * 4096;
/// Under callgrind the warm-up is at least this many requests per worker: each
/// worker is a cluster with its own upstream connections, and a policy that spreads
/// (`predicted_ttft` at 256 workers) opened most of them during a short warm-up's
/// counted phase, where Envoy's connects counted as the filter's cost.
const CALLGRIND_WARM_PER_WORKER: usize = 8;

/// One point of the grid.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    pub workers: usize,
    pub body_bytes: usize,
    pub threads: u32,
}

/// How much to send.
#[derive(Debug, Clone)]
pub struct Load {
    pub engines: usize,
    pub warm: usize,
    pub reps: usize,
    /// Requests per repetition at `connections` (for 4 KiB bodies; scaled down for
    /// larger ones).
    pub requests: usize,
    pub latency_requests: usize,
    pub connections: usize,
    /// The loaded phase of a repetition goes round the variants in this many slices
    /// (each variant's Envoy up throughout), so that every variant is measured
    /// through the same stretches of the machine's speed, which on a shared machine
    /// moves by a third over seconds: a variant measured in one block of 20,000
    /// requests could get a slow stretch that its floor, measured next, did not.
    pub slices: usize,
    pub variants: Vec<String>,
    /// `--callgrind-keep`: where the counts' dumps are kept.
    pub keep: Option<PathBuf>,
    /// `--cache-sim`: callgrind simulates the caches as well.
    pub cache_sim: bool,
}

/// What one variant measured over all repetitions.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    pub variant: String,
    /// Successful request latencies at one connection (ms).
    pub latencies_ms: Vec<f64>,
    /// Requests per second at `connections`, one per repetition.
    pub rps: Vec<f64>,
    /// Envoy CPU over the loaded phases and the requests they carried.
    pub cpu: Duration,
    /// Envoy CPU per request (us) of each repetition's loaded phase: their spread
    /// is the run's noise.
    pub cpu_runs: Vec<f64>,
    /// Of it, Envoy's user-space CPU per request (us), each repetition's.
    pub user_runs: Vec<f64>,
    pub requests: usize,
    /// The same at one connection.
    pub cpu_c1: Duration,
    pub requests_c1: usize,
    pub errors: usize,
    pub first_error: Option<String>,
    /// Router variants: the share of routed requests labelled `cache_hit`.
    pub hit_rate: Option<f64>,
    /// Envoy's resident memory after each repetition's loaded phase (`memory`).
    pub rss_bytes: Vec<u64>,
    /// The router's VMs' Wasm memory together, at the same moments (none for the
    /// floor).
    pub vm_bytes: Vec<u64>,
}

impl Measured {
    pub fn cpu_us_per_request(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / self.requests.max(1) as f64
    }
    pub fn cpu_c1_us_per_request(&self) -> f64 {
        self.cpu_c1.as_secs_f64() * 1e6 / self.requests_c1.max(1) as f64
    }
}

/// The floor guest, with settings or without (`floor`, `floor+key=value`).
fn is_floor(variant: &str) -> bool {
    variant.split('+').next() == Some(FLOOR)
}

/// A variant's policy and `.wasm`: `policy` runs the built filter (or, for
/// `floor`, the built floor guest, with its settings as well:
/// `floor+floor_hostcalls=true`); `policy@path` runs the filter at `path`, so two
/// builds can be compared side by side in one run.
fn policy_and_wasm(variant: &str) -> Result<(&str, PathBuf)> {
    if let Some((policy, path)) = variant.split_once('@') {
        return Ok((policy, PathBuf::from(path)));
    }
    if is_floor(variant) {
        Ok((variant, paths::floor_wasm_path()?))
    } else {
        Ok((variant, paths::wasm_path()?))
    }
}

/// Chat bodies of about `bytes` bytes: conversation `session`'s first turn, one of 8
/// system prompts plus its own user message.
pub fn bodies(bytes: usize, sessions: std::ops::Range<usize>) -> Vec<WorkItem> {
    let cfg = GenerateConfig {
        system_prompts: SYSTEM_PROMPTS,
        system_prompt_chars: bytes.saturating_sub(USER_CHARS + 120).max(64),
        user_chars: USER_CHARS,
        ..GenerateConfig::default()
    };
    sessions
        .map(|s| {
            let messages: Vec<Value> = conversation(&cfg, s, 0)
                .into_iter()
                .map(|(role, content)| json!({"role": role, "content": content}))
                .collect();
            let body = json!({"model": "mock", "messages": messages, "max_tokens": 1});
            WorkItem {
                line: s + 1,
                body: Bytes::from(serde_json::to_vec(&body).unwrap_or_default()),
                session: None,
                path: CHAT_PATH.to_string(),
                stream: false,
            }
        })
        .collect()
}

/// Requests scaled to the body size (same bytes as `base` requests of 4 KiB), at
/// least `min`.
fn scaled(base: usize, body_bytes: usize, min: usize) -> usize {
    (base * 4096 / body_bytes.max(1)).max(min)
}

/// The directory of the `i`th variant's Envoy (its config, log, and callgrind's
/// files), its own even when a variant is listed twice (two copies of one build
/// show the noise).
fn variant_dir(rep_dir: &Path, i: usize, variant: &str) -> Result<PathBuf> {
    let dir = rep_dir.join(format!(
        "{i}-{}",
        variant.replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '_' && c != '-',
            "_"
        )
    ));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Starts `envoy_bin` (Envoy, or a script that runs it under callgrind) with
/// `variant`'s filter, its files in `dir`.
fn start_envoy(
    variant: &str,
    fleet: &Fleet,
    threads: u32,
    dir: &Path,
    envoy_bin: &Path,
) -> Result<Envoy> {
    let (policy, wasm) = policy_and_wasm(variant)?;
    let (policy, settings) = policy_variant(policy)?;
    // The floor reads only the workers of the same plugin config.
    let policy = if policy == FLOOR {
        "round_robin"
    } else {
        policy
    };
    let mut plugin_config = json!({"policy": policy, "rng_seed": 1});
    if let Some(config) = plugin_config.as_object_mut() {
        config.extend(settings);
    }
    // `kv_capacity_bound=true`: one push states every engine's capacity.
    let bounded = plugin_config.get("kv_capacity_bound") == Some(&json!(true));
    if bounded {
        plugin_config["stats_token"] = json!(BOUND_PUSH_TOKEN);
    }
    // `kv_match=true`: every request asks the canned collector first.
    let asks = plugin_config.get("kv_match") == Some(&json!(true));
    if asks {
        plugin_config["kv_match"] = json!({"cluster": envoy::COLLECTOR_CLUSTER});
    }
    let spec = EnvoySpec {
        upstreams: fleet.upstreams.clone(),
        target: Target::Cluster,
        plugin_config,
        wasm,
        concurrency: threads,
        route_idle_timeout_ms: None,
        collector: asks
            .then(|| fleet.collector.addrs.first().copied())
            .flatten(),
    };
    let envoy =
        envoy::start(envoy_bin, &spec, dir).with_context(|| format!("Envoy with {variant}"))?;
    if bounded {
        push_capacity(&envoy, fleet.upstreams.len())
            .with_context(|| format!("{variant}: the capacity push"))?;
    }
    Ok(envoy)
}

/// The engines' KV capacity the bound variants are told: 16 KiB of chars at 4 a
/// token, so the tree is trimmed on most inserts of 4 KiB prompts (the bound's
/// dearest case; with room for every conversation it costs a share check alone).
const BOUND_CAPACITY_TOKENS: u64 = 4096;
const BOUND_PUSH_TOKEN: &str = "overhead-bench-push-token";

/// Pushes every worker's KV capacity once, as the collector would: the bound is
/// shared at the next interval and stays (no later push is needed for it).
fn push_capacity(envoy: &Envoy, workers: usize) -> Result<()> {
    let Some(stats) = envoy.stats_listener else {
        bail!("the Envoy config has no llm_stats listener");
    };
    let rows = (0..workers)
        .map(|i| WorkerStats {
            num_running: Some(0),
            num_waiting: Some(0),
            kv_capacity_tokens: Some(BOUND_CAPACITY_TOKENS),
            prompt_tokens_total: Some(0),
            ..WorkerStats::reachable(Some(worker_name(i)), None)
        })
        .collect();
    let push: Push = Push::new(rows);
    let body = serde_json::to_string(&push)?;
    let auth = format!("Bearer {BOUND_PUSH_TOKEN}");
    let headers = [
        ("content-type", "application/json"),
        ("authorization", &*auth),
    ];
    let resp = llm_demo::admin::request(
        stats,
        "POST",
        llm_router::config::DEFAULT_STATS_PATH,
        &headers,
        body.as_bytes(),
    )?;
    if !(200..300).contains(&resp.status) {
        bail!("the filter answered {}: {}", resp.status, resp.body);
    }
    Ok(())
}

fn replay(
    rt: &tokio::runtime::Runtime,
    url: &str,
    conns: usize,
    items: &[WorkItem],
) -> (Vec<Record>, Duration) {
    // As a production client: no decision headers asked for (the `cache_hit` share
    // comes from Envoy's stats).
    let mut r = Replay::closed_loop(url, conns, Duration::from_secs(120));
    r.target.explain = false;
    let t = Instant::now();
    let records = rt.block_on(r.records(items.to_vec()));
    (records, t.elapsed())
}

/// Sends the warm-up; any failure ends the run (the measurement after it would be of
/// a broken setup).
fn warm_up(
    rt: &tokio::runtime::Runtime,
    url: &str,
    conns: usize,
    items: &[WorkItem],
    variant: &str,
) -> Result<()> {
    let (records, _) = replay(rt, url, conns, items);
    let failed = records.iter().filter(|r| !r.is_ok()).count();
    if failed > 0 {
        bail!(
            "{variant}: {failed} of {} warm-up requests failed",
            records.len()
        );
    }
    Ok(())
}

fn note_errors(m: &mut Measured, records: &[Record]) {
    for r in records.iter().filter(|r| !r.is_ok()) {
        m.errors += 1;
        if m.first_error.is_none() {
            m.first_error = Some(format!("{:?} {:?}", r.status, r.error));
        }
    }
}

/// What the Envoys of one point route to: the engines, the workers (which share
/// them round robin when there are more workers than engines), and the collector
/// `kv_match` asks.
struct Fleet {
    _engines: Canned,
    upstreams: Vec<Upstream>,
    collector: Canned,
}

fn engines(p: Point, load: &Load) -> Result<Fleet> {
    let engines = Canned::start(load.engines.min(p.workers))?;
    let upstreams = (0..p.workers)
        .map(|i| Upstream {
            name: worker_name(i),
            addr: engines.addrs[i % engines.addrs.len()],
            pool: "regular",
            bootstrap: None,
        })
        .collect();
    Ok(Fleet {
        _engines: engines,
        upstreams,
        collector: Canned::answering(1, canned::collector_answer(p.workers))?,
    })
}

/// Runs one point of the grid; results in `load.variants` order.
///
/// Every measurement has an Envoy of its own, started, warmed and stopped around
/// it: with every variant's Envoy running for the whole point, the one started
/// first cost up to 70 us a request more than an identical build started last,
/// which swamped the differences this benchmark is for.
pub fn run(rt: &tokio::runtime::Runtime, p: Point, load: &Load, tps: u64) -> Result<Vec<Measured>> {
    let tmp = TempDir::new("llm-overhead")?;
    let envoy_bin = paths::envoy_bin()?;
    let fleet = engines(p, load)?;
    let mut measured: Vec<Measured> = load
        .variants
        .iter()
        .map(|v| Measured {
            variant: v.clone(),
            ..Measured::default()
        })
        .collect();
    let mut hits = vec![Hits::default(); measured.len()];

    let warm_n = load.warm.min(WARM_BYTES / p.body_bytes.max(1));
    let per_rep = scaled(load.requests, p.body_bytes, 100);
    let lat_n = scaled(load.latency_requests, p.body_bytes, 20);
    let warm = bodies(p.body_bytes, 0..warm_n);
    let mut next = warm_n;
    let n = measured.len();
    for rep in 0..load.reps {
        let one = bodies(p.body_bytes, next..next + lat_n);
        next += lat_n;
        let many = bodies(p.body_bytes, next..next + per_rep);
        next += per_rep;
        // Every variant's Envoy is up, warm, for the whole repetition, so that the
        // loaded phase can go round them in slices (see `Load::slices`).
        let mut envoys = Vec::with_capacity(n);
        for (i, m) in measured.iter().enumerate() {
            let dir = variant_dir(&tmp.0.join(format!("rep{rep}")), i, &m.variant)?;
            let envoy = start_envoy(&m.variant, &fleet, p.threads, &dir, &envoy_bin)?;
            warm_up(rt, &envoy.url(), load.connections, &warm, &m.variant)?;
            envoys.push(envoy);
        }
        // A different variant goes first each repetition, and each slice.
        let order = |round: usize| (0..n).map(move |k| (rep + round + k) % n);
        for i in order(0) {
            let (m, envoy) = (&mut measured[i], &envoys[i]);
            let ((records, _), spent) =
                cpu::during(envoy.pid(), tps, || Ok(replay(rt, &envoy.url(), 1, &one)))?;
            m.cpu_c1 += spent.cpu;
            m.requests_c1 += records.len();
            m.latencies_ms
                .extend(records.iter().filter(|x| x.is_ok()).map(|x| x.latency_ms));
            note_errors(m, &records);
        }
        let mut phase = vec![Phase::default(); n];
        let slice = many.len().div_ceil(load.slices.max(1)).max(1);
        for (round, items) in many.chunks(slice).enumerate() {
            for i in order(round) {
                let (m, envoy) = (&mut measured[i], &envoys[i]);
                let ((records, wall), spent) = cpu::during(envoy.pid(), tps, || {
                    Ok(replay(rt, &envoy.url(), load.connections, items))
                })?;
                phase[i].add(spent, wall, records.len());
                note_errors(m, &records);
            }
        }
        for ((m, envoy), (h, ph)) in measured
            .iter_mut()
            .zip(&envoys)
            .zip(hits.iter_mut().zip(&phase))
        {
            m.cpu += ph.cpu;
            let per_request = |d: Duration| d.as_secs_f64() * 1e6 / ph.requests.max(1) as f64;
            m.cpu_runs.push(per_request(ph.cpu));
            m.user_runs.push(per_request(ph.user));
            m.requests += ph.requests;
            m.rps
                .push(ph.requests as f64 / ph.wall.as_secs_f64().max(1e-9));
            h.count(&m.variant, envoy)?;
            m.rss_bytes.push(envoy_memory::rss(envoy.pid())?);
            m.vm_bytes
                .extend(envoy_memory::vms_memory_bytes(&envoy.stats()?));
        }
    }
    for (m, h) in measured.iter_mut().zip(hits) {
        m.hit_rate = h.rate(&m.variant);
    }
    Ok(measured)
}

/// One variant's loaded phase of a repetition, summed over its slices.
#[derive(Debug, Clone, Copy, Default)]
struct Phase {
    cpu: Duration,
    user: Duration,
    wall: Duration,
    requests: usize,
}

impl Phase {
    fn add(&mut self, spent: cpu::Spent, wall: Duration, requests: usize) {
        self.cpu += spent.cpu;
        self.user += spent.user;
        self.wall += wall;
        self.requests += requests;
    }
}

/// What one variant counted under callgrind over all repetitions.
#[derive(Debug, Clone, Default)]
pub struct Counted {
    pub variant: String,
    /// Envoy's instructions per request of each repetition: their spread is the
    /// count's own noise (Envoy's, not the machine's).
    pub runs: Vec<f64>,
    pub instructions: u64,
    /// Of them, the main thread's (`callgrind::Count`): its timers' work, which
    /// valgrind's slowness charges to a request many times over.
    pub main_instructions: u64,
    pub requests: usize,
    /// Seconds the counted requests took: valgrind serves them at a pace tens of
    /// times slower than Envoy's own, and work done by the second (the
    /// ticks' per-worker gauges, counters handed over on their lag) is charged to
    /// each request at that pace.
    pub counted_secs: f64,
    /// Router variants: the share of routed requests labelled `cache_hit`.
    pub hit_rate: Option<f64>,
}

impl Counted {
    pub fn instructions_per_request(&self) -> f64 {
        self.instructions as f64 / self.requests.max(1) as f64
    }

    /// Requests a second while counted.
    pub fn pace(&self) -> f64 {
        per_second(self.requests, self.counted_secs)
    }

    /// The instructions of the threads that serve requests (all but the main one).
    pub fn worker_instructions_per_request(&self) -> f64 {
        self.instructions.saturating_sub(self.main_instructions) as f64
            / self.requests.max(1) as f64
    }
}

/// `n` over `secs` seconds, a second.
fn per_second(n: usize, secs: f64) -> f64 {
    n as f64 / secs.max(f64::MIN_POSITIVE)
}

/// Runs one point with every Envoy under callgrind; results in `load.variants` order.
///
/// Each repetition of each variant has a fresh Envoy, sent the warm-up and then
/// `load.requests` counted requests at `load.connections` (one by default: valgrind
/// runs Envoy's threads one at a time and about 50 times slower; many count what a
/// busy thread does per request, as every busy worker's in-flight count). Every
/// repetition sends the same bodies, so repetitions differ only by what Envoy itself
/// does differently.
pub fn run_callgrind(rt: &tokio::runtime::Runtime, p: Point, load: &Load) -> Result<Vec<Counted>> {
    let tmp = TempDir::new("llm-overhead")?;
    let envoy_bin = paths::envoy_bin()?;
    let fleet = engines(p, load)?;
    let warm_n = load
        .warm
        .max(CALLGRIND_WARM_PER_WORKER * p.workers)
        .min(WARM_BYTES / p.body_bytes.max(1));
    let n = scaled(load.requests, p.body_bytes, 20);
    let warm = bodies(p.body_bytes, 0..warm_n);
    let counted_bodies = bodies(p.body_bytes, warm_n..warm_n + n);
    let mut counted: Vec<Counted> = load
        .variants
        .iter()
        .map(|v| Counted {
            variant: v.clone(),
            ..Counted::default()
        })
        .collect();
    let mut hits = vec![Hits::default(); counted.len()];
    for rep in 0..load.reps {
        for (i, (c, hits)) in counted.iter_mut().zip(hits.iter_mut()).enumerate() {
            let dir = variant_dir(&tmp.0.join(format!("rep{rep}")), i, &c.variant)?;
            let counter = Counter::new(&dir, &envoy_bin, load.cache_sim)?;
            let envoy = start_envoy(&c.variant, &fleet, p.threads, &dir, &counter.launcher())?;
            let url = envoy.url();
            // At the counted phase's concurrency: a policy that spreads under load
            // (predicted_ttft's cap) first uses most workers' clusters there, and
            // Envoy's upstream connects to them were counted as the filter's cost.
            warm_up(rt, &url, load.connections, &warm, &c.variant)?;
            let ((records, took), count) = counter
                .counting(envoy.pid(), || {
                    Ok(replay(rt, &url, load.connections, &counted_bodies))
                })
                .with_context(|| format!("counting {} (files in {})", c.variant, dir.display()))?;
            let failed: Vec<&Record> = records.iter().filter(|r| !r.is_ok()).collect();
            if let Some(first) = failed.first() {
                bail!(
                    "{}: {} of {} counted requests failed (first: {:?} {:?}); their count would be of the error path",
                    c.variant,
                    failed.len(),
                    records.len(),
                    first.status,
                    first.error
                );
            }
            if let Some(keep) = &load.keep {
                let name = format!("{}w-{}-rep{rep}", p.workers, c.variant.replace('/', "_"));
                counter.keep(keep, &name)?;
            }
            let per_request = count.all as f64 / records.len().max(1) as f64;
            let main = count.main as f64 / records.len().max(1) as f64;
            eprintln!(
                "overhead: {} rep {rep}: {per_request:.0} instructions per request ({main:.0} on the main thread), {:.0} requests a second",
                c.variant,
                per_second(records.len(), took.as_secs_f64())
            );
            c.runs.push(per_request);
            c.instructions += count.all;
            c.main_instructions += count.main;
            c.requests += records.len();
            c.counted_secs += took.as_secs_f64();
            hits.count(&c.variant, &envoy)?;
        }
    }
    for (c, h) in counted.iter_mut().zip(hits) {
        c.hit_rate = h.rate(&c.variant);
    }
    Ok(counted)
}

/// A variant's `cache_hit` decisions and routed requests over its repetitions (the
/// floor routes without deciding: it has none).
#[derive(Debug, Clone, Copy, Default)]
struct Hits {
    hit: u64,
    routed: u64,
}

impl Hits {
    /// Adds what `envoy`, running `variant`, decided.
    fn count(&mut self, variant: &str, envoy: &Envoy) -> Result<()> {
        if !is_floor(variant) {
            let (hit, routed) = decisions(envoy)?;
            self.hit += hit;
            self.routed += routed;
        }
        Ok(())
    }

    fn rate(self, variant: &str) -> Option<f64> {
        (!is_floor(variant)).then(|| self.hit as f64 / self.routed.max(1) as f64)
    }
}

/// An Envoy's `cache_hit` decisions and all its routed requests.
fn decisions(envoy: &Envoy) -> Result<(u64, u64)> {
    let stats = envoy.stats()?;
    let stat = |name: &str| {
        stats
            .get(&format!("wasmcustom.{name}"))
            .copied()
            .unwrap_or(0)
    };
    let routed: u64 = Label::ALL
        .iter()
        .map(|l| stat(&names::decision_metric(*l)))
        .sum();
    Ok((stat(&names::decision_metric(Label::CacheHit)), routed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_with_settings_is_still_the_floor_guest() {
        assert!(is_floor("floor"));
        assert!(is_floor(FLOOR_HOSTCALLS));
        assert!(!is_floor("cache_aware"));
        assert!(!is_floor("floor_like+x=1"));
        assert!(!is_floor("cache_aware+sync_batch_ms=100"));
        let (policy, settings) = policy_variant(FLOOR_HOSTCALLS).unwrap();
        assert_eq!(policy, FLOOR);
        assert_eq!(settings.get("floor_hostcalls"), Some(&Value::Bool(true)));
    }
}
