//! What the router knows of the workers' load when it decides: its own in-flight
//! counts (shared by every thread) plus peer replicas' (`crate::background::replica`), the
//! collector's last engine samples, and the
//! overload flags, gathered once per request into a `Loads` snapshot
//! (`crate::shared::read_loads`).
//!
//! Samples are stamped with the filter's clock when they arrive (the collector's
//! clock may differ) and are fresh while younger than `stale_after_ms`.
//!
//! The per-worker values the shared tables store and the policies read (a
//! `Candidate`, `predicted_ttft`'s `WorkerWork` and `WorkerCosts`) are declared
//! here, below both, so that neither imports the other.

use std::rc::Rc;

use crate::tree::TenantId;

/// One engine's load as last reported.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineSample {
    pub num_waiting: u64,
    pub num_running: u64,
    pub kv_usage: Option<f64>,
    pub ttft_p90_s: Option<f64>,
    pub tpot_p90_s: Option<f64>,
    /// Tokens the engine's KV cache holds at most, as the engine states it.
    pub kv_capacity_tokens: Option<u64>,
    /// The engine's prompt tokens counted since it started, cached ones included:
    /// against the text routed to it, its chars per token
    /// (`crate::request::kv_bounds`).
    pub prompt_tokens_total: Option<u64>,
    /// Filter clock (ms) when the push arrived.
    pub at_ms: u64,
}

/// What the last push said about one worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Report {
    Sample(EngineSample),
    /// The collector could not scrape it: unknown, never idle.
    Unreachable {
        at_ms: u64,
    },
}

/// Reports by worker index (`None`: never reported).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadTable {
    pub reports: Vec<Option<Report>>,
}

impl LoadTable {
    /// The worker's sample if it is fresh at `now_ms`.
    pub fn fresh(&self, worker: usize, now_ms: u64, stale_after_ms: u64) -> Option<&EngineSample> {
        match self.reports.get(worker)? {
            Some(Report::Sample(s)) if now_ms.saturating_sub(s.at_ms) < stale_after_ms => Some(s),
            _ => None,
        }
    }
}

/// Values by worker index, and which workers have one. A request's screen refills
/// only the workers that have requests in flight (at 256 workers, visiting every
/// worker's count for that was about 25 Wasm instructions a worker), and a table
/// kept from request to request is cleared in the time its last request's values
/// took to add, not the fleet's: fresh tables zeroed for each request showed in
/// a fleet of 256's count. A table updated in place (`Revision`) may bring a value
/// back to the default: its worker stays listed, once, until the table is cleared.
#[derive(Debug, Clone, Default)]
pub struct Tally<T> {
    values: Vec<T>,
    /// The workers whose value may not be the default, each once.
    busy: Vec<usize>,
    /// Whether each worker is in `busy`.
    listed: Vec<bool>,
}

impl<T: Copy + Default + PartialEq> Tally<T> {
    /// `n` workers' values, all default.
    pub fn zeroed(n: usize) -> Tally<T> {
        Tally::default().cleared(n)
    }

    /// This table with every value back to the default, for `n` workers, its
    /// memory kept.
    pub fn cleared(mut self, n: usize) -> Tally<T> {
        for &i in &self.busy {
            if let Some(v) = self.values.get_mut(i) {
                *v = T::default();
            }
            if let Some(l) = self.listed.get_mut(i) {
                *l = false;
            }
        }
        self.busy.clear();
        self.values.resize(n, T::default());
        self.listed.resize(n, false);
        self
    }

    /// Changes `worker`'s value with `f`; a worker out of range is left out.
    pub fn update(&mut self, worker: usize, f: impl FnOnce(&mut T)) {
        if let (Some(slot), Some(listed)) =
            (self.values.get_mut(worker), self.listed.get_mut(worker))
        {
            f(slot);
            if !*listed && *slot != T::default() {
                *listed = true;
                self.busy.push(worker);
            }
        }
    }

    /// `worker`'s value (out of range: the default).
    pub fn get(&self, worker: usize) -> T {
        self.values.get(worker).copied().unwrap_or_default()
    }

    /// The workers whose value may not be the default (every worker whose value
    /// is not).
    pub fn busy(&self) -> &[usize] {
        &self.busy
    }
}

/// Equal values are equal, whatever order the workers became busy in.
impl<T: PartialEq> PartialEq for Tally<T> {
    fn eq(&self, other: &Tally<T>) -> bool {
        self.values == other.values
    }
}

impl<T: Eq> Eq for Tally<T> {}

/// Requests by worker index.
pub type WorkerCounts = Tally<u64>;

impl WorkerCounts {
    /// Adds `n` to `worker`'s count (saturating); a worker out of range is left out.
    pub fn add(&mut self, worker: usize, n: u64) {
        self.update(worker, |slot| *slot = slot.saturating_add(n));
    }

    /// All counts together (saturating: a garbled peer's count must not wrap it).
    pub fn total(&self) -> u64 {
        self.values.iter().fold(0, |sum, n| sum.saturating_add(*n))
    }
}

impl<T: Copy + Default + PartialEq> From<Vec<T>> for Tally<T> {
    fn from(values: Vec<T>) -> Tally<T> {
        let listed: Vec<bool> = values.iter().map(|v| *v != T::default()).collect();
        let busy = (0..)
            .zip(&listed)
            .filter(|(_, l)| **l)
            .map(|(i, _)| i)
            .collect();
        Tally {
            values,
            busy,
            listed,
        }
    }
}

/// How a request's in-flight tables (`Loads::inflight`, `Loads::work`) were made:
/// whole, or as the previous request's with only the workers whose counts this
/// VM changed since touched (`crate::shared::InflightTable::by_worker`). A screen
/// kept from that request then refills only those workers (`crate::request::candidates`):
/// with dozens of workers busy, summing and refilling every busy worker's count
/// for each request was most of what a large fleet added to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Revision {
    /// This table's number, increasing with each this VM makes.
    pub number: u64,
    /// The number of the table this one was updated from (`None`: made whole).
    pub since: Option<u64>,
    /// The workers whose counts may differ from that table's.
    pub changed: Vec<usize>,
    /// What the table was made from: the worker list's id, whether the work
    /// columns were kept, and the other VMs' rows as read (the encoded bytes).
    pub names: u64,
    pub work: bool,
    pub others: Vec<u8>,
}

/// The workers' load as one request sees it, by worker index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loads {
    /// Router-side in-flight requests by worker index (missing: 0).
    pub inflight: WorkerCounts,
    /// How `inflight` and `work` were made, and what changed since the last
    /// request's.
    pub revision: Revision,
    /// Peer replicas' in-flight requests by worker index, from their fresh reports
    /// (`crate::background::replica`; missing: 0).
    pub peer_inflight: WorkerCounts,
    /// The collector's last reports, shared with this VM's copy of the tables
    /// (`crate::shared::TableCache`): copying them for each request cost a fleet of
    /// 256 tens of thousands of Wasm instructions.
    pub engine: Rc<LoadTable>,
    pub now_ms: u64,
    /// Overload flags by worker index (missing: not flagged), shared with this VM's
    /// copy of the tables like `engine`.
    pub overloaded: Rc<[bool]>,
    /// Down after a failure, by worker index (missing: up); see `crate::worker::health`.
    pub down: Rc<[bool]>,
    /// Down with their last connect failed, by worker index (missing: no).
    pub refused: Rc<[bool]>,
    /// `predicted_ttft` only (else empty): outstanding prefill by worker index.
    pub work: Tally<WorkerWork>,
    /// `predicted_ttft` only: learned costs by worker index, shared with this VM's
    /// copy (`crate::shared::CostTable`).
    pub costs: Rc<Vec<WorkerCosts>>,
    /// `predicted_ttft` only: this Envoy's in-flight counts when the last sample
    /// arrived, by worker index, shared with this VM's copy of the tables.
    pub own_at_sample: Rc<[u64]>,
}

impl Loads {
    /// The fleet's in-flight requests on `worker`: this Envoy's and its peers'.
    pub fn fleet_inflight(&self, worker: usize) -> u64 {
        self.inflight
            .get(worker)
            .saturating_add(self.peer_inflight.get(worker))
    }
}

/// A fresh engine sample's queue, as the gate and the pin read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineQueue {
    pub waiting: u64,
    pub running: u64,
}

/// A routable worker: its router-side in-flight count and, when fresh, what its
/// engine last reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub worker: TenantId,
    pub inflight: u64,
    pub engine: Option<EngineQueue>,
}

impl Candidate {
    /// The engine's own load when known, the router's in-flight count otherwise.
    pub fn pressure(&self) -> u64 {
        match self.engine {
            Some(q) => q.waiting.saturating_add(q.running),
            None => self.inflight,
        }
    }
}

/// A worker's learned costs (`predicted_ttft`'s) (either may be unknown yet).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct WorkerCosts {
    pub prefill_us_per_char: Option<f64>,
    pub service_ms: Option<f64>,
    /// When either was last learned (ms, the filter's clock; 0: never).
    pub observed_ms: u64,
}

/// What the router counts for one worker besides its in-flight requests
/// (`predicted_ttft`'s outstanding prefill).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerWork {
    /// Requests sent whose first byte has not come back.
    pub prefilling: u64,
    /// Their uncached prefill chars.
    pub ahead_chars: u64,
}

#[cfg(test)]
impl EngineSample {
    /// A sample of an engine's queue alone, no KV or latency figures; a test sets
    /// the others it needs with `..EngineSample::queue(..)`.
    pub fn queue(num_waiting: u64, num_running: u64, at_ms: u64) -> EngineSample {
        EngineSample {
            num_waiting,
            num_running,
            kv_usage: None,
            ttft_p90_s: None,
            tpot_p90_s: None,
            kv_capacity_tokens: None,
            prompt_tokens_total: None,
            at_ms,
        }
    }
}

#[cfg(test)]
impl Loads {
    /// No engine samples, no flags: the router's own counts only.
    pub fn inflight_only(inflight: &[u64]) -> Loads {
        Loads {
            inflight: inflight.to_vec().into(),
            ..Loads::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn worker_counts_know_their_busy_workers() {
        let mut c = WorkerCounts::zeroed(4);
        c.add(2, 3);
        c.add(0, 0);
        c.add(2, 1);
        c.add(1, 5);
        c.add(9, 7);
        assert_eq!((c.get(2), c.get(1), c.get(0), c.get(9)), (4, 5, 0, 0));
        assert_eq!(c.busy(), &[2, 1], "each once, none for a 0 or out of range");
        assert_eq!(c.total(), 9);
        let same: WorkerCounts = vec![0, 5, 4, 0].into();
        assert_eq!(same.busy(), &[1, 2]);
        assert_eq!(c, same, "equal counts, whatever the order they came in");
        c.add(3, u64::MAX);
        c.add(3, 1);
        assert_eq!((c.get(3), c.total()), (u64::MAX, u64::MAX), "saturating");
    }

    #[test]
    fn a_cleared_tally_is_a_fresh_one_of_its_new_size() {
        let mut c = WorkerCounts::zeroed(4);
        c.add(3, 2);
        c.add(1, 1);
        let mut c = c.cleared(4);
        assert_eq!(c, WorkerCounts::zeroed(4), "every value back to 0");
        assert!(c.busy().is_empty());
        c.add(0, 1);
        assert_eq!(c.busy(), &[0], "busy again from scratch");
        c.add(3, 5);
        let c = c.cleared(2);
        assert_eq!(
            c,
            WorkerCounts::zeroed(2),
            "shrunk: what was busy beyond it is gone"
        );
        let mut c = c.cleared(5);
        assert_eq!(
            c,
            WorkerCounts::zeroed(5),
            "grown: the new workers start at 0"
        );
        c.add(4, 1);
        assert_eq!((c.get(4), c.busy()), (1, &[4][..]));
        let mut w: Tally<WorkerWork> = Tally::zeroed(3);
        w.update(2, |w| w.prefilling += 1);
        w.update(2, |w| w.ahead_chars += 10);
        assert_eq!(w.busy(), &[2], "each once");
        let w = w.cleared(3);
        assert_eq!((w.get(2), w.busy().len()), (WorkerWork::default(), 0));
    }

    #[test]
    fn fleet_inflight_adds_the_peers() {
        let loads = Loads {
            peer_inflight: vec![0, 5].into(),
            ..Loads::inflight_only(&[2, 1])
        };
        assert_eq!(loads.fleet_inflight(0), 2);
        assert_eq!(loads.fleet_inflight(1), 6);
        assert_eq!(loads.fleet_inflight(7), 0);
    }

    #[test]
    fn freshness_is_strictly_younger_than_the_limit() {
        let t = LoadTable {
            reports: vec![
                Some(Report::Sample(EngineSample::queue(1, 0, 1000))),
                Some(Report::Unreachable { at_ms: 1000 }),
                None,
            ],
        };
        assert!(t.fresh(0, 1999, 1000).is_some());
        assert!(t.fresh(0, 2000, 1000).is_none(), "age == limit is stale");
        assert!(
            t.fresh(1, 1000, 1000).is_none(),
            "unreachable is never a sample"
        );
        assert!(t.fresh(2, 1000, 1000).is_none());
        assert!(t.fresh(9, 1000, 1000).is_none());
    }
}
