//! The router of one VM: the configured workers, a prefix tree per (pool, model),
//! and the policy, turning a parsed request and the workers' loads into a decision.
//!
//! Sans-IO: loads and randomness come in as arguments, so the same code runs in the
//! filter, in native tests and in benchmarks.
//!
//! Deciding and recording are separate: `route` returns the decision and the tree
//! operation it implies, and `apply` changes the trees. In the filter the operation
//! goes through the shared operation ring (`shared`) and every VM applies it in the
//! same order, with the ring's sequence number as the tree clock, so eviction order
//! is a function of the operation stream alone.
//!
//! The candidates come from `candidates` (serving set, overload screen, fresh
//! samples); the policy is one of `policy`. When every candidate was flagged the
//! request is routed among them (`all_overloaded`) rather than refused. The text is
//! still recorded under whichever worker was chosen, so when a flagged owner's
//! prefix goes elsewhere, the next request with it hits there instead of chasing the
//! stale owner (re-homing).

use crate::background::worker_stats::TreeGauges;
use crate::config::{Config, Pool, WorkerNames};
use crate::decision::{Decision, Reason};
use crate::load::Loads;
use crate::parse::Parsed;
use crate::policy::{Ask, Engines, EnginesUse, KvRoom, Selectors};
use crate::request::candidates::{self, Screened, Screens};
use crate::request::kv_bounds::{kv_step, KvBound, KvStep, Share};
use crate::request::model_trees::ModelTrees;
use crate::rng::Rng;
use crate::shared::{truncate_text, Membership, Op};
use crate::tree::{TenantId, Walked};

mod apply;

/// Why no worker could be chosen (the request gets a 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoWorker {
    /// No worker of the pool serves the requested model.
    NoWorkerForModel,
    /// PD: no prefill worker serves the model.
    NoPrefillWorkerForModel,
    /// PD: no decode worker serves the model.
    NoDecodeWorkerForModel,
    /// Discovery mode: the collector has pushed no membership yet (or an empty one).
    NoDiscoveredWorker,
}

impl NoWorker {
    pub fn as_str(self) -> &'static str {
        match self {
            NoWorker::NoWorkerForModel => "no_worker_for_model",
            NoWorker::NoPrefillWorkerForModel => "no_prefill_worker_for_model",
            NoWorker::NoDecodeWorkerForModel => "no_decode_worker_for_model",
            NoWorker::NoDiscoveredWorker => "no_discovered_worker",
        }
    }
}

/// A tree insert to record, and how many chars of its text its worker held before
/// it: what undoing it keeps (`Op::into_forget`). The decision's own walk of the
/// tree knows that depth, so the bookkeeping does not walk the text again; nor does
/// it count the text's chars (for the prompt metrics) where the decision did.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub op: Op,
    pub held_chars: u64,
    /// Chars of the recorded text.
    pub text_chars: u64,
}

/// A decision and the tree operation to record for it (`cache_aware` with routing
/// text only).
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    pub decision: Decision,
    pub record: Option<Record>,
    /// The queue gate is configured but no candidate has a fresh engine sample, so
    /// it cannot act: the collector is not feeding the filter.
    pub gate_inert: bool,
    /// The prefix's owners were all flagged overloaded and filtered out, so a
    /// logical cache hit became a physical miss on another worker.
    pub owner_overloaded: bool,
    /// What became of the engines' answer (`kv_match`).
    pub engines: EnginesUse,
}

/// A PD pair: each pool decided by its own policy over its own tree.
#[derive(Debug, Clone, PartialEq)]
pub struct PdRouted {
    pub prefill: Routed,
    pub decode: Routed,
}

pub struct Router {
    cfg: Config,
    trees: ModelTrees,
    /// Each pool's policy: its own state (a round-robin position, so one pool's
    /// traffic does not skew another's) and parameters.
    selectors: PoolSelectors,
    /// One past the newest operation applied.
    clock: u64,
    /// Discovery mode: the version of the worker list in `cfg` (0: none yet).
    membership_version: u64,
    /// Worker index by name: every applied operation names its worker, and a scan
    /// of 256 names per operation showed in a profile.
    names: WorkerNames,
    /// Bumped whenever `cfg` is replaced: the kept screens were built under one.
    cfg_version: u64,
    screens: Screens,
    /// Where the last decision's walk of its text ended, for the insert it records
    /// (`apply_routed`).
    walked: Option<Walked>,
    /// What each worker's engine can hold of the trees, by worker index
    /// (`crate::request::kv_bounds`).
    kv: Vec<KvBound>,
    /// Each worker's engine's KV capacity in tokens and the chars of the trees it
    /// may hold, by worker index (`kv`'s, 0: not stated), rebuilt whenever `kv`
    /// changes (`capacities_follow_bounds`), so a decision hands them over as they
    /// are (`Ask::kv`).
    kv_capacities: Vec<u64>,
    kv_bound_chars: Vec<u64>,
}

/// A pool's policy each.
struct PoolSelectors {
    regular: Selectors,
    prefill: Selectors,
    decode: Selectors,
}

impl PoolSelectors {
    fn new(cfg: &Config) -> PoolSelectors {
        PoolSelectors {
            regular: Selectors::new(cfg.policy_of(Pool::Regular), cfg),
            prefill: Selectors::new(cfg.policy_of(Pool::Prefill), cfg),
            decode: Selectors::new(cfg.policy_of(Pool::Decode), cfg),
        }
    }

    fn configure(&mut self, cfg: &Config) {
        for pool in [Pool::Regular, Pool::Prefill, Pool::Decode] {
            self.get_mut(pool).configure(cfg.policy_of(pool), cfg);
        }
    }

    fn get_mut(&mut self, pool: Pool) -> &mut Selectors {
        match pool {
            Pool::Regular => &mut self.regular,
            Pool::Prefill => &mut self.prefill,
            Pool::Decode => &mut self.decode,
        }
    }
}

impl Router {
    pub fn new(cfg: Config) -> Self {
        let selectors = PoolSelectors::new(&cfg);
        Router {
            names: WorkerNames::new(&cfg.workers),
            cfg,
            trees: ModelTrees::default(),
            selectors,
            clock: 0,
            membership_version: 0,
            cfg_version: 0,
            screens: Screens::default(),
            walked: None,
            kv: Vec::new(),
            kv_capacities: Vec::new(),
            kv_bound_chars: Vec::new(),
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Takes a new configuration. Tenants are worker indices, so the trees are
    /// renamed to the new list's indices by worker name (and pool); workers that left
    /// are removed, and affinity survives a reordered or grown fleet.
    pub fn reconfigure(&mut self, mut cfg: Config) {
        // Discovery mode keeps the list the collector pushed; a list the new config's
        // rules refuse is dropped and the next push must pass them.
        if cfg.discovers() && self.cfg.discovers() {
            match cfg.with_workers(self.cfg.workers.clone()) {
                Ok(kept) => cfg = kept,
                Err(_) => self.membership_version = 0,
            }
        } else {
            self.membership_version = 0;
        }
        self.remap(cfg);
    }

    /// Discovery mode: takes worker list `version` if it is newer than the one held
    /// and valid under this config (the table or ring could hold one written under
    /// another config). Returns whether the list changed.
    pub fn set_membership(&mut self, m: &Membership) -> bool {
        if !self.cfg.discovers() || m.version <= self.membership_version {
            return false;
        }
        let Ok(cfg) = self.cfg.with_workers(m.workers.clone()) else {
            return false;
        };
        self.membership_version = m.version;
        self.remap(cfg);
        true
    }

    pub fn membership_version(&self) -> u64 {
        self.membership_version
    }

    /// Swaps in `cfg`, renaming tenants to its worker indices.
    fn remap(&mut self, cfg: Config) {
        let old = std::mem::replace(&mut self.cfg, cfg);
        self.cfg_version += 1;
        self.names = WorkerNames::new(&self.cfg.workers);
        self.selectors.configure(&self.cfg);
        let new_index: Vec<Option<TenantId>> = old
            .workers
            .iter()
            .map(|w| self.worker_index(w.pool, &w.name))
            .collect();
        let identity = new_index
            .iter()
            .enumerate()
            .all(|(i, n)| *n == Some(i as TenantId));
        if !identity {
            self.trees
                .remap_tenants(|old| new_index.get(old as usize).copied().flatten());
            let mut kv = vec![KvBound::default(); self.cfg.workers.len()];
            for (old, bound) in self.kv.iter().enumerate() {
                let new = new_index.get(old).copied().flatten();
                if let Some(slot) = new.and_then(|n| kv.get_mut(n as usize)) {
                    *slot = *bound;
                }
            }
            self.kv = kv;
            self.capacities_follow_bounds();
        }
    }

    /// Rebuilds `kv_capacities` and `kv_bound_chars` from `kv`, after `kv` changed.
    fn capacities_follow_bounds(&mut self) {
        self.kv_capacities.clear();
        self.kv_capacities
            .extend(self.kv.iter().map(|b| b.capacity_tokens));
        self.kv_bound_chars.clear();
        self.kv_bound_chars.extend(
            self.kv
                .iter()
                .map(|b| b.max_chars().map_or(0, |c| c as u64)),
        );
    }

    /// Worker `index`'s bound as the stream last set it.
    pub fn kv_bound(&self, index: usize) -> KvBound {
        self.kv.get(index).copied().unwrap_or_default()
    }

    /// What worker `index` holds of the trees and what its engine can hold.
    pub fn tree_gauges(&self, index: usize) -> TreeGauges {
        TreeGauges {
            tree_chars: self.worker_tree_chars(index) as u64,
            kv_bound_chars: self.kv_max_chars(index).map_or(0, |c| c as u64),
            chars_per_token_milli: self.kv_bound(index).chars_per_token_milli,
        }
    }

    /// Chars worker `index` holds in its pool's trees.
    pub fn worker_tree_chars(&self, index: usize) -> usize {
        self.cfg
            .workers
            .get(index)
            .map_or(0, |w| self.trees.tenant_chars(w.pool, index as TenantId))
    }

    /// What worker `index`'s engine sample means for its bound at `now_ms`
    /// (`kv_step`): the operation to share, if any.
    pub fn kv_step(
        &self,
        index: usize,
        capacity: Option<u64>,
        prompt_tokens: Option<u64>,
        now_ms: u64,
    ) -> Option<(Op, Share)> {
        let w = self.cfg.workers.get(index)?;
        match kv_step(&self.kv_bound(index), capacity, prompt_tokens, now_ms) {
            KvStep::Keep(_) => None,
            KvStep::Share(update, why) => Some((
                Op::KvBound {
                    pool: w.pool,
                    worker: w.name.clone(),
                    update,
                },
                why,
            )),
        }
    }

    fn worker_index(&self, pool: Pool, name: &str) -> Option<TenantId> {
        let i = self.names.get(name)?;
        let w = self.cfg.workers.get(i)?;
        (w.pool == pool).then_some(i as TenantId)
    }

    /// The workers' indices by name.
    pub fn names(&self) -> &WorkerNames {
        &self.names
    }

    /// Chars held by all trees of this VM.
    pub fn tree_chars(&self) -> usize {
        self.trees.chars()
    }

    pub fn tree(&self, pool: Pool, model: &str) -> Option<&crate::tree::Tree> {
        self.trees.get(pool, model)
    }

    /// Chooses a worker of the regular pool for `req`. For `cache_aware` with a
    /// routing text, the returned operation records the text under the worker; the
    /// caller applies it (directly, or through the shared ring). The record takes
    /// the text and model out of `req` rather than copying them (a prompt is
    /// kilobytes); without a record `req` keeps them.
    pub fn route(
        &mut self,
        req: &mut Parsed,
        loads: &Loads,
        rng: &mut dyn Rng,
    ) -> Result<Routed, NoWorker> {
        self.route_in(Pool::Regular, req, Use::Last, loads, rng)
    }

    /// Chooses a prefill and a decode worker for `req`, each pool with its own
    /// policy and its own tree: one tree for both pools makes alternating prefill
    /// and decode inserts overwrite each other's owners, and affinity degrades to a
    /// coin flip. Either record, when present, is applied like `route`'s.
    pub fn route_pd(
        &mut self,
        req: &mut Parsed,
        loads: &Loads,
        rng: &mut dyn Rng,
    ) -> Result<PdRouted, NoWorker> {
        let prefill = self
            .route_in(Pool::Prefill, req, Use::Again, loads, rng)
            .map_err(|_| NoWorker::NoPrefillWorkerForModel)?;
        let decode = self
            .route_in(Pool::Decode, req, Use::Last, loads, rng)
            .map_err(|_| NoWorker::NoDecodeWorkerForModel)?;
        Ok(PdRouted { prefill, decode })
    }

    fn route_in(
        &mut self,
        pool: Pool,
        req: &mut Parsed,
        then: Use,
        loads: &Loads,
        rng: &mut dyn Rng,
    ) -> Result<Routed, NoWorker> {
        // A walk is only ever this decision's.
        self.walked = None;
        if self.cfg.workers.is_empty() {
            return Err(NoWorker::NoDiscoveredWorker);
        }
        let (model, text, answer) = match req {
            Parsed::Routable(r) => (
                r.model.as_str(),
                Some(truncate_text(&r.text, self.cfg.max_routing_text_bytes)),
                r.held.as_ref(),
            ),
            Parsed::Unroutable { model, .. } => (model.as_str(), None, None),
        };
        // The engines' answer by worker index, where their names are the workers'.
        let held: Vec<Option<u32>> = answer.map_or_else(Vec::new, |a| {
            self.cfg.workers.iter().map(|w| a.held(&w.name)).collect()
        });
        let Screened {
            candidates,
            flagged,
            all_flagged,
            all_down,
            inflight: total,
            position,
        } = self
            .screens
            .screen((&self.cfg, self.cfg_version), pool, model, loads);
        let (all_flagged, all_down) = (*all_flagged, *all_down);
        let gate_inert = candidates::gate_inert(candidates, self.cfg.worker_queue_limit);
        let trees = &self.trees;
        let held_chars = |w: TenantId| trees.tenant_chars(pool, w) as u64;
        let ask = Ask {
            text,
            tree: self.trees.get(pool, model),
            candidates,
            flagged,
            position,
            inflight: *total,
            loads,
            // Where the pool's trees are bounded by the engines' caches, each
            // one's capacity weighs its conversations and prices what a placement
            // evicts (`predicted_ttft`).
            kv: self.cfg.bounds_kv(pool).then_some(KvRoom {
                capacities: &self.kv_capacities,
                bound_chars: &self.kv_bound_chars,
                held_chars: &held_chars,
            }),
            engines: answer.map(|answer| Engines {
                answer,
                held: &held,
            }),
        };
        let chosen = self.selectors.get_mut(pool).select(&ask, rng);
        self.walked = chosen.walked;
        let mut decision = chosen.decision.ok_or(NoWorker::NoWorkerForModel)?;
        if all_down {
            decision.reason = Reason::AllDown;
        } else if all_flagged {
            decision.reason = Reason::AllOverloaded;
        }
        // A filtered owner shows as a miss, which a fleet all down or all flagged
        // does not report.
        let owner_overloaded = chosen.owner_overloaded && !all_down && !all_flagged;
        // The text's length first: it borrows `req`, which the record then takes
        // it from.
        let recorded = chosen.record.zip(text.map(str::len));
        let record = recorded.map(|(held, text_bytes)| {
            let (model, text) = then.model_and_text(req, text_bytes);
            Record {
                op: Op::Insert {
                    pool,
                    model,
                    worker: self
                        .cfg
                        .workers
                        .get(decision.worker as usize)
                        .map(|w| w.name.clone())
                        .unwrap_or_default(),
                    text,
                },
                held_chars: held.held_chars as u64,
                text_chars: held.text_chars as u64,
            }
        });
        Ok(Routed {
            decision,
            record,
            gate_inert,
            owner_overloaded,
            engines: chosen.engines,
        })
    }
}

/// Whether a routing of a request is its last (its record may take the request's
/// text and model) or another pool routes it next (PD's prefill: copied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    Again,
    Last,
}

impl Use {
    /// The model and the first `text_bytes` of the text of `req` (a char boundary:
    /// `truncate_text`'s cut) for a record.
    fn model_and_text(self, req: &mut Parsed, text_bytes: usize) -> (String, String) {
        let Parsed::Routable(r) = req else {
            return (req.model().to_string(), String::new());
        };
        if self == Use::Again || !r.text.is_char_boundary(text_bytes) {
            let text = r.text.get(..text_bytes).unwrap_or_default();
            return (r.model.clone(), text.to_string());
        }
        let mut text = std::mem::take(&mut r.text);
        text.truncate(text_bytes);
        (std::mem::take(&mut r.model), text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use crate::parse::parse;
    use crate::parse::testing::chat;
    use crate::rng::SplitMix64;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn router(extra: &str, workers: usize) -> Router {
        let ws: Vec<String> = (0..workers)
            .map(|i| format!(r#"{{"name":"w{i}"}}"#))
            .collect();
        // These tests are of `cache_aware` unless `extra` names a policy.
        let policy = if extra.contains(r#""policy""#) {
            ""
        } else {
            r#""policy":"cache_aware","#
        };
        let json = format!(r#"{{{policy}"workers":[{}]{extra}}}"#, ws.join(","));
        Router::new(Config::from_json(json.as_bytes()).unwrap())
    }

    /// Routes and records locally, as a single VM without sharing would.
    fn go(
        r: &mut Router,
        req: &Parsed,
        inflight: &[u64],
        rng: &mut SplitMix64,
    ) -> Result<Decision, NoWorker> {
        let routed = r.route(&mut req.clone(), &Loads::inflight_only(inflight), rng)?;
        if let Some(Record { op, .. }) = &routed.record {
            r.apply_local(op);
        }
        Ok(routed.decision)
    }

    #[test]
    fn the_chars_routed_to_a_worker_are_counted_for_its_kv_bound() {
        let mut r = router("", 2);
        let mut rng = SplitMix64(5);
        for w in ["w0", "w1"] {
            let update = crate::request::kv_bounds::KvUpdate {
                capacity_tokens: 1 << 20,
                chars_per_token_milli: 0,
                anchor_tokens: 1,
                anchor_ms: 0,
                cleared: false,
            };
            r.apply_local(&Op::KvBound {
                pool: Pool::Regular,
                worker: w.into(),
                update,
            });
        }
        let mut sent = [0u64; 2];
        for c in 0..6 {
            for turn in 0..4 {
                let msgs: Vec<String> = (0..=turn)
                    .map(|t| format!("conversation {c} turn {t} says something"))
                    .collect();
                let msgs: Vec<&str> = msgs.iter().map(String::as_str).collect();
                let routed = r
                    .route(&mut chat(&msgs), &Loads::inflight_only(&[0, 0]), &mut rng)
                    .unwrap();
                let record = routed.record.unwrap();
                sent[routed.decision.worker as usize] += record.text_chars;
                let seq = r.clock;
                r.apply_routed(seq, &record.op);
            }
        }
        assert_eq!([r.kv_bound(0).chars_since, r.kv_bound(1).chars_since], sent);
    }

    #[test]
    fn a_sampled_fleet_still_finds_the_conversation_and_the_rare_prefix() {
        // 64 workers, 4 scored a request: each conversation's later turns, and a
        // document one worker alone holds, must still find their worker.
        let mut r = router(r#","policy":"predicted_ttft","ttft_sample_size":4"#, 64);
        let mut rng = SplitMix64(3);
        let idle = vec![0; 64];
        for c in 0..20 {
            let first = format!("conversation {c} opens with a question long enough to count");
            let home = go(&mut r, &chat(&[&first]), &idle, &mut rng)
                .unwrap()
                .worker;
            for turn in 0..3 {
                let later = format!("{first} and goes on, turn {turn}");
                let d = go(&mut r, &chat(&[&later]), &idle, &mut rng).unwrap();
                assert_eq!(d.worker, home, "conversation {c}, turn {turn}");
                assert_eq!(d.reason, Reason::TtftCache);
            }
        }
        let mut spread = std::collections::BTreeSet::new();
        for c in 0..200 {
            let new = format!("{c} a new conversation of its own, nothing like the rest");
            spread.insert(go(&mut r, &chat(&[&new]), &idle, &mut rng).unwrap().worker);
        }
        assert!(
            spread.len() > 32,
            "new conversations spread: {}",
            spread.len()
        );
    }

    #[test]
    fn a_sampled_fleet_spreads_conversations_as_the_whole_fleet_does() {
        // 64 idle workers, 4 scored a request: new conversations go where the
        // fewest are, as with every worker scored, so 128 of them make two a
        // worker (4 drawn at random from the fleet would see the fewest only by
        // chance).
        for sample in [0, 4] {
            let mut r = router(
                &format!(r#","policy":"predicted_ttft","ttft_sample_size":{sample}"#),
                64,
            );
            let mut rng = SplitMix64(7);
            let idle = vec![0; 64];
            for c in 0..128 {
                let new = format!("{c} a new conversation of its own, nothing like the rest");
                go(&mut r, &chat(&[&new]), &idle, &mut rng).unwrap();
            }
            let tree = r.tree(Pool::Regular, "m").unwrap();
            let counts: Vec<usize> = (0..64).map(|w| tree.tenant_leaves(w)).collect();
            assert!(
                counts.iter().all(|&n| n == 2),
                "sample {sample}: {counts:?}"
            );
        }
    }

    #[test]
    fn a_conversation_sticks_to_its_first_worker() {
        let mut r = router("", 4);
        let mut rng = SplitMix64(11);
        let sys = "a long shared system prompt that dominates the text";
        let first = go(&mut r, &chat(&[sys, "q1"]), &[0; 4], &mut rng).unwrap();
        assert_eq!(first.reason, Reason::CacheMiss, "cold tree");
        for turn in 2..6 {
            let q = format!("q{turn}");
            let d = go(&mut r, &chat(&[sys, "q1", &q]), &[0; 4], &mut rng).unwrap();
            assert_eq!((d.worker, d.reason), (first.worker, Reason::CacheHit));
        }
    }

    #[test]
    fn a_record_says_how_much_its_worker_held_however_the_worker_was_chosen() {
        // Owners of the match, least-loaded picks of a balanced or an imbalanced
        // fleet, and predicted_ttft: the depth travels with the record, and it is
        // what walking the tree for that worker says.
        for policy in ["cache_aware", "predicted_ttft"] {
            let mut r = router(&format!(r#","policy":"{policy}""#), 4);
            let mut rng = SplitMix64(5);
            let mut seen = std::collections::HashSet::new();
            for i in 0..300u64 {
                let conv = rng.below(6);
                let turns: Vec<String> = (0..=rng.below(4))
                    .map(|t| format!("c{conv} tür{t}"))
                    .collect();
                let turns: Vec<&str> = turns.iter().map(String::as_str).collect();
                let mut req = chat(&turns);
                let inflight: Vec<u64> = (0..4)
                    .map(|_| rng.below(if i % 3 == 0 { 100 } else { 2 }) as u64)
                    .collect();
                let routed = r
                    .route(&mut req, &Loads::inflight_only(&inflight), &mut rng)
                    .unwrap();
                let Some(Record {
                    op,
                    held_chars,
                    text_chars,
                }) = routed.record
                else {
                    panic!("{policy} records its text");
                };
                let Op::Insert {
                    pool, model, text, ..
                } = &op
                else {
                    panic!("an insert");
                };
                let worker = routed.decision.worker;
                let walked = r
                    .tree(*pool, model)
                    .map_or(0, |t| t.tenant_depth(text, worker));
                assert_eq!(held_chars, walked as u64, "{policy}, request {i}");
                assert_eq!(
                    text_chars,
                    text.chars().count() as u64,
                    "{policy}, request {i}"
                );
                seen.insert((routed.decision.reason, held_chars > 0));
                r.apply_local(&op);
            }
            assert!(
                seen.len() >= 3,
                "{policy}: hits, misses and depths vary: {seen:?}"
            );
        }
    }

    #[test]
    fn a_forgotten_insert_leaves_no_owner_but_what_the_worker_held() {
        let mut r = router("", 4);
        let mut rng = SplitMix64(11);
        let sys = "a long shared system prompt that dominates the text";
        let first = go(&mut r, &chat(&[sys, "q1"]), &[0; 4], &mut rng).unwrap();
        let name = format!("w{}", first.worker);
        // The next turn goes to the same worker, whose engine then fails.
        let mut next = chat(&[sys, "q1", "q2"]);
        let routed = r
            .route(&mut next, &Loads::inflight_only(&[0; 4]), &mut rng)
            .unwrap();
        let Some(Record {
            op:
                Op::Insert {
                    pool,
                    model,
                    worker,
                    text,
                },
            held_chars: keep,
            ..
        }) = routed.record
        else {
            panic!("cache_aware records its text")
        };
        assert_eq!(worker, name);
        let tree = |r: &Router| r.tree(pool, &model).unwrap().prefix_match(&text);
        let before = tree(&r).matched_chars as u64;
        assert_eq!(keep, before, "it held the first turn");
        let insert = Op::Insert {
            pool,
            model: model.clone(),
            worker: worker.clone(),
            text: text.clone(),
        };
        r.apply(100, &insert);
        assert_eq!(tree(&r).input_chars, tree(&r).matched_chars);
        let forget = Op::Forget {
            pool,
            model: model.clone(),
            worker,
            text: text.clone(),
            keep_chars: keep,
            seq: 100,
        };
        r.apply(101, &forget);
        assert_eq!(
            tree(&r).matched_chars as u64,
            before,
            "only what it held before the failed request"
        );
        assert_eq!(tree(&r).owners, vec![first.worker]);
    }

    #[test]
    fn different_prefixes_spread_on_an_idle_fleet() {
        let mut r = router("", 4);
        let mut rng = SplitMix64(3);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..40 {
            let text = format!("{i} distinct conversation opener number {i}");
            seen.insert(
                go(&mut r, &chat(&[&text]), &[0; 4], &mut rng)
                    .unwrap()
                    .worker,
            );
        }
        assert_eq!(seen.len(), 4, "misses go least-load with random ties");
    }

    #[test]
    fn imbalance_overrides_affinity() {
        let mut r = router("", 2);
        let mut rng = SplitMix64(1);
        let p = chat(&["prefix that will be owned by someone"]);
        let owner = go(&mut r, &p, &[0, 0], &mut rng).unwrap().worker;
        let mut loads = [0u64; 2];
        loads[owner as usize] = 100;
        let d = go(&mut r, &p, &loads, &mut rng).unwrap();
        assert_eq!(d.reason, Reason::Imbalanced);
        assert_ne!(d.worker, owner);
        // The diverted text was inserted under the new worker too.
        let tree = r.tree(Pool::Regular, "m").unwrap();
        let owners = tree
            .prefix_match("user: prefix that will be owned by someone\n")
            .owners;
        assert_eq!(owners.len(), 2);
    }

    #[test]
    fn unreadable_body_is_routed_by_load_and_not_inserted() {
        let mut r = router("", 2);
        let mut rng = SplitMix64(1);
        let d = r
            .route(
                &mut parse("/v1/chat/completions", b"garbage"),
                &Loads::inflight_only(&[5, 1]),
                &mut rng,
            )
            .unwrap();
        assert_eq!(d.record, None, "nothing to record without routing text");
        let d = d.decision;
        assert_eq!((d.worker, d.reason), (1, Reason::Unreadable));
        assert_eq!(r.tree_chars(), 0);
    }

    #[test]
    fn model_without_worker_is_no_worker() {
        let cfg = Config::from_json(br#"{"workers":[{"name":"a","models":["m1"]}]}"#).unwrap();
        let mut r = Router::new(cfg);
        let mut rng = SplitMix64(1);
        let p = parse("/v1/completions", br#"{"model":"m2","prompt":"x"}"#);
        assert_eq!(
            go(&mut r, &p, &[0], &mut rng),
            Err(NoWorker::NoWorkerForModel)
        );
        let ok = parse("/v1/completions", br#"{"model":"m1","prompt":"x"}"#);
        assert!(go(&mut r, &ok, &[0], &mut rng).is_ok());
        // Naming no model, or no readable body at all, still finds a worker.
        for body in [&br#"{"prompt":"x"}"#[..], b"not json", b""] {
            let d = go(&mut r, &parse("/v1/completions", body), &[0], &mut rng);
            assert_eq!(
                d.map(|d| d.worker),
                Ok(0),
                "{:?}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn trees_are_per_model() {
        let mut r = router("", 2);
        let mut rng = SplitMix64(1);
        let a = parse(
            "/v1/completions",
            br#"{"model":"a","prompt":"same prompt text"}"#,
        );
        let b = parse(
            "/v1/completions",
            br#"{"model":"b","prompt":"same prompt text"}"#,
        );
        go(&mut r, &a, &[0, 0], &mut rng).unwrap();
        let d = go(&mut r, &b, &[0, 0], &mut rng).unwrap();
        assert_eq!(
            d.reason,
            Reason::CacheMiss,
            "model b has its own, empty tree"
        );
    }

    #[test]
    fn model_count_is_bounded() {
        let mut r = router(r#","max_models":2"#, 1);
        let mut rng = SplitMix64(1);
        for m in ["a", "b", "c"] {
            let p = parse(
                "/v1/completions",
                format!(r#"{{"model":"{m}","prompt":"p"}}"#).as_bytes(),
            );
            go(&mut r, &p, &[0], &mut rng).unwrap();
        }
        assert!(
            r.tree(Pool::Regular, "a").is_none(),
            "least recently used tree dropped"
        );
        assert!(r.tree(Pool::Regular, "c").is_some());
    }

    #[test]
    fn junk_model_names_never_evict_the_trees_of_real_traffic() {
        // Issue 14, failure 4: ~65 tiny requests with junk `model` names wiped the
        // real models' trees (plain LRU over `max_models`).
        let mut r = router(r#","max_models":4"#, 1);
        let mut rng = SplitMix64(1);
        let mut send = |r: &mut Router, model: &str, prompt: &str| {
            let body = format!(r#"{{"model":"{model}","prompt":"{prompt}"}}"#);
            go(
                r,
                &parse("/v1/completions", body.as_bytes()),
                &[0],
                &mut rng,
            )
            .unwrap();
        };
        for turn in 0..5 {
            send(
                &mut r,
                "real-a",
                &format!("a long conversation, turn {turn}"),
            );
            send(
                &mut r,
                "real-b",
                &format!("another conversation, turn {turn}"),
            );
        }
        for i in 0..65 {
            send(&mut r, &format!("junk-{i}"), "x");
        }
        assert!(r.tree(Pool::Regular, "real-a").is_some());
        assert!(r.tree(Pool::Regular, "real-b").is_some());
        assert!(
            r.tree(Pool::Regular, "junk-64").is_some(),
            "the newest stays"
        );
        assert!(
            r.tree(Pool::Regular, "junk-0").is_none(),
            "junk churns among itself"
        );
    }

    #[test]
    fn a_declared_model_outlives_bigger_undeclared_ones() {
        let mut r = Router::new(
            Config::from_json(
                br#"{"workers":[{"name":"w0","models":["small"]},{"name":"w1"}],"max_models":2}"#,
            )
            .unwrap(),
        );
        let mut rng = SplitMix64(1);
        let mut send = |r: &mut Router, model: &str, prompt: &str| {
            let body = format!(r#"{{"model":"{model}","prompt":"{prompt}"}}"#);
            go(
                r,
                &parse("/v1/completions", body.as_bytes()),
                &[0, 0],
                &mut rng,
            )
            .unwrap();
        };
        send(&mut r, "small", "s");
        send(&mut r, "big", &"b".repeat(500));
        send(&mut r, "other", &"o".repeat(500));
        assert!(r.tree(Pool::Regular, "small").is_some(), "declared by w0");
        assert!(r.tree(Pool::Regular, "big").is_none());
    }

    #[test]
    fn total_budget_is_enforced_on_insert() {
        let mut r = router(r#","max_total_tree_chars":100"#, 2);
        let mut rng = SplitMix64(1);
        for i in 0..50 {
            let p = parse(
                "/v1/completions",
                format!(r#"{{"prompt":"prompt number {i:04}"}}"#).as_bytes(),
            );
            go(&mut r, &p, &[0, 0], &mut rng).unwrap();
            assert!(r.tree_chars() <= 100, "budget holds after every insert");
        }
    }

    #[test]
    fn periodic_eviction_trims_tenants() {
        let mut r = router(r#","max_tree_size":10"#, 1);
        let mut rng = SplitMix64(1);
        let p = parse(
            "/v1/completions",
            br#"{"prompt":"a prompt longer than ten chars"}"#,
        );
        go(&mut r, &p, &[0], &mut rng).unwrap();
        r.evict();
        assert_eq!(r.tree(Pool::Regular, "").unwrap().tenant_chars(0), 0);
    }

    #[test]
    fn reconfigure_follows_workers_by_name() {
        let mut r = router("", 3);
        let mut rng = SplitMix64(1);
        let p = chat(&["kept text that w-something owns"]);
        let owner = go(&mut r, &p, &[0, 0, 0], &mut rng).unwrap().worker;
        let owner_name = format!("w{owner}");
        let same = Config::from_json(
            br#"{"policy":"cache_aware","workers":[{"name":"w0"},{"name":"w1"},{"name":"w2"}],"cache_threshold":0.5}"#,
        )
        .unwrap();
        r.reconfigure(same);
        let d = go(&mut r, &p, &[0, 0, 0], &mut rng).unwrap();
        assert_eq!((d.worker, d.reason), (owner, Reason::CacheHit));
        // Reverse the list and add a worker: the owner keeps its prefix at its new index.
        let reversed = br#"{"policy":"cache_aware","workers":[{"name":"w9"},{"name":"w2"},{"name":"w1"},{"name":"w0"}]}"#;
        r.reconfigure(Config::from_json(reversed).unwrap());
        let d = go(&mut r, &p, &[0; 4], &mut rng).unwrap();
        assert_eq!(d.reason, Reason::CacheHit);
        assert_eq!(r.config().workers[d.worker as usize].name, owner_name);
        // Drop the owner: its prefix is gone with it.
        let without: Vec<String> = ["w0", "w1", "w2"]
            .iter()
            .filter(|n| **n != owner_name)
            .map(|n| format!(r#"{{"name":"{n}"}}"#))
            .collect();
        let cfg = format!(
            r#"{{"policy":"cache_aware","workers":[{}]}}"#,
            without.join(",")
        );
        r.reconfigure(Config::from_json(cfg.as_bytes()).unwrap());
        let d = go(&mut r, &p, &[0, 0], &mut rng).unwrap();
        assert_eq!(d.reason, Reason::CacheMiss, "the owner left the fleet");
    }

    #[test]
    fn round_robin_ignores_the_tree() {
        let mut r = router(r#","policy":"round_robin""#, 3);
        let mut rng = SplitMix64(1);
        let picks: Vec<_> = (0..3)
            .map(|_| {
                go(&mut r, &chat(&["same"]), &[0; 3], &mut rng)
                    .unwrap()
                    .worker
            })
            .collect();
        assert_eq!(picks, vec![0, 1, 2]);
        assert_eq!(r.tree_chars(), 0);
    }

    #[test]
    fn ops_apply_the_same_on_every_router() {
        // Two VMs applying one op stream hold the same trees, whatever each routed.
        let mut a = router(r#","max_total_tree_chars":300"#, 3);
        let mut b = router(r#","max_total_tree_chars":300"#, 3);
        let mut rng = SplitMix64(4);
        let mut stream = Vec::new();
        for i in 0..40 {
            let body = format!(r#"{{"prompt":"conversation {} tour n° {i} 日本"}}"#, i % 5);
            let mut p = parse("/v1/completions", body.as_bytes());
            let vm = if i % 2 == 0 { &mut a } else { &mut b };
            let loads = Loads::inflight_only(&[0; 3]);
            if let Some(Record { op, .. }) = vm.route(&mut p, &loads, &mut rng).unwrap().record {
                stream.push(op);
            }
            if i % 7 == 0 {
                stream.push(Op::Evict);
            }
        }
        // One applies them as decoded, the other as the ring holds them.
        for (seq, op) in stream.iter().enumerate() {
            a.apply(seq as u64, op);
            assert!(b.apply_encoded(seq as u64, &op.encode()));
        }
        assert!(a.tree_chars() <= 300, "the budget held");
        assert!(a.tree_chars() > 0);
        assert_eq!(a.tree_chars(), b.tree_chars());
        let (ta, tb) = (
            a.tree(Pool::Regular, "").unwrap(),
            b.tree(Pool::Regular, "").unwrap(),
        );
        for i in 0..40 {
            let text = format!("conversation {} tour n° {i} 日本", i % 5);
            assert_eq!(ta.prefix_match(&text), tb.prefix_match(&text));
            for w in 0..3 {
                assert_eq!(ta.tenant_depth(&text, w), tb.tenant_depth(&text, w));
            }
        }
    }

    #[test]
    fn an_encoded_insert_whose_text_is_not_utf8_is_refused_and_changes_nothing() {
        let mut r = router("", 3);
        // An insert's text is last in its encoding: `last` replaces its final byte.
        let encoded = |model: &str, text: &str, last: Option<u8>| {
            let op = Op::Insert {
                pool: Pool::Regular,
                model: model.into(),
                worker: "w1".into(),
                text: text.to_string(),
            };
            let mut bytes = op.encode();
            if let (Some(b), Some(at)) = (last, bytes.last_mut()) {
                *at = b;
            }
            bytes
        };
        assert!(r.apply_encoded(4, &encoded("m", "système prompt", None)));
        let before = (r.tree_chars(), r.clock);
        // A stray continuation byte past what the tree holds; then a text for a
        // model with no tree yet.
        assert!(!r.apply_encoded(9, &encoded("m", "système prompt.", Some(0x80))));
        assert!(!r.apply_encoded(9, &encoded("other", "x", Some(0xff))));
        assert!(!r.apply_encoded(9, b"garbage"));
        assert_eq!((r.tree_chars(), r.clock), before);
        assert!(r.tree(Pool::Regular, "other").is_none(), "no tree made");
        // An insert for a worker not known here is no error.
        let stranger = Op::Insert {
            pool: Pool::Regular,
            model: "m".into(),
            worker: "w9".into(),
            text: "x".to_string(),
        };
        assert!(r.apply_encoded(10, &stranger.encode()));
        assert_eq!(r.tree_chars(), before.0);
    }

    #[test]
    fn a_decisions_record_applied_from_its_walk_holds_what_a_whole_insert_does() {
        for policy in ["cache_aware", "predicted_ttft"] {
            records_from_the_walk_hold_what_whole_inserts_do(policy);
        }
    }

    /// One router applies each record from the decision's walk, the other from the
    /// root, another VM's operation coming in between at times; then both evict by
    /// the clocks the inserts left.
    fn records_from_the_walk_hold_what_whole_inserts_do(policy: &str) {
        let extra = format!(r#","max_tree_size":120,"policy":"{policy}""#);
        let mut a = router(&extra, 3);
        let mut b = router(&extra, 3);
        let mut rng = (SplitMix64(5), SplitMix64(5));
        let texts: Vec<String> = (0..60)
            .map(|i| format!("system prompt {}. user turn {} of {}", i % 3, i / 6, i % 6))
            .collect();
        for (seq, text) in texts.iter().enumerate() {
            let mut p = chat(&[text]);
            let loads = Loads::inflight_only(&[seq as u64 % 3, 0, 1]);
            let ra = a.route(&mut p.clone(), &loads, &mut rng.0).unwrap();
            let rb = b.route(&mut p, &loads, &mut rng.1).unwrap();
            assert_eq!(ra.decision, rb.decision, "{policy}, request {seq}");
            if seq % 5 == 0 {
                let Parsed::Routable(earlier) = chat(&[&texts[seq / 2]]) else {
                    panic!("routable")
                };
                let other = Op::Insert {
                    pool: Pool::Regular,
                    model: "m".into(),
                    worker: "w1".into(),
                    text: earlier.text,
                };
                a.apply(seq as u64 * 2, &other);
                b.apply(seq as u64 * 2, &other);
            }
            let seq = seq as u64 * 2 + 1;
            if let (Some(x), Some(y)) = (ra.record, rb.record) {
                a.apply(seq, &x.op);
                b.apply_routed(seq, &y.op);
            }
        }
        let before = a.tree_chars();
        a.apply(1000, &Op::<String>::Evict);
        b.apply(1000, &Op::<String>::Evict);
        assert!(a.tree_chars() < before, "{policy}: evicted");
        assert_eq!(a.tree_chars(), b.tree_chars());
        let (ta, tb) = (
            a.tree(Pool::Regular, "m").unwrap(),
            b.tree(Pool::Regular, "m").unwrap(),
        );
        for text in &texts {
            let text = &format!("user: {text}\n");
            assert_eq!(ta.prefix_match(text), tb.prefix_match(text));
            for w in 0..3 {
                assert_eq!(ta.tenant_depth(text, w), tb.tenant_depth(text, w));
            }
        }
    }

    #[test]
    fn long_texts_are_matched_and_recorded_by_the_same_prefix() {
        let mut r = router(r#","max_routing_text_bytes":100"#, 4);
        let mut rng = SplitMix64(2);
        let long = "x".repeat(1000);
        let first = go(&mut r, &chat(&[&long]), &[0; 4], &mut rng).unwrap();
        assert!(r.tree_chars() <= 100, "only the prefix is recorded");
        let longer = format!("{long} and a further turn");
        let d = go(&mut r, &chat(&[&longer]), &[0; 4], &mut rng).unwrap();
        assert_eq!((d.worker, d.reason), (first.worker, Reason::CacheHit));
    }

    /// The text and model of `req`'s record, if it has one.
    fn recorded(routed: &Routed) -> Option<(&str, &str)> {
        match &routed.record.as_ref()?.op {
            Op::Insert { model, text, .. } => Some((model.as_str(), text.as_str())),
            _ => None,
        }
    }

    #[test]
    fn a_record_takes_its_text_and_model_out_of_the_request_cut_where_routing_cut_it() {
        // The text is "user: " and 80 "é" of two bytes each: a cut at 101 bytes
        // would split the 48th, so routing cuts at 100, and the record holds those
        // 100 bytes, 53 chars.
        let long = "é".repeat(80);
        for (extra, bytes, chars) in [("", 167, 87), (r#","max_routing_text_bytes":101"#, 100, 53)]
        {
            let mut r = router(extra, 4);
            let mut req = chat(&[&long]);
            let Parsed::Routable(whole) = req.clone() else {
                panic!("routable")
            };
            let routed = r.route(&mut req, &Loads::default(), &mut SplitMix64(1));
            let routed = routed.unwrap();
            let (model, text) = recorded(&routed).unwrap();
            assert_eq!(model, whole.model);
            assert_eq!(text, &whole.text[..bytes]);
            assert_eq!(routed.record.as_ref().unwrap().text_chars, chars as u64);
            let Parsed::Routable(left) = &req else {
                panic!("routable")
            };
            assert_eq!((left.text.as_str(), left.model.as_str()), ("", ""));
        }
        // Without a record the request keeps both.
        let mut r = router(r#","policy":"round_robin""#, 4);
        let mut req = chat(&["kept"]);
        let before = req.clone();
        let routed = r.route(&mut req, &Loads::default(), &mut SplitMix64(1));
        assert!(routed.unwrap().record.is_none());
        assert_eq!(req, before);
    }

    #[test]
    fn pd_records_both_pools_under_the_same_text_the_prefill_pool_copying_it() {
        let mut r = pd_router(PD);
        let mut req = chat(&["one prompt for both pools"]);
        let Parsed::Routable(whole) = req.clone() else {
            panic!("routable")
        };
        let pair = r.route_pd(&mut req, &Loads::inflight_only(&[0; 4]), &mut SplitMix64(1));
        let pair = pair.unwrap();
        let want = Some((whole.model.as_str(), whole.text.as_str()));
        assert_eq!(recorded(&pair.prefill), want);
        assert_eq!(recorded(&pair.decode), want);
    }

    /// Routes with overload flags and records locally.
    fn go_flagged(r: &mut Router, req: &Parsed, flags: &[bool], rng: &mut SplitMix64) -> Routed {
        let inflight = vec![0; flags.len()];
        let loads = Loads {
            overloaded: flags.into(),
            ..Loads::inflight_only(&inflight)
        };
        let routed = r.route(&mut req.clone(), &loads, rng).unwrap();
        if let Some(Record { op, .. }) = &routed.record {
            r.apply_local(op);
        }
        routed
    }

    #[test]
    fn flagged_workers_are_never_candidates_under_any_policy() {
        for policy in ["cache_aware", "round_robin", "random", "power_of_two"] {
            let mut r = router(&format!(r#","policy":"{policy}""#), 3);
            let mut rng = SplitMix64(5);
            for i in 0..30 {
                let p = chat(&[&format!("opener {i}")]);
                let routed = go_flagged(&mut r, &p, &[false, true, false], &mut rng);
                assert_ne!(routed.decision.worker, 1, "{policy}: w1 is flagged");
                assert_ne!(routed.decision.reason, Reason::AllOverloaded);
            }
        }
    }

    #[test]
    fn an_all_flagged_fleet_is_routed_and_says_so() {
        let mut r = router("", 2);
        let mut rng = SplitMix64(5);
        let routed = go_flagged(&mut r, &chat(&["hello"]), &[true, true], &mut rng);
        assert_eq!(routed.decision.reason, Reason::AllOverloaded);
        assert_eq!(routed.decision.label(), crate::decision::Label::AllQueued);
        assert!(!routed.owner_overloaded, "nobody was filtered out");
    }

    #[test]
    fn a_filtered_owner_is_counted_and_its_prefix_re_homed() {
        use crate::decision::Label;
        for policy in ["cache_aware", "predicted_ttft"] {
            let mut r = router(&format!(r#","policy":"{policy}""#), 3);
            let mut rng = SplitMix64(8);
            let sys = "a system prompt long enough to dominate the routing text";
            let owner = go_flagged(&mut r, &chat(&[sys, "q1"]), &[false; 3], &mut rng)
                .decision
                .worker;
            let mut flags = [false; 3];
            flags[owner as usize] = true;
            let moved = go_flagged(&mut r, &chat(&[sys, "q1", "q2"]), &flags, &mut rng);
            assert_ne!(moved.decision.worker, owner, "{policy}");
            assert_eq!(moved.decision.label(), Label::CacheMiss, "{policy}");
            assert!(
                moved.owner_overloaded,
                "{policy}: a logical hit became a physical miss"
            );
            // The next turn hits the new home, not the stale owner.
            let next = go_flagged(&mut r, &chat(&[sys, "q1", "q2", "q3"]), &flags, &mut rng);
            assert_eq!(
                (next.decision.worker, next.decision.label()),
                (moved.decision.worker, Label::CacheHit),
                "{policy}"
            );
            assert!(!next.owner_overloaded, "{policy}");
            // A prefix nobody owns is a plain miss, not a filtered owner.
            let unrelated = parse(
                "/v1/completions",
                br#"{"model":"m","prompt":"zebra crossing"}"#,
            );
            let cold = go_flagged(&mut r, &unrelated, &flags, &mut rng);
            assert_eq!(cold.decision.label(), Label::CacheMiss, "{policy}");
            assert!(!cold.owner_overloaded, "{policy}");
        }
    }

    /// Routes `req` with the collector's answer: `held` leading blocks by worker
    /// name, of a prompt of 64 tokens in blocks of 16 (`None`: an index not whole).
    fn route_held(
        r: &mut Router,
        req: &Parsed,
        held: &[(&str, Option<u32>)],
        inflight: &[u64],
        rng: &mut SplitMix64,
    ) -> Routed {
        let Parsed::Routable(routable) = req.clone() else {
            panic!("routable")
        };
        let engines = held.iter().map(|(n, h)| (n.to_string(), *h)).collect();
        let mut asked = Parsed::Routable(crate::parse::RoutingRequest {
            held: Some(crate::kv_match::EngineHeld {
                tokens: 64,
                block_tokens: 16,
                engines,
            }),
            ..routable
        });
        r.route(&mut asked, &Loads::inflight_only(inflight), rng)
            .unwrap()
    }

    /// Three workers' names, as `router` names them.
    const THREE: [&str; 3] = ["w0", "w1", "w2"];

    /// A conversation routed once on three workers: the router, its generator, the
    /// request, and the worker the tree recorded it under.
    fn a_recorded_conversation() -> (Router, SplitMix64, Parsed, TenantId) {
        let mut r = router("", 3);
        let mut rng = SplitMix64(2);
        let conv = chat(&["a system prompt", "the first question"]);
        let recorded = go(&mut r, &conv, &[0; 3], &mut rng).unwrap().worker;
        (r, rng, conv, recorded)
    }

    /// Each of the three workers' held blocks as `of` says, by name.
    fn held_by(of: impl Fn(u32) -> Option<u32>) -> Vec<(&'static str, Option<u32>)> {
        (0..3u32).map(|w| (THREE[w as usize], of(w))).collect()
    }

    #[test]
    fn cache_aware_follows_what_the_engines_hold_over_what_the_tree_recorded() {
        let (mut r, mut rng, conv, recorded) = a_recorded_conversation();
        // The engine the tree names evicted it; another holds three of four blocks.
        let holder = (recorded + 1) % 3;
        let held = held_by(|w| Some(if w == holder { 3 } else { 0 }));
        let routed = route_held(&mut r, &conv, &held, &[0; 3], &mut rng);
        assert_eq!(
            (routed.decision.worker, routed.decision.reason),
            (holder, Reason::CacheHit)
        );
        assert_eq!(routed.engines, EnginesUse::Ranked);
        // 3 of 4 blocks: three quarters of the text's chars, as the tree counts.
        let chars = crate::tree::char_len(&conv_text(&conv));
        assert_eq!(routed.decision.matched_chars, chars * 3 / 4);
        assert_eq!(
            routed.record.map(|rec| rec.held_chars),
            Some(chars as u64 * 3 / 4)
        );
        // Below the threshold where the tree recorded more, the record outlived
        // the cache: the conversation goes where the most of it is held, the least
        // loaded of those (here the one not busy), though below the threshold.
        let mut loads = [0; 3];
        loads[recorded as usize] = 1;
        let stale = route_held(
            &mut r,
            &conv,
            &held_by(|w| Some(u32::from(w == holder || w == recorded))),
            &loads,
            &mut rng,
        );
        assert_eq!(
            (stale.decision.worker, stale.decision.reason),
            (holder, Reason::CacheHit)
        );
        assert_eq!(stale.engines, EnginesUse::Ranked);
        // Where no engine holds a block, the tree's record stands: nowhere is
        // better, and it keeps the conversation together.
        let cold = route_held(&mut r, &conv, &held_by(|_| Some(0)), &[0; 3], &mut rng);
        assert_eq!(
            (cold.decision.worker, cold.decision.reason),
            (recorded, Reason::CacheHit)
        );
        assert_eq!(cold.engines, EnginesUse::Deferred);
        // A prompt the tree never saw, held below the threshold: a miss by load.
        let fresh = chat(&["another system prompt entirely", "a question"]);
        let mut loads = [0; 3];
        loads[holder as usize] = 1;
        let held = held_by(|w| Some(u32::from(w == holder)));
        let miss = route_held(&mut r, &fresh, &held, &loads, &mut rng);
        assert_eq!(miss.decision.reason, Reason::CacheMiss);
        assert_ne!(miss.decision.worker, holder, "one block is 0.25 <= 0.3");
        assert_eq!(miss.engines, EnginesUse::Deferred);
    }

    #[test]
    fn with_the_kv_bound_a_miss_follows_the_workers_that_hold_its_start() {
        // A 200-char system prompt on w1 and w2 (two conversations), then a new
        // conversation whose own part is long: its match (the start) is below the
        // threshold.
        let system = "s".repeat(200);
        let mut rng = SplitMix64(3);
        let spilling = r#","balance_rel_threshold":1.0"#;
        for (extra, want_kept) in [("", false), (r#","kv_capacity_bound":true"#, true)] {
            let mut r = router(&format!("{spilling}{extra}"), 4);
            for (w, q) in [(1u64, "first"), (2, "second")] {
                // Every other worker 25 over the mean: an owner spills, and the
                // least loaded takes it, whatever matches.
                let mut loads = [100u64; 4];
                loads[w as usize] = 0;
                let req = chat(&[&system, q]);
                let routed = r
                    .route(&mut req.clone(), &Loads::inflight_only(&loads), &mut rng)
                    .unwrap();
                assert_eq!(routed.decision.worker, w as u32);
                if let Some(Record { op, .. }) = &routed.record {
                    r.apply_local(op);
                }
            }
            let long_question = "q".repeat(600);
            let req = chat(&[&system, &long_question]);
            // w0 and w3 are the least loaded; w1 and w2 hold the start.
            let loads = [0, 1, 1, 0];
            let mut seen = [0u32; 4];
            for _ in 0..40 {
                let routed = r
                    .route(&mut req.clone(), &Loads::inflight_only(&loads), &mut rng)
                    .unwrap();
                seen[routed.decision.worker as usize] += 1;
            }
            let kept = seen[1] + seen[2];
            if want_kept {
                assert_eq!(kept, 40, "the start's holders: {seen:?}");
                assert!(seen[1] > 0 && seen[2] > 0, "ties spread: {seen:?}");
            } else {
                assert_eq!(kept, 0, "SMG's miss goes least loaded: {seen:?}");
            }
        }
    }

    #[test]
    fn the_tree_decides_where_the_engines_answer_leaves_a_candidate_out() {
        let (mut r, mut rng, conv, recorded) = a_recorded_conversation();
        let other = (recorded + 1) % 3;
        for unknown in [None, Some("absent")] {
            // One index not whole, or one worker the collector does not follow.
            let held: Vec<(&str, Option<u32>)> = held_by(|w| match (w == other, w == recorded) {
                (true, _) => Some(4),
                (_, true) => None,
                _ => Some(0),
            })
            .into_iter()
            .filter(|(name, _)| unknown.is_none() || *name != THREE[recorded as usize])
            .collect();
            let routed = route_held(&mut r, &conv, &held, &[0; 3], &mut rng);
            assert_eq!(
                (routed.decision.worker, routed.decision.reason),
                (recorded, Reason::CacheHit),
                "{unknown:?}"
            );
            assert_eq!(routed.engines, EnginesUse::Partial);
        }
    }

    #[test]
    fn predicted_ttft_prices_what_the_engines_hold_over_what_the_tree_recorded() {
        let mut r = router(r#","policy":"predicted_ttft""#, 3);
        let mut rng = SplitMix64(2);
        let conv = chat(&["a system prompt", "the first question"]);
        let recorded = go(&mut r, &conv, &[0; 3], &mut rng).unwrap().worker;
        let holder = (recorded + 1) % 3;
        let chars = crate::tree::char_len(&conv_text(&conv));
        // The engine the tree names evicted the conversation, another holds all
        // four blocks of it: the holder is predicted sooner.
        let held = held_by(|w| Some(if w == holder { 4 } else { 0 }));
        let routed = route_held(&mut r, &conv, &held, &[0; 3], &mut rng);
        assert_eq!(
            (routed.decision.worker, routed.decision.reason),
            (holder, Reason::TtftCache)
        );
        assert_eq!(routed.engines, EnginesUse::Ranked);
        assert_eq!(routed.decision.matched_chars, chars);
        assert_eq!(routed.record.map(|rec| rec.held_chars), Some(chars as u64));
        // The engines bear the tree out: its worker.
        let held = held_by(|w| Some(if w == recorded { 4 } else { 0 }));
        let routed = route_held(&mut r, &conv, &held, &[0; 3], &mut rng);
        assert_eq!(routed.decision.worker, recorded);
        // An answer that leaves a candidate out: the tree's record stands.
        let held = held_by(|w| {
            if w == recorded {
                None
            } else {
                Some(u32::from(w == holder) * 4)
            }
        });
        let routed = route_held(&mut r, &conv, &held, &[0; 3], &mut rng);
        assert_eq!(routed.decision.worker, recorded);
        assert_eq!(routed.engines, EnginesUse::Partial);
    }

    #[test]
    fn an_imbalanced_fleet_goes_least_loaded_whatever_the_engines_hold() {
        let mut r = router("", 2);
        let conv = chat(&["a system prompt", "the first question"]);
        let held = [("w0", Some(4)), ("w1", Some(0))];
        let routed = route_held(&mut r, &conv, &held, &[200, 10], &mut SplitMix64(1));
        assert_eq!(
            (routed.decision.worker, routed.decision.reason),
            (1, Reason::Imbalanced)
        );
    }

    fn conv_text(req: &Parsed) -> String {
        match req {
            Parsed::Routable(r) => r.text.clone(),
            Parsed::Unroutable { .. } => String::new(),
        }
    }

    #[test]
    fn ops_for_unknown_workers_are_ignored() {
        let mut r = router("", 1);
        r.apply(
            0,
            &Op::Insert {
                pool: Pool::Regular,
                model: "m",
                worker: "ghost",
                text: "t",
            },
        );
        assert_eq!(r.tree_chars(), 0);
    }

    const PD: &str = r#"{"workers":[
        {"name":"p0","pool":"prefill","address":"10.0.0.1:30000","bootstrap_port":8998},
        {"name":"p1","pool":"prefill","address":"10.0.0.2:30000","bootstrap_port":8998},
        {"name":"d0","pool":"decode"},{"name":"d1","pool":"decode"}],
        "prefill_policy":"cache_aware","decode_policy":"cache_aware"}"#;

    fn pd_router(cfg: &str) -> Router {
        Router::new(Config::from_json(cfg.as_bytes()).unwrap())
    }

    /// Routes a PD pair and records both pools' operations, as the filter does.
    fn go_pd(r: &mut Router, req: &Parsed, rng: &mut SplitMix64) -> (Decision, Decision) {
        let routed = r
            .route_pd(&mut req.clone(), &Loads::inflight_only(&[0; 4]), rng)
            .unwrap();
        for Record { op, .. } in [&routed.prefill.record, &routed.decode.record]
            .into_iter()
            .flatten()
        {
            r.apply_local(op);
        }
        (routed.prefill.decision, routed.decode.decision)
    }

    fn name_of(r: &Router, t: TenantId) -> String {
        r.config().workers[t as usize].name.clone()
    }

    fn name(r: &Router, d: &Decision) -> String {
        r.config().workers[d.worker as usize].name.clone()
    }

    /// Alternating prefill and decode selections of the same prompts, all through
    /// one router (one policy instance), keep each pool's owners: with one tree for
    /// both pools each pool's inserts would overwrite the other's.
    #[test]
    fn pd_pools_keep_their_own_owners() {
        let mut r = pd_router(PD);
        let mut rng = SplitMix64(3);
        let prompts: Vec<Parsed> = (0..12)
            .map(|i| {
                chat(&[&format!(
                    "conversation {i} with a long shared system prompt"
                )])
            })
            .collect();
        let first: Vec<(String, String)> = prompts
            .iter()
            .map(|p| {
                let (pre, dec) = go_pd(&mut r, p, &mut rng);
                (name(&r, &pre), name(&r, &dec))
            })
            .collect();
        for (p, owners) in prompts.iter().zip(&first) {
            for _ in 0..3 {
                let (pre, dec) = go_pd(&mut r, p, &mut rng);
                assert_eq!(
                    (pre.reason, dec.reason),
                    (Reason::CacheHit, Reason::CacheHit)
                );
                assert_eq!((name(&r, &pre), name(&r, &dec)), owners.clone());
            }
        }
        for (pool, prefix) in [(Pool::Prefill, "p"), (Pool::Decode, "d")] {
            let tenants = r.tree(pool, "m").unwrap().tenants();
            assert!(!tenants.is_empty());
            for t in tenants {
                assert!(
                    r.config().workers[t as usize].name.starts_with(prefix),
                    "{pool:?} tree holds a worker of another pool"
                );
            }
        }
        assert!(r.tree(Pool::Regular, "m").is_none());
    }

    #[test]
    fn pd_pools_use_their_own_policies() {
        let cfg = PD.replace(
            r#""decode_policy":"cache_aware""#,
            r#""decode_policy":"round_robin""#,
        );
        let mut r = pd_router(&cfg);
        let mut rng = SplitMix64(3);
        let p = chat(&["same prompt every time"]);
        let mut decodes = Vec::new();
        for _ in 0..4 {
            let (pre, dec) = go_pd(&mut r, &p, &mut rng);
            assert_eq!(r.config().workers[pre.worker as usize].pool, Pool::Prefill);
            assert_eq!(dec.reason, Reason::Picked(Policy::RoundRobin));
            decodes.push(name(&r, &dec));
        }
        assert_eq!(decodes, ["d0", "d1", "d0", "d1"]);
        assert!(
            r.tree(Pool::Decode, "m").is_none(),
            "round robin records nothing"
        );
    }

    #[test]
    fn removing_a_worker_touches_its_own_pool_only() {
        let mut r = pd_router(PD);
        let mut rng = SplitMix64(5);
        let prompts: Vec<Parsed> = (0..8)
            .map(|i| chat(&[&format!("prompt number {i} for removal")]))
            .collect();
        for p in &prompts {
            go_pd(&mut r, p, &mut rng);
        }
        let decode_tenants = r.tree(Pool::Decode, "m").unwrap().tenants();
        // Dropping p0 from the config keeps every decode owner.
        let without_p0 = PD.replace(
            r#"{"name":"p0","pool":"prefill","address":"10.0.0.1:30000","bootstrap_port":8998},"#,
            "",
        );
        r.reconfigure(Config::from_json(without_p0.as_bytes()).unwrap());
        assert_eq!(
            r.tree(Pool::Decode, "m").unwrap().tenants().len(),
            decode_tenants.len(),
            "the decode tree keeps its owners"
        );
        for t in r.tree(Pool::Prefill, "m").unwrap().tenants() {
            assert_eq!(name_of(&r, t), "p1", "p0 left the prefill tree");
        }
        for p in &prompts {
            let (pre, dec) = go_pd(&mut r, p, &mut rng);
            assert_eq!(dec.reason, Reason::CacheHit, "decode affinity survives");
            assert_eq!(name(&r, &pre), "p1");
        }
    }

    #[test]
    fn an_added_worker_joins_its_own_pool_only() {
        let mut r = pd_router(PD);
        let mut rng = SplitMix64(9);
        let mut p = chat(&["a prompt routed before the fleet grew"]);
        let (pre, _) = go_pd(&mut r, &p, &mut rng);
        let owner = name(&r, &pre);
        let grown = PD.replace(
            r#"{"name":"d0","pool":"decode"}"#,
            r#"{"name":"d0","pool":"decode"},{"name":"d2","pool":"decode"}"#,
        );
        r.reconfigure(Config::from_json(grown.as_bytes()).unwrap());
        let routed = r
            .route_pd(&mut p, &Loads::inflight_only(&[0; 5]), &mut rng)
            .unwrap();
        assert_eq!(routed.prefill.decision.reason, Reason::CacheHit);
        assert_eq!(name(&r, &routed.prefill.decision), owner);
        let fresh = chat(&["a brand new prompt"]);
        for _ in 0..20 {
            let routed = r
                .route_pd(&mut fresh.clone(), &Loads::inflight_only(&[0; 5]), &mut rng)
                .unwrap();
            assert_eq!(
                r.config().workers[routed.prefill.decision.worker as usize].pool,
                Pool::Prefill,
                "a decode worker is never a prefill candidate"
            );
        }
    }

    #[test]
    fn a_pool_without_a_worker_for_the_model_is_named() {
        let cfg = r#"{"workers":[
            {"name":"p0","pool":"prefill","address":"10.0.0.1:1","bootstrap_port":2,"models":["a"]},
            {"name":"d0","pool":"decode","models":["b"]}]}"#;
        let mut r = pd_router(cfg);
        let mut rng = SplitMix64(1);
        let req = |m: &str| {
            parse(
                "/v1/completions",
                format!(r#"{{"model":"{m}","prompt":"x"}}"#).as_bytes(),
            )
        };
        let loads = [0; 2];
        assert_eq!(
            r.route_pd(&mut req("b"), &Loads::inflight_only(&loads), &mut rng),
            Err(NoWorker::NoPrefillWorkerForModel)
        );
        assert_eq!(
            r.route_pd(&mut req("a"), &Loads::inflight_only(&loads), &mut rng),
            Err(NoWorker::NoDecodeWorkerForModel)
        );
    }
}
