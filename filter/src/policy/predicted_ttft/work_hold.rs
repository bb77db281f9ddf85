//! One `predicted_ttft` request's prefill booking in the in-flight table, as a small
//! state machine: booked at the decision (one request prefilling, its uncached
//! chars ahead of whoever comes next), the prefill part released at the first
//! response byte, which also teaches the worker's prefill cost per char, and the
//! stream's end teaching its service time (first byte to end). A stream that ends
//! before its first byte (reset, client gone, local reply) releases the prefill part
//! then and teaches nothing. Every release happens at most once, and the table
//! saturates at zero, so no count goes negative whatever the order of callbacks.
//! A release says whether it gave back this VM's last count, which the caller
//! publishes at once (`crate::shared::InflightTable::release`). The clock is the
//! caller's, read only when a step learns from it: a streamed answer calls
//! `first_byte` for every chunk, and in Envoy each read is a hostcall.
//!
//! The request's in-flight count is the in-flight table's (`glue::bookkeeping::Held`),
//! released at the stream's end as for every policy.

use super::predict::{learn_prefill, learn_service};
use super::Recall;
use crate::config::WorkerNames;
use crate::decision::Prediction;
use crate::load::WorkerCosts;
use crate::shared::{CostTable, InflightTable, SharedStore};

/// Where a booked request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Sent; its prefill is counted ahead of later requests.
    Prefilling { since_ms: u64 },
    /// First byte seen; the prefill part was released.
    Streaming { since_ms: u64 },
    /// Ended; nothing more to release.
    Done,
}

/// One request's booking on one worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkHold {
    worker: String,
    /// Uncached chars booked.
    chars: u64,
    /// The prefill the prediction put before this request's first byte (ahead plus
    /// its own): what the observed time to first byte is divided by.
    work_chars: u64,
    booked: bool,
    phase: Phase,
}

impl WorkHold {
    /// Books the request at the decision.
    pub fn take(work: &InflightTable, worker: &str, p: &Prediction, now_ms: u64) -> WorkHold {
        work.book_prefill(worker, p.uncached_chars);
        WorkHold {
            worker: worker.to_string(),
            chars: p.uncached_chars,
            work_chars: p.ahead_chars.saturating_add(p.uncached_chars),
            booked: true,
            phase: Phase::Prefilling { since_ms: now_ms },
        }
    }

    #[cfg(test)]
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Whether it gave back this VM's last count.
    fn release_prefill(&mut self, work: &InflightTable) -> bool {
        std::mem::take(&mut self.booked) && work.release_prefill(&self.worker, self.chars)
    }

    /// The first response byte: the prefill is done. Releases the prefill part and
    /// teaches the prefill cost. Only the first call counts. Whether this VM's last
    /// count was given back.
    pub fn first_byte(
        &mut self,
        store: &dyn SharedStore,
        (work, costs, names): (&InflightTable, &CostTable, &WorkerNames),
        (clock, memory_ms): (impl FnOnce() -> u64, u64),
    ) -> bool {
        let Phase::Prefilling { since_ms } = self.phase else {
            return false;
        };
        let now_ms = clock();
        let last = self.release_prefill(work);
        let ttfb_ms = now_ms.saturating_sub(since_ms);
        let at = Recall { now_ms, memory_ms };
        let seen = (ttfb_ms, self.work_chars);
        learn_first_byte(store, (costs, names), &self.worker, seen, at);
        self.phase = Phase::Streaming { since_ms: now_ms };
        last
    }

    /// The stream ended, however it ended. Releases what is still booked; a stream
    /// that had its first byte teaches the service time. Only the first call counts.
    /// Whether this VM's last count was given back.
    pub fn end(
        &mut self,
        store: &dyn SharedStore,
        (work, costs, names): (&InflightTable, &CostTable, &WorkerNames),
        (clock, memory_ms): (impl FnOnce() -> u64, u64),
    ) -> bool {
        let mut last = false;
        match self.phase {
            Phase::Prefilling { .. } => last = self.release_prefill(work),
            Phase::Streaming { since_ms } => {
                let now_ms = clock();
                let span_ms = now_ms.saturating_sub(since_ms);
                let at = Recall { now_ms, memory_ms };
                learn_end(store, (costs, names), &self.worker, span_ms, at);
            }
            Phase::Done => {}
        }
        self.phase = Phase::Done;
        last
    }
}

/// Teaches `worker`'s prefill cost per char at `at`: its first byte came `ttfb_ms`
/// after the decision, with `work_chars` of prefill before it (ahead, and its
/// own). The routing VM of `route_in: one_vm` learns so from what an asking VM
/// measured.
///
/// A worker's first observation, or its first since its costs were forgotten
/// (`Recall::fresh`), moves it from the fleet's mean (of the workers learned
/// lately; the observation itself while none is), as every later one does from
/// its own: one noisy first byte taken whole made an engine look a third slower
/// than its peers, and an engine no cheaper than the others by that much takes
/// no new conversation on a quiet fleet.
pub fn learn_first_byte(
    store: &dyn SharedStore,
    (costs, names): (&CostTable, &WorkerNames),
    worker: &str,
    (ttfb_ms, work_chars): (u64, u64),
    at: Recall,
) {
    let ttfb_us = ttfb_ms as f64 * 1000.0;
    if learn_prefill(None, ttfb_us, work_chars).is_some() {
        let fleet = fleet_if_unlearned(store, (costs, names), worker, at, |c| {
            c.prefill_us_per_char
        });
        costs.learn(store, names, worker, |c| {
            let c = at.fresh(c);
            let prev = c.prefill_us_per_char.or(fleet.prefill_us_per_char);
            WorkerCosts {
                prefill_us_per_char: learn_prefill(prev, ttfb_us, work_chars).or(prev),
                observed_ms: at.now_ms,
                ..c
            }
        });
    }
}

/// Teaches `worker`'s service time at `at`: a stream ran `span_ms` from its first
/// byte (from the fleet's mean the first time, as the prefill cost).
pub fn learn_end(
    store: &dyn SharedStore,
    (costs, names): (&CostTable, &WorkerNames),
    worker: &str,
    span_ms: u64,
    at: Recall,
) {
    let fleet = fleet_if_unlearned(store, (costs, names), worker, at, |c| c.service_ms);
    costs.learn(store, names, worker, |c| {
        let c = at.fresh(c);
        let prev = c.service_ms.or(fleet.service_ms);
        WorkerCosts {
            service_ms: learn_service(prev, span_ms as f64).or(prev),
            observed_ms: at.now_ms,
            ..c
        }
    });
}

/// The fleet's mean costs (`Recall::fleet_mean`) where `worker` has not learned
/// the one `cost` reads lately, else nothing: a pass over the fleet at every
/// response only for the few that need it.
fn fleet_if_unlearned(
    store: &dyn SharedStore,
    (costs, names): (&CostTable, &WorkerNames),
    worker: &str,
    at: Recall,
    cost: impl Fn(WorkerCosts) -> Option<f64>,
) -> WorkerCosts {
    let all = costs.by_worker(store, names);
    let own = names.get(worker).and_then(|i| all.get(i).copied());
    match own.map(|c| cost(at.fresh(c))) {
        Some(Some(_)) => WorkerCosts::default(),
        _ => at.fleet_mean(&all),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::names;
    use crate::load::WorkerWork;
    use crate::shared::testing::{ring, MemStore};
    use crate::shared::{Keys, OpRing};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// How long learned costs are remembered in these tests.
    const MEMORY_MS: u64 = 5000;

    /// Learning or reading at `now_ms`, with these tests' memory.
    fn at(now_ms: u64) -> Recall {
        Recall {
            now_ms,
            memory_ms: MEMORY_MS,
        }
    }

    struct Fixture {
        store: MemStore,
        ring: OpRing,
        work: InflightTable,
        costs: CostTable,
        names: WorkerNames,
    }

    fn fixture() -> Fixture {
        let store = MemStore::default();
        Fixture {
            ring: ring(&store, 4),
            store,
            work: InflightTable::new(1, 60_000),
            costs: CostTable::new(&Keys::new("t")),
            names: names(),
        }
    }

    impl Fixture {
        fn w0(&self) -> WorkerWork {
            self.work
                .by_worker(&self.ring, &names(), (0, true), Default::default())
                .work
                .get(0)
        }
        fn costs0(&self) -> WorkerCosts {
            self.learned(0)
        }
        /// Worker `w`'s costs as learned.
        fn learned(&self, w: usize) -> WorkerCosts {
            self.costs.by_worker(&self.store, &self.names)[w]
        }
        fn take(&self, uncached: u64, ahead: u64, now: u64) -> WorkHold {
            let p = Prediction {
                ttft_us: 0,
                uncached_chars: uncached,
                ahead_chars: ahead,
            };
            WorkHold::take(&self.work, "w0", &p, now)
        }
    }

    #[test]
    fn booked_at_decision_prefill_released_at_first_byte_rest_at_end() {
        let f = fixture();
        let mut a = f.take(4000, 0, 100);
        assert_eq!(
            f.w0(),
            WorkerWork {
                prefilling: 1,
                ahead_chars: 4000
            },
            "the next decision sees this one at once"
        );
        let mut b = f.take(1000, 4000, 101);
        assert_eq!(f.w0().ahead_chars, 5000);
        a.first_byte(&f.store, (&f.work, &f.costs, &f.names), (|| 120, MEMORY_MS));
        assert_eq!(
            f.w0(),
            WorkerWork {
                prefilling: 1,
                ahead_chars: 1000
            }
        );
        assert_eq!(
            f.costs0().prefill_us_per_char,
            Some(5.0),
            "20 ms over 4000 chars"
        );
        assert_eq!(a.phase(), Phase::Streaming { since_ms: 120 });
        a.first_byte(&f.store, (&f.work, &f.costs, &f.names), (|| 500, MEMORY_MS));
        assert_eq!(
            f.w0().ahead_chars,
            1000,
            "a second first byte releases nothing"
        );
        a.end(&f.store, (&f.work, &f.costs, &f.names), (|| 150, MEMORY_MS));
        assert_eq!(f.costs0().service_ms, Some(30.0));
        a.end(&f.store, (&f.work, &f.costs, &f.names), (|| 900, MEMORY_MS));
        assert_eq!(f.costs0().service_ms, Some(30.0), "ends once");
        assert_eq!(a.phase(), Phase::Done);
        // 5000 chars of work before b's first byte at 101 + 50 ms: 10 us per char;
        // the average moves 5 -> 6.
        b.first_byte(&f.store, (&f.work, &f.costs, &f.names), (|| 151, MEMORY_MS));
        assert_eq!(f.costs0().prefill_us_per_char, Some(6.0));
        b.end(&f.store, (&f.work, &f.costs, &f.names), (|| 151, MEMORY_MS));
        assert_eq!(f.w0(), WorkerWork::default());
    }

    #[test]
    fn a_workers_first_observation_moves_it_from_the_fleets_mean() {
        let f = fixture();
        let tables = (&f.costs, &f.names);
        // Nothing learned anywhere: the first observation is taken whole.
        learn_first_byte(&f.store, tables, "w0", (20, 4000), at(1000));
        learn_end(&f.store, tables, "w0", 30, at(1000));
        assert_eq!(
            f.learned(0),
            WorkerCosts {
                prefill_us_per_char: Some(5.0),
                service_ms: Some(30.0),
                observed_ms: 1000
            }
        );
        // w1's first: 10 us a char and 80 ms, a fifth of the way from w0's 5 and 30.
        learn_first_byte(&f.store, tables, "w1", (40, 4000), at(2000));
        learn_end(&f.store, tables, "w1", 80, at(2000));
        assert_eq!(
            f.learned(1),
            WorkerCosts {
                prefill_us_per_char: Some(6.0),
                service_ms: Some(40.0),
                observed_ms: 2000
            }
        );
        // Later observations move each from its own.
        learn_first_byte(&f.store, tables, "w1", (40, 4000), at(3000));
        assert_eq!(f.learned(1).prefill_us_per_char, Some(6.8));
        assert_eq!(f.learned(0).prefill_us_per_char, Some(5.0), "untouched");
    }

    #[test]
    fn costs_not_learned_within_the_memory_are_forgotten() {
        let f = fixture();
        let tables = (&f.costs, &f.names);
        // w0 measured slow (50 us a char), w1 fast (5), both at 1 s.
        learn_first_byte(&f.store, tables, "w0", (200, 4000), at(1000));
        learn_first_byte(&f.store, tables, "w1", (20, 4000), at(1000));
        assert_eq!(at(6000).fresh(f.learned(0)), f.learned(0), "5 s on: remembered");
        assert_eq!(
            at(6001).fresh(f.learned(0)),
            WorkerCosts::default(),
            "past the memory: nothing learned"
        );
        // w1 is measured again at 7 s; w0, shunned, is not. w0's next observation
        // (10 us a char) moves it from the fleet's mean of those learned lately
        // (w1's 5), not from its forgotten 50.
        learn_first_byte(&f.store, tables, "w1", (20, 4000), at(7000));
        assert_eq!(
            at(7000).fleet_mean(&f.costs.by_worker(&f.store, &f.names)),
            WorkerCosts {
                prefill_us_per_char: Some(5.0),
                ..WorkerCosts::default()
            }
        );
        learn_first_byte(&f.store, tables, "w0", (40, 4000), at(7500));
        assert_eq!(f.learned(0).prefill_us_per_char, Some(6.0));
        assert_eq!(f.learned(0).observed_ms, 7500);
    }

    #[test]
    fn a_reset_before_the_first_byte_releases_and_teaches_nothing() {
        let f = fixture();
        let mut a = f.take(4000, 0, 100);
        assert!(
            a.end(&f.store, (&f.work, &f.costs, &f.names), (|| 5000, MEMORY_MS)),
            "this VM's last count: to be published at once"
        );
        assert_eq!(f.w0(), WorkerWork::default());
        assert_eq!(f.costs0(), WorkerCosts::default());
        a.first_byte(&f.store, (&f.work, &f.costs, &f.names), (|| 6000, MEMORY_MS));
        a.end(&f.store, (&f.work, &f.costs, &f.names), (|| 7000, MEMORY_MS));
        assert_eq!(f.w0(), WorkerWork::default(), "never negative, never twice");
        assert_eq!(f.costs0(), WorkerCosts::default());
    }

    #[test]
    fn a_short_prefill_does_not_teach_the_per_char_cost() {
        let f = fixture();
        let mut a = f.take(10, 0, 0);
        a.first_byte(&f.store, (&f.work, &f.costs, &f.names), (|| 40, MEMORY_MS));
        assert_eq!(f.costs0().prefill_us_per_char, None);
        assert_eq!(f.w0(), WorkerWork::default());
    }

    #[test]
    fn other_workers_releases_do_not_touch_this_one() {
        let f = fixture();
        let _a = f.take(300, 0, 0);
        let p = Prediction {
            ttft_us: 0,
            uncached_chars: 700,
            ahead_chars: 0,
        };
        let mut b = WorkHold::take(&f.work, "w1", &p, 0);
        b.end(&f.store, (&f.work, &f.costs, &f.names), (|| 1, MEMORY_MS));
        b.end(&f.store, (&f.work, &f.costs, &f.names), (|| 2, MEMORY_MS));
        assert_eq!(f.w0().ahead_chars, 300);
    }

    #[test]
    fn what_another_vm_measured_teaches_as_a_hold_does() {
        let f = fixture();
        learn_first_byte(&f.store, (&f.costs, &f.names), "w0", (20, 4000), at(100));
        assert_eq!(f.costs0().prefill_us_per_char, Some(5.0), "20 ms over 4000 chars");
        learn_end(&f.store, (&f.costs, &f.names), "w0", 30, at(100));
        assert_eq!(f.costs0().service_ms, Some(30.0));
        assert_eq!(f.w0(), WorkerWork::default(), "nothing booked or released");
    }
}
