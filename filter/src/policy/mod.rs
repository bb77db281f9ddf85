//! Worker selection: one file per policy, each a pure function of the candidates'
//! loads (and a random source where ties are broken at random). The candidates come
//! from `crate::candidates` (the serving set after the overload screen); a policy
//! returns a `Decision` or `None` when there is no candidate.
//!
//! - `cache_aware`: SGLang model gateway's prefix-affinity ladder with the queue
//!   gate and saturation pin (the algorithm is stated at the top of its file);
//! - `predicted_ttft`: the least predicted time to first token (work ahead plus
//!   own uncached prefill) under a bounded-load cap (stated at the top of its file);
//! - `round_robin`, `random`, `power_of_two`: load spreading without a tree;
//! - `unreadable` (here): least-load for a body without routing text.

mod cache_aware;
mod power_of_two;
mod predicted_ttft;
mod random;
mod round_robin;
mod ttft_sample;

pub(crate) use cache_aware::owning;
pub use cache_aware::{
    any_fresh_queue_below, cache_aware, fleet_all_queued, is_imbalanced, queue_gate_admits,
    CacheAwareParams,
};
pub use power_of_two::power_of_two;
pub use predicted_ttft::{
    learn_prefill, learn_service, load_cap, match_margin, others_load, Ladder, Scored,
    TtftCandidate, TtftParams, WorkerCosts, WorkerWork,
};
pub use random::random;
pub use round_robin::round_robin;
pub use ttft_sample::{ttft_sample, Drawn, Marks};

use crate::decision::{Decision, GateAudit, Reason};
use crate::rng::Rng;
use crate::tree::TenantId;

/// A fresh engine sample's queue, as the gate and the pin read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineQueue {
    pub waiting: u64,
    pub running: u64,
}

/// A routable worker: its router-side in-flight count and, when fresh, what its
/// engine last reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub worker: TenantId,
    pub inflight: u64,
    pub engine: Option<EngineQueue>,
}

impl Candidate {
    /// The engine's own load when known, the router's in-flight count otherwise.
    pub fn pressure(&self) -> u64 {
        match self.engine {
            Some(q) => q.waiting.saturating_add(q.running),
            None => self.inflight,
        }
    }
}

/// The candidate with the least `key`, ties broken at random so an idle fleet
/// spreads.
pub(crate) fn least_by(
    candidates: &[Candidate],
    key: impl Fn(&Candidate) -> u64,
    rng: &mut dyn Rng,
) -> Option<TenantId> {
    let min = candidates.iter().map(&key).min()?;
    let tied: Vec<TenantId> = candidates
        .iter()
        .filter(|c| key(c) == min)
        .map(|c| c.worker)
        .collect();
    tied.get(rng.below(tied.len())).copied()
}

/// The least in-flight candidate, ties at random (SMG's least-load).
pub fn least_loaded(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<TenantId> {
    least_by(candidates, |c| c.inflight, rng)
}

/// Least pressure, then lowest id: a stable choice among cache candidates.
pub(crate) fn least_pressure<'a>(
    candidates: impl IntoIterator<Item = &'a Candidate>,
) -> Option<TenantId> {
    candidates
        .into_iter()
        .min_by_key(|c| (c.pressure(), c.worker))
        .map(|c| c.worker)
}

pub(crate) fn decide(
    worker: TenantId,
    reason: Reason,
    matched_chars: usize,
    gate: GateAudit,
) -> Decision {
    Decision {
        worker,
        reason,
        matched_chars,
        gate,
        predicted: None,
    }
}

/// Least-load for bodies without routing text.
pub fn unreadable(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<Decision> {
    least_loaded(candidates, rng).map(|w| decide(w, Reason::Unreadable, 0, GateAudit::default()))
}

#[cfg(test)]
pub(crate) mod testing {
    //! Candidates for the policies' tests.
    use super::*;

    /// Candidates without engine samples, by in-flight count.
    pub fn cands(loads: &[u64]) -> Vec<Candidate> {
        loads
            .iter()
            .enumerate()
            .map(|(i, &inflight)| c(i as TenantId, inflight, None))
            .collect()
    }

    /// A candidate with an optional fresh `(waiting, running)` sample.
    pub fn c(worker: TenantId, inflight: u64, engine: Option<(u64, u64)>) -> Candidate {
        Candidate {
            worker,
            inflight,
            engine: engine.map(|(waiting, running)| EngineQueue { waiting, running }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::cands;
    use super::*;
    use crate::rng::SplitMix64;

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
        assert!(round_robin(&[], &mut 0).is_none());
        assert!(random(&[], &mut rng).is_none());
        assert!(power_of_two(&[], &mut rng).is_none());
        assert!(unreadable(&[], &mut rng).is_none());
    }
}
