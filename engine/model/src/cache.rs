//! A simulated paged prefix cache (pure: no I/O, no clocks), reused by the simulator.
//!
//! Engines cache KV state in fixed-size pages keyed by a hash chained over everything before
//! them, so a page can only be reused if the entire prefix up to it matches. The mock does the
//! same over characters instead of tokens: the prompt is cut into blocks of `block_chars`
//! characters (never splitting a UTF-8 character), and block `i` is keyed by
//! `SHA-256(key(i-1) || bytes(i))` with 32 zero bytes standing in for `key(-1)`, as SGLang
//! hashes pages. A trailing partial block is never cached, as in vLLM/SGLang.
//!
//! Token accounting uses the rough "4 characters per token" rule so that the numbers reported in
//! `usage` are plausible and consistent between the engine and the router's estimates.
//!
//! An engine that publishes its cache's changes (the mock's `--kv-events-endpoint`) inserts with
//! [`PrefixCache::lookup_and_insert_tracked`], which also says which blocks it stored and evicted.

use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap, HashSet};

/// Key of one cached block: the chained SHA-256 digest.
pub type BlockHash = [u8; 32];

/// Characters per simulated token.
pub const CHARS_PER_TOKEN: usize = 4;

/// Chained hashes of every *full* `block_chars`-character block of `prompt`, in order.
///
/// # Panics
/// If `block_chars` is 0.
pub fn block_hashes(prompt: &str, block_chars: usize) -> Vec<BlockHash> {
    assert!(block_chars > 0, "block_chars must be positive");
    let mut out = Vec::new();
    let mut prev: BlockHash = [0; 32];
    let mut start = 0;
    let mut in_block = 0;
    for (idx, ch) in prompt.char_indices() {
        in_block += 1;
        if in_block == block_chars {
            let end = idx + ch.len_utf8();
            prev = chain_hash(&prev, &prompt.as_bytes()[start..end]);
            out.push(prev);
            start = end;
            in_block = 0;
        }
    }
    out
}

/// `SHA-256(prev || block)`.
pub fn chain_hash(prev: &BlockHash, block: &[u8]) -> BlockHash {
    let mut h = Sha256::new();
    h.update(prev);
    h.update(block);
    h.finalize().into()
}

/// Simulated prompt tokens for a prompt of `chars` characters: `ceil(chars / 4)`.
pub fn prompt_tokens_for_chars(chars: usize) -> usize {
    chars.div_ceil(CHARS_PER_TOKEN)
}

/// Outcome of one [`PrefixCache::lookup_and_insert`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLookup {
    /// Characters in the prompt.
    pub prompt_chars: usize,
    /// Full blocks in the prompt.
    pub total_blocks: usize,
    /// Leading blocks that were already cached.
    pub matched_blocks: usize,
    /// `ceil(prompt_chars / 4)`.
    pub prompt_tokens: usize,
    /// `matched_blocks * block_chars / 4`, never more than `prompt_tokens`.
    pub cached_tokens: usize,
}

impl CacheLookup {
    /// Tokens that must be prefilled (and cost simulated time).
    pub fn uncached_tokens(&self) -> usize {
        self.prompt_tokens - self.cached_tokens
    }
}

/// What one [`PrefixCache::lookup_and_insert_tracked`] changed in the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CacheChanges {
    /// The prompt's full blocks, in order (what [`block_hashes`] gives).
    pub blocks: Vec<BlockHash>,
    /// Indices into `blocks` of the blocks that were not cached before and are now,
    /// ascending.
    pub stored: Vec<usize>,
    /// Blocks that were cached before and are not any more, in the order they were
    /// evicted.
    pub evicted: Vec<BlockHash>,
}

/// LRU set of block hashes with a fixed capacity, plus the running totals engines export.
#[derive(Clone, Debug)]
pub struct PrefixCache {
    block_chars: usize,
    capacity: usize,
    /// Block -> its last-use tick.
    entries: HashMap<BlockHash, u64>,
    /// Last-use tick -> block; the first entry is the least recently used.
    by_age: BTreeMap<u64, BlockHash>,
    clock: u64,
    query_tokens: u64,
    hit_tokens: u64,
}

impl PrefixCache {
    /// A cache of `capacity` blocks of `block_chars` characters.
    ///
    /// # Panics
    /// If `block_chars` is 0.
    pub fn new(capacity: usize, block_chars: usize) -> Self {
        assert!(block_chars > 0, "block_chars must be positive");
        Self {
            block_chars,
            capacity,
            entries: HashMap::new(),
            by_age: BTreeMap::new(),
            clock: 0,
            query_tokens: 0,
            hit_tokens: 0,
        }
    }

    /// Characters per block.
    pub fn block_chars(&self) -> usize {
        self.block_chars
    }

    /// Capacity in blocks.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens a block holds (`block_size` in vLLM's `cache_config_info`).
    pub fn block_tokens(&self) -> usize {
        self.block_chars.div_ceil(CHARS_PER_TOKEN)
    }

    /// Tokens the cache holds at most, as an engine states its KV capacity.
    pub fn capacity_tokens(&self) -> usize {
        self.capacity * self.block_tokens()
    }

    /// Blocks currently cached.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Fraction of capacity in use, 0..=1 (0 for a zero-capacity cache).
    pub fn usage(&self) -> f64 {
        if self.capacity == 0 {
            0.0
        } else {
            self.entries.len() as f64 / self.capacity as f64
        }
    }

    /// Whether `block` is cached (does not touch it).
    pub fn contains(&self, block: &BlockHash) -> bool {
        self.entries.contains_key(block)
    }

    /// Total prompt tokens looked up so far (Prometheus "prefix cache queries").
    pub fn query_tokens(&self) -> u64 {
        self.query_tokens
    }

    /// Total cached tokens found so far (Prometheus "prefix cache hits").
    pub fn hit_tokens(&self) -> u64 {
        self.hit_tokens
    }

    /// Leading blocks of `blocks` that are cached, stopping at the first miss. Read-only.
    pub fn matched_prefix(&self, blocks: &[BlockHash]) -> usize {
        blocks.iter().take_while(|b| self.contains(b)).count()
    }

    /// Marks `blocks` (one prompt's chain, in order) as most recently used, inserting missing
    /// ones and evicting least recently used blocks beyond capacity.
    ///
    /// The chain is touched back to front so the *head* ends up newest: when this prompt's
    /// blocks age out, the tail goes first, which keeps the remaining prefix reusable (a chained
    /// block is useless once any block before it is gone). vLLM frees blocks in the same order.
    pub fn insert(&mut self, blocks: &[BlockHash]) {
        self.insert_with(blocks, |_| {});
    }

    /// [`PrefixCache::insert`], calling `evicted` with each block it evicts.
    fn insert_with(&mut self, blocks: &[BlockHash], mut evicted: impl FnMut(BlockHash)) {
        if self.capacity == 0 {
            return;
        }
        for block in blocks.iter().rev() {
            self.clock += 1;
            let tick = self.clock;
            if let Some(old) = self.entries.insert(*block, tick) {
                self.by_age.remove(&old);
            } else if self.entries.len() > self.capacity {
                if let Some((_, victim)) = self.by_age.pop_first() {
                    self.entries.remove(&victim);
                    evicted(victim);
                }
            }
            self.by_age.insert(tick, *block);
        }
    }

    /// Looks `prompt` up, then caches all of its full blocks; updates the running totals.
    pub fn lookup_and_insert(&mut self, prompt: &str) -> CacheLookup {
        self.lookup_and_insert_blocks(prompt).0
    }

    /// [`PrefixCache::lookup_and_insert`], also giving the prompt's full blocks in
    /// order (the first `matched_blocks` were cached before).
    pub fn lookup_and_insert_blocks(&mut self, prompt: &str) -> (CacheLookup, Vec<BlockHash>) {
        let blocks = block_hashes(prompt, self.block_chars);
        let matched_blocks = self.matched_prefix(&blocks);
        self.insert(&blocks);
        (self.account(prompt, blocks.len(), matched_blocks), blocks)
    }

    /// [`PrefixCache::lookup_and_insert`], also telling what it changed in the cache,
    /// for an engine that publishes its cache events.
    pub fn lookup_and_insert_tracked(&mut self, prompt: &str) -> (CacheLookup, CacheChanges) {
        let blocks = block_hashes(prompt, self.block_chars);
        let matched_blocks = self.matched_prefix(&blocks);
        let was_cached: Vec<bool> = blocks.iter().map(|b| self.contains(b)).collect();
        let mut victims = Vec::new();
        self.insert_with(&blocks, |v| victims.push(v));
        let stored: Vec<usize> = (0..blocks.len())
            .filter(|&i| !was_cached[i] && self.contains(&blocks[i]))
            .collect();
        // A block of this prompt inserted and evicted again by this same insert (the
        // prompt is longer than the cache) was never there as far as anyone can tell.
        let new_here: HashSet<&BlockHash> = blocks
            .iter()
            .zip(&was_cached)
            .filter(|(_, &was)| !was)
            .map(|(b, _)| b)
            .collect();
        let evicted = victims
            .into_iter()
            .filter(|v| !new_here.contains(v) && !self.contains(v))
            .collect();
        let lookup = self.account(prompt, blocks.len(), matched_blocks);
        (
            lookup,
            CacheChanges {
                blocks,
                stored,
                evicted,
            },
        )
    }

    /// Drops every cached block (an engine's `reset_prefix_cache`). The running
    /// query and hit totals are kept, as the counters an engine exports are.
    pub fn clear(&mut self) {
        self.entries.clear();
        self.by_age.clear();
    }

    /// The lookup's numbers, added to the running totals.
    fn account(&mut self, prompt: &str, total_blocks: usize, matched_blocks: usize) -> CacheLookup {
        let prompt_chars = prompt.chars().count();
        let prompt_tokens = prompt_tokens_for_chars(prompt_chars);
        let cached_tokens =
            (matched_blocks * self.block_chars / CHARS_PER_TOKEN).min(prompt_tokens);
        self.query_tokens += prompt_tokens as u64;
        self.hit_tokens += cached_tokens as u64;
        CacheLookup {
            prompt_chars,
            total_blocks,
            matched_blocks,
            prompt_tokens,
            cached_tokens,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize, c: char) -> String {
        std::iter::repeat_n(c, n).collect()
    }

    #[test]
    fn capacity_in_tokens_is_blocks_times_the_tokens_a_block_holds() {
        assert_eq!(PrefixCache::new(4096, 64).capacity_tokens(), 65536);
        let odd = PrefixCache::new(10, 65);
        assert_eq!((odd.block_tokens(), odd.capacity_tokens()), (17, 170));
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(block_hashes("", 4).len(), 0);
        assert_eq!(block_hashes("abc", 4).len(), 0);
        assert_eq!(block_hashes("abcd", 4).len(), 1);
        assert_eq!(block_hashes("abcdefg", 4).len(), 1);
        assert_eq!(block_hashes("abcdefgh", 4).len(), 2);
    }

    #[test]
    fn chain_starts_from_zero_digest() {
        let h = block_hashes("abcd", 4);
        assert_eq!(h[0], chain_hash(&[0; 32], b"abcd"));
        let h2 = block_hashes("abcdefgh", 4);
        assert_eq!(h2[1], chain_hash(&h2[0], b"efgh"));
    }

    #[test]
    fn blocks_count_chars_not_bytes() {
        // 4 multi-byte chars per block: bytes would split them.
        let s = "é世🦀aé世🦀bxy";
        let h = block_hashes(s, 4);
        assert_eq!(h.len(), 2);
        assert_eq!(h[0], chain_hash(&[0; 32], "é世🦀a".as_bytes()));
        assert_eq!(h[1], chain_hash(&h[0], "é世🦀b".as_bytes()));
        let mut c = PrefixCache::new(16, 4);
        let r = c.lookup_and_insert(s);
        assert_eq!(r.prompt_chars, 10);
        assert_eq!(r.prompt_tokens, 3);
    }

    #[test]
    fn same_prefix_then_divergence() {
        let mut c = PrefixCache::new(100, 4);
        let first = c.lookup_and_insert("aaaabbbbccccdddd");
        assert_eq!((first.total_blocks, first.matched_blocks), (4, 0));
        let second = c.lookup_and_insert("aaaabbbbXcccdddd");
        assert_eq!(second.matched_blocks, 2, "stops at the diverging block");
        // The tail "dddd" is identical text but its chained key differs.
        assert_eq!(second.cached_tokens, 2);
        let again = c.lookup_and_insert("aaaabbbbccccdddd");
        assert_eq!(again.matched_blocks, 4);
    }

    #[test]
    fn changed_early_block_invalidates_all_later_ones() {
        let mut c = PrefixCache::new(100, 4);
        c.lookup_and_insert("aaaabbbbccccdddd");
        let r = c.lookup_and_insert("Zaaabbbbccccdddd");
        assert_eq!(r.matched_blocks, 0);
        assert_eq!(r.cached_tokens, 0);
    }

    #[test]
    fn lru_capacity_and_eviction_order() {
        let mut c = PrefixCache::new(3, 4);
        let a = block_hashes("aaaa", 4)[0];
        let b = block_hashes("bbbb", 4)[0];
        let d = block_hashes("dddd", 4)[0];
        let e = block_hashes("eeee", 4)[0];
        c.lookup_and_insert("aaaa");
        c.lookup_and_insert("bbbb");
        c.lookup_and_insert("dddd");
        assert_eq!(c.len(), 3);
        assert_eq!(c.usage(), 1.0);
        // Touch "aaaa": "bbbb" becomes the least recently used.
        assert_eq!(c.lookup_and_insert("aaaa").matched_blocks, 1);
        c.lookup_and_insert("eeee");
        assert_eq!(c.len(), 3);
        assert!(!c.contains(&b));
        assert!(c.contains(&a) && c.contains(&d) && c.contains(&e));
        c.lookup_and_insert("ffff");
        assert!(!c.contains(&d), "next oldest goes next");
        assert!(c.contains(&a));
    }

    #[test]
    fn long_prompt_keeps_its_head_when_over_capacity() {
        let mut c = PrefixCache::new(2, 4);
        let r = c.lookup_and_insert("aaaabbbbcccc");
        assert_eq!(r.total_blocks, 3);
        assert_eq!(c.len(), 2);
        let again = c.lookup_and_insert("aaaabbbbcccc");
        assert_eq!(again.matched_blocks, 2, "tail evicted, head kept");
    }

    #[test]
    fn zero_capacity_caches_nothing() {
        let mut c = PrefixCache::new(0, 4);
        c.lookup_and_insert("aaaabbbb");
        assert_eq!(c.lookup_and_insert("aaaabbbb").cached_tokens, 0);
        assert_eq!(c.usage(), 0.0);
    }

    #[test]
    fn token_accounting_boundaries() {
        for (chars, tokens, cached_second) in [(63, 16, 0), (64, 16, 16), (65, 17, 16)] {
            let mut c = PrefixCache::new(100, 64);
            let p = text(chars, 'x');
            let first = c.lookup_and_insert(&p);
            assert_eq!(first.prompt_tokens, tokens, "{chars} chars");
            assert_eq!(first.cached_tokens, 0);
            let second = c.lookup_and_insert(&p);
            assert_eq!(second.prompt_tokens, tokens);
            assert_eq!(second.cached_tokens, cached_second, "{chars} chars");
            assert_eq!(second.uncached_tokens(), tokens - cached_second);
            assert_eq!(c.query_tokens(), 2 * tokens as u64);
            assert_eq!(c.hit_tokens(), cached_second as u64);
        }
    }

    #[test]
    fn cached_never_exceeds_prompt_tokens() {
        // 3-char blocks, 6 chars: 2 tokens; 2 blocks * 3 / 4 = 1.
        let mut c = PrefixCache::new(10, 3);
        c.lookup_and_insert("abcdef");
        let r = c.lookup_and_insert("abcdef");
        assert!(r.cached_tokens <= r.prompt_tokens);
        // 1-char blocks: 5 chars -> 2 tokens, 5 blocks * 1 / 4 = 1.
        let mut c = PrefixCache::new(10, 1);
        c.lookup_and_insert("abcde");
        let r = c.lookup_and_insert("abcde");
        assert_eq!((r.prompt_tokens, r.cached_tokens), (2, 1));
    }

    #[test]
    fn tracked_insert_reports_new_blocks_and_evictions() {
        let mut c = PrefixCache::new(3, 4);
        let (first, changes) = c.lookup_and_insert_tracked("aaaabbbbcc");
        assert_eq!(first.total_blocks, 2);
        assert_eq!(changes.blocks, block_hashes("aaaabbbbcc", 4));
        assert_eq!(changes.stored, vec![0, 1]);
        assert!(changes.evicted.is_empty());
        let [a, b] = [changes.blocks[0], changes.blocks[1]];

        // Shares "aaaa", adds two: one over capacity, and "bbbb" is the oldest.
        let (second, changes) = c.lookup_and_insert_tracked("aaaaXXXXYYYY");
        assert_eq!(second.matched_blocks, 1);
        assert_eq!(changes.stored, vec![1, 2], "the cached head is not new");
        assert_eq!(changes.evicted, vec![b]);
        assert!(c.contains(&a) && !c.contains(&b));

        // Nothing new, nothing evicted.
        let (_, changes) = c.lookup_and_insert_tracked("aaaaXXXX");
        assert!(changes.stored.is_empty() && changes.evicted.is_empty());
    }

    #[test]
    fn tracked_insert_of_a_prompt_longer_than_the_cache() {
        let mut c = PrefixCache::new(2, 4);
        c.lookup_and_insert("zzzz");
        let z = block_hashes("zzzz", 4)[0];
        // Three blocks into two: the tail goes in and out again, unseen; "zzzz" goes.
        let (_, changes) = c.lookup_and_insert_tracked("aaaabbbbcccc");
        assert_eq!(changes.stored, vec![0, 1]);
        assert_eq!(changes.evicted, vec![z]);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn tracked_and_plain_inserts_agree() {
        let prompts = [
            "aaaabbbbcccc",
            "aaaabbbbdddd",
            "eeee",
            "aaaaffff",
            "aaaabbbbcccc",
        ];
        let mut plain = PrefixCache::new(4, 4);
        let mut tracked = PrefixCache::new(4, 4);
        for p in prompts {
            let (lookup, _) = tracked.lookup_and_insert_tracked(p);
            assert_eq!(lookup, plain.lookup_and_insert(p), "{p}");
        }
        assert_eq!(tracked.hit_tokens(), plain.hit_tokens());
        for p in prompts {
            let blocks = block_hashes(p, 4);
            assert_eq!(
                tracked.matched_prefix(&blocks),
                plain.matched_prefix(&blocks)
            );
        }
    }

    #[test]
    fn clear_drops_every_block_and_keeps_the_totals() {
        let mut c = PrefixCache::new(10, 4);
        c.lookup_and_insert("aaaabbbb");
        c.lookup_and_insert("aaaabbbb");
        let (queries, hits) = (c.query_tokens(), c.hit_tokens());
        c.clear();
        assert!(c.is_empty());
        assert_eq!((c.query_tokens(), c.hit_tokens()), (queries, hits));
        assert_eq!(c.lookup_and_insert("aaaabbbb").matched_blocks, 0);
        assert_eq!(c.len(), 2, "usable again after a clear");
    }
}
