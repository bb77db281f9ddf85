//! Prefix blocks an engine is still computing.
//!
//! A request's blocks enter the prefix cache when it starts, but their KV exists
//! only once its prefill is done. A request that finds them in the cache before
//! then cannot have its first token sooner: SGLang holds it back until the first
//! request's prefill is done (in-batch prefix caching, so the prefix is computed
//! once), and vLLM computes it in the same forward pass as the first request's
//! prefill, which takes as long. Both report the prefix as cached for it. Without
//! this, a burst of requests on one long prompt got their first tokens at once on
//! whichever engine took the first of them, as no engine serves them.

use crate::cache::BlockHash;
use std::collections::HashMap;

/// When each block still being computed will be done (ms, on the caller's clock).
#[derive(Clone, Debug, Default)]
pub struct Computing {
    done_at: HashMap<BlockHash, f64>,
}

impl Computing {
    /// When every one of `blocks` (a request's cached prefix) is computed, as seen
    /// at `now_ms`: `now_ms` if they all are. Blocks done by `now_ms` are forgotten;
    /// `now_ms` must not go back from call to call.
    pub fn done_by(&mut self, now_ms: f64, blocks: &[BlockHash]) -> f64 {
        self.done_at.retain(|_, done| *done > now_ms);
        blocks
            .iter()
            .filter_map(|b| self.done_at.get(b))
            .fold(now_ms, |latest, &done| latest.max(done))
    }

    /// `blocks` (a request's uncached ones) are being computed until `done_ms`.
    pub fn start(&mut self, blocks: &[BlockHash], done_ms: f64) {
        for b in blocks {
            self.done_at.insert(*b, done_ms);
        }
    }

    /// When the first token of a request comes that starts at `start_ms` (seen at
    /// `now_ms`) with its prompt's full `blocks`, the first `matched` of them found
    /// cached, and `prefill_ms` of prefill of its own: after its cached prefix is
    /// computed, its own blocks booked as computing until then. The engine model and
    /// the engine mock both schedule a prefill by it.
    pub fn first_token(
        &mut self,
        (now_ms, start_ms): (f64, f64),
        (blocks, matched): (&[BlockHash], usize),
        prefill_ms: f64,
    ) -> f64 {
        let (cached, computed_here) = blocks.split_at(matched.min(blocks.len()));
        let first_token_ms = self.done_by(now_ms, cached).max(start_ms) + prefill_ms;
        self.start(computed_here, first_token_ms);
        first_token_ms
    }

    /// Blocks still being computed, as of the last [`Computing::done_by`].
    #[cfg(test)]
    fn len(&self) -> usize {
        self.done_at.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::block_hashes;

    #[test]
    fn a_prefix_is_ready_when_the_request_computing_it_is_done() {
        let blocks = block_hashes(&"p".repeat(256), 64);
        let mut c = Computing::default();
        assert_eq!(c.done_by(0.0, &blocks), 0.0, "nothing computing: ready now");
        c.start(&blocks[2..], 50.0);
        assert_eq!(c.done_by(10.0, &blocks[..2]), 10.0, "blocks not computing");
        assert_eq!(c.done_by(10.0, &blocks), 50.0, "the last two until 50 ms");
        c.start(&blocks[..1], 70.0);
        assert_eq!(c.done_by(20.0, &blocks), 70.0, "the latest of them");
        assert_eq!(c.done_by(60.0, &blocks), 70.0);
        assert_eq!(c.len(), 1, "what was done by 60 ms is forgotten");
        assert_eq!(c.done_by(70.0, &blocks), 70.0, "done at 70: ready at 70");
        assert_eq!(c.len(), 0);
    }
}
