//! Randomness, injected: every tie-break, sample and PD room draws from an `Rng`
//! the caller passes in, so the core has no hidden entropy and tests (and replays
//! with `rng_seed`) are deterministic. The filter seeds `SplitMix64` from the host,
//! or from `rng_seed`; PD rooms draw from the host's entropy (see `Rooms`).

/// The random source the host provides; injected so tests are deterministic.
pub trait Rng {
    fn next_u64(&mut self) -> u64;

    /// Uniform in `0..n`; 0 when `n` is 0 (an index no slice has, never a
    /// division by zero: that would trap the VM).
    fn below(&mut self, n: usize) -> usize {
        self.next_u64().checked_rem(n as u64).unwrap_or(0) as usize
    }
}

/// SplitMix64: tiny, seedable, good enough for tie-breaks and sampling.
#[derive(Debug, Clone)]
pub struct SplitMix64(pub u64);

impl Rng for SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// One value drawn from an `Rng` before, handed where the generator itself cannot
/// go (a closure called while its caller holds the generator): every draw is it.
#[derive(Debug, Clone, Copy)]
pub struct Drawn(pub u64);

impl Rng for Drawn {
    fn next_u64(&mut self) -> u64 {
        self.0
    }
}

/// PD rooms: each must be unguessable and unique across threads and Envoys, so they
/// come from the host's entropy (`entropy`, `None` when the host refuses), falling
/// back to the tie-break generator.
pub struct Rooms<'a> {
    pub entropy: &'a mut dyn FnMut() -> Option<u64>,
    pub fallback: &'a mut dyn Rng,
}

impl Rng for Rooms<'_> {
    fn next_u64(&mut self) -> u64 {
        match (self.entropy)() {
            Some(v) => v,
            None => self.fallback.next_u64(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn below_stays_in_range_and_survives_zero() {
        let mut r = SplitMix64(7);
        assert!((0..1000).all(|_| r.below(3) < 3));
        assert_eq!(r.below(0), 0);
    }
}
