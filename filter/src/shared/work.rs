//! `predicted_ttft`'s shared tables, each one key changed with CAS retries:
//!
//! - `WorkTable`: per worker, requests sent whose first byte has not come back and
//!   their uncached prefill chars. Booked at the decision, the prefill part released
//!   at the first response byte (or when the stream ends first), saturating at zero,
//!   so every thread's next decision sees it at once. Each VM owns what it booked,
//!   like the in-flight counts (`super::owned`), so a reloaded VM's bookings expire;
//! - `CostTable`: (worker name -> two numbers): per worker, the learned prefill cost per char (us) and service
//!   time (ms), moving averages every thread updates and reads;
//! - the in-flight counts as they were when the collector's last sample arrived
//!   (`own_at_sample`), so engine load beyond them reads as other routers' load.

use super::inflight::{decode_counts, encode_counts};
use super::owned::OwnedCounts;
use super::{
    by_worker_name, put_bytes, InflightTable, Keys, Reader, SetOutcome, SharedStore, CAS_ATTEMPTS,
};
use crate::config::WorkerConfig;
use crate::policy::{WorkerCosts, WorkerWork};

/// Stored form of "unknown" for a learned cost.
const UNKNOWN: u64 = u64::MAX;

fn encode(rows: &[(String, [u64; 2])]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for (name, [a, b]) in rows {
        put_bytes(&mut out, name.as_bytes());
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
    }
    out
}

fn decode(bytes: &[u8]) -> Vec<(String, [u64; 2])> {
    let mut r = Reader(bytes);
    let Some(n) = r.u32() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let (Some(name), Some(a), Some(b)) = (r.string(), r.u64(), r.u64()) else {
            break;
        };
        out.push((name, [a, b]));
    }
    out
}

/// One key of (worker name -> two numbers).
#[derive(Debug, Clone)]
struct PairTable {
    key: String,
}

impl PairTable {
    fn read(&self, store: &dyn SharedStore) -> Vec<(String, [u64; 2])> {
        store
            .get(&self.key)
            .map(|(v, _)| decode(&v))
            .unwrap_or_default()
    }

    fn by_worker(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
    ) -> Vec<Option<[u64; 2]>> {
        let rows: Vec<(String, Option<[u64; 2]>)> = self
            .read(store)
            .into_iter()
            .map(|(n, v)| (n, Some(v)))
            .collect();
        by_worker_name(&rows, workers, None)
    }

    /// Changes `worker`'s row with `f` (a missing row starts as `empty`); rows equal
    /// to `empty` are dropped. Whether it was stored.
    fn update(
        &self,
        store: &dyn SharedStore,
        worker: &str,
        empty: [u64; 2],
        f: impl Fn([u64; 2]) -> [u64; 2],
    ) -> bool {
        for _ in 0..CAS_ATTEMPTS {
            let (mut rows, cas) = match store.get(&self.key) {
                Some((v, cas)) => (decode(&v), cas),
                None => (Vec::new(), 0),
            };
            match rows.iter_mut().find(|(n, _)| n == worker) {
                Some((_, v)) => *v = f(*v),
                None => rows.push((worker.to_string(), f(empty))),
            }
            rows.retain(|(_, v)| *v != empty);
            match store.set(&self.key, &encode(&rows), cas) {
                SetOutcome::Stored => return true,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return false,
            }
        }
        false
    }
}

/// Prefill work outstanding per worker for the whole Envoy, and this VM's own.
#[derive(Debug)]
pub struct WorkTable(OwnedCounts<2>);

impl WorkTable {
    /// The table as VM `vm` writes it (see `InflightTable::new`).
    pub fn new(keys: &Keys, vm: u64, expiry_ms: u64) -> WorkTable {
        WorkTable(OwnedCounts::new(keys.work(), vm, expiry_ms))
    }

    pub fn set_expiry(&mut self, expiry_ms: u64) {
        self.0.set_expiry(expiry_ms);
    }

    /// Outstanding work by worker index (never booked: none).
    pub fn by_worker(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
        now_ms: u64,
    ) -> Vec<WorkerWork> {
        self.0
            .by_worker(store, workers, now_ms)
            .into_iter()
            .map(|[p, c]| WorkerWork {
                prefilling: p,
                ahead_chars: c,
            })
            .collect()
    }

    /// Adds (or with negative deltas, releases) one request's prefill on this VM,
    /// saturating at zero. Whether it was published (kept either way).
    pub fn add(
        &self,
        store: &dyn SharedStore,
        worker: &str,
        requests: i64,
        chars: i64,
        now_ms: u64,
    ) -> bool {
        self.0.add(store, worker, [requests, chars], now_ms)
    }

    /// The tick's heartbeat (`super::owned::OwnedCounts::refresh`).
    pub fn refresh(&self, store: &dyn SharedStore, now_ms: u64) -> bool {
        self.0.refresh(store, now_ms)
    }
}

/// Learned costs per worker for the whole Envoy.
#[derive(Debug, Clone)]
pub struct CostTable(PairTable);

fn to_bits(v: Option<f64>) -> u64 {
    v.filter(|x| x.is_finite()).map_or(UNKNOWN, f64::to_bits)
}

fn from_bits(b: u64) -> Option<f64> {
    (b != UNKNOWN)
        .then(|| f64::from_bits(b))
        .filter(|x| x.is_finite())
}

impl CostTable {
    pub fn new(keys: &Keys) -> CostTable {
        CostTable(PairTable { key: keys.costs() })
    }

    pub fn by_worker(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> Vec<WorkerCosts> {
        self.0
            .by_worker(store, workers)
            .into_iter()
            .map(|v| {
                v.map_or(WorkerCosts::default(), |[p, s]| WorkerCosts {
                    prefill_us_per_char: from_bits(p),
                    service_ms: from_bits(s),
                })
            })
            .collect()
    }

    /// Applies a learning step to `worker`'s costs (read and written under CAS, so
    /// concurrent observations all count).
    pub fn learn(
        &self,
        store: &dyn SharedStore,
        worker: &str,
        step: impl Fn(WorkerCosts) -> WorkerCosts,
    ) -> bool {
        self.0.update(store, worker, [UNKNOWN, UNKNOWN], |[p, s]| {
            let next = step(WorkerCosts {
                prefill_us_per_char: from_bits(p),
                service_ms: from_bits(s),
            });
            [to_bits(next.prefill_us_per_char), to_bits(next.service_ms)]
        })
    }
}

/// The in-flight counts as of the collector's last sample.
#[derive(Debug, Clone)]
pub struct OwnAtSample {
    key: String,
}

impl OwnAtSample {
    pub fn new(keys: &Keys) -> OwnAtSample {
        OwnAtSample {
            key: keys.own_at_sample(),
        }
    }

    /// Copies the in-flight counts as they are now (called when a push is stored).
    pub fn snapshot(&self, store: &dyn SharedStore, inflight: &InflightTable, now_ms: u64) -> bool {
        let counts = encode_counts(&inflight.read(store, now_ms));
        store.set(&self.key, &counts, 0) == SetOutcome::Stored
    }

    pub fn by_worker(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> Vec<u64> {
        let counts = store
            .get(&self.key)
            .map(|(v, _)| decode_counts(&v))
            .unwrap_or_default();
        by_worker_name(&counts, workers, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    use crate::config::testing::workers;

    #[test]
    fn work_is_booked_released_and_never_negative() {
        let store = MemStore::default();
        let t = WorkTable::new(&Keys::new("t"), 1, 5000);
        let ws = workers();
        assert_eq!(t.by_worker(&store, &ws, 0), vec![WorkerWork::default(); 2]);
        assert!(t.add(&store, "w0", 1, 4000, 0));
        assert!(t.add(&store, "w0", 1, 100, 0));
        let w0 = |s: &MemStore| t.by_worker(s, &ws, 0)[0];
        assert_eq!(
            w0(&store),
            WorkerWork {
                prefilling: 2,
                ahead_chars: 4100
            }
        );
        assert!(t.add(&store, "w0", -1, -4000, 0), "first byte of the first");
        assert_eq!(
            w0(&store),
            WorkerWork {
                prefilling: 1,
                ahead_chars: 100
            }
        );
        assert!(t.add(&store, "w0", -1, -100, 0));
        assert!(
            t.add(&store, "w0", -1, -100, 0),
            "a double release saturates"
        );
        assert_eq!(w0(&store), WorkerWork::default());
        assert!(t.0.read(&store, 0).is_empty(), "empty rows are dropped");
    }

    #[test]
    fn costs_are_learned_through_cas_and_unknown_until_then() {
        let store = MemStore::default();
        let t = CostTable::new(&Keys::new("t"));
        let ws = workers();
        assert_eq!(t.by_worker(&store, &ws), vec![WorkerCosts::default(); 2]);
        assert!(t.learn(&store, "w1", |c| WorkerCosts {
            prefill_us_per_char: crate::policy::learn_prefill(c.prefill_us_per_char, 8000.0, 1000),
            ..c
        }));
        assert_eq!(
            t.by_worker(&store, &ws)[1],
            WorkerCosts {
                prefill_us_per_char: Some(8.0),
                service_ms: None
            }
        );
        assert!(t.learn(&store, "w1", |c| WorkerCosts {
            service_ms: Some(f64::NAN),
            ..c
        }));
        assert_eq!(
            t.by_worker(&store, &ws)[1].service_ms,
            None,
            "a non-number is stored as unknown"
        );
    }

    #[test]
    fn own_load_at_sample_time_is_a_copy_of_the_inflight_table() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        let inflight = InflightTable::new(&keys, 1, 5000);
        inflight.add(&store, "w1", 3, 0);
        let own = OwnAtSample::new(&keys);
        assert!(own.snapshot(&store, &inflight, 0));
        inflight.add(&store, "w1", 5, 0);
        assert_eq!(own.by_worker(&store, &workers()), vec![0, 3]);
    }
}
