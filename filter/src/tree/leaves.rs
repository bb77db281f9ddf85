//! Each tenant's conversations (its leaves in the tree), also kept in order of how
//! many it holds: a sampled fleet (`predicted_ttft`'s sample) draws the workers with
//! the fewest conversations, which the fleet rung prefers, without a pass over the
//! fleet. Drawn from the whole fleet instead, a sample of 16 out of 256 saw the
//! fewest only by chance, and conversations spread 8 to 16 a worker where the
//! whole fleet scored gave every worker 16.
//!
//! A count moves by one at a time (a conversation added or its leaf evicted), and
//! a move by one only swaps the tenant with the first or last of its block of
//! equal counts, so the order costs O(1) a change.

use super::{by_tenant, TenantId};

/// Leaves by tenant, and the tenants in order of their counts.
#[derive(Debug, Default)]
pub struct Leaves {
    /// By tenant id (ids are worker indices, so dense).
    count: Vec<usize>,
    /// Each tenant's position in `order`, by tenant id.
    at: Vec<usize>,
    /// Every tenant with a slot, fewest leaves first.
    order: Vec<TenantId>,
    /// `start[c]`: the first position in `order` of a tenant with `c` or more
    /// leaves; `order.len()` past the end. Always longer than the largest count.
    start: Vec<usize>,
}

/// Tenants with the same number of leaves, in no particular order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block<'a> {
    listed: &'a [TenantId],
    /// Tenants past the last slot (none of them ever held a leaf): the fewest
    /// block's, up to the fleet's size.
    unlisted: (usize, usize),
}

impl Block<'_> {
    pub fn len(&self) -> usize {
        self.listed.len() + (self.unlisted.1 - self.unlisted.0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The `i`th tenant of the block.
    pub fn get(&self, i: usize) -> Option<TenantId> {
        match self.listed.get(i) {
            Some(&t) => Some(t),
            None => {
                let t = self.unlisted.0 + (i - self.listed.len());
                (t < self.unlisted.1).then_some(t as TenantId)
            }
        }
    }
}

/// No leaves: the conversations of a model with no tree yet.
pub static NO_LEAVES: Leaves = Leaves {
    count: Vec::new(),
    at: Vec::new(),
    order: Vec::new(),
    start: Vec::new(),
};

impl Leaves {
    /// `tenant`'s leaves (0 past the last slot).
    pub fn get(&self, tenant: TenantId) -> usize {
        self.count.get(tenant as usize).copied().unwrap_or(0)
    }

    /// Leaves by tenant id (a tenant past the end holds none).
    pub fn as_slice(&self) -> &[usize] {
        &self.count
    }

    /// The tenants with a slot and no leaf.
    pub fn without(&self) -> &[TenantId] {
        self.order.get(..self.start_of(1)).unwrap_or_default()
    }

    /// One more leaf for `tenant`.
    pub fn add(&mut self, tenant: TenantId) {
        self.reach(tenant);
        let c = self.get(tenant);
        // The last of `tenant`'s block takes its place; it takes the last's and
        // so becomes the first of the next block.
        let last = self.start_of(c + 1).saturating_sub(1);
        self.swap(tenant, last);
        if self.start.len() < c + 3 {
            self.start.resize(c + 3, self.order.len());
        }
        if let Some(s) = self.start.get_mut(c + 1) {
            *s = last;
        }
        if let Some(n) = self.count.get_mut(tenant as usize) {
            *n = c + 1;
        }
    }

    /// One leaf fewer for `tenant` (none below zero).
    pub fn remove(&mut self, tenant: TenantId) {
        let c = self.get(tenant);
        if c == 0 {
            return;
        }
        // The first of `tenant`'s block takes its place; it takes the first's and
        // so becomes the last of the block before.
        let first = self.start_of(c);
        self.swap(tenant, first);
        if let Some(s) = self.start.get_mut(c) {
            *s = first + 1;
        }
        if let Some(n) = self.count.get_mut(tenant as usize) {
            *n = c - 1;
        }
    }

    /// `tenant` holds no leaf any more (it left the tree). One step a leaf it had.
    pub fn forget(&mut self, tenant: TenantId) {
        for _ in 0..self.get(tenant) {
            self.remove(tenant);
        }
    }

    /// The same counts under new tenant ids (`f`: old to new; `None` drops one).
    pub fn remapped(&self, f: impl Fn(TenantId) -> Option<TenantId>) -> Leaves {
        let mut count = Vec::new();
        for (t, &n) in (0..).zip(&self.count) {
            if let Some(slot) = f(t).and_then(|to| by_tenant(&mut count, to)) {
                *slot = n;
            }
        }
        Leaves::of(count)
    }

    /// The tenants by blocks of equal counts, fewest first, for a fleet of
    /// `tenants`: those past the last slot (who never held a leaf) join the first
    /// block.
    pub fn fewest_first(&self, tenants: usize) -> impl Iterator<Item = Block<'_>> {
        let unlisted = (self.order.len(), tenants.max(self.order.len()));
        let zero = Block {
            listed: self.order.get(..self.start_of(1)).unwrap_or_default(),
            unlisted,
        };
        let mut from = self.start_of(1);
        let rest = std::iter::from_fn(move || {
            let &first = self.order.get(from)?;
            let end = self.start_of(self.get(first) + 1);
            let listed = self.order.get(from..end)?;
            from = end;
            Some(Block {
                listed,
                unlisted: (0, 0),
            })
        });
        std::iter::once(zero).filter(|b| !b.is_empty()).chain(rest)
    }

    /// Counts by tenant id, ordered (rare: a new tenant, a remap).
    fn of(count: Vec<usize>) -> Leaves {
        let mut order: Vec<TenantId> = (0..count.len() as TenantId).collect();
        order.sort_by_key(|&t| count.get(t as usize).copied().unwrap_or(0));
        let mut at = vec![0; count.len()];
        for (p, &t) in order.iter().enumerate() {
            if let Some(a) = at.get_mut(t as usize) {
                *a = p;
            }
        }
        let most = count.iter().copied().max().unwrap_or(0);
        let mut start = vec![order.len(); most + 2];
        let mut next = 0;
        for (p, &t) in order.iter().enumerate() {
            let c = count.get(t as usize).copied().unwrap_or(0);
            while next <= c {
                if let Some(s) = start.get_mut(next) {
                    *s = p;
                }
                next += 1;
            }
        }
        Leaves {
            count,
            at,
            order,
            start,
        }
    }

    /// Gives `tenant` a slot (with no leaves) if it has none.
    fn reach(&mut self, tenant: TenantId) {
        let i = tenant as usize;
        if i < self.count.len() {
            return;
        }
        let mut count = std::mem::take(&mut self.count);
        count.resize(i + 1, 0);
        *self = Leaves::of(count);
    }

    fn start_of(&self, c: usize) -> usize {
        self.start.get(c).copied().unwrap_or(self.order.len())
    }

    /// Swaps `tenant` with whoever is at position `to` of the order.
    fn swap(&mut self, tenant: TenantId, to: usize) {
        let Some(&from) = self.at.get(tenant as usize) else {
            return;
        };
        let Some(&other) = self.order.get(to) else {
            return;
        };
        self.order.swap(from, to);
        if let Some(a) = self.at.get_mut(other as usize) {
            *a = from;
        }
        if let Some(a) = self.at.get_mut(tenant as usize) {
            *a = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Rng, SplitMix64};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The blocks as sorted lists of tenants.
    fn blocks(l: &Leaves, tenants: usize) -> Vec<Vec<TenantId>> {
        l.fewest_first(tenants)
            .map(|b| {
                let mut v: Vec<TenantId> = (0..b.len()).filter_map(|i| b.get(i)).collect();
                v.sort_unstable();
                v
            })
            .collect()
    }

    /// What `fewest_first` must give: tenants grouped by count, fewest first.
    fn expected(count: &[usize], tenants: usize) -> Vec<Vec<TenantId>> {
        let n = tenants.max(count.len());
        let of = |t: usize| count.get(t).copied().unwrap_or(0);
        let mut values: Vec<usize> = (0..n).map(of).collect();
        values.sort_unstable();
        values.dedup();
        values
            .into_iter()
            .map(|c| {
                (0..n)
                    .filter(|&t| of(t) == c)
                    .map(|t| t as TenantId)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn blocks_group_tenants_by_count_fewest_first() {
        let mut l = Leaves::default();
        for t in [3, 3, 3, 1, 1, 5] {
            l.add(t);
        }
        assert_eq!(l.as_slice(), &[0, 2, 0, 3, 0, 1]);
        assert_eq!(
            blocks(&l, 8),
            vec![vec![0, 2, 4, 6, 7], vec![5], vec![1], vec![3]],
            "6 and 7 never held a leaf: in the first block"
        );
        l.remove(3);
        l.remove(3);
        l.remove(5);
        l.remove(0);
        assert_eq!(l.as_slice(), &[0, 2, 0, 1, 0, 0]);
        assert_eq!(blocks(&l, 6), vec![vec![0, 2, 4, 5], vec![3], vec![1]]);
        l.forget(1);
        assert_eq!(blocks(&l, 6), vec![vec![0, 1, 2, 4, 5], vec![3]]);
        // A smaller fleet than the slots: every slot still shows.
        assert_eq!(blocks(&l, 2), vec![vec![0, 1, 2, 4, 5], vec![3]]);
        assert_eq!(l.get(9), 0);
    }

    #[test]
    fn random_changes_keep_the_order_exact() {
        let mut rng = SplitMix64(17);
        let mut l = Leaves::default();
        let mut count = vec![0usize; 40];
        for step in 0..20_000 {
            let t = rng.below(40);
            match rng.below(10) {
                0..=5 => {
                    l.add(t as TenantId);
                    count[t] += 1;
                }
                6..=8 => {
                    l.remove(t as TenantId);
                    count[t] = count[t].saturating_sub(1);
                }
                _ if step % 50 == 0 => {
                    l.forget(t as TenantId);
                    count[t] = 0;
                }
                _ => {}
            }
            let listed = l.as_slice().len();
            assert_eq!(l.as_slice(), &count[..listed], "step {step}");
            assert!(count[listed..].iter().all(|&c| c == 0));
            if step % 97 == 0 {
                assert_eq!(blocks(&l, 40), expected(&count, 40), "step {step}");
            }
        }
        assert_eq!(blocks(&l, 40), expected(&count, 40));
    }

    #[test]
    fn a_remap_keeps_each_count_under_its_new_id() {
        let mut l = Leaves::default();
        for t in [0, 1, 1, 2, 2, 2] {
            l.add(t);
        }
        // 0 leaves, 2 becomes 0, 1 becomes 4.
        let m = l.remapped(|t| match t {
            1 => Some(4),
            2 => Some(0),
            _ => None,
        });
        assert_eq!(m.as_slice(), &[3, 0, 0, 0, 2]);
        assert_eq!(blocks(&m, 5), vec![vec![1, 2, 3], vec![4], vec![0]]);
        let mut m = m;
        m.add(1);
        assert_eq!(blocks(&m, 5), vec![vec![2, 3], vec![1], vec![4], vec![0]]);
    }

    #[test]
    fn an_empty_index_is_one_block_of_the_whole_fleet() {
        let l = Leaves::default();
        assert_eq!(blocks(&l, 3), vec![vec![0, 1, 2]]);
        assert!(blocks(&l, 0).is_empty());
        let b = l.fewest_first(3).next().unwrap();
        assert_eq!((b.get(2), b.get(3)), (Some(2), None));
    }
}
