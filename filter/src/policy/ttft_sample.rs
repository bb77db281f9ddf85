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
//! - the `sample_size` workers with the fewest conversations (ties at random) give
//!   the fleet rung the workers it prefers, as the whole fleet scored would;
//! - `sample_size` candidates drawn at random from the whole fleet give it a
//!   choice where those few are busy or slow, or serve another model.
//!
//! The bounded-load cap stays the whole fleet's (the screen sums the busy workers'
//! in-flight requests). What sampling gives up: the best prediction, which sets
//! the rungs' thresholds, is the sample's.

use crate::rng::Rng;
use crate::tree::{Block, TenantId};

/// Which workers a sample draws from, each where it is among the candidates
/// (`position`: `None` for a worker that is not one).
pub struct Drawn<'t, H, F, P> {
    /// How many workers hold a match within the margin of the request's longest,
    /// and the `j`th of them.
    pub holders: (usize, H),
    /// Conversations by worker (`tree::Leaves::as_slice`).
    pub conversations: &'t [usize],
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
pub fn ttft_sample<'b, H, F, P>(
    n: usize,
    sample_size: usize,
    drawn: Drawn<'_, H, F, P>,
    rng: &mut dyn Rng,
) -> Option<Vec<usize>>
where
    H: Fn(usize) -> Option<TenantId>,
    F: Iterator<Item = Block<'b>>,
    P: Fn(TenantId) -> Option<usize>,
{
    if sample_size == 0 || n <= sample_size {
        return None;
    }
    let Drawn {
        holders: (holding, holder),
        conversations,
        fewest,
        position,
        continuing,
    } = drawn;
    // Marks by position, read back in order: ascending and each once without a
    // sort.
    let mut marked = vec![0u64; n.div_ceil(64)];
    let mut mark = |i: usize| {
        if let Some(word) = marked.get_mut(i / 64).filter(|_| i < n) {
            *word |= 1 << (i % 64);
        }
    };
    continuing.iter().for_each(|&i| mark(i));
    let holds = |j: usize| {
        let t = holder(j)?;
        Some((t, conversations.get(t as usize).copied().unwrap_or(0)))
    };
    least(
        holding,
        sample_size,
        |j| holds(j).map(|(_, c)| c),
        rng,
        |j| {
            holds(j)
                .and_then(|(t, _)| position(t))
                .into_iter()
                .for_each(&mut mark)
        },
    );
    distinct(n, sample_size, rng, &mut mark);
    let mut wanted = sample_size;
    for block in fewest {
        if wanted == 0 {
            break;
        }
        let k = wanted.min(block.len());
        distinct(block.len(), k, rng, |i| {
            block
                .get(i)
                .and_then(&position)
                .into_iter()
                .for_each(&mut mark)
        });
        wanted -= k;
    }
    let mut picked = Vec::with_capacity(sample_size * 3 + continuing.len());
    for (at, &word) in marked.iter().enumerate() {
        let mut bits = word;
        while bits != 0 {
            picked.push(at * 64 + bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
    }
    Some(picked)
}

/// Gives the `k` positions of `0..n` with the least `key` to `take` (all of them
/// when `n <= k`; positions without a key last), ties at random: two passes and
/// a selection, no sort.
fn least(
    n: usize,
    k: usize,
    key: impl Fn(usize) -> Option<usize>,
    rng: &mut dyn Rng,
    mut take: impl FnMut(usize),
) {
    if n <= k {
        (0..n).for_each(take);
        return;
    }
    let key = |j| key(j).unwrap_or(usize::MAX);
    let mut keys: Vec<usize> = (0..n).map(key).collect();
    let Some(kth) = k.checked_sub(1).map(|i| *keys.select_nth_unstable(i).1) else {
        return;
    };
    let mut tied = Vec::new();
    let mut below = 0;
    for j in 0..n {
        match key(j).cmp(&kth) {
            std::cmp::Ordering::Less => {
                below += 1;
                take(j);
            }
            std::cmp::Ordering::Equal => tied.push(j),
            std::cmp::Ordering::Greater => {}
        }
    }
    distinct(tied.len(), k.saturating_sub(below), rng, |i| {
        tied.get(i).copied().into_iter().for_each(&mut take)
    });
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
                conversations: &[],
                fewest: none.fewest_first(0),
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
    fn the_least_keys_are_taken_ties_at_random() {
        let mut rng = SplitMix64(13);
        // Keys 0..20 as j % 5, position 7 without one: the four 0s, then two of
        // the four 1s.
        let key = |j: usize| (j != 7).then_some(j % 5);
        let mut ones = [0u32; 20];
        for _ in 0..4000 {
            let mut got = Vec::new();
            least(20, 6, key, &mut rng, |j| got.push(j));
            got.sort_unstable_by_key(|&j| (j % 5, j));
            assert_eq!(got.len(), 6, "{got:?}");
            assert_eq!(&got[..4], &[0, 5, 10, 15], "{got:?}");
            assert!(got[4..].iter().all(|&j| j % 5 == 1), "{got:?}");
            got[4..].iter().for_each(|&j| ones[j] += 1);
        }
        // Each 1 is taken half the time.
        for j in [1, 6, 11, 16] {
            assert!((1_800..2_200).contains(&ones[j]), "{ones:?}");
        }
        let mut got = Vec::new();
        least(20, 20, key, &mut rng, |j| got.push(j));
        assert_eq!(got, (0..20).collect::<Vec<_>>(), "k >= n: all");
        let mut got = Vec::new();
        least(20, 19, key, &mut rng, |j| got.push(j));
        assert!(!got.contains(&7), "no key: last");
        least(20, 0, key, &mut rng, |_| panic!("k 0: none"));
    }

    #[test]
    fn many_holders_give_those_with_the_fewest_conversations() {
        let mut rng = SplitMix64(15);
        // Workers 0..100 all hold the match; 30..36 have one conversation, the
        // rest 2 or more.
        let conversations: Vec<usize> = (0..100)
            .map(|t| if (30..36).contains(&t) { 1 } else { 2 + t % 3 })
            .collect();
        let holders: Vec<TenantId> = (0..100).collect();
        let none = Leaves::default();
        let s = ttft_sample(
            100,
            6,
            Drawn {
                holders: (100, |j| holders.get(j).copied()),
                conversations: &conversations,
                fewest: none.fewest_first(0),
                position: |t| Some(t as usize),
                continuing: &[],
            },
            &mut rng,
        )
        .unwrap();
        assert!((30..36).all(|t| s.contains(&t)), "{s:?}");
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
        let all: Vec<TenantId> = (0..256).collect();
        let s = sample(256, 16, &all, &[], &mut rng).unwrap();
        assert!((16..=32).contains(&s.len()), "{}", s.len());
        // Positions out of range are dropped, never indexed.
        let s = sample(100, 4, &[100], &[100, 3], &mut rng).unwrap();
        assert!(s.contains(&3) && s.iter().all(|&i| i < 100), "{s:?}");
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
                    conversations: leaves.as_slice(),
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
            // six of the ten with 3 (positions 59..69), then 16 drawn at random.
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
        // (more where a draw from the fleet adds it).
        assert!(
            third.iter().all(|&n| (1_100..1_500).contains(&n)),
            "{third:?}"
        );
    }
}
