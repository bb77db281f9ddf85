//! Peer replicas' in-flight counts, as their bridges last reported them: one key
//! holding, per peer replica, when the report arrived (this filter's clock) and its
//! counts by worker name. A report replaces that peer's previous one; readers ignore
//! reports older than `stale_after_ms`, so a peer that went away (or a bus that went
//! down) stops counting on its own. At most `MAX_PEERS` peers are kept (the oldest
//! report gives way), which bounds the key whatever the bridges send.

use super::inflight::{decode_counts, encode_counts};
use super::{put_bytes, Keys, Reader, SetOutcome, SharedStore, CAS_ATTEMPTS};
use crate::config::WorkerNames;
use crate::load::WorkerCounts;

/// Peers kept at most.
pub const MAX_PEERS: usize = 64;

/// One peer's last report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReport {
    pub replica: String,
    pub at_ms: u64,
    pub counts: Vec<(String, u64)>,
}

#[derive(Debug, Clone)]
pub struct PeerLoads {
    key: String,
}

fn encode(reports: &[PeerReport]) -> Vec<u8> {
    let mut out = (reports.len() as u32).to_le_bytes().to_vec();
    for r in reports {
        put_bytes(&mut out, r.replica.as_bytes());
        out.extend_from_slice(&r.at_ms.to_le_bytes());
        put_bytes(&mut out, &encode_counts(&r.counts));
    }
    out
}

fn decode(bytes: &[u8]) -> Vec<PeerReport> {
    let mut r = Reader(bytes);
    let n = r.u32().unwrap_or(0);
    let mut out = Vec::new();
    for _ in 0..n {
        let (Some(replica), Some(at_ms), Some(counts)) = (r.string(), r.u64(), r.u32()) else {
            break;
        };
        let Some(counts) = r.take(counts as usize) else {
            break;
        };
        out.push(PeerReport {
            replica,
            at_ms,
            counts: decode_counts(counts),
        });
    }
    out
}

impl PeerLoads {
    pub fn new(keys: &Keys) -> PeerLoads {
        PeerLoads {
            key: keys.peer_inflight(),
        }
    }

    pub fn read(&self, store: &dyn SharedStore) -> Vec<PeerReport> {
        store
            .get(&self.key)
            .map(|(v, _)| decode(&v))
            .unwrap_or_default()
    }

    /// Replaces `report.replica`'s report. Returns whether it was stored.
    pub fn store(&self, store: &dyn SharedStore, report: PeerReport) -> bool {
        for _ in 0..CAS_ATTEMPTS {
            let (mut reports, cas) = match store.get(&self.key) {
                Some((v, cas)) => (decode(&v), cas),
                None => (Vec::new(), 0),
            };
            reports.retain(|r| r.replica != report.replica);
            if reports.len() >= MAX_PEERS {
                if let Some(oldest) = (0..reports.len()).min_by_key(|&i| reports[i].at_ms) {
                    reports.swap_remove(oldest);
                }
            }
            reports.push(report.clone());
            match store.set(&self.key, &encode(&reports), cas) {
                SetOutcome::Stored => return true,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return false,
            }
        }
        false
    }

    /// Fresh peers' counts summed by worker index, and how many peers are fresh.
    pub fn by_worker(
        &self,
        store: &dyn SharedStore,
        names: &WorkerNames,
        now_ms: u64,
        stale_after_ms: u64,
    ) -> (WorkerCounts, usize) {
        Self::sum_by_worker(&self.read(store), names, now_ms, stale_after_ms)
    }

    /// `reports`' fresh counts summed by worker index (empty when none is fresh:
    /// a missing count is 0, and a fleet of 256 needs no zeros per request), and how
    /// many reports are fresh.
    pub fn sum_by_worker(
        reports: &[PeerReport],
        names: &WorkerNames,
        now_ms: u64,
        stale_after_ms: u64,
    ) -> (WorkerCounts, usize) {
        let fresh: Vec<&PeerReport> = reports
            .iter()
            .filter(|r| now_ms.saturating_sub(r.at_ms) < stale_after_ms)
            .collect();
        if fresh.is_empty() {
            return (WorkerCounts::default(), 0);
        }
        let mut sums = WorkerCounts::zeroed(names.len());
        for r in &fresh {
            for (name, n) in &r.counts {
                if let Some(i) = names.get(name) {
                    sums.add(i, *n);
                }
            }
        }
        (sums, fresh.len())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    use crate::config::testing::names;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn report(replica: &str, at_ms: u64, counts: &[(&str, u64)]) -> PeerReport {
        PeerReport {
            replica: replica.into(),
            at_ms,
            counts: counts.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
        }
    }

    #[test]
    fn fresh_peers_add_up_and_stale_ones_expire() {
        let store = MemStore::default();
        let t = PeerLoads::new(&Keys::new("t"));
        let w = names();
        assert!(t.store(&store, report("a", 1000, &[("w0", 2), ("w1", 1)])));
        assert!(t.store(&store, report("b", 1500, &[("w1", 4), ("gone", 9)])));
        assert_eq!(t.by_worker(&store, &w, 1600, 1000), (vec![2, 5].into(), 2));
        assert_eq!(
            t.by_worker(&store, &w, 2000, 1000),
            (vec![0, 4].into(), 1),
            "a's report is 1000 ms old: stale"
        );
        assert_eq!(
            t.by_worker(&store, &w, 9000, 1000),
            (WorkerCounts::default(), 0)
        );
        // A newer report replaces the peer's old one.
        assert!(t.store(&store, report("a", 8500, &[("w0", 1)])));
        assert_eq!(t.by_worker(&store, &w, 9000, 1000), (vec![1, 0].into(), 1));
        assert_eq!(t.read(&store).len(), 2);
    }

    #[test]
    fn the_table_is_bounded() {
        let store = MemStore::default();
        let t = PeerLoads::new(&Keys::new("t"));
        for i in 0..(MAX_PEERS as u64 + 10) {
            assert!(t.store(&store, report(&format!("r{i}"), 100 + i, &[("w0", 1)])));
        }
        let kept = t.read(&store);
        assert_eq!(kept.len(), MAX_PEERS);
        assert!(
            kept.iter().all(|r| r.replica != "r0"),
            "the oldest report gave way"
        );
    }
}
