//! One HTTP stream: strip client routing headers, buffer the body, decide at end of
//! stream (`crate::request::plan`), apply the plan (routing header, PD body and prefill copy,
//! bookkeeping), clear the route cache, and hold the in-flight counts until the
//! stream ends (however it ends). Collector pushes are handed to `push`.
//!
//! The callbacks are here; `routing` is how the stream is routed (here, or by the
//! routing VM's answer), `ending` what a routed stream gives back and tells as its
//! response comes and it ends.

mod ending;
mod routing;

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, MapType};

use super::bookkeeping::{Held, Undo};
use super::health;
use super::host::{self, request_header};
use super::hostcalls;
use super::prefill::{self, Leg};
use super::push::{self, Start};
use super::replica;
use super::reply;
use super::state::Shared;
use crate::config::{DecisionHeaders, Target};
use crate::decision::Decision;
use crate::kv_match::EngineHeld;
use crate::parse;
use crate::policy::predicted_ttft::WorkHold;
use crate::request::models;
use crate::request::plan::Refusal;
use crate::support::header_names::EXPLAIN_HEADER;

/// What a routed stream chose: the worker that gets the request itself (regular or
/// decode) and, in PD mode, the prefill leg.
struct Routed {
    decision: Decision,
    held: Held,
    /// `predicted_ttft`: the prefill booked on the worker until the first byte.
    work: Option<WorkHold>,
    prefill: Option<Leg>,
    /// Undoes the tree records if no engine serves the request.
    undo: Undo,
}

pub struct Stream {
    state: Shared,
    /// This stream's context id, which the routing VM's answer names.
    id: u32,
    /// The request's `:path`, once read: only where the body's shape leaves its API
    /// open (`parse::Reading::shape`), or before the body where it must be known
    /// (`on_http_request_headers`). Read, it costs a copy into the VM, about 8k
    /// Envoy instructions.
    path: Option<String>,
    /// An authorised stats push from the collector, answered by the filter itself.
    push: bool,
    /// A peer replica's batch from the bridge, answered by the filter itself.
    replica: Option<replica::Import>,
    /// Set once a worker was chosen; its counts are released when the stream ends.
    routed: Option<Routed>,
    /// The filter answered the client itself after routing (a failed prefill).
    replied: bool,
    /// Response headers went to the client: too late for a local reply.
    response_started: bool,
    /// The response as its callbacks saw it, for the health verdict.
    seen: health::Seen,
    /// The verdict on the upstream was taken (once: at a failure's headers, else
    /// when the stream ends).
    judged: bool,
    /// The response gets the decision headers (`decision_headers`).
    explain: bool,
    /// `route_in: one_vm`: the body, from the question to the routing VM until
    /// the answer (then it undoes the records if no engine serves the request).
    asked: Option<Vec<u8>>,
    /// The question is out and no answer came yet.
    waiting: bool,
    /// `kv_match`: the collector's call, while its answer is awaited (the body
    /// waits in `asked`).
    kv_call: Option<u32>,
    /// `kv_match`: what the engines hold of the prompt, once the collector said.
    held: Option<EngineHeld>,
}

impl Stream {
    pub fn new(state: Shared, id: u32) -> Stream {
        Stream {
            state,
            id,
            path: None,
            push: false,
            replica: None,
            routed: None,
            replied: false,
            response_started: false,
            seen: health::Seen::default(),
            judged: false,
            explain: false,
            asked: None,
            waiting: false,
            kv_call: None,
            held: None,
        }
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn state(&self) -> Shared {
        self.state.clone()
    }

    /// The prefill leg's token, while its answer is awaited.
    pub fn prefill_token(&self) -> Option<u32> {
        self.routed.as_ref()?.prefill.as_ref().map(|leg| leg.token)
    }

    /// Reads the path and answers a request to one of the router's own endpoints:
    /// a stats push or a replica batch (taken once its body is whole), or the model
    /// listing. `None`: a request to route.
    fn own_endpoint(&mut self, end_of_stream: bool) -> Option<Action> {
        let path = self.path.insert(request_header(":path"));
        match push::start(&self.state, path, end_of_stream) {
            Start::NotPush => {}
            Start::Refused(action) => return Some(action),
            Start::Accepting => {
                self.push = true;
                return Some(Action::Pause);
            }
        }
        match replica::start(&self.state, path, end_of_stream) {
            replica::Start::NotReplica => {}
            replica::Start::Answered(action) => return Some(action),
            replica::Start::Accepting(import) => {
                self.replica = Some(import);
                return Some(Action::Pause);
            }
        }
        // The model listing is the router's own: the union of the workers' models.
        if models::is_list_request(path, || request_header(":method")) {
            let listing = self
                .state
                .borrow()
                .as_ref()
                .and_then(|s| models::list_body(s.router.config()));
            if let Some(body) = listing {
                return Some(reply::json(200, "models_listed", &body));
            }
        }
        None
    }

    /// Refuses a body grown past its limit, as soon as it does: a push's or a
    /// replica batch's own, else, for a request to route, `max_body_bytes` (the same
    /// 413 at every size past the bound, and no more of it read). `None`: within it.
    fn oversized(&mut self, body_size: usize) -> Option<Action> {
        // `own_endpoint` makes a stream a push or a replica batch, never both.
        if self.push {
            let refused = push::check_size(&self.state, body_size);
            self.push = refused.is_none();
            return refused;
        }
        if self.replica.is_some() {
            let refused = replica::check_size(&self.state, body_size);
            if refused.is_some() {
                self.replica = None;
            }
            return refused;
        }
        let max = self
            .state
            .borrow()
            .as_ref()
            .map(|s| s.router.config().max_body_bytes)?;
        (body_size as u64 > max).then(|| reply::refusal(Refusal::BodyTooLarge))
    }

    /// Takes a whole push or replica batch (`None`: the body is neither).
    fn take_own(&mut self, body: &[u8]) -> Option<Action> {
        if self.push {
            return Some(push::accept(&self.state, body));
        }
        let import = self.replica.take()?;
        Some(replica::accept(&self.state, import, body))
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
        let slot = self.state.borrow();
        let Some(state) = slot.as_ref() else {
            return;
        };
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        let Some(leg) = routed.prefill.as_mut().filter(|leg| leg.token == token_id) else {
            return;
        };
        prefill::answered(
            state,
            leg,
            &routed.decision,
            num_headers,
            body_size,
            self.response_started,
            &mut self.replied,
        );
    }

    fn on_done(&mut self) -> bool {
        self.release();
        true
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        let slot = self.state.borrow();
        let Some(s) = slot.as_ref() else {
            drop(slot);
            return reply::refusal(Refusal::NotConfigured);
        };
        let cfg = s.router.config();
        // A client must not pick its own upstream. The header the filter routes by
        // is replaced on every request that goes upstream (`route`: any other gets a
        // local reply), so only the other one is removed here.
        let unused = match cfg.target {
            Target::Cluster => &cfg.endpoint_header,
            Target::Endpoint => &cfg.cluster_header,
        };
        let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, unused);
        // Asking for a header the request does not carry copies nothing into the VM.
        self.explain = match cfg.decision_headers {
            DecisionHeaders::Always => true,
            DecisionHeaders::Never => false,
            DecisionHeaders::OnRequest => {
                hostcalls::get_map_value(MapType::HttpRequestHeaders, EXPLAIN_HEADER)
                    .is_ok_and(|v| v.is_some())
            }
        };
        // The path before the body only where it matters before the body: a request
        // without one, a listener that takes only pushes, and PD (the prefill copy
        // goes to the same path). Otherwise the body usually names its API alone.
        let path_first = end_of_stream || cfg.stats_only || cfg.is_pd();
        drop(slot);
        if path_first {
            if let Some(answer) = self.own_endpoint(end_of_stream) {
                return answer;
            }
            if end_of_stream {
                return self.route(&[], parse::read(&[]));
            }
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some(refused) = self.oversized(body_size) {
            return refused;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        if let Some(taken) = self.take_own(&body) {
            return taken;
        }
        let reading = parse::read(&body);
        if self.path.is_none() && reading.shape().is_none() {
            // The body leaves its API open: the path names it, and may name one of
            // the router's own endpoints, known only now.
            if let Some(answer) = self.own_endpoint(false) {
                return self
                    .oversized(body_size)
                    .or_else(|| self.take_own(&body))
                    .unwrap_or(answer);
            }
        }
        self.route(&body, reading)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.response_started = true;
        self.seen.complete = end_of_stream;
        if self.routed.is_some() {
            if let Some(state) = self.state.borrow().as_ref() {
                self.seen.status = health::response_status(state);
            }
        }
        // A failure is judged before the client sees it: the client's next request
        // must not find the worker still in rotation (`on_log` comes after the
        // answer left).
        if self.seen.status.is_some_and(|s| s >= 500) {
            self.judge_upstream();
        }
        if end_of_stream {
            self.first_byte();
        }
        // A local reply after routing carries its own reason.
        if !self.replied {
            self.decision_headers();
        }
        Action::Continue
    }

    fn on_http_response_body(&mut self, _body_size: usize, end_of_stream: bool) -> Action {
        self.seen.complete |= end_of_stream;
        // The first body bytes are the first token (a stream) or the whole answer.
        self.first_byte();
        Action::Continue
    }

    fn on_log(&mut self) {
        // Before the release: a failure must take its worker out before any later
        // request can see its count drop.
        self.judge_upstream();
        self.release();
        if self.routed.is_some() {
            if let Some(state) = self.state.borrow_mut().as_mut() {
                state.settle();
            }
        }
        if let Some(state) = self.state.borrow().as_ref() {
            let idle = state.holds_no_stream();
            host::request_ended(idle, state.shared.recent_ms.get());
        }
    }
}
