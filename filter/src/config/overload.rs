//! The `overload` object of the plugin configuration: the thresholds and probe
//! settings of the latency-aware overload flags (`crate::worker::overload` runs the
//! machine), their defaults, and the rules they must follow. It lives with the rest
//! of the configuration so `config` depends on nothing else in the crate.

use serde::Deserialize;

use super::{Config, ConfigError, Target, WorkerConfig};

pub const DEFAULT_TTFT_ENTER_S: f64 = 30.0;
pub const DEFAULT_TTFT_RECOVER_S: f64 = 16.0;
pub const DEFAULT_TPOT_ENTER_S: f64 = 0.3;
pub const DEFAULT_TPOT_RECOVER_S: f64 = 0.08;
pub const DEFAULT_PROBE_INTERVAL_MS: u64 = 5_000;
/// Below the default TTFT recover threshold: a probe that waits longer than that
/// says the worker cannot take work promptly yet.
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_PROBE_PATH: &str = "/v1/completions";
/// Two output tokens, so the probe gives the engine one TTFT and one TPOT
/// observation; no `model`, which vLLM and SGLang fill in with the served model.
pub const DEFAULT_PROBE_BODY: &str = r#"{"prompt":"ping","max_tokens":2}"#;
pub const DEFAULT_PROBE_SUCCESSES_TO_RECOVER: u32 = 3;
/// The lease outlives this many prober ticks, so one late tick does not hand it
/// over, and a VM that stopped ticking loses it within a few.
pub const LEASE_TICKS: u64 = 3;

fn default_true() -> bool {
    true
}
fn default_ttft_enter() -> f64 {
    DEFAULT_TTFT_ENTER_S
}
fn default_ttft_recover() -> f64 {
    DEFAULT_TTFT_RECOVER_S
}
fn default_tpot_enter() -> f64 {
    DEFAULT_TPOT_ENTER_S
}
fn default_tpot_recover() -> f64 {
    DEFAULT_TPOT_RECOVER_S
}
fn default_probe_interval() -> u64 {
    DEFAULT_PROBE_INTERVAL_MS
}
fn default_probe_timeout() -> u64 {
    DEFAULT_PROBE_TIMEOUT_MS
}
fn default_probe_path() -> String {
    DEFAULT_PROBE_PATH.to_string()
}
fn default_probe_body() -> Option<String> {
    Some(DEFAULT_PROBE_BODY.to_string())
}
fn default_probe_successes() -> u32 {
    DEFAULT_PROBE_SUCCESSES_TO_RECOVER
}

/// The `overload` object of the plugin configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverloadConfig {
    /// `false`: no flags, no filtering, no probes; the flag table is cleared.
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default = "default_ttft_enter")]
    pub ttft_enter_s: f64,
    #[serde(default = "default_ttft_recover")]
    pub ttft_recover_s: f64,
    #[serde(default = "default_tpot_enter")]
    pub tpot_enter_s: f64,
    #[serde(default = "default_tpot_recover")]
    pub tpot_recover_s: f64,
    #[serde(default = "default_probe_interval")]
    pub probe_interval_ms: u64,
    #[serde(default = "default_probe_timeout")]
    pub probe_timeout_ms: u64,
    #[serde(default = "default_probe_path")]
    pub probe_path: String,
    /// POSTed to `probe_path`; `null` sends a GET (e.g. to `/health`).
    #[serde(default = "default_probe_body")]
    pub probe_body: Option<String>,
    #[serde(default = "default_probe_successes")]
    pub probe_successes_to_recover: u32,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            enabled: true,
            ttft_enter_s: DEFAULT_TTFT_ENTER_S,
            ttft_recover_s: DEFAULT_TTFT_RECOVER_S,
            tpot_enter_s: DEFAULT_TPOT_ENTER_S,
            tpot_recover_s: DEFAULT_TPOT_RECOVER_S,
            probe_interval_ms: DEFAULT_PROBE_INTERVAL_MS,
            probe_timeout_ms: DEFAULT_PROBE_TIMEOUT_MS,
            probe_path: DEFAULT_PROBE_PATH.to_string(),
            probe_body: default_probe_body(),
            probe_successes_to_recover: DEFAULT_PROBE_SUCCESSES_TO_RECOVER,
        }
    }
}

fn rule(field: &str, rule: impl Into<String>) -> ConfigError {
    ConfigError {
        field: format!("overload.{field}"),
        rule: rule.into(),
    }
}

impl OverloadConfig {
    /// Each value on its own first, then recover below enter (the hysteresis).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("ttft_enter_s", self.ttft_enter_s),
            ("ttft_recover_s", self.ttft_recover_s),
            ("tpot_enter_s", self.tpot_enter_s),
            ("tpot_recover_s", self.tpot_recover_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(rule(field, "must be a finite number > 0"));
            }
        }
        if self.probe_interval_ms < 10 {
            return Err(rule("probe_interval_ms", "must be >= 10"));
        }
        if self.probe_timeout_ms == 0 {
            return Err(rule("probe_timeout_ms", "must be >= 1"));
        }
        if !self.probe_path.starts_with('/') {
            return Err(rule("probe_path", "must start with `/`"));
        }
        if self.probe_successes_to_recover == 0 {
            return Err(rule("probe_successes_to_recover", "must be >= 1"));
        }
        for (field, recover, enter_field, enter) in [
            (
                "ttft_recover_s",
                self.ttft_recover_s,
                "ttft_enter_s",
                self.ttft_enter_s,
            ),
            (
                "tpot_recover_s",
                self.tpot_recover_s,
                "tpot_enter_s",
                self.tpot_enter_s,
            ),
        ] {
            if recover >= enter {
                return Err(rule(
                    field,
                    format!(
                        "({recover}) must be below `overload.{enter_field}` ({enter}): \
                         equal thresholds leave no hysteresis and the flag thrashes"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The run of successful probes a worker needs to recover. A worker that cannot
    /// be probed (`target: endpoint` without a cluster of its own: a probe to the
    /// shared cluster would land on any engine) recovers on latency alone; the glue
    /// says so in the log rather than pretending to probe it.
    pub fn probes_needed(&self, probeable: bool) -> u32 {
        if probeable {
            self.probe_successes_to_recover
        } else {
            0
        }
    }

    /// How long a prober lease lasts when the prober ticks every `tick_ms`.
    pub fn lease_ms(tick_ms: u64) -> u64 {
        tick_ms.saturating_mul(LEASE_TICKS)
    }
}

/// The cluster that reaches exactly this worker, for its probes: its own cluster
/// with `target: cluster`; with `target: endpoint` the pool shares one cluster and a
/// probe to it could land on any engine, so only a `cluster` set on the worker (one
/// holding just its engine) will do.
pub fn probe_cluster<'a>(cfg: &Config, w: &'a WorkerConfig) -> Option<&'a str> {
    match cfg.target {
        Target::Cluster => Some(w.cluster()),
        Target::Endpoint => w.cluster.as_deref(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn endpoint_workers_are_probed_only_through_a_cluster_of_their_own() {
        let c = |json: &str| Config::from_json(json.as_bytes()).unwrap();
        let cluster = c(r#"{"workers":[{"name":"a"}]}"#);
        assert_eq!(probe_cluster(&cluster, &cluster.workers[0]), Some("a"));
        let endpoint = c(
            r#"{"target":"endpoint","workers":[{"name":"a","address":"10.0.0.1:80"},
                {"name":"b","address":"10.0.0.2:80","cluster":"only_b"}]}"#,
        );
        assert_eq!(probe_cluster(&endpoint, &endpoint.workers[0]), None);
        assert_eq!(
            probe_cluster(&endpoint, &endpoint.workers[1]),
            Some("only_b")
        );
    }

    #[test]
    fn config_defaults_and_rules() {
        let d = OverloadConfig::default();
        assert_eq!(
            (
                d.ttft_enter_s,
                d.ttft_recover_s,
                d.tpot_enter_s,
                d.tpot_recover_s
            ),
            (30.0, 16.0, 0.3, 0.08)
        );
        assert!(d.enabled);
        assert_eq!(d.validate(), Ok(()));
        let bad = |f: fn(&mut OverloadConfig)| {
            let mut c = OverloadConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert_eq!(
            bad(|c| c.ttft_recover_s = 30.0).field,
            "overload.ttft_recover_s"
        );
        assert!(bad(|c| c.ttft_recover_s = 31.0)
            .rule
            .contains("must be below `overload.ttft_enter_s`"));
        assert_eq!(
            bad(|c| c.tpot_recover_s = 0.3).field,
            "overload.tpot_recover_s"
        );
        assert_eq!(
            bad(|c| c.tpot_enter_s = f64::NAN).field,
            "overload.tpot_enter_s"
        );
        assert_eq!(
            bad(|c| c.ttft_recover_s = 0.0).field,
            "overload.ttft_recover_s"
        );
        assert_eq!(
            bad(|c| c.probe_interval_ms = 9).field,
            "overload.probe_interval_ms"
        );
        assert_eq!(
            bad(|c| c.probe_timeout_ms = 0).field,
            "overload.probe_timeout_ms"
        );
        assert_eq!(
            bad(|c| c.probe_path = "x".into()).field,
            "overload.probe_path"
        );
        assert_eq!(
            bad(|c| c.probe_successes_to_recover = 0).field,
            "overload.probe_successes_to_recover"
        );
    }
}
