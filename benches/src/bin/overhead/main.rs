//! `overhead`: what the router costs Envoy per request, against a floor filter that
//! only buffers and reads the body (`benches/floor`), measured side by side.
//!
//! For each point of the grid (workers, body size, Envoy threads) it starts a few
//! fake engines that answer at once (`canned`; workers beyond them share them round robin),
//! one Envoy per variant (`floor`, the floor making the router's hostcalls,
//! `round_robin`, `cache_aware`, `predicted_ttft`: the same bootstrap and plugin
//! config, only the `.wasm`, the policy and its settings differ),
//! sends every Envoy the same warm-up (10k conversations, not measured), then, in
//! repetitions that rotate which variant goes first, the same closed-loop load: a
//! latency phase at one connection and a throughput phase at 64, the latter in
//! slices the variants take in turn (`--slices`), every Envoy up through the
//! repetition, so that the machine's slow and fast stretches fall on all of them
//! alike. Per variant it
//! prints p50/p99 at one connection, requests/s at 64 (median of repetitions), and
//! Envoy's own CPU time per request from `/proc/<pid>/stat` over the loaded phases
//! (steadier than latency on a shared machine), with the ratio and the difference
//! to the floor. The last line is the whole run as JSON.
//!
//! `--callgrind` counts instead of timing: every Envoy runs under valgrind's
//! callgrind, and per variant it prints Envoy's user-space instructions per request
//! over `--requests` requests at one connection (300 by default, after a warm-up of
//! 300), with the ratio and the difference to the floor. CPU time on the shared 2-core
//! machine spreads over 20-30 us a request from one repetition to the next; the count
//! repeats within about 0.1% (`predicted_ttft` within 1%), so a change worth a few
//! us shows. It leaves out kernel time, and valgrind runs Envoy about 50 times slower
//! (about 15 s per variant and repetition at 4 KiB).
//!
//! `benches/overhead` builds what it needs and runs this; `--full` is the whole grid.

mod bench;
mod callgrind;
mod canned;
mod cpu;

use anyhow::{bail, Result};
use bench::{Counted, Load, Measured, Point, FLOOR, FLOOR_HOSTCALLS};
use clap::Parser;
use serde_json::json;

#[derive(Parser, Debug)]
#[command(
    name = "overhead",
    about = "Envoy CPU per request of the router against a buffer-only floor filter"
)]
struct Args {
    /// Worker counts (each a point of the grid).
    #[arg(long, value_delimiter = ',', default_values_t = [4, 16, 256])]
    workers: Vec<usize>,
    /// Request body sizes (`4k`, `128k`, `1m` or bytes).
    #[arg(long, value_delimiter = ',', default_values = ["4k"], value_parser = parse_size)]
    body: Vec<usize>,
    /// Envoy `--concurrency` values.
    #[arg(long, value_delimiter = ',', default_values_t = [1])]
    threads: Vec<u32>,
    /// The whole grid: workers 4,16,256 x body 4k,128k,1m x threads 1,4.
    #[arg(long)]
    full: bool,
    /// Conversations sent before measuring, so the tree is warm (capped at 40 MB of
    /// bodies: fewer for large bodies) [default: 10000; 300 with --callgrind, and
    /// there at least 8 per worker, at --connections, so every worker's upstream
    /// connections exist before counting].
    #[arg(long)]
    warm: Option<usize>,
    /// Repetitions (each variant's phases once per repetition).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Requests per repetition in the throughput phase, or counted with --callgrind
    /// (4 KiB bodies; scaled to the same bytes for larger ones) [default: 20000; 300
    /// with --callgrind].
    #[arg(long)]
    requests: Option<usize>,
    /// Requests per repetition at one connection (scaled like `--requests`).
    #[arg(long, default_value_t = 200)]
    latency_requests: usize,
    /// The throughput phase of a repetition in this many slices, taken by the
    /// variants in turn (every variant's Envoy stays up through the repetition), so
    /// that a stretch of a slow machine falls on all of them alike.
    #[arg(long, default_value_t = 10)]
    slices: usize,
    /// Connections in the throughput phase [default: 64], or counted with
    /// --callgrind [default: 1; 64 counts what a busy thread does per request, such as
    /// the in-flight counts of every busy worker].
    #[arg(long)]
    connections: Option<usize>,
    /// Engines (at most one per worker; `canned`).
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Variants; the floor must be among them (ratios are to it). The default has
    /// the floor making the router's own hostcalls too
    /// (`floor+floor_hostcalls=true`): the least a filter that does what the router
    /// must can cost.
    #[arg(long, value_delimiter = ',', default_values = [FLOOR, FLOOR_HOSTCALLS, "round_robin", "cache_aware", "predicted_ttft"])]
    variants: Vec<String>,
    /// Count Envoy's instructions per request under callgrind instead of timing it
    /// (--latency-requests does not apply).
    #[arg(long)]
    callgrind: bool,
    /// With --callgrind: keep every count's dumps in DIR, as
    /// `<workers>w-<variant>-rep<n>.<k>`, for `callgrind_annotate` (which functions,
    /// hostcalls or V8's code, the instructions went to).
    #[arg(long, value_name = "DIR", requires = "callgrind")]
    callgrind_keep: Option<std::path::PathBuf>,
    /// With --callgrind: also simulate the caches (valgrind's `--cache-sim=yes`), so
    /// the kept dumps count each function's instruction and data cache misses too
    /// (`benches/envoy-profile --cache` reads them). The counts are the same.
    #[arg(long, requires = "callgrind")]
    cache_sim: bool,
}

/// Defaults of `--warm` and `--requests`: timing needs many requests to average
/// out the machine, counting needs few, and valgrind makes each about 50 times dearer.
const DEFAULT_WARM: usize = 10_000;
const DEFAULT_REQUESTS: usize = 20_000;
const CALLGRIND_WARM: usize = 300;
const CALLGRIND_REQUESTS: usize = 300;
const DEFAULT_CONNECTIONS: usize = 64;
const CALLGRIND_CONNECTIONS: usize = 1;

fn parse_size(s: &str) -> Result<usize, String> {
    let lower = s.to_ascii_lowercase();
    let (num, mult) = match lower.strip_suffix('k') {
        Some(n) => (n, 1024),
        None => match lower.strip_suffix('m') {
            Some(n) => (n, 1024 * 1024),
            None => (lower.as_str(), 1),
        },
    };
    match num.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n * mult),
        _ => Err(format!("{s:?} is not a size like 4k, 128k, 1m or 4096")),
    }
}

fn size_label(bytes: usize) -> String {
    if bytes.is_multiple_of(1024 * 1024) {
        format!("{} MiB", bytes / (1024 * 1024))
    } else if bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

fn percentile(samples: &[f64], p: f64) -> f64 {
    let sorted = llm_load::stats::sorted(samples.to_vec());
    llm_load::stats::percentile(&sorted, p).unwrap_or(f64::NAN)
}

fn median(samples: &[f64]) -> f64 {
    percentile(samples, 50.0)
}

/// The median over repetitions of a variant's CPU per request minus the floor's in
/// the same repetition. The machine's speed drifts between repetitions by more than
/// the difference being measured (the floor's own repetitions spread over tens of
/// microseconds); each repetition runs the variants one after the other, so the
/// difference within one is the steadier figure.
fn paired_above(runs: &[f64], floor_runs: &[f64]) -> f64 {
    let diffs: Vec<f64> = runs.iter().zip(floor_runs).map(|(v, f)| v - f).collect();
    median(&diffs)
}

/// Microseconds with their sign, or `-` where the run has nothing to take them from.
fn signed_us(us: f64) -> String {
    if us.is_nan() {
        "-".to_string()
    } else {
        format!("{us:+.0}")
    }
}

/// A variant's `cache_hit` share for the tables (`-`: the floor decides nothing).
fn hit_label(rate: Option<f64>) -> String {
    rate.map_or("-".to_string(), |h| format!("{:.0}%", h * 100.0))
}

/// The table of one point, and its rows as JSON.
fn report(p: Point, results: &[Measured]) -> (String, serde_json::Value) {
    let floor = results.iter().find(|m| m.variant == FLOOR);
    let floor_cpu = floor.map(Measured::cpu_us_per_request).unwrap_or(f64::NAN);
    let floor_rps = floor.map(|m| median(&m.rps)).unwrap_or(f64::NAN);
    // The router's own code: what a variant costs above the floor that makes its
    // hostcalls, when the run has it.
    let calls = results.iter().find(|m| m.variant == FLOOR_HOSTCALLS);
    let mut out = format!(
        "\n{} workers, {} bodies, Envoy --concurrency {}\n\n\
         | variant | p50 / p99 ms (1 conn) | req/s (64 conn) | x floor | Envoy CPU us/req | x floor | - floor us | - floor us, paired | of it user space, paired | - floor with hostcalls us, paired | CPU us/req at 1 conn | cache_hit | Envoy RSS MiB | VMs' memory MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        p.workers,
        size_label(p.body_bytes),
        p.threads
    );
    let mut rows = Vec::new();
    for m in results {
        let cpu = m.cpu_us_per_request();
        let rps = median(&m.rps);
        let hit = hit_label(m.hit_rate);
        let paired = floor.map_or(f64::NAN, |f| paired_above(&m.cpu_runs, &f.cpu_runs));
        let user = floor.map_or(f64::NAN, |f| paired_above(&m.user_runs, &f.user_runs));
        let own = calls.map_or(f64::NAN, |c| paired_above(&m.cpu_runs, &c.cpu_runs));
        out += &format!(
            "| {} | {:.2} / {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:+.0} | {:+.0} | {:+.0} | {} | {:.0} | {} | {} | {} |\n",
            m.variant,
            percentile(&m.latencies_ms, 50.0),
            percentile(&m.latencies_ms, 99.0),
            rps,
            rps / floor_rps,
            cpu,
            cpu / floor_cpu,
            cpu - floor_cpu,
            paired,
            user,
            signed_us(own),
            m.cpu_c1_us_per_request(),
            hit,
            mib(&m.rss_bytes),
            mib(&m.vm_bytes),
        );
        if m.errors > 0 {
            out += &format!(
                "|   {} errors, first: {} |\n",
                m.errors,
                m.first_error.as_deref().unwrap_or("")
            );
        }
        rows.push(json!({
            "variant": m.variant,
            "p50_ms": percentile(&m.latencies_ms, 50.0),
            "p99_ms": percentile(&m.latencies_ms, 99.0),
            "req_per_s": rps,
            "req_per_s_runs": m.rps,
            "cpu_us_per_req": cpu,
            "cpu_us_per_req_runs": m.cpu_runs,
            "cpu_us_above_floor_paired": paired,
            "user_us_per_req_runs": m.user_runs,
            "user_us_above_floor_paired": user,
            "cpu_us_above_floor_with_hostcalls_paired": own,
            "cpu_us_per_req_1_conn": m.cpu_c1_us_per_request(),
            "requests": m.requests,
            "errors": m.errors,
            "cache_hit_rate": m.hit_rate,
            "rss_bytes_runs": m.rss_bytes,
            "vm_memory_bytes_runs": m.vm_bytes,
        }));
    }
    let j = json!({
        "workers": p.workers, "body_bytes": p.body_bytes, "threads": p.threads, "variants": rows
    });
    (out, j)
}

/// The largest of a variant's memory readings in MiB (`-`: none, as the floor's
/// VMs report none): a tree only grows over a run.
fn mib(readings: &[u64]) -> String {
    readings.iter().max().map_or("-".to_string(), |&b| {
        format!("{:.1}", b as f64 / (1 << 20) as f64)
    })
}

/// `n` rounded, with thousands separated by commas (`225,609`).
fn thousands(n: f64) -> String {
    let digits = format!("{:.0}", n.abs());
    let mut out = String::new();
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    let sign = if n.round() < 0.0 { "-" } else { "" };
    format!("{sign}{out}")
}

/// The table of one point counted under callgrind, and its rows as JSON.
fn report_callgrind(
    p: Point,
    connections: usize,
    results: &[Counted],
) -> (String, serde_json::Value) {
    let floor_of = |per: fn(&Counted) -> f64| {
        results
            .iter()
            .find(|c| c.variant == FLOOR)
            .map(per)
            .unwrap_or(f64::NAN)
    };
    let floor = floor_of(Counted::instructions_per_request);
    let worker_floor = floor_of(Counted::worker_instructions_per_request);
    let signed = |n: f64| format!("{}{}", if n > 0.0 { "+" } else { "" }, thousands(n));
    let mut out = format!(
        "\n{} workers, {} bodies, Envoy --concurrency {}, under callgrind ({connections} connection{})\n\n\
         | variant | Envoy instructions/req | x floor | - floor | - floor, worker threads | runs | req/s counted | cache_hit |\n\
         |---|---|---|---|---|---|---|---|\n",
        p.workers,
        size_label(p.body_bytes),
        p.threads,
        if connections == 1 { "" } else { "s" }
    );
    let mut rows = Vec::new();
    for c in results {
        let per_request = c.instructions_per_request();
        let on_workers = c.worker_instructions_per_request();
        let runs: Vec<String> = c.runs.iter().map(|r| thousands(*r)).collect();
        let hit = hit_label(c.hit_rate);
        out += &format!(
            "| {} | {} | {:.2} | {} | {} | {} | {:.0} | {} |\n",
            c.variant,
            thousands(per_request),
            per_request / floor,
            signed(per_request - floor),
            signed(on_workers - worker_floor),
            runs.join(" / "),
            c.pace(),
            hit
        );
        rows.push(json!({
            "variant": c.variant,
            "instructions_per_req": per_request,
            "worker_thread_instructions_per_req": on_workers,
            "instructions_per_req_runs": c.runs,
            "requests": c.requests,
            "req_per_s_counted": c.pace(),
            "cache_hit_rate": c.hit_rate,
        }));
    }
    let j = json!({
        "workers": p.workers, "body_bytes": p.body_bytes, "threads": p.threads,
        "measure": "callgrind", "connections": connections, "variants": rows
    });
    (out, j)
}

fn main() -> Result<()> {
    let mut args = Args::parse();
    if args.full {
        args.workers = vec![4, 16, 256];
        args.body = vec![4096, 128 * 1024, 1024 * 1024];
        args.threads = vec![1, 4];
    }
    if !args.variants.iter().any(|v| v == FLOOR) {
        bail!("--variants must include {FLOOR}: every ratio is to it");
    }
    if args.callgrind {
        callgrind::check_tools()?;
    }
    let (warm, requests, connections) = if args.callgrind {
        (CALLGRIND_WARM, CALLGRIND_REQUESTS, CALLGRIND_CONNECTIONS)
    } else {
        (DEFAULT_WARM, DEFAULT_REQUESTS, DEFAULT_CONNECTIONS)
    };
    let load = Load {
        engines: args.engines.max(1),
        warm: args.warm.unwrap_or(warm),
        reps: args.reps.max(1),
        requests: args.requests.unwrap_or(requests).max(1),
        latency_requests: args.latency_requests.max(1),
        connections: args.connections.unwrap_or(connections).max(1),
        slices: args.slices.max(1),
        variants: args.variants.clone(),
        keep: args.callgrind_keep.clone(),
        cache_sim: args.cache_sim,
    };
    let tps = cpu::ticks_per_second();
    let rt = tokio::runtime::Runtime::new()?;
    let mut all = Vec::new();
    for &threads in &args.threads {
        for &body_bytes in &args.body {
            for &workers in &args.workers {
                let p = Point {
                    workers,
                    body_bytes,
                    threads,
                };
                eprintln!("overhead: {p:?}...");
                let (table, j) = if args.callgrind {
                    let counted = bench::run_callgrind(&rt, p, &load)?;
                    report_callgrind(p, load.connections, &counted)
                } else {
                    report(p, &bench::run(&rt, p, &load, tps)?)
                };
                println!("{table}");
                all.push(j);
            }
        }
    }
    println!("{}", json!({"overhead": all}));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_the_issue_writes_them() {
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("128K"), Ok(131072));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("0").is_err());
        assert!(parse_size("lots").is_err());
        assert_eq!(size_label(1 << 20), "1 MiB");
        assert_eq!(size_label(4096), "4 KiB");
    }

    #[test]
    fn the_paired_difference_is_the_median_of_each_repetitions() {
        // The floor drifts from 100 to 160 between repetitions; the variant stays
        // 30 above it, which the pooled difference (45) does not say.
        let floor = [100.0, 160.0, 130.0];
        let variant = [130.0, 190.0, 205.0];
        assert_eq!(paired_above(&variant, &floor), 30.0);
        assert_eq!(paired_above(&floor, &floor), 0.0);
    }

    #[test]
    fn a_difference_the_run_cannot_take_reads_as_a_dash() {
        assert_eq!(signed_us(12.4), "+12");
        assert_eq!(signed_us(-3.0), "-3");
        assert_eq!(signed_us(f64::NAN), "-");
    }

    #[test]
    fn counts_read_with_thousands_separated() {
        assert_eq!(thousands(225_609.4), "225,609");
        assert_eq!(thousands(999.6), "1,000");
        assert_eq!(thousands(12.0), "12");
        assert_eq!(thousands(-151_318.0), "-151,318");
        assert_eq!(thousands(-0.2), "0");
    }

    #[test]
    fn bodies_have_the_asked_size_and_share_system_prompts() {
        for size in [4096, 128 * 1024] {
            let items = bench::bodies(size, 0..16);
            for it in &items {
                let n = it.body.len() as f64;
                assert!((n / size as f64 - 1.0).abs() < 0.1, "{n} bytes for {size}");
            }
            assert_ne!(items[0].body, items[8].body, "each conversation differs");
        }
    }
}
