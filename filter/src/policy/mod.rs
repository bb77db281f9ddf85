//! Worker selection behind one seam, pingora's `BackendSelection` in a Wasm VM: each
//! policy is a module here whose selector implements `Select`, with its own
//! parameter struct built once from the configuration and its own state (a
//! round-robin counter, the buffers a tree policy refills), and a `select` that
//! decides from one request's screened candidates alone (no clock, no host; the
//! randomness is passed in). The policies are listed once, in
//! `crate::config::policies`; `Selectors`, one per pool, is generated from that list
//! and dispatches by a `match` (no allocation, no virtual call per request). The
//! candidates come from `crate::request::candidates` (the serving set after the
//! overload screen).
//!
//! - `cache_aware`: SGLang model gateway's prefix-affinity ladder with the queue
//!   gate and saturation pin (the algorithm is stated at the top of its file);
//! - `predicted_ttft`: the least predicted time to first token (work ahead plus
//!   own uncached prefill) under a bounded-load cap (its folder: the model is
//!   stated at the top of `predict.rs`, the rungs at the top of `ladder.rs`);
//! - `round_robin`, `random`, `power_of_two`: load spreading without a tree;
//! - `unreadable` (here): least-load for a body without routing text, which the
//!   tree policies fall back to.
//!
//! A new policy is a module here implementing `Select` and its line in
//! `crate::config::policies` (docs: "Adding a policy").

use crate::config::{Config, Policy};
use crate::decision::{Decision, GateAudit, Reason};
use crate::kv_match::EngineHeld;
use crate::load::{Candidate, Loads};
use crate::rng::Rng;
use crate::tree::{TenantId, Tree, Walked};

/// A routing policy: its parameters, read from the configuration when it changes,
/// and its choice for one request.
pub trait Select: Default {
    /// What the policy reads of the configuration, defaults filled in.
    type Params;

    /// The parameters under `cfg` (validated: `Config::validate` holds).
    fn params(cfg: &Config) -> Self::Params;

    /// The worker for one request, or no decision when there is no candidate.
    fn select(&mut self, params: &Self::Params, ask: &Ask<'_>, rng: &mut dyn Rng) -> Chosen;
}

/// One request as a policy sees it, in one pool.
pub struct Ask<'a> {
    /// The routing text, cut to `max_routing_text_bytes` (none: the body gave none).
    pub text: Option<&'a str>,
    /// The pool's tree of the request's model, if it has one yet.
    pub tree: Option<&'a Tree>,
    /// The screened candidates, in worker order.
    pub candidates: &'a [Candidate],
    /// Serving workers the overload screen filtered out.
    pub flagged: &'a [TenantId],
    /// Each worker's position among `candidates`, by worker index.
    pub position: &'a [Option<u32>],
    /// Requests in flight on the pool's candidates in all.
    pub inflight: u64,
    pub loads: &'a Loads,
    /// The engines' KV caches, where the pool's trees are bounded by them
    /// (`kv_capacity_bound`; `None`: not bounded).
    pub kv: Option<KvRoom<'a>>,
    /// What the engines' caches hold of the prompt (`kv_match`): the collector's
    /// answer and, by worker index, each worker's leading blocks (`None`: not known).
    pub engines: Option<Engines<'a>>,
}

impl<'a> Ask<'a> {
    /// The engines' answer where it covers every candidate (each one's index
    /// whole): an engine the collector cannot vouch for would read as holding
    /// nothing beside the others, a miss that is not one.
    pub fn engines_for_all(&self) -> Option<Engines<'a>> {
        self.engines.filter(|e| {
            self.candidates
                .iter()
                .all(|c| e.held_by(c.worker).is_some())
        })
    }
}

/// What the engines' KV caches can hold and what the pool's trees say they hold,
/// by worker index: `predicted_ttft` weighs conversations by the one and prices the
/// evictions a placement causes by both.
#[derive(Clone, Copy)]
pub struct KvRoom<'a> {
    /// Each engine's capacity in tokens (0: not stated).
    pub capacities: &'a [u64],
    /// The chars of the pool's trees each worker may hold: its capacity at the
    /// chars per token learned (0: not stated).
    pub bound_chars: &'a [u64],
    /// The chars a worker holds in the pool's trees.
    pub held_chars: &'a dyn Fn(TenantId) -> u64,
}

/// The engines' answer for one request, by worker index.
#[derive(Debug, Clone, Copy)]
pub struct Engines<'a> {
    pub answer: &'a EngineHeld,
    pub held: &'a [Option<u32>],
}

impl Engines<'_> {
    /// The leading blocks worker `worker`'s engine holds (`None`: not known).
    pub fn held_by(&self, worker: TenantId) -> Option<u32> {
        self.held.get(worker as usize).copied().flatten()
    }
}

/// A policy's answer.
#[derive(Debug, Default)]
pub struct Chosen {
    pub decision: Option<Decision>,
    /// A tree policy's: the text is recorded under the chosen worker.
    pub record: Option<Held>,
    /// Where the policy's walk of the tree ended, for that record's insert.
    pub walked: Option<Walked>,
    /// The prefix's owners were all flagged overloaded and filtered out, so a
    /// logical cache hit became a physical miss on another worker.
    pub owner_overloaded: bool,
    /// What became of the engines' answer (`Ask::engines`).
    pub engines: EnginesUse,
}

/// What became of the engines' answer (`kv_match`) in a decision; ordered so that
/// a PD pair reports its more telling leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum EnginesUse {
    /// No answer, or a policy that does not read it.
    #[default]
    None,
    /// It did not cover every candidate (an index not whole, a worker the
    /// collector does not follow): the tree decided.
    Partial,
    /// It covered every candidate and left the decision to the tree: the engines
    /// hold less than the threshold where the tree misses too, or nobody holds a
    /// block, or an imbalanced fleet went least loaded before any match.
    Deferred,
    /// The engines' match decided.
    Ranked,
}

impl Chosen {
    /// A decision of a policy that records nothing.
    pub fn only(decision: Option<Decision>) -> Chosen {
        Chosen {
            decision,
            ..Chosen::default()
        }
    }
}

/// What a tree policy's record says of its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// Chars of the text the chosen worker held before this request.
    pub held_chars: usize,
    /// Chars of the text.
    pub text_chars: usize,
}

/// Declares each listed policy's module and `Selectors`, the dispatch among them.
macro_rules! registry {
    ($($name:ident $module:ident,)*) => {
        $(pub mod $module;)*

        /// The parameters of a pool's configured policy.
        #[derive(Debug)]
        enum Params {
            $($name(<$module::$name as Select>::Params),)*
        }

        impl Params {
            fn of(policy: Policy, cfg: &Config) -> Params {
                match policy {
                    $(Policy::$name => Params::$name($module::$name::params(cfg)),)*
                }
            }
        }

        /// One pool's policies: the configured one's parameters, and every
        /// policy's state, kept when the configuration changes (as a round-robin
        /// counter always was).
        #[derive(Debug)]
        pub struct Selectors {
            params: Params,
            $($module: $module::$name,)*
        }

        impl Selectors {
            pub fn new(policy: Policy, cfg: &Config) -> Selectors {
                Selectors {
                    params: Params::of(policy, cfg),
                    $($module: $module::$name::default(),)*
                }
            }

            /// Takes `policy` and its parameters under a new `cfg`.
            pub fn configure(&mut self, policy: Policy, cfg: &Config) {
                self.params = Params::of(policy, cfg);
            }

            /// The configured policy's choice.
            #[inline]
            pub fn select(&mut self, ask: &Ask<'_>, rng: &mut dyn Rng) -> Chosen {
                match &self.params {
                    $(Params::$name(p) => self.$module.select(p, ask, rng),)*
                }
            }
        }
    };
}
crate::config::policies!(registry);

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
    use crate::load::EngineQueue;

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
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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
        let cfg = Config::from_json(br#"{"workers":[{"name":"w0"}]}"#).unwrap();
        let loads = Loads::default();
        for text in [None, Some("a prompt")] {
            let ask = Ask {
                text,
                tree: None,
                candidates: &[],
                flagged: &[],
                position: &[],
                inflight: 0,
                loads: &loads,
                kv: None,
                engines: None,
            };
            for &policy in Policy::ALL {
                let chosen = Selectors::new(policy, &cfg).select(&ask, &mut rng);
                assert!(chosen.decision.is_none(), "{}", policy.as_str());
            }
        }
        assert!(unreadable(&[], &mut rng).is_none());
    }
}
