//! One HTTP stream: strip client routing headers, buffer the body, decide at end of
//! stream (`crate::request::plan`), apply the plan (routing header, PD body and prefill copy,
//! bookkeeping), clear the route cache, and hold the in-flight counts until the
//! stream ends (however it ends). Collector pushes are handed to `push`.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};

use super::bookkeeping::{self, Held, Undo};
use super::decide::decide;
use super::health;
use super::host::{self, request_header};
use super::hostcalls;
use super::prefill::{self, Leg};
use super::push::{self, Start};
use super::replica;
use super::reply;
use super::state::{Shared, State};
use super::telling;
use crate::config::{DecisionHeaders, Target};
use crate::decision::Decision;
use crate::parse::{self, Reading};
use crate::policy::predicted_ttft::WorkHold;
use crate::relay::{self, Verdict};
use crate::request::bookkeeping::booking_of;
use crate::request::models;
use crate::request::plan::Refusal;
use crate::request::target::route_target;
use crate::support::header_names::{
    DECISION_HEADER, DECODE_REASON_HEADER, EXPLAIN_HEADER, PREDICTED_TTFT_HEADER,
    PREFILL_WORKER_HEADER, REASON_HEADER, WORKER_HEADER,
};

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
        }
    }

    /// Routes the request: in a VM that asks the routing VM (`route_in: one_vm`),
    /// keeps the body for the question the relay sends when the callback returns
    /// (`super::relay::Relayed`), else decides here. On success the routing header
    /// is set and the stream may continue; on failure a local reply is sent and the
    /// stream must stay paused.
    fn route(&mut self, body: &[u8], reading: Reading) -> Action {
        let shared = self.state.clone();
        let mut slot = shared.borrow_mut();
        let Some(state) = slot.as_mut() else {
            drop(slot);
            return reply::refusal(Refusal::NotConfigured);
        };
        if state.relay.asks() {
            self.asked = Some(body.to_vec());
            self.waiting = true;
            return Action::Pause;
        }
        self.route_here(state, body, reading)
    }

    /// The question this stream is to ask: its path and body.
    pub fn question(&self) -> (Option<&str>, &[u8]) {
        (
            self.path.as_deref(),
            self.asked.as_deref().unwrap_or_default(),
        )
    }

    /// Decides here (this VM routes, or its question found no answer in time)
    /// and applies the plan.
    fn route_here(&mut self, state: &mut State, body: &[u8], reading: Reading) -> Action {
        let mut parsed = reading.parsed(self.path.as_deref());
        let decided = match decide(state, &mut parsed, body) {
            Ok(d) => d,
            Err(refusal) => return reply::refusal(refusal),
        };
        self.seen.judged = decided.judged;
        self.seen.routed_ms = state.shared.recent_ms.get();
        let plan = decided.plan;
        let prefill = plan
            .prefill
            .as_ref()
            .map(|l| (l.decision, l.body.as_slice()));
        if let Err(refusal) = self.apply(state, plan.main, prefill, body.len(), None) {
            return reply::refusal(refusal);
        }
        let undo = bookkeeping::book(state, plan, decided.text_chars);
        self.routed_on(undo)
    }

    /// The routing VM's answer (`route_in: one_vm`).
    pub fn answered(&mut self, state: &mut State, verdict: Verdict) -> Action {
        self.waiting = false;
        let routed = match verdict {
            Verdict::Refused(r) => return reply::refused(r.status, &r.reason, r.detail),
            Verdict::Routed(r) => r,
        };
        let body = self.asked.take().unwrap_or_default();
        self.seen.judged = routed.judged;
        self.seen.routed_ms = host::now_ms();
        state.shared.recent_ms.set(self.seen.routed_ms);
        // By name: the two VMs' worker lists may differ for a moment (discovery
        // mode: this VM keeps no tree, so it reads the list only on its tick).
        let known = |state: &State, name: &str| {
            state.router.config().workers.iter().any(|w| w.name == name)
        };
        let unknown = !known(state, &routed.main_worker)
            || routed
                .prefill
                .as_ref()
                .is_some_and(|(_, p, _)| !known(state, p));
        if unknown {
            state.refresh_membership();
        }
        let cfg = state.router.config();
        let index = |name: &str| cfg.workers.iter().position(|w| w.name == name);
        let main = index(&routed.main_worker).map(|i| Decision {
            worker: i as u32,
            ..routed.main
        });
        let prefill = match &routed.prefill {
            None => Some(None),
            Some((d, name, leg)) => index(name).map(|i| {
                let d = Decision {
                    worker: i as u32,
                    ..*d
                };
                Some((d, leg.as_slice()))
            }),
        };
        let applied = match (main, prefill) {
            (Some(main), Some(prefill)) => self
                .apply(state, main, prefill, body.len(), Some(self.id))
                .map(|()| main),
            _ => Err(Refusal::UnknownWorker),
        };
        let undo = Undo::remote(routed.records, body, self.path.clone());
        match applied {
            Ok(main) => {
                let prefill = self.routed.as_ref().and_then(|r| r.prefill.as_ref());
                let booked = booking_of(&main, prefill.map(|leg| &leg.decision));
                state.metrics.book(&booked, routed.text_chars as usize);
                self.routed_on(undo)
            }
            Err(refusal) => {
                // What the routing VM recorded and counted for it is undone.
                bookkeeping::unserved(state, undo, None);
                telling::never_sent(state, self.id);
                reply::refusal(refusal)
            }
        }
    }

    /// The routing VM did not answer (within `relay_deadline_ms`, or the question
    /// could not be sent): decided here, by what this VM knows (it keeps no tree:
    /// by load).
    pub fn route_late(&mut self, state: &mut State) -> Action {
        self.waiting = false;
        let body = self.asked.take().unwrap_or_default();
        let action = self.route_here(state, &body, parse::read(&body));
        // Kept for the late answer's records (`asked`).
        self.asked = Some(body);
        action
    }

    /// The question's body and path, once the stream no longer needs them.
    pub fn asked(&mut self) -> (Vec<u8>, Option<String>) {
        (self.asked.take().unwrap_or_default(), self.path.clone())
    }

    /// Whether the stream waits for the routing VM's answer.
    pub fn waiting(&self) -> bool {
        self.waiting
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn state(&self) -> Shared {
        self.state.clone()
    }

    /// Sets the routing header and, in PD, sends the prefill leg (`prefill`: its
    /// decision and body), taking the in-flight counts (`told`: this stream's id,
    /// the routing VM counts it): the stream is routed.
    fn apply(
        &mut self,
        state: &mut State,
        main: Decision,
        prefill: Option<(Decision, &[u8])>,
        body_len: usize,
        told: Option<u32>,
    ) -> Result<(), Refusal> {
        let target =
            route_target(state.router.config(), main.worker).ok_or(Refusal::UnknownWorker)?;
        let set = hostcalls::set_map_value(
            MapType::HttpRequestHeaders,
            target.header,
            Some(target.value),
        );
        if let Err(e) = set {
            host::log(
                LogLevel::Error,
                &format!("llm-router: cannot set {}: {e:?}", target.header),
            );
            return Err(Refusal::HeaderRejected);
        }
        let prefill = match prefill {
            None => None,
            Some((decision, leg_body)) => {
                let cfg = state.router.config();
                let sent = cfg
                    .workers
                    .get(decision.worker as usize)
                    .ok_or(Refusal::UnknownWorker)
                    .and_then(|w| {
                        // PD reads the path before the body (`on_http_request_headers`).
                        let path = self.path.as_deref().unwrap_or_default();
                        let token = prefill::send(cfg, w, path, body_len, leg_body)?;
                        Ok((w, token))
                    });
                match sent {
                    Ok((w, token)) => {
                        let told = told.map(|ctx| (ctx, relay::Leg::Prefill));
                        let (held, work) = bookkeeping::count(state, &w.name, &decision, told);
                        Some(Leg {
                            decision,
                            held,
                            token,
                            work,
                        })
                    }
                    Err(refusal) => {
                        state.metrics.pd_prefill_failures.inc();
                        return Err(refusal);
                    }
                }
            }
        };
        let told = told.map(|ctx| (ctx, relay::Leg::Main));
        let (held, work) = bookkeeping::count(state, target.worker, &main, told);
        self.routed = Some(Routed {
            decision: main,
            held,
            work,
            prefill,
            undo: Undo::default(),
        });
        Ok(())
    }

    /// The stream is routed, `undo` undoing its records: Envoy looks for the route
    /// again, now that the header exists.
    fn routed_on(&mut self, undo: Undo) -> Action {
        if let Some(routed) = self.routed.as_mut() {
            routed.undo = undo;
        }
        if let Err(e) = hostcalls::call_foreign_function("clear_route_cache", None) {
            host::log(
                LogLevel::Warn,
                &format!("llm-router: clear_route_cache failed: {e:?}"),
            );
        }
        Action::Continue
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

    /// Gives the in-flight counts back, exactly once per routed stream, however the
    /// stream ended (completed, reset, client gone).
    fn release(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        if let Some(state) = self.state.borrow().as_ref() {
            routed.held.release(state);
            bookkeeping::end_work(state, &mut routed.work);
            if let Some(leg) = routed.prefill.as_mut() {
                leg.held.release(state);
                bookkeeping::end_work(state, &mut leg.work);
            }
        }
    }

    /// Takes the main worker out if its upstream failed (`super::health`); not after
    /// the filter's own reply (a failed prefill), which is no verdict on it, nor after
    /// a 4xx (`crate::worker::health::refused`), a verdict on the request. Each way no engine
    /// served the request: what it recorded is undone.
    fn judge_upstream(&mut self) {
        if std::mem::replace(&mut self.judged, true) {
            return;
        }
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        let mut slot = self.state.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return;
        };
        let worker = routed.held.worker();
        if self.replied {
            bookkeeping::unserved(state, std::mem::take(&mut routed.undo), None);
        } else if health::observe(state, worker, self.seen)
            || crate::worker::health::refused(self.seen.status)
        {
            bookkeeping::unserved(state, std::mem::take(&mut routed.undo), Some(worker));
        }
    }

    /// The first response byte: the booked prefill is done (at most once).
    fn first_byte(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        if let Some(state) = self.state.borrow().as_ref() {
            routed.held.first_byte(state);
            bookkeeping::first_byte(state, &mut routed.work);
        }
    }

    /// The decision headers of a routed response (`decision_headers`).
    fn decision_headers(&self) {
        let Some(routed) = self.routed.as_ref() else {
            return;
        };
        if !self.explain {
            return;
        }
        let main = routed.decision;
        // In PD mode the cache decision is the prefill pool's.
        let cache = routed.prefill.as_ref().map_or(main, |leg| leg.decision);
        let predicted = cache
            .predicted
            .map(|p| format!("{:.1}", p.ttft_us as f64 / 1000.0));
        let mut headers = vec![
            (WORKER_HEADER, routed.held.worker()),
            (DECISION_HEADER, cache.label().as_str()),
            (REASON_HEADER, cache.reason.as_str()),
        ];
        if let Some(ms) = predicted.as_deref() {
            headers.push((PREDICTED_TTFT_HEADER, ms));
        }
        if let Some(leg) = &routed.prefill {
            headers.push((PREFILL_WORKER_HEADER, leg.held.worker()));
            headers.push((DECODE_REASON_HEADER, main.reason.as_str()));
        }
        for (h, v) in headers {
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, h, Some(v));
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
