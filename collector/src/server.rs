//! The `--listen` server: the collector's own health and metrics
//! (`crate::telemetry`) and, when it follows the engines' KV events with a
//! tokenizer (`--kv-events`, `--kv-tokenizer`), `POST /kv/match?path=PATH` with a
//! request's body: which engines hold its prompt (`crate::kv_match`), as JSON.

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::kv_events::KvIndexes;
use crate::kv_match::Matcher;
use crate::telemetry::{self, Telemetry};

/// The largest request body `/kv/match` reads: the largest prompt a router sends.
pub const MAX_MATCH_BODY: usize = 64 << 20;

/// What the server answers from.
pub struct Served {
    pub telemetry: Arc<Telemetry>,
    /// `None` without `--kv-events` and `--kv-tokenizer`: `/kv/match` is 404.
    pub kv: Option<(Matcher, KvIndexes)>,
}

fn json(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    json(status, serde_json::json!({ "error": message }).to_string())
}

/// The `path` query parameter: the request's own path.
fn query_path(query: Option<&str>) -> Option<String> {
    query?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=')?;
        (k == "path").then(|| v.replace("%2F", "/").replace("%2f", "/"))
    })
}

/// Answers `POST /kv/match`.
async fn kv_match(served: &Served, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let Some((matcher, indexes)) = &served.kv else {
        return error(
            StatusCode::NOT_FOUND,
            "this collector matches no prompts: start it with --kv-events and --kv-tokenizer",
        );
    };
    if req.method() != Method::POST {
        return error(StatusCode::METHOD_NOT_ALLOWED, "only POST");
    }
    let Some(path) = query_path(req.uri().query()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "the request's path is the `path` query parameter, e.g. ?path=/v1/chat/completions",
        );
    };
    let body = match Limited::new(req.into_body(), MAX_MATCH_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(e) => return error(StatusCode::PAYLOAD_TOO_LARGE, &e.to_string()),
    };
    let answer = {
        let Ok(indexes) = indexes.lock() else {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the KV indexes are poisoned",
            );
        };
        matcher.answer(&path, &body, &indexes)
    };
    match answer {
        Ok(m) => json(
            StatusCode::OK,
            serde_json::to_string(&m).unwrap_or_default(),
        ),
        Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
    }
}

async fn handle(served: Arc<Served>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.uri().path() == "/kv/match" {
        return kv_match(&served, req).await;
    }
    telemetry::respond(&served.telemetry, req.method(), req.uri().path())
}

/// Serves `listener` until the process ends. Runs on its own tasks, so it answers
/// (503 "stalled") even if the loop is stuck.
pub fn serve(listener: TcpListener, served: Arc<Served>) {
    tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "--listen: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let served = served.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let served = served.clone();
                    async move { Ok::<_, std::convert::Infallible>(handle(served, req).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(Duration::from_secs(10))
                    .serve_connection(TokioIo::new(stream), service)
                    .await
                {
                    tracing::debug!(%peer, error = %e, "--listen: connection ended with an error");
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_path_comes_from_the_query() {
        assert_eq!(
            query_path(Some("path=/v1/chat/completions")),
            Some("/v1/chat/completions".into())
        );
        assert_eq!(
            query_path(Some("x=1&path=%2Fgenerate")),
            Some("/generate".into())
        );
        assert_eq!(query_path(Some("paths=/x")), None);
        assert_eq!(query_path(None), None);
    }
}
