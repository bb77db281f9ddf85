//! How tenants leave the tree's nodes: eviction (per tenant and to the per-VM
//! budget, least recently used leaves first), undoing one insert (`forget`),
//! dropping a tenant and renaming tenants. Every path keeps the invariants the
//! lookups rely on: a tenant on a node holds its parent, each hold counts the
//! children the tenant holds too, and no node survives without tenants or children.

use super::{Hold, Node, NodeIdx, TenantId, Tree, ROOT};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

impl Tree {
    /// Undoes the insert of `text` under `tenant` at `clock` for a request no
    /// worker served: `tenant` leaves the nodes of the path past its first
    /// `keep_chars` chars (what it held before that insert) that no later insert of
    /// it touched (their clock for it is not past `clock`; the VM that recorded the
    /// insert applied it ahead of its ring place, at an earlier clock:
    /// `crate::shared::Outbox`). A later insert through a node passed through its
    /// ancestors too, so the tenant keeps a whole path, and nodes left without
    /// tenants go. Nodes the path only partly covers (the tree changed since) are
    /// kept.
    pub fn forget(&mut self, text: &str, tenant: TenantId, keep_chars: usize, clock: u64) {
        let mut path = Vec::new();
        self.walk(text, |idx, node, matched, whole| {
            // A whole edge: `matched` counts all of it, so the path before it held
            // `matched - node.chars` chars. A partly covered node is kept.
            if whole && matched.saturating_sub(node.chars) >= keep_chars {
                path.push(idx);
            }
        });
        // Deepest first: a node is freed after its children.
        for idx in path.into_iter().rev() {
            let Some(hold) = self.node(idx).tenants.iter().find(|h| h.tenant == tenant) else {
                continue;
            };
            if hold.clock > clock || hold.children > 0 {
                break;
            }
            self.evict_leaf(idx, tenant);
        }
        if self.tenant_chars.get(&tenant) == Some(&0) {
            self.tenant_chars.remove(&tenant);
            self.forget_leaves(tenant);
            self.node_mut(ROOT).tenants.retain(|h| h.tenant != tenant);
        }
    }

    /// Removes `tenant` from every node; nodes left without tenants go.
    pub fn remove_tenant(&mut self, tenant: TenantId) {
        self.forget_leaves(tenant);
        if self.tenant_chars.remove(&tenant).is_none() {
            return;
        }
        let holders: Vec<NodeIdx> = (0..self.nodes.len() as NodeIdx)
            .filter(|&i| self.node(i).live && self.node(i).tenant_pos(tenant).is_some())
            .collect();
        for idx in holders.iter().copied() {
            let node = self.node_mut(idx);
            if let Some(pos) = node.tenant_pos(tenant) {
                node.tenants.remove(pos);
            }
        }
        // Deepest first, so a parent is freed after its children.
        let mut by_depth: Vec<(usize, NodeIdx)> =
            holders.into_iter().map(|i| (self.depth(i), i)).collect();
        by_depth.sort_unstable_by(|a, b| b.cmp(a));
        for (_, idx) in by_depth {
            self.free_if_unused(idx);
        }
    }

    /// Renames tenants (`f(old)`), dropping those `f` maps to `None`, for a worker
    /// list that changed order or membership. Two old tenants must not map to one.
    pub fn remap_tenants(&mut self, f: impl Fn(TenantId) -> Option<TenantId>) {
        let mut emptied = Vec::new();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            if !node.live {
                continue;
            }
            let before = node.tenants.len();
            node.tenants = node
                .tenants
                .iter()
                .filter_map(|h| f(h.tenant).map(|tenant| Hold { tenant, ..*h }))
                .collect();
            node.tenants.sort_unstable_by_key(|h| h.tenant);
            if node.tenants.len() < before {
                emptied.push(i as NodeIdx);
            }
        }
        self.tenant_chars = self
            .tenant_chars
            .iter()
            .filter_map(|(&t, &c)| f(t).map(|n| (n, c)))
            .collect();
        self.tenant_leaves = self.tenant_leaves.remapped(&f);
        let mut by_depth: Vec<(usize, NodeIdx)> =
            emptied.into_iter().map(|i| (self.depth(i), i)).collect();
        by_depth.sort_unstable_by(|a, b| b.cmp(a));
        for (_, idx) in by_depth {
            self.free_if_unused(idx);
        }
    }

    fn depth(&self, mut idx: NodeIdx) -> usize {
        let mut d = 0;
        while idx != ROOT {
            idx = self.node(idx).parent;
            d += 1;
        }
        d
    }

    /// Frees a non-root node that no tenant holds and that has no children.
    fn free_if_unused(&mut self, idx: NodeIdx) -> bool {
        let node = self.node(idx);
        if idx == ROOT || !node.live || !node.tenants.is_empty() || !node.children.is_empty() {
            return false;
        }
        let parent = node.parent;
        let first = node.text.chars().next().unwrap_or_default();
        self.stored_chars -= node.chars;
        self.edits += 1;
        self.node_mut(parent).children.remove(first);
        self.nodes[idx as usize] = Node::default();
        self.free.push(idx);
        true
    }

    /// Whether `tenant` holds `idx` but none of its children (an evictable leaf).
    fn is_tenant_leaf(&self, idx: NodeIdx, tenant: TenantId) -> bool {
        idx != ROOT
            && self
                .node(idx)
                .tenants
                .iter()
                .any(|h| h.tenant == tenant && h.children == 0)
    }

    /// Removes `tenant` from leaf `idx`; returns the parent if it became a leaf of the
    /// tenant in turn.
    fn evict_leaf(&mut self, idx: NodeIdx, tenant: TenantId) -> Option<NodeIdx> {
        let node = self.node_mut(idx);
        let pos = node.tenant_pos(tenant)?;
        node.tenants.remove(pos);
        let chars = node.chars;
        let parent = node.parent;
        if let Some(total) = self.tenant_chars.get_mut(&tenant) {
            *total = total.saturating_sub(chars);
        }
        self.drop_leaf(tenant);
        self.free_if_unused(idx);
        let hold = self.node_mut(parent).hold_mut(tenant)?;
        hold.children = hold.children.saturating_sub(1);
        if hold.children > 0 || parent == ROOT {
            return None;
        }
        self.add_leaf(tenant);
        Some(parent)
    }

    fn leaves_heap(&self, only: Option<TenantId>) -> BinaryHeap<Reverse<(u64, TenantId, NodeIdx)>> {
        let mut heap = BinaryHeap::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let idx = i as NodeIdx;
            if !node.live || idx == ROOT {
                continue;
            }
            for h in node.tenants.iter() {
                if only.is_none_or(|t| t == h.tenant) && h.children == 0 {
                    heap.push(Reverse((h.clock, h.tenant, idx)));
                }
            }
        }
        heap
    }

    /// Pops leaves oldest first (ties by tenant, then node) until `done` says stop;
    /// with `keep` (a heap of one tenant's leaves, and the chars that tenant may
    /// keep), its last leaf loses only its tail past them (`trim_tenant_to`).
    fn evict_oldest(
        &mut self,
        mut heap: BinaryHeap<Reverse<(u64, TenantId, NodeIdx)>>,
        done: impl Fn(&Tree) -> bool,
        keep: Option<usize>,
    ) {
        while !done(self) {
            let Some(Reverse((_, tenant, mut idx))) = heap.pop() else {
                break;
            };
            let still_there = self.node(idx).live && self.is_tenant_leaf(idx, tenant);
            if !still_there {
                continue;
            }
            if let Some(keep) = keep {
                idx = self.cut_tail(idx, self.tenant_chars(tenant).saturating_sub(keep));
            }
            if let Some(parent) = self.evict_leaf(idx, tenant) {
                let clock = self
                    .node(parent)
                    .tenants
                    .iter()
                    .find(|h| h.tenant == tenant)
                    .map_or(0, |h| h.clock);
                heap.push(Reverse((clock, tenant, parent)));
            }
        }
        // A tenant trimmed to nothing no longer holds the root either.
        let gone: Vec<TenantId> = self
            .tenant_chars
            .iter()
            .filter(|(_, &c)| c == 0)
            .map(|(&t, _)| t)
            .collect();
        self.node_mut(ROOT)
            .tenants
            .retain(|h| !gone.contains(&h.tenant));
        self.tenant_chars.retain(|_, c| *c > 0);
        for tenant in gone {
            self.forget_leaves(tenant);
        }
    }

    /// SMG's `evict_tenant_by_size`: trims every tenant to at most `max_chars`, least
    /// recently used leaves first.
    pub fn evict_tenants_over(&mut self, max_chars: usize) {
        let mut over: Vec<TenantId> = self
            .tenant_chars
            .iter()
            .filter(|(_, &c)| c > max_chars)
            .map(|(&t, _)| t)
            .collect();
        over.sort_unstable();
        for tenant in over {
            self.evict_tenant_to(tenant, max_chars, false);
        }
    }

    /// Trims `tenant` to `max_chars`, as its engine evicts (`crate::request::kv_bounds`):
    /// least recently used leaves first, and of the last one only the tail past
    /// `max_chars`. An engine frees a prompt's blocks tail first and keeps the
    /// head, which its next request still reads: dropped whole, a 12,000-char
    /// document the engine mostly held looked cold, and its next question went
    /// to an engine that prefilled it all again.
    pub fn trim_tenant_to(&mut self, tenant: TenantId, max_chars: usize) {
        self.evict_tenant_to(tenant, max_chars, true);
    }

    /// Evicts `tenant`'s least recently used leaves until it holds at most
    /// `max_chars`; with `tails`, of the last one only the tail past them.
    fn evict_tenant_to(&mut self, tenant: TenantId, max_chars: usize, tails: bool) {
        if self.tenant_chars(tenant) <= max_chars {
            return;
        }
        let heap = self.leaves_heap(Some(tenant));
        self.evict_oldest(
            heap,
            |t| t.tenant_chars(tenant) <= max_chars,
            tails.then_some(max_chars),
        );
    }

    /// Cuts `tenant`'s leaf `idx` so that its last `over` chars are a node of their
    /// own (a leaf no longer than that is left whole); returns the leaf to evict.
    fn cut_tail(&mut self, idx: NodeIdx, over: usize) -> NodeIdx {
        let node = self.node(idx);
        if over == 0 || over >= node.chars {
            return idx;
        }
        let keep_chars = node.chars - over;
        let Some((keep_bytes, _)) = node.text.char_indices().nth(keep_chars) else {
            return idx;
        };
        // `split` keeps `idx` as the tail, below a new node holding the head.
        self.split(idx, keep_bytes, keep_chars);
        idx
    }

    /// Trims the whole tree to at most `max_stored` chars in memory, least recently
    /// used leaves of any tenant first. This is the per-VM budget SMG lacks: its
    /// per-tenant limit times a fleet does not fit a 1 GiB Wasm VM.
    pub fn evict_to_budget(&mut self, max_stored: usize) {
        if self.stored_chars <= max_stored {
            return;
        }
        let heap = self.leaves_heap(None);
        self.evict_oldest(heap, |t| t.stored_chars <= max_stored, None);
    }
}
