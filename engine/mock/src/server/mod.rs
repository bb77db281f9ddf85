//! The HTTP server: routing, admission and response shapes; the per-request generation
//! task is `generation`'s.
//!
//! Each completion request is handed to its own task that waits for a slot, consults the prefix
//! cache, sleeps the simulated prefill time and then produces tokens into a channel. The HTTP
//! response is returned once the first piece of output exists, so the time to response headers
//! tracks the simulated TTFT for both streaming and non-streaming requests. The task stops as
//! soon as the receiving side is gone (client disconnected), dropping its slot with it.

use crate::cache::{BlockHash, CacheLookup, PrefixCache};
use crate::config::{Config, Role, MAX_OUTPUT_TOKENS};
use crate::kv_events::{self, KvEvents};
use crate::metrics::{self, Registry, Snapshot};
use crate::pd::{self, Rooms, Transfer};
use crate::prompt::Endpoint;
use crate::prompting::Prompting;
use crate::slots::Slots;
use anyhow::Context as _;
use bytes::Bytes;
use engine_model::computing::Computing;
use engine_model::latency::Latency;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CACHE_CONTROL, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

mod generation;

use generation::{run_job, ChannelBody, Job};

/// Response header naming the worker that served the request.
pub const WORKER_HEADER: &str = "x-engine-worker";
/// Decode role: the prefill engine whose KV the request used.
pub const PREFILL_WORKER_HEADER: &str = "x-engine-prefill-worker";

/// Request bodies larger than this are rejected; generous for long-prefix tests.
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// Response body type: either a buffered body or the streamed channel body.
pub type Body = UnsyncBoxBody<Bytes, Infallible>;

/// An `f64` that can be changed at run time (`/admin/latency`) without a lock.
#[derive(Debug)]
struct AtomicF64(AtomicU64);

impl AtomicF64 {
    fn new(v: f64) -> Self {
        Self(AtomicU64::new(v.to_bits()))
    }
    fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
    fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
}

/// Shared server state.
#[derive(Debug)]
pub struct State {
    cfg: Config,
    worker_header: HeaderValue,
    ttft_ms: AtomicF64,
    decode_ms_per_token: AtomicF64,
    prefill_us_per_token: AtomicF64,
    cache: Mutex<PrefixCache>,
    /// The cached blocks whose prefill is not done yet, in ms since `epoch`.
    computing: Mutex<Computing>,
    epoch: Instant,
    registry: Mutex<Registry>,
    slots: Slots,
    next_id: AtomicU64,
    /// Prefill role: rooms published for decode engines.
    rooms: Arc<Rooms>,
    /// `--kv-events-endpoint`: the cache's changes, published.
    kv_events: Option<KvEvents>,
    /// How prompts are read (`--tokenizer`).
    prompting: Prompting,
}

impl State {
    /// Builds the state; fails if the worker id cannot be sent as a header value.
    pub fn new(cfg: Config) -> anyhow::Result<Self> {
        let worker_header = HeaderValue::from_str(&cfg.worker_id)
            .context("--worker-id must be a valid HTTP header value")?;
        Ok(Self {
            worker_header,
            ttft_ms: AtomicF64::new(cfg.ttft_ms),
            decode_ms_per_token: AtomicF64::new(cfg.decode_ms_per_token),
            prefill_us_per_token: AtomicF64::new(cfg.prefill_us_per_token),
            cache: Mutex::new(PrefixCache::new(cfg.cache_blocks, cfg.block_chars as usize)),
            computing: Mutex::new(Computing::default()),
            epoch: Instant::now(),
            registry: Mutex::new(Registry::default()),
            slots: Slots::new(cfg.max_running),
            next_id: AtomicU64::new(0),
            rooms: Arc::new(Rooms::default()),
            kv_events: None,
            prompting: Prompting::new(cfg.tokenizer.as_deref(), cfg.chat_template.as_deref())
                .context("--tokenizer")?,
            cfg,
        })
    }

    /// The prefix cache consulted for `prompt`, its changes published if events are
    /// on; with the prompt's full blocks.
    fn lookup_and_insert(&self, prompt: &str) -> (CacheLookup, Vec<BlockHash>) {
        match &self.kv_events {
            Some(kv) => kv.lookup_and_insert(&self.cache, prompt),
            None => lock(&self.cache).lookup_and_insert_blocks(prompt),
        }
    }

    /// Looks `prompt` up: the lookup, and the ms until its first token. Its
    /// uncached blocks are booked as computing until then, and it waits for a
    /// cached prefix another request is still computing
    /// (`engine_model::computing`); with `--no-prefix-wait`, neither.
    fn start_prefill(&self, prompt: &str, latency: &Latency) -> (CacheLookup, f64) {
        if !self.cfg.prefix_wait {
            let (lookup, _) = self.lookup_and_insert(prompt);
            return (lookup, latency.prefill_ms(&lookup));
        }
        // Held across the lookup: a request that finds these blocks cached must
        // find them booked too.
        let mut computing = lock(&self.computing);
        let now_ms = self.epoch.elapsed().as_secs_f64() * 1000.0;
        let (lookup, blocks) = self.lookup_and_insert(prompt);
        let first_token_ms = computing.first_token(
            (now_ms, now_ms),
            (&blocks, lookup.matched_blocks),
            latency.prefill_ms(&lookup),
        );
        (lookup, first_token_ms - now_ms)
    }

    /// Empties the prefix cache (`AllBlocksCleared` if events are on).
    fn reset_prefix_cache(&self) {
        match &self.kv_events {
            Some(kv) => kv.clear(&self.cache),
            None => lock(&self.cache).clear(),
        }
    }

    fn snapshot(&self) -> Snapshot {
        let (kv_usage, cache_blocks, block_tokens, cache_query_tokens, cache_hit_tokens) = {
            let c = lock(&self.cache);
            let (usage, blocks, tokens) = (c.usage(), c.capacity(), c.block_tokens());
            (usage, blocks, tokens, c.query_tokens(), c.hit_tokens())
        };
        Snapshot {
            waiting: self.slots.waiting(),
            running: self.slots.running(),
            kv_usage,
            cache_blocks,
            block_tokens,
            cache_query_tokens,
            cache_hit_tokens,
            registry: lock(&self.registry).clone(),
        }
    }
}

/// A poisoned lock only means another request panicked mid-update of plain counters; the data
/// is still usable, so keep serving rather than cascading the panic.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Binds, prints the `listening` line, and serves until SIGTERM/SIGINT.
pub async fn run(cfg: Config) -> anyhow::Result<()> {
    let mut state = State::new(cfg)?;
    let mut kv = String::new();
    if let Some(bound) = kv_events::spawn(&state.cfg, state.prompting.ids_of()).await? {
        kv = format!(" kv-events {}", bound.endpoint);
        if let Some(replay) = &bound.replay_endpoint {
            kv.push_str(&format!(" kv-events-replay {replay}"));
        }
        state.kv_events = Some(bound.events);
    }
    let state = Arc::new(state);
    let listener = TcpListener::bind((state.cfg.host.as_str(), state.cfg.port))
        .await
        .with_context(|| format!("binding {}:{}", state.cfg.host, state.cfg.port))?;
    let addr = listener.local_addr()?;
    let bootstrap = match state.cfg.role {
        Role::Prefill => {
            let l = TcpListener::bind((state.cfg.host.as_str(), state.cfg.bootstrap_port))
                .await
                .with_context(|| {
                    format!(
                        "binding the bootstrap server on {}:{}",
                        state.cfg.host, state.cfg.bootstrap_port
                    )
                })?;
            let at = l.local_addr()?;
            tokio::spawn(serve_bootstrap(l, state.rooms.clone()));
            format!(" bootstrap {}:{}", at.ip(), at.port())
        }
        Role::Regular | Role::Decode => String::new(),
    };
    // Install signal handlers before announcing readiness so a test that signals right after
    // reading the port line cannot kill us uncleanly.
    let shutdown = shutdown_signal()?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(
            out,
            "engine-mock {}{bootstrap}{kv} listening on {}:{}",
            state.cfg.worker_id,
            addr.ip(),
            addr.port()
        )?;
        out.flush()?;
    }
    serve(listener, state, shutdown).await
}

/// The prefill role's bootstrap server; it lives as long as the process.
async fn serve_bootstrap(listener: TcpListener, rooms: Arc<Rooms>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let rooms = rooms.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let rooms = rooms.clone();
                async move { Ok::<_, Infallible>(pd::bootstrap_handle(rooms, req).await) }
            });
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// Resolves on SIGTERM or SIGINT. Handlers are registered when this is called.
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        Ok(async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
    }
    #[cfg(not(unix))]
    {
        Ok(async {
            let _ = tokio::signal::ctrl_c().await;
        })
    }
}

/// Accepts connections on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: TcpListener,
    state: Arc<State>,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return Ok(()),
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Typically EMFILE; back off instead of spinning.
                        eprintln!("engine-mock: accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| handle(state.clone(), req));
                    // Connection errors (client resets) are routine for a test server.
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    }
}

/// Routes one request and stamps the worker header on whatever comes back.
pub async fn handle(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let mut resp = route(&state, req).await;
    resp.headers_mut()
        .insert(WORKER_HEADER, state.worker_header.clone());
    Ok(resp)
}

async fn route(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    match (&method, path.as_str()) {
        (&Method::POST, "/v1/chat/completions") => completion(state, Endpoint::Chat, req).await,
        (&Method::POST, "/v1/completions") => completion(state, Endpoint::Completions, req).await,
        (&Method::POST, "/generate") => completion(state, Endpoint::Generate, req).await,
        (&Method::GET, "/health") => text(StatusCode::OK, "text/plain; charset=utf-8", "ok"),
        (&Method::GET, "/metrics") => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            metrics::render(state.cfg.metrics_style, &state.snapshot()),
        ),
        (&Method::GET, "/v1/models") => json_response(
            StatusCode::OK,
            &json!({
                "object": "list",
                "data": [{"id": "mock", "object": "model", "created": unix_now(), "owned_by": "engine-mock"}],
            }),
        ),
        (&Method::POST, "/admin/latency") => admin_latency(state, req).await,
        // vLLM's `POST /reset_prefix_cache` (dev mode), under the mock's admin prefix.
        (&Method::POST, "/admin/reset_prefix_cache") => {
            state.reset_prefix_cache();
            json_response(
                StatusCode::OK,
                &json!({"success": true, "worker": state.cfg.worker_id}),
            )
        }
        _ => error_response(
            StatusCode::NOT_FOUND,
            "not_found_error",
            &format!("no route for {method} {path}"),
        ),
    }
}

fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut resp = Response::new(Full::new(body.into()).boxed_unsync());
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

fn json_response(status: StatusCode, v: &Value) -> Response<Body> {
    text(status, "application/json", v.to_string())
}

/// OpenAI-style error body.
fn error_response(status: StatusCode, kind: &str, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": kind, "code": status.as_u16()}}),
    )
}

fn bad_request(message: &str) -> Response<Body> {
    error_response(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// Reads the body as a JSON object, or produces the 400 to send instead.
async fn read_json(req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let bytes = match Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => collected.to_bytes(),
        Err(e) => return Err(bad_request(&format!("could not read request body: {e}"))),
    };
    let v: Value = serde_json::from_slice(&bytes)
        .map_err(|e| bad_request(&format!("request body is not valid JSON: {e}")))?;
    if v.is_object() {
        Ok(v)
    } else {
        Err(bad_request("request body must be a JSON object"))
    }
}

async fn admin_latency(state: &Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let body = match read_json(req).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let fields = [
        ("ttft_ms", &state.ttft_ms),
        ("decode_ms_per_token", &state.decode_ms_per_token),
        ("tpot_ms", &state.decode_ms_per_token),
        ("prefill_us_per_token", &state.prefill_us_per_token),
    ];
    // Validate everything before applying anything, so a bad request changes nothing.
    let mut updates = Vec::new();
    for (name, slot) in fields {
        match body.get(name) {
            None | Some(Value::Null) => {}
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x >= 0.0 => updates.push((slot, x)),
                _ => return bad_request(&format!("'{name}' must be a number >= 0")),
            },
        }
    }
    for (slot, x) in updates {
        slot.set(x);
    }
    json_response(
        StatusCode::OK,
        &json!({
            "ttft_ms": state.ttft_ms.get(),
            "decode_ms_per_token": state.decode_ms_per_token.get(),
            "tpot_ms": state.decode_ms_per_token.get(),
            "prefill_us_per_token": state.prefill_us_per_token.get(),
            "worker": state.cfg.worker_id,
        }),
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Output tokens requested by the body, else the configured default; always 1..=64.
fn requested_tokens(endpoint: Endpoint, body: &Value, default: u32) -> u32 {
    let requested = match endpoint {
        Endpoint::Chat | Endpoint::Completions => body
            .get("max_completion_tokens")
            .and_then(Value::as_u64)
            .or_else(|| body.get("max_tokens").and_then(Value::as_u64)),
        Endpoint::Generate => body
            .pointer("/sampling_params/max_new_tokens")
            .and_then(Value::as_u64),
    };
    let n = requested.map_or(default, |n| n.min(u64::from(MAX_OUTPUT_TOKENS)) as u32);
    n.clamp(1, MAX_OUTPUT_TOKENS)
}

async fn completion(
    state: &Arc<State>,
    endpoint: Endpoint,
    req: Request<Incoming>,
) -> Response<Body> {
    let arrived = Instant::now();
    let body = match read_json(req).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let prompt = match state.prompting.prompt(endpoint, &body) {
        Ok(p) => p,
        Err(e) => return bad_request(&e.0),
    };
    let (publish, kv) = match pd_role(state, &body).await {
        Ok(v) => v,
        Err(resp) => return resp,
    };
    let prefill_worker = kv.as_ref().map(|t| t.prefill_worker.clone());
    let n = state.next_id.fetch_add(1, Ordering::Relaxed);
    let job = Job {
        endpoint,
        prompt,
        stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
        // A prefill engine stops at the first token: decode generates the rest.
        output_tokens: if publish.is_empty() {
            requested_tokens(endpoint, &body, state.cfg.output_tokens)
        } else {
            1
        },
        model: body
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("mock")
            .to_string(),
        id: format!("cmpl-{}-{n}", state.cfg.worker_id),
        created: unix_now(),
        arrived,
        publish,
        kv,
    };
    let stream = job.stream;
    let (tx, mut rx) = mpsc::channel::<Bytes>(16);
    tokio::spawn(run_job(state.clone(), job, tx));

    // Wait for the first output so response headers go out at "first token" time.
    let Some(first) = rx.recv().await else {
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_error",
            "generation ended without output",
        );
    };
    let mut resp = if stream {
        let mut resp = Response::new(
            ChannelBody {
                first: Some(first),
                rx,
            }
            .boxed_unsync(),
        );
        let h = resp.headers_mut();
        h.insert(CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        resp
    } else {
        let mut resp = Response::new(Full::new(first).boxed_unsync());
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        resp
    };
    if let Some(v) = prefill_worker.and_then(|w| HeaderValue::from_str(&w).ok()) {
        resp.headers_mut().insert(PREFILL_WORKER_HEADER, v);
    }
    resp
}

/// What the engine's PD role needs before generating: a prefill engine the rooms to
/// publish, a decode engine the KV of every room (fetched from the prefill engines
/// the body names). A regular engine needs nothing.
async fn pd_role(
    state: &State,
    body: &Value,
) -> Result<(Vec<u64>, Option<Transfer>), Response<Body>> {
    if state.cfg.role == Role::Regular {
        return Ok((Vec::new(), None));
    }
    let targets = pd::bootstrap_of(body).map_err(|e| bad_request(&e))?;
    if state.cfg.role == Role::Prefill {
        return Ok((targets.iter().map(|b| b.room).collect(), None));
    }
    let wait = Duration::from_millis(state.cfg.kv_wait_ms);
    let mut got: Option<Transfer> = None;
    for target in &targets {
        match pd::fetch(target, wait).await {
            // A batch's usage is the sum over its prompts.
            Ok(t) => {
                got = Some(match got {
                    None => t,
                    Some(acc) => Transfer {
                        prompt_tokens: acc.prompt_tokens + t.prompt_tokens,
                        cached_tokens: acc.cached_tokens + t.cached_tokens,
                        ..acc
                    },
                })
            }
            Err(e) => {
                lock(&state.registry).pd_kv_failures += 1;
                return Err(error_response(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "kv_transfer_failed",
                    &e,
                ));
            }
        }
    }
    lock(&state.registry).pd_pairs += targets.len() as u64;
    Ok((Vec::new(), got))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_token_limits() {
        let d = 8;
        assert_eq!(requested_tokens(Endpoint::Chat, &json!({}), d), 8);
        assert_eq!(
            requested_tokens(Endpoint::Chat, &json!({"max_tokens": 3}), d),
            3
        );
        assert_eq!(
            requested_tokens(
                Endpoint::Chat,
                &json!({"max_completion_tokens": 5, "max_tokens": 3}),
                d
            ),
            5
        );
        assert_eq!(
            requested_tokens(Endpoint::Completions, &json!({"max_tokens": 1000}), d),
            64
        );
        assert_eq!(
            requested_tokens(Endpoint::Completions, &json!({"max_tokens": 0}), d),
            1
        );
        assert_eq!(
            requested_tokens(
                Endpoint::Generate,
                &json!({"sampling_params": {"max_new_tokens": 2}}),
                d
            ),
            2
        );
        assert_eq!(requested_tokens(Endpoint::Chat, &json!({}), 500), 64);
    }

    #[test]
    fn rejects_bad_worker_id() {
        use clap::Parser;
        let cfg = Config::parse_from(["engine-mock", "--worker-id", "bad\nid"]);
        assert!(State::new(cfg).is_err());
    }
}
