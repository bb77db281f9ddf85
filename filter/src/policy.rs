//! Worker selection rungs, each a pure function of the candidates' loads (and a
//! random source where ties are broken at random).
//!
//! `cache_aware` (SGLang model gateway) reads as three rungs:
//! 1. imbalance: if `max - min > balance_abs_threshold` AND
//!    `max > balance_rel_threshold * min` over the candidates' in-flight counts, the
//!    least-loaded candidate wins (ties random) and the tree is not consulted;
//! 2. prefix: if the match rate is strictly above `cache_threshold`, the owners at the
//!    deepest matched node that are candidates are the choice, least in-flight first,
//!    then lowest worker id (SMG takes any owner; load is the better tie-break);
//! 3. otherwise least-load (ties random).
//!
//! The caller inserts the routing text under the chosen worker whatever the rung.

use crate::decision::{Decision, Reason};
use crate::tree::{PrefixMatch, TenantId};

/// A routable worker and its router-side in-flight count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub worker: TenantId,
    pub inflight: u64,
}

/// The random source the host provides; injected so tests are deterministic.
pub trait Rng {
    fn next_u64(&mut self) -> u64;

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// SplitMix64: tiny, seedable, good enough for tie-breaks and sampling.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl Rng for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// SMG's imbalance test. Both conditions must hold: a small absolute gap on a busy
/// fleet is noise, and a large ratio on an idle fleet is too.
pub fn is_imbalanced(candidates: &[Candidate], abs_threshold: u64, rel_threshold: f64) -> bool {
    let max = candidates.iter().map(|c| c.inflight).max();
    let min = candidates.iter().map(|c| c.inflight).min();
    match (max, min) {
        (Some(max), Some(min)) => {
            max.saturating_sub(min) > abs_threshold && (max as f64) > (min as f64 * rel_threshold)
        }
        _ => false,
    }
}

/// The least in-flight candidate, ties broken at random so an idle fleet spreads.
pub fn least_loaded(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<TenantId> {
    let min = candidates.iter().map(|c| c.inflight).min()?;
    let tied: Vec<TenantId> = candidates
        .iter()
        .filter(|c| c.inflight == min)
        .map(|c| c.worker)
        .collect();
    tied.get(rng.below(tied.len())).copied()
}

/// Among the prefix owners that are candidates, the least in-flight, then lowest id.
pub fn best_owner(owners: &[TenantId], candidates: &[Candidate]) -> Option<TenantId> {
    candidates
        .iter()
        .filter(|c| owners.contains(&c.worker))
        .min_by_key(|c| (c.inflight, c.worker))
        .map(|c| c.worker)
}

/// Tuning of the `cache_aware` rungs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheAwareParams {
    pub cache_threshold: f64,
    pub balance_abs_threshold: u64,
    pub balance_rel_threshold: f64,
}

/// The `cache_aware` ladder. `lookup` runs the prefix match only when the imbalance
/// rung passes, so an imbalanced fleet costs no tree walk.
pub fn cache_aware(
    params: &CacheAwareParams,
    candidates: &[Candidate],
    lookup: impl FnOnce() -> PrefixMatch,
    rng: &mut dyn Rng,
) -> Option<Decision> {
    if is_imbalanced(
        candidates,
        params.balance_abs_threshold,
        params.balance_rel_threshold,
    ) {
        return least_loaded(candidates, rng).map(|worker| Decision {
            worker,
            reason: Reason::Imbalanced,
            matched_chars: 0,
        });
    }
    let found = lookup();
    if found.match_rate() > params.cache_threshold {
        if let Some(worker) = best_owner(&found.owners, candidates) {
            return Some(Decision {
                worker,
                reason: Reason::CacheHit,
                matched_chars: found.matched_chars,
            });
        }
    }
    least_loaded(candidates, rng).map(|worker| Decision {
        worker,
        reason: Reason::CacheMiss,
        matched_chars: found.matched_chars,
    })
}

/// Least-load for bodies without routing text.
pub fn unreadable(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<Decision> {
    least_loaded(candidates, rng).map(|worker| Decision {
        worker,
        reason: Reason::Unreadable,
        matched_chars: 0,
    })
}

/// Round robin over the candidates, advancing a caller-held counter.
pub fn round_robin(candidates: &[Candidate], counter: &mut u64) -> Option<Decision> {
    if candidates.is_empty() {
        return None;
    }
    let pick = candidates[(*counter % candidates.len() as u64) as usize];
    *counter = counter.wrapping_add(1);
    Some(Decision {
        worker: pick.worker,
        reason: Reason::RoundRobin,
        matched_chars: 0,
    })
}

pub fn random(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<Decision> {
    if candidates.is_empty() {
        return None;
    }
    let pick = candidates[rng.below(candidates.len())];
    Some(Decision {
        worker: pick.worker,
        reason: Reason::Random,
        matched_chars: 0,
    })
}

/// Two distinct random candidates, the less loaded wins (ties: the first drawn).
pub fn power_of_two(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<Decision> {
    let n = candidates.len();
    if n == 0 {
        return None;
    }
    let a = rng.below(n);
    let pick = if n == 1 {
        candidates[a]
    } else {
        let b = (a + 1 + rng.below(n - 1)) % n;
        let (ca, cb) = (candidates[a], candidates[b]);
        if cb.inflight < ca.inflight {
            cb
        } else {
            ca
        }
    };
    Some(Decision {
        worker: pick.worker,
        reason: Reason::PowerOfTwo,
        matched_chars: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cands(loads: &[u64]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &inflight)| Candidate {
                worker: i as TenantId,
                inflight,
            })
            .collect()
    }

    const SMG: CacheAwareParams = CacheAwareParams {
        cache_threshold: 0.3,
        balance_abs_threshold: 64,
        balance_rel_threshold: 1.5,
    };

    fn matched(matched_chars: usize, input_chars: usize, owners: Vec<TenantId>) -> PrefixMatch {
        PrefixMatch {
            matched_chars,
            input_chars,
            owners,
        }
    }

    #[test]
    fn imbalance_needs_both_thresholds() {
        // The seed's worked example with SMG's command-line defaults.
        assert!(
            !is_imbalanced(&cands(&[100, 40]), 64, 1.5),
            "gap 60 <= 64: balanced"
        );
        assert!(
            is_imbalanced(&cands(&[100, 30]), 64, 1.5),
            "gap 70 and 100 > 45"
        );
        // Absolute gap alone is not enough.
        assert!(!is_imbalanced(&cands(&[1000, 900]), 64, 1.5), "ratio 1.11");
        // Exactly at the thresholds is not over them.
        assert!(!is_imbalanced(&cands(&[64, 0]), 64, 1.5), "gap == abs");
        assert!(is_imbalanced(&cands(&[65, 0]), 64, 1.5));
        assert!(
            !is_imbalanced(&cands(&[150, 100]), 10, 1.5),
            "max == rel * min"
        );
        assert!(is_imbalanced(&cands(&[151, 100]), 10, 1.5));
        assert!(!is_imbalanced(&[], 0, 1.0));
        assert!(
            !is_imbalanced(&cands(&[500]), 0, 1.0),
            "one worker is balanced"
        );
    }

    #[test]
    fn imbalanced_fleet_goes_least_load_without_lookup() {
        let mut rng = SplitMix64(1);
        let d = cache_aware(
            &SMG,
            &cands(&[100, 30, 80]),
            || panic!("an imbalanced fleet must not walk the tree"),
            &mut rng,
        )
        .unwrap();
        assert_eq!((d.worker, d.reason), (1, Reason::Imbalanced));
    }

    #[test]
    fn match_rate_must_be_strictly_above_threshold() {
        let mut rng = SplitMix64(1);
        let c = cands(&[0, 0, 5]);
        let at = cache_aware(&SMG, &c, || matched(3, 10, vec![2]), &mut rng).unwrap();
        assert_eq!(at.reason, Reason::CacheMiss, "0.3 is not > 0.3");
        assert_ne!(
            at.worker, 2,
            "miss goes least-load, worker 2 is the busiest"
        );
        let above = cache_aware(&SMG, &c, || matched(31, 100, vec![2]), &mut rng).unwrap();
        assert_eq!((above.worker, above.reason), (2, Reason::CacheHit));
        assert_eq!(above.matched_chars, 31);
    }

    #[test]
    fn hit_prefers_least_loaded_owner_then_lowest_id() {
        let mut rng = SplitMix64(1);
        let c = cands(&[3, 1, 1, 0]);
        let d = cache_aware(&SMG, &c, || matched(10, 10, vec![0, 1, 2]), &mut rng).unwrap();
        assert_eq!(d.worker, 1, "owners 1 and 2 tie at 1 in flight: lower id");
    }

    #[test]
    fn owner_that_is_not_a_candidate_is_a_miss() {
        let mut rng = SplitMix64(1);
        let c = cands(&[0, 0]);
        let d = cache_aware(&SMG, &c, || matched(10, 10, vec![7]), &mut rng).unwrap();
        assert_eq!(d.reason, Reason::CacheMiss);
    }

    #[test]
    fn least_loaded_breaks_ties_at_random() {
        let c = cands(&[2, 1, 1, 1]);
        let mut rng = SplitMix64(3);
        let mut seen = [0; 4];
        for _ in 0..300 {
            seen[least_loaded(&c, &mut rng).unwrap() as usize] += 1;
        }
        assert_eq!(seen[0], 0, "never the busier one");
        assert!(seen[1..].iter().all(|&n| n > 50), "ties spread: {seen:?}");
        assert_eq!(least_loaded(&[], &mut rng), None);
    }

    #[test]
    fn no_candidates_no_decision() {
        let mut rng = SplitMix64(1);
        assert!(cache_aware(&SMG, &[], || matched(0, 1, vec![]), &mut rng).is_none());
        assert!(round_robin(&[], &mut 0).is_none());
        assert!(random(&[], &mut rng).is_none());
        assert!(power_of_two(&[], &mut rng).is_none());
        assert!(unreadable(&[], &mut rng).is_none());
    }

    #[test]
    fn round_robin_cycles() {
        let c = cands(&[0, 0, 0]);
        let mut counter = 0;
        let picks: Vec<_> = (0..6)
            .map(|_| round_robin(&c, &mut counter).unwrap().worker)
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn power_of_two_never_picks_the_busiest_of_two() {
        let c = cands(&[5, 0]);
        let mut rng = SplitMix64(9);
        for _ in 0..50 {
            assert_eq!(power_of_two(&c, &mut rng).unwrap().worker, 1);
        }
        let one = cands(&[3]);
        assert_eq!(power_of_two(&one, &mut rng).unwrap().worker, 0);
    }

    #[test]
    fn random_covers_all() {
        let c = cands(&[0, 9, 0]);
        let mut rng = SplitMix64(5);
        let mut seen = [false; 3];
        for _ in 0..100 {
            seen[random(&c, &mut rng).unwrap().worker as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
