//! What the engines' KV caches hold of a request's prompt, as the collector answers
//! `POST /kv/match` (`kv_match` in the configuration): the prompt's tokens as the
//! engines make them, the block size, and per engine how many of its leading
//! blocks that engine's cache holds, or nothing where the collector's index of the
//! engine is not whole (unheard, stale, quiet): there the tree stays the judge.
//!
//! The tree records where text was sent; this is what the engines still hold after
//! evicting, counted in the engines' own blocks. `cache_aware` ranks by it when it
//! knows every candidate's (`crate::policy::cache_aware`).

use serde::Deserialize;

/// The collector's answer for one prompt.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EngineHeld {
    /// The prompt's tokens.
    pub tokens: u32,
    /// Tokens a block.
    pub block_tokens: u32,
    /// By engine name (the collector's `--engine NAME`, the worker's name here),
    /// sorted by it: the leading blocks held, `None` where the index is not whole.
    pub engines: Vec<(String, Option<u32>)>,
}

/// Why an answer was not taken: the request is routed by the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unusable {
    /// Not the collector's JSON (a proxy's error page, a truncated body).
    Malformed,
    /// Held blocks past the prompt's: the collector and this filter disagree on
    /// what was asked.
    Inconsistent,
}

impl Unusable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unusable::Malformed => "malformed",
            Unusable::Inconsistent => "inconsistent",
        }
    }
}

#[derive(Deserialize)]
struct Answer {
    tokens: u32,
    block_tokens: u32,
    engines: std::collections::BTreeMap<String, EngineAnswer>,
}

#[derive(Deserialize)]
struct EngineAnswer {
    held_blocks: Option<u32>,
}

impl EngineHeld {
    /// Reads the collector's JSON answer (`200` bodies only).
    pub fn from_answer(body: &[u8]) -> Result<EngineHeld, Unusable> {
        let answer: Answer = serde_json::from_slice(body).map_err(|_| Unusable::Malformed)?;
        if answer.block_tokens == 0 {
            return Err(Unusable::Malformed);
        }
        let blocks = answer.tokens / answer.block_tokens;
        // In name order, as the map keeps them.
        let engines: Vec<(String, Option<u32>)> = answer
            .engines
            .into_iter()
            .map(|(name, e)| (name, e.held_blocks))
            .collect();
        if engines
            .iter()
            .any(|(_, held)| held.is_some_and(|h| h > blocks))
        {
            return Err(Unusable::Inconsistent);
        }
        Ok(EngineHeld {
            tokens: answer.tokens,
            block_tokens: answer.block_tokens,
            engines,
        })
    }

    /// The leading blocks engine `name` holds; `None`: unknown to the collector, or
    /// its index is not whole.
    pub fn held(&self, name: &str) -> Option<u32> {
        // Every worker of a request's fleet is looked up: by halves, not in turn.
        let at = self
            .engines
            .binary_search_by(|(n, _)| n.as_str().cmp(name))
            .ok()?;
        self.engines.get(at).and_then(|(_, held)| *held)
    }

    /// `blocks` in the prompt's chars (`text_chars` of them in `tokens` tokens), so
    /// that a match by blocks reads as the tree's by chars.
    pub fn chars_of(&self, blocks: u32, text_chars: usize) -> usize {
        if self.tokens == 0 {
            return 0;
        }
        let held_tokens = u64::from(blocks) * u64::from(self.block_tokens);
        let chars =
            held_tokens.min(u64::from(self.tokens)) * text_chars as u64 / u64::from(self.tokens);
        usize::try_from(chars).unwrap_or(text_chars)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const ANSWER: &[u8] = br#"{"tokens":232,"block_tokens":16,"blocks":14,
        "engines":{"w0":{"index":"whole","held_blocks":14},
                   "w1":{"index":"whole","held_blocks":0},
                   "w2":{"index":"stale","held_blocks":null}}}"#;

    #[test]
    fn reads_the_collectors_answer() {
        let held = EngineHeld::from_answer(ANSWER).unwrap();
        assert_eq!((held.tokens, held.block_tokens), (232, 16));
        assert_eq!(held.held("w0"), Some(14));
        assert_eq!(held.held("w1"), Some(0));
        assert_eq!(held.held("w2"), None, "a stale index counts nothing");
        assert_eq!(
            held.held("w9"),
            None,
            "an engine the collector does not follow"
        );
    }

    #[test]
    fn refuses_what_is_not_an_answer() {
        for body in [
            &b"<html>503</html>"[..],
            b"",
            br#"{"tokens":10,"engines":{}}"#,
            br#"{"tokens":10,"block_tokens":0,"engines":{}}"#,
            br#"{"tokens":-1,"block_tokens":16,"engines":{}}"#,
            br#"{"tokens":10,"block_tokens":16,"engines":{"w0":{"held_blocks":"x"}}}"#,
        ] {
            assert_eq!(EngineHeld::from_answer(body), Err(Unusable::Malformed));
        }
        let past = br#"{"tokens":32,"block_tokens":16,"engines":{"w0":{"held_blocks":3}}}"#;
        assert_eq!(EngineHeld::from_answer(past), Err(Unusable::Inconsistent));
    }

    #[test]
    fn blocks_read_as_the_prompts_chars() {
        let held = EngineHeld::from_answer(ANSWER).unwrap();
        // 14 blocks of 16 = 224 of 232 tokens, of a 928-char prompt.
        assert_eq!(held.chars_of(14, 928), 896);
        assert_eq!(held.chars_of(0, 928), 0);
        let empty = EngineHeld::default();
        assert_eq!(empty.chars_of(3, 100), 0);
    }
}
