//! One HTTP stream: strip client routing headers, buffer the body, decide at end of
//! stream, set the routing header, clear the route cache, and count the request in
//! flight until the stream ends (however it ends).

use std::time::Duration;

use super::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};

use super::host::{self, HostRandom, HostStore};
use super::root::{Shared, State, SAMPLES_KEY};
use crate::config::{Config, Target, WorkerConfig};
use crate::decision::Decision;
use crate::load::{encode_table, parse_push, token_matches, PushError};
use crate::pd::{self, Bootstrap, PrefillFailure};
use crate::request::{self, Parsed, Unreadable};
use crate::router::{Loads, NoWorker};
use crate::sync::{Op, SetOutcome, SharedStore};

pub const WORKER_HEADER: &str = "x-llm-router-worker";
pub const DECISION_HEADER: &str = "x-llm-router-decision";
pub const REASON_HEADER: &str = "x-llm-router-reason";
/// PD: the prefill worker of the pair (`x-llm-router-worker` names the decode one).
pub const PREFILL_WORKER_HEADER: &str = "x-llm-router-prefill-worker";
/// PD: why the decode worker was chosen (`x-llm-router-reason` is the prefill's).
pub const DECODE_REASON_HEADER: &str = "x-llm-router-decode-reason";
/// Prefill error bodies quoted back to the client, at most this many bytes.
const PREFILL_ERROR_QUOTE_BYTES: usize = 512;

/// An in-flight count held on a worker, by name: counts are keyed by name, so one is
/// released correctly even if a config update reorders the workers meanwhile.
struct Held {
    worker: String,
    counted: bool,
}

impl Held {
    fn take(state: &State, worker: &str) -> Held {
        Held {
            worker: worker.to_string(),
            counted: state.shared.inflight.add(&HostStore, worker, 1),
        }
    }

    /// Gives the count back, at most once.
    fn release(&mut self, state: &State) {
        if std::mem::take(&mut self.counted) {
            state.shared.inflight.add(&HostStore, &self.worker, -1);
        }
    }
}

/// PD: the prefill copy, sent with `dispatch_http_call` alongside the main request.
struct PrefillLeg {
    decision: Decision,
    held: Held,
    token: u32,
}

/// What a routed stream chose: the worker that gets the request itself (regular or
/// decode) and, in PD mode, the prefill leg.
struct Routed {
    decision: Decision,
    held: Held,
    prefill: Option<PrefillLeg>,
}

/// What routing decided for one stream, before any of it is applied.
struct Plan {
    main: Decision,
    /// PD: the prefill decision and the body both engines get.
    prefill: Option<(Decision, Vec<u8>)>,
    records: Vec<Op>,
}

/// A request refused before it went anywhere.
struct Refusal {
    status: u32,
    reason: &'static str,
}

pub struct Stream {
    state: Shared,
    path: String,
    /// An authorised stats push from the collector, answered by the filter itself.
    push: bool,
    /// Set once a worker was chosen; its counts are released when the stream ends.
    routed: Option<Routed>,
    /// The filter answered the client itself after routing (a failed prefill).
    replied: bool,
    /// Response headers went to the client: too late for a local reply.
    response_started: bool,
}

/// Decides where the request goes (and, in PD mode, rewrites its body), without
/// touching the stream.
fn plan(state: &mut State, path: &str, parsed: &Parsed, body: &[u8]) -> Result<Plan, Refusal> {
    let no_worker = |e: NoWorker| Refusal {
        status: 503,
        reason: e.as_str(),
    };
    let inflight = state.inflight();
    let engine = state.engine_loads();
    let overloaded = super::overload::overloaded(state.router.config());
    let loads = Loads {
        inflight: &inflight,
        engine: &engine,
        now_ms: host::now_ms(),
        overloaded: &overloaded,
    };
    if !state.router.config().is_pd() {
        let routed = state
            .router
            .route(parsed, &loads, &mut state.rng)
            .map_err(no_worker)?;
        if routed.gate_inert {
            state.note_gate_inert();
        }
        if routed.owner_overloaded {
            state.metrics.overload_owner_filtered.inc();
        }
        return Ok(Plan {
            main: routed.decision,
            prefill: None,
            records: routed.record.into_iter().collect(),
        });
    }
    let pair = state
        .router
        .route_pd(parsed, &loads, &mut state.rng)
        .map_err(no_worker)?;
    if pair.prefill.gate_inert || pair.decode.gate_inert {
        state.note_gate_inert();
    }
    if pair.prefill.owner_overloaded || pair.decode.owner_overloaded {
        state.metrics.overload_owner_filtered.inc();
    }
    let records = [pair.prefill.record, pair.decode.record]
        .into_iter()
        .flatten()
        .collect();
    // A request without a body (`GET /v1/models`) has no prompt to prefill.
    if matches!(
        parsed,
        Parsed::Unroutable {
            reason: Unreadable::EmptyBody,
            ..
        }
    ) {
        return Ok(Plan {
            main: pair.decode.decision,
            prefill: None,
            records,
        });
    }
    let cfg = state.router.config();
    let bootstrap = cfg
        .workers
        .get(pair.prefill.decision.worker as usize)
        .and_then(|w| {
            Some(Bootstrap {
                host: w.bootstrap_host()?,
                port: w.bootstrap_port?,
            })
        })
        .ok_or(Refusal {
            status: 503,
            reason: "prefill_without_bootstrap",
        })?;
    let rewritten = pd::inject_bootstrap(
        path,
        body,
        bootstrap,
        &mut HostRandom {
            fallback: &mut state.rng,
        },
    )
    .map_err(|e| Refusal {
        status: 400,
        reason: e.as_str(),
    })?;
    Ok(Plan {
        main: pair.decode.decision,
        prefill: Some((pair.prefill.decision, rewritten.body)),
        records,
    })
}

/// Headers of the prefill copy: the client's, minus hop-by-hop, length and routing
/// headers (Envoy sets the length of the call's body itself).
fn prefill_headers(cfg: &Config) -> Vec<(String, String)> {
    let skip = |name: &str| {
        name.starts_with(':')
            || name.starts_with("x-envoy-")
            || name == cfg.cluster_header
            || name == cfg.endpoint_header
            || matches!(
                name,
                "content-length"
                    | "transfer-encoding"
                    | "connection"
                    | "keep-alive"
                    | "upgrade"
                    | "te"
                    | "expect"
                    | "proxy-connection"
            )
    };
    hostcalls::get_map(MapType::HttpRequestHeaders)
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| !skip(name))
        .collect()
}

impl Stream {
    pub fn new(state: Shared) -> Stream {
        Stream {
            state,
            path: String::new(),
            push: false,
            routed: None,
            replied: false,
            response_started: false,
        }
    }

    /// Routes the request: on success the routing header is set and the stream may
    /// continue; on failure a local reply is sent and the stream must stay paused.
    fn route(&mut self, body: &[u8]) -> Action {
        let parsed = request::parse(&self.path, body);
        let mut slot = self.state.borrow_mut();
        let Some(state) = slot.as_mut() else {
            drop(slot);
            return reply_503("not_configured");
        };
        if let Parsed::Unroutable { reason, .. } = &parsed {
            state.metrics.unreadable.inc();
            host::log(
                LogLevel::Debug,
                &format!("llm-router: routing by load: {}", reason.as_str()),
            );
        }
        // See every prefix any thread routed, every thread's load, and the engines'.
        state.catch_up();
        let plan = match plan(state, &self.path, &parsed, body) {
            Ok(p) => p,
            Err(refusal) => {
                if refusal.status == 503 {
                    state.metrics.no_worker.inc();
                }
                drop(slot);
                return reply_error(refusal.status, refusal.reason);
            }
        };
        let cfg = state.router.config();
        let Some(worker) = cfg.workers.get(plan.main.worker as usize) else {
            drop(slot);
            return reply_503("unknown_worker");
        };
        let (header, value) = match cfg.target {
            Target::Cluster => (cfg.cluster_header.as_str(), worker.cluster()),
            Target::Endpoint => (
                cfg.endpoint_header.as_str(),
                worker.address.as_deref().unwrap_or_default(),
            ),
        };
        if let Err(e) = hostcalls::set_map_value(MapType::HttpRequestHeaders, header, Some(value)) {
            host::log(
                LogLevel::Error,
                &format!("llm-router: cannot set {header}: {e:?}"),
            );
            drop(slot);
            return reply_503("header_rejected");
        }
        let prefill = match &plan.prefill {
            None => None,
            Some((decision, new_body)) => {
                let sent = cfg
                    .workers
                    .get(decision.worker as usize)
                    .ok_or("unknown_worker")
                    .and_then(|w| {
                        let token = send_prefill(cfg, w, &self.path, body.len(), new_body)?;
                        Ok((w, token))
                    });
                match sent {
                    Ok((w, token)) => Some(PrefillLeg {
                        decision: *decision,
                        held: Held::take(state, &w.name),
                        token,
                    }),
                    Err(reason) => {
                        state.metrics.pd_prefill_failures.inc();
                        drop(slot);
                        return reply_error(503, reason);
                    }
                }
            }
        };
        let held = Held::take(state, &worker.name);
        match &prefill {
            Some(leg) => {
                // The prefill pool holds the prompt cache: its decision is the
                // request's label; the decode pool's gate work is still counted.
                state.metrics.decision(&leg.decision);
                state.metrics.gate(&plan.main);
                state.metrics.pd_pairs.inc();
            }
            None => state.metrics.decision(&plan.main),
        }
        for op in plan.records {
            state.record(op);
        }
        self.routed = Some(Routed {
            decision: plan.main,
            held,
            prefill,
        });
        drop(slot);
        // The route was chosen before the header existed; make Envoy look again.
        if let Err(e) = hostcalls::call_foreign_function("clear_route_cache", None) {
            host::log(
                LogLevel::Warn,
                &format!("llm-router: clear_route_cache failed: {e:?}"),
            );
        }
        Action::Continue
    }

    /// Gives the in-flight counts back, exactly once per routed stream, however the
    /// stream ended (completed, reset, client gone).
    fn release(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        if let Some(state) = self.state.borrow().as_ref() {
            routed.held.release(state);
            if let Some(leg) = routed.prefill.as_mut() {
                leg.held.release(state);
            }
        }
    }
}

/// Replaces the buffered body with the rewritten one (fixing `content-length`, which
/// Envoy leaves as the client sent it) and dispatches the same body to the prefill
/// worker. Returns the call's token.
fn send_prefill(
    cfg: &Config,
    prefill: &WorkerConfig,
    path: &str,
    old_len: usize,
    body: &[u8],
) -> Result<u32, &'static str> {
    if let Err(e) = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, old_len, body) {
        host::log(
            LogLevel::Error,
            &format!("llm-router: cannot rewrite the body for PD: {e:?}"),
        );
        return Err("body_rewrite_failed");
    }
    let had_length = hostcalls::get_map_value(MapType::HttpRequestHeaders, "content-length")
        .ok()
        .flatten()
        .is_some();
    if had_length {
        let len = body.len().to_string();
        if let Err(e) =
            hostcalls::set_map_value(MapType::HttpRequestHeaders, "content-length", Some(&len))
        {
            host::log(
                LogLevel::Error,
                &format!("llm-router: cannot fix content-length: {e:?}"),
            );
            return Err("body_rewrite_failed");
        }
    }
    let authority = header(":authority");
    let extra = prefill_headers(cfg);
    let mut headers: Vec<(&str, &str)> = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", authority.as_str()),
    ];
    headers.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let timeout = Duration::from_millis(cfg.prefill_timeout_ms);
    hostcalls::dispatch_http_call(prefill.cluster(), headers, Some(body), vec![], timeout).map_err(
        |e| {
            host::log(
                LogLevel::Error,
                &format!(
                    "llm-router: cannot send the prefill copy to cluster {}: {e:?}",
                    prefill.cluster()
                ),
            );
            "prefill_dispatch_failed"
        },
    )
}

/// Stores a collector snapshot, all or nothing, and answers the collector.
fn accept_push(state: &Shared, body: &[u8]) -> Action {
    let slot = state.borrow();
    let Some(state) = slot.as_ref() else {
        return reply_json(503, "not_configured", "{\"error\":\"not configured\"}");
    };
    let cfg = state.router.config();
    let outcome =
        parse_push(body, cfg.stats_max_bytes, &cfg.workers, host::now_ms()).and_then(|reports| {
            let n = reports.iter().filter(|r| r.is_some()).count();
            match HostStore.set(SAMPLES_KEY, &encode_table(&cfg.workers, &reports), 0) {
                SetOutcome::Stored => Ok(n),
                _ => Err(PushError::BadRequest(
                    "shared data refused the snapshot".into(),
                )),
            }
        });
    match outcome {
        Ok(n) => {
            state.metrics.pushes_accepted.inc();
            reply_json(200, "stats_accepted", &format!("{{\"accepted\":{n}}}"))
        }
        Err(e) => {
            state.metrics.pushes_rejected.inc();
            refuse(&e)
        }
    }
}

fn refuse(e: &PushError) -> Action {
    let body = serde_json::json!({"error": e.reason()}).to_string();
    reply_json(e.status(), "stats_refused", &body)
}

/// A local reply with a JSON body; the stream stays paused (Envoy ends it).
fn reply_json(status: u32, reason: &str, body: &str) -> Action {
    let sent = hostcalls::send_http_response(
        status,
        vec![
            (REASON_HEADER, reason),
            ("content-type", "application/json"),
        ],
        Some(body.as_bytes()),
    );
    if let Err(e) = sent {
        host::log(
            LogLevel::Error,
            &format!("llm-router: cannot send {status}: {e:?}"),
        );
    }
    Action::Pause
}

fn reply_503(reason: &str) -> Action {
    reply_error(503, reason)
}

/// An OpenAI-style error body, the reason also in `x-llm-router-reason`.
fn reply_error(status: u32, reason: &str) -> Action {
    let message = match status {
        400 => format!("request cannot be routed: {reason}"),
        _ => format!("no worker available: {reason}"),
    };
    let kind = match status {
        400 => "invalid_request_error",
        _ => "service_unavailable",
    };
    let body = serde_json::json!({"error": {"message": message, "type": kind}});
    reply_json(status, reason, &body.to_string())
}

fn header(name: &str) -> String {
    hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
        .ok()
        .flatten()
        .unwrap_or_default()
}

impl Stream {
    /// Recognises a collector push (the stats path, with pushes enabled) and refuses
    /// it early when the token, method or declared size is wrong, before buffering
    /// anything. `None`: not a push, route as usual.
    fn start_push(&mut self, end_of_stream: bool) -> Option<Action> {
        let (token, path, limit) = {
            let slot = self.state.borrow();
            let cfg = slot.as_ref()?.router.config();
            (
                cfg.stats_token.clone()?,
                cfg.stats_path.clone(),
                cfg.stats_max_bytes,
            )
        };
        if self.path.split('?').next() != Some(path.as_str()) {
            return None;
        }
        let refused = |e: PushError| Some(self.refuse_push(e));
        let authorization = header("authorization");
        if !token_matches(Some(&authorization), &token) {
            return refused(PushError::Unauthorized);
        }
        if header(":method") != "POST" {
            return refused(PushError::BadRequest(
                "the stats endpoint takes POST".into(),
            ));
        }
        if header("content-length")
            .parse::<usize>()
            .is_ok_and(|n| n > limit)
        {
            return refused(PushError::TooLarge { limit });
        }
        if end_of_stream {
            return refused(PushError::BadRequest("empty snapshot".into()));
        }
        self.push = true;
        Some(Action::Pause)
    }
}

impl Stream {
    /// Refuses a push with its status and reason, and counts it.
    fn refuse_push(&self, e: PushError) -> Action {
        if let Some(s) = self.state.borrow().as_ref() {
            s.metrics.pushes_rejected.inc();
        }
        refuse(&e)
    }
}

impl Stream {
    /// The prefill copy answered (or failed): release its count, and on failure answer
    /// the client at once; Envoy then resets the decode request, which would
    /// otherwise wait for KV that never comes.
    fn prefill_answered(&mut self, num_headers: usize, body_size: usize) {
        let status = (num_headers > 0)
            .then(|| {
                hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
                    .ok()
                    .flatten()
                    .and_then(|s| s.parse::<u32>().ok())
            })
            .flatten();
        let slot = self.state.borrow();
        let Some(state) = slot.as_ref() else {
            return;
        };
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        let Some(leg) = routed.prefill.as_mut() else {
            return;
        };
        leg.held.release(state);
        let Some(failure) = PrefillFailure::from_status(status) else {
            return;
        };
        state.metrics.pd_prefill_failures.inc();
        let cfg = state.router.config();
        let name = |d: &Decision| {
            cfg.workers
                .get(d.worker as usize)
                .map(|w| w.name.clone())
                .unwrap_or_default()
        };
        let (prefill, decode) = (name(&leg.decision), name(&routed.decision));
        let quoted = hostcalls::get_buffer(
            BufferType::HttpCallResponseBody,
            0,
            body_size.min(PREFILL_ERROR_QUOTE_BYTES),
        )
        .ok()
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
        let status_text = status.map_or("no response".to_string(), |s| format!("HTTP {s}"));
        host::log(
            LogLevel::Warn,
            &format!(
                "llm-router: prefill worker {prefill} failed ({status_text}, {}); decode worker {decode} abandoned",
                failure.as_str()
            ),
        );
        drop(slot);
        if self.response_started {
            // The decode already answered; nothing left to save.
            return;
        }
        self.replied = true;
        let body = serde_json::json!({"error": {
            "message": format!("prefill worker {prefill} failed: {status_text} {quoted}").trim_end().to_string(),
            "type": failure.as_str(),
        }});
        let sent = hostcalls::send_http_response(
            failure.client_status(),
            vec![
                (REASON_HEADER, failure.as_str()),
                (PREFILL_WORKER_HEADER, prefill.as_str()),
                (WORKER_HEADER, decode.as_str()),
                ("content-type", "application/json"),
            ],
            Some(body.to_string().as_bytes()),
        );
        if let Err(e) = sent {
            host::log(
                LogLevel::Error,
                &format!("llm-router: cannot answer a failed prefill: {e:?}"),
            );
        }
    }
}

impl Context for Stream {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let ours = self
            .routed
            .as_ref()
            .and_then(|r| r.prefill.as_ref())
            .is_some_and(|leg| leg.token == token_id);
        if ours {
            self.prefill_answered(num_headers, body_size);
        }
    }

    fn on_done(&mut self) -> bool {
        self.release();
        true
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let (cluster_header, endpoint_header) = match self.state.borrow().as_ref() {
            Some(s) => (
                s.router.config().cluster_header.clone(),
                s.router.config().endpoint_header.clone(),
            ),
            None => return reply_503("not_configured"),
        };
        // A client must not pick its own upstream.
        for h in [cluster_header.as_str(), endpoint_header.as_str()] {
            let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, h);
        }
        self.path = header(":path");
        if let Some(action) = self.start_push(end_of_stream) {
            return action;
        }
        if end_of_stream {
            return self.route(&[]);
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.push {
            let limit = self
                .state
                .borrow()
                .as_ref()
                .map_or(0, |s| s.router.config().stats_max_bytes);
            if body_size > limit {
                self.push = false;
                return self.refuse_push(PushError::TooLarge { limit });
            }
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        if self.push {
            return accept_push(&self.state, &body);
        }
        self.route(&body)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        self.response_started = true;
        // A local reply after routing carries its own reason.
        if self.replied {
            return Action::Continue;
        }
        let Some(routed) = self.routed.as_ref() else {
            return Action::Continue;
        };
        let slot = self.state.borrow();
        let Some(state) = slot.as_ref() else {
            return Action::Continue;
        };
        let cfg = state.router.config();
        if !cfg.decision_headers {
            return Action::Continue;
        }
        let name = |d: &Decision| {
            cfg.workers
                .get(d.worker as usize)
                .map(|w| w.name.as_str())
                .unwrap_or_default()
        };
        let main = routed.decision;
        // In PD mode the cache decision is the prefill pool's.
        let cache = routed.prefill.as_ref().map_or(main, |leg| leg.decision);
        let mut headers = vec![
            (WORKER_HEADER, name(&main)),
            (DECISION_HEADER, cache.label().as_str()),
            (REASON_HEADER, cache.reason.as_str()),
        ];
        if let Some(leg) = &routed.prefill {
            headers.push((PREFILL_WORKER_HEADER, name(&leg.decision)));
            headers.push((DECODE_REASON_HEADER, main.reason.as_str()));
        }
        for (h, v) in headers {
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, h, Some(v));
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release();
    }
}
