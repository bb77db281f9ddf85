//! The collector's own health and metrics, served on `--listen` (`crate::server`):
//!
//! - `GET /healthz`: 200 `ok ...` while the loop runs and at least one push URL is
//!   delivering; 503 with the reason when the loop stalled (no tick finished within
//!   3 intervals + 4 timeouts: a tick is at most a membership read, a scrape round and
//!   a push round, each bounded by the timeout) or when every push URL has been
//!   failing, or never accepted a snapshot, for `--unhealthy-after-intervals`.
//! - `GET /metrics`: Prometheus text format 0.0.4 (names under `llm_collector_`).

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EngineLabel {
    pub engine: String,
}

/// A KV event gap's outcome: `repaired` from the replay socket, or `lost`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KvGapLabels {
    pub engine: String,
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UrlLabel {
    pub url: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PushFailureLabels {
    pub url: String,
    /// `refused` (the filter answered 4xx) or `undelivered` (connect error, timeout,
    /// TLS failure, 5xx).
    pub kind: &'static str,
}

fn push_duration_histogram() -> Histogram {
    // 1 ms .. ~8 s: a loopback push takes about a millisecond, a timeout ends it.
    Histogram::new(exponential_buckets(0.001, 2.0, 14))
}

/// Health state of one push URL.
#[derive(Debug, Clone)]
struct TargetHealth {
    url: String,
    last_success: Option<Instant>,
    /// Since when every attempt failed (or, before any success, the start).
    failing_since: Option<Instant>,
    last_error: Option<String>,
}

#[derive(Debug)]
struct HealthState {
    started: Instant,
    last_tick: Option<Instant>,
    targets: Vec<TargetHealth>,
}

/// Metrics and health, shared by the loop, the push tasks and the HTTP server.
pub struct Telemetry {
    registry: Registry,
    pub ticks: Counter,
    pub scrapes: Family<EngineLabel, Counter>,
    pub scrape_failures: Family<EngineLabel, Counter>,
    pub engines: Gauge,
    pub engines_reachable: Gauge,
    pub membership_refreshes: Counter,
    pub membership_failures: Counter,
    pub push_attempts: Family<UrlLabel, Counter>,
    pub push_failures: Family<PushFailureLabels, Counter>,
    pub push_duration: Family<UrlLabel, Histogram, fn() -> Histogram>,
    last_push_age: Family<UrlLabel, Gauge<f64, AtomicU64>>,
    /// `--kv-events`: what each engine's index holds and how whole its stream is.
    pub kv_blocks: Family<EngineLabel, Gauge>,
    pub kv_stale: Family<EngineLabel, Gauge>,
    pub kv_quiet: Family<EngineLabel, Gauge>,
    pub kv_events: Family<EngineLabel, Counter>,
    pub kv_gaps: Family<KvGapLabels, Counter>,
    pub kv_restarts: Family<EngineLabel, Counter>,
    pub kv_malformed: Family<EngineLabel, Counter>,
    health: Mutex<HealthState>,
    stall_after: Duration,
    fail_after: Duration,
}

impl Telemetry {
    /// `stall_after`: longest acceptable time between two finished ticks;
    /// `fail_after`: how long every push URL may fail before /healthz says 503.
    pub fn new(push_urls: &[String], stall_after: Duration, fail_after: Duration) -> Self {
        let now = Instant::now();
        let mut t = Telemetry {
            registry: Registry::default(),
            ticks: Counter::default(),
            scrapes: Family::default(),
            scrape_failures: Family::default(),
            engines: Gauge::default(),
            engines_reachable: Gauge::default(),
            membership_refreshes: Counter::default(),
            membership_failures: Counter::default(),
            push_attempts: Family::default(),
            push_failures: Family::default(),
            push_duration: Family::new_with_constructor(push_duration_histogram),
            last_push_age: Family::default(),
            kv_blocks: Family::default(),
            kv_stale: Family::default(),
            kv_quiet: Family::default(),
            kv_events: Family::default(),
            kv_gaps: Family::default(),
            kv_restarts: Family::default(),
            kv_malformed: Family::default(),
            health: Mutex::new(HealthState {
                started: now,
                last_tick: None,
                targets: push_urls
                    .iter()
                    .map(|url| TargetHealth {
                        url: url.clone(),
                        last_success: None,
                        failing_since: Some(now),
                        last_error: None,
                    })
                    .collect(),
            }),
            stall_after,
            fail_after,
        };
        let r = &mut t.registry;
        r.register(
            "llm_collector_ticks",
            "Scrape-and-push intervals finished",
            t.ticks.clone(),
        );
        r.register(
            "llm_collector_scrapes",
            "Engine /metrics scrapes attempted (engines in backoff are not scraped)",
            t.scrapes.clone(),
        );
        r.register(
            "llm_collector_scrape_failures",
            "Engine scrapes that failed (connect, timeout, HTTP status, unreadable metrics)",
            t.scrape_failures.clone(),
        );
        r.register(
            "llm_collector_engines",
            "Engines known (from --engine or Envoy's clusters)",
            t.engines.clone(),
        );
        r.register(
            "llm_collector_engines_reachable",
            "Engines reported reachable in the last snapshot",
            t.engines_reachable.clone(),
        );
        r.register(
            "llm_collector_membership_refreshes",
            "Reads of Envoy's admin /clusters",
            t.membership_refreshes.clone(),
        );
        r.register(
            "llm_collector_membership_refresh_failures",
            "Reads of Envoy's admin /clusters that failed (the last worker list stays)",
            t.membership_failures.clone(),
        );
        r.register(
            "llm_collector_push_attempts",
            "Snapshot pushes attempted, per push URL",
            t.push_attempts.clone(),
        );
        r.register(
            "llm_collector_push_failures",
            "Snapshot pushes not accepted, per push URL and kind (refused: 4xx; undelivered: connection, TLS, timeout or 5xx)",
            t.push_failures.clone(),
        );
        r.register(
            "llm_collector_push_duration_seconds",
            "Time from sending a push to its answer (or its failure), per push URL",
            t.push_duration.clone(),
        );
        r.register(
            "llm_collector_last_successful_push_age_seconds",
            "Seconds since the last accepted push, per push URL (absent until one is accepted)",
            t.last_push_age.clone(),
        );
        r.register(
            "llm_collector_kv_blocks",
            "KV cache blocks the engine holds on the GPU, from its KV events",
            t.kv_blocks.clone(),
        );
        r.register(
            "llm_collector_kv_stale",
            "1 while the engine's block index cannot be trusted: events were lost and not replayed",
            t.kv_stale.clone(),
        );
        r.register(
            "llm_collector_kv_quiet",
            "1 while the engine counted many prompt tokens and published no KV event: its index is not trusted until the next event",
            t.kv_quiet.clone(),
        );
        r.register(
            "llm_collector_kv_events",
            "KV events applied, per engine",
            t.kv_events.clone(),
        );
        r.register(
            "llm_collector_kv_gaps",
            "Gaps in an engine's KV event sequence, by outcome (repaired from its replay socket, or lost)",
            t.kv_gaps.clone(),
        );
        r.register(
            "llm_collector_kv_restarts",
            "KV event publishers seen restarting (the sequence went back): the engine's index was emptied",
            t.kv_restarts.clone(),
        );
        r.register(
            "llm_collector_kv_malformed",
            "KV event messages that could not be decoded (skipped)",
            t.kv_malformed.clone(),
        );
        t
    }

    /// A tick finished at `now`.
    pub fn tick_finished(&self, now: Instant) {
        self.ticks.inc();
        self.health.lock().unwrap().last_tick = Some(now);
    }

    /// Records one push outcome for target `index` (`None` error: accepted).
    pub fn push_finished(&self, index: usize, at: Instant, error: Option<String>) {
        let mut h = self.health.lock().unwrap();
        let Some(t) = h.targets.get_mut(index) else {
            return;
        };
        match error {
            None => {
                t.last_success = Some(at);
                t.failing_since = None;
                t.last_error = None;
            }
            Some(e) => {
                t.failing_since.get_or_insert(at);
                t.last_error = Some(e);
            }
        }
    }

    /// `Ok(text)` when healthy, `Err(reason)` otherwise.
    pub fn health(&self, now: Instant) -> Result<String, String> {
        let h = self.health.lock().unwrap();
        let secs = |d: Duration| format!("{:.1}s", d.as_secs_f64());
        let last_tick = match h.last_tick {
            Some(t) => t,
            None => {
                let since = now.saturating_duration_since(h.started);
                return Err(if since > self.stall_after {
                    format!(
                        "loop stalled: no tick finished in {} since start",
                        secs(since)
                    )
                } else {
                    "starting: no tick finished yet".to_string()
                });
            }
        };
        let age = now.saturating_duration_since(last_tick);
        if age > self.stall_after {
            return Err(format!(
                "loop stalled: last tick finished {} ago (limit {})",
                secs(age),
                secs(self.stall_after)
            ));
        }
        let failing: Vec<&TargetHealth> = h
            .targets
            .iter()
            .filter(|t| {
                t.failing_since
                    .is_some_and(|s| now.saturating_duration_since(s) >= self.fail_after)
            })
            .collect();
        if !h.targets.is_empty() && failing.len() == h.targets.len() {
            let why: Vec<String> = failing
                .iter()
                .map(|t| {
                    let since = secs(now.saturating_duration_since(t.failing_since.unwrap_or(now)));
                    match (&t.last_error, t.last_success) {
                        (Some(e), _) => format!("{}: failing for {since}: {e}", t.url),
                        (None, None) => {
                            format!("{}: nothing pushed in {since} (no worker list yet?)", t.url)
                        }
                        (None, Some(_)) => format!("{}: failing for {since}", t.url),
                    }
                })
                .collect();
            return Err(format!(
                "every push URL failing for over {}: {}",
                secs(self.fail_after),
                why.join("; ")
            ));
        }
        Ok(format!(
            "ok: last tick {} ago; {} of {} push URLs delivering",
            secs(age),
            h.targets
                .iter()
                .filter(|t| t.failing_since.is_none())
                .count(),
            h.targets.len()
        ))
    }

    /// The Prometheus text exposition.
    pub fn render(&self, now: Instant) -> String {
        {
            let h = self.health.lock().unwrap();
            for t in &h.targets {
                if let Some(s) = t.last_success {
                    self.last_push_age
                        .get_or_create(&UrlLabel { url: t.url.clone() })
                        .set(now.saturating_duration_since(s).as_secs_f64());
                }
            }
        }
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }

    /// Forgets an engine's series when membership drops it (pools churn).
    pub fn forget_engine(&self, name: &str) {
        let l = EngineLabel {
            engine: name.to_string(),
        };
        self.scrapes.remove(&l);
        self.scrape_failures.remove(&l);
    }
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// Answers one request to the `--listen` server.
pub fn respond(t: &Telemetry, method: &Method, path: &str) -> Response<Full<Bytes>> {
    const PLAIN: &str = "text/plain; charset=utf-8";
    if method != Method::GET && method != Method::HEAD {
        let mut r = text(
            StatusCode::METHOD_NOT_ALLOWED,
            PLAIN,
            "only GET\n".to_string(),
        );
        r.headers_mut().insert(
            hyper::header::ALLOW,
            hyper::header::HeaderValue::from_static("GET, HEAD"),
        );
        return r;
    }
    let now = Instant::now();
    match path {
        "/healthz" => match t.health(now) {
            Ok(msg) => text(StatusCode::OK, PLAIN, msg + "\n"),
            Err(reason) => text(StatusCode::SERVICE_UNAVAILABLE, PLAIN, reason + "\n"),
        },
        "/metrics" => text(
            StatusCode::OK,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
            t.render(now),
        ),
        _ => text(
            StatusCode::NOT_FOUND,
            PLAIN,
            "not found: try /healthz or /metrics\n".to_string(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_rules() {
        let urls = vec!["http://a/s".to_string(), "http://b/s".to_string()];
        let t = Telemetry::new(&urls, Duration::from_secs(5), Duration::from_secs(10));
        let t0 = t.health.lock().unwrap().started;
        assert!(t.health(t0).unwrap_err().contains("starting"));
        t.tick_finished(t0);
        t.push_finished(0, t0, None);
        t.push_finished(1, t0, Some("connection refused".into()));
        assert!(t.health(t0).unwrap().contains("1 of 2"));
        // a down, b down: 503 only after fail_after.
        let t1 = t0 + Duration::from_secs(1);
        t.push_finished(0, t1, Some("timeout".into()));
        t.tick_finished(t1 + Duration::from_secs(9));
        assert!(t.health(t1 + Duration::from_secs(9)).is_ok());
        t.tick_finished(t1 + Duration::from_secs(10));
        let e = t.health(t1 + Duration::from_secs(10)).unwrap_err();
        assert!(
            e.contains("every push URL") && e.contains("http://b/s"),
            "{e}"
        );
        // Recovery of one target is enough.
        t.push_finished(1, t1 + Duration::from_secs(11), None);
        assert!(t.health(t1 + Duration::from_secs(11)).is_ok());
        // Stall.
        let e = t.health(t1 + Duration::from_secs(20)).unwrap_err();
        assert!(e.contains("stalled"), "{e}");
    }

    #[test]
    fn exposition_parses() {
        let t = Telemetry::new(
            &["http://a/s".to_string()],
            Duration::from_secs(5),
            Duration::from_secs(10),
        );
        let now = Instant::now();
        t.scrapes
            .get_or_create(&EngineLabel {
                engine: "w0".into(),
            })
            .inc();
        t.push_duration
            .get_or_create(&UrlLabel {
                url: "http://a/s".into(),
            })
            .observe(0.002);
        t.push_finished(0, now, None);
        let text = t.render(now + Duration::from_secs(2));
        let lines = text.lines().map(|l| Ok(l.to_string()));
        let scrape = prometheus_parse::Scrape::parse(lines).unwrap();
        let get = |name: &str| {
            scrape
                .samples
                .iter()
                .find(|s| s.metric == name)
                .unwrap_or_else(|| panic!("{name} missing in\n{text}"))
        };
        assert_eq!(
            get("llm_collector_scrapes_total").labels.get("engine"),
            Some("w0")
        );
        match get("llm_collector_last_successful_push_age_seconds").value {
            prometheus_parse::Value::Gauge(v) => assert!((v - 2.0).abs() < 1e-9),
            ref v => panic!("{v:?}"),
        }
        assert!(matches!(
            get("llm_collector_push_duration_seconds").value,
            prometheus_parse::Value::Histogram(_)
        ));
    }
}
