//! vLLM's prefix-cache block hashes with `--prefix-caching-hash-algo sha256_cbor`.
//!
//! vLLM hashes each full block as
//! `sha256(cbor2.dumps((parent_hash, tuple(block_tokens), extra_keys), canonical=True))`
//! (`hash_block_tokens` in `vllm/v1/core/kv_cache_utils.py`), where the first
//! block's parent is `NONE_HASH`. This is `sha256_cbor`; vLLM's default algorithm,
//! `sha256`, pickles the same tuple instead, which only Python reproduces, so an
//! engine whose hashes a router recomputes runs with
//! `--prefix-caching-hash-algo sha256_cbor`.
//!
//! What a `BlockStored` carries is not always the digest: by default
//! (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`) vLLM publishes the digest's last
//! 8 bytes as an unsigned int, see [`external_hash`].

use std::ops::Range;

use sha2::{Digest, Sha256};

use crate::cbor::{self, CborValue};
use crate::wire::BlockHash;

/// The seed vLLM 0.34 derives `NONE_HASH` from when `PYTHONHASHSEED` is unset and
/// the hash is cryptographic. vLLM 0.20 (and 0.11) instead drew 32 random bytes per
/// process unless `PYTHONHASHSEED` was set, so no one else can compute their hashes;
/// set `PYTHONHASHSEED` on such engines and pass its value to [`none_hash`].
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// `NONE_HASH = sha256_cbor(seed)`: the parent hash of every sequence's first block.
/// `seed` is `PYTHONHASHSEED` if the engine has it set, else
/// [`DEFAULT_NONE_HASH_SEED`].
pub fn none_hash(seed: &str) -> [u8; 32] {
    let mut buf = Vec::with_capacity(seed.len() + 9);
    cbor::write_text(&mut buf, seed);
    Sha256::digest(&buf).into()
}

/// One block's hash. `parent` is the previous block's digest, or `NONE_HASH` for a
/// sequence's first block (vLLM substitutes `NONE_HASH` for any falsy parent, so
/// an empty slice here would be hashed as-is where vLLM would not: don't pass one).
/// `extra_keys` is the tuple vLLM builds for the block, `None` when it has none.
pub fn hash_block_tokens(
    parent: &[u8],
    tokens: &[u32],
    extra_keys: Option<&[CborValue]>,
) -> [u8; 32] {
    // Streamed instead of built as a CborValue: this runs for every block of every
    // routed prompt.
    let mut buf = Vec::with_capacity(48 + tokens.len() * 5);
    cbor::write_head(&mut buf, cbor::MAJOR_ARRAY, 3);
    cbor::write_bytes(&mut buf, parent);
    cbor::write_head(&mut buf, cbor::MAJOR_ARRAY, tokens.len() as u64);
    for &t in tokens {
        cbor::write_uint(&mut buf, t.into());
    }
    match extra_keys {
        None => buf.push(0xf6),
        Some(keys) => {
            cbor::write_head(&mut buf, cbor::MAJOR_ARRAY, keys.len() as u64);
            for k in keys {
                k.encode_into(&mut buf);
            }
        }
    }
    Sha256::digest(&buf).into()
}

/// The digests of the full blocks of `token_ids`, as vLLM chains them for a
/// request with no extra keys (no LoRA, multimodal input, cache salt or prompt
/// embeddings). A trailing partial block has no hash, and neither does anything
/// when `block_size` is 0.
pub fn block_hashes(token_ids: &[u32], block_size: usize, none_hash: &[u8]) -> Vec<[u8; 32]> {
    block_hashes_with(token_ids, block_size, none_hash, |_, _| None)
}

/// Like [`block_hashes`], with the extra keys of each block from `extra_keys(index,
/// token_range)`, for keys this crate has no builder for (lookahead hashing,
/// prompt embeddings, another release's key shapes).
pub fn block_hashes_with<F>(
    token_ids: &[u32],
    block_size: usize,
    none_hash: &[u8],
    mut extra_keys: F,
) -> Vec<[u8; 32]>
where
    F: FnMut(usize, Range<usize>) -> Option<Vec<CborValue>>,
{
    if block_size == 0 {
        return Vec::new();
    }
    let mut out: Vec<[u8; 32]> = Vec::with_capacity(token_ids.len() / block_size);
    for (i, block) in token_ids.chunks_exact(block_size).enumerate() {
        let start = i * block_size;
        let keys = extra_keys(i, start..start + block_size);
        let parent: &[u8] = out.last().map_or(none_hash, |h| h.as_slice());
        let h = hash_block_tokens(parent, block, keys.as_deref());
        out.push(h);
    }
    out
}

/// A multimodal item's placeholder tokens in the prompt, as vLLM's `mm_features`
/// give them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmItem {
    /// The item's content hash (`mm_feature.identifier`).
    pub identifier: String,
    /// First placeholder position.
    pub offset: usize,
    /// Placeholder count.
    pub length: usize,
}

/// How vLLM shapes the extra keys it hashes; the shape changed between releases
/// and changes every hash of a LoRA, multimodal or salted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStyle {
    /// vLLM 0.34: `("lora", name, path)`, `("mm", identifier, offset)`,
    /// `("cache_salt", salt)`. Events publish these untagged and without the LoRA
    /// path, so they cannot be rebuilt from an event alone.
    Tagged,
    /// vLLM 0.20: `name`, `(identifier, offset)`, `salt`, exactly what events publish.
    Untagged,
}

/// The parts of a request that vLLM folds into its block hashes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestKeys {
    /// `(lora_name, lora_path)`; [`KeyStyle::Untagged`] hashes the name only.
    pub lora: Option<(String, String)>,
    /// Sorted by offset and not overlapping, as vLLM assumes.
    pub mm: Vec<MmItem>,
    /// Hashed into the first block only.
    pub cache_salt: Option<String>,
}

impl RequestKeys {
    /// `generate_block_hash_extra_keys` for the block covering `tokens`: LoRA
    /// first, then every multimodal item overlapping the block with its offset
    /// relative to the block start (negative when it began in an earlier block),
    /// then the salt. `None` when there are none, as vLLM hashes `None` then.
    pub fn extra_keys(&self, tokens: Range<usize>, style: KeyStyle) -> Option<Vec<CborValue>> {
        let mut keys = Vec::new();
        if let Some((name, path)) = &self.lora {
            keys.push(match style {
                KeyStyle::Tagged => {
                    tuple(["lora".into(), name.as_str().into(), path.as_str().into()])
                }
                KeyStyle::Untagged => name.as_str().into(),
            });
        }
        for item in &self.mm {
            let end = item.offset.saturating_add(item.length);
            if tokens.end > item.offset && tokens.start < end {
                let rel = item.offset as i128 - tokens.start as i128;
                let id: CborValue = item.identifier.as_str().into();
                keys.push(match style {
                    KeyStyle::Tagged => tuple(["mm".into(), id, CborValue::Int(rel)]),
                    KeyStyle::Untagged => tuple([id, CborValue::Int(rel)]),
                });
            }
        }
        if let Some(salt) = self
            .cache_salt
            .as_deref()
            .filter(|s| !s.is_empty() && tokens.start == 0)
        {
            keys.push(match style {
                KeyStyle::Tagged => tuple(["cache_salt".into(), salt.into()]),
                KeyStyle::Untagged => salt.into(),
            });
        }
        (!keys.is_empty()).then_some(keys)
    }

    /// The digests of the full blocks of a request with these keys.
    pub fn block_hashes(
        &self,
        token_ids: &[u32],
        block_size: usize,
        none_hash: &[u8],
        style: KeyStyle,
    ) -> Vec<[u8; 32]> {
        block_hashes_with(token_ids, block_size, none_hash, |_, range| {
            self.extra_keys(range, style)
        })
    }
}

fn tuple<const N: usize>(items: [CborValue; N]) -> CborValue {
    CborValue::Array(items.into())
}

/// `maybe_convert_block_hash`: what a digest becomes in `BlockStored.block_hashes`.
/// With `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` at its default of 1 that is
/// `int.from_bytes(digest, "big") & (2**64 - 1)`, the last 8 bytes; with 0 the
/// digest itself.
pub fn external_hash(digest: &[u8], use_int_block_hashes: bool) -> BlockHash {
    if !use_int_block_hashes {
        return BlockHash::Bytes(digest.to_vec());
    }
    let tail = digest
        .get(digest.len().saturating_sub(8)..)
        .unwrap_or_default();
    BlockHash::Int(tail.iter().fold(0u64, |acc, b| acc << 8 | u64::from(*b)))
}
