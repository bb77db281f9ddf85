//! A routed request's bookkeeping on the host: the in-flight counts it holds until
//! its stream ends, its metrics (`crate::bookkeeping::Booking`), the tree
//! operations its plan records, and their undoing if no engine served it.

use super::host::HostStore;
use super::state::State;
use crate::bookkeeping::booking;
use crate::decision::Decision;
use crate::plan::Plan;
use crate::router::Record;
use crate::shared::Op;
use crate::work_hold::WorkHold;

/// An in-flight count held on a worker, by name: counts are keyed by name, so one is
/// released correctly even if a config update reorders the workers meanwhile. The
/// count is this VM's (`crate::shared::InflightTable`): kept in memory even when
/// its publication failed, so it is released whatever happened to the write.
pub struct Held {
    worker: String,
    counted: bool,
}

impl Held {
    /// Published by the request's first tree record, else at the end of `book`.
    pub fn take(state: &State, worker: &str) -> Held {
        state.shared.inflight.take(worker);
        Held {
            worker: worker.to_string(),
            counted: true,
        }
    }

    /// The worker, by name: what the response headers name, even if the worker list
    /// changed (and indices moved) while the request ran.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// Gives the count back, at most once.
    pub fn release(&mut self, state: &State) {
        if std::mem::take(&mut self.counted) {
            let s = &state.shared;
            let now = s.recent_ms.get();
            s.inflight.release(&HostStore, &s.ring, &self.worker, now);
        }
    }
}

/// Books a `predicted_ttft` decision's prefill on `worker` (other policies: none).
pub fn take_work(state: &State, worker: &str, d: &Decision) -> Option<WorkHold> {
    let p = d.predicted?;
    state.metrics.predicted_ttft_ms.set(p.ttft_us / 1000);
    Some(WorkHold::take(
        &HostStore,
        &state.shared.work,
        worker,
        &p,
        super::host::now_ms(),
    ))
}

/// The first response byte of a booked request.
pub fn first_byte(state: &State, hold: &mut Option<WorkHold>) {
    if let Some(h) = hold.as_mut() {
        let s = &state.shared;
        h.first_byte(&HostStore, &s.work, &s.costs, super::host::now_ms());
    }
}

/// The end of a booked request's stream (or prefill call).
pub fn end_work(state: &State, hold: &mut Option<WorkHold>) {
    if let Some(h) = hold.as_mut() {
        let s = &state.shared;
        h.end(&HostStore, &s.work, &s.costs, super::host::now_ms());
    }
}

/// What undoes a routed request's tree records if no engine serves it: per insert,
/// its `Op::Forget` (the text, what the worker held of it before, the insert's
/// sequence). The texts are the records' own, moved here, not copies.
#[derive(Default)]
pub struct Undo {
    forgets: Vec<Op>,
}

/// Counts the routed request (whose routing text had `text_chars` chars), records
/// its tree operations (shared with every VM, applied here in ring order) and
/// publishes its in-flight counts (`Held::take`) if no record carried them; returns
/// the records' undoing. An insert kept on this VM only (the ring refused it) is
/// not undone.
pub fn book(state: &mut State, plan: Plan, text_chars: usize) -> Undo {
    state.metrics.book(&booking(&plan), text_chars);
    let mut undo = Undo::default();
    for Record { op, held_chars } in plan.records {
        if let Some(seq) = state.record(&op) {
            undo.forgets.extend(op.into_forget(held_chars, seq));
        }
    }
    let s = &state.shared;
    s.inflight.flush(&HostStore, &s.ring, s.recent_ms.get());
    undo
}

/// A routed request no engine served: counts it (`llm_router_unserved`) and
/// forgets what it recorded under `worker` (its main upstream failed; a prefill
/// that served its part keeps it), or under every worker (`None`: the filter
/// answered it after routing).
pub fn unserved(state: &mut State, undo: Undo, worker: Option<&str>) {
    state.metrics.unserved.inc();
    for op in undo.forgets {
        let ours = match (&op, worker) {
            (Op::Forget { worker: w, .. }, Some(only)) => w == only,
            _ => true,
        };
        if ours {
            state.record(&op);
        }
    }
}
