//! Work done once per interval for the whole Envoy: eviction (`Op::Evict`) and the
//! engines' KV bounds (`Op::KvBound`). The VM whose tick finds the interval elapsed
//! claims it by CAS and appends the operation, so every VM applies it at the same
//! point of the operation stream.

use super::{Keys, Reader, SetOutcome, SharedStore};

/// The time the work was last claimed, in one key.
#[derive(Debug, Clone)]
pub struct IntervalClaim {
    key: String,
}

impl IntervalClaim {
    pub fn eviction(keys: &Keys) -> IntervalClaim {
        IntervalClaim {
            key: keys.eviction(),
        }
    }

    pub fn kv_bounds(keys: &Keys) -> IntervalClaim {
        IntervalClaim {
            key: keys.kv_bounds(),
        }
    }

    /// Whether this caller won the interval due at `now_ms`.
    pub fn claim(&self, store: &dyn SharedStore, now_ms: u64, interval_ms: u64) -> bool {
        let (last, cas) = match store.get(&self.key) {
            Some((v, cas)) => (Reader(&v).u64().unwrap_or(0), cas),
            None => {
                // First tick anywhere: start the clock, evict one interval later.
                store.set(&self.key, &now_ms.to_le_bytes(), 0);
                return false;
            }
        };
        now_ms.saturating_sub(last) >= interval_ms
            && store.set(&self.key, &now_ms.to_le_bytes(), cas) == SetOutcome::Stored
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn each_interval_is_claimed_once() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        let c = IntervalClaim::eviction(&keys);
        let other = IntervalClaim::kv_bounds(&keys);
        assert!(
            !other.claim(&store, 900, 100),
            "first tick starts the clock"
        );
        assert!(!c.claim(&store, 1000, 500), "first tick starts the clock");
        assert!(!c.claim(&store, 1499, 500));
        assert!(c.claim(&store, 1500, 500));
        assert!(
            !c.claim(&store, 1500, 500),
            "the same interval is claimed once"
        );
        assert!(c.claim(&store, 2000, 500));
        assert!(
            other.claim(&store, 1000, 100),
            "each work has its own clock"
        );
    }
}
