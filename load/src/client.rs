//! The HTTP side: sends one workload request and turns what happens into a [`Record`].
//!
//! HTTP/1.1 (plain or TLS) over hyper-util's pooled client, so connections are kept
//! alive between requests as a real OpenAI client library would, and connection setup
//! does not dominate latency. Every failure mode becomes an error string on the record;
//! nothing here panics on network data.

use crate::record::Record;
use crate::response::{parse_json_body, snippet, worker_of, SseParser};
use crate::workload::WorkItem;
use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{HeaderMap, ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper::{Request, Uri};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Request header asking the routing filter for its decision headers.
pub const EXPLAIN_HEADER: &str = "x-llm-router-explain";
/// Response header an engine may use to name itself (fallback to the body's `worker`).
pub const WORKER_HEADER: &str = "x-engine-worker";
/// Response header naming the worker the routing filter chose.
pub const ROUTED_WORKER_HEADER: &str = "x-llm-router-worker";

/// Pooled keep-alive HTTP/1.1 client, `http://` or `https://`.
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// Builds the client; the idle pool keeps `idle` connections per host (the
/// concurrency, so every worker task can keep its connection; 0: a new connection
/// per request). TLS trusts the system's roots, or Mozilla's where the system has
/// none.
pub fn build_client(idle: usize) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.enforce_http(false);
    let tls = match HttpsConnectorBuilder::new().with_native_roots() {
        Ok(b) => b,
        Err(_) => HttpsConnectorBuilder::new().with_webpki_roots(),
    };
    let https = tls.https_or_http().enable_http1().wrap_connector(connector);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(idle)
        .build(https)
}

/// Validates `--url` and returns it without a trailing slash, ready to have workload
/// paths appended.
pub fn normalize_base_url(url: &str) -> Result<String> {
    let uri: Uri = url
        .parse()
        .with_context(|| format!("invalid --url {url:?}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            bail!("invalid --url {url:?}: scheme {other:?} not supported, use http:// or https://")
        }
        None => bail!("invalid --url {url:?}: missing http:// or https:// scheme"),
    }
    if uri.authority().is_none() {
        bail!("invalid --url {url:?}: missing host");
    }
    if uri.query().is_some() {
        bail!("invalid --url {url:?}: must not contain a query");
    }
    Ok(url.trim_end_matches('/').to_string())
}

/// Where requests go and how they are sent.
#[derive(Debug, Clone)]
pub struct Target {
    /// `http(s)://host:port[/prefix]`, as [`normalize_base_url`] returns it.
    pub base: String,
    /// Sent as `Authorization: Bearer <key>` (an OpenAI-compatible API key).
    pub api_key: Option<String>,
    /// Covers the whole exchange, body included.
    pub timeout: Duration,
    /// Sends `x-llm-router-explain`, which asks the router for its decision headers
    /// (by default it puts them only on the responses to requests that ask).
    pub explain: bool,
}

/// Sends one request and records status, timings, worker, decision and usage.
/// `run_start` is when the run began, for the record's start offset.
pub async fn send(
    client: &HttpClient,
    target: &Target,
    item: &WorkItem,
    run_start: Instant,
) -> Record {
    let start = Instant::now();
    let mut rec = Record {
        line: item.line,
        start_ms: ms(start.duration_since(run_start)),
        start_unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
        ..Record::default()
    };
    let timeout = target.timeout;
    let outcome =
        tokio::time::timeout(timeout, exchange(client, target, item, start, &mut rec)).await;
    rec.latency_ms = ms(start.elapsed());
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(e)) => rec.error = Some(e),
        Err(_) => rec.error = Some(format!("timeout after {:.1}s", timeout.as_secs_f64())),
    }
    rec
}

/// The conversation's id, sent with each of its requests.
pub const SESSION_HEADER: &str = "x-session-id";

async fn exchange(
    client: &HttpClient,
    target: &Target,
    item: &WorkItem,
    start: Instant,
    rec: &mut Record,
) -> Result<(), String> {
    let url = format!("{}{}", target.base, item.path);
    let accept = if item.stream {
        "text/event-stream"
    } else {
        "application/json"
    };
    let mut req = Request::post(&url)
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, accept);
    if let Some(key) = &target.api_key {
        req = req.header(AUTHORIZATION, format!("Bearer {key}"));
    }
    if target.explain {
        req = req.header(EXPLAIN_HEADER, "1");
    }
    // What a proxy without this router hashes on (Envoy `ring_hash` on a header).
    // Ids that are no valid header value are not sent rather than failing the request.
    if let Some(session) = item
        .session
        .as_ref()
        .filter(|s| s.bytes().all(|b| b.is_ascii_graphic() || b == b' '))
    {
        req = req.header(SESSION_HEADER, session.as_str());
    }
    let req = req
        .body(Full::new(item.body.clone()))
        .map_err(|e| format!("cannot build request for {url}: {e}"))?;

    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("request failed: {}", error_chain(&e)))?;
    let status = resp.status();
    rec.status = Some(status.as_u16());
    let headers = resp.headers().clone();
    rec.read_decision(|name| headers.get(name).and_then(|v| v.to_str().ok()));
    let header_worker =
        header_str(&headers, WORKER_HEADER).or_else(|| header_str(&headers, ROUTED_WORKER_HEADER));
    let is_sse = item.stream
        || header_str(&headers, CONTENT_TYPE.as_str())
            .is_some_and(|ct| ct.starts_with("text/event-stream"));

    // Read the body frame by frame: SSE is parsed as it arrives, JSON is buffered.
    let mut body = resp.into_body();
    let mut sse = SseParser::new();
    let mut buffered: Vec<u8> = Vec::new();
    let mut last_token_ms = 0.0;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| format!("reading body: {}", error_chain(&e)))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        if data.is_empty() {
            continue;
        }
        let now = start.elapsed();
        if is_sse && rec.ttfb_ms.is_none() {
            rec.ttfb_ms = Some(ms(now));
        }
        if is_sse && status.is_success() {
            let tokens_before = sse.token_events;
            sse.push(&data);
            if sse.token_events > tokens_before {
                match rec.ttft_ms {
                    None => rec.ttft_ms = Some(ms(now)),
                    Some(_) => rec.itl_ms.push(ms(now) - last_token_ms),
                }
                last_token_ms = ms(now);
            }
        } else {
            buffered.extend_from_slice(&data);
        }
    }

    if !status.is_success() {
        rec.worker = header_worker.or_else(|| {
            serde_json::from_slice::<serde_json::Value>(&buffered)
                .ok()
                .and_then(|v| worker_of(&v))
        });
        return Err(format!("HTTP {}: {}", status.as_u16(), snippet(&buffered)));
    }
    let parsed = if is_sse {
        sse.finish()
    } else {
        parse_json_body(&buffered)
    };
    match parsed {
        Ok(facts) => {
            rec.worker = facts.worker.or(header_worker);
            if let Some(u) = facts.usage {
                rec.prompt_tokens = Some(u.prompt_tokens);
                rec.cached_tokens = Some(u.cached_tokens);
            }
            Ok(())
        }
        Err(e) => {
            rec.worker = e.worker.or(header_worker);
            Err(e.reason)
        }
    }
}

fn header_str(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

/// An error with its sources, since hyper's top-level messages ("client error
/// (Connect)") hide the useful part ("Connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_validation() {
        assert_eq!(
            normalize_base_url("http://127.0.0.1:8080/").unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(
            normalize_base_url("http://h:1/prefix").unwrap(),
            "http://h:1/prefix"
        );
        assert!(normalize_base_url("127.0.0.1:8080").is_err());
        assert_eq!(normalize_base_url("https://x/").unwrap(), "https://x");
        assert!(normalize_base_url("ftp://x").is_err());
        assert!(normalize_base_url("http://").is_err());
        assert!(normalize_base_url("not a url").is_err());
    }
}
