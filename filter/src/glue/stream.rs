//! One HTTP stream: strip client routing headers, buffer the body, decide at end of
//! stream (`crate::plan`), apply the plan (routing header, PD body and prefill copy,
//! bookkeeping), clear the route cache, and hold the in-flight counts until the
//! stream ends (however it ends). Collector pushes are handed to `push`.

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, BufferType, LogLevel, MapType};

use super::bookkeeping::{self, Held, Undo};
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
use crate::header_names::{
    DECISION_HEADER, DECODE_REASON_HEADER, EXPLAIN_HEADER, PREDICTED_TTFT_HEADER,
    PREFILL_WORKER_HEADER, REASON_HEADER, WORKER_HEADER,
};
use crate::header_pairs::{self, Pairs};
use crate::models;
use crate::parse::{parse, Parsed};
use crate::plan::{plan, Refusal};
use crate::shared::truncate_text;
use crate::target::route_target;
use crate::work_hold::WorkHold;

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
    path: String,
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
    /// The response gets the decision headers (`decision_headers`).
    explain: bool,
}

impl Stream {
    pub fn new(state: Shared) -> Stream {
        Stream {
            state,
            path: String::new(),
            push: false,
            replica: None,
            routed: None,
            replied: false,
            response_started: false,
            seen: health::Seen::default(),
            explain: false,
        }
    }

    /// Routes the request: on success the routing header is set and the stream may
    /// continue; on failure a local reply is sent and the stream must stay paused.
    fn route(&mut self, body: &[u8]) -> Action {
        let parsed = parse(&self.path, body);
        let mut slot = self.state.borrow_mut();
        let Some(state) = slot.as_mut() else {
            drop(slot);
            return reply::refusal(Refusal::NotConfigured);
        };
        if let Parsed::Unroutable { reason, .. } = &parsed {
            state.metrics.unreadable.inc();
            host::log(
                LogLevel::Debug,
                &format!("llm-router: routing by load: {}", reason.as_str()),
            );
        }
        // See every prefix any thread routed, every thread's load, and the engines':
        // as of now if this request syncs, else as of this VM's last sync.
        state.shared.recent_ms.set(host::now_ms());
        state.sync_or_listen();
        let loads = state.loads();
        let planned = plan(
            &mut state.router,
            &parsed,
            body,
            &loads,
            &mut state.rng,
            &mut host::entropy,
        );
        state.recycle(loads);
        if planned.notes.gate_inert {
            state.note_gate_inert();
        }
        if planned.notes.owner_overloaded {
            state.metrics.overload_owner_filtered.inc();
        }
        let plan = match planned.outcome {
            Ok(p) => p,
            Err(refusal) => {
                if refusal.is_no_worker() {
                    state.metrics.no_worker.inc();
                }
                drop(slot);
                return reply::refusal(refusal);
            }
        };
        let Some(target) = route_target(state.router.config(), plan.main.worker) else {
            drop(slot);
            return reply::refusal(Refusal::UnknownWorker);
        };
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
            drop(slot);
            return reply::refusal(Refusal::HeaderRejected);
        }
        let prefill = match &plan.prefill {
            None => None,
            Some(leg) => {
                let cfg = state.router.config();
                let sent = cfg
                    .workers
                    .get(leg.decision.worker as usize)
                    .ok_or(Refusal::UnknownWorker)
                    .and_then(|w| {
                        let token = prefill::send(cfg, w, &self.path, body.len(), &leg.body)?;
                        Ok((w, token))
                    });
                match sent {
                    Ok((w, token)) => Some(Leg {
                        decision: leg.decision,
                        held: Held::take(state, &w.name),
                        token,
                        work: bookkeeping::take_work(state, &w.name, &leg.decision),
                    }),
                    Err(refusal) => {
                        state.metrics.pd_prefill_failures.inc();
                        drop(slot);
                        return reply::refusal(refusal);
                    }
                }
            }
        };
        let held = Held::take(state, target.worker);
        let work = bookkeeping::take_work(state, target.worker, &plan.main);
        let decision = plan.main;
        // A tree policy counted the text's chars as it decided.
        let text_chars = match (plan.records.first(), &parsed) {
            (Some(record), _) => usize::try_from(record.text_chars).unwrap_or(usize::MAX),
            (None, Parsed::Routable(r)) => crate::tree::char_len(truncate_text(
                &r.text,
                state.router.config().max_routing_text_bytes,
            )),
            (None, Parsed::Unroutable { .. }) => 0,
        };
        let undo = bookkeeping::book(state, plan, text_chars);
        self.routed = Some(Routed {
            decision,
            held,
            work,
            prefill,
            undo,
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
            bookkeeping::end_work(state, &mut routed.work);
            if let Some(leg) = routed.prefill.as_mut() {
                leg.held.release(state);
                bookkeeping::end_work(state, &mut leg.work);
            }
        }
    }

    /// Takes the main worker out if its upstream failed (`super::health`); not after
    /// the filter's own reply (a failed prefill), which is no verdict on it. Either
    /// way no engine served the request: what it recorded is undone.
    fn judge_upstream(&mut self) {
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
        } else if health::observe(state, worker, self.seen) {
            bookkeeping::unserved(state, std::mem::take(&mut routed.undo), Some(worker));
        }
    }

    /// The first response byte: the booked prefill is done (at most once).
    fn first_byte(&mut self) {
        let Some(routed) = self.routed.as_mut() else {
            return;
        };
        if let Some(state) = self.state.borrow().as_ref() {
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
        // One hostcall for every header this callback asks about (a hostcall costs
        // Envoy more than reading a few dozen pairs here); if the host cannot list
        // them, each is read on its own.
        let listed = hostcalls::get_map_bytes(MapType::HttpRequestHeaders).ok();
        let slot = self.state.borrow();
        let Some(s) = slot.as_ref() else {
            drop(slot);
            return reply::refusal(Refusal::NotConfigured);
        };
        let cfg = s.router.config();
        let unused = match cfg.target {
            Target::Cluster => &cfg.endpoint_header,
            Target::Endpoint => &cfg.cluster_header,
        };
        let (path, explain, unused_sent) = match listed.as_deref() {
            Some(bytes) => {
                let [path, explain, sent] =
                    Pairs::new(bytes).find([":path", EXPLAIN_HEADER, unused]);
                (header_pairs::text(path), explain.is_some(), sent.is_some())
            }
            None => (
                request_header(":path"),
                hostcalls::get_map_value(MapType::HttpRequestHeaders, EXPLAIN_HEADER)
                    .is_ok_and(|v| v.is_some()),
                true,
            ),
        };
        // A client must not pick its own upstream. The header the filter routes by
        // is replaced on every request that goes upstream (`route`: any other gets a
        // local reply), so only the other one is removed here.
        if unused_sent {
            let _ = hostcalls::remove_map_value(MapType::HttpRequestHeaders, unused);
        }
        self.explain = match cfg.decision_headers {
            DecisionHeaders::Always => true,
            DecisionHeaders::Never => false,
            DecisionHeaders::OnRequest => explain,
        };
        drop(slot);
        self.path = path;
        match push::start(&self.state, &self.path, end_of_stream) {
            Start::NotPush => {}
            Start::Refused(action) => return action,
            Start::Accepting => {
                self.push = true;
                return Action::Pause;
            }
        }
        match replica::start(&self.state, &self.path, end_of_stream) {
            replica::Start::NotReplica => {}
            replica::Start::Answered(action) => return action,
            replica::Start::Accepting(import) => {
                self.replica = Some(import);
                return Action::Pause;
            }
        }
        // The model listing is the router's own: the union of the workers' models.
        if models::is_list_request(&self.path, || request_header(":method")) {
            let listing = self
                .state
                .borrow()
                .as_ref()
                .and_then(|s| models::list_body(s.router.config()));
            if let Some(body) = listing {
                return reply::json(200, "models_listed", &body);
            }
        }
        if end_of_stream {
            return self.route(&[]);
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.push {
            if let Some(refused) = push::check_size(&self.state, body_size) {
                self.push = false;
                return refused;
            }
        }
        if self.replica.is_some() {
            if let Some(refused) = replica::check_size(&self.state, body_size) {
                self.replica = None;
                return refused;
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
            return push::accept(&self.state, &body);
        }
        if let Some(import) = self.replica.take() {
            return replica::accept(&self.state, import, &body);
        }
        self.route(&body)
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        self.response_started = true;
        self.seen.complete = end_of_stream;
        if self.routed.is_some() {
            if let Some(state) = self.state.borrow().as_ref() {
                self.seen.status = health::response_status(state);
            }
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
            let s = &state.shared;
            host::request_ended(s.inflight.holds_nothing(), s.recent_ms.get());
        }
    }
}
