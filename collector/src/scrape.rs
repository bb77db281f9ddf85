//! HTTP GET with a hard timeout, shared by engine scrapes and Envoy admin reads.
//!
//! One pooled HTTP/1 client serves every request so that steady-state scrapes reuse
//! keep-alive connections instead of opening one socket per engine per second.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::StatusCode;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The shared client type (requests carry a buffered body: empty for GETs).
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Larger responses are refused: a real engine's /metrics is tens of KiB, and a
/// runaway endpoint must not make the collector buffer without bound.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

pub fn client() -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        // Idle connections outliving an engine restart would only produce one
        // spurious error; keep them short anyway.
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// A short, operator-readable cause: "connection refused" rather than hyper's
/// nested "client error (Connect)".
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut last = err.to_string();
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                std::io::ErrorKind::ConnectionReset => "connection reset".to_string(),
                _ => io.to_string(),
            };
        }
        last = e.to_string();
        cur = e.source();
    }
    last
}

/// GETs `url` and returns the body as text. Errors are strings meant for the
/// snapshot's `error` field and the log.
pub async fn get_text(client: &HttpClient, url: &str, timeout: Duration) -> Result<String, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
    let req = hyper::Request::get(uri)
        .header(hyper::header::ACCEPT, "text/plain, application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("bad request: {e}"))?;
    let fetch = async {
        let resp = client.request(req).await.map_err(|e| describe(&e))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading body: {e}"))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(format!("HTTP {}", status.as_u16()));
        }
        String::from_utf8(body.to_vec()).map_err(|_| "body is not UTF-8".to_string())
    };
    match tokio::time::timeout(timeout, fetch).await {
        Ok(r) => r,
        Err(_) => Err(format!("timeout after {} ms", timeout.as_millis())),
    }
}
