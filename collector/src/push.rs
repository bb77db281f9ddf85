//! POSTing a snapshot to the filter, and classifying the answer.
//!
//! The three outcomes need different handling: accepted (carry on), refused by the
//! filter with a reason (a config mismatch or a wrong token: an operator must act,
//! and retrying faster fixes nothing) and not delivered (Envoy down, restarting, or
//! a 5xx on the way: back off and try again).

use crate::scrape::{describe, HttpClient};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use std::time::Duration;

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
    body: Vec<u8>,
    timeout: Duration,
) -> PushOutcome {
    let req = hyper::Request::post(url)
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body)));
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
