//! `route_in: one_vm` on the host (`crate::relay`): the seat, the queues, and the
//! streams that wait for the routing VM's answer.
//!
//! The VM that holds the seat registers a route queue and keeps the trees. Every
//! other VM registers a reply queue, sends each request's path and body to the
//! route queue and pauses the stream; the routing VM decides as it would for a
//! request of its own (`super::decide`), counts the request until the asking VM
//! tells its end (`super::telling`), books its records, and answers; the asking VM
//! applies the answer (routing header, PD's prefill leg) and resumes the stream.
//!
//! A question unanswered after `relay_deadline_ms` (the main thread busy with
//! configuration) is decided by its own VM, by load; a routing VM that stops
//! beating is replaced by the first VM that notices (`super::seat`). The queues
//! and the streams they serve are `super::queues`; the routing VM's side is
//! `super::answering`.

use std::rc::Weak;

use super::answering::{self, answer_questions, expire_holds};
use super::bookkeeping::{self, Undo};
use super::host;
use super::hostcalls;
use super::queues::{self, resume_with, take_stream, Queue, StreamRef};
use super::seat::{read_seat, take_or_follow, take_seat};
use super::state::{Shared, State};
use super::telling;
use crate::kv_match::EngineHeld;
use crate::relay::{Answer, Ask, Inbound, Late, Part, Verdict};

/// How long a late question's body is kept for its answer: a router that has not
/// answered in this long has lost the question with its VM.
const LATE_KEPT_MS: u64 = 60_000;

/// How often a root context ticks: in `one_vm`, often enough to keep the deadline,
/// and every few milliseconds until the seat is settled, so that a new Envoy's
/// first requests find their router.
pub fn tick_period_ms(state: &State) -> u64 {
    let cfg = state.router.config();
    match &state.relay {
        Part::EveryVm => cfg.tick_ms(),
        Part::Asker { route: None, .. } => SETTLING_TICK_MS,
        Part::Asker { .. } | Part::Router { .. } => deadline_tick_ms(state),
    }
}

/// Half the deadline: a question waits at most one and a half deadlines.
fn deadline_tick_ms(state: &State) -> u64 {
    let cfg = state.router.config();
    (cfg.relay_deadline_ms / 2).clamp(SETTLING_TICK_MS, cfg.tick_ms())
}

/// The tick of a root context that has not found the routing VM yet.
const SETTLING_TICK_MS: u64 = 5;

/// The relay's part of a tick: the seat, the routing VM's holds of silent VMs,
/// what an asking VM has to tell, and the questions past their deadline.
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
    expire_holds(state, now);
    telling::send_if_due(state, now);
    let deadline = state.router.config().relay_deadline_ms;
    let late: Vec<(u32, StreamRef)> = match &mut state.relay {
        Part::Asker { waiting, .. } => waiting
            .extract_if(|_, since| now.saturating_sub(*since) >= deadline)
            .filter_map(|(id, _)| take_stream(id).map(|s| (id, s)))
            .collect(),
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
pub fn ask(
    shared: &Shared,
    state: &mut State,
    ctx: u32,
    path: Option<&str>,
    body: &[u8],
    held: Option<&EngineHeld>,
) -> bool {
    if let Part::Asker { route: None, .. } = state.relay {
        // Not found yet: perhaps it is now, or nobody holds the seat yet (an Envoy
        // whose first request came before any tick): then this VM takes it.
        take_or_follow(shared, state, host::now_ms(), true);
    }
    let Part::Asker { route, reply, .. } = &state.relay else {
        return false;
    };
    let sent = match (*route, *reply) {
        (Some(route), Some(reply)) => {
            let ask = Ask {
                reply,
                ctx,
                path,
                body,
                notes: telling::riding(state, host::now_ms()),
                held: held.cloned(),
            };
            hostcalls::enqueue_shared_queue(route, &ask.encode()).is_ok()
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
        queues::keep_stream(ctx, stream);
    }
}

/// A stream ended: it waits no more, and its prefill copy's answer has no taker.
pub fn forget(state: &mut State, ctx: u32, prefill_token: Option<u32>) {
    if let Part::Asker { waiting, .. } = &mut state.relay {
        waiting.remove(&ctx);
    }
    take_stream(ctx);
    if let Some(token) = prefill_token {
        queues::forget_callout(token);
    }
}

/// A queue of this VM has messages: questions for the routing VM, or answers.
pub fn on_queue_ready(queue_id: u32) {
    let Some((queue, weak)) = queues::served(queue_id) else {
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
    let shared = queues::an_asker().as_ref().and_then(Weak::upgrade);
    let (Some(shared), Some(_)) = (shared, Inbound::decode(&first)) else {
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
    let digest = seat.digest.clone();
    let key = state.shared.keys.relay_seat(&digest);
    let (_, cas) = read_seat(&key);
    let why = "this thread's routing VM failed; its successor routes from now on";
    if !take_seat(&shared, state, (&key, cas), &digest, Some(why)) {
        return;
    }
    queues::register(queue_id, Queue::Route, &shared);
    answering::take(state, &first);
    answer_questions(state, queue_id);
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
        // Routed here at the deadline: what the answer recorded is undone, and
        // what it counted.
        if let (Some(l), Verdict::Routed(r)) = (late, &verdict) {
            let undo = Undo::remote(r.records.clone(), l.body, l.path);
            bookkeeping::forget(state, undo, None);
            telling::never_sent(state, answer.ctx);
            continue;
        }
        // Gone (its client left): nothing to apply; what it counted is undone.
        let Some(stream) = stream else {
            if let Verdict::Routed(_) = verdict {
                telling::never_sent(state, answer.ctx);
            }
            continue;
        };
        resume_with(state, answer.ctx, &stream, move |s, state| {
            s.answered(state, verdict)
        });
    }
}
