//! The in-flight table: requests in flight per worker for the whole Envoy, so the
//! imbalance rule sees every thread's load. Each VM owns the counts it took
//! (`super::owned`: a VM Envoy reloaded stops counting after the expiry); counts
//! are keyed by name, so a count taken before a config update is released on the
//! same worker after it. Also the plain (worker name -> count) encoding that peer
//! reports and the counts at sample time use.

use super::owned::{Counts, OwnedCounts};
use super::{put_bytes, Keys, Reader, SharedStore};
use crate::config::WorkerConfig;

/// In-flight requests per worker for the whole Envoy, and this VM's own.
#[derive(Debug)]
pub struct InflightTable(OwnedCounts<1>);

pub(super) fn encode_counts(counts: &[(String, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(counts.len() as u32).to_le_bytes());
    for (name, n) in counts {
        put_bytes(&mut out, name.as_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

pub(super) fn decode_counts(bytes: &[u8]) -> Vec<(String, u64)> {
    let mut r = Reader(bytes);
    let Some(n) = r.u32() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let (Some(name), Some(count)) = (r.string(), r.u64()) else {
            break;
        };
        out.push((name, count));
    }
    out
}

fn flat(counts: Counts<1>) -> Vec<(String, u64)> {
    counts.into_iter().map(|(n, [c])| (n, c)).collect()
}

impl InflightTable {
    /// The table as VM `vm` writes it, its rows living `expiry_ms` past their last
    /// write (`super::owner_expiry_ms`).
    pub fn new(keys: &Keys, vm: u64, expiry_ms: u64) -> InflightTable {
        InflightTable(OwnedCounts::new(keys.inflight(), vm, expiry_ms))
    }

    pub fn set_expiry(&mut self, expiry_ms: u64) {
        self.0.set_expiry(expiry_ms);
    }

    /// Every VM's counts summed (workers never counted are absent).
    pub fn read(&self, store: &dyn SharedStore, now_ms: u64) -> Vec<(String, u64)> {
        flat(self.0.read(store, now_ms))
    }

    /// Counts by worker index, for `workers` (never counted: 0).
    pub fn by_worker(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
        now_ms: u64,
    ) -> Vec<u64> {
        self.0
            .by_worker(store, workers, now_ms)
            .into_iter()
            .map(|[c]| c)
            .collect()
    }

    /// What this VM holds.
    pub fn mine(&self) -> Vec<(String, u64)> {
        flat(self.0.mine())
    }

    /// Adds `delta` to this VM's count for `worker`, saturating at zero. Whether it
    /// was published (it is kept either way: the tick retries).
    pub fn add(&self, store: &dyn SharedStore, worker: &str, delta: i64, now_ms: u64) -> bool {
        self.0.add(store, worker, [delta], now_ms)
    }

    /// The tick's heartbeat (`OwnedCounts::refresh`).
    pub fn refresh(&self, store: &dyn SharedStore, now_ms: u64) -> bool {
        self.0.refresh(store, now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;

    #[test]
    fn inflight_counts_add_and_saturate() {
        let store = MemStore::default();
        let t = InflightTable::new(&Keys::new("t"), 1, 5000);
        assert!(t.read(&store, 0).is_empty());
        assert!(t.add(&store, "w0", 1, 0));
        assert!(t.add(&store, "w0", 1, 0));
        assert!(t.add(&store, "w1", 1, 0));
        assert_eq!(
            t.read(&store, 0),
            vec![("w0".to_string(), 2), ("w1".to_string(), 1)]
        );
        assert!(
            !t.add(&store, "w1", -1, 0),
            "a release rides on the next write"
        );
        assert!(!t.add(&store, "w1", -1, 0), "never below zero");
        assert_eq!(t.read(&store, 0), vec![("w0".to_string(), 2)]);
        assert_eq!(t.mine(), t.read(&store, 0));
    }

    #[test]
    fn plain_counts_round_trip() {
        let counts = vec![("a".to_string(), 3), ("日".to_string(), 0)];
        assert_eq!(decode_counts(&encode_counts(&counts)), counts);
        assert!(decode_counts(&[1, 0]).is_empty());
    }
}
