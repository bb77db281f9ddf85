//! An approximate prefix cache index: a compressed character radix tree with many
//! tenants (workers) per node, as SGLang's model gateway (`cache_aware`) keeps it.
//!
//! The tree does not know what an engine really caches; it remembers which texts
//! were sent to which worker. A tenant on a node holds the whole path from the root
//! to that node, because `insert` marks every node it walks through. Eviction keeps
//! that invariant by removing a tenant only from its own leaves (nodes where no child
//! holds the tenant), oldest first.
//!
//! Parameters and units:
//! - text is compared by `char` and edges never split a UTF-8 sequence;
//! - sizes are counted in chars: a tenant's size is the sum of the edge lengths of
//!   the nodes it holds (SMG's `max_tree_size` is per tenant), and `stored_chars` is
//!   what the tree really holds in memory (every edge once), which the per-VM budget
//!   bounds;
//! - the clock is a caller-supplied `u64` (a sequence number, not wall time), so that
//!   every VM that applies the same operations with the same clocks evicts the same
//!   way;
//! - a tenant's leaves are its conversations: every text routed to it ends in one
//!   (a conversation's next turn extends its leaf instead of adding one), so the
//!   count says how much future work a worker has taken on, which `predicted_ttft`
//!   balances. Each hold keeps how many of the node's children the tenant also
//!   holds, so the count and the leaf test are O(1).
//!
//! Nodes live in an arena (`Vec`) with a free list: no `Rc`, no locking, which a
//! single-threaded Wasm VM does not need.

use crate::scan;
use children::Children;
use hashbrown::HashMap;
use tenants::Tenants;

mod children;
mod insert;
mod leaves;
mod prefix_match;
mod removal;
mod replay;
mod tenant_matches;
mod tenants;

pub use leaves::{Block, Leaves, NO_LEAVES};
pub use prefix_match::PrefixMatch;
pub use tenant_matches::{Holders, TenantMatches};

/// A worker's identity inside a tree. Stable for the life of the VM.
pub type TenantId = u32;

type NodeIdx = u32;

const ROOT: NodeIdx = 0;

#[derive(Debug, Default)]
struct Node {
    /// The edge label leading into this node (empty for the root).
    text: String,
    /// `text.chars().count()`, cached because sizes are accounted in chars.
    chars: usize,
    children: Children,
    /// Tenants holding this node, sorted by tenant: a vector beats a map, but a
    /// shared prompt's nodes hold every worker of a fleet, and each request's insert
    /// looked its worker up along them (a scan of 256 at 256 workers, the routed
    /// worker's and the matching tenants' lookups a few thousand V8 instructions a
    /// request). The first is kept inline (`Tenants`).
    tenants: Tenants,
    parent: NodeIdx,
    live: bool,
}

/// One tenant's hold on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold {
    tenant: TenantId,
    /// Children of the node the tenant holds too: 0 makes the node its leaf.
    children: u32,
    /// When the tenant last inserted through the node.
    clock: u64,
}

impl Node {
    fn tenant_pos(&self, tenant: TenantId) -> Option<usize> {
        self.tenant_search(tenant).ok()
    }

    /// Where `tenant` is among the node's tenants, or where it would go. Ids are
    /// worker indices, so a node every worker holds (a shared prompt's, which
    /// every insert touches) has each at its own id: one load, where a search of
    /// 256 took eight steps.
    fn tenant_search(&self, tenant: TenantId) -> Result<usize, usize> {
        let at = tenant as usize;
        if self.tenants.get(at).is_some_and(|h| h.tenant == tenant) {
            return Ok(at);
        }
        self.tenants.binary_search_by_key(&tenant, |h| h.tenant)
    }

    fn hold_mut(&mut self, tenant: TenantId) -> Option<&mut Hold> {
        let pos = self.tenant_pos(tenant)?;
        self.tenants.get_mut(pos)
    }
}

/// Where a prefix match's walk of a text ended (`Tree::prefix_walk`): the deepest
/// node whose whole edge the text matched and the bytes of the text its path
/// covers. An insert of the same text under the routed worker starts there
/// (`Tree::insert_walked`) instead of comparing the kilobytes a hit matched with
/// the same edges again. It holds while the tree is the one walked and no node has
/// been added, split or freed since.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Walked {
    tree: u64,
    edits: u64,
    node: NodeIdx,
    bytes: usize,
    /// The chars of those bytes.
    chars: usize,
    text_len: usize,
}

/// The radix tree for one (pool, model).
#[derive(Debug)]
pub struct Tree {
    /// Tells this tree's `Walked` from another's (`ModelTrees` numbers its trees).
    id: u64,
    /// Nodes added, split or freed so far: a `Walked` of an earlier count is stale.
    edits: u64,
    /// `insert_walked`'s path from the root, kept to spare an allocation a request.
    path: Vec<NodeIdx>,
    nodes: Vec<Node>,
    free: Vec<NodeIdx>,
    tenant_chars: HashMap<TenantId, usize>,
    /// Non-root nodes each tenant holds and none of whose children it holds, by
    /// tenant id (ids are worker indices, so dense): `predicted_ttft` reads every
    /// candidate's, and a map was a pass and a vector per request at 256 workers.
    tenant_leaves: Leaves,
    stored_chars: usize,
}

impl Default for Tree {
    fn default() -> Self {
        Self::new()
    }
}

/// Length in bytes of the longest common prefix of `node`'s edge and `text` that
/// ends on a char boundary of both, and its length in chars. An ASCII edge (its
/// cached char count is its length) needs neither the boundary nor the char count:
/// whatever of `text` equals part of it is whole ASCII chars, which spares every
/// walk a pass over the kilobytes it matched.
fn edge_prefix(node: &Node, text: &str) -> (usize, usize) {
    if node.chars == node.text.len() {
        let n = scan::common_len(node.text.as_bytes(), text.as_bytes());
        return (n, n);
    }
    common_prefix(&node.text, text)
}

/// Length in bytes of the longest common prefix of `a` and `b` that ends on a char
/// boundary of both, and its length in chars.
fn common_prefix(a: &str, b: &str) -> (usize, usize) {
    let mut n = scan::common_len(a.as_bytes(), b.as_bytes());
    while n > 0 && !(a.is_char_boundary(n) && b.is_char_boundary(n)) {
        n -= 1;
    }
    (n, char_len(a.get(..n).unwrap_or_default()))
}

/// `tenant`'s slot of a count kept dense by tenant id (ids are worker indices),
/// the vector grown with zeros to reach it.
fn by_tenant(counts: &mut Vec<usize>, tenant: TenantId) -> Option<&mut usize> {
    let i = tenant as usize;
    if i >= counts.len() {
        counts.resize(i + 1, 0);
    }
    counts.get_mut(i)
}

/// Chars in `s`, without decoding when it is ASCII (the common case, and a pass of
/// whole words rather than one per char).
pub(crate) fn char_len(s: &str) -> usize {
    if scan::is_ascii(s.as_bytes()) {
        s.len()
    } else {
        s.chars().count()
    }
}

impl Tree {
    pub fn new() -> Self {
        Self::with_id(0)
    }

    /// A tree whose walks no other tree's insert takes (`Walked`).
    pub fn with_id(id: u64) -> Self {
        Tree {
            id,
            edits: 0,
            path: Vec::new(),
            nodes: vec![Node {
                live: true,
                ..Node::default()
            }],
            free: Vec::new(),
            tenant_chars: HashMap::new(),
            tenant_leaves: Leaves::default(),
            stored_chars: 0,
        }
    }

    /// Chars held in memory (each edge counted once).
    pub fn stored_chars(&self) -> usize {
        self.stored_chars
    }

    /// Chars attributed to `tenant` (SMG's per-tenant tree size).
    pub fn tenant_chars(&self, tenant: TenantId) -> usize {
        self.tenant_chars.get(&tenant).copied().unwrap_or(0)
    }

    /// The conversations `tenant` holds: its leaves, the ends of the texts routed
    /// to it that no later text of it extends.
    pub fn tenant_leaves(&self, tenant: TenantId) -> usize {
        self.tenant_leaves.get(tenant)
    }

    /// `tenant_leaves` by tenant id (a tenant past the end holds none), and in
    /// order of the count.
    pub fn leaves(&self) -> &Leaves {
        &self.tenant_leaves
    }

    /// Tenants that hold anything, sorted.
    pub fn tenants(&self) -> Vec<TenantId> {
        let mut t: Vec<_> = self.tenant_chars.keys().copied().collect();
        t.sort_unstable();
        t
    }

    /// Live nodes, the root included.
    #[cfg(test)]
    pub fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn node(&self, idx: NodeIdx) -> &Node {
        &self.nodes[idx as usize]
    }

    fn node_mut(&mut self, idx: NodeIdx) -> &mut Node {
        &mut self.nodes[idx as usize]
    }

    fn alloc(&mut self, node: Node) -> NodeIdx {
        self.edits += 1;
        self.stored_chars += node.chars;
        if let Some(idx) = self.free.pop() {
            self.nodes[idx as usize] = node;
            idx
        } else {
            self.nodes.push(node);
            (self.nodes.len() - 1) as NodeIdx
        }
    }

    /// Marks `tenant` on `idx` at `clock`, accounting its chars when new there. The
    /// clock only moves forward, so inserts commute.
    /// `insert` touches a path top down, so the parent already holds the tenant and
    /// stops being its leaf when this node becomes one.
    fn touch(&mut self, idx: NodeIdx, tenant: TenantId, clock: u64) {
        let node = self.node_mut(idx);
        let at = match node.tenant_search(tenant) {
            Ok(pos) => {
                if let Some(hold) = node.tenants.get_mut(pos) {
                    hold.clock = hold.clock.max(clock);
                }
                return;
            }
            Err(at) => at,
        };
        node.tenants.insert(
            at,
            Hold {
                tenant,
                children: 0,
                clock,
            },
        );
        let (chars, parent) = (node.chars, node.parent);
        *self.tenant_chars.entry(tenant).or_insert(0) += chars;
        if idx == ROOT {
            return;
        }
        self.add_leaf(tenant);
        if let Some(hold) = self.node_mut(parent).hold_mut(tenant) {
            hold.children += 1;
            if hold.children == 1 && parent != ROOT {
                self.drop_leaf(tenant);
            }
        }
    }

    fn add_leaf(&mut self, tenant: TenantId) {
        self.tenant_leaves.add(tenant);
    }

    /// `tenant` holds no leaf any more (it left the tree).
    fn forget_leaves(&mut self, tenant: TenantId) {
        self.tenant_leaves.forget(tenant);
    }

    fn drop_leaf(&mut self, tenant: TenantId) {
        self.tenant_leaves.remove(tenant);
    }

    /// A walk of a text of `text_len` bytes that has not left the root yet.
    fn at_root(&self, text_len: usize) -> Walked {
        Walked {
            tree: self.id,
            edits: self.edits,
            node: ROOT,
            bytes: 0,
            chars: 0,
            text_len,
        }
    }

    /// Walks the path `text` matches from the root, calling `visit` with each node on
    /// it (its index and the node), the chars matched once that node is counted and
    /// whether its whole edge matched; returns the last node reached (the root when
    /// nothing matched), the chars matched in all, what of `text` is left, and where
    /// an insert of `text` may start (`Walked`: the deepest node whose whole edge
    /// matched).
    fn walk<'t>(
        &self,
        text: &'t str,
        mut visit: impl FnMut(NodeIdx, &Node, usize, bool),
    ) -> (NodeIdx, usize, &'t str, Walked) {
        let mut cur = ROOT;
        let mut matched = 0usize;
        let mut rest = text;
        let mut walked = self.at_root(text.len());
        while let Some(first) = rest.chars().next() {
            let Some(child) = self.node(cur).children.get(first) else {
                break;
            };
            let node = self.node(child);
            let (bytes, chars) = edge_prefix(node, rest);
            matched += chars;
            let whole = bytes == node.text.len();
            visit(child, node, matched, whole);
            cur = child;
            rest = rest.get(bytes..).unwrap_or_default();
            if !whole {
                break;
            }
            walked.node = child;
            walked.bytes = text.len() - rest.len();
            walked.chars = matched;
        }
        (cur, matched, rest, walked)
    }

    /// The longest prefix of `text` the tree holds and who holds it.
    pub fn prefix_match(&self, text: &str) -> PrefixMatch {
        self.prefix_walk(text).0
    }

    /// `prefix_match`, and where its walk ended for an insert of the same text.
    pub fn prefix_walk(&self, text: &str) -> (PrefixMatch, Walked) {
        let mut found = PrefixMatch::default();
        let walked = self.prefix_walk_into(text, &mut found);
        (found, walked)
    }

    /// `prefix_walk` into a match the caller keeps: its owners' list is refilled,
    /// not allocated again, on every request that walks a tree.
    pub fn prefix_walk_into(&self, text: &str, found: &mut PrefixMatch) -> Walked {
        let (last, matched, rest, walked) = self.walk(text, |_, _, _, _| {});
        found.refill(
            matched,
            // The walk counted the matched chars (an ASCII edge without a pass): only
            // the rest is counted here, not the kilobytes matched again.
            matched + char_len(rest),
            // Sorted, as a node keeps its tenants.
            self.node(last).tenants.iter().map(|h| h.tenant),
        );
        walked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Walks the whole tree and checks the invariants the rest of the code relies
    /// on: accounted sizes match, every tenant on a node holds its parent, no empty
    /// non-root node survives, children are keyed by their first char.
    fn check_invariants(t: &Tree) {
        let mut stored = 0;
        let mut per_tenant: HashMap<TenantId, usize> = HashMap::new();
        let mut leaves: HashMap<TenantId, usize> = HashMap::new();
        for (i, n) in t.nodes.iter().enumerate() {
            if !n.live {
                continue;
            }
            let idx = i as NodeIdx;
            assert_eq!(n.chars, n.text.chars().count(), "cached char count");
            assert!(
                n.tenants.windows(2).all(|w| w[0].tenant < w[1].tenant),
                "tenants sorted, each once"
            );
            stored += n.chars;
            for &Hold {
                tenant, children, ..
            } in n.tenants.iter()
            {
                *per_tenant.entry(tenant).or_default() += n.chars;
                let held_below = n
                    .children
                    .iter()
                    .filter(|&(_, c)| t.node(c).tenant_pos(tenant).is_some())
                    .count();
                assert_eq!(children as usize, held_below, "child count of {tenant}");
                if idx != ROOT && held_below == 0 {
                    *leaves.entry(tenant).or_default() += 1;
                }
                if idx != ROOT {
                    assert!(
                        t.node(n.parent).tenant_pos(tenant).is_some(),
                        "tenant {tenant} on a node must hold its parent"
                    );
                }
            }
            if idx != ROOT {
                assert!(
                    !n.tenants.is_empty() || !n.children.is_empty(),
                    "dead node kept"
                );
                assert!(!n.text.is_empty(), "empty edge");
            }
            for (c, child) in n.children.iter() {
                assert_eq!(t.node(child).text.chars().next(), Some(c), "child key");
                assert_eq!(t.node(child).parent, idx, "parent link");
            }
        }
        assert_eq!(stored, t.stored_chars(), "stored chars");
        for (tenant, chars) in per_tenant {
            assert_eq!(t.tenant_chars(tenant), chars, "tenant {tenant} size");
        }
        for (tenant, &n) in t.leaves().as_slice().iter().enumerate() {
            assert_eq!(
                leaves.get(&(tenant as TenantId)).copied().unwrap_or(0),
                n,
                "leaves of {tenant}"
            );
        }
        for (tenant, n) in leaves {
            assert_eq!(t.tenant_leaves(tenant), n, "leaves of {tenant}");
        }
    }

    /// Every live node as its path from the root and its holds, sorted: two trees
    /// with the same listing hold the same texts for the same tenants.
    fn listing(t: &Tree) -> Vec<(String, Vec<Hold>)> {
        let path = |mut idx: NodeIdx| {
            let mut parts = Vec::new();
            while idx != ROOT {
                parts.push(t.node(idx).text.as_str());
                idx = t.node(idx).parent;
            }
            parts.iter().rev().copied().collect::<String>()
        };
        let mut all: Vec<_> = (0..t.nodes.len() as NodeIdx)
            .filter(|&i| t.node(i).live)
            .map(|i| (path(i), t.node(i).tenants.to_vec()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    #[test]
    fn a_tenant_is_found_where_it_is_whether_or_not_the_node_holds_every_one() {
        let sets: [&[TenantId]; 6] = [&[0, 1, 2, 3], &[1, 2, 3], &[0, 2, 5], &[0, 1, 3], &[3], &[]];
        for held in sets {
            let node = Node {
                tenants: held
                    .iter()
                    .map(|&tenant| Hold {
                        tenant,
                        children: 0,
                        clock: 0,
                    })
                    .collect(),
                ..Node::default()
            };
            for t in 0..7 {
                assert_eq!(
                    node.tenant_search(t),
                    held.binary_search(&t),
                    "{t} in {held:?}"
                );
            }
        }
    }

    #[test]
    fn bytes_inserted_make_the_tree_the_text_makes() {
        let texts = [
            "system prompt|alice hello",
            "system prompt|bob hi",
            "system",
            "",
            "système élevé",
            "systèmes",
            "syst\u{e8}me",
            "日本語のプロンプト",
            "日本人",
            "日本語のプロンプト and more",
            "\u{1f600} emoji first",
            "\u{1f601} emoji second",
            "system prompt|alice hello again",
        ];
        let (mut by_text, mut by_bytes) = (Tree::new(), Tree::new());
        for (i, text) in texts.iter().enumerate() {
            let (tenant, clock) = (i as TenantId % 3, i as u64 + 1);
            // Either way counts the text's chars, held or new.
            assert_eq!(by_text.insert(text, tenant, clock), text.chars().count());
            assert_eq!(
                by_bytes.insert_bytes(text.as_bytes(), tenant, clock),
                Some(text.chars().count()),
                "{text}"
            );
            check_invariants(&by_bytes);
            assert_eq!(listing(&by_bytes), listing(&by_text), "after {text:?}");
            assert_eq!(by_bytes.stored_chars(), by_text.stored_chars());
            assert_eq!(by_bytes.leaves().as_slice(), by_text.leaves().as_slice());
        }
        for tenant in 0..3 {
            assert_eq!(by_bytes.tenant_chars(tenant), by_text.tenant_chars(tenant));
        }
    }

    #[test]
    fn bytes_that_are_not_utf8_leave_the_tree_as_it_was() {
        let mut t = Tree::new();
        t.insert("system prompt|alice hello", 0, 1);
        t.insert("système", 1, 2);
        let before = (listing(&t), t.edits, t.stored_chars());
        let mut cases: Vec<Vec<u8>> = vec![
            // Past the held path, inside an edge, and where nothing is held.
            b"system prompt|alice hello\xff".to_vec(),
            b"system prompt|al\xffice".to_vec(),
            b"\xffsystem".to_vec(),
            // A lone continuation byte, a cut char, an overlong encoding.
            b"\x80".to_vec(),
            b"syst\xc3".to_vec(),
            b"system prompt|\xc0\xaf".to_vec(),
            // A surrogate's encoding, and a char past U+10FFFF.
            b"\xed\xa0\x80".to_vec(),
            b"\xf4\x90\x80\x80".to_vec(),
        ];
        // A stray byte right after a multi-byte char an edge holds.
        let mut stray = "systè".as_bytes().to_vec();
        stray.push(0xa8);
        cases.push(stray);
        for bytes in &cases {
            assert_eq!(t.insert_bytes(bytes, 2, 3), None, "{bytes:?}");
            assert_eq!(
                (listing(&t), t.edits, t.stored_chars()),
                before,
                "{bytes:?}"
            );
        }
        assert_eq!(t.insert_bytes("système élevé".as_bytes(), 2, 3), Some(13));
        assert_eq!(t.tenant_depth("système élevé", 2), 13);
    }

    #[test]
    fn empty_tree_matches_nothing() {
        let t = Tree::new();
        let m = t.prefix_match("hello");
        assert_eq!(m.matched_chars, 0);
        assert_eq!(m.input_chars, 5);
        assert_eq!(m.match_rate(), 0.0);
    }

    #[test]
    fn tenant_matches_give_each_tenant_its_own_depth() {
        let mut t = Tree::new();
        t.insert("system prompt|alice hello", 0, 1);
        t.insert("system prompt|bob hi", 1, 2);
        t.insert("system", 2, 3);
        t.insert("other", 3, 4);
        let m = t.tenant_matches("system prompt|alice hello again");
        assert_eq!(
            m.depths(&t),
            vec![(0, 25), (1, 14), (2, 6)],
            "alice's worker holds all of her history, bob's the shared prompt, w2 a part; w3 nothing"
        );
        let deepest = t.prefix_match("system prompt|alice hello again");
        assert_eq!(deepest.matched_chars, 25);
        assert_eq!(deepest.owners, vec![0]);
        // Where each walk ended aside (the root, for both).
        let mut none = Tree::new().tenant_matches("x");
        assert_eq!((none.text_chars, none.walked.node), (1, ROOT));
        (none.text_chars, none.walked) = (0, Walked::default());
        assert_eq!(none, TenantMatches::default());
        let mut empty = t.tenant_matches("");
        assert_eq!(empty.walked.node, ROOT);
        empty.walked = Walked::default();
        assert_eq!(
            empty,
            TenantMatches::default(),
            "an empty text matches nothing"
        );
        // A match ending inside an edge counts the chars up to the divergence.
        assert_eq!(
            t.tenant_matches("systXm").depths(&t),
            vec![(0, 4), (1, 4), (2, 4)]
        );
        // Multi-byte chars are counted as chars.
        let mut u = Tree::new();
        u.insert("héllo wörld", 5, 1);
        assert_eq!(u.tenant_matches("héllo wörlx").depths(&u), vec![(5, 10)]);
    }

    #[test]
    fn tenant_matches_refilled_are_what_a_fresh_walk_gives() {
        // One table refilled across trees of different fleets and texts (as the
        // router keeps it from request to request) reads as a new one each time.
        let mut small = Tree::new();
        small.insert("system prompt|alice hello", 0, 1);
        small.insert("system prompt|bob hi", 1, 2);
        let mut large = Tree::new();
        for w in 0..300 {
            large.insert(&format!("system prompt|user {w}"), w, u64::from(w) + 1);
        }
        large.insert("other prompt", 7, 400);
        let mut kept = TenantMatches::default();
        for (tree, text) in [
            (&large, "system prompt|user 42 and more"),
            (&small, "system prompt|alice hello again"),
            (&large, "other prompt, longer"),
            (&small, "nothing alike"),
            (&large, "system prompt|user 299"),
            (&small, ""),
        ] {
            tree.tenant_matches_into(text, &mut kept);
            assert_eq!(kept, tree.tenant_matches(text), "{text}");
        }
        kept.clear();
        assert_eq!(kept, TenantMatches::default());
    }

    #[test]
    fn the_holders_of_a_match_near_the_longest_are_one_nodes_tenants() {
        let mut t = Tree::new();
        t.insert("system prompt|alice hello", 0, 1);
        t.insert("system prompt|bob hi", 1, 2);
        t.insert("system prompt|alice hello", 4, 3);
        t.insert("system", 2, 4);
        t.insert("system prompt|carl", 5, 5);
        let holders = |text: &str, margin: usize| {
            let h = t.holders_within(&t.tenant_matches(text), margin);
            let mut v: Vec<_> = h.iter().collect();
            v.sort_unstable();
            v
        };
        assert_eq!(holders("system prompt|alice hello again", 0), vec![0, 4]);
        assert_eq!(
            holders("system prompt|carol", 0),
            vec![5],
            "\"|car\" is carl's alone"
        );
        assert_eq!(
            holders("system prompt|carol", 3),
            vec![0, 1, 4, 5],
            "within 3 chars of it, the shared prompt's"
        );
        assert_eq!(
            holders("system prompt|alice hello again", 12),
            vec![0, 1, 4, 5],
            "alice's 12 chars past the prompt"
        );
        assert_eq!(
            holders("systXm", 0),
            vec![0, 1, 2, 4, 5],
            "a match ending inside an edge"
        );
        assert!(holders("systXm", 4).is_empty(), "no longer than the margin");
        assert!(
            holders("nothing alike", 0).is_empty(),
            "no match, no holders"
        );
        assert_eq!(
            t.holders_within(&TenantMatches::default(), 0).iter().len(),
            0
        );
    }

    #[test]
    fn each_tenants_match_is_its_own_walk_and_is_looked_up_by_id() {
        // 300 tenants over shared prompts: every tenant's depth is what walking the
        // tree for it alone says, and the lookups find it.
        let mut t = Tree::new();
        for i in 0..300u32 {
            let text = format!("system {}|user {}|turn {}", i % 3, i % 40, i);
            t.insert(&text, (i * 7) % 300, u64::from(i));
        }
        let probes = [
            "system 1|user 4|turn 44",
            "system 2|user 9",
            "system 0|",
            "x",
        ];
        let check = |t: &Tree| {
            for probe in probes {
                let m = t.tenant_matches(probe);
                for tenant in 0..310u32 {
                    assert_eq!(
                        m.depth(tenant, t.tenant_leaves(tenant)),
                        t.tenant_depth(probe, tenant),
                        "{probe} {tenant}"
                    );
                    assert_eq!(m.continues(tenant), m.continued.contains(&tenant));
                }
            }
        };
        check(&t);
        // Tenants that left keep their slots without leaves: the shared prompt's
        // node still holds every tenant with one, and they hold none of it.
        t.remove_tenant(7);
        t.remove_tenant(140);
        assert_eq!(t.leaves().without().len(), 2);
        check(&t);
        let m = t.tenant_matches("system 2|user 4|turn 44 and more");
        assert!(
            m.continues((44 * 7) % 300),
            "turn 44's worker holds the leaf it extends"
        );
    }

    #[test]
    fn a_next_turn_continues_its_leaf_and_a_new_conversation_continues_nobody() {
        let mut t = Tree::new();
        t.insert("system|alice", 0, 1);
        t.insert("system|bob", 1, 2);
        let next = t.tenant_matches("system|alice|reply|again");
        assert_eq!(
            next.continued,
            vec![0],
            "alice's next turn extends her text"
        );
        assert_eq!(next.depths(&t), vec![(0, 12), (1, 7)]);
        let new = t.tenant_matches("system|carol");
        assert!(
            new.continued.is_empty(),
            "the shared prompt is extended by others"
        );
        assert!(
            t.tenant_matches("system|ali").continued.is_empty(),
            "a match ending inside a text continues nothing"
        );
        assert_eq!(
            t.tenant_matches("system|alice").continued,
            vec![0],
            "the same text again"
        );
        // Both workers hold alice's text (she moved once): both are continued.
        t.insert("system|alice", 1, 3);
        assert_eq!(t.tenant_matches("system|alice|x").continued, vec![0, 1]);
        // Once a later text extends her leaf, the old end is not a leaf any more.
        t.insert("system|alice|reply|again", 0, 4);
        assert_eq!(
            t.tenant_matches("system|alice|y").continued,
            Vec::<TenantId>::new()
        );
    }

    #[test]
    fn leaves_count_each_tenants_conversations() {
        let mut t = Tree::new();
        t.insert("system|alice", 0, 1);
        t.insert("system|bob", 0, 2);
        t.insert("system|alice|again", 0, 3);
        t.insert("system|carol", 1, 4);
        assert_eq!(
            t.tenant_leaves(0),
            2,
            "alice and bob; alice's turns are one"
        );
        assert_eq!(t.tenant_leaves(1), 1);
        assert_eq!(t.tenant_leaves(7), 0);
        t.insert("system", 2, 5);
        assert_eq!(
            t.tenant_leaves(2),
            1,
            "a prefix of others' texts is this tenant's leaf"
        );
        t.evict_tenants_over(0);
        assert_eq!((t.tenant_leaves(0), t.tenant_leaves(1)), (0, 0));
        check_invariants(&t);
    }

    #[test]
    fn empty_input_has_zero_rate() {
        let mut t = Tree::new();
        t.insert("abc", 1, 1);
        assert_eq!(t.prefix_match("").match_rate(), 0.0);
    }

    #[test]
    fn exact_and_partial_matches_report_owner() {
        let mut t = Tree::new();
        t.insert("hello world", 1, 1);
        let m = t.prefix_match("hello world");
        assert_eq!((m.matched_chars, m.owners.clone()), (11, vec![1]));
        let m = t.prefix_match("hello there");
        assert_eq!(m.matched_chars, 6, "common prefix 'hello '");
        assert_eq!(m.owners, vec![1]);
        assert_eq!(t.prefix_match("help").matched_chars, 3);
        check_invariants(&t);
    }

    #[test]
    fn split_keeps_both_tenants_on_the_shared_prefix() {
        let mut t = Tree::new();
        t.insert("system prompt A: question one", 1, 1);
        t.insert("system prompt B: question two", 2, 2);
        let shared = t.prefix_match("system prompt C");
        assert_eq!(shared.matched_chars, 14);
        assert_eq!(shared.owners, vec![1, 2], "both hold the shared prefix");
        let a = t.prefix_match("system prompt A: question one and more");
        assert_eq!(a.owners, vec![1]);
        assert_eq!(a.matched_chars, 29);
        assert_eq!(t.stored_chars(), 14 + 15 + 15);
        assert_eq!(t.tenant_chars(1), 29);
        assert_eq!(t.tenant_chars(2), 29);
        check_invariants(&t);
    }

    #[test]
    fn reinsert_is_idempotent_in_size() {
        let mut t = Tree::new();
        t.insert("abcdef", 1, 1);
        t.insert("abcdef", 1, 2);
        t.insert("abc", 1, 3);
        assert_eq!(t.tenant_chars(1), 6);
        assert_eq!(t.stored_chars(), 6);
        check_invariants(&t);
    }

    #[test]
    fn multibyte_text_never_splits_a_char() {
        let mut t = Tree::new();
        // 'é' (C3 A9) and 'ê' (C3 AA) share their first byte.
        t.insert("café au lait", 1, 1);
        t.insert("cafê noir", 2, 2);
        let m = t.prefix_match("café au lait");
        assert_eq!(m.matched_chars, 12);
        assert_eq!(m.owners, vec![1]);
        let m = t.prefix_match("cafê");
        assert_eq!(m.matched_chars, 4);
        assert_eq!(m.owners, vec![2]);
        assert_eq!(t.prefix_match("caf").matched_chars, 3);
        t.insert("日本語のテキスト", 3, 3);
        t.insert("日本人", 4, 4);
        let m = t.prefix_match("日本語");
        assert_eq!((m.matched_chars, m.input_chars), (3, 3));
        assert_eq!(t.prefix_match("日本").owners, vec![3, 4]);
        t.insert("🦀🦀🦀", 5, 5);
        t.insert("🦀🦐", 6, 6);
        assert_eq!(t.prefix_match("🦀🦀").matched_chars, 2);
        check_invariants(&t);
    }

    #[test]
    fn an_edges_prefix_is_the_common_prefix_whether_or_not_it_is_ascii() {
        let texts = [
            "",
            "abc",
            "abé",
            "ab",
            "日本語",
            "日本",
            "a日",
            "abcdefghij",
            "abcdefgh日",
        ];
        for edge in texts {
            let node = Node {
                text: edge.to_string(),
                chars: edge.chars().count(),
                ..Node::default()
            };
            for text in texts {
                assert_eq!(
                    edge_prefix(&node, text),
                    common_prefix(edge, text),
                    "{edge:?} / {text:?}"
                );
            }
        }
    }

    #[test]
    fn common_prefix_backs_off_to_char_boundary() {
        assert_eq!(common_prefix("é", "ê"), (0, 0));
        assert_eq!(common_prefix("aé", "aê"), (1, 1));
        assert_eq!(common_prefix("日本語", "日本人"), (6, 2));
        assert_eq!(common_prefix("abc", "abc"), (3, 3));
        assert_eq!(common_prefix("", "abc"), (0, 0));
    }

    #[test]
    fn remove_tenant_drops_only_its_nodes() {
        let mut t = Tree::new();
        t.insert("shared prefix then one", 1, 1);
        t.insert("shared prefix then two", 2, 2);
        t.remove_tenant(1);
        assert_eq!(t.tenant_chars(1), 0);
        let m = t.prefix_match("shared prefix then one");
        assert_eq!(m.owners, vec![2], "only worker 2 is left on the path");
        assert_eq!(m.matched_chars, 19);
        assert_eq!(t.stored_chars(), 22, "worker 1's branch freed");
        check_invariants(&t);
        t.remove_tenant(2);
        assert_eq!(t.stored_chars(), 0);
        assert_eq!(t.node_count(), 1);
    }

    #[test]
    fn eviction_trims_tenant_oldest_leaf_first() {
        let mut t = Tree::new();
        t.insert("aaaa-old", 1, 1);
        t.insert("aaaa-new", 1, 2);
        t.insert("bbbb", 2, 3);
        assert_eq!(t.tenant_chars(1), 11, "'aaaa-' + 'old' + 'new'");
        t.evict_tenants_over(9);
        assert_eq!(t.tenant_chars(1), 8, "the older leaf '-old' went");
        assert_eq!(t.prefix_match("aaaa-new").matched_chars, 8);
        assert_eq!(t.prefix_match("aaaa-old").matched_chars, 5);
        assert_eq!(t.tenant_chars(2), 4, "other tenants untouched");
        check_invariants(&t);
        t.evict_tenants_over(4);
        assert_eq!(t.tenant_chars(1), 0, "'new' then 'aaaa-' went");
        assert_eq!(t.tenants(), vec![2]);
        assert_eq!(
            t.prefix_match("zzz").owners,
            vec![2],
            "root no longer lists 1"
        );
        check_invariants(&t);
    }

    #[test]
    fn a_trim_takes_the_oldest_leaves_and_only_the_tail_of_the_last() {
        let mut t = Tree::new();
        let doc = "d".repeat(40);
        t.insert(&format!("{doc}-old question"), 1, 1);
        t.insert("another document", 1, 2);
        t.insert(&format!("{doc}-old question"), 2, 3);
        // 53 + 16 chars; keep 50: the older text loses its last 19 chars.
        t.trim_tenant_to(1, 50);
        assert_eq!(t.tenant_chars(1), 50);
        assert_eq!(t.tenant_depth(&format!("{doc}-old question"), 1), 34);
        assert_eq!(t.tenant_depth("another document", 1), 16, "newer: whole");
        assert_eq!(t.tenant_leaves(1), 2, "both texts still held in part");
        assert_eq!(
            t.tenant_depth(&format!("{doc}-old question"), 2),
            53,
            "another tenant keeps the whole text"
        );
        check_invariants(&t);
        // Past the older text: it goes whole, then the newer one's tail.
        t.trim_tenant_to(1, 10);
        assert_eq!(t.tenant_chars(1), 10);
        assert_eq!(t.tenant_depth(&doc, 1), 0);
        assert_eq!(t.tenant_depth("another document", 1), 10);
        check_invariants(&t);
        t.trim_tenant_to(1, 0);
        assert_eq!(t.tenants(), vec![2]);
        check_invariants(&t);
    }

    #[test]
    fn eviction_never_leaves_a_tenant_below_without_above() {
        let mut t = Tree::new();
        t.insert("root-a-leaf1", 1, 5);
        t.insert("root-a-leaf2", 1, 1);
        t.insert("root-b", 1, 3);
        for limit in (0..16).rev() {
            t.evict_tenants_over(limit);
            assert!(t.tenant_chars(1) <= limit);
            check_invariants(&t);
        }
    }

    #[test]
    fn budget_eviction_frees_memory_lru_across_tenants() {
        let mut t = Tree::new();
        t.insert("xxxxxxxxxx", 1, 1);
        t.insert("yyyyyyyyyy", 2, 2);
        t.insert("zzzzzzzzzz", 3, 3);
        t.evict_to_budget(20);
        assert_eq!(t.stored_chars(), 20);
        assert_eq!(t.prefix_match("xxxxxxxxxx").matched_chars, 0, "oldest gone");
        assert_eq!(t.prefix_match("zzzzzzzzzz").matched_chars, 10);
        check_invariants(&t);
    }

    #[test]
    fn shared_node_survives_until_every_tenant_left() {
        let mut t = Tree::new();
        t.insert("same text", 1, 1);
        t.insert("same text", 2, 2);
        t.insert("other", 3, 3);
        t.evict_tenants_over(0);
        assert_eq!(t.stored_chars(), 0, "every tenant trimmed to nothing");
        t.insert("same text", 1, 4);
        t.insert("same text", 2, 5);
        t.insert("other", 3, 6);
        // Budget 6: tenant 1's claim (oldest) goes first, but the node stays for 2;
        // then 2's claim goes and the node with it, which is enough.
        t.evict_to_budget(6);
        assert_eq!(t.stored_chars(), 5);
        assert_eq!(t.prefix_match("other").owners, vec![3]);
        t.evict_to_budget(0);
        assert_eq!(t.stored_chars(), 0);
        check_invariants(&t);
    }

    #[test]
    fn clocks_only_move_forward_so_inserts_commute() {
        let mut a = Tree::new();
        a.insert("shared text", 1, 5);
        a.insert("shared text", 1, 3);
        let mut b = Tree::new();
        b.insert("shared text", 1, 3);
        b.insert("shared text", 1, 5);
        a.insert("zz", 2, 4);
        b.insert("zz", 2, 4);
        // Eviction order depends on clocks; equal trees evict equally.
        a.evict_to_budget(11);
        b.evict_to_budget(11);
        assert_eq!(a.prefix_match("shared text"), b.prefix_match("shared text"));
        assert_eq!(
            a.prefix_match("shared text").matched_chars,
            11,
            "clock 5 kept, zz (4) went"
        );
    }

    #[test]
    fn remap_renames_and_drops_tenants() {
        let mut t = Tree::new();
        t.insert("common then a", 0, 1);
        t.insert("common then b", 1, 2);
        t.insert("common then c", 2, 3);
        // Worker 1 left; 0 and 2 swapped places.
        t.remap_tenants(|old| match old {
            0 => Some(2),
            2 => Some(0),
            _ => None,
        });
        assert_eq!(t.prefix_match("common then a").owners, vec![2]);
        assert_eq!(t.prefix_match("common then c").owners, vec![0]);
        assert_eq!(
            t.prefix_match("common then b").matched_chars,
            12,
            "b's leaf freed"
        );
        assert_eq!(t.tenant_chars(1), 0);
        check_invariants(&t);
    }

    #[test]
    fn forget_undoes_what_the_insert_added_and_nothing_else() {
        let mut t = Tree::new();
        t.insert("system prompt, then question one", 0, 1);
        t.insert("system prompt, then question one", 1, 2);
        let before = t.tenant_chars(0);
        // Worker 0 held the first turn; a request extending it fails.
        let held = "system prompt, then question one".len();
        let text = "system prompt, then question one and two";
        let keep = t.tenant_depth(text, 0);
        assert_eq!(keep, held);
        t.insert(text, 0, 3);
        assert_eq!(t.prefix_match(text).owners, vec![0]);
        t.forget(text, 0, keep, 3);
        check_invariants(&t);
        assert_eq!(t.tenant_depth(text, 0), keep, "what it held before stays");
        assert_eq!(t.tenant_chars(0), before);
        assert_eq!(
            t.prefix_match(text).matched_chars,
            held,
            "the failed request's own text is gone from the tree"
        );
        assert_eq!(
            t.prefix_match("system prompt, then question one").owners,
            vec![0, 1]
        );
        // A worker that held nothing of it loses all of it, root included.
        let keep = t.tenant_depth("fresh text", 2);
        t.insert("fresh text", 2, 4);
        t.forget("fresh text", 2, keep, 4);
        check_invariants(&t);
        assert_eq!(t.prefix_match("fresh text").matched_chars, 0);
        assert!(!t.tenants().contains(&2), "tenant 2 holds nothing");
    }

    #[test]
    fn forget_keeps_what_a_later_insert_touched() {
        let mut t = Tree::new();
        let text = "a conversation retried";
        t.insert(text, 0, 1);
        // The retry of the same text on the same worker succeeds (clock 2); the
        // first attempt's failure is undone after it.
        t.insert(text, 0, 2);
        t.forget(text, 0, 0, 1);
        check_invariants(&t);
        assert_eq!(
            t.prefix_match(text).owners,
            vec![0],
            "the retry's entry stays"
        );
        // An insert applied ahead of its ring place, at an earlier clock than the
        // one its forget names, is undone all the same.
        t.insert("applied ahead", 2, 2);
        t.forget("applied ahead", 2, 0, 5);
        check_invariants(&t);
        assert_eq!(t.tenant_depth("applied ahead", 2), 0);
        // A later, longer text through the same nodes keeps them too.
        t.insert("shared start, then x", 1, 3);
        t.insert("shared start, then x and more", 1, 4);
        t.forget("shared start, then x", 1, 0, 3);
        check_invariants(&t);
        assert_eq!(
            t.tenant_depth("shared start, then x and more", 1),
            29,
            "nodes a later insert passed through are kept"
        );
    }

    /// Up to `below` chars of `alphabet`, drawn by `rng`.
    fn random_text(rng: &mut crate::rng::SplitMix64, alphabet: &[char], below: usize) -> String {
        use crate::rng::Rng;
        (0..rng.below(below))
            .map(|_| alphabet[rng.below(alphabet.len())])
            .collect()
    }

    /// Property test: random inserts, removals and evictions over a small alphabet
    /// (with multi-byte chars) keep the invariants, and a just-inserted text always
    /// matches whole under its tenant.
    #[test]
    fn random_operations_keep_invariants() {
        use crate::rng::{Rng, SplitMix64};
        let alphabet = ['a', 'b', 'é', '語', '🦀'];
        let mut rng = SplitMix64(7);
        for round in 0..40 {
            let mut t = Tree::new();
            for clock in 0..60u64 {
                let text = random_text(&mut rng, &alphabet, 12);
                let tenant = rng.below(4) as TenantId;
                match rng.below(14) {
                    0 => t.remove_tenant(tenant),
                    1 if rng.below(2) == 0 => t.evict_tenants_over(rng.below(20)),
                    1 => t.trim_tenant_to(tenant, rng.below(20)),
                    2 => t.evict_to_budget(rng.below(40)),
                    3 => t.remap_tenants(|old| match old {
                        0 => Some(1),
                        1 => Some(0),
                        3 => None,
                        other => Some(other),
                    }),
                    4 => {
                        // An insert whose request failed, undone at once or later.
                        let keep = t.tenant_depth(&text, tenant);
                        t.insert(&text, tenant, clock);
                        if rng.below(2) == 0 {
                            t.forget(&text, tenant, keep, clock);
                            assert!(
                                t.tenant_depth(&text, tenant) == keep,
                                "round {round}: undone back to what it held"
                            );
                        }
                    }
                    5 => t.forget(&text, tenant, rng.below(6), rng.below(60) as u64),
                    6 => {
                        // Matched in part or not at all, the text is counted whole.
                        let p = t.prefix_match(&text);
                        assert_eq!(p.input_chars, text.chars().count(), "round {round}");
                        assert!(p.matched_chars <= p.input_chars, "round {round}");
                        let m = t.tenant_matches(&text);
                        assert_eq!(m.text_chars, p.input_chars, "round {round}");
                        for tenant in 0..4 {
                            assert_eq!(
                                m.depth(tenant, t.tenant_leaves(tenant)),
                                t.tenant_depth(&text, tenant),
                                "round {round}: tenant {tenant}'s depth is its own walk's"
                            );
                        }
                    }
                    _ => {
                        t.insert(&text, tenant, clock);
                        let m = t.prefix_match(&text);
                        assert_eq!(m.matched_chars, m.input_chars, "round {round}: whole match");
                        if !text.is_empty() {
                            assert!(m.owners.contains(&tenant), "round {round}: owner");
                        }
                    }
                }
                check_invariants(&t);
            }
        }
    }

    /// A tree's nodes (path from the root and holds), stored chars and each of
    /// four tenants' chars and leaves.
    type Holdings = (
        Vec<(String, Vec<Hold>)>,
        usize,
        Vec<(TenantId, usize, usize)>,
    );

    /// Everything a tree holds, in an order of its own (children by first char):
    /// two trees that hold the same have the same.
    fn holdings(t: &Tree) -> Holdings {
        let mut nodes = Vec::new();
        let mut stack = vec![(ROOT, String::new())];
        while let Some((idx, path)) = stack.pop() {
            let node = t.node(idx);
            let path = path + &node.text;
            nodes.push((path.clone(), node.tenants.to_vec()));
            let mut children: Vec<_> = node.children.iter().collect();
            children.sort();
            stack.extend(children.into_iter().map(|(_, c)| (c, path.clone())));
        }
        let tenants = (0..4)
            .map(|x| (x, t.tenant_chars(x), t.tenant_leaves(x)))
            .collect();
        (nodes, t.stored_chars(), tenants)
    }

    #[test]
    fn an_insert_from_its_walk_holds_what_a_whole_insert_does() {
        use crate::rng::{Rng, SplitMix64};
        let alphabet = ['a', 'b', 'é', '語'];
        let mut rng = SplitMix64(11);
        let (mut fresh, mut stale) = (0, 0);
        for round in 0..40 {
            // `whole` inserts from the root, `walked` from its own walk of the text,
            // taken before another operation half of the time.
            let (mut whole, mut walked) = (Tree::new(), Tree::with_id(1));
            for clock in 0..60u64 {
                let text = random_text(&mut rng, &alphabet, 10);
                let tenant = rng.below(4) as TenantId;
                let (found, w) = walked.prefix_walk(&text);
                assert_eq!(found, walked.prefix_match(&text));
                assert_eq!(walked.tenant_matches(&text).walked, w, "one walk, one end");
                if rng.below(2) == 0 {
                    let other = random_text(&mut rng, &alphabet, 10);
                    let t = rng.below(4) as TenantId;
                    let op = rng.below(4);
                    for tree in [&mut whole, &mut walked] {
                        match op {
                            0 => tree.evict_to_budget(30),
                            1 => tree.forget(&other, t, 1, clock),
                            _ => {
                                tree.insert(&other, t, clock);
                            }
                        }
                    }
                }
                if w.edits == walked.edits {
                    fresh += 1;
                } else {
                    stale += 1;
                }
                let chars = text.chars().count();
                assert_eq!(whole.insert(&text, tenant, clock), chars);
                assert_eq!(walked.insert_walked(&text, tenant, clock, w), chars);
                check_invariants(&walked);
                assert_eq!(
                    holdings(&whole),
                    holdings(&walked),
                    "round {round}, clock {clock}"
                );
            }
        }
        assert!(
            fresh > 500 && stale > 200,
            "{fresh} fresh walks, {stale} stale"
        );
    }

    #[test]
    fn a_kept_match_refilled_by_a_walk_is_what_a_fresh_walk_finds() {
        let mut t = Tree::with_id(1);
        t.insert("system prompt, first question", 0, 1);
        t.insert("system prompt, first question", 2, 2);
        t.insert("system prompt, second question", 1, 3);
        let mut kept = PrefixMatch::default();
        // Two owners, then one, then a text the tree shares nothing with: each walk
        // leaves no trace of the last.
        for (text, owners) in [
            ("system prompt, first question and more", 2),
            ("system prompt, second question", 1),
            ("another prompt", 3),
        ] {
            let walked = t.prefix_walk_into(text, &mut kept);
            let (fresh, fresh_walked) = t.prefix_walk(text);
            assert_eq!(kept, fresh, "{text}");
            assert_eq!(walked, fresh_walked, "{text}");
            assert_eq!(kept.owners.len(), owners, "{text}");
        }
        assert_eq!(kept.matched_chars, 0);
    }

    #[test]
    fn a_walk_of_another_tree_or_text_is_not_taken() {
        let mut a = Tree::with_id(1);
        let mut b = Tree::with_id(2);
        for t in [&mut a, &mut b] {
            t.insert("system prompt, first question", 0, 1);
        }
        let (_, walked) = a.prefix_walk("system prompt, first question and more");
        // Another tree: its own walk is taken instead.
        b.insert_walked("system prompt, first question and more", 1, 2, walked);
        assert_eq!(
            b.tenant_depth("system prompt, first question and more", 1),
            38
        );
        // Another text of this tree: inserted from the root.
        a.insert_walked("system prompt, second question", 1, 2, walked);
        check_invariants(&a);
        assert_eq!(a.tenant_depth("system prompt, second question", 1), 30);
        assert_eq!(a.tenant_depth("system prompt, first question", 1), 15);
    }
}
