//! `predicted_ttft`: send each request to the worker where it would see its first
//! token soonest, stay with the cache while the cache is worth more than the queue,
//! and move when it is not. Each candidate's prediction is `super::predict`'s;
//! here is how the ladder chooses by it. "Predicted" below is the candidate's
//! cost (`cost_us`): its predicted time to first token, plus the prefill of what
//! a copy of another worker's prefix would evict from its full cache.
//!
//! Rungs. `best` is the least prediction among the workers under the cap; "within
//! the stay factor" means predicted at most `stay_factor` times `best`, "near" at
//! most `1 + load_factor` times; among the workers a rung keeps, the one with the
//! fewest conversations wins, then the least predicted, near-ties (2%) at random:
//! 1. **The conversation's worker**: a request that continues a text a worker holds
//!    (the tree's leaf: a conversation's next turn resends the turns before it)
//!    stays there while it is within the stay factor, even above the cap. A
//!    conversation is one request at a time, so it cannot herd by itself, and moving
//!    it costs its whole history once more: this is what keeps the cached ratio at
//!    what affinity (ring hash on a session id) gets.
//! 2. **The prefix's holders** (Preble's exploit rule): workers within the stay
//!    factor holding the longest match any of those has, whose cached part is
//!    longer than their missing tail, predicted within `1 + load_factor` of the
//!    soonest of them, and not past the cap on conversations. The stay factor
//!    keeps a cache against a copy; among holders that each keep it, balance
//!    costs a first token no more than bounded load allows (an engine several
//!    times slower, holding the same system prompt, took new conversations for
//!    having fewer, and each of their turns was slow). The
//!    cap on requests does not apply: it stops a pile-up, a pile-up shows in the
//!    prediction, and it must not override a prefill saving larger than the wait
//!    it avoids (a slow engine holding a prompt runs more requests at once than
//!    a fast one; a request moved for the count prefills the prompt again, later).
//!    A hot prefix is kept from herding by the bound on conversations.
//! 3. **The fleet**: every worker under the cap and near, but one holding less
//!    than the longest match among those only while it is predicted no slower
//!    than the soonest of the workers holding it that are under the cap on
//!    conversations (below). Balance may cost a new
//!    conversation a slower first token, but only by what bounded load allows, and
//!    it never overrides a prefill saving larger than the wait it avoids: a
//!    conversation whose history its engine evicted (and the tree, bounded by the
//!    engine's cache, forgot) goes to an engine holding its system prompt unless
//!    another is sooner. The stay factor is for keeping a cache, not for spreading.
//!
//! Two bounds keep the load even (consistent hashing with bounded loads, Envoy's
//! `hash_balance_factor`):
//! - **Requests now**: a worker is under the cap if taking this request keeps it at
//!   or below `ceil((1 + load_factor) * mean) + 1`, where `mean` is the candidates'
//!   in-flight requests including this one. Some worker is always under it.
//! - **Work to come**: a worker's conversations are its leaves in the tree (every
//!   new conversation adds one, later turns extend it), the same on every Envoy
//!   thread; where the trees are bounded by the engines' caches and every
//!   candidate's capacity is known, weighed by the candidates' mean capacity over
//!   the worker's own (`super::room`: a larger cache keeps more of them). A holder may take a new conversation only while it has fewer than
//!   `ceil((1 + load_factor) * fewest) + 2` (`conversation_cap`), `fewest` being the least any near
//!   worker under the cap has (one far slower for this request, say one that would
//!   prefill a long prompt the others hold while they are idle, is no alternative). Placing by the queue of the moment would not do: with
//!   conversations that stay, a worker that looked idle while others prefilled a
//!   long shared prompt would keep the extra conversations it took for the rest of
//!   their lives, and its queue with them.
//!
//! Matches within 2% of the input of each other count as equal (two users'
//! questions that begin alike are no reason to prefer a worker), and one no longer
//! than that is no match.
//!
//! Reasons (labels): `ttft_cache` (the winner holds this request's longest match
//! among the candidates; `cache_hit`), `ttft_spread` (a holder was under the cap
//! but slower or already holding too many conversations: moved for load),
//! `ttft_capped` (every holder was above the cap and rung 2 kept none), `ttft_cold`
//! (nobody holds any of it); all three `cache_miss`.
//!
//! The effect on a hot prefix: the first holder takes new conversations while its
//! queue is short and its conversations are few; then the prefix is prefilled
//! elsewhere, which becomes a second holder, and so on until the prefix is
//! replicated on as many workers as its traffic needs, each with an even share of
//! the conversations, which then stay where their history is.

use super::predict::Scored;
use super::TtftParams;
use crate::decision::{Decision, GateAudit, Prediction, Reason};
use crate::policy::decide;
use crate::rng::Rng;

/// Near-ties: predictions within this share of the minimum are equal.
const NEAR_TIE_SHARE: f64 = 0.02;
/// Bounded load: the most requests any worker may hold once this one is placed,
/// `ceil((1 + load_factor) * mean) + 1` with `mean` over `n` workers including it.
pub fn load_cap(total_inflight: u64, n: usize, load_factor: f64) -> u64 {
    if n == 0 {
        return 0;
    }
    let mean = (total_inflight as f64 + 1.0) / n as f64;
    ((1.0 + load_factor) * mean).ceil() as u64 + 1
}

/// Work to come: a holder may take a new conversation only while it has fewer than
/// `ceil((1 + load_factor) * fewest) + 2`, `fewest` being the fleet's. The slack of
/// two lets a holder take a prompt's second conversation while some engine has
/// none: in a start-up burst a prompt's second request often arrives before the
/// other prompts' first ones (connections race), and with a slack of one it copied
/// the prompt to an idle engine, which then kept a second prompt's conversations
/// and their queue for the rest of the run.
pub fn conversation_cap(fewest: u64, load_factor: f64) -> u64 {
    ((1.0 + load_factor) * fewest as f64).ceil() as u64 + 2
}

/// A few chars of a match (two users' questions that start alike) are no reason to
/// prefer a worker: matches within this many chars of each other are equal, and
/// one no longer than it is no match.
pub fn match_margin(input_chars: u64) -> u64 {
    (input_chars as f64 * NEAR_TIE_SHARE) as u64
}

/// The ladder for one request, fed one scored candidate at a time.
///
/// The rungs depend on each other (the cap on the total, the rungs on the best
/// prediction, the holders on the fewest conversations), so a ladder stated rung by
/// rung passes over the fleet once per aggregate, and at 256 workers those passes
/// were most of the policy's cost. Here the aggregates that need only the cap are
/// taken as the router scores each candidate (`push`), and everything else in one
/// pass (`decide`): the three rungs' least-loaded picks are kept side by side and
/// the ladder then chooses among them. What it decides is the ladder as the module
/// docs state it; a test holds it to that statement over thousands of fleets.
pub struct Ladder<'p> {
    params: &'p TtftParams,
    input_chars: u64,
    cap: u64,
    /// The best eligible prediction, the longest eligible match and the longest
    /// match of all.
    best: f64,
    longest_eligible: u64,
    longest: u64,
    scored: Vec<Scored>,
}

impl<'p> Ladder<'p> {
    /// A ladder for a request of `input_chars` over a fleet of `n` candidates
    /// holding `total_inflight` requests between them, given those it scores (all
    /// of them, or a sample: `super::sample`) in `list`, emptied first: a
    /// caller that scores every request keeps the list (`into_list`), which at
    /// 256 workers is a kilobyte.
    pub fn new(
        params: &'p TtftParams,
        input_chars: u64,
        (total_inflight, n): (u64, usize),
        mut list: Vec<Scored>,
    ) -> Self {
        list.clear();
        Ladder {
            params,
            input_chars,
            cap: load_cap(total_inflight, n, params.load_factor),
            best: f64::INFINITY,
            longest_eligible: 0,
            longest: 0,
            scored: list,
        }
    }

    /// The list the candidates were scored into, for the next ladder.
    pub fn into_list(self) -> Vec<Scored> {
        self.scored
    }

    /// Takes one candidate (its `inflight` counted in the total given to `new`).
    #[inline]
    pub fn push(&mut self, c: Scored) {
        self.longest = self.longest.max(c.cached_chars);
        if c.inflight < self.cap {
            self.best = least(self.best, c.cost_us);
            self.longest_eligible = self.longest_eligible.max(c.cached_chars);
        }
        self.scored.push(c);
    }

    /// Chooses where the request goes: its conversation's worker, else the holders
    /// of its prefix, else the fleet, each time the one with the fewest
    /// conversations among those the rung keeps (see the module docs).
    pub fn decide(&self, rng: &mut dyn Rng) -> Option<Decision> {
        let (p, input_chars, cap) = (self.params, self.input_chars, self.cap);
        let (best, longest, longest_eligible) = (self.best, self.longest, self.longest_eligible);
        let within_us = band_us(best, p.stay_factor);
        let near_us = band_us(best, 1.0 + p.load_factor);
        let margin = match_margin(input_chars);
        let holds = |cached: u64, longest: u64| {
            longest > margin && cached.saturating_add(margin) >= longest
        };
        // Each rung's least loaded. The holders' is taken before their bound on
        // conversations, which needs the fleet's fewest: the bound keeps a holder
        // only with fewer than it, and the least loaded holder has the fewest of
        // them, so the rung is empty exactly when that one is not under it.
        // The holders are those within the stay factor, above the cap on
        // requests or not (module docs): the longest match among them first.
        // The fleet rung keeps a near worker holding less than the longest match
        // among the near ones only while it is predicted no slower than the
        // soonest of those holding it that may take a conversation: the longest
        // near match and the fleet's fewest conversations (the near workers under
        // the cap), then that soonest.
        let near = |c: &Scored| c.inflight < cap && c.cost_us <= near_us;
        let (mut longest_within, mut longest_near, mut fewest) = (0, 0, None::<u64>);
        for c in &self.scored {
            if c.cost_us <= within_us {
                longest_within = longest_within.max(c.cached_chars);
            }
            if near(c) {
                longest_near = longest_near.max(c.cached_chars);
                fewest = Some(fewest.map_or(c.conversations, |f| f.min(c.conversations)));
            }
        }
        // No near worker under the cap: no fleet to balance against.
        let conversation_cap = conversation_cap(fewest.unwrap_or(0), p.load_factor);
        // The prefix's holders (rung 2), before the band around the soonest of
        // them, and in the same pass that soonest and the fleet rung's soonest
        // holder.
        let holder = |c: &Scored| {
            c.cost_us <= within_us
                && holds(c.cached_chars, longest_within)
                && c.cached_chars > input_chars.saturating_sub(c.cached_chars)
        };
        let (mut soonest_holder, mut soonest_holding) = (f64::INFINITY, f64::INFINITY);
        for c in &self.scored {
            if near(c) && holds(c.cached_chars, longest_near) && c.conversations < conversation_cap {
                soonest_holder = least(soonest_holder, c.cost_us);
            }
            if holder(c) {
                soonest_holding = least(soonest_holding, c.cost_us);
            }
        }
        let holding_us = band_us(soonest_holding, 1.0 + p.load_factor);
        let (mut continuing, mut holding, mut spread) =
            (Least::default(), Least::default(), Least::default());
        for c in &self.scored {
            if c.continues && c.cost_us <= within_us {
                continuing.offer(c);
            }
            if near(c) && (c.cost_us <= soonest_holder || holds(c.cached_chars, longest_near)) {
                spread.offer(c);
            }
            if holder(c) && c.cost_us <= holding_us {
                holding.offer(c);
            }
        }
        let rung = if continuing.fewest().is_some() {
            continuing
        } else if holding.fewest().is_some_and(|f| f < conversation_cap) {
            holding
        } else {
            spread
        };
        let winner = rung.pick(rng)?;
        let reason = if longest <= margin {
            Reason::TtftCold
        } else if holds(winner.cached_chars, longest) {
            Reason::TtftCache
        } else if holds(longest_eligible, longest) {
            // An eligible worker held the longest match.
            Reason::TtftSpread
        } else {
            Reason::TtftCapped
        };
        let mut d = decide(
            winner.worker,
            reason,
            winner.cached_chars as usize,
            GateAudit::default(),
        );
        d.predicted = Some(Prediction {
            ttft_us: winner.ttft_us.max(0.0).round() as u64,
            uncached_chars: input_chars.saturating_sub(winner.cached_chars),
            ahead_chars: winner.ahead_chars,
        });
        Some(d)
    }
}

/// A rung's least loaded, offered the rung's candidates one by one: the fewest
/// conversations first (the work a worker has taken on), then the least predicted
/// TTFT, near-ties at random. The near-ties of the least so far are kept in order,
/// and those the final least leaves out are dropped when it picks.
#[derive(Default)]
struct Least<'a> {
    /// The fewest conversations so far and the least prediction among them.
    top: Option<(u64, f64)>,
    tied: Vec<&'a Scored>,
}

impl<'a> Least<'a> {
    fn offer(&mut self, c: &'a Scored) {
        let low = match self.top {
            Some((fewest, _)) if c.conversations > fewest => return,
            Some((fewest, low)) if c.conversations == fewest => least(low, c.cost_us),
            // Fewer conversations than any so far: the ties start again.
            _ => {
                self.tied.clear();
                least(f64::INFINITY, c.cost_us)
            }
        };
        self.top = Some((c.conversations, low));
        if near_tie(c.cost_us, low) {
            self.tied.push(c);
        }
    }

    /// The fewest conversations offered (none offered: `None`).
    fn fewest(&self) -> Option<u64> {
        self.top.map(|(fewest, _)| fewest)
    }

    fn pick(mut self, rng: &mut dyn Rng) -> Option<&'a Scored> {
        let (_, low) = self.top?;
        self.tied.retain(|c| near_tie(c.cost_us, low));
        self.tied.get(rng.below(self.tied.len())).copied()
    }
}

fn near_tie(t: f64, low: f64) -> bool {
    t <= band_us(low, 1.0)
}

/// The most a candidate may cost to count as within `factor` times `low`, the
/// least: `factor * low` and the near-tie share of it.
fn band_us(low: f64, factor: f64) -> f64 {
    low * factor + low * NEAR_TIE_SHARE
}

/// `f64::min` for a minimum kept from `INFINITY` (a NaN never replaces it): the
/// same answer, without the call to `fmin` that `f64::min` compiles to in Wasm
/// (whose own `f64.min` treats NaN otherwise), once per candidate.
fn least(low: f64, t: f64) -> f64 {
    if t < low {
        t
    } else {
        low
    }
}

#[cfg(test)]
mod tests {
    use super::super::predict::testing::{cand, prefilling, P};
    use super::super::predict::{others_load, TtftCandidate};
    use super::*;
    use crate::decision::Label;
    use crate::load::WorkerWork;
    use crate::rng::SplitMix64;
    use crate::tree::TenantId;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The ladder over candidates scored as the router scores them.
    fn ladder(
        p: &TtftParams,
        input: u64,
        cands: &[TtftCandidate],
        rng: &mut dyn Rng,
    ) -> Option<Decision> {
        let total = cands.iter().map(|c| c.inflight).sum();
        // A list a previous request filled, as the router hands it over: a
        // worker outside the fleet holding all of the text, idle, which would win
        // every decision if `new` kept it.
        let stale = vec![cand(999, 0, input).scored(p, input); 3];
        let mut ladder = Ladder::new(p, input, (total, cands.len()), stale);
        for c in cands {
            ladder.push(c.scored(p, input));
        }
        let decision = ladder.decide(rng);
        assert_eq!(ladder.into_list().len(), cands.len());
        decision
    }

    fn run(input: u64, cands: &[TtftCandidate]) -> Decision {
        ladder(&P, input, cands, &mut SplitMix64(7)).unwrap()
    }

    #[test]
    fn stays_with_the_cache_while_it_is_worth_more_than_the_queue() {
        // w0 holds 3900 of 4000 chars with one request prefilling 100 chars ahead;
        // w1 is idle and holds nothing: 5 * 200 < 5 * 4000.
        let owner = prefilling(0, 3900, 100);
        let d = run(4000, &[owner, cand(1, 0, 0)]);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        assert_eq!(d.label(), Label::CacheHit);
        assert_eq!(d.matched_chars, 3900);
        assert_eq!(
            d.predicted,
            Some(Prediction {
                ttft_us: 1000,
                uncached_chars: 100,
                ahead_chars: 100
            })
        );
    }

    #[test]
    fn a_copy_that_evicts_from_a_full_cache_pays_for_what_it_evicts() {
        // A document of 8000 chars held by w0, behind 12,000 chars of prefill
        // queued there; w1 is idle and does not hold it: 5 * 8200 = 41,000 us
        // there against 5 * (12,000 + 200) = 61,000 us on w0.
        let owner = prefilling(0, 8000, 12_000);
        let copy = cand(1, 0, 0);
        let d = run(8200, &[owner, copy]);
        assert_eq!(d.worker, 1, "room everywhere: the queue decides");
        // w1's cache is full: taking the copy evicts 8000 chars of other texts,
        // which a later request prefills there again (5 * 8000 us more).
        let full = TtftCandidate {
            evicts_chars: 8000,
            ..copy
        };
        let d = run(8200, &[owner, full]);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        assert_eq!(
            d.predicted.map(|p| p.ttft_us),
            Some(5 * (12_000 + 200)),
            "the decision reports the prediction, not the eviction"
        );
    }

    #[test]
    fn moves_when_the_queue_costs_more_than_the_cache() {
        // w0's prefill queue (12000 chars ahead) outweighs re-prefilling 3900 chars on w1.
        let owner = prefilling(0, 3900, 12_000);
        let d = run(4000, &[owner, cand(1, 0, 0), cand(2, 0, 0)]);
        assert_ne!(d.worker, 0);
        assert_eq!(d.reason, Reason::TtftSpread);
        assert_eq!(d.label(), Label::CacheMiss);
        assert_eq!(d.predicted.unwrap().uncached_chars, 4000);
    }

    #[test]
    fn a_partial_holder_beats_a_cold_worker_when_loads_are_equal() {
        // The shared system prompt is on w1 (3000 chars), the conversation on w0
        // (3900); w0 busier by one request ahead than w1 is worth it only up to
        // the 900-char difference.
        let d = run(4000, &[cand(0, 0, 3900), cand(1, 0, 3000), cand(2, 0, 0)]);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        let busy = prefilling(0, 3900, 1000);
        let d = run(4000, &[busy, cand(1, 0, 3000), cand(2, 0, 0)]);
        assert_eq!((d.worker, d.reason), (1, Reason::TtftSpread));
        assert_eq!(d.matched_chars, 3000);
    }

    #[test]
    fn engine_load_from_other_routers_counts() {
        let mut owner = cand(0, 0, 3900);
        owner.others = 2; // 40 ms of others' work vs 4000 * 5 us = 20 ms
        let d = run(4000, &[owner, cand(1, 0, 0)]);
        assert_eq!((d.worker, d.reason), (1, Reason::TtftSpread));
        assert_eq!(others_load(5, 3), 2);
        assert_eq!(others_load(1, 3), 0, "never negative");
    }

    #[test]
    fn the_cap_is_bounded_load_consistent_hashing() {
        // Mean including this request: (7 + 1) / 4 = 2; 1.25 * 2 = 2.5 -> 3, + 1.
        assert_eq!(load_cap(7, 4, 0.25), 4);
        assert_eq!(
            load_cap(0, 4, 0.25),
            2,
            "an idle fleet: 1.25 * 0.25 -> 1, + 1"
        );
        assert_eq!(load_cap(31, 4, 0.25), 11);
        assert_eq!(load_cap(7, 4, 0.0), 3);
        assert_eq!(load_cap(0, 0, 0.25), 0);
    }

    #[test]
    fn a_holder_above_the_cap_keeps_the_prefix_while_its_cache_saves_more_than_its_queue_costs(
    ) {
        // 4 + 0 + 0 in flight: cap = ceil(1.25 * 5 / 3) + 1 = 4; w0 at 4 would go
        // to 5. Its four requests are prefilling fully cached texts: no work
        // ahead, so its prediction (0) beats a cold prefill of 4000 chars.
        let mut above = cand(0, 4, 4000);
        above.work.prefilling = 4;
        let d = run(4000, &[above, cand(1, 0, 0), cand(2, 0, 0)]);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        // The same four past their first byte: four service times ahead (80 ms)
        // against a 20 ms prefill, beyond the stay factor (1 here): too busy.
        let d = run(4000, &[cand(0, 4, 4000), cand(1, 0, 0), cand(2, 0, 0)]);
        assert_ne!(d.worker, 0);
        assert_eq!(d.reason, Reason::TtftCapped);
        // Within a stay factor of 4 it keeps the prefix, above the cap or not.
        let stay = TtftParams {
            stay_factor: 4.0,
            ..P
        };
        let c = [cand(0, 4, 4000), cand(1, 0, 0), cand(2, 0, 0)];
        let d = ladder(&stay, 4000, &c, &mut SplitMix64(7)).unwrap();
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
    }

    #[test]
    fn nobody_holding_anything_is_cold_and_spreads_near_ties_at_random() {
        let c = [cand(0, 0, 0), cand(1, 0, 0), cand(2, 0, 0), cand(3, 1, 0)];
        let mut rng = SplitMix64(3);
        let mut seen = [0; 4];
        for _ in 0..400 {
            let d = ladder(&P, 100, &c, &mut rng).unwrap();
            assert_eq!(d.reason, Reason::TtftCold);
            seen[d.worker as usize] += 1;
        }
        assert_eq!(seen[3], 0, "20 ms of service ahead is no tie");
        assert!(seen[..3].iter().all(|&n| n > 80), "ties spread: {seen:?}");
        // Within 2% is a tie, beyond it is not.
        let mut a = cand(0, 1, 0);
        a.work.prefilling = 1;
        a.work.ahead_chars = 1; // 5 us more than 0 + 100 chars * 5 = 500 us: 1%
        let mut seen = [0; 2];
        for _ in 0..200 {
            let d = ladder(&P, 100, &[a, cand(1, 0, 0)], &mut rng).unwrap();
            seen[d.worker as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 50), "1% apart is a tie: {seen:?}");
        a.work.ahead_chars = 20; // 4%
        for _ in 0..50 {
            let d = ladder(&P, 100, &[a, cand(1, 0, 0)], &mut rng).unwrap();
            assert_eq!(d.worker, 1);
        }
    }

    #[test]
    fn a_long_match_stays_within_the_stay_factor_and_moves_beyond_it() {
        let p = TtftParams {
            stay_factor: 2.0,
            ..P
        };
        // w0 holds the conversation (3900 of 4000): 5 us * (3000 ahead + 100)
        // = 15.5 ms; w1 holds the shared prompt (3000): 5 us * 1000 = 5 ms.
        let mut owner = prefilling(0, 3900, 3000);
        let others = [cand(1, 0, 3000), cand(2, 0, 0)];
        let pick = |o: TtftCandidate, p: &TtftParams| {
            let mut all = vec![o];
            all.extend(others);
            ladder(p, 4000, &all, &mut SplitMix64(5)).unwrap()
        };
        let d = pick(owner, &P);
        assert_eq!(
            (d.worker, d.reason),
            (1, Reason::TtftSpread),
            "3.1x with factor 1: moves"
        );
        owner.work.ahead_chars = 1900; // 10 ms: 2x the best, stays
        let d = pick(owner, &p);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        owner.work.ahead_chars = 2100; // 11 ms: beyond 2x (and the 2% tie), moves
        let d = pick(owner, &p);
        assert_eq!((d.worker, d.reason), (1, Reason::TtftSpread));
    }

    #[test]
    fn a_short_match_gets_no_stay() {
        // w0 holds 1000 of 4000 chars: its missing tail is longer than its match, so
        // it competes on prediction alone.
        let p = TtftParams {
            stay_factor: 100.0,
            ..P
        };
        let mut holder = prefilling(0, 1000, 2000);
        // w0: 5 * (2000 + 3000) = 25 ms; w1: 5 * 4000 = 20 ms.
        let d = ladder(&p, 4000, &[holder, cand(1, 0, 0)], &mut SplitMix64(5)).unwrap();
        assert_eq!((d.worker, d.reason), (1, Reason::TtftSpread));
        // Exactly half is not longer than the tail either.
        holder.cached_chars = 2000;
        holder.work.ahead_chars = 3000; // 25 ms again
        let d = ladder(&p, 4000, &[holder, cand(1, 0, 0)], &mut SplitMix64(5)).unwrap();
        assert_eq!(d.worker, 1);
        holder.cached_chars = 2001; // now it stays, 100x slack
        let d = ladder(&p, 4000, &[holder, cand(1, 0, 0)], &mut SplitMix64(5)).unwrap();
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
    }

    #[test]
    fn a_conversation_keeps_its_worker_above_the_cap_within_the_stay_factor() {
        // w0 holds the conversation and is over the cap (4 of 5 in flight, cap
        // ceil(1.25 * 6 / 3) + 1 = 4): a new request could not go there, its
        // conversation's next turn does. 5 us * (300 ahead + 100) = 2 ms; w1, holding
        // the shared prompt: 5 us * 1000 = 5 ms.
        let mut owner = cand(0, 4, 3900);
        owner.continues = true;
        owner.work = WorkerWork {
            prefilling: 4,
            ahead_chars: 300,
        };
        let mut prompt = cand(1, 1, 3000);
        prompt.work.prefilling = 1;
        let d = run(4000, &[owner, prompt, cand(2, 0, 0)]);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        // Without the continuation it is the holder of the longest match,
        // predicted the fastest: the cap on requests does not move it either.
        owner.continues = false;
        let d = run(4000, &[owner, prompt, cand(2, 0, 0)]);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        // Beyond stay_factor (1 here) of the best it moves: 5 us * 1200 = 6 ms.
        owner.continues = true;
        owner.work.ahead_chars = 1100;
        let d = run(4000, &[owner, prompt, cand(2, 0, 0)]);
        assert_eq!((d.worker, d.reason), (1, Reason::TtftCapped));
    }

    #[test]
    fn a_new_conversation_goes_to_the_holder_with_the_fewest_conversations_near_the_soonest() {
        let p = TtftParams {
            stay_factor: 2.0,
            ..P
        };
        // Both hold the prompt; w0 is a little faster (w1 1.2x) but has taken on
        // more conversations: the work still to come decides.
        let mut w0 = cand(0, 0, 3000);
        w0.conversations = 6;
        let mut w1 = cand(1, 1, 3000);
        w1.conversations = 5;
        w1.work.prefilling = 1;
        w1.work.ahead_chars = 200;
        let d = ladder(&p, 4000, &[w0, w1, cand(2, 0, 0)], &mut SplitMix64(1)).unwrap();
        assert_eq!((d.worker, d.reason), (1, Reason::TtftCache));
        // Not when it is predicted beyond 1 + load_factor of the soonest holder
        // (1.5x), though within stay_factor: among holders, balance costs a first
        // token no more than bounded load allows.
        w1.work.ahead_chars = 500;
        let d = ladder(&p, 4000, &[w0, w1, cand(2, 0, 0)], &mut SplitMix64(1)).unwrap();
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        // Nor beyond stay_factor of the fastest.
        w1.work.ahead_chars = 6000;
        let d = ladder(&p, 4000, &[w0, w1, cand(2, 0, 0)], &mut SplitMix64(1)).unwrap();
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        // Equal conversations: the faster.
        w1.conversations = 6;
        w1.work.ahead_chars = 200;
        let d = ladder(&p, 4000, &[w0, w1, cand(2, 0, 0)], &mut SplitMix64(1)).unwrap();
        assert_eq!(d.worker, 0);
    }

    #[test]
    fn the_conversation_cap_is_the_fleets_fewest_with_load_factor_and_two_of_slack() {
        assert_eq!(conversation_cap(0, 0.25), 2, "while an engine has none: two");
        assert_eq!(conversation_cap(1, 0.25), 4, "ceil(1.25) + 2");
        assert_eq!(conversation_cap(4, 0.25), 7);
        assert_eq!(conversation_cap(6, 0.25), 10, "ceil(7.5) + 2");
        assert_eq!(conversation_cap(6, 0.0), 8);
    }

    #[test]
    fn in_a_start_up_burst_a_holder_takes_its_prompts_second_conversation() {
        // w0 holds 1800 of the 2100 chars with that prefill still ahead of it: 5 us
        // * (1800 + 300) = 10.5 ms, as much as w1 prefilling all of it while idle.
        let mut holder = prefilling(0, 1800, 1800);
        holder.conversations = 1;
        let idle = cand(1, 0, 0);
        let d = ladder(&P, 2100, &[holder, idle], &mut SplitMix64(3)).unwrap();
        assert_eq!(
            (d.worker, d.reason),
            (0, Reason::TtftCache),
            "a second conversation stays with the prompt though w1 has none"
        );
        // A third does not: the prompt goes to w1.
        holder.conversations = 2;
        let d = ladder(&P, 2100, &[holder, idle], &mut SplitMix64(3)).unwrap();
        assert_eq!((d.worker, d.reason), (1, Reason::TtftSpread));
    }

    #[test]
    fn balance_never_trades_a_held_prompt_for_a_slower_first_token() {
        // A 6000-char turn whose history the tree forgot: w0 still holds its
        // 1500-char system prompt, w1 nothing and no conversation. Not a holder
        // (1500 < 4500 missing), so the fleet decides.
        let mut w0 = prefilling(0, 1500, 1000);
        w0.conversations = 1;
        let w1 = cand(1, 0, 0);
        // w0 5 us * (1000 + 4500) = 27.5 ms, w1 5 us * 6000 = 30 ms: both near, and
        // w1 has fewer conversations, but it is slower and holds less: w0.
        let d = run(6000, &[w0, w1]);
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
        // With more ahead of it w0 is the slower (32.5 ms): the fewest conversations.
        let mut busy = w0;
        busy.work.ahead_chars = 2000;
        let d = run(6000, &[busy, w1]);
        assert_eq!((d.worker, d.reason), (1, Reason::TtftSpread));
        // A holder at the cap on conversations (2 while w1 has none) is no
        // alternative, so it keeps nobody off w1.
        let mut full = w0;
        full.conversations = 2;
        let d = run(6000, &[full, w1]);
        assert_eq!((d.worker, d.reason), (1, Reason::TtftSpread));
    }

    #[test]
    fn holders_with_too_many_conversations_replicate_the_prefix() {
        // The prompt is on w0 and w1, with 9 conversations each and 1500 chars of
        // prefill ahead; w2 is idle, holds nothing and has 6 conversations.
        let p = TtftParams {
            stay_factor: 2.0,
            ..P
        };
        let holder = |w, conversations| {
            let mut h = prefilling(w, 3000, 1500);
            h.conversations = conversations;
            h
        };
        let (a, b) = (holder(0, 9), holder(1, 9));
        let mut c = cand(2, 0, 0);
        c.conversations = 6;
        // Holders 5 us * (1500 + 1000) = 12.5 ms, w2 5 us * 4000 = 20 ms: not near
        // (1.25x), so no alternative: the holders keep the prompt's conversations.
        let d = ladder(&p, 4000, &[a, b, c], &mut SplitMix64(1)).unwrap();
        assert_eq!(d.reason, Reason::TtftCache);
        assert_ne!(d.worker, 2);
        // A shorter prompt (2001 held: holders 17.5 ms) puts w2 near; the cap on
        // conversations is ceil(1.25 * 6) + 2 = 10, so a holder may not take an
        // eleventh, and the prompt is replicated on w2.
        let (mut a, mut b) = (a, b);
        a.cached_chars = 2001;
        b.cached_chars = 2001;
        (a.conversations, b.conversations) = (10, 10);
        let d = ladder(&p, 4000, &[a, b, c], &mut SplitMix64(1)).unwrap();
        assert_eq!((d.worker, d.reason), (2, Reason::TtftSpread));
        // With 9 a holder may take one more.
        a.conversations = 9;
        let d = ladder(&p, 4000, &[a, b, c], &mut SplitMix64(1)).unwrap();
        assert_eq!((d.worker, d.reason), (0, Reason::TtftCache));
    }

    #[test]
    fn a_few_chars_more_of_a_match_are_no_preference() {
        // 2% of 4000 = 80 chars: w0's 3050 and w1's 3000 are the same match.
        let p = TtftParams {
            stay_factor: 2.0,
            ..P
        };
        let mut w0 = cand(0, 0, 3050);
        w0.conversations = 3;
        let w1 = cand(1, 0, 3000);
        let d = ladder(&p, 4000, &[w0, w1], &mut SplitMix64(1)).unwrap();
        assert_eq!((d.worker, d.reason), (1, Reason::TtftCache));
        // A match no longer than the margin is no match.
        let d = ladder(
            &P,
            4000,
            &[cand(0, 0, 80), cand(1, 0, 0)],
            &mut SplitMix64(1),
        )
        .unwrap();
        assert_eq!(d.reason, Reason::TtftCold);
    }

    /// The ladder as the module docs state it, rung by rung and aggregate by
    /// aggregate, each a pass of its own: what the ladder's one pass must agree
    /// with.
    fn stated<'a>(
        p: &TtftParams,
        input: u64,
        cands: &'a [TtftCandidate],
        rng: &mut dyn Rng,
    ) -> Option<(&'a TtftCandidate, Reason)> {
        let total = cands.iter().map(|c| c.inflight).sum();
        let cap = load_cap(total, cands.len(), p.load_factor);
        let eligible = |c: &TtftCandidate| c.inflight < cap;
        let t = |c: &TtftCandidate| c.scored(p, input).cost_us;
        let best = cands
            .iter()
            .filter(|c| eligible(c))
            .map(t)
            .fold(f64::INFINITY, f64::min);
        let within = |c: &TtftCandidate| t(c) <= best * p.stay_factor + best * NEAR_TIE_SHARE;
        let near = |c: &TtftCandidate| t(c) <= best * (1.0 + p.load_factor) + best * NEAR_TIE_SHARE;
        let margin = (input as f64 * NEAR_TIE_SHARE) as u64;
        let holds = |c: &TtftCandidate, l: u64| l > margin && c.cached_chars + margin >= l;
        let longest = cands.iter().map(|c| c.cached_chars).max().unwrap_or(0);
        let longest_within = cands
            .iter()
            .filter(|c| within(c))
            .map(|c| c.cached_chars)
            .max()
            .unwrap_or(0);
        let fewest = cands
            .iter()
            .filter(|c| eligible(c) && near(c))
            .map(|c| c.conversations)
            .min()
            .unwrap_or(0);
        let longest_near = cands
            .iter()
            .filter(|c| eligible(c) && near(c))
            .map(|c| c.cached_chars)
            .max()
            .unwrap_or(0);
        let conversation_cap = ((1.0 + p.load_factor) * fewest as f64).ceil() as u64 + 2;
        let soonest_holder = cands
            .iter()
            .filter(|c| {
                eligible(c)
                    && near(c)
                    && holds(c, longest_near)
                    && c.conversations < conversation_cap
            })
            .map(t)
            .fold(f64::INFINITY, f64::min);
        let holder = |c: &TtftCandidate| {
            within(c)
                && holds(c, longest_within)
                && c.cached_chars > input.saturating_sub(c.cached_chars)
        };
        let soonest_holding = cands
            .iter()
            .filter(|c| holder(c))
            .map(t)
            .fold(f64::INFINITY, f64::min);
        let rungs: [&dyn Fn(&TtftCandidate) -> bool; 3] = [
            &|c| c.continues && within(c),
            &|c| {
                holder(c)
                    && t(c)
                        <= soonest_holding * (1.0 + p.load_factor)
                            + soonest_holding * NEAR_TIE_SHARE
                    && c.conversations < conversation_cap
            },
            &|c| eligible(c) && near(c) && (holds(c, longest_near) || t(c) <= soonest_holder),
        ];
        let group: Vec<&TtftCandidate> = rungs
            .iter()
            .map(|rung| cands.iter().filter(|c| rung(c)).collect::<Vec<_>>())
            .find(|g| !g.is_empty())?;
        let fewest_in = group.iter().map(|c| c.conversations).min()?;
        let least = group
            .iter()
            .filter(|c| c.conversations == fewest_in)
            .map(|c| t(c))
            .fold(f64::INFINITY, f64::min);
        let tied: Vec<&&TtftCandidate> = group
            .iter()
            .filter(|c| c.conversations == fewest_in && t(c) <= least + least * NEAR_TIE_SHARE)
            .collect();
        let winner = **tied.get(rng.below(tied.len()))?;
        let reason = if longest <= margin {
            Reason::TtftCold
        } else if holds(winner, longest) {
            Reason::TtftCache
        } else if cands.iter().any(|c| holds(c, longest) && eligible(c)) {
            Reason::TtftSpread
        } else {
            Reason::TtftCapped
        };
        Some((winner, reason))
    }

    #[test]
    fn the_ladder_decides_as_it_is_stated() {
        let mut gen = SplitMix64(11);
        let mut pick = |n: u64| gen.next_u64() % n;
        let mut reasons_seen = Vec::new();
        for round in 0..4000 {
            let n = 1 + pick(12) as usize;
            let input = 1 + pick(5000);
            let params = TtftParams {
                load_factor: [0.0, 0.25, 1.0][pick(3) as usize],
                stay_factor: [1.0, 4.0][pick(2) as usize],
                ..P
            };
            // Few distinct values, so ties, caps and shared depths are common; the
            // last two depths sit on either side of the 2% margin below a whole
            // match.
            let margin = (input as f64 * NEAR_TIE_SHARE) as u64;
            let depths = [
                0,
                input / 2,
                input,
                input - margin,
                input.saturating_sub(margin + 1),
            ];
            let cands: Vec<TtftCandidate> = (0..n)
                .map(|w| {
                    let mut c = cand(w as TenantId, pick(4), depths[pick(5) as usize]);
                    c.continues = pick(5) == 0;
                    c.conversations = pick(3);
                    c.others = pick(2);
                    c.work = WorkerWork {
                        prefilling: pick(2).min(c.inflight),
                        ahead_chars: pick(2) * 500,
                    };
                    if pick(3) == 0 {
                        c.costs.prefill_us_per_char = Some(1.0 + pick(8) as f64);
                    }
                    if pick(4) == 0 {
                        c.evicts_chars = input.saturating_sub(c.cached_chars) / (1 + pick(2));
                    }
                    c
                })
                .collect();
            let seed = pick(u64::MAX);
            let fused = ladder(&params, input, &cands, &mut SplitMix64(seed));
            let plain = stated(&params, input, &cands, &mut SplitMix64(seed));
            let what = format!("round {round}: {cands:?} input {input} {params:?}");
            assert_eq!(
                fused.as_ref().map(|d| (d.worker, d.reason)),
                plain.map(|(w, r)| (w.worker, r)),
                "{what}"
            );
            if let (Some(d), Some((w, _))) = (&fused, plain) {
                let predicted = Prediction {
                    ttft_us: w.predict_us(&params, input).round() as u64,
                    uncached_chars: input.saturating_sub(w.cached_chars),
                    ahead_chars: w.wait().0.round() as u64,
                };
                assert_eq!(d.predicted, Some(predicted), "{what}");
                assert_eq!(d.matched_chars, w.cached_chars as usize, "{what}");
            }
            let reason = fused.map(|d| d.reason);
            if !reasons_seen.contains(&reason) {
                reasons_seen.push(reason);
            }
        }
        assert_eq!(
            reasons_seen.len(),
            4,
            "every reason was exercised: {reasons_seen:?}"
        );
    }

    #[test]
    fn no_candidate_no_decision() {
        assert!(ladder(&P, 10, &[], &mut SplitMix64(1)).is_none());
    }

}
