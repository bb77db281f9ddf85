//! Each tenant's own share of a text (`predicted_ttft` scores every worker by the
//! prefix it holds, not only the deepest owner's) and the holders of the longest
//! match, which a sampled fleet draws from.

use super::{by_tenant, Hold, NodeIdx, TenantId, Tree, Walked};

/// Each tenant's share of one text (`Tree::tenant_matches`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TenantMatches {
    /// Chars of the text each tenant holds as a prefix, by tenant id (ids are
    /// worker indices, so dense), 0 for none of it or `base`. Every candidate of a
    /// fleet looks itself up here: at 256 workers a binary search each showed in a
    /// profile.
    depth_of: Vec<usize>,
    /// The match of the deepest node on the path that every tenant with a leaf
    /// holds, for the tenants with leaves that `depth_of` leaves at 0: a shared
    /// prompt's nodes hold every worker of a fleet, and marking each of them was
    /// most of this table's cost at 256 workers. Those without leaves (new or
    /// idle workers, often most of a large fleet) are told apart by the caller's
    /// count: searching a list of them at every lookup cost 1.2k instructions a
    /// request at 256 workers, and marking them 0.9k.
    base: usize,
    /// Tenants holding a stored text that the text continues: it matched all of a
    /// leaf, a text nobody else's extends, as a conversation's next turn resends the
    /// turns before it. A shared prefix (a system prompt several texts extend) is
    /// not a leaf, so a new conversation under it continues nobody. Sorted.
    pub continued: Vec<TenantId>,
    /// The text's path: each node and the chars matched down to it
    /// (`Tree::holders_within`).
    path: Vec<(NodeIdx, usize)>,
    /// The text's length in chars, counted past the match only (the walk counted
    /// the rest), so the kilobytes a request shares are not passed over again.
    pub text_chars: usize,
    /// Where the walk ended, for the insert of the text (`Tree::insert_walked`).
    pub walked: Walked,
}

/// The tenants holding the whole of a text's longest match, read where they are
/// rather than copied: a shared prompt's node has every worker of the fleet on it.
/// None by default (a model with no tree yet).
#[derive(Default)]
pub struct Holders<'t>(&'t [Hold]);

impl Holders<'_> {
    pub fn iter(&self) -> impl ExactSizeIterator<Item = TenantId> + '_ {
        self.0.iter().map(|h| h.tenant)
    }
}

impl TenantMatches {
    /// Chars of the text `tenant` holds, given its `conversations` (its leaves in
    /// the tree, `Tree::leaves`): a tenant with none holds nothing.
    #[inline]
    pub fn depth(&self, tenant: TenantId, conversations: usize) -> usize {
        match self.depth_of.get(tenant as usize) {
            Some(&0) if conversations > 0 => self.base,
            Some(&d) => d,
            None => 0,
        }
    }

    /// The longest match any tenant holds, in chars.
    pub fn longest(&self) -> usize {
        self.path.last().map_or(0, |&(_, matched)| matched)
    }

    /// Whether the text continues one of `tenant`'s.
    pub fn continues(&self, tenant: TenantId) -> bool {
        self.continued.binary_search(&tenant).is_ok()
    }

    /// No match, as for a text no tree has seen, keeping the lists' allocations:
    /// at 256 workers the depths alone are a kilobyte, allocated and freed on
    /// every request when each made its own.
    pub fn clear(&mut self) {
        self.depth_of.clear();
        self.base = 0;
        self.continued.clear();
        self.path.clear();
        self.text_chars = 0;
        self.walked = Walked::default();
    }

    /// The tenants holding any of the text and how much, by tenant (`tree`'s
    /// matches).
    #[cfg(test)]
    pub fn depths(&self, tree: &Tree) -> Vec<(TenantId, usize)> {
        (0..self.depth_of.len() as TenantId)
            .map(|t| (t, self.depth(t, tree.tenant_leaves(t))))
            .filter(|&(_, d)| d > 0)
            .collect()
    }
}

/// Marks a tenant past the end of the table (one whose conversations were never
/// counted), growing it: kept out of the marking loop.
#[cold]
#[inline(never)]
fn mark_beyond(depth_of: &mut Vec<usize>, tenant: TenantId, matched: usize) {
    if let Some(d) = by_tenant(depth_of, tenant) {
        *d = matched;
    }
}

impl Tree {
    /// How many chars of `text` each tenant holds as a prefix (its own match
    /// depth, not only the deepest owner's), and which tenants' texts `text`
    /// continues. A tenant on a node holds the whole path to it, so its depth is the
    /// matched length at the deepest node of the path it holds.
    ///
    /// Written into `out`, its lists refilled in place: the router keeps one from
    /// request to request.
    pub fn tenant_matches_into(&self, text: &str, out: &mut TenantMatches) {
        // By tenant id (ids are worker indices, so dense): at 256 workers a shared
        // system prompt has 256 tenants on every node of its path, and a search of
        // the depths found so far for each of them was quadratic.
        // Sized and zeroed for every tenant at the first node marked, so marking a
        // tenant is a store: grown tenant by tenant from inside the loop, it was
        // grown at each of a node's tenants (they are sorted), about 20 V8
        // instructions each and 5k a request at 256 workers.
        let leaves = &self.tenant_leaves;
        let tenants = leaves.as_slice().len();
        // A node's tenants all have leaves, so a node with as many as have any
        // holds every one of them: it sets the base, unmarked.
        let with_leaves = tenants - leaves.without().len();
        out.clear();
        let mut base = 0;
        let TenantMatches {
            depth_of,
            continued,
            path,
            ..
        } = out;
        let mut mark = |depth_of: &mut Vec<usize>, idx: NodeIdx, matched: usize| {
            if depth_of.is_empty() {
                depth_of.resize(tenants, 0);
            }
            let node = self.node(idx);
            if node.tenants.len() == with_leaves {
                base = matched;
                return;
            }
            for h in node.tenants.iter() {
                match depth_of.get_mut(h.tenant as usize) {
                    Some(d) => *d = matched,
                    None => mark_beyond(depth_of, h.tenant, matched),
                }
            }
        };
        // A node's tenants are among its parent's, so a node with as many tenants
        // as its parent has the same ones and the parent's depths would be
        // overwritten: a run of such nodes is marked once, at its last (a shared
        // prompt cut into a few nodes by the prompts that share its start has
        // every worker on each of them).
        let mut pending: Option<(NodeIdx, usize, usize)> = None;
        let (_, matched, rest, walked) = self.walk(text, |idx, node, matched, whole| {
            path.push((idx, matched));
            if let Some((prev, prev_matched, held)) = pending {
                if held != node.tenants.len() {
                    mark(depth_of, prev, prev_matched);
                }
            }
            pending = Some((idx, matched, node.tenants.len()));
            // A leaf is the last node of any walk: only it can be continued.
            if whole && node.children.is_empty() {
                continued.extend(node.tenants.iter().map(|h| h.tenant));
            }
        });
        if let Some((last, matched, _)) = pending {
            mark(depth_of, last, matched);
        }
        continued.sort_unstable();
        out.base = base;
        out.text_chars = matched + super::char_len(rest);
        out.walked = walked;
    }

    /// `tenant_matches_into` a new table.
    #[cfg(test)]
    pub fn tenant_matches(&self, text: &str) -> TenantMatches {
        let mut matches = TenantMatches::default();
        self.tenant_matches_into(text, &mut matches);
        matches
    }

    /// The tenants holding a match of the text within `margin` chars of the
    /// longest match `m` found (none when that is no longer than `margin`): a
    /// node's tenants hold the whole path to it and include its children's, so
    /// they are the tenants of the first node on the path that deep. Two users'
    /// first questions that begin alike put a node of a few chars, held by one
    /// worker, below the system prompt every other holder shares. `m` must come
    /// from this tree, as it is.
    pub fn holders_within(&self, m: &TenantMatches, margin: usize) -> Holders<'_> {
        let longest = m.longest();
        let first = m
            .path
            .iter()
            .find(|&&(_, matched)| matched.saturating_add(margin) >= longest);
        match first.and_then(|&(idx, _)| self.nodes.get(idx as usize)) {
            Some(node) if longest > margin && node.live => Holders(&node.tenants),
            _ => Holders(&[]),
        }
    }

    /// How many chars of `text` `tenant` holds as a prefix (what `tenant_matches`
    /// says for it), stopping at the first node on the path it does not hold.
    pub fn tenant_depth(&self, text: &str, tenant: TenantId) -> usize {
        let mut depth = 0;
        let mut held = true;
        self.walk(text, |_, node, matched, _| {
            held = held && node.tenant_pos(tenant).is_some();
            if held {
                depth = matched;
            }
        });
        depth
    }
}
