//! The `cache_aware` policy: SGLang model gateway's (SMG 1.13) prefix affinity with
//! its spill gate, plus the queue gate and saturation pin of the newer SGLang
//! router. It reads as rungs:
//! 1. prefix: if the match rate is strictly above `cache_threshold`, the owners at the
//!    deepest matched node that are candidates are the cache candidates;
//! 2. queue gate (`worker_queue_limit`): an owner is admitted if it has no fresh
//!    engine sample (fail open: unknown is not full) or `num_waiting < limit` (strict:
//!    a worker at the limit already makes requests wait). Among admitted owners the
//!    least pressure wins (fresh engine load `waiting + running`, else in-flight),
//!    then the lowest worker id: `cache_hit`;
//! 3. spill gate: a `cache_hit` whose owner has more in flight than the candidates'
//!    mean plus `min(balance_abs_threshold, max(4, 2 * sqrt(mean)))` AND more than
//!    `balance_rel_threshold` times the mean goes to the least in-flight candidate
//!    instead (ties random): `imbalanced` (`spills`);
//! 4. every owner rejected by the gate:
//!    - saturation pin (`saturation_queue_floor`): if no candidate has a fresh sample
//!      with `num_waiting < floor` (no sample is no proof of idleness: fail closed),
//!      diverting buys nothing, so pin to the least-pressure owner (`all_queued`);
//!    - without a floor, if every candidate has a fresh sample at or above the limit,
//!      waiting is waiting everywhere: stay with the owners (`all_queued`);
//!    - else divert to the least-pressure candidate the gate admits
//!      (`cache_worker_queued`), abandoning the matched prefix;
//! 5. otherwise least in-flight (ties random): `cache_miss`.
//!
//! With `kv_match` (the engines' held blocks for every candidate, from the
//! collector), rung 1 reads the engines first:
//! - their match above `cache_threshold` (held tokens over the prompt's) makes the
//!   engines holding the most blocks the owners: what is cached now, wherever it
//!   came from;
//! - else a tree hit is a record the cache outlived: the conversation goes to the
//!   least loaded of the engines holding the most of it (ties random), or stays
//!   with the tree's owners where no engine holds a block;
//! - else the tree's miss stands.
//!
//! With `kv_capacity_bound` (`keep_start`), a miss whose start (`KEPT_START_CHARS`
//! or more) some candidates' trees hold goes to the least loaded of those, ties
//! random: the bound forgets a conversation's tail, not where its start lives.
//!
//! The routing text is recorded under the chosen worker whatever the rung; a body
//! without one goes to the least loaded (`super::unreadable`).

use super::{
    decide, least_by, least_loaded, least_pressure, unreadable, Ask, Chosen, Engines, EnginesUse,
    Held, Select,
};
use crate::config::{
    Config, DEFAULT_BALANCE_ABS_THRESHOLD, DEFAULT_BALANCE_REL_THRESHOLD, DEFAULT_CACHE_THRESHOLD,
};
use crate::decision::{Decision, GateAudit, Reason};
use crate::load::Candidate;
use crate::rng::{Drawn, Rng};
use crate::tree::{char_len, PrefixMatch, TenantId};

/// The last decision's prefix match, kept so that its owners' list is refilled
/// rather than allocated on every request.
#[derive(Debug, Default)]
pub struct CacheAware {
    found: PrefixMatch,
    /// `kv_match`: the engines' match, beside the tree's.
    engines: PrefixMatch,
}

impl Select for CacheAware {
    type Params = CacheAwareParams;

    fn params(cfg: &Config) -> CacheAwareParams {
        CacheAwareParams {
            cache_threshold: cfg.cache_threshold.unwrap_or(DEFAULT_CACHE_THRESHOLD),
            balance_abs_threshold: cfg
                .balance_abs_threshold
                .unwrap_or(DEFAULT_BALANCE_ABS_THRESHOLD),
            balance_rel_threshold: cfg
                .balance_rel_threshold
                .unwrap_or(DEFAULT_BALANCE_REL_THRESHOLD),
            worker_queue_limit: cfg.worker_queue_limit,
            saturation_queue_floor: cfg.saturation_queue_floor,
            keep_start: cfg.kv_capacity_bound == Some(true),
        }
    }

    fn select(&mut self, params: &CacheAwareParams, ask: &Ask<'_>, rng: &mut dyn Rng) -> Chosen {
        let Some(text) = ask.text else {
            return Chosen::only(unreadable(ask.candidates, rng));
        };
        let tree = ask.tree;
        let engines = ask.engines_for_all();
        let candidates = ask.candidates;
        let threshold = params.cache_threshold;
        // Drawn only where the engines answered or the bound keeps starts: the tree
        // alone decides as SMG's.
        let keep_start = params.keep_start;
        let pick = if engines.is_some() || keep_start {
            rng.next_u64()
        } else {
            0
        };
        let text_chars = char_len(text);
        let (mut walked, mut source) = (None, Source::Tree);
        let hit = 'matched: {
            if let Some(e) = engines {
                engine_match(e, candidates, text_chars, &mut self.engines);
                if self.engines.match_rate() > threshold {
                    source = Source::Engines;
                    break 'matched true;
                }
            }
            match tree {
                Some(t) => walked = Some(t.prefix_walk_into(text, &mut self.found)),
                None => self.found.refill(0, text_chars, []),
            }
            let tree_hit = self.found.match_rate() > threshold;
            if engines.is_some() && tree_hit && rehome(candidates, &mut self.engines, pick) {
                source = Source::Engines;
                break 'matched true;
            }
            if keep_start
                && !tree_hit
                && self.found.matched_chars >= KEPT_START_CHARS
                && rehome(candidates, &mut self.found, pick)
            {
                break 'matched true;
            }
            tree_hit
        };
        let matched = match source {
            Source::Tree => &self.found,
            Source::Engines => &self.engines,
        };
        let decision = cache_aware_by(params, candidates, (matched, hit), rng);
        let text_chars = matched.input_chars;
        // An owner of the match holds all of it; anyone else, what its engine says,
        // or a walk of its own.
        let held_chars = decision.as_ref().map_or(0, |d| match engines {
            _ if matched.owners.binary_search(&d.worker).is_ok() => matched.matched_chars,
            Some(e) => e
                .answer
                .chars_of(e.held_by(d.worker).unwrap_or(0), text_chars),
            None => tree.map_or(0, |t| t.tenant_depth(text, d.worker)),
        });
        // Only a miss can hide a filtered owner: any other reason followed an owner
        // that was a candidate (a spill one that was).
        let owner_overloaded = !ask.flagged.is_empty()
            && decision
                .as_ref()
                .is_some_and(|d| d.reason == Reason::CacheMiss)
            && owners_filtered(params.cache_threshold, matched, ask.candidates, ask.flagged);
        Chosen {
            decision,
            record: Some(Held {
                held_chars,
                text_chars,
            }),
            walked,
            owner_overloaded,
            engines: match (ask.engines, engines, source) {
                (None, _, _) => EnginesUse::None,
                (Some(_), None, _) => EnginesUse::Partial,
                (_, Some(_), Source::Tree) => EnginesUse::Deferred,
                (_, Some(_), Source::Engines) => EnginesUse::Ranked,
            },
        }
    }
}

/// The shortest start a `keep_start` miss follows: an engine block's worth of
/// chars (16 tokens at 4 chars a token), more than any two prompts share by chance.
const KEPT_START_CHARS: usize = 64;

/// Whose match a decision followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Source {
    Tree,
    Engines,
}

/// The engines' match as the tree's would read: the candidates holding the most
/// leading blocks own it (none when no candidate holds a block), its length in the
/// prompt's chars. Every candidate's count is known (`CacheAware::select`).
fn engine_match(
    engines: Engines<'_>,
    candidates: &[Candidate],
    text_chars: usize,
    found: &mut PrefixMatch,
) {
    let held = |c: &Candidate| engines.held_by(c.worker).unwrap_or(0);
    let most = candidates.iter().map(held).max().unwrap_or(0);
    let owners = candidates
        .iter()
        .filter(|c| most > 0 && held(c) == most)
        .map(|c| c.worker);
    found.refill(engines.answer.chars_of(most, text_chars), text_chars, owners);
}

/// A tree hit the engines do not bear out (they hold less than the threshold of
/// the prompt, where the tree recorded more): the record outlived the cache. The
/// conversation goes where the most of it is still held (at least its shared
/// start, so a move costs nothing the stay would have saved), to the least loaded
/// such worker, ties by `pick`; the stay is no better, and an engine that evicted
/// it will again. Rewrites `engines` to name that one worker; `false` when no
/// engine holds a block (then the tree's record stands).
fn rehome(candidates: &[Candidate], engines: &mut PrefixMatch, pick: u64) -> bool {
    let holders: Vec<Candidate> = candidates
        .iter()
        .filter(|c| engines.owners.binary_search(&c.worker).is_ok())
        .copied()
        .collect();
    let Some(home) = least_by(&holders, Candidate::pressure, &mut Drawn(pick)) else {
        return false;
    };
    engines.owners.clear();
    engines.owners.push(home);
    true
}

/// Whether `found` has owners above the cache threshold, none of them a candidate
/// and some of them flagged.
fn owners_filtered(
    cache_threshold: f64,
    found: &PrefixMatch,
    candidates: &[Candidate],
    flagged: &[TenantId],
) -> bool {
    found.match_rate() > cache_threshold
        && found.owners.iter().any(|o| flagged.contains(o))
        && owning(candidates, &found.owners).is_empty()
}

/// SMG 1.13's spill gate: whether an owner with `load` requests in flight is
/// skipped for the least loaded candidate, the candidates holding `mean` on
/// average. It must exceed the mean by more than the margin AND be more than
/// `rel_threshold` times it: a small absolute excess on a busy fleet is noise, and
/// a large ratio on an idle one is too. The margin is `abs_threshold` capped at the
/// natural swing of an in-flight count at that mean (two standard deviations of a
/// Poisson count, `2 * sqrt(mean)`, at least 4): with the absolute default of 64
/// alone, a fleet with fewer requests in flight than that could never spill, and
/// one hot prefix took all of them to one engine.
pub fn spills(load: u64, mean: f64, abs_threshold: u64, rel_threshold: f64) -> bool {
    let load = load as f64;
    load - mean > spill_margin(mean, abs_threshold) && load > rel_threshold * mean
}

/// The spill gate's absolute margin at a fleet mean of `mean` in flight.
pub fn spill_margin(mean: f64, abs_threshold: u64) -> f64 {
    (abs_threshold as f64).min((2.0 * mean.sqrt()).max(4.0))
}

/// The candidates' mean in-flight count (0 for none).
fn mean_inflight(candidates: &[Candidate]) -> f64 {
    if candidates.is_empty() {
        return 0.0;
    }
    let total: u64 = candidates.iter().map(|c| c.inflight).sum();
    total as f64 / candidates.len() as f64
}

/// The queue gate's one rule. Fails open: without a fresh sample the router cannot
/// tell running from waiting, and unknown is not full.
pub fn queue_gate_admits(c: &Candidate, limit: Option<u64>) -> bool {
    match (limit, c.engine) {
        (Some(limit), Some(q)) => q.waiting < limit,
        _ => true,
    }
}

/// Whether the whole fleet is provably queued: the limit is set, the fleet is not
/// empty, and every worker has a fresh sample at or above it. Unknown is not full.
pub fn fleet_all_queued(fleet: &[Candidate], limit: Option<u64>) -> bool {
    let Some(limit) = limit else {
        return false;
    };
    !fleet.is_empty()
        && fleet
            .iter()
            .all(|c| c.engine.is_some_and(|q| q.waiting >= limit))
}

/// Whether some worker is provably less queued than `floor`. Fails closed, the
/// opposite polarity to the gate: the pin asks for proof of a better destination,
/// and a missing sample proves nothing.
pub fn any_fresh_queue_below(fleet: &[Candidate], floor: u64) -> bool {
    fleet
        .iter()
        .any(|c| c.engine.is_some_and(|q| q.waiting < floor))
}

/// Tuning of the `cache_aware` rungs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheAwareParams {
    pub cache_threshold: f64,
    pub balance_abs_threshold: u64,
    pub balance_rel_threshold: f64,
    pub worker_queue_limit: Option<u64>,
    pub saturation_queue_floor: Option<u64>,
    /// `kv_capacity_bound`: a miss whose start some candidates still hold goes to
    /// the least loaded of them (the bound forgot the conversation's tail, not
    /// where its start lives).
    pub keep_start: bool,
}

/// The `cache_aware` ladder for the prefix match `found`, a hit above the threshold.
/// `candidates` come in worker order, as `crate::request::candidates` screens them: the
/// match's owners are looked up in them.
pub fn cache_aware(
    params: &CacheAwareParams,
    candidates: &[Candidate],
    found: &PrefixMatch,
    rng: &mut dyn Rng,
) -> Option<Decision> {
    let hit = found.match_rate() > params.cache_threshold;
    cache_aware_by(params, candidates, (found, hit), rng)
}

/// The ladder with the prefix rung's verdict given: a match and whether its owners
/// are a hit (the tree's by the threshold; `kv_match`'s by what the engines hold,
/// `CacheAware::select`).
fn cache_aware_by(
    params: &CacheAwareParams,
    candidates: &[Candidate],
    (found, hit): (&PrefixMatch, bool),
    rng: &mut dyn Rng,
) -> Option<Decision> {
    let none = GateAudit::default();
    let matched = found.matched_chars;
    if hit {
        let owners = owning(candidates, &found.owners);
        if !owners.is_empty() {
            let d = gated_owner_choice(params, candidates, &owners, matched, rng);
            // Only a plain hit spills: a diverted request already went least
            // pressure, and a pinned one stays because diverting buys nothing.
            let load = owners.iter().find(|c| c.worker == d.worker).map(|c| c.inflight);
            let spill = d.reason == Reason::CacheHit
                && load.is_some_and(|load| {
                    spills(
                        load,
                        mean_inflight(candidates),
                        params.balance_abs_threshold,
                        params.balance_rel_threshold,
                    )
                });
            if spill {
                return least_loaded(candidates, rng)
                    .map(|w| decide(w, Reason::Imbalanced, matched, d.gate));
            }
            return Some(d);
        }
    }
    least_loaded(candidates, rng).map(|w| decide(w, Reason::CacheMiss, matched, none))
}

/// The candidates among `owners`, in worker order (also the test of whether a
/// match's owners were all screened out). Both lists are sorted by worker
/// (`PrefixMatch` sorts its owners), so the smaller is searched for in the larger: a
/// conversation has one owner among hundreds of candidates, a shared system prompt
/// hundreds of owners.
fn owning<'c>(candidates: &'c [Candidate], owners: &[TenantId]) -> Owning<'c> {
    if owners.len() < candidates.len() {
        owners
            .iter()
            .filter_map(|o| {
                let at = candidates.binary_search_by_key(o, |c| c.worker).ok()?;
                candidates.get(at)
            })
            .collect()
    } else {
        candidates
            .iter()
            .filter(|c| owners.binary_search(&c.worker).is_ok())
            .collect()
    }
}

/// The candidates among a match's owners (`owning`): a conversation's one owner is
/// held in place, and a list is made only for a second, so the request that follows
/// its own conversation allocates nothing here.
pub(crate) enum Owning<'c> {
    One([&'c Candidate; 1]),
    List(Vec<&'c Candidate>),
}

impl<'c> std::ops::Deref for Owning<'c> {
    type Target = [&'c Candidate];

    fn deref(&self) -> &Self::Target {
        match self {
            Owning::One(one) => one,
            Owning::List(list) => list,
        }
    }
}

impl<'c> FromIterator<&'c Candidate> for Owning<'c> {
    fn from_iter<I: IntoIterator<Item = &'c Candidate>>(iter: I) -> Self {
        let mut iter = iter.into_iter();
        let Some(first) = iter.next() else {
            return Owning::List(Vec::new());
        };
        match iter.next() {
            None => Owning::One([first]),
            Some(second) => Owning::List([first, second].into_iter().chain(iter).collect()),
        }
    }
}

/// Rungs 3 and 4 for a non-empty set of owners.
fn gated_owner_choice(
    params: &CacheAwareParams,
    fleet: &[Candidate],
    owners: &[&Candidate],
    matched: usize,
    rng: &mut dyn Rng,
) -> Decision {
    let limit = params.worker_queue_limit;
    // The owners the gate admits (`true`) or rejects (`false`), walked where needed
    // rather than collected: a conversation has one owner, and every request passes
    // here.
    let gated = |admits: bool| {
        owners
            .iter()
            .copied()
            .filter(move |c| queue_gate_admits(c, limit) == admits)
    };
    let gate = GateAudit {
        rejected: gated(false).count() as u32,
        unsampled: if limit.is_some() {
            gated(true).filter(|c| c.engine.is_none()).count() as u32
        } else {
            0
        },
    };
    if let Some(w) = least_pressure(gated(true)) {
        return decide(w, Reason::CacheHit, matched, gate);
    }
    // Every owner is queued. Non-empty owners make `least_pressure` total below.
    let pin_owner = least_pressure(gated(false)).unwrap_or_default();
    match params.saturation_queue_floor {
        Some(floor) if !any_fresh_queue_below(fleet, floor) => {
            return decide(pin_owner, Reason::SaturationPin, matched, gate);
        }
        None if fleet_all_queued(fleet, limit) => {
            return decide(pin_owner, Reason::AllQueued, matched, gate);
        }
        _ => {}
    }
    let open: Vec<Candidate> = fleet
        .iter()
        .copied()
        .filter(|c| queue_gate_admits(c, limit))
        .collect();
    match least_by(&open, Candidate::pressure, rng) {
        Some(w) => decide(w, Reason::CacheWorkerQueued, matched, gate),
        // Unreachable while the floor is at most the limit; stay with the owner.
        None => decide(pin_owner, Reason::AllQueued, matched, gate),
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{c, cands};
    use super::*;
    use crate::decision::Label;
    use crate::rng::SplitMix64;
    use crate::tree::TenantId;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const SMG: CacheAwareParams = CacheAwareParams {
        cache_threshold: 0.3,
        balance_abs_threshold: 64,
        balance_rel_threshold: 1.5,
        worker_queue_limit: None,
        saturation_queue_floor: None,
        keep_start: false,
    };

    fn matched(matched_chars: usize, input_chars: usize, owners: Vec<TenantId>) -> PrefixMatch {
        PrefixMatch {
            matched_chars,
            input_chars,
            owners,
        }
    }

    #[test]
    fn no_candidates_no_decision() {
        let mut rng = SplitMix64(1);
        let none = matched(0, 1, vec![]);
        assert!(cache_aware(&SMG, &[], &none, &mut rng).is_none());
    }

    #[test]
    fn spill_margin_is_the_absolute_threshold_capped_at_the_natural_swing() {
        // At a mean of 4 the swing is 2 * 2 = 4; at 25, 10; at 2500, 100.
        assert_eq!(spill_margin(4.0, 64), 4.0);
        assert_eq!(spill_margin(25.0, 64), 10.0);
        assert_eq!(spill_margin(2500.0, 64), 64.0, "capped by the threshold");
        assert_eq!(spill_margin(0.0, 64), 4.0, "never under four...");
        assert_eq!(spill_margin(0.0, 2), 2.0, "...unless the threshold is");
    }

    #[test]
    fn spill_needs_both_the_margin_and_the_ratio() {
        // SMG 1.13's defaults (abs 64, rel 1.5) at a mean of 25: margin 10.
        assert!(!spills(35, 25.0, 64, 1.5), "exactly the margin over");
        assert!(
            !spills(36, 25.0, 64, 1.5),
            "over the margin, but 36 < 1.5 * 25"
        );
        assert!(!spills(37, 25.0, 64, 1.5), "37.5 is the ratio's bound");
        assert!(spills(38, 25.0, 64, 1.5));
        // An idle fleet: the ratio alone is not enough.
        assert!(!spills(3, 1.0, 64, 1.5), "3 > 1.5 but only 2 over");
        assert!(spills(6, 1.0, 64, 1.5), "5 over the margin of 4");
        // A busy fleet: the margin is the threshold.
        assert!(!spills(3064, 3000.0, 64, 1.0));
        assert!(spills(3065, 3000.0, 64, 1.0));
    }

    #[test]
    fn a_hot_owner_spills_to_the_least_loaded_and_a_miss_never_spills() {
        let mut rng = SplitMix64(1);
        // Mean 8, margin max(4, 5.66) = 5.66, ratio bound 12: 20 spills.
        let fleet = cands(&[20, 4, 6, 2]);
        let hit = matched(90, 100, vec![0]);
        let d = cache_aware(&SMG, &fleet, &hit, &mut rng).unwrap();
        assert_eq!((d.worker, d.reason), (3, Reason::Imbalanced));
        assert_eq!(d.matched_chars, 90, "the match it gave up is reported");
        // At 10 (4 over a mean of 6, with a margin of 4.9) it stays.
        let fleet = cands(&[10, 4, 6, 4]);
        let d = cache_aware(&SMG, &fleet, &hit, &mut rng).unwrap();
        assert_eq!((d.worker, d.reason), (0, Reason::CacheHit));
        // A miss goes least loaded whatever the loads.
        let miss = matched(10, 100, vec![0]);
        let d = cache_aware(&SMG, &cands(&[20, 4, 6, 2]), &miss, &mut rng).unwrap();
        assert_eq!((d.worker, d.reason), (3, Reason::CacheMiss));
        // Another owner under the gate is not spilled: the least loaded owner
        // takes it.
        let shared = matched(90, 100, vec![0, 2]);
        let d = cache_aware(&SMG, &cands(&[20, 4, 6, 2]), &shared, &mut rng).unwrap();
        assert_eq!((d.worker, d.reason), (2, Reason::CacheHit));
    }

    #[test]
    fn match_rate_must_be_strictly_above_threshold() {
        let mut rng = SplitMix64(1);
        let c = cands(&[0, 0, 5]);
        let (at_threshold, above_it) = (matched(3, 10, vec![2]), matched(31, 100, vec![2]));
        let at = cache_aware(&SMG, &c, &at_threshold, &mut rng).unwrap();
        assert_eq!(at.reason, Reason::CacheMiss, "0.3 is not > 0.3");
        assert_ne!(
            at.worker, 2,
            "miss goes least-load, worker 2 is the busiest"
        );
        let above = cache_aware(&SMG, &c, &above_it, &mut rng).unwrap();
        assert_eq!((above.worker, above.reason), (2, Reason::CacheHit));
        assert_eq!(above.matched_chars, 31);
    }

    #[test]
    fn hit_prefers_least_loaded_owner_then_lowest_id() {
        let mut rng = SplitMix64(1);
        let c = cands(&[3, 1, 1, 0]);
        let m = matched(10, 10, vec![0, 1, 2]);
        let d = cache_aware(&SMG, &c, &m, &mut rng).unwrap();
        assert_eq!(d.worker, 1, "owners 1 and 2 tie at 1 in flight: lower id");
    }

    #[test]
    fn owner_that_is_not_a_candidate_is_a_miss() {
        let mut rng = SplitMix64(1);
        let c = cands(&[0, 0]);
        let m = matched(10, 10, vec![7]);
        let d = cache_aware(&SMG, &c, &m, &mut rng).unwrap();
        assert_eq!(d.reason, Reason::CacheMiss);
    }

    fn gated(limit: Option<u64>, floor: Option<u64>) -> CacheAwareParams {
        CacheAwareParams {
            worker_queue_limit: limit,
            saturation_queue_floor: floor,
            ..SMG
        }
    }

    /// Full match owned by `owners`.
    fn run(params: CacheAwareParams, fleet: &[Candidate], owners: &[TenantId]) -> Decision {
        let mut rng = SplitMix64(3);
        let m = matched(100, 100, owners.to_vec());
        cache_aware(&params, fleet, &m, &mut rng).expect("a non-empty fleet always decides")
    }

    #[test]
    fn gate_boundary_is_strict_and_fails_open() {
        assert!(
            queue_gate_admits(&c(0, 0, Some((99, 0))), None),
            "no limit, no gate"
        );
        assert!(
            queue_gate_admits(&c(0, 0, None), Some(4)),
            "no sample: unknown is not full"
        );
        assert!(queue_gate_admits(&c(0, 0, Some((3, 9))), Some(4)));
        assert!(
            !queue_gate_admits(&c(0, 0, Some((4, 0))), Some(4)),
            "at the limit it already queues"
        );
        assert!(!queue_gate_admits(&c(0, 0, Some((5, 0))), Some(4)));
    }

    #[test]
    fn fleet_all_queued_needs_proof_from_every_worker() {
        let q = |w| c(w, 0, Some((4, 1)));
        assert!(!fleet_all_queued(&[q(0), q(1)], None), "no limit");
        assert!(!fleet_all_queued(&[], Some(4)), "empty fleet");
        assert!(fleet_all_queued(&[q(0), q(1)], Some(4)));
        assert!(
            !fleet_all_queued(&[q(0), c(1, 0, None)], Some(4)),
            "a missing sample is not full"
        );
        assert!(!fleet_all_queued(&[q(0), c(1, 0, Some((3, 0)))], Some(4)));
    }

    #[test]
    fn saturation_proof_fails_closed() {
        assert!(
            !any_fresh_queue_below(&[c(0, 0, None), c(1, 0, None)], 2),
            "no sample proves nothing"
        );
        assert!(any_fresh_queue_below(
            &[c(0, 0, None), c(1, 0, Some((1, 0)))],
            2
        ));
        assert!(
            !any_fresh_queue_below(&[c(1, 0, Some((2, 0)))], 2),
            "at the floor is not below"
        );
        assert!(!any_fresh_queue_below(&[], 1));
    }

    #[test]
    fn admitted_owners_are_a_hit_by_pressure_then_id() {
        let fleet = [
            c(0, 0, Some((1, 5))),
            c(1, 5, Some((0, 2))),
            c(2, 0, Some((0, 2))),
            c(3, 0, None),
        ];
        let d = run(gated(Some(4), None), &fleet, &[0, 1, 2]);
        assert_eq!(
            (d.worker, d.reason),
            (1, Reason::CacheHit),
            "pressure 2 ties: lower id; engine load beats in-flight"
        );
        assert_eq!(d.gate, GateAudit::default());
        let d = run(gated(Some(4), None), &fleet, &[0, 3]);
        assert_eq!(
            (d.worker, d.reason),
            (3, Reason::CacheHit),
            "no sample: in-flight 0 is the pressure"
        );
        assert_eq!(
            d.gate,
            GateAudit {
                rejected: 0,
                unsampled: 1
            }
        );
    }

    #[test]
    fn one_queued_owner_is_skipped_for_another_owner() {
        let fleet = [
            c(0, 0, Some((4, 0))),
            c(1, 0, Some((1, 8))),
            c(2, 0, Some((0, 0))),
        ];
        let d = run(gated(Some(4), None), &fleet, &[0, 1]);
        assert_eq!(
            (d.worker, d.reason),
            (1, Reason::CacheHit),
            "a partial diversion is still a hit"
        );
        assert_eq!(d.gate.rejected, 1);
    }

    #[test]
    fn queued_owners_divert_to_the_least_pressure_open_worker() {
        let fleet = [
            c(0, 0, Some((4, 0))),
            c(1, 0, Some((9, 0))),
            c(2, 0, Some((2, 3))),
            c(3, 0, Some((0, 1))),
        ];
        let d = run(gated(Some(4), None), &fleet, &[0, 1]);
        assert_eq!((d.worker, d.reason), (3, Reason::CacheWorkerQueued));
        assert_eq!(d.label(), Label::CacheWorkerQueued);
        assert_eq!(d.matched_chars, 100, "the abandoned prefix is reported");
        assert_eq!(d.gate.rejected, 2);
    }

    #[test]
    fn a_worker_without_sample_is_a_diversion_target_without_a_floor() {
        let fleet = [c(0, 0, Some((4, 0))), c(1, 0, None), c(2, 0, Some((7, 0)))];
        let d = run(gated(Some(4), None), &fleet, &[0]);
        assert_eq!((d.worker, d.reason), (1, Reason::CacheWorkerQueued));
    }

    #[test]
    fn a_provably_queued_fleet_stays_with_the_owner() {
        let fleet = [
            c(0, 0, Some((6, 2))),
            c(1, 0, Some((4, 1))),
            c(2, 0, Some((5, 0))),
        ];
        let d = run(gated(Some(4), None), &fleet, &[0, 2]);
        assert_eq!(
            (d.worker, d.reason),
            (2, Reason::AllQueued),
            "least pressure owner (5 < 8)"
        );
        assert_eq!(d.label(), Label::AllQueued);
    }

    #[test]
    fn the_pin_holds_when_no_worker_is_provably_below_the_floor() {
        // Owner 0 gated; worker 1 is under the limit (the gate would divert there)
        // but not under the floor: diverting buys nothing.
        let fleet = [c(0, 0, Some((5, 0))), c(1, 0, Some((3, 0))), c(2, 0, None)];
        let d = run(gated(Some(4), Some(2)), &fleet, &[0]);
        assert_eq!((d.worker, d.reason), (0, Reason::SaturationPin));
        assert_eq!(d.label(), Label::AllQueued);
        assert_eq!(d.reason.as_str(), "saturation_pin");
        // Without the floor the same fleet diverts.
        let d = run(gated(Some(4), None), &fleet, &[0]);
        assert_eq!(d.reason, Reason::CacheWorkerQueued);
    }

    #[test]
    fn the_pin_yields_to_a_worker_provably_below_the_floor() {
        let fleet = [
            c(0, 0, Some((5, 0))),
            c(1, 0, Some((1, 0))),
            c(2, 0, Some((3, 0))),
        ];
        let d = run(gated(Some(4), Some(2)), &fleet, &[0]);
        assert_eq!((d.worker, d.reason), (1, Reason::CacheWorkerQueued));
    }

    #[test]
    fn the_pin_takes_the_least_pressure_owner_then_id_and_replaces_the_fleet_tier() {
        let fleet = [
            c(0, 0, Some((9, 0))),
            c(1, 0, Some((4, 2))),
            c(2, 0, Some((5, 1))),
            c(3, 0, Some((8, 8))),
        ];
        let d = run(gated(Some(4), Some(4)), &fleet, &[0, 1, 2]);
        assert_eq!(
            (d.worker, d.reason),
            (1, Reason::SaturationPin),
            "6 ties 6: lower id; pin, not all_queued"
        );
    }

    #[test]
    fn the_pin_counts_only_the_routable_fleet_it_is_given() {
        // Only candidates are passed in: an idle worker of another pool or model
        // never reaches the ladder, so it cannot veto the pin.
        let fleet = [c(0, 0, Some((5, 0))), c(1, 0, Some((6, 0)))];
        let d = run(gated(Some(4), Some(1)), &fleet, &[0]);
        assert_eq!(d.reason, Reason::SaturationPin);
    }

    #[test]
    fn without_a_limit_queues_are_ignored() {
        let fleet = [c(0, 0, Some((500, 0))), c(1, 0, Some((0, 0)))];
        let d = run(gated(None, None), &fleet, &[0]);
        assert_eq!((d.worker, d.reason), (0, Reason::CacheHit));
    }

    #[test]
    fn a_miss_is_not_gated() {
        let fleet = [c(0, 0, Some((9, 0))), c(1, 1, Some((0, 0)))];
        let mut rng = SplitMix64(1);
        let m = matched(1, 100, vec![1]);
        let d = cache_aware(&gated(Some(4), Some(2)), &fleet, &m, &mut rng).unwrap();
        assert_eq!(
            (d.worker, d.reason),
            (0, Reason::CacheMiss),
            "a miss is least in-flight, as SMG"
        );
    }

    #[test]
    fn owners_are_found_among_candidates_whichever_list_is_longer() {
        let fleet = cands(&[0; 8]);
        let ids = |found: Owning| found.iter().map(|c| c.worker).collect::<Vec<_>>();
        assert_eq!(ids(owning(&fleet, &[3])), [3], "one owner among many");
        assert_eq!(ids(owning(&fleet, &[1, 6, 9])), [1, 6], "9 is no candidate");
        let few = [fleet[2], fleet[5]];
        let many: Vec<TenantId> = (0..20).collect();
        assert_eq!(
            ids(owning(&few, &many)),
            [2, 5],
            "many owners, few candidates"
        );
        assert!(owning(&few, &[]).is_empty());
        assert!(owning(&[], &many).is_empty());
    }

    #[test]
    fn one_owner_is_held_in_place_and_a_second_makes_a_list() {
        let fleet = cands(&[0; 8]);
        assert!(matches!(owning(&fleet, &[3]), Owning::One([c]) if c.worker == 3));
        assert!(matches!(owning(&fleet, &[3, 9]), Owning::One([c]) if c.worker == 3));
        assert!(matches!(&owning(&fleet, &[1, 3, 5]), Owning::List(l) if l.len() == 3));
        assert!(matches!(&owning(&fleet, &[9]), Owning::List(l) if l.is_empty()));
    }
}
