//! A routed request's bookkeeping on the host: the in-flight counts it holds until
//! its stream ends, its metrics (`crate::bookkeeping::Booking`) and the tree
//! operations its plan records.

use super::host::HostStore;
use super::state::State;
use crate::bookkeeping::booking;
use crate::decision::Decision;
use crate::plan::Plan;
use crate::work_hold::WorkHold;

/// An in-flight count held on a worker, by name: counts are keyed by name, so one is
/// released correctly even if a config update reorders the workers meanwhile.
pub struct Held {
    worker: String,
    counted: bool,
}

impl Held {
    pub fn take(state: &State, worker: &str) -> Held {
        Held {
            worker: worker.to_string(),
            counted: state.shared.inflight.add(&HostStore, worker, 1),
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
            state.shared.inflight.add(&HostStore, &self.worker, -1);
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

/// Counts the routed request (whose routing text had `text_chars` chars) and records
/// its tree operations (shared with every VM, applied here in ring order).
pub fn book(state: &mut State, plan: Plan, text_chars: usize) {
    state.metrics.book(&booking(&plan), text_chars);
    for op in plan.records {
        state.record(op);
    }
}
