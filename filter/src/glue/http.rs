//! One HTTP stream: strip client routing headers, buffer the body, decide at end of
//! stream, set the routing header, clear the route cache, and count the request in
//! flight until the stream ends (however it ends).

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};

use super::host;
use super::root::Shared;
use crate::config::Target;
use crate::decision::Decision;
use crate::request::{self, Parsed};

pub const WORKER_HEADER: &str = "x-llm-router-worker";
pub const DECISION_HEADER: &str = "x-llm-router-decision";
pub const REASON_HEADER: &str = "x-llm-router-reason";

pub struct Stream {
    state: Shared,
    path: String,
    /// Set once a worker was chosen; cleared when its in-flight count is released.
    routed: Option<Decision>,
}

impl Stream {
    pub fn new(state: Shared) -> Stream {
        Stream {
            state,
            path: String::new(),
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
        let decision = match state.router.route(&parsed, &state.inflight, &mut state.rng) {
            Ok(d) => d,
            Err(e) => {
                state.metrics.no_worker.inc();
                drop(slot);
                return reply_503(e.as_str());
            }
        };
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
        if let Some(n) = state.inflight.get_mut(decision.worker as usize) {
            *n += 1;
        }
        state.metrics.decision(decision.label());
        self.routed = Some(decision);
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

    /// Gives the in-flight slot back, exactly once per routed stream.
    fn release(&mut self) {
        let Some(decision) = self.routed.take() else {
            return;
        };
        if let Some(state) = self.state.borrow_mut().as_mut() {
            if let Some(n) = state.inflight.get_mut(decision.worker as usize) {
                *n = n.saturating_sub(1);
            }
        }
    }
}

fn reply_503(reason: &str) -> Action {
    let body = format!(
        "{{\"error\":{{\"message\":\"no worker available: {reason}\",\"type\":\"service_unavailable\"}}}}"
    );
    let sent = hostcalls::send_http_response(
        503,
        vec![
            (REASON_HEADER, reason),
            ("content-type", "application/json"),
        ],
        Some(body.as_bytes()),
    );
    if let Err(e) = sent {
        host::log(
            LogLevel::Error,
            &format!("llm-router: cannot send 503: {e:?}"),
        );
    }
    Action::Pause
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
        self.path = hostcalls::get_map_value(MapType::HttpRequestHeaders, ":path")
            .ok()
            .flatten()
            .unwrap_or_default();
        if end_of_stream {
            return self.route(&[]);
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        self.route(&body)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        let Some(decision) = self.routed else {
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
