//! The `health` object of the plugin configuration: when a worker taken out for a
//! failure comes back (`crate::worker::health` runs the machine). Probes reuse the overload
//! probe's request, interval and timeout (`overload.probe_*`), so a worker has one
//! probe definition whatever flagged it.

use serde::Deserialize;

use super::ConfigError;

/// One good probe: a dead engine that answers a real generation is back.
pub const DEFAULT_HEALTH_PROBE_SUCCESSES: u32 = 1;
/// A worker that cannot be probed waits this long before taking traffic on trial.
pub const DEFAULT_UNPROBED_HOLD_MS: u64 = 5_000;

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
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            enabled: true,
            probe_successes_to_recover: DEFAULT_HEALTH_PROBE_SUCCESSES,
            unprobed_hold_ms: DEFAULT_UNPROBED_HOLD_MS,
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
            ..d
        };
        assert_eq!(
            short.validate().unwrap_err().field,
            "health.unprobed_hold_ms"
        );
    }
}
