//! The push endpoint's lockout: failed token checks are counted per Envoy (every
//! thread shares one count, so a guesser gains nothing from spreading its
//! connections) in fixed windows; once a window holds `MAX_FAILED_PUSHES` failures,
//! every push is refused until the window ends, the right token included, so a
//! guesser cannot tell a hit from a miss. The collector then misses samples for up
//! to a window; routing reads missing samples as unknown and fails open.
//!
//! At 10 failures a minute a 32-character token takes longer than the universe to
//! guess; without it a loopback client tried about 1,600 tokens a second.

use super::{Keys, SetOutcome, SharedStore, CAS_ATTEMPTS};

/// Failed token checks a window may hold before every push is refused.
pub const MAX_FAILED_PUSHES: u32 = 10;
pub const LOCKOUT_WINDOW_MS: u64 = 60_000;

/// The failures of the current window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures {
    pub window_start_ms: u64,
    pub count: u32,
}

impl Failures {
    fn encode(&self) -> Vec<u8> {
        format!("{}:{}", self.window_start_ms, self.count).into_bytes()
    }

    fn decode(bytes: &[u8]) -> Option<Failures> {
        let (start, count) = std::str::from_utf8(bytes).ok()?.split_once(':')?;
        Some(Failures {
            window_start_ms: start.parse().ok()?,
            count: count.parse().ok()?,
        })
    }
}

/// Whether a push may be checked at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gate {
    Open,
    /// Refused without looking at the token, for this long more.
    LockedOut {
        retry_after_ms: u64,
    },
}

/// The gate at `now_ms` given the stored failures.
pub fn gate(failures: Option<Failures>, now_ms: u64) -> Gate {
    match failures {
        Some(f)
            if f.count >= MAX_FAILED_PUSHES
                && now_ms < f.window_start_ms.saturating_add(LOCKOUT_WINDOW_MS) =>
        {
            Gate::LockedOut {
                retry_after_ms: f.window_start_ms + LOCKOUT_WINDOW_MS - now_ms,
            }
        }
        _ => Gate::Open,
    }
}

/// The failures after one more at `now_ms` (a new window once the last one ended).
pub fn one_more(failures: Option<Failures>, now_ms: u64) -> Failures {
    match failures {
        Some(f) if now_ms < f.window_start_ms.saturating_add(LOCKOUT_WINDOW_MS) => Failures {
            count: f.count.saturating_add(1),
            ..f
        },
        _ => Failures {
            window_start_ms: now_ms,
            count: 1,
        },
    }
}

/// The failure count in shared data (one key).
#[derive(Debug, Clone)]
pub struct PushLockout {
    key: String,
}

impl PushLockout {
    pub fn new(keys: &Keys) -> PushLockout {
        PushLockout {
            key: keys.push_failures(),
        }
    }

    pub fn gate(&self, store: &dyn SharedStore, now_ms: u64) -> Gate {
        gate(
            store.get(&self.key).and_then(|(v, _)| Failures::decode(&v)),
            now_ms,
        )
    }

    /// Counts a failed token check (CAS, so concurrent failures all count).
    pub fn fail(&self, store: &dyn SharedStore, now_ms: u64) {
        for _ in 0..CAS_ATTEMPTS {
            let (current, cas) = match store.get(&self.key) {
                Some((v, cas)) => (Failures::decode(&v), cas),
                None => (None, 0),
            };
            match store.set(&self.key, &one_more(current, now_ms).encode(), cas) {
                SetOutcome::CasMismatch => continue,
                SetOutcome::Stored | SetOutcome::Failed => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_gate_closes_at_the_limit_and_opens_when_the_window_ends() {
        let at = |count| {
            Some(Failures {
                window_start_ms: 1000,
                count,
            })
        };
        assert_eq!(gate(None, 0), Gate::Open);
        assert_eq!(
            gate(at(MAX_FAILED_PUSHES - 1), 1000),
            Gate::Open,
            "one below"
        );
        assert_eq!(
            gate(at(MAX_FAILED_PUSHES), 1000),
            Gate::LockedOut {
                retry_after_ms: LOCKOUT_WINDOW_MS
            },
            "at the limit"
        );
        assert_eq!(
            gate(at(MAX_FAILED_PUSHES), 1000 + LOCKOUT_WINDOW_MS - 1),
            Gate::LockedOut { retry_after_ms: 1 }
        );
        assert_eq!(
            gate(at(MAX_FAILED_PUSHES), 1000 + LOCKOUT_WINDOW_MS),
            Gate::Open,
            "the window ended"
        );
    }

    #[test]
    fn failures_count_within_a_window_and_restart_after_it() {
        let f = one_more(None, 5);
        assert_eq!((f.window_start_ms, f.count), (5, 1));
        let f = one_more(Some(f), 5 + LOCKOUT_WINDOW_MS - 1);
        assert_eq!((f.window_start_ms, f.count), (5, 2));
        let f = one_more(Some(f), 5 + LOCKOUT_WINDOW_MS);
        assert_eq!((f.window_start_ms, f.count), (5 + LOCKOUT_WINDOW_MS, 1));
    }

    #[test]
    fn the_table_locks_out_after_the_limit() {
        let store = MemStore::default();
        let l = PushLockout::new(&Keys::new("t"));
        for _ in 0..MAX_FAILED_PUSHES {
            assert_eq!(l.gate(&store, 10), Gate::Open);
            l.fail(&store, 10);
        }
        assert!(matches!(l.gate(&store, 10), Gate::LockedOut { .. }));
        assert_eq!(l.gate(&store, 10 + LOCKOUT_WINDOW_MS), Gate::Open);
        store
            .map
            .borrow_mut()
            .insert("t.push.failures".into(), (b"junk".to_vec(), 1));
        assert_eq!(l.gate(&store, 10), Gate::Open, "garbled: open");
    }
}
