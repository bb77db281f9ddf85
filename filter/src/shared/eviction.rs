//! The eviction clock: one eviction per interval for the whole Envoy. The VM whose
//! tick finds the interval elapsed claims it by CAS and appends `Op::Evict`, so every
//! VM evicts at the same point of the operation stream.

use super::{Keys, Reader, SetOutcome, SharedStore};

/// The time of the last eviction, in one key.
#[derive(Debug, Clone)]
pub struct EvictionClock {
    key: String,
}

impl EvictionClock {
    pub fn new(keys: &Keys) -> EvictionClock {
        EvictionClock {
            key: keys.eviction(),
        }
    }

    /// Whether this caller won the eviction due at `now_ms`.
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
    fn eviction_is_claimed_once_per_interval() {
        let store = MemStore::default();
        let c = EvictionClock::new(&Keys::new("t"));
        assert!(!c.claim(&store, 1000, 500), "first tick starts the clock");
        assert!(!c.claim(&store, 1499, 500));
        assert!(c.claim(&store, 1500, 500));
        assert!(
            !c.claim(&store, 1500, 500),
            "the same interval is claimed once"
        );
        assert!(c.claim(&store, 2000, 500));
    }
}
