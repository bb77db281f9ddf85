//! The prober lease: which VM runs the overload prober, until when. One prober per
//! Envoy, so each worker is probed once per interval and each flag flip is counted
//! once; the holder renews on every tick, and any VM takes over once it expires.

use super::{Keys, SetOutcome, SharedStore};

/// The prober's lease: which VM probes, until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub holder: u64,
    pub until_ms: u64,
}

impl Lease {
    pub fn encode(&self) -> Vec<u8> {
        format!("{}:{}", self.holder, self.until_ms).into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Option<Lease> {
        let s = std::str::from_utf8(bytes).ok()?;
        let (h, u) = s.split_once(':')?;
        Some(Lease {
            holder: h.parse().ok()?,
            until_ms: u.parse().ok()?,
        })
    }
}

/// The lease `me` should write at `now_ms`, if it may hold it: it holds it already
/// (renewal), there is none, or the holder stopped renewing (takeover).
pub fn claim(current: Option<Lease>, me: u64, now_ms: u64, ttl_ms: u64) -> Option<Lease> {
    let free = match current {
        None => true,
        Some(l) => l.holder == me || now_ms >= l.until_ms,
    };
    free.then_some(Lease {
        holder: me,
        until_ms: now_ms.saturating_add(ttl_ms),
    })
}

/// The lease key in shared data.
#[derive(Debug, Clone)]
pub struct ProbeLease {
    key: String,
}

impl ProbeLease {
    pub fn new(keys: &Keys) -> ProbeLease {
        ProbeLease { key: keys.lease() }
    }

    /// Takes or renews the lease for `me`; whether `me` holds it now. Two VMs that
    /// both see it free race on the CAS and one wins.
    pub fn acquire(&self, store: &dyn SharedStore, me: u64, now_ms: u64, ttl_ms: u64) -> bool {
        let (current, cas) = match store.get(&self.key) {
            Some((v, cas)) => (Lease::decode(&v), cas),
            None => (None, 0),
        };
        match claim(current, me, now_ms, ttl_ms) {
            Some(l) => store.set(&self.key, &l.encode(), cas) == SetOutcome::Stored,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    use crate::config::OverloadConfig;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn lease_is_held_renewed_and_taken_over_when_it_expires() {
        let store = MemStore::default();
        let lease = ProbeLease::new(&Keys::new("t"));
        assert!(lease.acquire(&store, 1, 0, 300), "free: taken");
        assert!(!lease.acquire(&store, 2, 100, 300), "held by another");
        assert!(lease.acquire(&store, 1, 200, 300), "renewed by its holder");
        assert!(
            !lease.acquire(&store, 2, 499, 300),
            "renewal moved the expiry"
        );
        assert!(
            lease.acquire(&store, 2, 500, 300),
            "holder stopped renewing: taken over"
        );
        assert!(
            !lease.acquire(&store, 1, 600, 300),
            "the old holder lost it"
        );
        assert_eq!(
            claim(None, 9, 10, 5),
            Some(Lease {
                holder: 9,
                until_ms: 15
            })
        );
        assert_eq!(Lease::decode(b"garbage"), None);
        assert_eq!(OverloadConfig::lease_ms(1000), 3000);
    }
}
