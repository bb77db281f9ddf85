//! How much room each engine's KV cache has: where the pool's trees are bounded by
//! the engines' caches, a worker's conversation count (the ladder's balance,
//! `super::ladder`) is weighed by it, and a placement that fills a full cache with
//! a copy of what another engine holds is charged for what it evicts.

use crate::tree::TenantId;

/// The candidates' mean KV capacity in tokens, when the pool's trees are bounded
/// by the engines' caches and every candidate's engine stated one (`capacities`
/// by worker index, 0 for none): what a worker's conversations are weighed
/// against (`weighed_conversations`). `None`: counted as they are.
pub fn mean_capacity(
    candidates: impl ExactSizeIterator<Item = TenantId>,
    capacities: &[u64],
) -> Option<f64> {
    let n = candidates.len();
    let mut sum = 0u128;
    for w in candidates {
        let c = capacities.get(w as usize).copied().unwrap_or(0);
        if c == 0 {
            return None;
        }
        sum += u128::from(c);
    }
    (n > 0).then(|| sum as f64 / n as f64)
}

/// A worker's conversations as the balance counts them: scaled by the fleet's
/// mean capacity over its engine's own. A tree bounded by the engines' caches
/// holds more conversations under a larger cache; counted as they are, that
/// engine looked the busiest and took the fewest new ones, and its room went
/// unused while the smaller caches evicted (four caches of 48 to 384 blocks,
/// through Envoy: 0.255 of the prompts cached against 0.299 weighed).
pub fn weighed_conversations(conversations: u64, capacity: u64, mean: Option<f64>) -> u64 {
    match mean {
        Some(mean) if capacity > 0 => (conversations as f64 * mean / capacity as f64).ceil() as u64,
        _ => conversations,
    }
}

/// Chars a placement evicts that another placement would have spared: a worker
/// holding `held` chars of the trees, bounded at `bound` (0: not known), that
/// takes `uncached` chars of a request evicts what passes the bound; of those,
/// only as many as another worker already holds (`held_elsewhere`: the longest
/// match beyond this worker's) could have been spared. A prefix nobody holds must
/// be cached somewhere, whatever it evicts there; a copy of one that another
/// engine holds evicts what the fleet did not need to lose. A cache with room
/// loses nothing.
///
/// Where every cache is too small for the working set (documents of 8k chars,
/// two engines caching about five each, one 3.8 times slower than the other), the
/// fast engine took copies of the slow one's documents whenever the slow one's
/// queue was longer, each evicting one of its own, which the next of its
/// questions prefilled again: 0.76 of the prompts cached, against 0.90 charged.
pub fn avoidable_eviction(held: u64, bound: u64, uncached: u64, held_elsewhere: u64) -> u64 {
    if bound == 0 {
        return 0;
    }
    held.saturating_add(uncached)
        .saturating_sub(bound)
        .min(uncached)
        .min(held_elsewhere)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn conversations_are_weighed_by_the_room_each_engine_has_for_them() {
        // Capacities by worker index: w0 1000 tokens, w1 3000, w2 not stated.
        let caps = [1000, 3000, 0];
        let mean = mean_capacity([0, 1].into_iter(), &caps);
        assert_eq!(mean, Some(2000.0));
        assert_eq!(
            mean_capacity([0, 1, 2].into_iter(), &caps),
            None,
            "an engine that stated none: counted as they are"
        );
        assert_eq!(mean_capacity([0, 1].into_iter(), &[]), None, "not bounded");
        assert_eq!(mean_capacity([].into_iter(), &caps), None);
        // Eight conversations each: the small cache counts twice as busy, the
        // large one a third less (rounded up).
        assert_eq!(weighed_conversations(8, 1000, mean), 16);
        assert_eq!(weighed_conversations(8, 3000, mean), 6);
        assert_eq!(weighed_conversations(8, 2000, mean), 8);
        assert_eq!(weighed_conversations(8, 3000, None), 8);
        assert_eq!(weighed_conversations(8, 0, mean), 8);
        // Equal caches change nothing.
        let equal = mean_capacity([0, 1].into_iter(), &[4096, 4096]);
        assert_eq!(weighed_conversations(5, 4096, equal), 5);
    }

    #[test]
    fn only_a_copy_into_a_full_cache_evicts_what_it_need_not() {
        // A cache of 10,000 chars holding 9,000, a request of 3,000 uncached
        // chars there, 2,500 of which another worker holds: 2,000 pass the bound.
        assert_eq!(avoidable_eviction(9000, 10_000, 3000, 2500), 2000);
        assert_eq!(
            avoidable_eviction(9000, 10_000, 3000, 500),
            500,
            "only what another worker holds could have been spared"
        );
        assert_eq!(
            avoidable_eviction(9000, 10_000, 3000, 0),
            0,
            "a prefix nobody holds is cached somewhere"
        );
        assert_eq!(avoidable_eviction(6000, 10_000, 3000, 3000), 0, "room");
        assert_eq!(
            avoidable_eviction(10_000, 10_000, 3000, 9000),
            3000,
            "a full cache evicts at most what it takes"
        );
        assert_eq!(avoidable_eviction(90_000, 0, 3000, 3000), 0, "no bound known");
        assert_eq!(avoidable_eviction(u64::MAX, 1, 3, 3), 3, "no overflow");
    }
}
