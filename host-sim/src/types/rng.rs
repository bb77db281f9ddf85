//! The one deterministic random source behind a filter VM's WASI `random_get` (seeded
//! per VM from the host's seed) and fault probabilities, so a run is a function of its
//! seed. The generator is the filter crate's SplitMix64 (written once in the
//! workspace); this adds the byte filling WASI needs.

use llm_router::rng::{Rng as _, SplitMix64};

pub(crate) struct Rng(SplitMix64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Self(SplitMix64(seed))
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    pub(crate) fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}
