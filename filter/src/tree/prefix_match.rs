//! What a prefix lookup of the tree found (`Tree::prefix_walk`): how much of the
//! text the tree holds and who holds it, which `cache_aware` decides by.

use super::TenantId;

/// What a prefix lookup found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PrefixMatch {
    /// Chars of the input that the tree holds as a prefix.
    pub matched_chars: usize,
    /// Chars in the input.
    pub input_chars: usize,
    /// Tenants at the deepest node reached, sorted by id. Each holds the whole matched
    /// prefix (or more).
    pub owners: Vec<TenantId>,
}

impl PrefixMatch {
    /// `matched / input`, 0 for an empty input (SMG's definition).
    pub fn match_rate(&self) -> f64 {
        if self.input_chars == 0 {
            0.0
        } else {
            self.matched_chars as f64 / self.input_chars as f64
        }
    }

    /// Makes this match say what another lookup found, in place: the owners' list
    /// is refilled, so a match kept from one request to the next allocates once.
    pub fn refill(
        &mut self,
        matched_chars: usize,
        input_chars: usize,
        owners: impl IntoIterator<Item = TenantId>,
    ) {
        self.matched_chars = matched_chars;
        self.input_chars = input_chars;
        self.owners.clear();
        self.owners.extend(owners);
    }
}
