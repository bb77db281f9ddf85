//! SGLang's page hashes as its KV events publish them (SGLang 0.5.23).
//!
//! SGLang chains SHA-256 over pages of `page_size` tokens
//! (`sglang/srt/mem_cache/cpp_utils/hash_binding.cpp`): a page's digest is
//! `sha256(previous_digest || token ids as u32 little-endian)`, the first page
//! having no previous digest. The event carries `hash_str_to_int64` of it: the
//! first 8 bytes, big-endian, as a signed int. A trailing partial page is hashed
//! like a full one.
//!
//! Requests with a cache salt or a LoRA adapter are namespaced on top
//! ([`EventNamespace`]). Releases before the SHA-256 chain (0.5.2 published
//! Python's `hash(tuple(page_tokens))`, unchained) are not covered.

use sha2::{Digest, Sha256};

/// The digests of the pages of `token_ids`, chained from `prior` (`None` for a
/// sequence that starts at the root of SGLang's tree).
///
/// Token ids past `u32` (which no vocabulary has) are hashed differently by
/// SGLang and cannot occur here. `page_size` 0 gives no pages.
pub fn page_digests(
    token_ids: &[u32],
    page_size: usize,
    prior: Option<&[u8; 32]>,
) -> Vec<[u8; 32]> {
    if page_size == 0 {
        return Vec::new();
    }
    let mut out: Vec<[u8; 32]> = Vec::with_capacity(token_ids.len().div_ceil(page_size));
    let mut page_bytes = Vec::with_capacity(page_size.min(token_ids.len()) * 4);
    for page in token_ids.chunks(page_size) {
        let mut h = Sha256::new();
        if let Some(prev) = out.last().or(prior) {
            h.update(prev);
        }
        page_bytes.clear();
        for t in page {
            page_bytes.extend_from_slice(&t.to_le_bytes());
        }
        h.update(&page_bytes);
        out.push(h.finalize().into());
    }
    out
}

/// `hash_str_to_int64`: the int an event carries for a page digest.
pub fn event_hash(digest: &[u8; 32]) -> i64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(digest.get(..8).unwrap_or(&[0; 8]));
    i64::from_be_bytes(first)
}

/// The hashes SGLang publishes for `token_ids` of a request with no cache salt and
/// no LoRA adapter, one per page, in `BlockStored.block_hashes` order.
pub fn page_hashes(token_ids: &[u32], page_size: usize) -> Vec<i64> {
    page_digests(token_ids, page_size, None)
        .iter()
        .map(event_hash)
        .collect()
}

/// What besides the tokens decides an SGLang event hash.
///
/// SGLang (0.5.23) seeds the chain of a salted request with a digest of the salt,
/// then, when a namespace applies, rehashes every published int with a seed made
/// of the namespace's parts. Which parts form the namespace depends on
/// `--kv-events-config`'s `format`:
///
/// * `"default"`: the request's `extra_key`, and only when it names a LoRA
///   adapter (SGLang appends the adapter's internal `lora_id` to it, so a router
///   rarely knows it); the salt never does;
/// * `"dynamo"`: the `extra_key` and the salt.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventNamespace<'a> {
    pub cache_salt: Option<&'a str>,
    /// The request's `extra_key` as the engine holds it, if it counts (see above).
    pub namespace_extra_key: Option<&'a str>,
    /// The salt counts in the namespace too (`"format": "dynamo"`).
    pub dynamo_format: bool,
}

impl EventNamespace<'_> {
    /// The hashes SGLang publishes for `token_ids` of a request in this namespace.
    pub fn page_hashes(&self, token_ids: &[u32], page_size: usize) -> Vec<i64> {
        let prior = self.cache_salt.map(cache_salt_seed);
        let salt_in_namespace = if self.dynamo_format {
            self.cache_salt
        } else {
            None
        };
        let seed = namespace_seed(self.namespace_extra_key, salt_in_namespace);
        page_digests(token_ids, page_size, prior.as_ref())
            .iter()
            .map(|d| namespaced_block_hash(event_hash(d), seed.as_ref()))
            .collect()
    }
}

/// The chain seed of a salted request (`compute_node_event_hash_values`):
/// `sha256(b"sglang-cache-salt-v1\0" + salt)`.
pub fn cache_salt_seed(salt: &str) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"sglang-cache-salt-v1\0");
    h.update(salt.as_bytes());
    h.finalize().into()
}

/// `kv_event_namespace_seed`: `None` when neither part is given. Each part is
/// written as a presence byte, then its UTF-8 length as 8 bytes little-endian and
/// the bytes, so `("a", "bc")` and `("ab", "c")` differ.
pub fn namespace_seed(extra_key: Option<&str>, cache_salt: Option<&str>) -> Option<[u8; 32]> {
    if extra_key.is_none() && cache_salt.is_none() {
        return None;
    }
    let mut h = Sha256::new();
    h.update(b"sglang-kv-event-namespace-v1");
    for part in [extra_key, cache_salt] {
        match part {
            None => h.update([0u8]),
            Some(s) => {
                h.update([1u8]);
                h.update((s.len() as u64).to_le_bytes());
                h.update(s.as_bytes());
            }
        }
    }
    Some(h.finalize().into())
}

/// `namespaced_block_hash`: the first 8 bytes of `sha256(seed || hash as 8
/// big-endian bytes)` as a signed int; the hash itself without a seed.
pub fn namespaced_block_hash(block_hash: i64, seed: Option<&[u8; 32]>) -> i64 {
    let Some(seed) = seed else { return block_hash };
    let mut h = Sha256::new();
    h.update(seed);
    h.update(block_hash.to_be_bytes());
    event_hash(&h.finalize().into())
}
