//! How much room each engine's KV cache has for conversations: where the pool's
//! trees are bounded by the engines' caches, a worker's conversation count (the
//! ladder's balance, `super::ladder`) is weighed by it.

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
}
