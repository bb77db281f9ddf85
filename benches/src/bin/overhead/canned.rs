//! The benchmark's engines: every request is read to its end and answered at once
//! with the same one-token chat completion, on one thread of their own.
//!
//! The engine mock (`engine/mock`) parses each body, looks it up in a paged prefix
//! cache and keeps Prometheus metrics: four of them took about 1.2 of this 2-core
//! machine's cores at 2,300 requests a second, three times Envoy's own CPU, and
//! Envoy's time per request then measured the contention more than the filter.
//! Answered here, the engines cost a few percent of a core.

use std::net::{SocketAddr, TcpListener};
use std::thread::JoinHandle;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use llm_load::fleet::worker_name;
use tokio::sync::oneshot;

/// What every request gets: a chat completion of one token, with the usage the
/// load tool counts a request successful by.
const ANSWER: &str = concat!(
    r#"{"id":"cmpl-canned","object":"chat.completion","created":0,"model":"mock","#,
    r#""choices":[{"index":0,"message":{"role":"assistant","content":"tok0"},"#,
    r#""finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"#,
    r#""total_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}"#
);

/// `kv_match`'s collector for `workers` workers (`w0`..): every prompt of 64
/// tokens, each engine's index whole and holding none of it, so the filter makes
/// the call, reads the answer, and decides by its tree.
pub fn collector_answer(workers: usize) -> String {
    let engines: Vec<String> = (0..workers)
        .map(|i| {
            format!(
                r#""{}":{{"index":"whole","held_blocks":0}}"#,
                worker_name(i)
            )
        })
        .collect();
    format!(
        r#"{{"tokens":64,"block_tokens":16,"blocks":4,"engines":{{{}}}}}"#,
        engines.join(",")
    )
}

/// Engines listening on loopback until dropped.
pub struct Canned {
    pub addrs: Vec<SocketAddr>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Canned {
    /// `n` engines, each on a port of its own.
    pub fn start(n: usize) -> Result<Canned> {
        Canned::answering(n, ANSWER.to_string())
    }

    /// `n` servers answering every request with `answer` (JSON).
    pub fn answering(n: usize, answer: String) -> Result<Canned> {
        let listeners = (0..n.max(1))
            .map(|_| {
                let l = TcpListener::bind("127.0.0.1:0").context("bind an engine's port")?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .collect::<Result<Vec<_>>>()?;
        let addrs = listeners
            .iter()
            .map(TcpListener::local_addr)
            .collect::<std::io::Result<_>>()?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("canned-engines".into())
            .spawn(move || rt.block_on(serve(listeners, Bytes::from(answer), stopped)))?;
        Ok(Canned {
            addrs,
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Canned {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Accepts on every listener until `stopped`; connections end with the runtime.
async fn serve(listeners: Vec<TcpListener>, body: Bytes, stopped: oneshot::Receiver<()>) {
    for l in listeners {
        let Ok(l) = tokio::net::TcpListener::from_std(l) else {
            continue;
        };
        let body = body.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = l.accept().await {
                let _ = stream.set_nodelay(true);
                let body = body.clone();
                let service = service_fn(move |req| answer(req, body.clone()));
                tokio::spawn(async move {
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
    }
    let _ = stopped.await;
}

/// Reads the request to its end (the connection is reused) and answers it.
async fn answer(
    req: Request<Incoming>,
    body: Bytes,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    req.into_body().collect().await?;
    let mut resp = Response::new(Full::new(body));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}
