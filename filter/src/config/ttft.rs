//! `predicted_ttft`'s settings: the plugin configuration's flat `load_factor`,
//! `prefill_us_per_char`, `service_ms`, `stay_factor` and `ttft_sample_size` keys,
//! their defaults and rules, which the policy resolves into its parameters
//! (`crate::policy::predicted_ttft::TtftParams`). They live with the rest of the
//! configuration so that one struct parses and validates it all (`deny_unknown_fields`
//! sees every key) and `config` depends on nothing else in the crate.

use super::{err, Config, ConfigError};

/// `predicted_ttft`'s bounded load: no worker above
/// `ceil((1 + load_factor) * mean in-flight) + 1`, no holder taking a new
/// conversation at `ceil((1 + load_factor) * fewest) + 2` conversations.
pub const DEFAULT_LOAD_FACTOR: f64 = 0.25;
/// `predicted_ttft`'s prefill cost per uncached char before any observation
/// (about 20 us per token at 4 chars per token).
pub const DEFAULT_PREFILL_US_PER_CHAR: f64 = 5.0;
/// `predicted_ttft`'s time one request ahead occupies the engine after its first
/// byte, before any observation.
pub const DEFAULT_SERVICE_MS: f64 = 20.0;
/// `predicted_ttft`: a conversation's worker (or a holder of the request's longest
/// match) keeps it while its predicted TTFT is at most this many times the best
/// worker's. 4 rather than 2: once new conversations are placed evenly, a queue
/// that looks twice the best for a moment is usually noise, and a move costs the
/// conversation's whole history (on the demo's workloads 2 moved 1-3 conversations
/// a run, 4 none, at the same or a lower p99).
pub const DEFAULT_STAY_FACTOR: f64 = 4.0;

/// `predicted_ttft` scores every worker of a fleet of at most `ttft_sample_size`
/// (0: of any size); a larger fleet's request scores its conversation's worker,
/// the holders of its longest match (up to that many: those with the fewest
/// conversations) and a quarter as many of the workers with the fewest
/// conversations (`crate::policy::predicted_ttft`, its sample). On by default: on
/// eight replays at 64 and 256 workers it placed every request as scoring every
/// worker did but one (within 0.1 point of cached tokens), and a fleet of 256 costs
/// Envoy about 1.3 times what 4 do, against 1.85 times scoring every worker.
pub const DEFAULT_TTFT_SAMPLE_SIZE: usize = 16;

impl Config {
    /// The settings' value rules (whether they may be set at all is the policy
    /// check in `validate`).
    pub(super) fn validate_ttft_values(&self) -> Result<(), ConfigError> {
        if let Some(f) = self.load_factor {
            if !(f.is_finite() && f >= 0.0) {
                return Err(err("load_factor", "must be a finite number >= 0"));
            }
        }
        if let Some(c) = self.prefill_us_per_char {
            if !(c.is_finite() && c > 0.0) {
                return Err(err("prefill_us_per_char", "must be a finite number > 0"));
            }
        }
        if let Some(m) = self.service_ms {
            if !(m.is_finite() && m >= 0.0) {
                return Err(err("service_ms", "must be a finite number >= 0"));
            }
        }
        if let Some(f) = self.stay_factor {
            if !(f.is_finite() && f >= 1.0) {
                return Err(err("stay_factor", "must be a finite number >= 1"));
            }
        }
        Ok(())
    }
}
