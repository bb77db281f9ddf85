//! `kv_match`: before deciding, ask the collector which engines' KV caches hold
//! the request's prompt (its `POST /kv/match`, on its `--listen` address, which an
//! Envoy cluster names), and wait at most `timeout_ms` for the answer; without one
//! the tree decides.

use serde::Deserialize;

use super::{err, ConfigError};

/// `timeout_ms`'s default: a collector on the same host answers a 4 KiB chat in
/// well under a millisecond; one that takes this long is stalled, and every
/// request would wait for it.
pub const DEFAULT_KV_MATCH_TIMEOUT_MS: u64 = 25;

fn default_timeout() -> u64 {
    DEFAULT_KV_MATCH_TIMEOUT_MS
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvMatchConfig {
    /// The Envoy cluster of the collector's `--listen` address.
    pub cluster: String,
    #[serde(default = "default_timeout")]
    pub timeout_ms: u64,
}

impl KvMatchConfig {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if self.cluster.is_empty() {
            return Err(err("kv_match.cluster", "must name the collector's cluster"));
        }
        if !(1..=10_000).contains(&self.timeout_ms) {
            return Err(err("kv_match.timeout_ms", "must be between 1 and 10000"));
        }
        Ok(())
    }
}
