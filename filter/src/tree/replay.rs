//! Another VM's inserts, taken from the bytes the operation ring holds: the text
//! is walked down the tree as bytes and checked as UTF-8 only past the edges it
//! matches, which are text already (`Tree::insert_bytes`).

use super::{TenantId, Tree, Walked};
use crate::scan;

impl Tree {
    /// `insert` of a text given as bytes that may not be UTF-8 (another VM's, read
    /// from shared memory), checked only past the path the tree already holds of
    /// it: those bytes equal its edges, which are text. Replayed in every VM but
    /// the one that routed it, a 4 KiB text checked in full cost each VM about 1k
    /// Envoy instructions a request, most of them on the prompt the tree held.
    /// Its length in chars (`insert`'s); `None`: not UTF-8, and the tree is as it
    /// was.
    pub fn insert_bytes(&mut self, text: &[u8], tenant: TenantId, clock: u64) -> Option<usize> {
        let walked = self.walk_bytes(text);
        text.get(walked.bytes..).and_then(scan::utf8)?;
        debug_assert!(text
            .get(..walked.bytes)
            .is_some_and(|held| std::str::from_utf8(held).is_ok()));
        // SAFETY: `text[..walked.bytes]` is the edges of a path from the root, each
        // matched whole (`walk_bytes`), and edges are `String`s: UTF-8 that ends on a
        // char boundary. The rest of `text` was checked just now, and UTF-8 joined to
        // UTF-8 at a char boundary is UTF-8.
        let text = unsafe { std::str::from_utf8_unchecked(text) };
        Some(self.insert_walked(text, tenant, clock, walked))
    }

    /// Where an insert of `text` may start (`Walked`): down the edges it matches
    /// whole, compared as bytes.
    fn walk_bytes(&self, text: &[u8]) -> Walked {
        let mut walked = self.at_root(text.len());
        loop {
            let rest = text.get(walked.bytes..).unwrap_or_default();
            let next = first_char(rest).and_then(|c| self.node(walked.node).children.get(c));
            let Some(child) = next else {
                return walked;
            };
            let edge = self.node(child).text.as_bytes();
            if scan::common_len(edge, rest) < edge.len() {
                return walked;
            }
            walked.node = child;
            walked.bytes += edge.len();
            walked.chars += self.node(child).chars;
        }
    }
}

/// The char `bytes` begin with, if they begin with a whole UTF-8 one.
fn first_char(bytes: &[u8]) -> Option<char> {
    let &lead = bytes.first()?;
    if lead.is_ascii() {
        return Some(char::from(lead));
    }
    let width = match lead {
        0xc0..=0xdf => 2,
        0xe0..=0xef => 3,
        0xf0..=0xf7 => 4,
        _ => return None,
    };
    std::str::from_utf8(bytes.get(..width)?)
        .ok()?
        .chars()
        .next()
}
