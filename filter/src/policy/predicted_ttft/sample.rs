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
//!   conversations spread 4 to 20 a worker where scoring every holder gave 16.
//!   Found from the holders' own list while it is short against the fleet (at
//!   most `sqrt(sample_size * n)`), tallied by conversations with no sort;
//!   otherwise they are common enough that reading the workers fewest first, as
//!   for the fleet's (next), meets them soon;
//! - a quarter as many candidates (`fleet_draws`) with the fewest conversations
//!   (ties at random) give the fleet rung the workers it prefers, as the whole
//!   fleet scored would. The rung takes a new conversation nobody holds a prefix
//!   of, so any of the fewest serves it alike but for their load, and picking the
//!   least loaded of a few such draws is the power of d choices again: with 2, 4
//!   or 8 draws, twenty replays at 32 to 256 workers (idle, queueing, hot
//!   prefix, 64 prompts) placed every request as every worker scored did (16
//!   draws: within 0.04 point of cached tokens), and each draw dropped is a
//!   candidate less to score (about 350 Envoy instructions at 256 workers).
//!
//! The bounded-load cap stays the whole fleet's (the screen sums the busy workers'
//! in-flight requests). What sampling gives up: the best prediction, which sets
//! the rungs' thresholds, is the sample's.

use crate::rng::Rng;
use crate::tree::{Block, TenantId};

/// Words of marks kept on the stack (a fleet of up to 512 candidates).
const STACK_MARKS: usize = 8;

/// How many conversation counts a holder list is tallied by, from the fleet's
/// fewest up; the last takes every count past it, and a cut there is left to the
/// walk.
const HOLDER_LEVELS: usize = 64;

/// The bits of a found holder's word that hold its level (`HOLDER_LEVELS`).
const LEVEL_BITS: u32 = 6;
const LEVEL_MASK: u64 = (1 << LEVEL_BITS) - 1;

/// Which workers a sample draws from, each where it is among the candidates
/// (`position`: `None` for a worker that is not one).
pub struct Drawn<'t, H, S, C, F, P> {
    /// The workers holding a match within the margin of the request's longest.
    pub holders: H,
    /// Whether a worker is one of them.
    pub holds: S,
    /// A worker's conversations, as `fewest` counts them.
    pub conversations: C,
    /// The workers in blocks of equal conversation counts, fewest first
    /// (`tree::Leaves::fewest_first`).
    pub fewest: F,
    pub position: P,
    /// The positions of the candidates whose conversation the request continues.
    pub continuing: &'t [usize],
}

/// How many of the fleet's workers with the fewest conversations a sample of
/// `sample_size` draws for the fleet rung (at least one).
pub fn fleet_draws(sample_size: usize) -> usize {
    sample_size.div_ceil(4)
}

/// Positions in a candidate list of `n`, each marked once and read back in order
/// (ascending, without a sort). The words live on the stack for a fleet of up to
/// `STACK_MARKS * 64`: read back into a list, the sample cost an allocation a
/// request.
pub struct Marks {
    on_stack: [u64; STACK_MARKS],
    on_heap: Vec<u64>,
    n: usize,
}

impl Marks {
    fn new(n: usize) -> Marks {
        let words = n.div_ceil(64);
        Marks {
            on_stack: [0; STACK_MARKS],
            on_heap: if words <= STACK_MARKS {
                Vec::new()
            } else {
                vec![0; words]
            },
            n,
        }
    }

    fn words(&self) -> &[u64] {
        if self.on_heap.is_empty() {
            self.on_stack.get(..self.n.div_ceil(64)).unwrap_or_default()
        } else {
            &self.on_heap
        }
    }

    /// A marker of positions, the words found once for all its marks rather than
    /// at every mark.
    fn marker(&mut self) -> Marker<'_> {
        let n = self.n;
        let words = if self.on_heap.is_empty() {
            self.on_stack.as_mut_slice()
        } else {
            self.on_heap.as_mut_slice()
        };
        Marker { words, n }
    }

    /// How many positions are marked.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.words().iter().map(|w| w.count_ones() as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.words().iter().all(|&w| w == 0)
    }

    /// Calls `f` with each marked position, ascending (a loop of its own: as an
    /// iterator, the scoring loop it drives cost Envoy more than the list did).
    pub fn for_each(&self, mut f: impl FnMut(usize)) {
        for (at, &word) in self.words().iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                f(at * 64 + bits.trailing_zeros() as usize);
                bits &= bits - 1;
            }
        }
    }
}

/// Marks positions of a `Marks`.
struct Marker<'m> {
    words: &'m mut [u64],
    n: usize,
}

impl Marker<'_> {
    /// Marks position `i` (one past the list is left out).
    fn mark(&mut self, i: usize) {
        if i < self.n {
            if let Some(word) = self.words.get_mut(i / 64) {
                *word |= 1 << (i % 64);
            }
        }
    }
}

/// The positions in the candidate list of the candidates a request scores, or
/// `None` to score all `n` (a fleet of at most `sample_size`, or `sample_size` 0).
/// `found` is room for a short holder list's tally, kept by the caller from
/// request to request.
pub fn ttft_sample<'b, H, S, C, F, P>(
    n: usize,
    sample_size: usize,
    drawn: Drawn<'_, H, S, C, F, P>,
    (found, rng): (&mut Vec<u64>, &mut dyn Rng),
) -> Option<Marks>
where
    H: ExactSizeIterator<Item = TenantId>,
    S: Fn(TenantId) -> bool,
    C: Fn(TenantId) -> usize,
    F: Iterator<Item = Block<'b>>,
    P: Fn(TenantId) -> Option<usize>,
{
    if sample_size == 0 || n <= sample_size {
        return None;
    }
    let Drawn {
        holders,
        holds,
        conversations,
        fewest,
        position,
        continuing,
    } = drawn;
    let holding = holders.len();
    let mut marks = Marks::new(n);
    let mut marker = marks.marker();
    let mut mark = |i| marker.mark(i);
    continuing.iter().for_each(|&i| mark(i));
    let mut fewest = fewest.peekable();
    // Holders the walk below still has to find.
    let mut to_find = 0;
    if holding <= sample_size {
        holders.filter_map(&position).for_each(&mut mark);
    } else if holding.saturating_mul(holding) > sample_size.saturating_mul(n) {
        to_find = sample_size;
    } else {
        // A few holders in a large fleet: the walk meets one every `n / holding`
        // workers at best, `sample_size * n / holding` steps (128 at 256 workers,
        // 16 sampled and 32 holders), and later where the holders, having taken
        // their prompt's conversations, sit above the fleet's fewest (in replays
        // at 256 workers, about 240 steps for 17 holders, 210 for 56). Reading
        // the list once to tally its holders by count, and the tally's words once
        // more to take them, is `2 * holding` steps. Counts are tallied from the
        // fleet's fewest, which no holder has fewer than.
        let base = fewest
            .peek()
            .and_then(|b| b.get(0))
            .map_or(0, &conversations);
        // Each holder that is a candidate is looked up once, and kept as its level
        // in the low bits of its position: looked up again to be taken, a holder
        // cost V8 about 40 instructions more (1.3k a request at 256 workers).
        // Written by index into room grown once, not pushed: a push cost V8 about
        // 8 instructions more a holder.
        if found.len() < holding {
            found.resize(holding, 0);
        }
        let found = found.as_mut_slice();
        let mut at_level = [0usize; HOLDER_LEVELS];
        let mut len = 0;
        for t in holders {
            let Some(at) = position(t).filter(|&at| at < n) else {
                continue;
            };
            let l = conversations(t).saturating_sub(base).min(HOLDER_LEVELS - 1);
            if let (Some(a), Some(slot)) = (at_level.get_mut(l), found.get_mut(len)) {
                *a += 1;
                *slot = (at as u64) << LEVEL_BITS | l as u64;
                len += 1;
            }
        }
        // The cut: every holder below level `cut` is taken, and `need` of the
        // `ties` at it.
        let (mut below, mut cut) = (0, 0);
        while cut < HOLDER_LEVELS - 1 && below + at_level[cut] < sample_size {
            below += at_level[cut];
            cut += 1;
        }
        let ties = at_level[cut];
        if below + ties > sample_size && cut == HOLDER_LEVELS - 1 {
            // The cut is among counts the tally lumped together.
            to_find = sample_size;
        } else {
            let need = ties.min(sample_size - below);
            // A run of `need` ties, cyclic from one drawn at random: each tie as
            // likely to be taken as any other.
            let from = rng.below(ties);
            // The run, and its part wrapped round to the first ties.
            let (run, wrapped) = (from..from + need, (from + need).saturating_sub(ties));
            let mut tie = 0;
            for &e in found.get(..len).unwrap_or_default() {
                let (l, at) = ((e & LEVEL_MASK) as usize, (e >> LEVEL_BITS) as usize);
                if l < cut {
                    mark(at);
                } else if l == cut {
                    if run.contains(&tie) || tie < wrapped {
                        mark(at);
                    }
                    tie += 1;
                }
            }
        }
    }
    // The fewest conversations first: `fleet_draws` candidates, and the holders
    // left to find. Each block is read from a place drawn at random, round to
    // where it began, so ties go at random and a block's workers that are no
    // candidates (screened out, or serving another model) cost a step each.
    let mut fleet = fleet_draws(sample_size);
    for block in fewest {
        let len = block.len();
        let from = rng.below(len);
        for k in 0..len {
            if fleet == 0 && to_find == 0 {
                break;
            }
            let i = if k < len - from {
                from + k
            } else {
                k - (len - from)
            };
            let Some(t) = block.get(i) else {
                continue;
            };
            let Some(at) = position(t) else {
                continue;
            };
            let as_holder = to_find > 0 && holds(t);
            if fleet > 0 || as_holder {
                mark(at);
                fleet = fleet.saturating_sub(1);
                to_find -= usize::from(as_holder);
            }
        }
        if fleet == 0 && to_find == 0 {
            break;
        }
    }
    // Nothing drawn (no candidate in any block): every candidate, rather than none.
    (!marks.is_empty()).then_some(marks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::SplitMix64;
    use crate::tree::Leaves;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The sample's positions, ascending.
    fn positions(marks: Option<Marks>) -> Option<Vec<usize>> {
        marks.map(|m| {
            let mut at = Vec::new();
            m.for_each(|i| at.push(i));
            at
        })
    }

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
        positions(ttft_sample(
            n,
            k,
            Drawn {
                holders: holders.iter().copied(),
                holds: |t| holders.contains(&t),
                conversations: |t| none.get(t),
                fewest: none.fewest_first(n),
                position: |t| Some(t as usize).filter(|&i| i < n),
                continuing,
            },
            (&mut Vec::new(), rng),
        ))
    }

    /// Workers `0..n` with `counts` conversations each.
    fn leaves_of(n: usize, counts: impl Fn(TenantId) -> usize) -> Leaves {
        let mut leaves = Leaves::default();
        for t in 0..n as TenantId {
            (0..counts(t)).for_each(|_| leaves.add(t));
        }
        leaves
    }

    /// Workers `0..n` with `leaves`, candidates at their own index but those in
    /// `out`; `holders` hold the match. The sample, and how many times a worker
    /// was asked whether it holds the match (the walk asks, a read of the holder
    /// list does not).
    fn sample_by_counts(
        nk: (usize, usize),
        holders: &[TenantId],
        leaves: &Leaves,
        out: &[TenantId],
        rng: &mut dyn Rng,
    ) -> (Vec<usize>, usize) {
        sample_in_room(nk, holders, leaves, out, (&mut Vec::new(), rng))
    }

    /// `sample_by_counts` with the tally's room given.
    fn sample_in_room(
        (n, k): (usize, usize),
        holders: &[TenantId],
        leaves: &Leaves,
        out: &[TenantId],
        (found, rng): (&mut Vec<u64>, &mut dyn Rng),
    ) -> (Vec<usize>, usize) {
        let asked = std::cell::Cell::new(0);
        let s = positions(ttft_sample(
            n,
            k,
            Drawn {
                holders: holders.iter().copied(),
                holds: |t| {
                    asked.set(asked.get() + 1);
                    holders.contains(&t)
                },
                conversations: |t| leaves.get(t),
                fewest: leaves.fewest_first(n),
                position: |t| (!out.contains(&t)).then_some(t as usize),
                continuing: &[],
            },
            (found, rng),
        ))
        .unwrap();
        (s, asked.get())
    }

    #[test]
    fn marks_read_back_ascending_once_each_on_the_stack_and_the_heap() {
        let mut rng = SplitMix64(3);
        // Up to `STACK_MARKS * 64` on the stack, past it on the heap.
        for n in [1, 63, 64, 65, 511, 512, 513, 1500] {
            let mut marks = Marks::new(n);
            assert!(marks.is_empty());
            let mut want = std::collections::BTreeSet::new();
            let mut marker = marks.marker();
            for _ in 0..200 {
                let i = rng.below(n + 2);
                marker.mark(i);
                if i < n {
                    want.insert(i);
                }
            }
            let mut got = Vec::new();
            marks.for_each(|i| got.push(i));
            assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "n {n}");
            assert_eq!(marks.len(), want.len(), "n {n}");
            assert_eq!(marks.is_empty(), want.is_empty(), "n {n}");
        }
    }

    #[test]
    fn a_fleet_within_the_size_is_scored_whole() {
        let mut rng = SplitMix64(1);
        assert_eq!(sample(16, 16, &[], &[], &mut rng), None);
        assert_eq!(sample(300, 0, &[], &[], &mut rng), None, "0: never sampled");
        // A quarter as many drawn from the fleet (at least one).
        let s = sample(17, 16, &[], &[], &mut rng).unwrap();
        assert_eq!(s.len(), 4);
        assert_eq!(fleet_draws(16), 4);
        assert_eq!(fleet_draws(1), 1);
        assert_eq!(fleet_draws(5), 2);
        let s = sample(300, 1, &[], &[], &mut rng).unwrap();
        assert_eq!(s.len(), 1);
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
            // The holders, the conversation and the 4 drawn from the fleet's
            // fewest conversations (all have none: at random; some may coincide).
            assert!((4..=8).contains(&s.len()), "{s:?}");
            drawn_alone += s.contains(&33) as u32;
        }
        // Any other worker only when drawn (4/256 of the time: 31 of 2,000).
        assert!((12..60).contains(&drawn_alone), "{drawn_alone}");
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
            let s = positions(ttft_sample(
                100,
                8,
                Drawn {
                    holders: holders.iter().copied(),
                    holds: |t| !(50..60).contains(&t),
                    conversations: |t| leaves.get(t),
                    fewest: leaves.fewest_first(100),
                    position: |t| Some(t as usize),
                    continuing: &[],
                },
                (&mut Vec::new(), &mut rng),
            ))
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
            // 15 drawn from the fleet.
            let s = positions(ttft_sample(
                255,
                60,
                Drawn {
                    holders: std::iter::empty(),
                    holds: |_| false,
                    conversations: |t| leaves.get(t),
                    fewest: leaves.fewest_first(256),
                    position: |t: TenantId| match t {
                        45 => None,
                        t if t > 45 => Some(t as usize - 1),
                        t => Some(t as usize),
                    },
                    continuing: &[],
                },
                (&mut Vec::new(), &mut rng),
            ))
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

    #[test]
    fn a_few_holders_give_those_with_the_fewest_conversations_from_their_list() {
        // 256 workers, 16 sampled: 32 and 64 holders (every 8th, every 4th
        // worker; 64 the most the list is read for) are read from their list,
        // 128 (every other) are walked to, and all take the same holders. The
        // other workers have one conversation each, so the fleet's 4 are none of
        // the holders; of these the first 10 have two (worker 0
        // is no candidate), the next 10 three and the rest four: the nine
        // candidates with two and seven of the ten with three, at random.
        for (holding, listed) in [(32, true), (64, true), (128, false)] {
            let every = 256 / holding;
            let holders: Vec<TenantId> = (0..holding).map(|i| i * every).collect();
            let counts = |t: TenantId| match t / every {
                _ if !t.is_multiple_of(every) => 1,
                i if i < 10 => 2,
                i if i < 20 => 3,
                _ => 4,
            };
            let leaves = leaves_of(256, counts);
            let mut rng = SplitMix64(21);
            let mut third = [0u32; 256];
            for _ in 0..2000 {
                let (s, asked) = sample_by_counts((256, 16), &holders, &leaves, &[0], &mut rng);
                assert_eq!(asked == 0, listed, "{holding} holders: the list is read");
                let held: Vec<usize> = s
                    .iter()
                    .copied()
                    .filter(|i| i % every as usize == 0)
                    .collect();
                assert_eq!(held.len(), 16, "{holding} holders: 16 of them in {s:?}");
                for i in held {
                    match counts(i as TenantId) {
                        2 => {}
                        3 => third[i] += 1,
                        c => panic!("{holding} holders: {i} with {c} in {s:?}"),
                    }
                }
                assert!(!s.contains(&0), "worker 0 is no candidate: {s:?}");
            }
            // Seven of the ten with three, each as likely: 1,400 of 2,000 times.
            for t in holders.iter().filter(|&&t| counts(t) == 3) {
                let got = third[*t as usize];
                assert!(
                    (1_250..1_550).contains(&got),
                    "{holding} holders: {t} taken {got} times, about 1,400"
                );
            }
        }
    }

    #[test]
    fn the_tallys_room_kept_from_a_longer_list_changes_no_sample() {
        // Lists of 64, then 17, 40 and 32 holders of 256 (all read from their
        // list), each sampled with the room the one before left and with a new
        // one, from the same random state: the same sample.
        let leaves = leaves_of(256, |t| 1 + (t as usize * 7) % 5);
        let mut kept = Vec::new();
        for (holding, every) in [(64, 4), (17, 15), (40, 6), (32, 8)] {
            let holders: Vec<TenantId> = (0..holding).map(|i| i * every).collect();
            for seed in 0..20 {
                let sampled = |found: &mut Vec<u64>| {
                    let mut rng = SplitMix64(seed);
                    sample_in_room((256, 16), &holders, &leaves, &[], (found, &mut rng))
                };
                let (with_kept, asked) = sampled(&mut kept);
                assert_eq!(asked, 0, "{holding} holders: the list is read");
                assert_eq!(with_kept, sampled(&mut Vec::new()).0, "{holding} holders");
            }
        }
        assert_eq!(kept.len(), 64, "grown once, to the longest list");
    }

    #[test]
    fn one_holder_past_the_size_is_the_one_with_the_most_conversations_left_out() {
        // 17 holders of 256, 16 sampled, the fleet at 3 conversations, the holders
        // at 5 but worker 160's at 9: every holder but 160. With worker 10 no
        // candidate, 16 candidates hold the match: all of them, 160 too.
        let holders: Vec<TenantId> = (0..17).map(|i| i * 10).collect();
        let leaves = leaves_of(256, |t| match t {
            160 => 9,
            t if t % 10 == 0 && t < 160 => 5,
            _ => 3,
        });
        let mut rng = SplitMix64(23);
        for _ in 0..200 {
            let (s, asked) = sample_by_counts((256, 16), &holders, &leaves, &[], &mut rng);
            assert_eq!(asked, 0, "the list is read");
            assert!(
                holders[..16].iter().all(|&t| s.contains(&(t as usize))),
                "{s:?}"
            );
            assert!(!s.contains(&160), "160 has the most: {s:?}");
            let (s, _) = sample_by_counts((256, 16), &holders, &leaves, &[10], &mut rng);
            assert!(
                holders
                    .iter()
                    .all(|&t| (t == 10) != s.contains(&(t as usize))),
                "{s:?}"
            );
        }
    }

    #[test]
    fn holders_far_above_the_fleets_fewest_are_walked_to() {
        // Worker 1 has no conversation, the fleet 200, the 32 holders 300 and up
        // (five with 300): past the levels the list is tallied by, so the walk
        // takes the holders, still those with the fewest.
        let holders: Vec<TenantId> = (0..32).map(|i| i * 8).collect();
        let leaves = leaves_of(256, |t| match t {
            1 => 0,
            t if t % 8 != 0 => 200,
            t if t < 40 => 300,
            t => 301 + t as usize % 3,
        });
        let mut rng = SplitMix64(25);
        for _ in 0..50 {
            let (s, asked) = sample_by_counts((256, 16), &holders, &leaves, &[], &mut rng);
            assert!(asked > 0, "the fleet is walked");
            assert!((0..40).step_by(8).all(|t| s.contains(&t)), "{s:?}");
            let held = s.iter().filter(|&&i| i % 8 == 0).count();
            assert_eq!(held, 16, "{s:?}");
        }
    }
}
