//! Command-line interface: `llm-load run` and `llm-load generate`.
//!
//! Setup problems (unreadable or malformed workload, bad URL, unwritable output) are
//! returned as errors and make the process exit non-zero; request failures during a run
//! are data, reported in the summary, and leave the exit code at 0 so the caller decides
//! what error rate is acceptable.

use crate::client::{build_client, normalize_base_url, send};
use crate::generate::{generate, to_jsonl, GenerateConfig};
use crate::record::Record;
use crate::report::{human, json_line};
use crate::scheduler::run_scheduled;
use crate::stats::{summarize, Summary};
use crate::workload::{load_workload, WorkItem};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Parser)]
#[command(
    name = "llm-load",
    version,
    about = "Replay an OpenAI-style workload against a URL and report routing, caching and latency"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Replay a JSONL workload and print a report; the last stdout line is JSON.
    Run(RunArgs),
    /// Write a deterministic multi-turn chat workload (JSONL).
    Generate(GenerateArgs),
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Base URL, e.g. http://127.0.0.1:10000 (workload paths are appended).
    #[arg(long)]
    pub url: String,
    /// Workload file: one `{"body":{..},"session":"..","path":".."}` per line.
    #[arg(long)]
    pub workload: PathBuf,
    /// Maximum requests in flight.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub concurrency: u64,
    /// Per-request timeout in seconds, covering the whole response body.
    #[arg(long, default_value_t = 120.0)]
    pub timeout_s: f64,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Number of sessions (conversations).
    #[arg(long, default_value_t = 32)]
    pub sessions: usize,
    /// Turns per session; turn t resends the whole conversation so far.
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Distinct system prompts; session i uses prompt i % S.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    pub system_prompts: u64,
    /// Length of each system prompt in characters.
    #[arg(long, default_value_t = 2000)]
    pub system_prompt_chars: usize,
    /// Approximate length of each user message and assistant reply in characters.
    #[arg(long, default_value_t = 200)]
    pub user_chars: usize,
    /// Seed: the same arguments give a byte-identical file.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Fraction of requests sent with "stream": true (0..=1).
    #[arg(long, default_value_t = 0.0)]
    pub stream_fraction: f64,
    /// Model name put in every body.
    #[arg(long, default_value = "mock")]
    pub model: String,
    /// Emit /v1/completions bodies with a flattened `prompt` instead of `messages`.
    #[arg(long)]
    pub completions: bool,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
}

impl GenerateArgs {
    fn config(&self) -> Result<GenerateConfig> {
        if !(0.0..=1.0).contains(&self.stream_fraction) {
            bail!(
                "--stream-fraction must be within 0..=1, got {}",
                self.stream_fraction
            );
        }
        Ok(GenerateConfig {
            sessions: self.sessions,
            turns: self.turns,
            system_prompts: usize::try_from(self.system_prompts)?,
            system_prompt_chars: self.system_prompt_chars,
            user_chars: self.user_chars,
            seed: self.seed,
            stream_fraction: self.stream_fraction,
            model: self.model.clone(),
            completions: self.completions,
        })
    }
}

/// `llm-load generate`: writes the workload file.
pub fn generate_cmd(args: &GenerateArgs) -> Result<()> {
    let cfg = args.config()?;
    let lines = generate(&cfg);
    let text = to_jsonl(&lines)?;
    std::fs::write(&args.out, text).with_context(|| format!("writing {}", args.out.display()))?;
    eprintln!(
        "llm-load: wrote {} requests ({} sessions x {} turns) to {}",
        lines.len(),
        cfg.sessions,
        cfg.turns,
        args.out.display()
    );
    Ok(())
}

/// `llm-load run`: replays the workload, prints the human report then the JSON line,
/// and returns the summary.
pub async fn run_cmd(args: &RunArgs) -> Result<Summary> {
    let base = normalize_base_url(&args.url)?;
    if !(args.timeout_s.is_finite() && args.timeout_s > 0.0) {
        bail!(
            "--timeout-s must be a positive number, got {}",
            args.timeout_s
        );
    }
    let timeout = Duration::from_secs_f64(args.timeout_s);
    let concurrency = usize::try_from(args.concurrency)?;
    let items = load_workload(&args.workload)?;
    eprintln!(
        "llm-load: replaying {} requests against {base} (concurrency {concurrency}, timeout {}s)",
        items.len(),
        args.timeout_s
    );

    let summary = replay(&base, items, concurrency, timeout).await;

    let json = json_line(&summary);
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print!("{}", human(&summary));
    println!("{json}");
    Ok(summary)
}

/// Replays `items` against `base` (an `http://host:port` URL without a trailing
/// slash) with at most `concurrency` in flight, and summarises what happened.
pub async fn replay(
    base: &str,
    items: Vec<WorkItem>,
    concurrency: usize,
    timeout: Duration,
) -> Summary {
    let started = Instant::now();
    let records = replay_records(base, items, concurrency, timeout).await;
    summarize(&records, started.elapsed())
}

/// `replay` without the summary: the records, for callers that replay a workload
/// in parts and summarise parts and whole.
pub async fn replay_records(
    base: &str,
    items: Vec<WorkItem>,
    concurrency: usize,
    timeout: Duration,
) -> Vec<Record> {
    let sessions: Vec<Option<String>> = items.iter().map(|it| it.session.clone()).collect();
    let items = Arc::new(items);
    let client = build_client(concurrency);
    let base = Arc::new(base.to_string());
    run_scheduled(&sessions, concurrency, move |i| {
        let client = client.clone();
        let base = Arc::clone(&base);
        let items = Arc::clone(&items);
        async move { send(&client, &base, &items[i], timeout).await }
    })
    .await
}
