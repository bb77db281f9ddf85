//! POSTing a snapshot to the filter, and classifying the answer.
//!
//! The three outcomes need different handling: accepted (carry on), refused by the
//! filter with a reason (a config mismatch or a wrong token: an operator must act,
//! and retrying faster fixes nothing) and not delivered (Envoy down, restarting, or
//! a 5xx on the way: back off and try again).

use crate::backoff::Backoff;
use crate::scrape::{describe, HttpClient};
use crate::telemetry::{PushFailureLabels, UrlLabel};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use std::time::{Duration, Instant};

/// Refusal bodies are short reasons; more than this is cut off in the log.
const MAX_REASON_BYTES: usize = 4096;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushOutcome {
    Accepted,
    /// A 4xx: the filter read the push and said no (401 token, 400 shape or unknown
    /// worker, 413 too large).
    Refused {
        status: u16,
        reason: String,
    },
    /// Not delivered: connection failure, timeout or a 5xx.
    Failed(String),
}

pub async fn push(
    client: &HttpClient,
    url: &str,
    token: &str,
    body: Bytes,
    timeout: Duration,
) -> PushOutcome {
    let req = hyper::Request::post(url)
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(body));
    let req = match req {
        Ok(r) => r,
        Err(e) => return PushOutcome::Failed(format!("bad request: {e}")),
    };
    let send = async {
        let resp = client.request(req).await.map_err(|e| describe(&e))?;
        let status = resp.status();
        // Read the body even on success so the connection can be reused.
        let body = Limited::new(resp.into_body(), 1024 * 1024)
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        Ok::<_, String>((status, body))
    };
    match tokio::time::timeout(timeout, send).await {
        Err(_) => PushOutcome::Failed(format!("timeout after {} ms", timeout.as_millis())),
        Ok(Err(e)) => PushOutcome::Failed(e),
        Ok(Ok((status, body))) => {
            let mut reason = String::from_utf8_lossy(&body[..body.len().min(MAX_REASON_BYTES)])
                .trim()
                .to_string();
            if reason.is_empty() {
                reason = status.canonical_reason().unwrap_or("").to_string();
            }
            if status.is_success() {
                PushOutcome::Accepted
            } else if status.is_client_error() {
                PushOutcome::Refused {
                    status: status.as_u16(),
                    reason,
                }
            } else {
                PushOutcome::Failed(format!("HTTP {}: {reason}", status.as_u16()))
            }
        }
    }
}

/// Everything a push needs that is the same for every URL.
pub struct PushShared {
    pub client: HttpClient,
    pub token: String,
    pub timeout: Duration,
    pub telemetry: std::sync::Arc<crate::telemetry::Telemetry>,
}

/// Push state for change-only logging.
#[derive(Debug, Clone, PartialEq)]
enum PushLog {
    Accepted,
    Refused(u16, String),
    Down,
}

/// One push URL: its own backoff, outcome log state and metrics series, so a dead
/// Envoy neither delays nor silences the others.
pub struct Target {
    /// Position in `--push-url` order (the health table's key).
    pub index: usize,
    pub url: String,
    backoff: Backoff,
    last: Option<PushLog>,
}

impl Target {
    pub fn new(index: usize, url: String, interval: Duration) -> Self {
        Target {
            index,
            url,
            backoff: Backoff::new(interval),
            last: None,
        }
    }

    /// Whether a push is due (not backing off after undelivered pushes).
    pub fn ready(&self, now: Instant) -> bool {
        self.backoff.ready(now)
    }

    /// Pushes `body`, records the outcome (backoff, metrics, health) and logs it
    /// when it differs from the previous one.
    pub async fn push(&mut self, shared: &PushShared, body: Bytes) -> PushOutcome {
        let label = UrlLabel {
            url: self.url.clone(),
        };
        let t = &shared.telemetry;
        t.push_attempts.get_or_create(&label).inc();
        let started = Instant::now();
        let outcome = push(
            &shared.client,
            &self.url,
            &shared.token,
            body,
            shared.timeout,
        )
        .await;
        let done = Instant::now();
        t.push_duration
            .get_or_create(&label)
            .observe(done.saturating_duration_since(started).as_secs_f64());
        let (state, error) = match &outcome {
            PushOutcome::Accepted => {
                self.backoff.succeeded();
                (PushLog::Accepted, None)
            }
            PushOutcome::Refused { status, reason } => {
                // The filter is up and answering: retrying sooner or later changes
                // nothing until an operator fixes the config, so no backoff.
                self.backoff.succeeded();
                (
                    PushLog::Refused(*status, reason.clone()),
                    Some(format!("refused: HTTP {status}: {reason}")),
                )
            }
            PushOutcome::Failed(e) => {
                self.backoff.failed(done);
                (PushLog::Down, Some(e.clone()))
            }
        };
        if let Some(kind) = match &outcome {
            PushOutcome::Accepted => None,
            PushOutcome::Refused { .. } => Some("refused"),
            PushOutcome::Failed(_) => Some("undelivered"),
        } {
            t.push_failures
                .get_or_create(&PushFailureLabels {
                    url: self.url.clone(),
                    kind,
                })
                .inc();
        }
        t.push_finished(self.index, done, error);
        if self.last.as_ref() != Some(&state) {
            let url = self.url.as_str();
            match &outcome {
                PushOutcome::Accepted => tracing::info!(url, "push accepted"),
                PushOutcome::Refused { status, reason } => tracing::error!(
                    url,
                    status,
                    reason = reason.as_str(),
                    "push refused by the filter (check --token and the plugin config)"
                ),
                PushOutcome::Failed(e) => tracing::warn!(
                    url,
                    error = e.as_str(),
                    "push failed; backing off this URL (scraping and other URLs continue)"
                ),
            }
        }
        self.last = Some(state);
        outcome
    }
}
