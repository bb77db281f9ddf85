//! The prefix trees of one VM, one per (pool, model), and the two bounds on them:
//! how many models are kept (`max_models`) and how many chars all trees hold
//! together (`max_total_tree_chars`).
//!
//! Every VM applies the same operation stream with the same clocks, so every choice
//! here (which model's tree to drop, how far each tree shrinks) is a function of that
//! stream alone and the VMs' trees stay alike.

use std::cell::Cell;

use hashbrown::HashMap;

use crate::config::Pool;
use crate::tree::{TenantId, Tree, Walked};

struct ModelTree {
    key: (Pool, String),
    tree: Tree,
    last_used: u64,
}

impl ModelTree {
    /// Records `text` under `worker` at `clock` (see `ModelTrees::insert`).
    fn insert(&mut self, text: Inserted<'_>, worker: TenantId, clock: u64) -> Option<usize> {
        let tree = &mut self.tree;
        let chars = match text {
            Inserted::Routed(t, Some(w)) => tree.insert_walked(t, worker, clock, w),
            Inserted::Routed(t, None) => tree.insert(t, worker, clock),
            Inserted::Replayed(bytes) => tree.insert_bytes(bytes, worker, clock)?,
        };
        self.last_used = self.last_used.max(clock);
        Some(chars)
    }
}

/// A tree's key, `(pool, model)`, borrowed: looking a tree up does not build the
/// `String` the map keeps. It hashes as the owned key does (a tuple
/// struct hashes its fields in order, as a tuple; `&str` as `String`).
#[derive(Hash)]
struct TreeKey<'a>(Pool, &'a str);

impl hashbrown::Equivalent<(Pool, String)> for TreeKey<'_> {
    fn equivalent(&self, key: &(Pool, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

/// The text an insert records.
pub enum Inserted<'a> {
    /// This VM's decision's, and where its walk of the tree ended, if it walked
    /// one (`Tree::insert_walked`).
    Routed(&'a str, Option<Walked>),
    /// Another VM's, as the ring holds it: checked as UTF-8 only past what the
    /// tree holds of it (`Tree::insert_bytes`).
    Replayed(&'a [u8]),
}

/// The limits an insert keeps the trees within.
pub struct Bounds<'a> {
    pub max_models: usize,
    pub max_total_chars: usize,
    /// Whether some worker declares the model: such trees outlive undeclared ones.
    pub declared: &'a dyn Fn(&str) -> bool,
}

/// The trees, found by key through a map of their places, and the one found last
/// compared first: a request looks its model's tree up twice (to decide, then to
/// record), and nearly every request names the model the one before it named. A
/// hash of the name is 128-bit arithmetic, which wasm32 does in calls (about 0.2k
/// of V8's instructions a lookup); comparing it with the last is a few.
#[derive(Default)]
pub struct ModelTrees {
    trees: Vec<ModelTree>,
    places: HashMap<(Pool, String), usize>,
    /// Where the last lookup found its tree (checked by key before use).
    last: Cell<usize>,
    /// Trees made so far: each new one is numbered past the others (`Walked`).
    made: u64,
}

impl ModelTrees {
    /// The place of `(pool, model)`'s tree.
    fn place(&self, pool: Pool, model: &str) -> Option<usize> {
        let last = self.last.get();
        if self
            .trees
            .get(last)
            .is_some_and(|t| t.key.0 == pool && t.key.1 == model)
        {
            return Some(last);
        }
        let place = *self.places.get(&TreeKey(pool, model))?;
        self.last.set(place);
        Some(place)
    }

    pub fn get(&self, pool: Pool, model: &str) -> Option<&Tree> {
        let place = self.place(pool, model)?;
        self.trees.get(place).map(|t| &t.tree)
    }

    fn get_mut(&mut self, pool: Pool, model: &str) -> Option<&mut Tree> {
        let place = self.place(pool, model)?;
        self.trees.get_mut(place).map(|t| &mut t.tree)
    }

    /// Chars held by all trees.
    pub fn chars(&self) -> usize {
        self.trees.iter().map(|t| t.tree.stored_chars()).sum()
    }

    /// Chars `worker` holds in the trees of `pool`.
    pub fn tenant_chars(&self, pool: Pool, worker: TenantId) -> usize {
        self.of_pool(pool)
            .map(|t| t.tree.tenant_chars(worker))
            .sum()
    }

    /// Trims `worker` in the trees of `pool` to `max_chars` in all, each tree in
    /// proportion to what the worker holds there, least recently used leaves first.
    pub fn trim_tenant(&mut self, pool: Pool, worker: TenantId, max_chars: usize) {
        let held = self.tenant_chars(pool, worker);
        if held <= max_chars {
            return;
        }
        for t in self.trees.iter_mut().filter(|t| t.key.0 == pool) {
            let here = t.tree.tenant_chars(worker);
            let share = (here as u128 * max_chars as u128 / held as u128) as usize;
            t.tree.trim_tenant_to(worker, share);
        }
    }

    /// Removes `worker` from the trees of `pool`.
    pub fn remove_tenant(&mut self, pool: Pool, worker: TenantId) {
        for t in self.trees.iter_mut().filter(|t| t.key.0 == pool) {
            t.tree.remove_tenant(worker);
        }
    }

    fn of_pool(&self, pool: Pool) -> impl Iterator<Item = &ModelTree> {
        self.trees.iter().filter(move |t| t.key.0 == pool)
    }

    /// Renames every tree's tenants (`None`: the tenant is removed).
    pub fn remap_tenants(&mut self, new_index: impl Fn(TenantId) -> Option<TenantId>) {
        for t in &mut self.trees {
            t.tree.remap_tenants(&new_index);
        }
    }

    /// Records `text` under `worker` at `clock`, making room for a new model's tree
    /// and keeping the char budget; the text's length in chars. `None`: another
    /// VM's text that is not UTF-8, and nothing changed.
    pub fn insert(
        &mut self,
        (pool, model): (Pool, &str),
        text: Inserted<'_>,
        worker: TenantId,
        clock: u64,
        bounds: &Bounds,
    ) -> Option<usize> {
        let known = self.place(pool, model);
        let inserted = match known.and_then(|place| self.trees.get_mut(place)) {
            Some(entry) => entry.insert(text, worker, clock),
            None => {
                let text = match text {
                    // A new tree holds nothing to check the text against.
                    Inserted::Replayed(bytes) => Inserted::Routed(crate::scan::utf8(bytes)?, None),
                    t => t,
                };
                if self.trees.len() >= bounds.max_models {
                    self.drop_least_worth(bounds.declared);
                }
                self.made += 1;
                let key = (pool, model.to_string());
                self.places.insert(key.clone(), self.trees.len());
                let mut entry = ModelTree {
                    key,
                    tree: Tree::with_id(self.made),
                    last_used: clock,
                };
                let inserted = entry.insert(text, worker, clock);
                self.trees.push(entry);
                inserted
            }
        };
        if inserted.is_some() {
            self.shrink_to_budget(bounds.max_total_chars);
        }
        inserted
    }

    /// Drops the tree worth least: one of a model no worker declares before a
    /// declared one, then the one holding the fewest chars, then the least recently
    /// used. So a stream of junk `model` names churns among its own one-request trees
    /// and never evicts the trees of real traffic; a real new model grows out of
    /// their reach with its traffic.
    fn drop_least_worth(&mut self, declared: &dyn Fn(&str) -> bool) {
        let victim = self
            .trees
            .iter()
            .enumerate()
            .min_by_key(|(_, t)| {
                (
                    declared(&t.key.1),
                    t.tree.stored_chars(),
                    t.last_used,
                    &t.key,
                )
            })
            .map(|(place, _)| place);
        if let Some(place) = victim {
            let gone = self.trees.swap_remove(place);
            self.places.remove(&gone.key);
            // The last tree moved into the place.
            if let Some(moved) = self.trees.get(place) {
                self.places.insert(moved.key.clone(), place);
            }
        }
    }

    /// Takes `worker`'s claim on `text` back beyond its first `keep_chars` chars
    /// (`Tree::forget`).
    pub fn forget(
        &mut self,
        (pool, model): (Pool, &str),
        text: &str,
        worker: TenantId,
        keep_chars: usize,
        clock: u64,
    ) {
        if let Some(t) = self.get_mut(pool, model) {
            t.forget(text, worker, keep_chars, clock);
        }
    }

    /// Periodic eviction (SMG's `eviction_interval`): every tenant down to
    /// `per_tenant` chars, then all trees down to the budget.
    pub fn evict(&mut self, per_tenant: usize, max_total_chars: usize) {
        for t in &mut self.trees {
            t.tree.evict_tenants_over(per_tenant);
        }
        self.shrink_to_budget(max_total_chars);
    }

    /// Shrinks every tree in proportion until the total fits the budget, to 90% of
    /// it so that inserts do not trigger an eviction each.
    fn shrink_to_budget(&mut self, budget: usize) {
        let total = self.chars();
        if total <= budget {
            return;
        }
        let target = budget - budget / 10;
        for t in &mut self.trees {
            let share = (t.tree.stored_chars() as u128 * target as u128 / total as u128) as usize;
            t.tree.evict_to_budget(share);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_tree_is_found_at_its_place_through_drops_and_alternating_lookups() {
        let declared = |m: &str| m.starts_with("real");
        let bounds = Bounds {
            max_models: 5,
            max_total_chars: 1 << 20,
            declared: &declared,
        };
        let mut trees = ModelTrees::default();
        let mut state = 11u64;
        for step in 0..2000u64 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (state >> 33) % 9;
            let pool = [Pool::Regular, Pool::Decode][(n % 2) as usize];
            let model = if n < 3 {
                format!("real{n}")
            } else {
                format!("junk{n}")
            };
            // Each tree holds only texts naming its own key.
            let text = format!("{pool:?}/{model}/{step}");
            let inserted = trees.insert(
                (pool, &model),
                Inserted::Routed(&text, None),
                0,
                step,
                &bounds,
            );
            assert_eq!(inserted, Some(text.len()));
            assert!(trees.trees.len() <= 5);
            assert_eq!(trees.places.len(), trees.trees.len());
            for (place, t) in trees.trees.iter().enumerate() {
                assert_eq!(trees.places.get(&t.key), Some(&place), "step {step}");
                let prefix = format!("{:?}/{}/", t.key.0, t.key.1);
                let found = trees.get(t.key.0, &t.key.1).unwrap();
                assert!(found.prefix_match(&prefix).matched_chars == prefix.len());
            }
            assert!(
                trees.get(pool, &model).is_some(),
                "the tree just inserted into"
            );
        }
        // Declared models' trees outlived the junk.
        for n in 0..3u64 {
            let pool = [Pool::Regular, Pool::Decode][(n % 2) as usize];
            assert!(trees.get(pool, &format!("real{n}")).is_some());
        }
        assert!(trees.get(Pool::Prefill, "real0").is_none());
    }
}
