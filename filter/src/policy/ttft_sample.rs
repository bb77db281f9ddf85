//! Which candidates `predicted_ttft` scores for one request in a large fleet, when
//! the operator asks for it (`ttft_sample_size`; every worker by default).
//!
//! Scoring is a pass over the fleet per request: in Envoy a fleet of 256 cost
//! `predicted_ttft` about twice what 4 did. A fleet larger than `sample_size` may
//! therefore be sampled, as Envoy's `LEAST_REQUEST` samples its hosts ("power of d
//! choices"), but never where the cache is decided:
//! - every candidate whose conversation the request continues is scored (the first
//!   rung must see its worker);
//! - up to `sample_size` of the workers holding a match within the 2% margin of
//!   the request's longest (`Tree::holders_within`) are scored, so a prefix only a
//!   few workers hold is found where it is, and the reason labels see the longest
//!   match.
//!   Where more hold it, those with the fewest conversations (ties at random), as
//!   the holders' rung prefers: drawn at random instead, a hot prompt's
//!   conversations spread 4 to 20 a worker where scoring every holder gave 16;
//! - the `sample_size` candidates with the fewest conversations (ties at random)
//!   give the fleet rung the workers it prefers, as the whole fleet scored would.
//!
//! The bounded-load cap stays the whole fleet's (the screen sums the busy workers'
//! in-flight requests). What sampling gives up: the best prediction, which sets
//! the rungs' thresholds, is the sample's.

use crate::rng::Rng;
use crate::tree::{Block, TenantId};

/// Which workers a sample draws from, each where it is among the candidates
/// (`position`: `None` for a worker that is not one).
pub struct Drawn<'t, H, S, F, P> {
    /// How many workers hold a match within the margin of the request's longest,
    /// and the `j`th of them.
    pub holders: (usize, H),
    /// Whether a worker is one of them.
    pub holds: S,
    /// The workers in blocks of equal conversation counts, fewest first
    /// (`tree::Leaves::fewest_first`).
    pub fewest: F,
    pub position: P,
    /// The positions of the candidates whose conversation the request continues.
    pub continuing: &'t [usize],
}

/// Positions in the candidate list (ascending, each once) of the candidates a
/// request scores, or `None` to score all `n` (a fleet of at most `sample_size`, or
/// `sample_size` 0).
pub fn ttft_sample<'b, H, S, F, P>(
    n: usize,
    sample_size: usize,
    drawn: Drawn<'_, H, S, F, P>,
    rng: &mut dyn Rng,
) -> Option<Vec<usize>>
where
    H: Fn(usize) -> Option<TenantId>,
    S: Fn(TenantId) -> bool,
    F: Iterator<Item = Block<'b>>,
    P: Fn(TenantId) -> Option<usize>,
{
    if sample_size == 0 || n <= sample_size {
        return None;
    }
    let Drawn {
        holders: (holding, holder),
        holds,
        fewest,
        position,
        continuing,
    } = drawn;
    // Marks by position, read back in order: ascending and each once without a
    // sort.
    let mut marked = vec![0u64; n.div_ceil(64)];
    let mut mark = |i: Option<usize>| {
        let Some(i) = i.filter(|&i| i < n) else {
            return;
        };
        if let Some(word) = marked.get_mut(i / 64) {
            *word |= 1 << (i % 64);
        }
    };
    continuing.iter().for_each(|&i| mark(Some(i)));
    if holding <= sample_size {
        (0..holding).for_each(|j| mark(holder(j).and_then(&position)));
    }
    // The fewest conversations first: `sample_size` candidates, and as many
    // holders when more hold the match than that. Each block is read from a
    // place drawn at random, round to where it began, so ties go at random and a
    // block's workers that are no candidates (screened out, or serving another
    // model) cost a step each.
    let mut fleet = sample_size;
    let mut holders = if holding > sample_size {
        sample_size
    } else {
        0
    };
    for block in fewest {
        let len = block.len();
        let from = rng.below(len);
        for t in (from..len).chain(0..from).filter_map(|i| block.get(i)) {
            if fleet == 0 && holders == 0 {
                break;
            }
            let Some(at) = position(t) else {
                continue;
            };
            let as_holder = holders > 0 && holds(t);
            if fleet > 0 || as_holder {
                mark(Some(at));
                fleet = fleet.saturating_sub(1);
                holders -= usize::from(as_holder);
            }
        }
        if fleet == 0 && holders == 0 {
            break;
        }
    }
    let mut picked = Vec::with_capacity(sample_size * 2 + continuing.len());
    for (at, &word) in marked.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            picked.push(at * 64 + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
    }
    // Nothing drawn (no candidate in any block): every candidate, rather than none.
    (!picked.is_empty()).then_some(picked)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::tree::Leaves;

    /// Workers `0..n` are candidates `0..n`; `holders` and `continuing` as given,
    /// no conversation counts.
    fn sample(
        n: usize,
        k: usize,
        holders: &[TenantId],
        continuing: &[usize],
        rng: &mut dyn Rng,
    ) -> Option<Vec<usize>> {
        let none = Leaves::default();
        ttft_sample(
            n,
            k,
            Drawn {
                holders: (holders.len(), |j| holders.get(j).copied()),
                holds: |t| holders.contains(&t),
                fewest: none.fewest_first(n),
                position: |t| Some(t as usize).filter(|&i| i < n),
                continuing,
            },
            rng,
        )
    }

    #[test]
    fn a_fleet_within_the_size_is_scored_whole() {
        let mut rng = SplitMix64(1);
        assert_eq!(sample(16, 16, &[], &[], &mut rng), None);
        assert_eq!(sample(300, 0, &[], &[], &mut rng), None, "0: never sampled");
        let s = sample(17, 16, &[], &[], &mut rng).unwrap();
        assert_eq!(s.len(), 16);
    }

    #[test]
    fn the_conversation_and_a_few_holders_are_always_scored() {
        let mut rng = SplitMix64(5);
        // 256 candidates; workers 17, 90 and 200 hold the longest match (worker
        // 300 is no candidate); the conversation is on 250.
        let holders = [17, 300, 90, 200];
        let mut drawn_alone = 0;
        for _ in 0..2000 {
            let s = sample(256, 16, &holders, &[250], &mut rng).unwrap();
            assert!(s.windows(2).all(|w| w[0] < w[1]), "ascending, once: {s:?}");
            for must in [17, 90, 200, 250] {
                assert!(s.contains(&must), "{must} in {s:?}");
            }
            assert!(s.iter().all(|&i| i < 256));
            // The holders, the conversation and the 16 with the fewest
            // conversations (all have none: at random; some may coincide).
            assert!((16..=20).contains(&s.len()), "{s:?}");
            drawn_alone += s.contains(&33) as u32;
        }
        // Any other worker only when drawn (16/256 of the time: 125 of 2,000).
        assert!((80..180).contains(&drawn_alone), "{drawn_alone}");
    }

    #[test]
    fn many_holders_are_sampled_too() {
        let mut rng = SplitMix64(9);
        // Every candidate holds the shared prompt: 16 of them, which are also
        // the 16 with the fewest conversations.
        let all: Vec<TenantId> = (0..256).collect();
        let s = sample(256, 16, &all, &[], &mut rng).unwrap();
        assert!((16..=32).contains(&s.len()), "{}", s.len());
        // Positions out of range are dropped, never indexed.
        let s = sample(100, 4, &[100], &[100, 3], &mut rng).unwrap();
        assert!(s.contains(&3) && s.iter().all(|&i| i < 100), "{s:?}");
    }

    #[test]
    fn many_holders_give_those_with_the_fewest_conversations() {
        let mut rng = SplitMix64(15);
        // Workers 0..100 hold the match but 50..60; those without it have the
        // fewest conversations (none), then 30..36 (one), the rest 2 or more.
        let mut leaves = Leaves::default();
        for t in 0..100 {
            let n = match t {
                50..60 => 0,
                30..36 => 1,
                t => 2 + t % 3,
            };
            (0..n).for_each(|_| leaves.add(t));
        }
        let holders: Vec<TenantId> = (0..100).filter(|t| !(50..60).contains(t)).collect();
        for _ in 0..200 {
            let s = ttft_sample(
                100,
                8,
                Drawn {
                    holders: (holders.len(), |j| holders.get(j).copied()),
                    holds: |t| !(50..60).contains(&t),
                    fewest: leaves.fewest_first(100),
                    position: |t| Some(t as usize),
                    continuing: &[],
                },
                &mut rng,
            )
            .unwrap();
            // The six holders with one, and two of those with two (more when
            // they are among the fleet's fewest).
            assert!((30..36).all(|t| s.contains(&t)), "{s:?}");
            let two = |t: &&usize| {
                (**t).is_multiple_of(3) && !(30..36).contains(*t) && !(50..60).contains(*t)
            };
            assert!(s.iter().filter(two).count() >= 2, "{s:?}");
        }
    }

    #[test]
    fn the_workers_with_the_fewest_conversations_are_always_scored() {
        let mut rng = SplitMix64(11);
        // 256 workers, every one with 5 conversations but 40..50 with 2 and
        // 60..70 with 3; worker 45 is no candidate (the position skips it).
        let mut leaves = Leaves::default();
        for t in 0..256 {
            let n = match t {
                40..50 => 2,
                60..70 => 3,
                _ => 5,
            };
            (0..n).for_each(|_| leaves.add(t));
        }
        let mut third = [0u32; 10];
        for _ in 0..2000 {
            let s = ttft_sample(
                255,
                16,
                Drawn {
                    holders: (0, |_| None),
                    holds: |_| false,
                    fewest: leaves.fewest_first(256),
                    position: |t: TenantId| match t {
                        45 => None,
                        t if t > 45 => Some(t as usize - 1),
                        t => Some(t as usize),
                    },
                    continuing: &[],
                },
                &mut rng,
            )
            .unwrap();
            // The nine candidates with 2 (positions 40..49, without 45's), then
            // six of the ten with 3 (positions 59..69), the fewest.
            for must in 40..49 {
                assert!(s.contains(&must), "{must} in {s:?}");
            }
            let with_three: Vec<usize> =
                s.iter().copied().filter(|i| (59..69).contains(i)).collect();
            assert!(with_three.len() >= 6, "{s:?}");
            for i in with_three {
                third[i - 59] += 1;
            }
        }
        // Six of ten with 3 each time, at random: each about 1,200 of 2,000 times
        // (at random where the block is read from).
        assert!(
            third.iter().all(|&n| (1_100..1_500).contains(&n)),
            "{third:?}"
        );
    }
}
