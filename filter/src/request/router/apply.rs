//! How a router applies the operation stream every VM shares: its own decisions'
//! records from where their walk ended, another VM's operations from the bytes the
//! ring holds, evictions and membership at the same point in every VM.

use super::Router;
use crate::config::Pool;
use crate::request::kv_bounds::{KvBound, KvUpdate};
use crate::request::model_trees::{Bounds, Inserted};
use crate::shared::{Incoming, Op};
use crate::tree::{TenantId, Walked};

impl Router {
    /// Applies operation `seq` of the stream (its clock is `seq + 1`, so 0 never
    /// appears). Operations naming unknown workers are ignored.
    pub fn apply<S: AsRef<str>>(&mut self, seq: u64, op: &Op<S>) {
        self.apply_walked(seq, op, None);
    }

    /// `apply` for the record of this VM's last decision: its insert starts where
    /// the decision's walk of the text ended (`crate::tree::Tree::insert_walked`,
    /// which checks that the walk is that tree's and still holds).
    pub fn apply_routed(&mut self, seq: u64, op: &Op) {
        let walked = self.walked.take();
        self.apply_walked(seq, op, walked);
    }

    fn apply_walked<S: AsRef<str>>(&mut self, seq: u64, op: &Op<S>, walked: Option<Walked>) {
        let clock = seq.saturating_add(1);
        self.clock = self.clock.max(clock);
        match op {
            Op::Insert {
                pool,
                model,
                worker,
                text,
            } => {
                if let Some(idx) = self.worker_index(*pool, worker.as_ref()) {
                    let text = Inserted::Routed(text.as_ref(), walked);
                    self.insert((*pool, model.as_ref()), text, idx, clock);
                }
            }
            Op::Forget {
                pool,
                model,
                worker,
                text,
                keep_chars,
                seq,
            } => {
                if let Some(idx) = self.worker_index(*pool, worker.as_ref()) {
                    let keep = usize::try_from(*keep_chars).unwrap_or(usize::MAX);
                    self.trees.forget(
                        (*pool, model.as_ref()),
                        text.as_ref(),
                        idx,
                        keep,
                        seq.saturating_add(1),
                    );
                }
            }
            Op::Evict => self.evict(),
            Op::KvBound {
                pool,
                worker,
                update,
            } => {
                if let Some(idx) = self.worker_index(*pool, worker.as_ref()) {
                    self.set_kv_bound(*pool, idx, update);
                }
            }
            Op::Membership(m) => {
                self.set_membership(m);
            }
        }
    }

    /// `apply` of operation `seq` as the ring holds it (`Incoming`), an insert's
    /// text checked as UTF-8 only past what the tree holds of it. `false`: not an
    /// operation, or an insert whose text is not UTF-8; nothing was applied.
    pub fn apply_encoded(&mut self, seq: u64, bytes: &[u8]) -> bool {
        match Incoming::decode(bytes) {
            Some(Incoming::Insert {
                pool,
                model,
                worker,
                text,
            }) => {
                let clock = seq.saturating_add(1);
                let inserted = match self.worker_index(pool, worker) {
                    Some(idx) => self
                        .insert((pool, model), Inserted::Replayed(text), idx, clock)
                        .is_some(),
                    None => true,
                };
                if inserted {
                    self.clock = self.clock.max(clock);
                }
                inserted
            }
            Some(Incoming::Other(op)) => {
                self.apply(seq, &op);
                true
            }
            None => false,
        }
    }

    /// Applies `op` as the next operation of this VM alone (no sharing).
    pub fn apply_local(&mut self, op: &Op) {
        self.apply(self.clock, op);
    }

    /// Records `text` under `worker`, which then holds no more than its engine
    /// can (`crate::request::kv_bounds`). `None`: another VM's text that is not
    /// UTF-8, and nothing changed.
    fn insert(
        &mut self,
        key: (Pool, &str),
        text: Inserted<'_>,
        worker: TenantId,
        clock: u64,
    ) -> Option<usize> {
        let workers = &self.cfg.workers;
        let declared = |m: &str| workers.iter().any(|w| w.models.iter().any(|d| d == m));
        let bounds = Bounds {
            max_models: self.cfg.max_models,
            max_total_chars: self.cfg.max_total_tree_chars,
            declared: &declared,
        };
        let chars = self.trees.insert(key, text, worker, clock, &bounds)?;
        if let Some(bound) = self.kv.get_mut(worker as usize) {
            bound.chars_since = bound.chars_since.saturating_add(chars as u64);
        }
        if let Some(max) = self.kv_max_chars(worker as usize) {
            if self.trees.tenant_chars(key.0, worker) > max {
                self.trees
                    .trim_tenant(key.0, worker, KvBound::trim_target(max));
            }
        }
        Some(chars)
    }

    /// Takes a bound the stream carries: an engine that restarted holds nothing
    /// (always: the tree's claims on an empty cache send its conversations to an
    /// engine that must prefill them all), and where the pool is bounded
    /// (`Config::bounds_kv`) the worker keeps no more than its engine can.
    fn set_kv_bound(&mut self, pool: Pool, worker: TenantId, update: &KvUpdate) {
        let at = worker as usize;
        if self.kv.len() <= at {
            self.kv.resize(at + 1, KvBound::default());
        }
        if let Some(bound) = self.kv.get_mut(at) {
            bound.set(update);
        }
        self.capacities_follow_bounds();
        if update.cleared {
            self.trees.remove_tenant(pool, worker);
        }
        if let Some(max) = self.kv_max_chars(at) {
            self.trees.trim_tenant(pool, worker, max);
        }
    }

    /// The chars worker `index`'s engine can hold, when the config bounds its pool
    /// by it (`Config::bounds_kv`) and the stream has said.
    pub fn kv_max_chars(&self, index: usize) -> Option<usize> {
        let pool = self.cfg.workers.get(index)?.pool;
        if !self.cfg.bounds_kv(pool) {
            return None;
        }
        self.kv.get(index)?.max_chars()
    }

    /// Periodic eviction (SMG's `eviction_interval`): every tenant down to
    /// `max_tree_size`, then all trees down to the VM budget.
    pub fn evict(&mut self) {
        self.trees
            .evict(self.cfg.max_tree_size, self.cfg.max_total_tree_chars);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn router(extra: &str) -> Router {
        let json = format!(
            r#"{{"workers":[{{"name":"a"}},{{"name":"b"}}],"kv_capacity_bound":true{extra}}}"#
        );
        Router::new(Config::from_json(json.as_bytes()).unwrap())
    }

    fn insert(worker: &str, text: &str) -> Op {
        Op::Insert {
            pool: Pool::Regular,
            model: "m".into(),
            worker: worker.into(),
            text: text.into(),
        }
    }

    /// A bound of `capacity` tokens at 1 char a token, anchored at `anchor`.
    fn bound(worker: &str, capacity: u64, anchor: u64, cleared: bool) -> Op {
        Op::KvBound {
            pool: Pool::Regular,
            worker: worker.into(),
            update: KvUpdate {
                capacity_tokens: capacity,
                chars_per_token_milli: 1000,
                anchor_tokens: anchor,
                anchor_ms: 0,
                cleared,
            },
        }
    }

    fn holds(r: &Router, worker: &str, text: &str) -> bool {
        let tree = r.tree(Pool::Regular, "m").unwrap();
        let idx = r.worker_index(Pool::Regular, worker).unwrap();
        tree.prefix_match(text).owners.contains(&idx)
            && tree.prefix_match(text).matched_chars == text.len()
    }

    #[test]
    fn an_engine_full_of_other_text_makes_its_worker_forget_the_oldest() {
        let mut r = router("");
        let texts: Vec<String> = (0..8)
            .map(|i| format!("conversation {i} ").repeat(10))
            .collect();
        let mut seq = 0;
        for t in &texts {
            r.apply(seq, &insert("a", t));
            r.apply(seq + 1, &insert("b", t));
            seq += 2;
        }
        let a_before = r.worker_tree_chars(0);
        // a's engine holds 4 of the 8 texts' worth.
        let each = texts[0].len();
        r.apply(seq, &bound("a", 4 * each as u64, 0, false));
        assert!(
            r.worker_tree_chars(0) <= 4 * each,
            "{} > {}",
            r.worker_tree_chars(0),
            4 * each
        );
        assert!(r.worker_tree_chars(0) < a_before);
        assert!(holds(&r, "a", &texts[7]), "the newest stays");
        assert!(!holds(&r, "a", &texts[0]), "the oldest goes");
        assert_eq!(r.worker_tree_chars(1), a_before, "b's engine said nothing");
        // Inserts past the bound trim to fifteen sixteenths of it, oldest first.
        let more = "a new conversation ".repeat(10);
        r.apply(seq + 1, &insert("a", &more));
        assert!(r.worker_tree_chars(0) <= KvBound::trim_target(4 * each).max(4 * each));
        assert!(holds(&r, "a", &more));
        let g = r.tree_gauges(0);
        assert_eq!(
            (g.kv_bound_chars, g.chars_per_token_milli),
            (4 * each as u64, 1000)
        );
        assert_eq!(g.tree_chars, r.worker_tree_chars(0) as u64);
    }

    #[test]
    fn the_bound_follows_the_pool_policy_unless_set_and_a_restart_clears_anyway() {
        // Unset: on where predicted_ttft routes (the default), off where
        // cache_aware does (SMG's decisions); set, as set.
        for (extra, bounded) in [
            ("", true),
            (r#","policy":"cache_aware""#, false),
            (r#","kv_capacity_bound":false"#, false),
            (r#","policy":"cache_aware","kv_capacity_bound":true"#, true),
        ] {
            let json = format!(r#"{{"workers":[{{"name":"a"}},{{"name":"b"}}]{extra}}}"#);
            let mut r = Router::new(Config::from_json(json.as_bytes()).unwrap());
            r.apply(0, &insert("a", &"x".repeat(100)));
            r.apply(1, &insert("b", &"y".repeat(100)));
            r.apply(2, &bound("a", 10, 0, false));
            r.apply(3, &bound("b", 10, 0, true));
            // Bounded: the text's first 10 chars, what an engine of 10 keeps.
            let (chars, gauge) = if bounded { (10, 10) } else { (100, 0) };
            assert_eq!(r.worker_tree_chars(0), chars, "{extra}");
            assert_eq!(r.tree_gauges(0).kv_bound_chars, gauge, "{extra}");
            assert_eq!(r.worker_tree_chars(1), 0, "b's engine restarted: {extra}");
        }
    }

    #[test]
    fn a_restarted_engine_leaves_its_worker_nothing() {
        let mut r = router("");
        r.apply(0, &insert("a", "some text"));
        r.apply(1, &insert("b", "some text"));
        r.apply(2, &bound("a", 1_000_000, 0, true));
        assert_eq!(r.worker_tree_chars(0), 0);
        assert_eq!(r.worker_tree_chars(1), 9);
    }

    #[test]
    fn chars_routed_since_the_bound_are_counted_replayed_or_not_until_a_new_anchor() {
        let mut r = router("");
        r.apply(0, &bound("a", 1000, 5, false));
        r.apply(1, &insert("a", "héllo"));
        assert!(r.apply_encoded(2, &insert("a", "héllo wörld").encode()));
        r.apply(3, &insert("b", "not a's"));
        assert_eq!(r.kv_bound(0).chars_since, 5 + 11);
        // The same anchor (a new capacity) keeps the window; a new one starts one.
        r.apply(4, &bound("a", 2000, 5, false));
        assert_eq!(r.kv_bound(0).chars_since, 16);
        r.apply(5, &bound("a", 2000, 9, false));
        assert_eq!(r.kv_bound(0).chars_since, 0);
    }

    #[test]
    fn bounds_follow_their_workers_by_name_through_a_new_list() {
        let mut r = router("");
        r.apply(0, &bound("b", 1000, 5, false));
        assert_eq!(r.kv_capacities, [0, 1000]);
        let json = br#"{"workers":[{"name":"c"},{"name":"b"},{"name":"a"}]}"#;
        r.reconfigure(Config::from_json(json).unwrap());
        assert_eq!(r.kv_bound(1).capacity_tokens, 1000);
        assert_eq!(r.kv_bound(2), KvBound::default());
        assert_eq!(r.kv_bound(0), KvBound::default());
        assert_eq!(r.kv_capacities, [0, 1000, 0], "the capacities follow");
    }

    #[test]
    fn a_step_names_the_worker_and_its_pool() {
        let r = router("");
        let (op, why) = r.kv_step(1, Some(4096), Some(10), 0).unwrap();
        assert_eq!(why, crate::request::kv_bounds::Share::Anchored);
        assert!(matches!(op, Op::KvBound { pool: Pool::Regular, ref worker, .. } if worker == "b"));
        assert_eq!(r.kv_step(1, None, Some(10), 0), None);
        assert_eq!(
            r.kv_step(7, Some(4096), Some(10), 0),
            None,
            "no such worker"
        );
    }
}
