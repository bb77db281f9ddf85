//! The filter's replicas endpoint, as the bridge calls it over plain HTTP on the
//! loopback listener: export this replica's operations, import a peer's batch.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// Larger answers are not the filter's (its batches stay under its stats limit).
const MAX_ANSWER_BYTES: usize = 8 << 20;
const TIMEOUT: Duration = Duration::from_secs(5);

/// One exported batch.
#[derive(Debug, Clone)]
pub struct Export {
    /// The cursor to ask from next time.
    pub next: u64,
    /// Operations in the batch.
    pub ops: usize,
    /// The batch, as published.
    pub body: Bytes,
}

#[derive(Clone)]
pub struct Envoy {
    client: Client<HttpConnector, Full<Bytes>>,
    url: String,
    auth: String,
}

impl Envoy {
    pub fn new(url: &str, token: &str) -> Envoy {
        Envoy {
            client: Client::builder(TokioExecutor::new()).build_http(),
            url: url.to_string(),
            auth: format!("Bearer {token}"),
        }
    }

    async fn call(
        &self,
        req: hyper::Request<Full<Bytes>>,
    ) -> Result<(hyper::http::response::Parts, Bytes), String> {
        let send = async {
            let resp = self.client.request(req).await.map_err(|e| format!("{e}"))?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, MAX_ANSWER_BYTES)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            Ok::<_, String>((parts, body))
        };
        let (parts, body) = tokio::time::timeout(TIMEOUT, send)
            .await
            .map_err(|_| format!("no answer within {} s", TIMEOUT.as_secs()))??;
        if !parts.status.is_success() {
            return Err(format!(
                "HTTP {}: {}",
                parts.status.as_u16(),
                String::from_utf8_lossy(&body[..body.len().min(512)]).trim()
            ));
        }
        Ok((parts, body))
    }

    /// This replica's own operations after `after`.
    pub async fn export(&self, after: u64) -> Result<Export, String> {
        let req = hyper::Request::get(format!("{}?after={after}", self.url))
            .header(hyper::header::AUTHORIZATION, &self.auth)
            .body(Full::new(Bytes::new()))
            .map_err(|e| e.to_string())?;
        let (parts, body) = self.call(req).await?;
        let header = |name: &str| -> Result<u64, String> {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| {
                    format!("the answer has no `{name}`: is --envoy-url the replicas endpoint?")
                })
        };
        Ok(Export {
            next: header("x-llm-router-next")?,
            ops: header("x-llm-router-ops")? as usize,
            body,
        })
    }

    /// Posts peer `replica`'s batch; a replay brings its operations only.
    pub async fn import(&self, replica: &str, replay: bool, batch: Bytes) -> Result<(), String> {
        let replay = if replay { "&replay=1" } else { "" };
        let req = hyper::Request::post(format!("{}?replica={replica}{replay}", self.url))
            .header(hyper::header::AUTHORIZATION, &self.auth)
            .header(hyper::header::CONTENT_TYPE, "application/octet-stream")
            .body(Full::new(batch))
            .map_err(|e| e.to_string())?;
        self.call(req).await.map(|_| ())
    }
}
