//! The `health` object of the plugin configuration: when failures take a worker out
//! and when it comes back (`crate::worker::health` runs the machine). Probes reuse the overload
//! probe's request, interval and timeout (`overload.probe_*`), so a worker has one
//! probe definition whatever flagged it.

use serde::Deserialize;

use super::ConfigError;

/// One good probe: a dead engine that answers a real generation is back.
pub const DEFAULT_HEALTH_PROBE_SUCCESSES: u32 = 1;
/// A worker that cannot be probed waits this long before taking traffic on trial.
pub const DEFAULT_UNPROBED_HOLD_MS: u64 = 5_000;

/// Envoy's `consecutive_5xx` default: resets, timeouts and 5xx in a row that take
/// a worker out (a refused connect takes it out at once).
pub const DEFAULT_CONSECUTIVE_FAILURES: u32 = 5;
/// Envoy's `max_ejection_percent` default: the share of a pool that a run of
/// failures may take out at once; one worker always may (Envoy's rule too), so a
/// pool of 4 at 10% can lose one to failures and not two.
pub const DEFAULT_MAX_EJECTION_PERCENT: u32 = 10;
/// Added to the least time out for each ejection after the first.
pub const DEFAULT_BACKOFF_MS: u64 = 10_000;
/// Envoy's `max_ejection_time` default: the backoff's ceiling, and how long a worker
/// back in rotation keeps its ejections on record.
pub const DEFAULT_MAX_BACKOFF_MS: u64 = 300_000;
/// A failure that follows a request body larger than this (16 MiB) is the
/// request's, not the engine's: engines refuse bodies past their own limits, some
/// by resetting the connection.
pub const DEFAULT_JUDGED_BODY_BYTES: u64 = 16 * 1024 * 1024;

fn default_consecutive() -> u32 {
    DEFAULT_CONSECUTIVE_FAILURES
}
fn default_max_ejection_percent() -> u32 {
    DEFAULT_MAX_EJECTION_PERCENT
}
fn default_backoff() -> u64 {
    DEFAULT_BACKOFF_MS
}
fn default_max_backoff() -> u64 {
    DEFAULT_MAX_BACKOFF_MS
}
fn default_judged_body() -> u64 {
    DEFAULT_JUDGED_BODY_BYTES
}
fn default_true() -> bool {
    true
}
fn default_probe_successes() -> u32 {
    DEFAULT_HEALTH_PROBE_SUCCESSES
}
fn default_hold() -> u64 {
    DEFAULT_UNPROBED_HOLD_MS
}

/// The `health` object of the plugin configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    /// `false`: failures take no worker out (the table is cleared).
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default = "default_probe_successes")]
    pub probe_successes_to_recover: u32,
    #[serde(default = "default_hold")]
    pub unprobed_hold_ms: u64,
    #[serde(default = "default_consecutive")]
    pub consecutive_failures: u32,
    #[serde(default = "default_max_ejection_percent")]
    pub max_ejection_percent: u32,
    #[serde(default = "default_backoff")]
    pub backoff_ms: u64,
    #[serde(default = "default_max_backoff")]
    pub max_backoff_ms: u64,
    #[serde(default = "default_judged_body")]
    pub judged_body_bytes: u64,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            probe_successes_to_recover: DEFAULT_HEALTH_PROBE_SUCCESSES,
            unprobed_hold_ms: DEFAULT_UNPROBED_HOLD_MS,
            consecutive_failures: DEFAULT_CONSECUTIVE_FAILURES,
            max_ejection_percent: DEFAULT_MAX_EJECTION_PERCENT,
            backoff_ms: DEFAULT_BACKOFF_MS,
            max_backoff_ms: DEFAULT_MAX_BACKOFF_MS,
            judged_body_bytes: DEFAULT_JUDGED_BODY_BYTES,
        }
    }
}

impl HealthConfig {
    pub fn validate(&self) -> Result<(), ConfigError> {
        let rule = |field: &str, rule: &str| ConfigError {
            field: format!("health.{field}"),
            rule: rule.to_string(),
        };
        if self.probe_successes_to_recover == 0 {
            return Err(rule("probe_successes_to_recover", "must be >= 1"));
        }
        if self.unprobed_hold_ms < 10 {
            return Err(rule("unprobed_hold_ms", "must be >= 10"));
        }
        if self.consecutive_failures == 0 {
            return Err(rule("consecutive_failures", "must be >= 1"));
        }
        if self.max_ejection_percent > 100 {
            return Err(rule("max_ejection_percent", "must be <= 100"));
        }
        if self.judged_body_bytes == 0 {
            return Err(rule("judged_body_bytes", "must be >= 1"));
        }
        if self.backoff_ms > self.max_backoff_ms {
            return Err(rule("backoff_ms", "must be <= health.max_backoff_ms"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn defaults_and_rules() {
        let d = HealthConfig::default();
        assert!(d.enabled);
        assert_eq!(d.validate(), Ok(()));
        let zero = HealthConfig {
            probe_successes_to_recover: 0,
            ..d.clone()
        };
        assert_eq!(
            zero.validate().unwrap_err().field,
            "health.probe_successes_to_recover"
        );
        let short = HealthConfig {
            unprobed_hold_ms: 9,
            ..d.clone()
        };
        assert_eq!(
            short.validate().unwrap_err().field,
            "health.unprobed_hold_ms"
        );
        assert_eq!(
            (d.consecutive_failures, d.max_ejection_percent),
            (5, 10),
            "Envoy's outlier detection defaults"
        );
        let cases = [
            (
                HealthConfig {
                    consecutive_failures: 0,
                    ..d.clone()
                },
                "health.consecutive_failures",
            ),
            (
                HealthConfig {
                    max_ejection_percent: 101,
                    ..d.clone()
                },
                "health.max_ejection_percent",
            ),
            (
                HealthConfig {
                    judged_body_bytes: 0,
                    ..d.clone()
                },
                "health.judged_body_bytes",
            ),
            (
                HealthConfig {
                    backoff_ms: 2,
                    max_backoff_ms: 1,
                    ..d.clone()
                },
                "health.backoff_ms",
            ),
        ];
        for (c, field) in cases {
            assert_eq!(c.validate().unwrap_err().field, field);
        }
        let edge = HealthConfig {
            consecutive_failures: 1,
            max_ejection_percent: 100,
            judged_body_bytes: 1,
            backoff_ms: 0,
            max_backoff_ms: 0,
            ..d
        };
        assert_eq!(edge.validate(), Ok(()), "each rule's boundary is allowed");
    }
}
