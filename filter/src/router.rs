//! The router of one VM: the configured workers, a prefix tree per (pool, model),
//! and the policy, turning a parsed request and the workers' loads into a decision.
//!
//! Sans-IO: loads and randomness come in as arguments, so the same code runs in the
//! filter, in native tests and in benchmarks. The tree clock is a counter of inserts,
//! not wall time, so eviction order is a function of the operations alone.

use hashbrown::HashMap;

use crate::config::{Config, Policy, Pool};
use crate::decision::Decision;
use crate::policy::{self, CacheAwareParams, Candidate, Rng};
use crate::request::Parsed;
use crate::tree::{TenantId, Tree};

/// Why no worker could be chosen (the request gets a 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoWorker {
    /// No worker of the pool serves the requested model.
    NoWorkerForModel,
}

impl NoWorker {
    pub fn as_str(self) -> &'static str {
        match self {
            NoWorker::NoWorkerForModel => "no_worker_for_model",
        }
    }
}

struct ModelTree {
    tree: Tree,
    last_used: u64,
}

pub struct Router {
    cfg: Config,
    trees: HashMap<(Pool, String), ModelTree>,
    rr_counter: u64,
    clock: u64,
}

impl Router {
    pub fn new(cfg: Config) -> Self {
        Router {
            cfg,
            trees: HashMap::new(),
            rr_counter: 0,
            clock: 0,
        }
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Takes a new configuration. Trees survive when the worker list (names, in
    /// order) is unchanged, since tenants are worker indices.
    pub fn reconfigure(&mut self, cfg: Config) {
        let same_workers = cfg.workers.len() == self.cfg.workers.len()
            && cfg
                .workers
                .iter()
                .zip(&self.cfg.workers)
                .all(|(a, b)| a.name == b.name && a.pool == b.pool);
        if !same_workers {
            self.trees.clear();
        }
        self.cfg = cfg;
    }

    /// Chars held by all trees of this VM.
    pub fn tree_chars(&self) -> usize {
        self.trees.values().map(|t| t.tree.stored_chars()).sum()
    }

    pub fn tree(&self, pool: Pool, model: &str) -> Option<&Tree> {
        self.trees.get(&(pool, model.to_string())).map(|t| &t.tree)
    }

    /// Candidates of `pool` serving `model`, with their in-flight counts
    /// (`inflight[i]` for worker `i`; missing entries count as 0).
    fn candidates(&self, pool: Pool, model: &str, inflight: &[u64]) -> Vec<Candidate> {
        self.cfg
            .workers
            .iter()
            .enumerate()
            .filter(|(_, w)| w.pool == pool && w.serves(model))
            .map(|(i, _)| Candidate {
                worker: i as TenantId,
                inflight: inflight.get(i).copied().unwrap_or(0),
            })
            .collect()
    }

    /// Chooses a worker of the regular pool for `req`, and for `cache_aware` records
    /// the routing text under it.
    pub fn route(
        &mut self,
        req: &Parsed,
        inflight: &[u64],
        rng: &mut dyn Rng,
    ) -> Result<Decision, NoWorker> {
        let pool = Pool::Regular;
        let (model, text) = match req {
            Parsed::Routable(r) => (r.model.as_str(), Some(r.text.as_str())),
            Parsed::Unroutable { model, .. } => (model.as_str(), None),
        };
        let candidates = self.candidates(pool, model, inflight);
        let decision = match (self.cfg.policy, text) {
            (Policy::CacheAware, Some(text)) => {
                let params = CacheAwareParams {
                    cache_threshold: self.cfg.cache_threshold,
                    balance_abs_threshold: self.cfg.balance_abs_threshold,
                    balance_rel_threshold: self.cfg.balance_rel_threshold,
                };
                let tree = self.trees.get(&(pool, model.to_string()));
                let d = policy::cache_aware(
                    &params,
                    &candidates,
                    || match tree {
                        Some(t) => t.tree.prefix_match(text),
                        None => crate::tree::PrefixMatch {
                            matched_chars: 0,
                            input_chars: text.chars().count(),
                            owners: Vec::new(),
                        },
                    },
                    rng,
                );
                if let Some(d) = d {
                    self.insert(pool, model, text, d.worker);
                }
                d
            }
            (Policy::CacheAware, None) => policy::unreadable(&candidates, rng),
            (Policy::RoundRobin, _) => policy::round_robin(&candidates, &mut self.rr_counter),
            (Policy::Random, _) => policy::random(&candidates, rng),
            (Policy::PowerOfTwo, _) => policy::power_of_two(&candidates, rng),
        };
        decision.ok_or(NoWorker::NoWorkerForModel)
    }

    fn insert(&mut self, pool: Pool, model: &str, text: &str, worker: TenantId) {
        self.clock += 1;
        let clock = self.clock;
        let key = (pool, model.to_string());
        if !self.trees.contains_key(&key) && self.trees.len() >= self.cfg.max_models {
            let oldest = self
                .trees
                .iter()
                .min_by_key(|(_, t)| t.last_used)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.trees.remove(&k);
            }
        }
        let entry = self.trees.entry(key).or_insert_with(|| ModelTree {
            tree: Tree::new(),
            last_used: clock,
        });
        entry.last_used = clock;
        entry.tree.insert(text, worker, clock);
        if self.tree_chars() > self.cfg.max_total_tree_chars {
            self.evict_to_budget();
        }
    }

    /// Periodic eviction (SMG's `eviction_interval`): every tenant down to
    /// `max_tree_size`, then all trees down to the VM budget.
    pub fn evict(&mut self) {
        let per_tenant = self.cfg.max_tree_size;
        for t in self.trees.values_mut() {
            t.tree.evict_tenants_over(per_tenant);
        }
        self.evict_to_budget();
    }

    /// Shrinks every tree in proportion until the total fits the budget, to 90% of
    /// it so that inserts do not trigger an eviction each.
    fn evict_to_budget(&mut self) {
        let total = self.tree_chars();
        let budget = self.cfg.max_total_tree_chars;
        if total <= budget {
            return;
        }
        let target = budget - budget / 10;
        for t in self.trees.values_mut() {
            let share = (t.tree.stored_chars() as u128 * target as u128 / total as u128) as usize;
            t.tree.evict_to_budget(share);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::decision::Reason;
    use crate::policy::SplitMix64;
    use crate::request::parse;

    fn router(extra: &str, workers: usize) -> Router {
        let ws: Vec<String> = (0..workers)
            .map(|i| format!(r#"{{"name":"w{i}"}}"#))
            .collect();
        let json = format!(r#"{{"workers":[{}]{extra}}}"#, ws.join(","));
        Router::new(Config::from_json(json.as_bytes()).unwrap())
    }

    fn chat(turns: &[&str]) -> Parsed {
        let msgs: Vec<String> = turns
            .iter()
            .map(|t| format!(r#"{{"role":"user","content":"{t}"}}"#))
            .collect();
        parse(
            "/v1/chat/completions",
            format!(r#"{{"model":"m","messages":[{}]}}"#, msgs.join(",")).as_bytes(),
        )
    }

    #[test]
    fn a_conversation_sticks_to_its_first_worker() {
        let mut r = router("", 4);
        let mut rng = SplitMix64(11);
        let sys = "a long shared system prompt that dominates the text";
        let first = r.route(&chat(&[sys, "q1"]), &[0; 4], &mut rng).unwrap();
        assert_eq!(first.reason, Reason::CacheMiss, "cold tree");
        for turn in 2..6 {
            let q = format!("q{turn}");
            let d = r.route(&chat(&[sys, "q1", &q]), &[0; 4], &mut rng).unwrap();
            assert_eq!((d.worker, d.reason), (first.worker, Reason::CacheHit));
        }
    }

    #[test]
    fn different_prefixes_spread_on_an_idle_fleet() {
        let mut r = router("", 4);
        let mut rng = SplitMix64(3);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..40 {
            let text = format!("{i} distinct conversation opener number {i}");
            seen.insert(r.route(&chat(&[&text]), &[0; 4], &mut rng).unwrap().worker);
        }
        assert_eq!(seen.len(), 4, "misses go least-load with random ties");
    }

    #[test]
    fn imbalance_overrides_affinity() {
        let mut r = router("", 2);
        let mut rng = SplitMix64(1);
        let p = chat(&["prefix that will be owned by someone"]);
        let owner = r.route(&p, &[0, 0], &mut rng).unwrap().worker;
        let mut loads = [0u64; 2];
        loads[owner as usize] = 100;
        let d = r.route(&p, &loads, &mut rng).unwrap();
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
                &parse("/v1/chat/completions", b"garbage"),
                &[5, 1],
                &mut rng,
            )
            .unwrap();
        assert_eq!((d.worker, d.reason), (1, Reason::Unreadable));
        assert_eq!(r.tree_chars(), 0);
    }

    #[test]
    fn model_without_worker_is_no_worker() {
        let cfg = Config::from_json(br#"{"workers":[{"name":"a","models":["m1"]}]}"#).unwrap();
        let mut r = Router::new(cfg);
        let mut rng = SplitMix64(1);
        let p = parse("/v1/completions", br#"{"model":"m2","prompt":"x"}"#);
        assert_eq!(r.route(&p, &[0], &mut rng), Err(NoWorker::NoWorkerForModel));
        let ok = parse("/v1/completions", br#"{"model":"m1","prompt":"x"}"#);
        assert!(r.route(&ok, &[0], &mut rng).is_ok());
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
        r.route(&a, &[0, 0], &mut rng).unwrap();
        let d = r.route(&b, &[0, 0], &mut rng).unwrap();
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
            r.route(&p, &[0], &mut rng).unwrap();
        }
        assert!(
            r.tree(Pool::Regular, "a").is_none(),
            "least recently used tree dropped"
        );
        assert!(r.tree(Pool::Regular, "c").is_some());
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
            r.route(&p, &[0, 0], &mut rng).unwrap();
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
        r.route(&p, &[0], &mut rng).unwrap();
        r.evict();
        assert_eq!(r.tree(Pool::Regular, "").unwrap().tenant_chars(0), 0);
    }

    #[test]
    fn reconfigure_keeps_trees_only_for_the_same_workers() {
        let mut r = router("", 2);
        let mut rng = SplitMix64(1);
        r.route(&chat(&["kept text"]), &[0, 0], &mut rng).unwrap();
        let same = Config::from_json(
            br#"{"workers":[{"name":"w0"},{"name":"w1"}],"cache_threshold":0.5}"#,
        )
        .unwrap();
        r.reconfigure(same);
        assert!(r.tree_chars() > 0);
        let other = Config::from_json(br#"{"workers":[{"name":"w1"},{"name":"w0"}]}"#).unwrap();
        r.reconfigure(other);
        assert_eq!(
            r.tree_chars(),
            0,
            "tenants are indices: a reordered fleet starts afresh"
        );
    }

    #[test]
    fn round_robin_ignores_the_tree() {
        let mut r = router(r#","policy":"round_robin""#, 3);
        let mut rng = SplitMix64(1);
        let picks: Vec<_> = (0..3)
            .map(|_| r.route(&chat(&["same"]), &[0; 3], &mut rng).unwrap().worker)
            .collect();
        assert_eq!(picks, vec![0, 1, 2]);
        assert_eq!(r.tree_chars(), 0);
    }
}
