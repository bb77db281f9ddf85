//! The router's core alone, natively, for a count by source line: `Router::route` over
//! a generated workload (conversations over shared system prompts, each session's
//! turns in order), with a closed loop of requests in flight whose in-flight counts
//! and outstanding prefill are kept as the glue keeps them, and every routed text
//! recorded. No Envoy, no Wasm, no host: what is left is the policy, the tree and
//! the screen, which callgrind can charge to their lines (a Wasm JIT's code it cannot).
//!
//! ```sh
//! CARGO_PROFILE_RELEASE_DEBUG=true CARGO_PROFILE_RELEASE_STRIP=false \
//!     cargo build --release -p llm-bench --bin route-profile
//! valgrind --tool=callgrind --toggle-collect='*Router*route_in*' \
//!     target/release/route-profile --workers 256 --policy predicted_ttft
//! callgrind_annotate --auto=yes callgrind.out.<pid>
//! ```
//!
//! It prints a checksum of the decisions: two builds that must decide alike (a
//! restructured ladder, say) print the same one.

use anyhow::{anyhow, Result};
use clap::Parser;
use llm_load::generate::{generate, GenerateConfig};
use llm_load::workload::CHAT_PATH;
use llm_router::config::Config;
use llm_router::load::{Loads, WorkerWork};
use llm_router::parse::{parse, Parsed};
use llm_router::request::router::Router;
use llm_router::rng::SplitMix64;
use std::collections::VecDeque;

#[derive(Parser, Debug)]
#[command(about = "Route a generated workload through the router's core, natively")]
struct Args {
    /// Workers in the fleet (`w0`, `w1`, ...).
    #[arg(long, default_value_t = 256)]
    workers: usize,
    #[arg(long, default_value = "predicted_ttft")]
    policy: String,
    /// Requests routed.
    #[arg(long, default_value_t = 4000)]
    requests: usize,
    /// Requests in flight: each new one is routed before the oldest ends.
    #[arg(long, default_value_t = 64)]
    in_flight: usize,
    /// Conversations over 8 system prompts.
    #[arg(long, default_value_t = 512)]
    sessions: usize,
    /// Turns of each conversation (1: every request starts a conversation, as
    /// `benches/overhead`'s do).
    #[arg(long, default_value_t = 4)]
    turns: usize,
    /// Chars of each system prompt.
    #[arg(long, default_value_t = 3000)]
    system_prompt_chars: usize,
    /// JSON members added to the plugin configuration, e.g. `"ttft_sample_size":16`.
    #[arg(long, default_value = "")]
    config: String,
}

/// The plugin configuration for `args`.
fn config(args: &Args) -> Result<Config> {
    let workers: Vec<String> = (0..args.workers)
        .map(|i| format!(r#"{{"name":"w{i}"}}"#))
        .collect();
    let extra = if args.config.is_empty() {
        String::new()
    } else {
        format!(",{}", args.config)
    };
    let json = format!(
        r#"{{"policy":"{}","workers":[{}]{extra}}}"#,
        args.policy,
        workers.join(",")
    );
    Config::from_json(json.as_bytes()).map_err(|e| anyhow!("configuration: {e}"))
}

/// The workload as `llm-load generate` writes it: every session's first turn, then
/// every second turn, and so on.
fn requests(args: &Args) -> Vec<Parsed> {
    let cfg = GenerateConfig {
        sessions: args.sessions,
        turns: args.turns,
        system_prompts: 8,
        system_prompt_chars: args.system_prompt_chars,
        ..GenerateConfig::default()
    };
    generate(&cfg)
        .iter()
        .map(|line| {
            let path = line.path.as_deref().unwrap_or(CHAT_PATH);
            parse(path, line.body.to_string().as_bytes())
        })
        .collect()
}

/// What a closed loop of `in_flight` requests holds on each worker.
struct InFlight {
    counts: Vec<u64>,
    work: Vec<WorkerWork>,
    /// Oldest first: the worker and the uncached chars booked there.
    open: VecDeque<(usize, u64)>,
}

impl InFlight {
    fn new(workers: usize) -> InFlight {
        InFlight {
            counts: vec![0; workers],
            work: vec![WorkerWork::default(); workers],
            open: VecDeque::new(),
        }
    }

    fn take(&mut self, worker: usize, chars: u64) {
        if let (Some(n), Some(w)) = (self.counts.get_mut(worker), self.work.get_mut(worker)) {
            *n += 1;
            w.prefilling += 1;
            w.ahead_chars += chars;
            self.open.push_back((worker, chars));
        }
    }

    /// Ends the oldest request once more than `depth` are open.
    fn settle(&mut self, depth: usize) {
        while self.open.len() > depth {
            let Some((worker, chars)) = self.open.pop_front() else {
                return;
            };
            if let (Some(n), Some(w)) = (self.counts.get_mut(worker), self.work.get_mut(worker)) {
                *n -= 1;
                w.prefilling -= 1;
                w.ahead_chars -= chars;
            }
        }
    }
}

/// Routes `args.requests` requests; the checksum of the workers chosen.
fn run(args: &Args) -> Result<u64> {
    let mut router = Router::new(config(args)?);
    let ttft = router.config().uses_predicted_ttft();
    let workload = requests(args);
    let mut rng = SplitMix64(7);
    let mut held = InFlight::new(args.workers);
    // The tables a VM keeps between requests, shared as the glue shares them (a new
    // one each request would rebuild the kept screen every time).
    let kept = Loads::default();
    let mut checksum = 0u64;
    // Each request routed from its own copy, as the glue routes each freshly parsed
    // body (a record takes the text out of it).
    for (i, req) in workload.iter().cycle().take(args.requests).enumerate() {
        let loads = Loads {
            inflight: held.counts.clone().into(),
            work: if ttft {
                held.work.clone().into()
            } else {
                Default::default()
            },
            now_ms: i as u64,
            ..kept.clone()
        };
        let routed = router
            .route(&mut req.clone(), &loads, &mut rng)
            .map_err(|e| anyhow!("request {i}: {}", e.as_str()))?;
        if let Some(record) = &routed.record {
            router.apply_local(&record.op);
        }
        let worker = routed.decision.worker as usize;
        checksum = checksum.wrapping_mul(31).wrapping_add(worker as u64);
        let chars = routed.decision.predicted.map_or(0, |p| p.uncached_chars);
        held.take(worker, chars);
        held.settle(args.in_flight);
    }
    Ok(checksum)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let checksum = run(&args)?;
    println!(
        "route-profile: {} requests, {} workers, {}: decisions checksum {checksum:016x}",
        args.requests, args.workers, args.policy
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(policy: &str) -> Args {
        Args::parse_from([
            "route-profile",
            "--workers",
            "16",
            "--requests",
            "300",
            "--sessions",
            "32",
            "--system-prompt-chars",
            "400",
            "--policy",
            policy,
        ])
    }

    #[test]
    fn the_same_build_decides_alike_and_policies_differ() {
        let ttft = run(&args("predicted_ttft")).unwrap();
        assert_eq!(run(&args("predicted_ttft")).unwrap(), ttft);
        assert_ne!(run(&args("round_robin")).unwrap(), ttft);
    }

    #[test]
    fn the_loop_holds_at_most_its_depth_and_gives_everything_back() {
        let mut held = InFlight::new(4);
        for i in 0..10 {
            held.take(i % 4, 100);
            held.settle(3);
            assert!(held.open.len() <= 3);
            assert_eq!(held.counts.iter().sum::<u64>(), held.open.len() as u64);
        }
        held.settle(0);
        assert!(held.counts.iter().all(|&n| n == 0));
        assert!(held.work.iter().all(|w| *w == WorkerWork::default()));
    }

    #[test]
    fn a_bad_configuration_is_refused_by_name() {
        let mut a = args("no_such_policy");
        a.config = String::new();
        assert!(run(&a).is_err());
    }
}
