//! Recording a text under a tenant: the walk down the edges it matches, the split
//! of the edge where it leaves one, and its new leaf.

use super::children::Children;
use super::{char_len, edge_prefix, Hold, Node, NodeIdx, TenantId, Tenants, Tree, Walked, ROOT};

impl Tree {
    /// Splits `child` so that its first `split_bytes` bytes become a new parent node,
    /// which inherits the child's tenants (sizes per tenant are unchanged).
    pub(super) fn split(
        &mut self,
        child: NodeIdx,
        split_bytes: usize,
        split_chars: usize,
    ) -> NodeIdx {
        self.edits += 1;
        let (parent, head, tail, tenants, first) = {
            let c = self.node(child);
            // `split_bytes` is a char boundary (`common_prefix`); never the fallback.
            let (head, tail) = c
                .text
                .split_at_checked(split_bytes)
                .unwrap_or((c.text.as_str(), ""));
            let (head, tail) = (head.to_string(), tail.to_string());
            let first = head.chars().next().unwrap_or_default();
            // Every tenant of the child holds the child below the new parent.
            let tenants = c
                .tenants
                .iter()
                .map(|h| Hold { children: 1, ..*h })
                .collect::<Tenants>();
            (c.parent, head, tail, tenants, first)
        };
        let tail_first = tail.chars().next().unwrap_or_default();
        let total = self.node(child).chars;
        // The split does not change stored chars: the edge is cut in two.
        self.stored_chars -= total;
        let mid = self.alloc(Node {
            text: head,
            chars: split_chars,
            children: Children::None,
            tenants,
            parent,
            live: true,
        });
        self.stored_chars += total - split_chars;
        {
            let c = self.node_mut(child);
            c.text = tail;
            c.chars = total - split_chars;
            c.parent = mid;
        }
        self.node_mut(mid).children.insert(tail_first, child);
        self.node_mut(parent).children.insert(first, mid);
        mid
    }

    /// Records that `text` was routed to `tenant` at `clock`; its length in chars,
    /// counted on the way down (what its engine was sent, for
    /// `crate::request::kv_bounds`).
    pub fn insert(&mut self, text: &str, tenant: TenantId, clock: u64) -> usize {
        self.touch(ROOT, tenant, clock);
        self.insert_below(ROOT, text, tenant, clock)
    }

    /// `insert`, starting where `walked` (this tree's walk of `text`, if nothing
    /// changed since) ended: the path down to there is touched top down, as
    /// `insert` touches it, without comparing its edges with the text again.
    /// Anything else is a plain `insert`. The text's length in chars, as `insert`.
    pub fn insert_walked(
        &mut self,
        text: &str,
        tenant: TenantId,
        clock: u64,
        walked: Walked,
    ) -> usize {
        let fresh =
            walked.tree == self.id && walked.edits == self.edits && walked.text_len == text.len();
        let rest = text.get(walked.bytes..).filter(|_| fresh);
        let Some(rest) = rest else {
            return self.insert(text, tenant, clock);
        };
        let mut path = std::mem::take(&mut self.path);
        path.clear();
        let mut at = walked.node;
        // Bounded by the node count, whatever the parents say.
        while at != ROOT && path.len() < self.nodes.len() {
            path.push(at);
            at = self.node(at).parent;
        }
        self.touch(ROOT, tenant, clock);
        for &idx in path.iter().rev() {
            self.touch(idx, tenant, clock);
        }
        self.path = path;
        walked.chars + self.insert_below(walked.node, rest, tenant, clock)
    }

    /// The part of an insert below `cur`, whose path `tenant` holds already: `rest`
    /// of the text follows the edges that match it and ends in a new leaf. The
    /// chars of `text`.
    fn insert_below(
        &mut self,
        mut cur: NodeIdx,
        text: &str,
        tenant: TenantId,
        clock: u64,
    ) -> usize {
        let mut rest = text;
        let mut counted = 0;
        while let Some(first) = rest.chars().next() {
            let Some(child) = self.node(cur).children.get(first) else {
                let chars = char_len(rest);
                let leaf = self.alloc(Node {
                    text: rest.to_string(),
                    chars,
                    children: Children::None,
                    tenants: Tenants::None,
                    parent: cur,
                    live: true,
                });
                self.node_mut(cur).children.insert(first, leaf);
                self.touch(leaf, tenant, clock);
                return counted + chars;
            };
            let (bytes, chars) = edge_prefix(self.node(child), rest);
            counted += chars;
            let next = if bytes < self.node(child).text.len() {
                self.split(child, bytes, chars)
            } else {
                child
            };
            self.touch(next, tenant, clock);
            rest = rest.get(bytes..).unwrap_or_default();
            cur = next;
        }
        counted
    }
}
