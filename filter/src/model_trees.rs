//! The prefix trees of one VM, one per (pool, model), and the two bounds on them:
//! how many models are kept (`max_models`) and how many chars all trees hold
//! together (`max_total_tree_chars`).
//!
//! Every VM applies the same operation stream with the same clocks, so every choice
//! here (which model's tree to drop, how far each tree shrinks) is a function of that
//! stream alone and the VMs' trees stay alike.

use hashbrown::HashMap;

use crate::config::Pool;
use crate::tree::{TenantId, Tree, Walked};

struct ModelTree {
    tree: Tree,
    last_used: u64,
}

/// A tree's key, `(pool, model)`, borrowed: looking a tree up on every request does
/// not build the `String` the map keeps. It hashes as the owned key does (a tuple
/// struct hashes its fields in order, as a tuple; `&str` as `String`).
#[derive(Hash)]
struct TreeKey<'a>(Pool, &'a str);

impl hashbrown::Equivalent<(Pool, String)> for TreeKey<'_> {
    fn equivalent(&self, key: &(Pool, String)) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

/// The owned key, built only when a new tree is stored.
impl From<&TreeKey<'_>> for (Pool, String) {
    fn from(key: &TreeKey<'_>) -> Self {
        (key.0, key.1.to_string())
    }
}

/// The limits an insert keeps the trees within.
pub struct Bounds<'a> {
    pub max_models: usize,
    pub max_total_chars: usize,
    /// Whether some worker declares the model: such trees outlive undeclared ones.
    pub declared: &'a dyn Fn(&str) -> bool,
}

#[derive(Default)]
pub struct ModelTrees {
    trees: HashMap<(Pool, String), ModelTree>,
    /// Trees made so far: each new one is numbered past the others (`Walked`).
    made: u64,
}

impl ModelTrees {
    pub fn get(&self, pool: Pool, model: &str) -> Option<&Tree> {
        self.trees.get(&TreeKey(pool, model)).map(|t| &t.tree)
    }

    fn get_mut(&mut self, pool: Pool, model: &str) -> Option<&mut Tree> {
        self.trees
            .get_mut(&TreeKey(pool, model))
            .map(|t| &mut t.tree)
    }

    /// Chars held by all trees.
    pub fn chars(&self) -> usize {
        self.trees.values().map(|t| t.tree.stored_chars()).sum()
    }

    /// Renames every tree's tenants (`None`: the tenant is removed).
    pub fn remap_tenants(&mut self, new_index: impl Fn(TenantId) -> Option<TenantId>) {
        for t in self.trees.values_mut() {
            t.tree.remap_tenants(&new_index);
        }
    }

    /// Records `text` under `worker` at `clock`, making room for a new model's tree
    /// and keeping the char budget; from where `walked` ended if it is that tree's
    /// walk of `text` (`Tree::insert_walked`).
    pub fn insert(
        &mut self,
        (pool, model): (Pool, &str),
        (text, walked): (&str, Option<Walked>),
        worker: TenantId,
        clock: u64,
        bounds: &Bounds,
    ) {
        if !self.trees.contains_key(&TreeKey(pool, model)) && self.trees.len() >= bounds.max_models
        {
            self.drop_least_worth(bounds.declared);
        }
        let entry = self
            .trees
            .entry_ref(&TreeKey(pool, model))
            .or_insert_with(|| {
                self.made += 1;
                ModelTree {
                    tree: Tree::with_id(self.made),
                    last_used: clock,
                }
            });
        entry.last_used = entry.last_used.max(clock);
        match walked {
            Some(w) => entry.tree.insert_walked(text, worker, clock, w),
            None => entry.tree.insert(text, worker, clock),
        }
        self.shrink_to_budget(bounds.max_total_chars);
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
            .min_by_key(|(k, t)| {
                (
                    declared(&k.1),
                    t.tree.stored_chars(),
                    t.last_used,
                    (*k).clone(),
                )
            })
            .map(|(k, _)| k.clone());
        if let Some(k) = victim {
            self.trees.remove(&k);
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
        for t in self.trees.values_mut() {
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
        for t in self.trees.values_mut() {
            let share = (t.tree.stored_chars() as u128 * target as u128 / total as u128) as usize;
            t.tree.evict_to_budget(share);
        }
    }
}
