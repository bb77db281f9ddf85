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
    /// and keeping the char budget. `false`: another VM's text that is not UTF-8,
    /// and nothing changed.
    pub fn insert(
        &mut self,
        (pool, model): (Pool, &str),
        text: Inserted<'_>,
        worker: TenantId,
        clock: u64,
        bounds: &Bounds,
    ) -> bool {
        let known = self.trees.contains_key(&TreeKey(pool, model));
        let text = match text {
            // A new tree holds nothing to check the text against.
            Inserted::Replayed(bytes) if !known => match crate::scan::utf8(bytes) {
                Some(t) => Inserted::Routed(t, None),
                None => return false,
            },
            t => t,
        };
        if !known && self.trees.len() >= bounds.max_models {
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
        let tree = &mut entry.tree;
        let inserted = match text {
            Inserted::Routed(t, Some(w)) => {
                tree.insert_walked(t, worker, clock, w);
                true
            }
            Inserted::Routed(t, None) => {
                tree.insert(t, worker, clock);
                true
            }
            Inserted::Replayed(bytes) => tree.insert_bytes(bytes, worker, clock),
        };
        if inserted {
            entry.last_used = entry.last_used.max(clock);
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
