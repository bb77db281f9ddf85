//! The engine's cost model, in milliseconds: a request waits for a running slot, then
//! pays `ttft_ms + prefill_us_per_token * uncached_tokens / 1000` before its first
//! token (so cache hits show in latency as on a real engine) and
//! `decode_ms_per_token` between output tokens.

use crate::cache::CacheLookup;

/// The engine mock's latency knobs (its command-line flags of the same names).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Latency {
    /// Fixed time to first token, on top of prefill.
    pub ttft_ms: f64,
    /// Prefill cost per uncached prompt token, in microseconds.
    pub prefill_us_per_token: f64,
    /// Time between two output tokens.
    pub decode_ms_per_token: f64,
}

impl Default for Latency {
    /// The engine mock's defaults.
    fn default() -> Self {
        Self {
            ttft_ms: 0.0,
            prefill_us_per_token: 20.0,
            decode_ms_per_token: 0.0,
        }
    }
}

/// A latency flag's value (`--decode-ms-per-token` and its kin, of the engine mock
/// and of the simulator that models it): a finite number, 0 or more.
pub fn non_negative(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(format!("`{s}` is not a finite number, 0 or more")),
    }
}

impl Latency {
    /// Time from getting a slot to the first token.
    pub fn prefill_ms(&self, lookup: &CacheLookup) -> f64 {
        self.ttft_ms + self.prefill_us_per_token * lookup.uncached_tokens() as f64 / 1000.0
    }

    /// Time from the first token to the last of `output_tokens`.
    pub fn decode_ms(&self, output_tokens: u32) -> f64 {
        self.decode_ms_per_token * output_tokens.saturating_sub(1) as f64
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_latency_flag_is_a_finite_number_not_below_zero() {
        assert_eq!(non_negative("20"), Ok(20.0));
        assert_eq!(non_negative("0"), Ok(0.0));
        for bad in ["-1", "NaN", "inf", "fast"] {
            let e = non_negative(bad).unwrap_err();
            assert!(e.contains(bad) && e.contains("0 or more"), "{e}");
        }
    }

    use super::*;

    #[test]
    fn prefill_pays_only_for_uncached_tokens() {
        let l = Latency {
            ttft_ms: 5.0,
            prefill_us_per_token: 100.0,
            decode_ms_per_token: 2.0,
        };
        let lookup = CacheLookup {
            prompt_chars: 400,
            total_blocks: 6,
            matched_blocks: 4,
            prompt_tokens: 100,
            cached_tokens: 64,
        };
        assert_eq!(l.prefill_ms(&lookup), 5.0 + 3.6);
        assert_eq!(l.decode_ms(8), 14.0);
        assert_eq!(l.decode_ms(0), 0.0);
    }
}
