//! One HTTP stream: strip client routing headers, buffer the body, decide at end of
//! stream, set the routing header, clear the route cache, and count the request in
//! flight until the stream ends (however it ends).

use super::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};

use super::host::{self, HostStore};
use super::root::{Shared, SAMPLES_KEY};
use crate::config::Target;
use crate::decision::Decision;
use crate::load::{encode_table, parse_push, token_matches, PushError};
use crate::request::{self, Parsed};
use crate::router::Loads;
use crate::sync::{SetOutcome, SharedStore};

pub const WORKER_HEADER: &str = "x-llm-router-worker";
pub const DECISION_HEADER: &str = "x-llm-router-decision";
pub const REASON_HEADER: &str = "x-llm-router-reason";

/// A routed stream's worker, by name: the in-flight count is keyed by name, so it is
/// released correctly even if a config update reorders the workers meanwhile.
struct Routed {
    decision: Decision,
    worker: String,
    counted: bool,
}

pub struct Stream {
    state: Shared,
    path: String,
    /// An authorised stats push from the collector, answered by the filter itself.
    push: bool,
    /// Set once a worker was chosen; its count is released when the stream ends.
    routed: Option<Routed>,
}

impl Stream {
    pub fn new(state: Shared) -> Stream {
        Stream {
            state,
            path: String::new(),
            push: false,
            routed: None,
        }
    }

    /// Routes the request: on success the routing header is set and the stream may
    /// continue; on failure a 503 is sent and the stream must stay paused.
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
        let inflight = state.inflight();
        let engine = state.engine_loads();
        let loads = Loads {
            inflight: &inflight,
            engine: &engine,
            now_ms: host::now_ms(),
        };
        let routed = match state.router.route(&parsed, &loads, &mut state.rng) {
            Ok(r) => r,
            Err(e) => {
                state.metrics.no_worker.inc();
                drop(slot);
                return reply_503(e.as_str());
            }
        };
        let decision = routed.decision;
        if routed.gate_inert {
            state.note_gate_inert();
        }
        let cfg = state.router.config();
        let Some(worker) = cfg.workers.get(decision.worker as usize) else {
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
        let worker_name = worker.name.clone();
        let counted = state.shared.inflight.add(&HostStore, &worker_name, 1);
        state.metrics.decision(&decision);
        if let Some(op) = routed.record {
            state.record(op);
        }
        self.routed = Some(Routed {
            decision,
            worker: worker_name,
            counted,
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

    /// Gives the in-flight count back, exactly once per routed stream, however the
    /// stream ended (completed, reset, client gone).
    fn release(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        if std::mem::take(&mut routed.counted) {
            if let Some(state) = self.state.borrow().as_ref() {
                state.shared.inflight.add(&HostStore, &routed.worker, -1);
            }
        }
    }
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
    let body = serde_json::json!({"error": {
        "message": format!("no worker available: {reason}"),
        "type": "service_unavailable",
    }});
    reply_json(503, reason, &body.to_string())
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

impl Context for Stream {
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
        let Some(decision) = self.routed.as_ref().map(|r| r.decision) else {
            return Action::Continue;
        };
        let slot = self.state.borrow();
        let Some(state) = slot.as_ref() else {
            return Action::Continue;
        };
        let cfg = state.router.config();
        if cfg.decision_headers {
            let name = cfg
                .workers
                .get(decision.worker as usize)
                .map(|w| w.name.as_str())
                .unwrap_or_default();
            for (h, v) in [
                (WORKER_HEADER, name),
                (DECISION_HEADER, decision.label().as_str()),
                (REASON_HEADER, decision.reason.as_str()),
            ] {
                let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, h, Some(v));
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.release();
    }
}
