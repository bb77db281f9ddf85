//! A routed request's bookkeeping on the host: the in-flight counts it holds until
//! its stream ends, its metrics (`crate::bookkeeping::Booking`) and the tree
//! operations its plan records.

use super::host::HostStore;
use super::state::State;
use crate::bookkeeping::booking;
use crate::plan::Plan;

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

    /// Gives the count back, at most once.
    pub fn release(&mut self, state: &State) {
        if std::mem::take(&mut self.counted) {
            state.shared.inflight.add(&HostStore, &self.worker, -1);
        }
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
