//! `predicted_ttft`'s model: each candidate's predicted time to first token for
//! a request, and how each engine's costs are learned from what it serves. The
//! rungs that choose among the predictions are `super::ladder`'s.
//!
//! For every candidate `w` (after the overload screen), with the request's routing
//! text of `input` chars:
//!
//! ```text
//! uncached(w)  = input - cached(w)          cached(w): w's own match depth in the tree
//! ttft_us(w)   = prefill_us_per_char(w) * (wait_chars(w) + uncached(w))
//!              + service_ms(w) * 1000 * wait_requests(w)
//! cost_us(w)   = ttft_us(w) + prefill_us_per_char(w) * evicts(w)
//! ```
//!
//! The ladder ranks by `cost_us`; the decision reports `ttft_us`.
//!
//! - the wait (`wait_for_slot`): an engine runs `slots(w)` requests at once. While
//!   fewer than that are on it (`present`: this Envoy's in flight there plus
//!   `others`), a new request starts at once and waits for nobody. Past that it is
//!   `present + 1 - slots` in the queue, and each slot frees after about one
//!   average request there: its share of `ahead_chars` as prefill and, where the
//!   engine is known to be full at `slots`, a service time (a whole one for each
//!   request still prefilling: it holds its slot while it decodes). On one slot
//!   that is every request ahead;
//! - `slots` (`Slots::limit`): once a sample showed requests waiting, the requests
//!   it showed running: a limit. Until then the most seen running at once, at
//!   least one: a floor, so prefill beyond it is waited for (a burst on engines of
//!   one slot spreads), but no service is: a request past what an engine was seen
//!   running is not known to wait for another's decode, and routers that assumed
//!   so kept every engine at the concurrency it happened to have been sent. An
//!   engine not yet seen full in a pool where another was is taken to have that
//!   one's limit (a pool's engines are alike), if it was not seen running more.
//!   An engine never sampled (no collector) is taken as one slot: every request
//!   ahead is waited for, its prefill and, past its first byte, its service;
//! - `ahead_chars`: uncached prefill chars this Envoy sent to `w` whose first byte
//!   has not come back (booked at the decision, released at the first response
//!   byte; shared by every thread, so the next request sees this one at once);
//! - `others`: what a fresh engine sample reports (waiting + running) beyond what
//!   this Envoy had in flight there when the sample was taken: load from other
//!   routers. No fresh sample: 0 (fail open, the router's own count stands);
//! - `prefill_us_per_char`, `service_ms`: learned per worker from observed time to
//!   first byte (over the wait chars and own chars the prediction put before it)
//!   and stream duration (moving averages, `learn`); until then the mean of the
//!   candidates' learned values, the configured priors while none has any
//!   (`TtftParams::with_fleet_priors`);
//! - `evicts(w)`: where the trees are bounded by the engines' caches, the chars of
//!   other texts a full cache evicts to take this request's uncached part, as far
//!   as another worker already holds that part (`super::room::avoidable_eviction`).
//!   What an engine evicts, some later request prefills again; a copy of a prefix
//!   another engine holds is an eviction the fleet did not need.

use super::TtftParams;
use crate::load::{WorkerCosts, WorkerWork};
use crate::tree::TenantId;

/// Moving-average weight of a new observation.
pub const LEARN_WEIGHT: f64 = 0.2;
/// Fewer prefill chars than this say little about the per-char cost (fixed
/// overheads dominate), so they do not teach it.
pub const MIN_LEARN_CHARS: u64 = 256;
/// The filter's clock counts milliseconds: a first byte in the same millisecond took
/// about half of one, not nothing (a zero cost would make a worker look free).
pub const MIN_TTFB_US: f64 = 500.0;

/// One candidate as the model sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftCandidate {
    pub worker: TenantId,
    /// This Envoy's requests in flight there (every thread).
    pub inflight: u64,
    pub work: WorkerWork,
    /// Requests the engine reports beyond this Envoy's.
    pub others: u64,
    /// Chars of this request's routing text the worker holds.
    pub cached_chars: u64,
    /// The request continues a text this worker holds (a conversation's next turn).
    pub continues: bool,
    pub conversations: u64,
    pub costs: WorkerCosts,
    /// Requests the engine runs at once, as far as its samples showed, and whether
    /// it is known to be full there (`Slots::limit`).
    pub slots: SlotLimit,
    /// Chars of other texts this placement would evict from a full cache where
    /// another worker's copy of the request's prefix would have spared them
    /// (`super::room::avoidable_eviction`).
    pub evicts_chars: u64,
}

impl TtftCandidate {
    /// Predicted time to first token here, in microseconds.
    pub fn predict_us(&self, p: &TtftParams, input_chars: u64) -> f64 {
        let service_us = self.costs.service_ms.unwrap_or(p.service_ms) * 1000.0;
        let uncached = input_chars.saturating_sub(self.cached_chars) as f64;
        let (ahead, queued) = self.wait();
        self.prefill_us_per_char(p) * (ahead + uncached) + service_us * queued
    }

    /// The prefill of what the placement evicts needlessly (`evicts_chars`), which
    /// some later request pays for here.
    fn eviction_us(&self, p: &TtftParams) -> f64 {
        self.prefill_us_per_char(p) * self.evicts_chars as f64
    }

    fn prefill_us_per_char(&self, p: &TtftParams) -> f64 {
        self.costs
            .prefill_us_per_char
            .unwrap_or(p.prefill_us_per_char)
    }

    /// The work a new request waits for here: prefill chars and requests past
    /// their first byte.
    pub fn wait(&self) -> (f64, f64) {
        wait_for_slot(
            self.inflight.saturating_add(self.others),
            (self.work.prefilling, self.work.ahead_chars),
            self.slots,
        )
    }

    /// The candidate as the ladder compares it, predicted for a request of
    /// `input_chars`: what placing the request here costs is its predicted time
    /// to first token and the prefill of what it needlessly evicts.
    pub fn scored(&self, p: &TtftParams, input_chars: u64) -> Scored {
        // Predicted once: the cost is the prediction and the eviction.
        let ttft_us = self.predict_us(p, input_chars);
        Scored {
            worker: self.worker,
            continues: self.continues,
            inflight: self.inflight,
            cached_chars: self.cached_chars,
            conversations: self.conversations,
            ahead_chars: self.wait().0.round() as u64,
            ttft_us,
            cost_us: ttft_us + self.eviction_us(p),
        }
    }
}

/// A candidate as the ladder compares it: its prediction and what the rungs read.
/// The router scores each candidate as it gathers it, so the ladder reads
/// these few fields rather than the whole candidate (a fleet of 256 paid for every
/// byte of every pass).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scored {
    pub worker: TenantId,
    pub continues: bool,
    pub inflight: u64,
    pub cached_chars: u64,
    pub conversations: u64,
    /// Uncached prefill chars ahead of the request there (`WorkerWork`).
    pub ahead_chars: u64,
    /// The prediction (`TtftCandidate::predict_us`).
    pub ttft_us: f64,
    /// What the ladder ranks by: the prediction and the eviction it causes
    /// (`TtftCandidate::scored`).
    pub cost_us: f64,
}

/// A request's wait for a running slot, as prefill chars and service times (the
/// units of the learned costs), on an engine running `slots` at once with
/// `present` requests on it, `prefilling` of them holding `ahead_chars` uncached
/// chars: none while a slot is free, else its place in the queue over the slots,
/// each freeing after about one average request. How much service is waited for
/// depends on what is known of the slots (`SlotsSeen`).
pub fn wait_for_slot(
    present: u64,
    (prefilling, ahead_chars): (u64, u64),
    slots: SlotLimit,
) -> (f64, f64) {
    let count = slots.count.max(1);
    if present < count {
        return (0.0, 0.0);
    }
    let streaming = present.saturating_sub(prefilling);
    if count == 1 {
        // A queue of one: every request ahead, its prefill and its service, in
        // whole numbers (the shares below may round an ulp off them, and an ulp
        // decides exact ties between engines alike).
        let services = match slots.seen {
            SlotsSeen::Never => streaming,
            SlotsSeen::Running => 0,
            SlotsSeen::Full => present,
        };
        return (ahead_chars as f64, services as f64);
    }
    // The average request on the engine: its share of the prefill chars.
    let turns = (present + 1 - count) as f64 / count as f64;
    let mean_chars = ahead_chars as f64 / present as f64;
    let share = |n: u64| n as f64 / present as f64;
    let services = match slots.seen {
        SlotsSeen::Never => turns * share(streaming),
        SlotsSeen::Running => 0.0,
        // A request still prefilling holds its slot for a whole service after
        // its first byte, so where they hold the slots the first in the queue
        // waits a whole round; one past its first byte frees its slot partway,
        // about the average share.
        SlotsSeen::Full => share(prefilling.min(present)) * turns.ceil() + share(streaming) * turns,
    };
    (turns * mean_chars, services)
}

/// What the samples showed of an engine's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotsSeen {
    /// No sample came (no collector): taken as one slot, the service of the
    /// requests past their first byte waited for.
    Never,
    /// Requests running, never any waiting: the most seen running is a floor, and
    /// a request past it is not known to wait for another's service.
    Running,
    /// Requests waiting, this engine's or another of the pool's: full at the
    /// count, each request there holding its slot for a service.
    Full,
}

/// What a candidate's wait knows of its engine's running slots (`Slots::limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLimit {
    /// Requests the engine runs at once, as far as known (at least one).
    pub count: u64,
    pub seen: SlotsSeen,
}

impl SlotLimit {
    /// An engine never sampled: one slot.
    pub const UNSAMPLED: SlotLimit = SlotLimit {
        count: 1,
        seen: SlotsSeen::Never,
    };
}

/// One engine's running slots as its samples showed them. A sample with requests
/// waiting shows them all taken: the engine runs exactly as many as were running
/// then (the most such a sample showed, should the engine's limit move). Until
/// one does, never more than the most it was seen running at once, and at least
/// one: a router that assumed more would send a burst to an engine of one slot as
/// if it ran them all.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Slots {
    /// The most running while some waited (0: never seen full).
    full: u64,
    /// The most running at once.
    seen: u64,
    /// Whether any sample came.
    sampled: bool,
}

impl Slots {
    /// Takes one fresh sample.
    pub fn observe(&mut self, waiting: u64, running: u64) {
        self.sampled = true;
        self.seen = self.seen.max(running);
        if waiting > 0 {
            self.full = self.full.max(running);
        }
    }

    /// Where a sample showed the engine full.
    pub fn full(&self) -> Option<u64> {
        (self.full > 0).then_some(self.full)
    }

    /// What a request's wait knows of the engine's slots, given the least that
    /// another engine of the pool was seen full at (`pool_full`).
    pub fn limit(&self, pool_full: Option<u64>) -> SlotLimit {
        match (self.full(), self.sampled, pool_full) {
            (Some(full), _, _) => SlotLimit {
                count: full,
                seen: SlotsSeen::Full,
            },
            (None, false, _) => SlotLimit::UNSAMPLED,
            (None, true, Some(pool)) => SlotLimit {
                count: pool.max(self.seen).max(1),
                seen: SlotsSeen::Full,
            },
            (None, true, None) => SlotLimit {
                count: self.seen.max(1),
                seen: SlotsSeen::Running,
            },
        }
    }
}

/// Engine requests beyond what this Envoy had in flight there when the sample was
/// taken: other routers' load. Never negative.
pub fn others_load(engine_waiting_running: u64, own_at_sample: u64) -> u64 {
    engine_waiting_running.saturating_sub(own_at_sample)
}

/// One moving-average step; the first observation is taken as is.
fn average(prev: Option<f64>, sample: f64) -> f64 {
    match prev {
        Some(p) if p.is_finite() => p + LEARN_WEIGHT * (sample - p),
        _ => sample,
    }
}

/// Learns the prefill cost per char from one observed time to first byte: the
/// time over the prefill chars the prediction put before it (those ahead plus its
/// own). Too few chars, or a time that is not a number, teach nothing (`None`).
pub fn learn_prefill(prev: Option<f64>, ttfb_us: f64, work_chars: u64) -> Option<f64> {
    if work_chars < MIN_LEARN_CHARS || !ttfb_us.is_finite() || ttfb_us < 0.0 {
        return None;
    }
    Some(average(prev, ttfb_us.max(MIN_TTFB_US) / work_chars as f64))
}

/// Learns the service time from one observed span between first byte and stream
/// end (how long the request held the engine after prefill).
pub fn learn_service(prev: Option<f64>, span_ms: f64) -> Option<f64> {
    if !span_ms.is_finite() || span_ms < 0.0 {
        return None;
    }
    Some(average(prev, span_ms))
}

#[cfg(test)]
pub(super) mod testing {
    use super::*;

    pub const P: TtftParams = TtftParams {
        load_factor: 0.25,
        prefill_us_per_char: 5.0,
        service_ms: 20.0,
        stay_factor: 1.0,
        sample_size: 0,
        cost_memory_ms: 5000,
    };

    pub fn cand(worker: TenantId, inflight: u64, cached: u64) -> TtftCandidate {
        TtftCandidate {
            worker,
            inflight,
            work: WorkerWork::default(),
            others: 0,
            cached_chars: cached,
            continues: false,
            conversations: 0,
            costs: WorkerCosts::default(),
            slots: SlotLimit::UNSAMPLED,
            evicts_chars: 0,
        }
    }

    /// Candidate `worker` holding `cached` chars, with one request in flight whose
    /// prefill of `ahead_chars` has not come back.
    pub fn prefilling(worker: TenantId, cached: u64, ahead_chars: u64) -> TtftCandidate {
        TtftCandidate {
            work: WorkerWork {
                prefilling: 1,
                ahead_chars,
            },
            ..cand(worker, 1, cached)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Full at `count`.
    const fn limit(count: u64) -> SlotLimit {
        SlotLimit {
            count,
            seen: SlotsSeen::Full,
        }
    }

    /// Seen running `count` at most, never full.
    const fn floor(count: u64) -> SlotLimit {
        SlotLimit {
            count,
            seen: SlotsSeen::Running,
        }
    }

    #[test]
    fn a_free_slot_waits_for_nobody_and_a_full_engine_for_its_share_of_the_queue() {
        // 3 on an engine of 4 slots: a slot is free.
        assert_eq!(wait_for_slot(3, (3, 3000), limit(4)), (0.0, 0.0));
        // 4 on 4, all prefilling: first in the queue, one quarter of the way
        // through the prefill ahead (each slot frees after about one average
        // request: 1000 chars), and a whole service: each of them holds its slot
        // for one after its first byte.
        assert_eq!(wait_for_slot(4, (4, 4000), limit(4)), (250.0, 1.0));
        // 8 on 2 slots, 4 prefilling 2000 chars, 4 streaming: 7 / 2 turns of the
        // average request (250 chars of prefill); of the service, half the
        // requests hold a slot for whole ones (4 rounds), half for the rest of
        // theirs (3.5 turns).
        assert_eq!(
            wait_for_slot(8, (4, 2000), limit(2)),
            (3.5 * 250.0, 0.5 * 4.0 + 0.5 * 3.5)
        );
        // One slot: every request ahead is waited for, prefill and service.
        assert_eq!(wait_for_slot(2, (2, 600), limit(1)), (600.0, 2.0));
        // In whole numbers: 3 x (1001 / 3) is not 1001 in floating point.
        assert_eq!(wait_for_slot(3, (1, 1001), limit(1)), (1001.0, 3.0));
        // A slot count of 0 reads as 1; an engine wider than its load never queues.
        assert_eq!(wait_for_slot(1, (1, 100), limit(0)), (100.0, 1.0));
        assert_eq!(wait_for_slot(500, (500, 1), limit(u64::MAX)), (0.0, 0.0));
        // Never sampled: one slot, the service of those past their first byte.
        let never = SlotLimit::UNSAMPLED;
        assert_eq!(wait_for_slot(2, (2, 600), never), (600.0, 0.0));
        assert_eq!(wait_for_slot(3, (1, 1001), never), (1001.0, 2.0));
        let never_two = SlotLimit { count: 2, ..never };
        assert_eq!(wait_for_slot(8, (4, 2000), never_two), (3.5 * 250.0, 3.5 * 0.5));
    }

    #[test]
    fn an_engine_never_seen_full_is_waited_for_its_prefill_but_not_its_service() {
        // Seen running 4 at most: the prefill ahead as on an engine full at 4,
        // but no service, whatever is prefilling or streaming.
        assert_eq!(wait_for_slot(4, (4, 4000), floor(4)), (250.0, 0.0));
        assert_eq!(wait_for_slot(8, (4, 2000), floor(2)), (3.5 * 250.0, 0.0));
        assert_eq!(wait_for_slot(3, (1, 1001), floor(1)), (1001.0, 0.0));
        assert_eq!(wait_for_slot(3, (3, 3000), floor(4)), (0.0, 0.0));
    }

    #[test]
    fn an_engines_slots_are_the_most_seen_running_until_a_queue_shows_them_all() {
        let mut s = Slots::default();
        assert_eq!(s.limit(None), SlotLimit::UNSAMPLED, "never sampled");
        assert_eq!(s.limit(Some(8)), SlotLimit::UNSAMPLED, "whatever the pool's");
        s.observe(0, 0);
        assert_eq!(s.limit(None), floor(1), "an idle sample shows one at least");
        s.observe(0, 3);
        assert_eq!(s.limit(None), floor(3));
        s.observe(0, 2);
        assert_eq!(s.limit(None), floor(3), "fewer running later does not lower it");
        s.observe(0, 5);
        assert_eq!(s.limit(None), floor(5));
        assert_eq!(s.full(), None);
        // Another engine of the pool was seen full: its limit, unless this one
        // was seen running more.
        assert_eq!(s.limit(Some(8)), limit(8));
        assert_eq!(s.limit(Some(2)), limit(5));
        // Requests waiting: the engine is full at what runs, whatever the pool's.
        let mut full = Slots::default();
        full.observe(0, 1);
        full.observe(2, 4);
        assert_eq!(full.limit(None), limit(4));
        assert_eq!(full.limit(Some(8)), limit(4));
        assert_eq!(full.full(), Some(4));
        full.observe(0, 6);
        assert_eq!(full.limit(None), limit(4), "a full engine's count stands over idle samples");
        full.observe(1, 6);
        assert_eq!(full.limit(None), limit(6), "the most a full sample showed");
        full.observe(3, 2);
        assert_eq!(full.limit(None), limit(6), "a full sample with fewer running does not lower it");
    }

    #[test]
    fn the_prediction_is_work_ahead_plus_own_uncached_prefill() {
        let mut c = cand(0, 3, 1000);
        c.work = WorkerWork {
            prefilling: 1,
            ahead_chars: 400,
        };
        c.others = 2;
        // 5 us * (400 + 4000 - 1000) + 20 ms * (3 - 1 busy + 2 others)
        assert_eq!(c.predict_us(&P, 4000), 5.0 * 3400.0 + 20_000.0 * 4.0);
        c.costs = WorkerCosts {
            prefill_us_per_char: Some(1.0),
            service_ms: Some(0.0),
            ..WorkerCosts::default()
        };
        assert_eq!(
            c.predict_us(&P, 4000),
            3400.0,
            "learned costs replace priors"
        );
        c.cached_chars = 9999;
        assert_eq!(
            c.predict_us(&P, 4000),
            400.0,
            "cached beyond input: no own prefill"
        );
    }

    #[test]
    fn learning_is_a_moving_average_with_guards() {
        assert_eq!(learn_prefill(None, 4000.0, 1000), Some(4.0), "first sample");
        assert_eq!(learn_prefill(Some(5.0), 5000.0, 1000), Some(5.0));
        assert_eq!(
            learn_prefill(Some(5.0), 0.0, 1000),
            Some(4.1),
            "0 ms counts as 0.5 ms: 5 + 0.2 * (0.5 - 5)"
        );
        assert_eq!(learn_prefill(Some(5.0), 1e6, MIN_LEARN_CHARS - 1), None);
        assert_eq!(learn_prefill(Some(5.0), f64::NAN, 1000), None);
        assert_eq!(learn_prefill(Some(5.0), -1.0, 1000), None);
        assert_eq!(learn_prefill(Some(f64::NAN), 1000.0, 1000), Some(1.0));
        assert_eq!(learn_service(None, 30.0), Some(30.0));
        assert_eq!(learn_service(Some(30.0), 80.0), Some(40.0));
        assert_eq!(learn_service(Some(30.0), f64::INFINITY), None);
    }
}
