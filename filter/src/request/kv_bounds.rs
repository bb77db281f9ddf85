//! What each worker's engine can hold of the tree. The tree records where text was
//! sent; an engine keeps only what fits its KV cache and evicts the rest, least
//! recently used first. So each worker's share of the tree is bounded by its engine's
//! capacity (`kv_capacity_tokens`, from the collector) in the tree's own unit, chars:
//! capacity times the chars per token the engine's own counter shows for the text
//! routed to it (`prompt_tokens_total` against the chars inserted under the worker).
//! The tree then forgets, in LRU order, what the engine must have evicted
//! (`kv_capacity_bound`, off by default: `cache_aware`'s threshold turns a truthful
//! tree into a loss where every engine evicts). A counter that goes back is an
//! engine that restarted with an empty cache: its worker's share goes, bound or not.
//!
//! Every VM must bound alike, so the state travels in the operation stream
//! (`crate::shared::Op::KvBound`): one VM per interval compares the engines' samples
//! with what the stream last said (`kv_step`) and shares what changed; every VM
//! applies it at the same point. A VM counts the chars it applied since the last
//! bound of a worker, so whichever VM claims the next interval can close the window.

/// How often one VM compares the engines' samples with the bounds: about the pace
/// the collector pushes at (1 s by default), so no sample goes unread for long.
pub const KV_BOUNDS_INTERVAL_MS: u64 = 500;

/// Prompt tokens an engine must count before a window's chars per token is taken:
/// a few requests, so one long or short prompt does not set the ratio alone.
pub const MIN_WINDOW_TOKENS: u64 = 4096;

/// How long a window lasts at least. Its tokens are counted from the sample that
/// anchored it, its chars from when the bound reached the stream, up to an interval
/// and a collector push later: over 20 s that misalignment is a few percent. (Over
/// the 1 s a busy engine takes to count 4096 tokens it read 3 chars a token where
/// the text had 4.)
pub const MIN_WINDOW_MS: u64 = 20_000;

/// Chars per token, in thousandths, that a window may give. A tokenizer gives about
/// 4 chars of English a token, 1 to 2 of CJK; a window outside this range is text
/// the router never saw (other routers' traffic) or a broken counter, and clamped.
const MIN_CHARS_PER_TOKEN_MILLI: u64 = 250;
const MAX_CHARS_PER_TOKEN_MILLI: u64 = 32_000;

/// Chars per token, in thousandths, until a window has closed: a BPE tokenizer's
/// usual rate on English prose (code and other scripts have fewer chars a token, so
/// the bound errs on the generous side there), so a bound holds from the first
/// comparison that reads a capacity, not only once a window has closed.
pub const PRIOR_CHARS_PER_TOKEN_MILLI: u64 = 4000;

/// Once a worker's share is over its bound, it is trimmed to this fraction (15/16)
/// of it, so that a full engine does not cost a trim on every insert.
const TRIM_TO_SIXTEENTHS: usize = 15;

/// One worker's bound, as the operation stream last set it, and the chars routed to
/// it since.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvBound {
    /// Tokens its engine's KV cache holds (0: not stated).
    pub capacity_tokens: u64,
    /// Chars of routed text per prompt token, in thousandths (0: not learned yet).
    pub chars_per_token_milli: u64,
    /// The engine's prompt-token counter where the current window began.
    pub anchor_tokens: Option<u64>,
    /// When it began (the filter's clock, ms).
    pub anchor_ms: u64,
    /// Chars inserted under the worker since that point of the stream.
    pub chars_since: u64,
}

impl KvBound {
    /// The chars of tree the worker's engine can hold, at the prior chars per token
    /// until one is learned; `None` while its capacity is unknown (the tree is then
    /// bounded by `max_tree_size` and the VM budget only).
    pub fn max_chars(&self) -> Option<usize> {
        if self.capacity_tokens == 0 {
            return None;
        }
        let ratio = match self.chars_per_token_milli {
            0 => PRIOR_CHARS_PER_TOKEN_MILLI,
            learned => learned,
        };
        let chars = u128::from(self.capacity_tokens) * u128::from(ratio) / 1000;
        Some(usize::try_from(chars).unwrap_or(usize::MAX))
    }

    /// What a trim of a share over `max_chars` leaves.
    pub fn trim_target(max_chars: usize) -> usize {
        max_chars / 16 * TRIM_TO_SIXTEENTHS
    }

    /// Takes a bound the stream carries: a new anchor starts a new window.
    pub fn set(&mut self, update: &KvUpdate) {
        if self.anchor_tokens != Some(update.anchor_tokens) {
            self.chars_since = 0;
        }
        self.capacity_tokens = update.capacity_tokens;
        self.chars_per_token_milli = update.chars_per_token_milli;
        self.anchor_tokens = Some(update.anchor_tokens);
        self.anchor_ms = update.anchor_ms;
    }
}

/// A worker's bound as the stream carries it (`crate::shared::Op::KvBound`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvUpdate {
    pub capacity_tokens: u64,
    pub chars_per_token_milli: u64,
    pub anchor_tokens: u64,
    pub anchor_ms: u64,
    /// The engine restarted: its cache is empty, so is the worker's share of the tree.
    pub cleared: bool,
}

/// Why a sample changes nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The sample states no KV capacity: nothing to bound by.
    NoCapacity,
    /// Nothing new: the window is shorter than `MIN_WINDOW_TOKENS` or
    /// `MIN_WINDOW_MS`, and the capacity is the one shared.
    ShortWindow,
}

/// Why a bound is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Share {
    /// The first counter seen for the worker (or a window nothing was routed in):
    /// a window starts.
    Anchored,
    /// A window closed: chars per token learned.
    Learned,
    /// The engine states another capacity.
    Resized,
    /// The counter went back: the engine restarted, its cache is empty.
    Restarted,
}

impl Share {
    pub fn as_str(self) -> &'static str {
        match self {
            Share::Anchored => "anchored",
            Share::Learned => "learned",
            Share::Resized => "resized",
            Share::Restarted => "restarted",
        }
    }
}

/// What an engine sample means for a worker's bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvStep {
    Keep(Keep),
    Share(KvUpdate, Share),
}

/// Compares an engine's sample (its capacity, its prompt-token counter) with the
/// bound the stream holds for it, at `now_ms`.
pub fn kv_step(
    held: &KvBound,
    capacity: Option<u64>,
    prompt_tokens: Option<u64>,
    now_ms: u64,
) -> KvStep {
    let Some(capacity_tokens) = capacity.filter(|&c| c > 0) else {
        return KvStep::Keep(Keep::NoCapacity);
    };
    // A new anchor starts a window now; the same one keeps its start.
    let update = |chars_per_token_milli, anchor_tokens, cleared| KvUpdate {
        capacity_tokens,
        chars_per_token_milli,
        anchor_tokens,
        anchor_ms: if held.anchor_tokens == Some(anchor_tokens) {
            held.anchor_ms
        } else {
            now_ms
        },
        cleared,
    };
    let ratio = held.chars_per_token_milli;
    let (Some(total), Some(anchor)) = (prompt_tokens, held.anchor_tokens) else {
        return match prompt_tokens {
            Some(total) => KvStep::Share(update(ratio, total, false), Share::Anchored),
            // No counter: the capacity alone, and no ratio to learn.
            None if capacity_tokens != held.capacity_tokens => {
                let anchor = held.anchor_tokens.unwrap_or(0);
                KvStep::Share(update(ratio, anchor, false), Share::Resized)
            }
            None => KvStep::Keep(Keep::ShortWindow),
        };
    };
    if total < anchor {
        return KvStep::Share(update(ratio, total, true), Share::Restarted);
    }
    let window = total - anchor;
    if window >= MIN_WINDOW_TOKENS && now_ms.saturating_sub(held.anchor_ms) >= MIN_WINDOW_MS {
        if held.chars_since == 0 {
            // Tokens the router sent nothing for (another router's traffic, or a
            // VM that started inside the window): nothing to learn from.
            return KvStep::Share(update(ratio, total, false), Share::Anchored);
        }
        let seen = (u128::from(held.chars_since) * 1000 / u128::from(window)) as u64;
        let seen = seen.clamp(MIN_CHARS_PER_TOKEN_MILLI, MAX_CHARS_PER_TOKEN_MILLI);
        // A new ratio is taken whole; after that a window weighs a quarter.
        let learned = if ratio == 0 {
            seen
        } else {
            (3 * ratio + seen) / 4
        };
        return KvStep::Share(update(learned, total, false), Share::Learned);
    }
    if capacity_tokens != held.capacity_tokens {
        return KvStep::Share(update(ratio, anchor, false), Share::Resized);
    }
    KvStep::Keep(Keep::ShortWindow)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A window's age when the tests close it.
    const LATER: u64 = MIN_WINDOW_MS;

    fn held(capacity: u64, ratio: u64, anchor: Option<u64>, chars: u64) -> KvBound {
        KvBound {
            capacity_tokens: capacity,
            chars_per_token_milli: ratio,
            anchor_tokens: anchor,
            anchor_ms: 0,
            chars_since: chars,
        }
    }

    fn share(step: KvStep) -> (KvUpdate, Share) {
        match step {
            KvStep::Share(u, why) => (u, why),
            KvStep::Keep(why) => panic!("kept: {why:?}"),
        }
    }

    #[test]
    fn no_capacity_bounds_nothing() {
        let fresh = KvBound::default();
        assert_eq!(
            kv_step(&fresh, None, Some(10), LATER),
            KvStep::Keep(Keep::NoCapacity)
        );
        assert_eq!(
            kv_step(&fresh, Some(0), Some(10), LATER),
            KvStep::Keep(Keep::NoCapacity)
        );
        assert_eq!(fresh.max_chars(), None);
    }

    #[test]
    fn the_first_counter_anchors_a_window_and_bounds_at_the_prior() {
        let (u, why) = share(kv_step(&KvBound::default(), Some(65536), Some(500), LATER));
        assert_eq!(why, Share::Anchored);
        assert_eq!(
            (u.capacity_tokens, u.anchor_tokens, u.cleared),
            (65536, 500, false)
        );
        let mut b = held(0, 0, None, 77);
        b.set(&u);
        assert_eq!(b.chars_since, 0);
        assert_eq!(
            b.max_chars(),
            Some(65536 * 4),
            "4 chars a token until learned"
        );
    }

    #[test]
    fn a_window_closes_at_its_token_count_and_takes_the_ratio_whole_first() {
        let b = held(65536, 0, Some(1000), 16_000);
        // One token short: nothing yet.
        let short = kv_step(&b, Some(65536), Some(1000 + MIN_WINDOW_TOKENS - 1), LATER);
        assert_eq!(short, KvStep::Keep(Keep::ShortWindow));
        // 16000 chars over the window's 4096 tokens: 3.906 chars a token.
        let (u, why) = share(kv_step(
            &b,
            Some(65536),
            Some(1000 + MIN_WINDOW_TOKENS),
            LATER,
        ));
        assert_eq!(why, Share::Learned);
        assert_eq!(u.anchor_ms, LATER, "the next window starts now");
        assert_eq!(u.chars_per_token_milli, 16_000 * 1000 / MIN_WINDOW_TOKENS);
        assert_eq!(u.anchor_tokens, 1000 + MIN_WINDOW_TOKENS);
        let mut b = b;
        b.set(&u);
        assert_eq!(b.chars_since, 0, "a new window");
        assert_eq!(b.max_chars(), Some(65536 * 3906 / 1000));
    }

    #[test]
    fn a_window_lasts_its_time_however_many_tokens_it_counted() {
        let b = KvBound {
            anchor_ms: 5000,
            ..held(65536, 0, Some(0), 1 << 20)
        };
        let young = kv_step(&b, Some(65536), Some(1 << 20), 5000 + MIN_WINDOW_MS - 1);
        assert_eq!(young, KvStep::Keep(Keep::ShortWindow));
        let (_, why) = share(kv_step(
            &b,
            Some(65536),
            Some(1 << 20),
            5000 + MIN_WINDOW_MS,
        ));
        assert_eq!(why, Share::Learned);
        // A new capacity meanwhile keeps the window and its start.
        let (u, why) = share(kv_step(&b, Some(1000), Some(10), 6000));
        assert_eq!((why, u.anchor_ms), (Share::Resized, 5000));
    }

    #[test]
    fn a_later_window_weighs_a_quarter() {
        let b = held(1000, 4000, Some(0), 2 * 8192);
        let (u, _) = share(kv_step(&b, Some(1000), Some(8192), LATER));
        assert_eq!(u.chars_per_token_milli, (3 * 4000 + 2000) / 4);
    }

    #[test]
    fn windows_out_of_range_are_clamped() {
        let few = held(1000, 0, Some(0), 1);
        let (u, _) = share(kv_step(&few, Some(1000), Some(1 << 20), LATER));
        assert_eq!(u.chars_per_token_milli, MIN_CHARS_PER_TOKEN_MILLI);
        let many = held(1000, 0, Some(0), u64::MAX / 2);
        let (u, _) = share(kv_step(&many, Some(1000), Some(MIN_WINDOW_TOKENS), LATER));
        assert_eq!(u.chars_per_token_milli, MAX_CHARS_PER_TOKEN_MILLI);
    }

    #[test]
    fn a_window_nothing_was_routed_in_starts_again_without_learning() {
        let b = held(1000, 3000, Some(0), 0);
        let (u, why) = share(kv_step(&b, Some(1000), Some(MIN_WINDOW_TOKENS * 3), LATER));
        assert_eq!(why, Share::Anchored);
        assert_eq!(
            (u.chars_per_token_milli, u.anchor_tokens),
            (3000, MIN_WINDOW_TOKENS * 3)
        );
    }

    #[test]
    fn a_counter_that_goes_back_is_a_restart_that_clears() {
        let b = held(1000, 3000, Some(50_000), 123);
        let (u, why) = share(kv_step(&b, Some(1000), Some(20), LATER));
        assert_eq!(why, Share::Restarted);
        assert!(u.cleared);
        assert_eq!((u.chars_per_token_milli, u.anchor_tokens), (3000, 20));
    }

    #[test]
    fn a_new_capacity_is_shared_within_a_window_and_keeps_it_open() {
        let b = held(1000, 3000, Some(100), 999);
        let (u, why) = share(kv_step(&b, Some(2000), Some(200), LATER));
        assert_eq!(why, Share::Resized);
        assert_eq!((u.capacity_tokens, u.anchor_tokens), (2000, 100));
        let mut kept = b;
        kept.set(&u);
        assert_eq!(kept.chars_since, 999, "same anchor, same window");
        assert_eq!(kept.max_chars(), Some(6000));
        // Without a counter too, but then nothing is learned.
        let (u, why) = share(kv_step(&b, Some(4000), None, LATER));
        assert_eq!((why, u.chars_per_token_milli), (Share::Resized, 3000));
        assert_eq!(
            kv_step(&b, Some(1000), None, LATER),
            KvStep::Keep(Keep::ShortWindow)
        );
    }

    #[test]
    fn a_trim_leaves_fifteen_sixteenths() {
        assert_eq!(KvBound::trim_target(1600), 1500);
        assert!(KvBound::trim_target(10) <= 10);
    }
}
