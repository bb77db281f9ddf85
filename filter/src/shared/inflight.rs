//! The in-flight table: requests in flight per worker for the whole Envoy, in one
//! key (worker name -> count), changed with CAS retries and saturating at zero, so
//! the imbalance rule sees every thread's load. Counts are keyed by name, so a count
//! taken before a config update is released on the same worker after it.

use super::{put_bytes, Keys, Reader, SetOutcome, SharedStore, CAS_ATTEMPTS};
use crate::config::WorkerConfig;

/// In-flight requests per worker for the whole Envoy, in one key.
#[derive(Debug, Clone)]
pub struct InflightTable {
    key: String,
}

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

impl InflightTable {
    pub fn new(keys: &Keys) -> InflightTable {
        InflightTable {
            key: keys.inflight(),
        }
    }

    /// A table of the same encoding under another key (a snapshot of this one).
    pub(crate) fn with_key(key: &str) -> InflightTable {
        InflightTable {
            key: key.to_string(),
        }
    }

    /// Every worker's count (workers never counted are absent).
    pub fn read(&self, store: &dyn SharedStore) -> Vec<(String, u64)> {
        store
            .get(&self.key)
            .map(|(v, _)| decode_counts(&v))
            .unwrap_or_default()
    }

    /// Counts by worker index, for `workers` (never counted: 0).
    pub fn by_worker(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> Vec<u64> {
        let counts = self.read(store);
        workers
            .iter()
            .map(|w| {
                counts
                    .iter()
                    .find(|(n, _)| *n == w.name)
                    .map_or(0, |(_, c)| *c)
            })
            .collect()
    }

    /// Creates the table empty if no VM has yet. Envoy's shared data has no
    /// "create if absent": a `set` on a missing key succeeds whatever the CAS, so two
    /// threads counting the very first requests at once could both create it, and
    /// one count was lost for good (a stuck in-flight gauge). A VM calls this when it
    /// is configured, before it takes requests, so every count is a CAS update of an
    /// existing key; VMs creating it together both write the same empty table.
    pub fn ensure(&self, store: &dyn SharedStore) {
        if store.get(&self.key).is_none() {
            store.set(&self.key, &encode_counts(&[]), 0);
        }
    }

    /// Adds `delta` to `worker`'s count, saturating at zero. Returns whether it was
    /// stored.
    pub fn add(&self, store: &dyn SharedStore, worker: &str, delta: i64) -> bool {
        for _ in 0..CAS_ATTEMPTS {
            let (mut counts, cas) = match store.get(&self.key) {
                Some((v, cas)) => (decode_counts(&v), cas),
                None => (Vec::new(), 0),
            };
            match counts.iter_mut().find(|(n, _)| n == worker) {
                Some((_, c)) => *c = c.saturating_add_signed(delta),
                None => counts.push((worker.to_string(), 0u64.saturating_add_signed(delta))),
            }
            // Zero entries are dropped so names of removed workers do not pile up.
            counts.retain(|(_, c)| *c > 0);
            match store.set(&self.key, &encode_counts(&counts), cas) {
                SetOutcome::Stored => return true,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return false,
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;

    #[test]
    fn ensure_creates_an_empty_table_once_and_never_resets_counts() {
        let store = MemStore::default();
        let t = InflightTable::new(&Keys::new("t"));
        t.ensure(&store);
        assert!(store.get(&t.key).is_some(), "created");
        assert!(t.add(&store, "w0", 2));
        t.ensure(&store);
        assert_eq!(t.read(&store), vec![("w0".to_string(), 2)], "kept");
    }

    #[test]
    fn inflight_counts_add_and_saturate() {
        let store = MemStore::default();
        let t = InflightTable::new(&Keys::new("t"));
        assert!(t.read(&store).is_empty());
        assert!(t.add(&store, "w0", 1));
        assert!(t.add(&store, "w0", 1));
        assert!(t.add(&store, "w1", 1));
        assert_eq!(
            t.read(&store),
            vec![("w0".to_string(), 2), ("w1".to_string(), 1)]
        );
        assert!(t.add(&store, "w1", -1));
        assert!(t.add(&store, "w1", -1), "never below zero");
        assert_eq!(t.read(&store), vec![("w0".to_string(), 2)]);
    }
}
