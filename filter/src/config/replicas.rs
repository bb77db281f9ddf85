//! The `replicas` object of the plugin configuration: the endpoint through which
//! this Envoy's bridge (`llm-bridge`) exports its routing operations to peer
//! replicas and imports theirs (`crate::background::replica`), and how long a peer's in-flight
//! report counts. The endpoint takes the stats token (`stats_token`); without one it
//! is off, like the stats endpoint.

use serde::Deserialize;

use super::{err, ConfigError};

pub const DEFAULT_REPLICAS_PATH: &str = "/llm-router/replicas";
/// A peer's in-flight report counts this long. Bridges report every 250 ms, so a
/// few lost reports do not drop a live peer, and a dead peer (or bus) stops counting
/// within seconds.
pub const DEFAULT_PEER_STALE_AFTER_MS: u64 = 3_000;
/// Operations per exported or imported batch: bounds one answer's size and how
/// much of the ring one import may fill.
pub const DEFAULT_REPLICA_BATCH_OPS: usize = 256;

fn default_path() -> String {
    DEFAULT_REPLICAS_PATH.to_string()
}
fn default_stale() -> u64 {
    DEFAULT_PEER_STALE_AFTER_MS
}
fn default_batch() -> usize {
    DEFAULT_REPLICA_BATCH_OPS
}

/// The `replicas` object of the plugin configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplicasConfig {
    #[serde(default = "default_path")]
    pub path: String,
    #[serde(default = "default_stale")]
    pub peer_stale_after_ms: u64,
    #[serde(default = "default_batch")]
    pub batch_ops: usize,
}

impl Default for ReplicasConfig {
    fn default() -> Self {
        ReplicasConfig {
            path: default_path(),
            peer_stale_after_ms: default_stale(),
            batch_ops: default_batch(),
        }
    }
}

impl ReplicasConfig {
    pub fn validate(&self, stats_path: &str) -> Result<(), ConfigError> {
        if !self.path.starts_with('/') || self.path.contains('?') {
            return Err(err(
                "replicas.path",
                "must start with `/` and have no query",
            ));
        }
        if self.path == stats_path {
            return Err(err("replicas.path", "must differ from `stats_path`"));
        }
        if self.peer_stale_after_ms == 0 {
            return Err(err("replicas.peer_stale_after_ms", "must be >= 1"));
        }
        if self.batch_ops == 0 {
            return Err(err("replicas.batch_ops", "must be >= 1"));
        }
        Ok(())
    }

    /// Operations per batch with a ring of `ring_slots`: at most half the ring, so
    /// one import never overwrites operations the VMs have not applied yet.
    pub fn batch_limit(&self, ring_slots: usize) -> usize {
        self.batch_ops.min(ring_slots / 2).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::Config;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn check(replicas: &str) -> Result<Config, String> {
        let json = format!(r#"{{"workers":[{{"name":"a"}}],"replicas":{replicas}}}"#);
        Config::from_json(json.as_bytes()).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_and_rules() {
        let cfg = check("{}").unwrap();
        assert_eq!(cfg.replicas.path, super::DEFAULT_REPLICAS_PATH);
        assert!(check(r#"{"path":"x"}"#)
            .unwrap_err()
            .contains("`replicas.path`"));
        assert!(check(r#"{"path":"/llm-router/stats"}"#)
            .unwrap_err()
            .contains("differ from `stats_path`"));
        assert!(check(r#"{"peer_stale_after_ms":0}"#)
            .unwrap_err()
            .contains("peer_stale_after_ms"));
        assert!(check(r#"{"batch_ops":0}"#)
            .unwrap_err()
            .contains("batch_ops"));
        assert_eq!(cfg.replicas.batch_limit(1024), 256);
        assert_eq!(cfg.replicas.batch_limit(8), 4, "half a small ring");
        assert_eq!(cfg.replicas.batch_limit(1), 1);
        assert!(check(r#"{"bogus":1}"#).unwrap_err().contains("bogus"));
    }
}
