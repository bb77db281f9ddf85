//! Which engines hold a request's prompt, block for block, by their KV events
//! (`crate::kv_index`): the prompt's token ids as the engine makes them, its full
//! blocks' hashes as the engine chains them (vLLM's `sha256_cbor` from the none
//! hash), and per engine how many of the leading blocks its index holds. A block
//! counts only if every block before it is held too: that is what the engine's
//! prefix cache can reuse.
//!
//! The router asks before it decides (`POST /kv/match` on `--listen`,
//! `crate::telemetry`); an engine whose index is not whole (nothing heard yet, a
//! gap that could not be replayed, events that stopped) says so, and the router
//! falls back to its tree for it. Sans-IO.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use llm_kv_events::BlockHash;
use llm_kv_events::{sglang, vllm};
use serde::Serialize;

use crate::kv_index::{KvIndex, Trust};
use crate::model_tokenizer::{ModelTokenizer, PromptError};

/// How the engines turn a request into token ids.
#[derive(Debug, Clone)]
pub enum Tokenizer {
    /// The engine mock's documented tokenizer (`engine_model::tokenizer`): its
    /// flattened prompt in chunks of 4 characters.
    EngineMock,
    /// A model's `tokenizer.json` and chat template, as vLLM applies them.
    Model(Arc<ModelTokenizer>),
}

impl Tokenizer {
    /// `--kv-tokenizer`: `engine-mock`, or a model directory or `tokenizer.json`
    /// (with `chat_template` replacing the model's).
    pub fn from_flag(value: &str, chat_template: Option<&Path>) -> anyhow::Result<Tokenizer> {
        if value == "engine-mock" {
            return Ok(Tokenizer::EngineMock);
        }
        let model = ModelTokenizer::load(Path::new(value), chat_template)?;
        Ok(Tokenizer::Model(Arc::new(model)))
    }

    /// The token ids the engine computes for a request to `path` with `body`.
    pub fn token_ids(&self, path: &str, body: &[u8]) -> Result<Vec<u32>, PromptError> {
        let value: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| PromptError::Body(e.to_string()))?;
        match self {
            Tokenizer::EngineMock => {
                use engine_model::prompt::{flatten, Endpoint};
                let endpoint = match path {
                    "/v1/chat/completions" => Endpoint::Chat,
                    "/v1/completions" => Endpoint::Completions,
                    "/generate" => Endpoint::Generate,
                    other => return Err(PromptError::Path(other.to_string())),
                };
                let text = flatten(endpoint, &value).map_err(|e| PromptError::Body(e.0))?;
                Ok(engine_model::tokenizer::token_ids(&text))
            }
            Tokenizer::Model(model) => model.token_ids(path, &value),
        }
    }
}

/// How the engines hash their blocks: the tokens a block (an SGLang page) holds,
/// and the chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hashing {
    pub block_tokens: usize,
    pub chain: Chain,
}

/// The engines' hash chain (`--kv-hash`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chain {
    /// vLLM's `sha256_cbor` from the none hash (`sha256_cbor` of `PYTHONHASHSEED`,
    /// which must be set on every engine for anyone to recompute it); events carry
    /// the digest's last 8 bytes as an integer (vLLM's default) or the whole digest.
    Vllm {
        none_hash: [u8; 32],
        int_hashes: bool,
    },
    /// SGLang's per-page SHA-256 chain, its events carrying each digest's first 8
    /// bytes as a signed integer (no cache salt, no LoRA adapter).
    Sglang,
}

impl Hashing {
    /// vLLM's chain from `seed` (its `PYTHONHASHSEED`).
    pub fn vllm(block_tokens: usize, seed: &str, int_hashes: bool) -> Hashing {
        Hashing {
            block_tokens,
            chain: Chain::Vllm {
                none_hash: vllm::none_hash(seed),
                int_hashes,
            },
        }
    }

    /// SGLang's chain over pages of `page_size` tokens (its `--page-size`).
    pub fn sglang(page_size: usize) -> Hashing {
        Hashing {
            block_tokens: page_size,
            chain: Chain::Sglang,
        }
    }

    /// The hashes the engine publishes for the full blocks of `token_ids`.
    pub fn block_hashes(&self, token_ids: &[u32]) -> Vec<BlockHash> {
        match &self.chain {
            Chain::Vllm {
                none_hash,
                int_hashes,
            } => vllm::block_hashes(token_ids, self.block_tokens, none_hash)
                .iter()
                .map(|d| vllm::external_hash(d, *int_hashes))
                .collect(),
            Chain::Sglang => {
                let full = token_ids.len() / self.block_tokens.max(1) * self.block_tokens;
                sglang::page_hashes(token_ids.get(..full).unwrap_or_default(), self.block_tokens)
                    .into_iter()
                    // The signed int's bit pattern, as the wire keeps it.
                    .map(|h| BlockHash::Int(h as u64))
                    .collect()
            }
        }
    }
}

/// What the collector matches requests with (`--kv-tokenizer`, `--kv-block-tokens`,
/// `--kv-hash-seed`, `--kv-digest-hashes`).
#[derive(Debug, Clone)]
pub struct Matcher {
    pub tokenizer: Tokenizer,
    pub hashing: Hashing,
}

impl Matcher {
    /// Matches a request to `path` with `body` against every engine's index.
    pub fn answer(
        &self,
        path: &str,
        body: &[u8],
        indexes: &BTreeMap<String, KvIndex>,
    ) -> Result<Matched, PromptError> {
        let ids = self.tokenizer.token_ids(path, body)?;
        Ok(matched(&ids, &self.hashing, indexes))
    }
}

/// The answer: the prompt's tokens and full blocks, and per engine what it holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Matched {
    pub tokens: usize,
    pub block_tokens: usize,
    pub blocks: usize,
    pub engines: BTreeMap<String, EngineMatch>,
}

/// One engine's part: the leading blocks it holds, when its index can be trusted.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineMatch {
    /// `whole`, `unheard`, `stale` or `quiet` (`crate::kv_index::Trust`).
    pub index: &'static str,
    /// `None` unless the index is whole.
    pub held_blocks: Option<usize>,
}

/// The leading blocks of `hashes` that `index` holds.
pub fn held_blocks(hashes: &[BlockHash], index: &KvIndex) -> usize {
    hashes.iter().take_while(|h| index.holds(h)).count()
}

fn trust_name(t: Trust) -> &'static str {
    match t {
        Trust::Unheard => "unheard",
        Trust::Whole => "whole",
        Trust::Stale => "stale",
        Trust::Quiet => "quiet",
    }
}

/// Matches `token_ids` against every engine's index.
pub fn matched(
    token_ids: &[u32],
    hashing: &Hashing,
    indexes: &BTreeMap<String, KvIndex>,
) -> Matched {
    let hashes = hashing.block_hashes(token_ids);
    let engines = indexes
        .iter()
        .map(|(name, index)| {
            let trust = index.trust();
            let held = (trust == Trust::Whole).then(|| held_blocks(&hashes, index));
            let m = EngineMatch {
                index: trust_name(trust),
                held_blocks: held,
            };
            (name.clone(), m)
        })
        .collect();
    Matched {
        tokens: token_ids.len(),
        block_tokens: hashing.block_tokens,
        blocks: hashes.len(),
        engines,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_kv_events::{BlockStored, Event, EventBatch, TokenIds};

    fn mock_hashing() -> Hashing {
        Hashing::vllm(16, vllm::DEFAULT_NONE_HASH_SEED, true)
    }

    fn chat(text: &str) -> Vec<u8> {
        serde_json::json!({"model": "m", "messages": [{"role": "user", "content": text}]})
            .to_string()
            .into_bytes()
    }

    /// An index that stored `hashes` in one batch (and so is whole).
    fn index_holding(hashes: &[BlockHash]) -> KvIndex {
        let mut index = KvIndex::default();
        let batch = EventBatch {
            ts: 0.0,
            events: vec![Event::BlockStored(Box::new(BlockStored::new(
                hashes.to_vec(),
                None,
                TokenIds::Ids(vec![0; hashes.len() * 16]),
                16,
            )))],
            data_parallel_rank: None,
        };
        index.apply(0, &batch);
        index
    }

    #[test]
    fn the_mock_tokenizer_reads_the_prompt_as_the_engine_mock_does() {
        let t = Tokenizer::EngineMock;
        // "user: " + text + "\n": 4 characters a token.
        let ids = t
            .token_ids("/v1/chat/completions", &chat("abcdefghij"))
            .unwrap();
        assert_eq!(
            ids,
            engine_model::tokenizer::token_ids("user: abcdefghij\n")
        );
        let completion = br#"{"model":"m","prompt":"abcd"}"#;
        assert_eq!(
            t.token_ids("/v1/completions", completion).unwrap(),
            [engine_model::tokenizer::token_id("abcd")]
        );
        assert!(matches!(
            t.token_ids("/v1/embeddings", completion),
            Err(PromptError::Path(_))
        ));
        assert!(matches!(
            t.token_ids("/v1/completions", b"{not json"),
            Err(PromptError::Body(_))
        ));
        assert!(matches!(
            t.token_ids("/v1/chat/completions", br#"{"messages":3}"#),
            Err(PromptError::Body(_))
        ));
        assert!(matches!(
            Tokenizer::from_flag("engine-mock", None),
            Ok(Tokenizer::EngineMock)
        ));
        let missing = Tokenizer::from_flag("/nonexistent/tokenizer.json", None).unwrap_err();
        assert!(
            format!("{missing:#}").contains("/nonexistent/tokenizer.json"),
            "{missing:#}"
        );
    }

    #[test]
    fn an_engine_holds_the_leading_blocks_it_stored_and_no_block_past_a_gap() {
        let h = mock_hashing();
        let ids: Vec<u32> = (0..100).collect();
        let hashes = h.block_hashes(&ids);
        assert_eq!(hashes.len(), 6, "100 tokens: 6 full blocks of 16");
        let mut indexes = BTreeMap::new();
        indexes.insert("all".to_string(), index_holding(&hashes));
        indexes.insert("first-two".to_string(), index_holding(&hashes[..2]));
        // The 2nd block missing: the 3rd and later are no prefix the engine reuses.
        let gap: Vec<BlockHash> = [&hashes[..1], &hashes[2..]].concat();
        indexes.insert("gap".to_string(), index_holding(&gap));
        indexes.insert("silent".to_string(), KvIndex::default());
        let m = matched(&ids, &h, &indexes);
        assert_eq!((m.tokens, m.block_tokens, m.blocks), (100, 16, 6));
        let held = |name: &str| m.engines[name].held_blocks;
        assert_eq!(held("all"), Some(6));
        assert_eq!(held("first-two"), Some(2));
        assert_eq!(held("gap"), Some(1));
        assert_eq!(held("silent"), None, "nothing heard: not trusted");
        assert_eq!(m.engines["silent"].index, "unheard");
        assert_eq!(m.engines["all"].index, "whole");
    }

    #[test]
    fn the_chain_is_the_engines_own_so_another_seed_holds_nothing() {
        let ids: Vec<u32> = (0..64).collect();
        let mock = mock_hashing();
        let mut indexes = BTreeMap::new();
        indexes.insert("w0".to_string(), index_holding(&mock.block_hashes(&ids)));
        let other = Hashing::vllm(16, "another-seed", true);
        assert_eq!(
            matched(&ids, &other, &indexes).engines["w0"].held_blocks,
            Some(0)
        );
        // A block is 16 tokens here: at 32 a block the chain is another.
        let wide = Hashing::vllm(32, vllm::DEFAULT_NONE_HASH_SEED, true);
        assert_eq!(
            matched(&ids, &wide, &indexes).engines["w0"].held_blocks,
            Some(0)
        );
        // Whole digests, as with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: another key.
        let bytes = Hashing::vllm(16, vllm::DEFAULT_NONE_HASH_SEED, false);
        assert_eq!(
            matched(&ids, &bytes, &indexes).engines["w0"].held_blocks,
            Some(0)
        );
        assert_eq!(
            matched(&ids, &mock, &indexes).engines["w0"].held_blocks,
            Some(4)
        );
    }

    #[test]
    fn sglang_pages_hash_as_sglang_publishes_them() {
        let ids: Vec<u32> = (0..100).collect();
        let published: Vec<BlockHash> = sglang::page_hashes(&ids[..96], 16)
            .into_iter()
            .map(|h| BlockHash::Int(h as u64))
            .collect();
        assert!(
            published.iter().any(|h| h.as_i64().is_some_and(|v| v < 0)),
            "a negative hash keeps its bit pattern"
        );
        let mut indexes = BTreeMap::new();
        indexes.insert("s0".to_string(), index_holding(&published));
        let sglang = Hashing::sglang(16);
        assert_eq!(sglang.block_hashes(&ids), published, "full pages only");
        assert_eq!(
            matched(&ids, &sglang, &indexes).engines["s0"].held_blocks,
            Some(6)
        );
        assert_eq!(
            matched(&ids, &mock_hashing(), &indexes).engines["s0"].held_blocks,
            Some(0),
            "vLLM's chain is another"
        );
    }
}
