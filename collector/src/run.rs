//! The loop: every interval, refresh membership when due, scrape every engine that
//! is not backing off (concurrently, so one slow engine costs one timeout, not N),
//! update the latency windows, build one snapshot and push it.
//!
//! Failures are expected and never fatal here: engines restart, Envoy restarts, the
//! admin API may be briefly unavailable. Each is logged when its state changes, not
//! every interval, so the log stays readable at 1 Hz.

use crate::backoff::Backoff;
use crate::cli::{Config, Membership};
use crate::histogram::Window;
use crate::log;
use crate::membership::{self, Worker};
use crate::metrics::{self, EngineMetrics};
use crate::push::{self, PushOutcome};
use crate::scrape::{self, HttpClient};
use crate::snapshot::{Snapshot, WorkerReport, COLLECTOR_NAME};
use std::collections::HashMap;
use std::time::Instant;
use tokio::task::JoinSet;

/// Membership from Envoy's admin API is re-read every this many intervals: often
/// enough to follow scaling, rarely enough not to load the admin endpoint.
pub const MEMBERSHIP_EVERY: u64 = 10;

/// Per-engine state kept across intervals.
struct EngineState {
    worker: Worker,
    backoff: Backoff,
    ttft: Window,
    tpot: Window,
    /// Why the last scrape failed; reported while backing off.
    last_error: String,
    /// Last logged state (`None`: not logged yet).
    up: Option<bool>,
}

/// Push state for change-only logging.
#[derive(Debug, Clone, PartialEq)]
enum PushLog {
    Accepted,
    Refused(u16, String),
    Down,
}

pub struct Collector {
    cfg: Config,
    client: HttpClient,
    workers: Vec<Worker>,
    engines: HashMap<String, EngineState>,
    seq: u64,
    ticks: u64,
    push_backoff: Backoff,
    push_log: Option<PushLog>,
    /// Whether the last admin read worked (`None`: not tried yet).
    admin_ok: Option<bool>,
    admin_warnings: Vec<String>,
}

impl Collector {
    pub fn new(cfg: Config) -> Self {
        let workers = match &cfg.membership {
            Membership::Static(w) => w.clone(),
            Membership::Envoy { .. } => Vec::new(),
        };
        let mut c = Collector {
            client: scrape::client(),
            workers: Vec::new(),
            engines: HashMap::new(),
            seq: 0,
            ticks: 0,
            push_backoff: Backoff::new(cfg.interval),
            push_log: None,
            admin_ok: None,
            admin_warnings: Vec::new(),
            cfg,
        };
        c.set_workers(workers);
        c
    }

    /// Installs a new worker list, keeping the state of workers that stayed (same
    /// name and address) and starting fresh for new or moved ones.
    fn set_workers(&mut self, workers: Vec<Worker>) {
        let old: Vec<String> = self
            .workers
            .iter()
            .map(|w| format!("{}@{}", w.name, w.address))
            .collect();
        let new: Vec<String> = workers
            .iter()
            .map(|w| format!("{}@{}", w.name, w.address))
            .collect();
        let added: Vec<&String> = new.iter().filter(|n| !old.contains(n)).collect();
        let removed: Vec<&String> = old.iter().filter(|o| !new.contains(o)).collect();
        if !added.is_empty() || !removed.is_empty() {
            log!(
                "workers: {} (added {:?}, removed {:?})",
                workers.len(),
                added,
                removed
            );
        }
        let mut engines = HashMap::new();
        for w in &workers {
            let state = match self.engines.remove(&w.name) {
                Some(s) if s.worker == *w => s,
                _ => EngineState {
                    worker: w.clone(),
                    backoff: Backoff::new(self.cfg.interval),
                    ttft: Window::new(self.cfg.window),
                    tpot: Window::new(self.cfg.window),
                    last_error: String::new(),
                    up: None,
                },
            };
            engines.insert(w.name.clone(), state);
        }
        self.engines = engines;
        self.workers = workers;
    }

    /// Re-reads Envoy's clusters. On failure the previous list is kept: a brief
    /// admin outage must not make every worker vanish from the snapshot.
    async fn refresh_membership(&mut self) -> anyhow::Result<()> {
        let Membership::Envoy {
            admin_url,
            cluster_prefix,
            pool_clusters,
        } = &self.cfg.membership
        else {
            return Ok(());
        };
        let url = format!("{admin_url}/clusters?format=json");
        let result = scrape::get_text(&self.client, &url, self.cfg.timeout)
            .await
            .map_err(anyhow::Error::msg)
            .and_then(|body| {
                membership::parse_envoy_clusters(body.as_bytes(), cluster_prefix, pool_clusters)
            });
        match result {
            Ok((workers, warnings)) => {
                if self.admin_ok != Some(true) {
                    log!("envoy admin {admin_url}: reading clusters");
                }
                self.admin_ok = Some(true);
                if warnings != self.admin_warnings {
                    for w in &warnings {
                        log!("envoy admin: {w}");
                    }
                    self.admin_warnings = warnings;
                }
                self.set_workers(workers);
                Ok(())
            }
            Err(e) => {
                if self.admin_ok != Some(false) {
                    log!("envoy admin {url}: {e:#}; keeping the last worker list");
                }
                self.admin_ok = Some(false);
                Err(e)
            }
        }
    }

    /// Scrapes every due engine concurrently and returns one report per worker.
    async fn scrape_all(&mut self, now: Instant) -> Vec<WorkerReport> {
        let mut tasks = JoinSet::new();
        for (i, w) in self.workers.iter().enumerate() {
            let due = self
                .engines
                .get(&w.name)
                .is_none_or(|s| s.backoff.ready(now));
            if due {
                let client = self.client.clone();
                let url = w.metrics_url.clone();
                let timeout = self.cfg.timeout;
                tasks.spawn(async move {
                    let r = scrape::get_text(&client, &url, timeout).await;
                    (i, r.and_then(|text| metrics::extract(&text)))
                });
            }
        }
        let mut results: Vec<Option<Result<EngineMetrics, String>>> =
            vec![None; self.workers.len()];
        while let Some(joined) = tasks.join_next().await {
            // A panicking scrape task is a bug; its worker is reported as backing
            // off with its previous error rather than taking the collector down.
            if let Ok((i, r)) = joined {
                if let Some(slot) = results.get_mut(i) {
                    *slot = Some(r);
                }
            }
        }
        let mut reports = Vec::with_capacity(self.workers.len());
        for (w, result) in self.workers.iter().zip(results) {
            let Some(state) = self.engines.get_mut(&w.name) else {
                continue;
            };
            reports.push(match result {
                Some(Ok(m)) => {
                    state.backoff.succeeded();
                    if state.up != Some(true) {
                        log!(
                            "engine {} ({}) up: {}",
                            w.name,
                            w.address,
                            m.engine.as_str()
                        );
                    }
                    state.up = Some(true);
                    match &m.ttft {
                        Some(b) => state.ttft.observe(now, b.clone()),
                        None => state.ttft.clear(),
                    }
                    match &m.tpot {
                        Some(b) => state.tpot.observe(now, b.clone()),
                        None => state.tpot.clear(),
                    }
                    WorkerReport::reachable(w, &m, state.ttft.p90(), state.tpot.p90())
                }
                Some(Err(e)) => {
                    let wait = state.backoff.failed(now);
                    if state.up != Some(false) {
                        log!(
                            "engine {} ({}) down: {e}; retrying with backoff (next in {} ms)",
                            w.name,
                            w.address,
                            wait.as_millis()
                        );
                    }
                    state.up = Some(false);
                    state.last_error = e;
                    WorkerReport::unreachable(w, &state.last_error)
                }
                None => {
                    let error = if state.last_error.is_empty() {
                        "not scraped yet".to_string()
                    } else {
                        state.last_error.clone()
                    };
                    WorkerReport::unreachable(w, &error)
                }
            });
        }
        reports
    }

    /// Pushes and logs the outcome when it differs from the last one.
    async fn push(&mut self, snapshot: &Snapshot, now: Instant) -> PushOutcome {
        let body = snapshot.to_json().to_string().into_bytes();
        let outcome = push::push(
            &self.client,
            &self.cfg.push_url,
            &self.cfg.token,
            body,
            self.cfg.timeout,
        )
        .await;
        let state = match &outcome {
            PushOutcome::Accepted => {
                self.push_backoff.succeeded();
                PushLog::Accepted
            }
            PushOutcome::Refused { status, reason } => {
                // The filter is up and answering: retrying sooner or later changes
                // nothing until an operator fixes the config, so no backoff.
                self.push_backoff.succeeded();
                PushLog::Refused(*status, reason.clone())
            }
            PushOutcome::Failed(_) => {
                self.push_backoff.failed(now);
                PushLog::Down
            }
        };
        if self.push_log.as_ref() != Some(&state) {
            match &outcome {
                PushOutcome::Accepted => log!("push to {}: accepted", self.cfg.push_url),
                PushOutcome::Refused { status, reason } => {
                    log!(
                        "push to {} refused: HTTP {status}: {reason}",
                        self.cfg.push_url
                    )
                }
                PushOutcome::Failed(e) => log!(
                    "push to {} failed: {e}; backing off pushes (scraping continues)",
                    self.cfg.push_url
                ),
            }
        }
        self.push_log = Some(state);
        outcome
    }

    /// One interval's work. `force_push` ignores the push backoff (`--once`).
    pub async fn tick(&mut self, force_push: bool) -> (Snapshot, Option<PushOutcome>) {
        let due = self.ticks.is_multiple_of(MEMBERSHIP_EVERY) || self.admin_ok != Some(true);
        if due {
            // Errors are logged inside; the last list stays in use.
            let _ = self.refresh_membership().await;
        }
        self.ticks += 1;
        let now = Instant::now();
        let workers = self.scrape_all(now).await;
        self.seq += 1;
        let snapshot = Snapshot {
            collector: COLLECTOR_NAME,
            seq: self.seq,
            interval_ms: u64::try_from(self.cfg.interval.as_millis()).unwrap_or(u64::MAX),
            workers,
        };
        // Until Envoy has named the workers, an (empty) push would wipe the filter's
        // table; nothing is better than that.
        let have_workers = match self.cfg.membership {
            Membership::Static(_) => true,
            Membership::Envoy { .. } => self.admin_ok == Some(true) || !self.workers.is_empty(),
        };
        let outcome = if have_workers && (force_push || self.push_backoff.ready(Instant::now())) {
            Some(self.push(&snapshot, Instant::now()).await)
        } else {
            None
        };
        (snapshot, outcome)
    }
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let period = cfg.interval;
    log!(
        "pushing to {} every {} ms ({})",
        cfg.push_url,
        period.as_millis(),
        match &cfg.membership {
            Membership::Static(w) => format!("{} static engines", w.len()),
            Membership::Envoy { admin_url, .. } => format!("engines from {admin_url}"),
        }
    );
    let mut collector = Collector::new(cfg);
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                log!("shutting down");
                return Ok(());
            }
            _ = ticker.tick() => {
                collector.tick(false).await;
            }
        }
    }
}

/// One scrape and push. Fails only when no worker list could be had at all.
pub async fn run_once(cfg: Config) -> anyhow::Result<Snapshot> {
    let mut collector = Collector::new(cfg);
    if matches!(collector.cfg.membership, Membership::Envoy { .. }) {
        collector.refresh_membership().await?;
        // Just read: the tick below need not read it again.
        collector.ticks = 1;
    }
    let (snapshot, _) = collector.tick(true).await;
    Ok(snapshot)
}

async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
