//! Command-line interface: `llm-load run` and `llm-load generate`.
//!
//! Exit codes: 0 when every request succeeded, 3 when some failed (they are reported
//! in the summary; a script must not mistake a failing fleet for a good run), 2 for
//! setup problems (unreadable or malformed workload, bad URL, unwritable output).

use crate::arrivals::Arrivals;
use crate::client::{build_client, normalize_base_url, send, Target};
use crate::family::Member;
use crate::generate::{generate, to_jsonl, GenerateConfig};
use crate::record::Record;
use crate::report::{human, json_line};
use crate::scheduler::run_scheduled;
use crate::stats::{summarize, Summary};
use crate::workload::{load_workload, WorkItem};
use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
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
    /// More base URLs (repeatable; Envoy replicas behind no load balancer): requests
    /// go round robin over `--url` and these, each on a new connection, so a
    /// conversation's turns land on different replicas.
    #[arg(long = "spread-url")]
    pub spread_urls: Vec<String>,
    /// Workload file: one `{"body":{..},"session":"..","path":".."}` per line.
    #[arg(long)]
    pub workload: PathBuf,
    /// Maximum requests in flight.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub concurrency: u64,
    /// Requests per second, arriving as a Poisson process (like `vllm bench serve
    /// --request-rate`), still capped by `--concurrency`. Unset: closed loop, each
    /// slot sends its next request as soon as its last one ended.
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Seed of the arrival times with `--request-rate`.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// API key, sent as `Authorization: Bearer <key>`.
    #[arg(long, env = "OPENAI_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Per-request timeout in seconds, covering the whole response body.
    #[arg(long, default_value_t = 120.0)]
    pub timeout_s: f64,
    /// Do not send `x-llm-router-explain` (which asks the router for its decision
    /// headers, the source of the report's decisions and workers).
    #[arg(long)]
    pub no_explain: bool,
    /// Also write the JSON summary to this file.
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    /// Write one JSON line per request to this file: send time (`start_ms` into the
    /// run, `start_unix_ms`), status, worker, decision, latency, TTFT, inter-token
    /// gaps, tokens, error.
    #[arg(long)]
    pub records_out: Option<PathBuf>,
    /// Write the run as an HTML page of charts (requests per worker, cached ratio and
    /// decisions over time, latency distributions) to this file.
    #[arg(long)]
    pub html_out: Option<PathBuf>,
    /// Progress on stderr: `auto` (when stderr is a terminal), `always`, `never`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "never"])]
    pub progress: String,
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
    /// Write member SEED of the policy sweep's workload family (`host-sim sweep`)
    /// instead of the shape the flags above give, and print its load and fleet.
    #[arg(long, value_name = "SEED")]
    pub family: Option<u64>,
    /// Output file.
    #[arg(long)]
    pub out: PathBuf,
}

impl GenerateArgs {
    fn config(&self) -> Result<GenerateConfig> {
        if let Some(seed) = self.family {
            return Ok(GenerateConfig {
                model: self.model.clone(),
                completions: self.completions,
                ..Member::draw(seed).workload
            });
        }
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
    if let Some(seed) = args.family {
        eprintln!(
            "llm-load: family member {seed}: {}",
            Member::draw(seed).describe()
        );
    }
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
    let spread = args
        .spread_urls
        .iter()
        .map(|u| normalize_base_url(u))
        .collect::<Result<Vec<_>>>()?;
    if !(args.timeout_s.is_finite() && args.timeout_s > 0.0) {
        bail!(
            "--timeout-s must be a positive number, got {}",
            args.timeout_s
        );
    }
    let arrivals = match args.request_rate {
        None => None,
        Some(r) if r.is_finite() && r > 0.0 => Some(Arrivals::poisson(r, args.seed)),
        Some(r) => bail!("--request-rate must be a positive number, got {r}"),
    };
    let items = load_workload(&args.workload)?;
    let pace = match args.request_rate {
        Some(r) => format!("{r} req/s Poisson, at most {} in flight", args.concurrency),
        None => format!("concurrency {}", args.concurrency),
    };
    let against = if spread.is_empty() {
        base.clone()
    } else {
        format!("{base} and {} (round robin)", spread.join(", "))
    };
    eprintln!(
        "llm-load: replaying {} requests against {against} ({pace}, timeout {}s)",
        items.len(),
        args.timeout_s
    );
    let replay = Replay {
        target: Target {
            base,
            api_key: args.api_key.clone(),
            timeout: Duration::from_secs_f64(args.timeout_s),
            explain: !args.no_explain,
        },
        concurrency: usize::try_from(args.concurrency)?,
        spread,
        arrivals,
        progress: match args.progress.as_str() {
            "always" => true,
            "never" => false,
            _ => std::io::stderr().is_terminal(),
        },
    };
    let started = Instant::now();
    let records = replay.records(items).await;
    let summary = summarize(&records, started.elapsed());

    if let Some(path) = &args.records_out {
        crate::record::write_jsonl(path, &records)?;
    }
    if let Some(path) = &args.html_out {
        let title = format!("llm-load: {}", args.workload.display());
        std::fs::write(path, crate::html::page(&title, &summary, &records))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("llm-load: charts in {}", path.display());
    }
    let json = json_line(&summary);
    if let Some(path) = &args.json_out {
        std::fs::write(path, format!("{json}\n"))
            .with_context(|| format!("writing {}", path.display()))?;
    }
    print!("{}", human(&summary));
    println!("{json}");
    Ok(summary)
}

/// A replay: where to send, how many at once, how fast.
#[derive(Debug, Clone)]
pub struct Replay {
    pub target: Target,
    /// Requests in flight at most.
    pub concurrency: usize,
    /// More bases: requests go round robin over `target.base` and these, each on a
    /// new connection (empty: every request to `target.base`, connections kept).
    pub spread: Vec<String>,
    /// Open-loop arrivals; `None`: closed loop.
    pub arrivals: Option<Arrivals>,
    /// Report progress on stderr while running.
    pub progress: bool,
}

impl Replay {
    /// A closed-loop replay against `base` (an `http(s)://host:port` URL without a
    /// trailing slash), without credentials or progress, asking for the router's
    /// decision headers.
    pub fn closed_loop(base: &str, concurrency: usize, timeout: Duration) -> Self {
        Self {
            target: Target {
                base: base.to_string(),
                api_key: None,
                timeout,
                explain: true,
            },
            concurrency,
            spread: Vec::new(),
            arrivals: None,
            progress: false,
        }
    }

    /// The same replay spread round robin over `bases` (the first is the target's),
    /// a new connection per request.
    pub fn spread_over(mut self, bases: &[String]) -> Self {
        if let Some((first, more)) = bases.split_first() {
            self.target.base = first.clone();
            self.spread = more.to_vec();
        }
        self
    }

    /// Replays `items` and summarises what happened.
    pub async fn run(&self, items: Vec<WorkItem>) -> Summary {
        let started = Instant::now();
        let records = self.records(items).await;
        summarize(&records, started.elapsed())
    }

    /// Replays `items` and returns one record per item, in workload order.
    pub async fn records(&self, items: Vec<WorkItem>) -> Vec<Record> {
        let sessions: Vec<Option<String>> = items.iter().map(|it| it.session.clone()).collect();
        let total = items.len();
        let items = Arc::new(items);
        let idle = if self.spread.is_empty() {
            self.concurrency.max(1)
        } else {
            0
        };
        let client = build_client(idle);
        // The `n`th request sent goes to the `n % len`th base.
        let targets: Arc<Vec<Target>> = Arc::new(
            std::iter::once(&self.target.base)
                .chain(&self.spread)
                .map(|base| Target {
                    base: base.clone(),
                    ..self.target.clone()
                })
                .collect(),
        );
        let sent = Arc::new(AtomicUsize::new(0));
        let done = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let run_start = Instant::now();
        let ticker = self.progress.then(|| {
            let (done, failed) = (Arc::clone(&done), Arc::clone(&failed));
            tokio::spawn(async move { show_progress(total, &done, &failed, run_start).await })
        });
        let counters = (Arc::clone(&done), Arc::clone(&failed));
        let records = run_scheduled(
            &sessions,
            self.concurrency,
            self.arrivals.clone(),
            move |i| {
                let client = client.clone();
                let targets = Arc::clone(&targets);
                let n = sent.fetch_add(1, Ordering::Relaxed);
                let items = Arc::clone(&items);
                let (done, failed) = (Arc::clone(&counters.0), Arc::clone(&counters.1));
                async move {
                    let target = targets.get(n % targets.len().max(1));
                    let rec = match (items.get(i), target) {
                        (Some(item), Some(target)) => send(&client, target, item, run_start).await,
                        _ => Record::default(),
                    };
                    if !rec.is_ok() {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                    rec
                }
            },
        )
        .await;
        if let Some(t) = ticker {
            t.abort();
            progress_line(total, &done, &failed, run_start, true);
        }
        records
    }
}

/// Redraws the progress line every quarter second on a terminal, or prints one every
/// 10 s into a log.
async fn show_progress(total: usize, done: &AtomicUsize, failed: &AtomicUsize, start: Instant) {
    let period = if std::io::stderr().is_terminal() {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(10)
    };
    loop {
        tokio::time::sleep(period).await;
        progress_line(total, done, failed, start, false);
    }
}

fn progress_line(
    total: usize,
    done: &AtomicUsize,
    failed: &AtomicUsize,
    start: Instant,
    last: bool,
) {
    let n = done.load(Ordering::Relaxed);
    let errors = failed.load(Ordering::Relaxed);
    let secs = start.elapsed().as_secs_f64();
    let width = 30;
    let filled = (n * width).checked_div(total).unwrap_or(width);
    let bar: String = (0..width)
        .map(|i| if i < filled { '#' } else { '.' })
        .collect();
    let rate = if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let text = format!(
        "llm-load: [{bar}] {n}/{total} done, {errors} failed, {rate:.1} req/s, {secs:.0} s"
    );
    let mut err = std::io::stderr();
    if err.is_terminal() {
        let _ = write!(err, "\r{text}{}", if last { "\n" } else { "" });
    } else {
        let _ = writeln!(err, "{text}");
    }
}
