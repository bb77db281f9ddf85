//! The mock tokenizer: the token ids the engine mock publishes in its KV cache
//! events, and the one place they are defined.
//!
//! The mock has no model and no vocabulary: it counts 4 characters a token
//! ([`CHARS_PER_TOKEN`]) and caches 64-character blocks. A KV event carries token
//! ids and block hashes computed from them, so the mock gives every token an id:
//!
//! * the text is the prompt as the cache sees it, [`crate::prompt::flatten`]ed (a
//!   chat is `role + ": " + text + "\n"` per message);
//! * it is cut into chunks of 4 characters (Unicode scalar values, as the cache
//!   counts them, never bytes), the last chunk shorter when the text's length is
//!   not a multiple of 4;
//! * a chunk's id is the first 4 bytes of SHA-256 of the chunk's UTF-8 bytes, read
//!   big-endian, with the top bit cleared: a `u32` below 2^31, the same on every
//!   machine and in every language. In Python:
//!   `int.from_bytes(hashlib.sha256(chunk.encode()).digest()[:4], "big") & 0x7FFFFFFF`.
//!
//! So a prompt of `n` characters has `ceil(n / 4)` tokens, the `prompt_tokens` the
//! mock reports, and a 64-character cache block is 16 tokens, vLLM's default block
//! size: cache block `i` is tokens `16 i .. 16 i + 16`. The block hashes the mock
//! publishes are vLLM's (`sha256_cbor` chained from the none hash of
//! `vllm-none-hash`, see the engine mock's `kv_events`) over these ids, so a router computes
//! them as it would for vLLM: `llm_kv_events::vllm::block_hashes(&token_ids(text),
//! 16, &none_hash)`.
//!
//! Two different chunks can share an id (31 bits), which only makes two blocks
//! share a published hash; tests never meet it. One edge differs from a real
//! engine: a text whose last chunk is short still counts that chunk as a token, so
//! when the text ends 61 to 63 characters into a block, vLLM would count that block
//! full (16 ids) while the mock's cache, which cuts characters, does not cache it
//! and never announces it.

use sha2::{Digest, Sha256};

pub use crate::cache::CHARS_PER_TOKEN;

/// The id of one chunk (normally [`CHARS_PER_TOKEN`] characters).
pub fn token_id(chunk: &str) -> u32 {
    let digest = Sha256::digest(chunk.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) & 0x7fff_ffff
}

/// The token ids of `text`: one per 4 characters, the last for what is left.
pub fn token_ids(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len() / CHARS_PER_TOKEN + 1);
    let (mut start, mut in_chunk) = (0, 0);
    for (i, ch) in text.char_indices() {
        in_chunk += 1;
        if in_chunk == CHARS_PER_TOKEN {
            let end = i + ch.len_utf8();
            ids.push(token_id(&text[start..end]));
            start = end;
            in_chunk = 0;
        }
    }
    if start < text.len() {
        ids.push(token_id(&text[start..]));
    }
    ids
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::prompt_tokens_for_chars;

    #[test]
    fn ids_are_the_first_four_digest_bytes_below_2_pow_31() {
        // sha256(b"abcd") = 88d4266f d4e6338d ...: 0x88d4266f without its top bit.
        assert_eq!(token_id("abcd"), 0x08d4_266f);
        // sha256(b"") = e3b0c442 ...
        assert_eq!(token_id(""), 0x63b0_c442);
        assert_eq!(
            token_ids("abcdabcdab"),
            [0x08d4_266f, 0x08d4_266f, token_id("ab")]
        );
        assert!(token_ids(&"xyz!".repeat(100)).iter().all(|&t| t < 1 << 31));
    }

    #[test]
    fn chunks_count_characters_and_match_the_reported_tokens() {
        let text = "é世🦀aé世🦀bxy";
        assert_eq!(
            token_ids(text),
            [token_id("é世🦀a"), token_id("é世🦀b"), token_id("xy")]
        );
        for n in 0..70 {
            let text = "ab🦀d".repeat(n / 4) + &"x".repeat(n % 4);
            assert_eq!(token_ids(&text).len(), prompt_tokens_for_chars(n), "{n}");
        }
        assert!(token_ids("").is_empty());
    }
}

/// The symbols of [`id_codes`]: 64, six bits each.
const CODE_SYMBOLS: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// A model tokenizer's ids as text the mock's cache reads by characters: each id
/// written as [`CHARS_PER_TOKEN`] symbols of six bits (its low 24 bits: every
/// vocabulary a model ships is smaller), so a 64-character block is 16 of the
/// model's tokens and `prompt_tokens` is the ids' count (the engine mock's
/// `--tokenizer`). [`code_ids`] reads them back.
pub fn id_codes(ids: &[u32]) -> String {
    let mut out = String::with_capacity(ids.len() * CHARS_PER_TOKEN);
    for id in ids {
        for shift in [18, 12, 6, 0] {
            let symbol = CODE_SYMBOLS[((id >> shift) & 63) as usize];
            out.push(char::from(symbol));
        }
    }
    out
}

/// The ids [`id_codes`] wrote (a symbol outside its alphabet reads as 0; a short
/// last group is dropped).
pub fn code_ids(codes: &str) -> Vec<u32> {
    let value = |b: u8| {
        CODE_SYMBOLS
            .iter()
            .position(|&s| s == b)
            .map_or(0, |p| p as u32)
    };
    codes
        .as_bytes()
        .chunks_exact(CHARS_PER_TOKEN)
        .map(|group| group.iter().fold(0, |id, &b| id << 6 | value(b)))
        .collect()
}

#[cfg(test)]
mod code_tests {
    use super::*;

    #[test]
    fn ids_written_as_codes_read_back_four_characters_each() {
        let ids = [0, 1, 63, 64, 4095, 128_255, (1 << 24) - 1];
        let codes = id_codes(&ids);
        assert_eq!(codes.chars().count(), ids.len() * CHARS_PER_TOKEN);
        assert_eq!(code_ids(&codes), ids);
        assert_eq!(id_codes(&[1 << 24]), id_codes(&[0]), "the low 24 bits");
        assert!(codes.is_ascii());
    }
}
