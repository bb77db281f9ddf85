//! `route_in: one_vm` on the host (`crate::relay`): the seat, the queues, and the
//! streams that wait for the routing VM's answer.
//!
//! The VM that holds the seat registers a route queue and keeps the trees. Every
//! other VM registers a reply queue, sends each request's path and body to the
//! route queue and pauses the stream; the routing VM decides as it would for a
//! request of its own (`super::decide`), counts the request, books its records, and
//! answers; the asking VM applies the answer (routing header, PD's prefill leg, its
//! own in-flight count) and resumes the stream. Envoy tells a queue's notification
//! to the registrant's thread's VM under the registrant's context id, which in that
//! VM may be another root context: the queues are found by id here, per VM.
//!
//! A question unanswered after `relay_deadline_ms` (the main thread busy with
//! configuration) is decided by its own VM, by load; a routing VM that stops
//! beating is replaced by the first VM that notices (`crate::relay::seat`).

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use proxy_wasm::traits::{Context, HttpContext};
use proxy_wasm::types::{Action, LogLevel};
use sha2::{Digest, Sha256};

use super::bookkeeping::{self, Undo};
use super::decide::decide;
use super::host::{self, HostStore};
use super::hostcalls;
use super::state::{Shared, State};
use super::stream::Stream;
use crate::config::RouteIn;
use crate::decision::Decision;
use crate::parse;
use crate::policy::predicted_ttft::WorkHold;
use crate::relay::{
    seat, Answer, Ask, Handover, Late, Part, Refused, Routed, Seat, SeatCall, Seated, Verdict,
};
use crate::request::plan::Refusal;
use crate::shared::{SetOutcome, SharedStore};

/// How long a late question's body is kept for its answer: a router that has not
/// answered in this long has lost the question with its VM.
const LATE_KEPT_MS: u64 = 60_000;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Queue {
    Route,
    Reply,
}

/// A root context's state, as its queues know it.
type StateRef = Weak<RefCell<Option<State>>>;
/// A stream, as the relay knows it.
type StreamRef = Weak<RefCell<Stream>>;

thread_local! {
    /// This VM's queues, each with the root context state it serves.
    static QUEUES: RefCell<HashMap<u32, (Queue, StateRef)>> = RefCell::new(HashMap::new());
    /// Prefill copies sent from a root context (an answer's), by token and with
    /// their stream's context id: their response comes back to a root context.
    static CALLOUTS: RefCell<HashMap<u32, (u32, StreamRef)>> = RefCell::new(HashMap::new());
    /// The streams waiting for an answer (`Part::Asker::waiting`), by context id
    /// (unique in a VM).
    static STREAMS: RefCell<HashMap<u32, StreamRef>> = RefCell::new(HashMap::new());
}

/// The waiting stream `ctx`, no longer waiting.
fn take_stream(ctx: u32) -> Option<StreamRef> {
    STREAMS.with(|m| m.borrow_mut().remove(&ctx))
}

/// How long a seat holder may go without a beat before another VM takes over: a
/// main thread applying a large configuration must not lose it, a failed VM must.
fn stale_after_ms(state: &State) -> u64 {
    state.router.config().tick_ms().saturating_mul(3).max(2_000)
}

/// How often a root context ticks: in `one_vm`, often enough to keep the deadline,
/// and every few milliseconds until the seat is settled, so that a new Envoy's
/// first requests find their router.
pub fn tick_period_ms(state: &State) -> u64 {
    let cfg = state.router.config();
    match &state.relay {
        Part::EveryVm => cfg.tick_ms(),
        Part::Asker { route: None, .. } => SETTLING_TICK_MS,
        Part::Asker { .. } => deadline_tick_ms(state),
        // The routing VM gives its hold of each decision back when due
        // (`crate::relay::handover`), and what it counted with the last one.
        Part::Router { .. } => Handover::<()>::hold_ms(cfg.sync_batch_ms).clamp(1, cfg.tick_ms()),
    }
}

/// Half the deadline: a question waits at most one and a half deadlines.
fn deadline_tick_ms(state: &State) -> u64 {
    let cfg = state.router.config();
    (cfg.relay_deadline_ms / 2).clamp(SETTLING_TICK_MS, cfg.tick_ms())
}

/// The tick of a root context that has not found the routing VM yet.
const SETTLING_TICK_MS: u64 = 5;

/// Takes this root context's part under its (new) configuration `config`.
pub fn join(shared: &Shared, config: &[u8]) {
    let mut slot = shared.borrow_mut();
    let Some(state) = slot.as_mut() else {
        return;
    };
    let cfg = state.router.config();
    if cfg.route_in == RouteIn::EveryVm || cfg.stats_only {
        state.relay = Part::EveryVm;
        return;
    }
    let digest: String = Sha256::digest(config)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let same = match &state.relay {
        Part::Router { seat, .. } | Part::Asker { seat, .. } => seat.digest == digest,
        Part::EveryVm => false,
    };
    if same {
        return;
    }
    let me = host::random_seed().max(1);
    let vm_id = hostcalls::get_property(&["plugin_vm_id"])
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    let reply = hostcalls::register_shared_queue(&format!("llm_router.reply.{me:016x}")).ok();
    if let Some(q) = reply {
        let weak = Rc::downgrade(shared);
        QUEUES.with(|m| m.borrow_mut().insert(q, (Queue::Reply, weak)));
    }
    state.relay = Part::Asker {
        seat: Seated { digest, me, vm_id },
        route: None,
        reply,
        following: 0,
        waiting: HashMap::new(),
        late: HashMap::new(),
    };
    take_or_follow(shared, state, host::now_ms(), false);
}

/// The seat as this root context finds it: taken (then this context routes; only
/// on a tick, `may_take`), beaten, or followed to whoever holds it.
///
/// Envoy configures a plugin first in a VM of its main thread that never ticks and
/// is never told of its queues (they are told to the main thread's own copy, under
/// the registrant's context id): a root context takes the seat on its tick, so
/// that one never does. The main thread's copy is configured before the worker
/// threads', so its first tick usually comes first.
fn take_or_follow(shared: &Shared, state: &mut State, now: u64, may_take: bool) {
    let stale_after = stale_after_ms(state);
    let (Part::Router { seat: s, .. } | Part::Asker { seat: s, .. }) = &state.relay else {
        return;
    };
    let (digest, me) = (s.digest.clone(), s.me);
    let key = state.shared.keys.relay_seat(&digest);
    let (found, cas) = read_seat(&key);
    let call = seat::seat_call(found, me, now, stale_after);
    let mine = Seat {
        holder: me,
        beat_ms: now,
    };
    match call {
        SeatCall::Beat => {
            let _ = HostStore.set(&key, &mine.encode(), cas);
            match &mut state.relay {
                Part::Router { beat_ms, .. } => *beat_ms = now,
                // The seat names this root context, which does not route: the
                // same nonce in a VM started afresh (a host whose randomness
                // repeats). It routes, on the queue of that name.
                _ => seated(shared, state, &mine.queue_name(&digest), now),
            }
        }
        SeatCall::Follow => follow(state, found),
        SeatCall::TakeEmpty | SeatCall::TakeStale if !may_take => {}
        SeatCall::TakeEmpty | SeatCall::TakeStale => {
            if HostStore.set(&key, &mine.encode(), cas) != SetOutcome::Stored {
                return;
            }
            if call == SeatCall::TakeStale {
                state.metrics.relay_takeovers.inc();
                host::log(
                    LogLevel::Warn,
                    "llm-router: the routing VM stopped; this one routes from now on",
                );
            }
            seated(shared, state, &mine.queue_name(&digest), now);
        }
    }
}

/// This root context holds the seat: it registers its route queue, keeps the
/// trees from now on (what the ring holds), and decides the streams that waited
/// for the old router.
fn seated(shared: &Shared, state: &mut State, queue_name: &str, now: u64) {
    let Ok(queue) = hostcalls::register_shared_queue(queue_name) else {
        host::log(
            LogLevel::Warn,
            "llm-router: cannot register the route queue",
        );
        return;
    };
    let weak = Rc::downgrade(shared);
    QUEUES.with(|m| m.borrow_mut().insert(queue, (Queue::Route, weak)));
    let (seat, waiting) = match std::mem::take(&mut state.relay) {
        Part::Router { seat, .. } => (seat, HashMap::new()),
        Part::Asker { seat, waiting, .. } => (seat, waiting),
        Part::EveryVm => return,
    };
    state.relay = Part::Router {
        seat,
        beat_ms: now,
        handover: Handover::default(),
    };
    state.serve();
    for ctx in waiting.into_keys() {
        if let Some(stream) = take_stream(ctx) {
            state.metrics.relay_late.inc();
            resume_with(state, ctx, &stream, |s, state| s.route_late(state));
        }
    }
}

/// The seat's value and CAS token; a missing key is created empty first, so that
/// taking it is a CAS that one VM wins.
fn read_seat(key: &str) -> (Option<Seat>, u32) {
    let got = HostStore.get(key).or_else(|| {
        let _ = HostStore.set(key, &[], 0);
        HostStore.get(key)
    });
    match got {
        Some((value, cas)) => (Seat::decode(&value), cas),
        None => (None, 0),
    }
}

/// Asks the seat's holder from now on (a router that lost its seat asks too; the
/// trees it keeps answer whoever still asks it).
fn follow(state: &mut State, found: Option<Seat>) {
    let Some(holder) = found else {
        return;
    };
    if let Part::Router { seat, .. } = &mut state.relay {
        let seat = Seated {
            digest: std::mem::take(&mut seat.digest),
            me: seat.me,
            vm_id: std::mem::take(&mut seat.vm_id),
        };
        let reply =
            hostcalls::register_shared_queue(&format!("llm_router.reply.{:016x}", seat.me)).ok();
        state.relay = Part::Asker {
            seat,
            route: None,
            reply,
            following: 0,
            waiting: HashMap::new(),
            late: HashMap::new(),
        };
    }
    if let Part::Asker {
        seat,
        route,
        following,
        ..
    } = &mut state.relay
    {
        if *following != holder.holder || route.is_none() {
            let name = holder.queue_name(&seat.digest);
            *route = hostcalls::resolve_shared_queue(&seat.vm_id, &name)
                .ok()
                .flatten();
            *following = holder.holder;
        }
    }
}

/// The relay's part of a tick: the seat, the routing VM's handed-over counts, and
/// the questions past their deadline.
pub fn tick(shared: &Shared, now: u64) {
    let Ok(mut slot) = shared.try_borrow_mut() else {
        return;
    };
    let Some(state) = slot.as_mut() else {
        return;
    };
    let beat_due = match &state.relay {
        Part::EveryVm => return,
        Part::Router { beat_ms, .. } => now.saturating_sub(*beat_ms) >= deadline_tick_ms(state),
        Part::Asker { .. } => true,
    };
    if beat_due {
        take_or_follow(shared, state, now, true);
    }
    release_handed(state, now);
    let deadline = state.router.config().relay_deadline_ms;
    let late: Vec<(u32, StreamRef)> = match &mut state.relay {
        Part::Asker { waiting, .. } => {
            let ids: Vec<u32> = waiting
                .iter()
                .filter(|(_, since)| now.saturating_sub(**since) >= deadline)
                .map(|(id, _)| *id)
                .collect();
            ids.into_iter()
                .filter_map(|id| {
                    waiting.remove(&id);
                    take_stream(id).map(|s| (id, s))
                })
                .collect()
        }
        // A new router decides what waited for the old one.
        Part::Router { .. } | Part::EveryVm => Vec::new(),
    };
    for (ctx, stream) in late {
        state.metrics.relay_late.inc();
        resume_with(state, ctx, &stream, |s, state| s.route_late(state));
        let Some((body, path)) = stream
            .upgrade()
            .and_then(|s| s.try_borrow_mut().ok().map(|mut s| s.asked()))
        else {
            continue;
        };
        if let Part::Asker { late, .. } = &mut state.relay {
            late.insert(
                ctx,
                Late {
                    body,
                    path,
                    since_ms: now,
                },
            );
        }
    }
    if let Part::Asker { late, .. } = &mut state.relay {
        late.retain(|_, l| now.saturating_sub(l.since_ms) < LATE_KEPT_MS);
    }
}

/// Sends the stream `ctx`'s question to the routing VM; `false`: decide here (this
/// VM routes, or the question could not be sent, which counts as late).
pub fn ask(shared: &Shared, state: &mut State, ctx: u32, path: Option<&str>, body: &[u8]) -> bool {
    if let Part::Asker { route: None, .. } = state.relay {
        // Not found yet: perhaps it is now, or nobody holds the seat yet (an Envoy
        // whose first request came before any tick): then this VM takes it.
        take_or_follow(shared, state, host::now_ms(), true);
    }
    let Part::Asker { route, reply, .. } = &state.relay else {
        return false;
    };
    let sent = match (route, reply) {
        (Some(route), Some(reply)) => {
            let ask = Ask {
                reply: *reply,
                ctx,
                path,
                body,
            };
            hostcalls::enqueue_shared_queue(*route, &ask.encode()).is_ok()
        }
        _ => false,
    };
    if !sent {
        state.metrics.relay_late.inc();
    }
    sent
}

/// A stream's question is out: it waits for the answer, or the deadline.
pub fn wait(state: &mut State, ctx: u32, stream: StreamRef) {
    let now = state.shared.recent_ms.get().max(host::now_ms());
    if let Part::Asker { waiting, .. } = &mut state.relay {
        waiting.insert(ctx, now);
        STREAMS.with(|m| m.borrow_mut().insert(ctx, stream));
    }
}

/// A stream ended: it waits no more, and its prefill copy's answer has no taker.
pub fn forget(state: &mut State, ctx: u32, prefill_token: Option<u32>) {
    if let Part::Asker { waiting, .. } = &mut state.relay {
        waiting.remove(&ctx);
    }
    take_stream(ctx);
    if let Some(token) = prefill_token {
        CALLOUTS.with(|c| c.borrow_mut().remove(&token));
    }
}

/// A queue of this VM has messages: questions for the routing VM, or answers.
pub fn on_queue_ready(queue_id: u32) {
    let Some((queue, weak)) = QUEUES.with(|m| m.borrow().get(&queue_id).cloned()) else {
        orphaned(queue_id);
        return;
    };
    let Some(shared) = weak.upgrade() else {
        return;
    };
    let Ok(mut slot) = shared.try_borrow_mut() else {
        return;
    };
    let Some(state) = slot.as_mut() else {
        return;
    };
    match queue {
        Queue::Route => answer_questions(state, queue_id),
        Queue::Reply => take_answers(state, queue_id),
    }
}

/// A queue this VM did not register is told here: one a predecessor of this VM
/// on the same thread registered (Envoy started the VM afresh after a failure).
/// Questions on it mean the routing VM was that predecessor: a root context of
/// this VM takes the seat over and answers them. Answers on it are for streams
/// that ended with the predecessor.
fn orphaned(queue_id: u32) {
    let Ok(Some(first)) = hostcalls::dequeue_shared_queue(queue_id) else {
        return;
    };
    let weak = QUEUES.with(|m| {
        m.borrow()
            .values()
            .find(|(q, _)| *q == Queue::Reply)
            .map(|(_, w)| w.clone())
    });
    let shared = weak.as_ref().and_then(Weak::upgrade);
    let (Some(shared), Some(_)) = (shared, Ask::decode(&first)) else {
        while let Ok(Some(_)) = hostcalls::dequeue_shared_queue(queue_id) {}
        return;
    };
    let Ok(mut slot) = shared.try_borrow_mut() else {
        return;
    };
    let Some(state) = slot.as_mut() else {
        return;
    };
    let Part::Asker { seat, .. } = &state.relay else {
        return;
    };
    let now = host::now_ms();
    let mine = Seat {
        holder: seat.me,
        beat_ms: now,
    };
    let (name, key) = (
        mine.queue_name(&seat.digest),
        state.shared.keys.relay_seat(&seat.digest),
    );
    let (_, cas) = read_seat(&key);
    if HostStore.set(&key, &mine.encode(), cas) != SetOutcome::Stored {
        return;
    }
    state.metrics.relay_takeovers.inc();
    host::log(
        LogLevel::Warn,
        "llm-router: this thread's routing VM failed; its successor routes from now on",
    );
    seated(&shared, state, &name, now);
    QUEUES.with(|m| {
        m.borrow_mut()
            .insert(queue_id, (Queue::Route, Rc::downgrade(&shared)))
    });
    if let Some(ask) = Ask::decode(&first) {
        answer(state, &ask, now);
    }
    answer_questions(state, queue_id);
}

/// Decides every question waiting on the route queue and answers each.
fn answer_questions(state: &mut State, queue: u32) {
    while let Ok(Some(message)) = hostcalls::dequeue_shared_queue(queue) {
        let Some(ask) = Ask::decode(&message) else {
            continue;
        };
        answer(state, &ask, host::now_ms());
    }
}

/// Decides one question and answers it.
fn answer(state: &mut State, ask: &Ask<'_>, now: u64) {
    release_handed(state, now);
    let verdict = verdict(state, ask, now);
    state.metrics.relay_answered.inc();
    let answer = Answer {
        ctx: ask.ctx,
        verdict,
    };
    if let Err(e) = hostcalls::enqueue_shared_queue(ask.reply, &answer.encode()) {
        host::log(
            LogLevel::Debug,
            &format!("llm-router: an answer found no asker: {e:?}"),
        );
    }
    // Counted like a stream's end: what it counted is handed over by the same
    // budget, and at once on the tick that finds nothing held any more.
    host::request_ended(false, now);
}

/// The routing VM's answer to one question.
fn verdict(state: &mut State, ask: &Ask<'_>, now: u64) -> Verdict {
    let mut parsed = parse::read(ask.body).parsed(ask.path);
    let refused = |r: Refusal| {
        Verdict::Refused(Refused {
            status: r.status(),
            reason: r.as_str().to_string(),
            detail: r.detail(),
        })
    };
    let mut decided = match decide(state, &mut parsed, ask.body) {
        Ok(d) => d,
        Err(r) => return refused(r),
    };
    let cfg = state.router.config();
    let name = |d: &Decision| cfg.workers.get(d.worker as usize).map(|w| w.name.clone());
    let Some(main_worker) = name(&decided.plan.main) else {
        return refused(Refusal::UnknownWorker);
    };
    let prefill = match decided.plan.prefill.as_mut() {
        None => None,
        Some(leg) => match name(&leg.decision) {
            Some(worker) => Some((leg.decision, worker, std::mem::take(&mut leg.body))),
            None => return refused(Refusal::UnknownWorker),
        },
    };
    hand_over(state, &main_worker, &decided.plan.main, now);
    if let Some((d, worker, _)) = &prefill {
        hand_over(state, worker, d, now);
    }
    let main = decided.plan.main;
    // Counted by the VM that asked, with its other counts of the request.
    let undo = bookkeeping::record(state, decided.plan);
    Verdict::Routed(Routed {
        main,
        main_worker,
        prefill,
        judged: decided.judged,
        text_chars: decided.text_chars as u64,
        records: undo.report(),
    })
}

/// Counts a decision made for another VM here until that VM's count is shared
/// (`crate::relay::handover`).
fn hand_over(state: &mut State, worker: &str, d: &Decision, now: u64) {
    bookkeeping::take_count(state, worker);
    // The prediction is recorded once, by the VM that asked.
    let work = d
        .predicted
        .map(|p| WorkHold::take(&state.shared.inflight, worker, &p, now));
    let due = now.saturating_add(Handover::<()>::hold_ms(state.router.config().sync_batch_ms));
    if let Part::Router { handover, .. } = &mut state.relay {
        handover.hold(due, (worker.to_string(), work));
    }
}

/// Gives back the handed-over counts that are due.
fn release_handed(state: &mut State, now: u64) {
    let due = match &mut state.relay {
        Part::Router { handover, .. } if !handover.is_empty() => handover.due(now),
        _ => return,
    };
    for (worker, mut work) in due {
        bookkeeping::release_count(state, &worker);
        bookkeeping::end_work(state, &mut work);
    }
}

/// Applies every answer waiting on this root context's reply queue.
fn take_answers(state: &mut State, queue: u32) {
    while let Ok(Some(message)) = hostcalls::dequeue_shared_queue(queue) {
        let Some(answer) = Answer::decode(&message) else {
            continue;
        };
        let (stream, late) = match &mut state.relay {
            Part::Asker { waiting, late, .. } => (
                waiting.remove(&answer.ctx).and(take_stream(answer.ctx)),
                late.remove(&answer.ctx),
            ),
            _ => (None, None),
        };
        let verdict = answer.verdict;
        // Routed here at the deadline: what the answer recorded is undone.
        if let (Some(l), Verdict::Routed(r)) = (late, &verdict) {
            let undo = Undo::remote(r.records.clone(), l.body, l.path);
            bookkeeping::forget(state, undo, None);
            continue;
        }
        // Gone (its client left): nothing to apply.
        let Some(stream) = stream else {
            continue;
        };
        resume_with(state, answer.ctx, &stream, move |s, state| {
            s.answered(state, verdict)
        });
    }
}

/// Runs `then` on the waiting stream `ctx` as its effective context, registers a
/// prefill copy it sent, and resumes the stream if it may go on.
fn resume_with(
    state: &mut State,
    ctx: u32,
    stream: &StreamRef,
    then: impl FnOnce(&mut Stream, &mut State) -> Action,
) {
    let Some(stream) = stream.upgrade() else {
        return;
    };
    if hostcalls::set_effective_context(ctx).is_err() {
        return;
    }
    let Ok(mut s) = stream.try_borrow_mut() else {
        return;
    };
    let action = then(&mut s, state);
    if let Some(token) = s.prefill_token() {
        let weak = Rc::downgrade(&stream);
        CALLOUTS.with(|c| c.borrow_mut().insert(token, (ctx, weak)));
    }
    drop(s);
    if action == Action::Continue {
        if let Err(e) = hostcalls::resume_http_request() {
            host::log(
                LogLevel::Warn,
                &format!("llm-router: cannot resume a routed request: {e:?}"),
            );
        }
    }
}

/// A root context's HTTP call answered: a prefill copy an answer sent goes to its
/// stream (`true`), anything else is the root context's own.
pub fn callout_answered(token: u32, headers: usize, body: usize, trailers: usize) -> bool {
    let Some((ctx, stream)) = CALLOUTS.with(|c| c.borrow_mut().remove(&token)) else {
        return false;
    };
    if let Some(stream) = stream.upgrade() {
        if hostcalls::set_effective_context(ctx).is_ok() {
            if let Ok(mut s) = stream.try_borrow_mut() {
                s.on_http_call_response(token, headers, body, trailers);
            }
        }
    }
    true
}

/// The stream as Envoy holds it: shared with this VM's relay, which applies the
/// routing VM's answer to it from a root context's callback.
pub struct Relayed(Rc<RefCell<Stream>>);

impl Relayed {
    pub fn new(stream: Stream) -> Relayed {
        Relayed(Rc::new(RefCell::new(stream)))
    }

    /// After a request callback that left a question (`Stream::question`): asks
    /// it and the stream waits, or, if it cannot be sent, decides here (the
    /// callback's answer to Envoy is then this one).
    fn after_request(&self, action: Action) -> Action {
        let Ok(mut s) = self.0.try_borrow_mut() else {
            return action;
        };
        if !s.waiting() {
            return action;
        }
        let (shared, ctx) = (s.state(), s.id());
        let mut slot = shared.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return action;
        };
        let (path, body) = s.question();
        if ask(&shared, state, ctx, path, body) {
            wait(state, ctx, Rc::downgrade(&self.0));
            return action;
        }
        s.route_late(state)
    }

    /// The stream ended (its log or its end, whichever comes first): the relay
    /// forgets it.
    fn ended(&self) {
        let Ok(s) = self.0.try_borrow() else {
            return;
        };
        let (shared, token) = (s.state(), s.prefill_token());
        let mut slot = shared.borrow_mut();
        if let Some(state) = slot.as_mut() {
            forget(state, s.id(), token);
        }
    }

    /// The stream's callback; `fallback` if the stream is busy (it never is: Envoy
    /// runs what a callback sets in motion after it returns).
    fn with<R>(&self, fallback: R, f: impl FnOnce(&mut Stream) -> R) -> R {
        match self.0.try_borrow_mut() {
            Ok(mut s) => f(&mut s),
            Err(_) => fallback,
        }
    }
}

impl Context for Relayed {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        self.with((), |s| {
            s.on_http_call_response(token, headers, body, trailers)
        });
    }

    fn on_done(&mut self) -> bool {
        self.ended();
        self.with(true, |s| s.on_done())
    }
}

impl HttpContext for Relayed {
    fn on_http_request_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        let action = self.with(Action::Continue, |s| {
            s.on_http_request_headers(headers, end_of_stream)
        });
        self.after_request(action)
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let action = self.with(Action::Continue, |s| {
            s.on_http_request_body(body_size, end_of_stream)
        });
        self.after_request(action)
    }

    fn on_http_response_headers(&mut self, headers: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |s| {
            s.on_http_response_headers(headers, end_of_stream)
        })
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        self.with(Action::Continue, |s| {
            s.on_http_response_body(body_size, end_of_stream)
        })
    }

    fn on_log(&mut self) {
        self.ended();
        self.with((), |s| s.on_log())
    }
}
