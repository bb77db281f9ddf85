//! `overhead`: what the router costs Envoy per request, against a floor filter that
//! only buffers and reads the body (`benches/floor`), measured side by side.
//!
//! For each point of the grid (workers, body size, Envoy threads) it starts a few
//! engine mocks that answer at once (workers beyond them share them round robin),
//! one Envoy per variant (`floor`, `round_robin`, `cache_aware`, `predicted_ttft`:
//! the same bootstrap and plugin config, only the `.wasm` and the policy differ),
//! sends every Envoy the same warm-up (10k conversations, not measured), then, in
//! repetitions that rotate which variant goes first, the same closed-loop load: a
//! latency phase at one connection and a throughput phase at 64. Per variant it
//! prints p50/p99 at one connection, requests/s at 64 (median of repetitions), and
//! Envoy's own CPU time per request from `/proc/<pid>/stat` over the loaded phases
//! (steadier than latency on a shared machine), with the ratio and the difference
//! to the floor. The last line is the whole run as JSON.
//!
//! `benches/overhead` builds what it needs and runs this; `--full` is the whole grid.

mod bench;
mod cpu;

use anyhow::{bail, Result};
use bench::{Load, Measured, Point, FLOOR};
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
    /// bodies: fewer for large bodies).
    #[arg(long, default_value_t = 10_000)]
    warm: usize,
    /// Repetitions (each variant's phases once per repetition).
    #[arg(long, default_value_t = 3)]
    reps: usize,
    /// Requests per repetition in the throughput phase (4 KiB bodies; scaled to the
    /// same bytes for larger ones).
    #[arg(long, default_value_t = 3000)]
    requests: usize,
    /// Requests per repetition at one connection (scaled like `--requests`).
    #[arg(long, default_value_t = 200)]
    latency_requests: usize,
    /// Connections in the throughput phase.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Engine mock processes (at most one per worker).
    #[arg(long, default_value_t = 4)]
    engines: usize,
    /// Variants; the floor must be among them (ratios are to it).
    #[arg(long, value_delimiter = ',', default_values = [FLOOR, "round_robin", "cache_aware", "predicted_ttft"])]
    variants: Vec<String>,
}

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

/// The table of one point, and its rows as JSON.
fn report(p: Point, results: &[Measured]) -> (String, serde_json::Value) {
    let floor = results.iter().find(|m| m.variant == FLOOR);
    let floor_cpu = floor.map(Measured::cpu_us_per_request).unwrap_or(f64::NAN);
    let floor_rps = floor.map(|m| median(&m.rps)).unwrap_or(f64::NAN);
    let mut out = format!(
        "\n{} workers, {} bodies, Envoy --concurrency {}\n\n\
         | variant | p50 / p99 ms (1 conn) | req/s (64 conn) | x floor | Envoy CPU us/req | x floor | - floor us | CPU us/req at 1 conn | cache_hit |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        p.workers,
        size_label(p.body_bytes),
        p.threads
    );
    let mut rows = Vec::new();
    for m in results {
        let cpu = m.cpu_us_per_request();
        let rps = median(&m.rps);
        let hit = m
            .hit_rate
            .map_or("-".to_string(), |h| format!("{:.0}%", h * 100.0));
        out += &format!(
            "| {} | {:.2} / {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {:+.0} | {:.0} | {} |\n",
            m.variant,
            percentile(&m.latencies_ms, 50.0),
            percentile(&m.latencies_ms, 99.0),
            rps,
            rps / floor_rps,
            cpu,
            cpu / floor_cpu,
            cpu - floor_cpu,
            m.cpu_c1_us_per_request(),
            hit
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
            "cpu_us_per_req_1_conn": m.cpu_c1_us_per_request(),
            "requests": m.requests,
            "errors": m.errors,
            "cache_hit_rate": m.hit_rate,
        }));
    }
    let j = json!({
        "workers": p.workers, "body_bytes": p.body_bytes, "threads": p.threads, "variants": rows
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
    let load = Load {
        engines: args.engines.max(1),
        warm: args.warm,
        reps: args.reps.max(1),
        requests: args.requests.max(1),
        latency_requests: args.latency_requests.max(1),
        connections: args.connections.max(1),
        variants: args.variants.clone(),
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
                let results = bench::run(&rt, p, &load, tps)?;
                let (table, j) = report(p, &results);
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
