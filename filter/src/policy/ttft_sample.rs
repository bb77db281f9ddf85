//! Which candidates `predicted_ttft` scores for one request in a large fleet, when
//! the operator asks for it (`ttft_sample_size`; every worker by default).
//!
//! Scoring is a pass over the fleet per request: in Envoy a fleet of 256 cost
//! `predicted_ttft` about twice what 4 did. A fleet larger than `sample_size` may
//! therefore be sampled, as Envoy's `LEAST_REQUEST` samples its hosts ("power of d
//! choices"), but never where the cache is decided:
//! - every candidate whose conversation the request continues is scored (the first
//!   rung must see its worker);
//! - up to `sample_size` of the workers holding the whole of the request's longest
//!   match (the tree's deepest node on its path) are scored, so a prefix only a few
//!   workers hold is found where it is, and the reason labels see the longest match;
//! - `sample_size` candidates drawn at random from the whole fleet give the fleet
//!   rung its choice.
//!
//! The bounded-load cap stays the whole fleet's (the screen sums the busy workers'
//! in-flight requests). What sampling gives up: holders within the 2% margin of the
//! longest match but not on its deepest node, and unsampled workers with fewer
//! conversations, are seen only when drawn, so conversations spread less evenly.

use crate::rng::Rng;

/// Positions in the candidate list (ascending, each once) of the candidates a
/// request scores, or `None` to score all `n` (a fleet of at most `sample_size`, or
/// `sample_size` 0). `holders` is how many workers hold the whole of the request's
/// longest match and where holder `j` is among the candidates (`None`: not one);
/// `continuing` the positions of the candidates whose conversation it continues.
pub fn ttft_sample(
    n: usize,
    sample_size: usize,
    holders: (usize, impl Fn(usize) -> Option<usize>),
    continuing: &[usize],
    rng: &mut dyn Rng,
) -> Option<Vec<usize>> {
    if sample_size == 0 || n <= sample_size {
        return None;
    }
    let (holding, position) = holders;
    // Marks by position, read back in order: ascending and each once without a
    // sort.
    let mut marked = vec![0u64; n.div_ceil(64)];
    let mut mark = |i: usize| {
        if let Some(word) = marked.get_mut(i / 64).filter(|_| i < n) {
            *word |= 1 << (i % 64);
        }
    };
    continuing.iter().for_each(|&i| mark(i));
    distinct(holding, sample_size, rng, |j| {
        position(j).into_iter().for_each(&mut mark)
    });
    distinct(n, sample_size, rng, mark);
    let mut picked = Vec::with_capacity(sample_size * 2 + continuing.len());
    for (at, &word) in marked.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            picked.push(at * 64 + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
    }
    Some(picked)
}

/// Gives `k` distinct positions of `0..n` drawn uniformly to `take` (all of them
/// when `n <= k`), by Floyd's algorithm: `k` draws whatever `n` is.
fn distinct(n: usize, k: usize, rng: &mut dyn Rng, mut take: impl FnMut(usize)) {
    if n <= k {
        (0..n).for_each(take);
        return;
    }
    let mut drawn: Vec<usize> = Vec::with_capacity(k);
    for j in n - k..n {
        let t = rng.below(j + 1);
        let t = if drawn.contains(&t) { j } else { t };
        drawn.push(t);
        take(t);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;

    /// No holders.
    fn none() -> (usize, fn(usize) -> Option<usize>) {
        (0, |_| None)
    }

    #[test]
    fn a_fleet_within_the_size_is_scored_whole() {
        let mut rng = SplitMix64(1);
        assert_eq!(ttft_sample(16, 16, none(), &[], &mut rng), None);
        assert_eq!(
            ttft_sample(300, 0, none(), &[], &mut rng),
            None,
            "0: never sampled"
        );
        let s = ttft_sample(17, 16, none(), &[], &mut rng).unwrap();
        assert_eq!(s.len(), 16);
    }

    #[test]
    fn floyd_draws_k_distinct_positions_uniformly() {
        let mut rng = SplitMix64(3);
        let mut seen = [0u32; 40];
        for _ in 0..20_000 {
            let mut d = Vec::new();
            distinct(40, 8, &mut rng, |i| d.push(i));
            assert_eq!(d.len(), 8);
            assert!(d.iter().all(|&i| i < 40));
            d.sort_unstable();
            d.dedup();
            assert_eq!(d.len(), 8, "distinct");
            for i in d {
                seen[i] += 1;
            }
        }
        // Each position is drawn with probability 8/40: 4,000 of 20,000 times.
        assert!(
            seen.iter().all(|&s| (3_700..4_300).contains(&s)),
            "{seen:?}"
        );
        let mut all = Vec::new();
        distinct(3, 8, &mut rng, |i| all.push(i));
        assert_eq!(all, vec![0, 1, 2], "fewer than k: all");
    }

    #[test]
    fn the_conversation_and_a_few_holders_are_always_scored() {
        let mut rng = SplitMix64(5);
        // 256 candidates; workers 17, 90 and 200 hold the longest match (holder 1,
        // a worker the screen left out, is no candidate); the conversation is on 250.
        let holders = [17, usize::MAX, 90, 200];
        let at = |j: usize| holders.get(j).copied().filter(|&i| i != usize::MAX);
        let mut drawn_alone = 0;
        for _ in 0..2000 {
            let s = ttft_sample(256, 16, (4, at), &[250], &mut rng).unwrap();
            assert!(s.windows(2).all(|w| w[0] < w[1]), "ascending, once: {s:?}");
            for must in [17, 90, 200, 250] {
                assert!(s.contains(&must), "{must} in {s:?}");
            }
            assert!(s.iter().all(|&i| i < 256));
            // The holders, the conversation and 16 draws (some may coincide).
            assert!((16..=20).contains(&s.len()), "{s:?}");
            drawn_alone += s.contains(&33) as u32;
        }
        // Any other worker only when drawn (16/256 of the time: 125 of 2,000).
        assert!((80..180).contains(&drawn_alone), "{drawn_alone}");
    }

    #[test]
    fn many_holders_are_sampled_too() {
        let mut rng = SplitMix64(9);
        // Every candidate holds the shared prompt: 16 of them, and 16 draws.
        let s = ttft_sample(256, 16, (256, Some), &[], &mut rng).unwrap();
        assert!((16..=32).contains(&s.len()), "{}", s.len());
        // Positions out of range are dropped, never indexed.
        let s = ttft_sample(100, 4, (1, |_| Some(100)), &[100, 3], &mut rng).unwrap();
        assert!(s.contains(&3) && s.iter().all(|&i| i < 100), "{s:?}");
    }
}
