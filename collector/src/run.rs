//! The loop: every interval, refresh membership when due, scrape every engine that
//! is not backing off (concurrently, so one slow engine costs one timeout, not N),
//! update the latency windows, build one snapshot and hand it to every push URL.
//!
//! Each push URL has its own task, fed the latest snapshot through a `watch`
//! channel: the loop never waits for a push, a slow or dead Envoy costs only its own
//! task (which skips the snapshots built while it was busy or backing off, so seq
//! numbers it receives may have gaps), and the others get every snapshot.
//!
//! Failures are expected and never fatal here: engines restart, Envoy restarts, the
//! admin API may be briefly unavailable. Each is logged when its state changes, not
//! every interval, so the log stays readable at 1 Hz.

use crate::backoff::Backoff;
use crate::cli::{Config, Membership};
use crate::histogram::Window;
use crate::membership::{self, Worker};
use crate::metrics::{self, EngineMetrics};
use crate::push::{PushOutcome, PushShared, Target};
use crate::scrape;
use crate::snapshot::{self, COLLECTOR_NAME};
use crate::telemetry::{EngineLabel, Telemetry};
use bytes::Bytes;
use llm_router_push::{Push, WorkerStats};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// Membership from Envoy's admin API is re-read every this many intervals: often
/// enough to follow scaling, rarely enough not to load the admin endpoint.
pub const MEMBERSHIP_EVERY: u64 = 10;

/// /healthz calls the loop stalled when no tick finished for this long: a tick is
/// at most a membership read, a scrape round and (in `--once`) a push round, each
/// bounded by the timeout, and the next one starts an interval after the last.
pub fn stall_after(interval: Duration, timeout: Duration) -> Duration {
    interval * 3 + timeout * 4
}

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

pub struct Collector {
    cfg: Config,
    shared: Arc<PushShared>,
    workers: Vec<Worker>,
    engines: HashMap<String, EngineState>,
    seq: u64,
    ticks: u64,
    /// Whether the last admin read worked (`None`: not tried yet).
    admin_ok: Option<bool>,
    admin_warnings: Vec<String>,
    /// The engines' KV event indexes (`--kv-events`), told each scrape's counters.
    kv: Option<crate::kv_events::KvIndexes>,
}

impl Collector {
    pub fn new(cfg: Config) -> Self {
        let workers = match &cfg.membership {
            Membership::Static(w) => w.clone(),
            Membership::Envoy { .. } => Vec::new(),
        };
        let telemetry = Arc::new(Telemetry::new(
            &cfg.push_urls,
            stall_after(cfg.interval, cfg.timeout),
            cfg.interval * cfg.unhealthy_after_intervals,
        ));
        let shared = Arc::new(PushShared {
            client: scrape::client(&cfg.tls),
            token: cfg.token.clone(),
            timeout: cfg.timeout,
            telemetry,
        });
        let mut c = Collector {
            shared,
            workers: Vec::new(),
            engines: HashMap::new(),
            seq: 0,
            ticks: 0,
            admin_ok: None,
            admin_warnings: Vec::new(),
            kv: None,
            cfg,
        };
        c.set_workers(workers);
        c
    }

    pub fn telemetry(&self) -> &Arc<Telemetry> {
        &self.shared.telemetry
    }

    /// One push target per `--push-url`.
    fn targets(&self) -> Vec<Target> {
        self.cfg
            .push_urls
            .iter()
            .enumerate()
            .map(|(i, url)| Target::new(i, url.clone(), self.cfg.interval))
            .collect()
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
            tracing::info!(
                workers = workers.len(),
                ?added,
                ?removed,
                "worker list changed"
            );
        }
        for w in &self.workers {
            if !workers.iter().any(|n| n.name == w.name) {
                self.shared.telemetry.forget_engine(&w.name);
            }
        }
        self.shared.telemetry.engines.set(workers.len() as i64);
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
            engine_scheme,
        } = &self.cfg.membership
        else {
            return Ok(());
        };
        let url = format!("{admin_url}/clusters?format=json");
        self.shared.telemetry.membership_refreshes.inc();
        let result = scrape::get_text(&self.shared.client, &url, self.cfg.timeout)
            .await
            .map_err(anyhow::Error::msg)
            .and_then(|body| {
                membership::parse_envoy_clusters(body.as_bytes(), cluster_prefix, pool_clusters)
            })
            .map(|(mut workers, warnings)| {
                if engine_scheme != "http" {
                    for w in &mut workers {
                        w.metrics_url = format!("{engine_scheme}://{}/metrics", w.address);
                    }
                }
                (workers, warnings)
            });
        match result {
            Ok((workers, warnings)) => {
                if self.admin_ok != Some(true) {
                    tracing::info!(admin = admin_url.as_str(), "envoy admin: reading clusters");
                }
                self.admin_ok = Some(true);
                if warnings != self.admin_warnings {
                    for w in &warnings {
                        tracing::warn!(admin = admin_url.as_str(), "envoy admin: {w}");
                    }
                    self.admin_warnings = warnings;
                }
                self.set_workers(workers);
                Ok(())
            }
            Err(e) => {
                self.shared.telemetry.membership_failures.inc();
                if self.admin_ok != Some(false) {
                    tracing::warn!(
                        url = url.as_str(),
                        error = format!("{e:#}"),
                        "envoy admin unreadable; keeping the last worker list"
                    );
                }
                self.admin_ok = Some(false);
                Err(e)
            }
        }
    }

    /// Scrapes every due engine concurrently and returns one report per worker.
    async fn scrape_all(&mut self, now: Instant) -> Vec<WorkerStats> {
        let mut tasks = JoinSet::new();
        for (i, w) in self.workers.iter().enumerate() {
            let due = self
                .engines
                .get(&w.name)
                .is_none_or(|s| s.backoff.ready(now));
            if due {
                self.shared
                    .telemetry
                    .scrapes
                    .get_or_create(&EngineLabel {
                        engine: w.name.clone(),
                    })
                    .inc();
                let client = self.shared.client.clone();
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
                        tracing::info!(
                            worker = w.name.as_str(),
                            address = w.address.as_str(),
                            engine = m.engine.as_str(),
                            "engine up"
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
                    snapshot::reachable(w, &m, state.ttft.p90(), state.tpot.p90())
                }
                Some(Err(e)) => {
                    self.shared
                        .telemetry
                        .scrape_failures
                        .get_or_create(&EngineLabel {
                            engine: w.name.clone(),
                        })
                        .inc();
                    let wait = state.backoff.failed(now);
                    if state.up != Some(false) {
                        tracing::warn!(
                            worker = w.name.as_str(),
                            address = w.address.as_str(),
                            error = e.as_str(),
                            retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                            "engine down; retrying with backoff"
                        );
                    }
                    state.up = Some(false);
                    state.last_error = e;
                    snapshot::unreachable(w, &state.last_error)
                }
                None => {
                    let error = if state.last_error.is_empty() {
                        "not scraped yet".to_string()
                    } else {
                        state.last_error.clone()
                    };
                    snapshot::unreachable(w, &error)
                }
            });
        }
        reports
    }

    /// One interval's work: the snapshot, and whether it may be pushed (not before
    /// Envoy has named the workers: an empty push would wipe the filter's table).
    pub async fn tick(&mut self) -> (Push, bool) {
        let due = self.ticks.is_multiple_of(MEMBERSHIP_EVERY) || self.admin_ok != Some(true);
        if due {
            // Errors are logged inside; the last list stays in use.
            let _ = self.refresh_membership().await;
        }
        self.ticks += 1;
        let now = Instant::now();
        let workers = self.scrape_all(now).await;
        self.shared
            .telemetry
            .engines_reachable
            .set(workers.iter().filter(|w| w.reachable).count() as i64);
        if let Some(kv) = &self.kv {
            let counters = workers
                .iter()
                .filter_map(|w| Some((w.name.as_deref()?, w.prompt_tokens_total?)));
            crate::kv_events::observe_counters(kv, counters, &self.shared.telemetry);
        }
        self.seq += 1;
        let snapshot = Push {
            collector: Some(COLLECTOR_NAME.to_string()),
            seq: Some(self.seq),
            interval_ms: Some(u64::try_from(self.cfg.interval.as_millis()).unwrap_or(u64::MAX)),
            workers,
            membership: Some(self.workers.iter().map(Worker::member).collect()),
        };
        let have_workers = match self.cfg.membership {
            Membership::Static(_) => true,
            Membership::Envoy { .. } => self.admin_ok == Some(true) || !self.workers.is_empty(),
        };
        (snapshot, have_workers)
    }
}

/// Pushes each snapshot the loop publishes to one URL, skipping while backing off.
async fn push_task(
    mut target: Target,
    shared: Arc<PushShared>,
    mut rx: watch::Receiver<Option<Bytes>>,
) {
    while rx.changed().await.is_ok() {
        let Some(body) = rx.borrow_and_update().clone() else {
            continue;
        };
        if target.ready(Instant::now()) {
            target.push(&shared, body).await;
        }
    }
}

/// Binds `--listen` and serves /healthz and /metrics.
async fn listen(
    addr: std::net::SocketAddr,
    served: Arc<crate::server::Served>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("--listen {addr}: cannot bind: {e}"))?;
    let local = listener.local_addr()?;
    let what = if served.kv.is_some() {
        "serving /healthz, /metrics and /kv/match"
    } else {
        "serving /healthz and /metrics"
    };
    tracing::info!(addr = %local, "{what}");
    crate::server::serve(listener, served);
    Ok(())
}

fn warn_cleartext_tokens(cfg: &Config) {
    for url in &cfg.push_urls {
        if !crate::cli::is_loopback_http(url) {
            tracing::warn!(
                url = url.as_str(),
                "the bearer token is sent in clear text over http to a non-loopback host; use https"
            );
        }
    }
}

/// Runs until SIGINT/SIGTERM.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let period = cfg.interval;
    tracing::info!(
        push_urls = ?cfg.push_urls,
        interval_ms = u64::try_from(period.as_millis()).unwrap_or(u64::MAX),
        engines = %match &cfg.membership {
            Membership::Static(w) => format!("{} static", w.len()),
            Membership::Envoy { admin_url, .. } => format!("from {admin_url}"),
        },
        "collector starting"
    );
    warn_cleartext_tokens(&cfg);
    let mut collector = Collector::new(cfg);
    if !collector.cfg.kv_events.is_empty() {
        collector.kv = Some(crate::kv_events::spawn(
            &collector.cfg.kv_events,
            collector.telemetry().clone(),
        ));
    }
    if let Some(addr) = collector.cfg.listen {
        let kv = collector.cfg.kv_matcher.clone().zip(collector.kv.clone());
        let served = crate::server::Served {
            telemetry: collector.telemetry().clone(),
            kv,
        };
        listen(addr, Arc::new(served)).await?;
    }
    let (tx, rx) = watch::channel::<Option<Bytes>>(None);
    let mut pushers = JoinSet::new();
    for target in collector.targets() {
        pushers.spawn(push_task(target, collector.shared.clone(), rx.clone()));
    }
    drop(rx);
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => {
                tracing::info!("shutting down");
                return Ok(());
            }
            _ = ticker.tick() => {
                let (snapshot, pushable) = collector.tick().await;
                if pushable {
                    tx.send_replace(Some(snapshot::body(&snapshot)));
                }
                collector.telemetry().tick_finished(Instant::now());
            }
        }
    }
}

/// What `--once` did: the snapshot, and each push URL's outcome (none when there
/// was nothing to push).
pub struct OnceResult {
    pub snapshot: Push,
    pub pushes: Vec<(String, PushOutcome)>,
}

impl OnceResult {
    /// The push URLs that did not accept the snapshot, with why.
    pub fn failures(&self) -> Vec<String> {
        self.pushes
            .iter()
            .filter_map(|(url, o)| match o {
                PushOutcome::Accepted => None,
                PushOutcome::Refused { status, reason } => {
                    Some(format!("{url}: refused: HTTP {status}: {reason}"))
                }
                PushOutcome::Failed(e) => Some(format!("{url}: {e}")),
            })
            .collect()
    }
}

/// One scrape and one push to every URL, concurrently. Fails when no worker list
/// could be had at all; push failures are in the result (see [`OnceResult::failures`]).
pub async fn run_once(cfg: Config) -> anyhow::Result<OnceResult> {
    warn_cleartext_tokens(&cfg);
    let mut collector = Collector::new(cfg);
    if matches!(collector.cfg.membership, Membership::Envoy { .. }) {
        collector.refresh_membership().await?;
        // Just read: the tick below need not read it again.
        collector.ticks = 1;
    }
    let (snapshot, pushable) = collector.tick().await;
    let mut pushes = Vec::new();
    if pushable {
        let body = snapshot::body(&snapshot);
        let mut set = JoinSet::new();
        for mut target in collector.targets() {
            let shared = collector.shared.clone();
            let body = body.clone();
            set.spawn(async move {
                let outcome = target.push(&shared, body).await;
                (target.index, target.url, outcome)
            });
        }
        let mut done = Vec::new();
        while let Some(joined) = set.join_next().await {
            done.push(joined?);
        }
        done.sort_by_key(|(i, _, _)| *i);
        pushes = done.into_iter().map(|(_, u, o)| (u, o)).collect();
    }
    Ok(OnceResult { snapshot, pushes })
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
