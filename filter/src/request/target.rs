//! Which request header carries the chosen worker to Envoy's router, and its value.
//!
//! - `target: cluster` (default): one Envoy cluster per worker; the route reads
//!   `cluster_header` (`cluster_header` routing), so the value is the worker's
//!   cluster.
//! - `target: endpoint`: one cluster for the pool with the `override_host` load
//!   balancing policy reading `endpoint_header: ip:port`. An address the cluster does
//!   not know silently falls back to the fallback policy, so only configured
//!   addresses are emitted (validation requires one on every worker).

use crate::config::{Config, Target};
use crate::tree::TenantId;

/// The routing header to set and its value, borrowed from the configuration: a
/// request copies none of them (it sets the header from them and keeps only the
/// worker's name, `glue::bookkeeping::Held`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteTarget<'c> {
    /// The worker's name (in-flight counts are held by name).
    pub worker: &'c str,
    pub header: &'c str,
    pub value: &'c str,
}

/// The header and value that send a request to `worker`; `None` for an index the
/// configuration does not have.
pub fn route_target(cfg: &Config, worker: TenantId) -> Option<RouteTarget<'_>> {
    let w = cfg.workers.get(worker as usize)?;
    let (header, value) = match cfg.target {
        Target::Cluster => (cfg.cluster_header.as_str(), w.cluster()),
        Target::Endpoint => (
            cfg.endpoint_header.as_str(),
            w.address.as_deref().unwrap_or_default(),
        ),
    };
    Some(RouteTarget {
        worker: &w.name,
        header,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn target(json: &str, worker: TenantId) -> Option<(String, String, String)> {
        let cfg = Config::from_json(json.as_bytes()).unwrap();
        route_target(&cfg, worker).map(|t| {
            (
                t.worker.to_string(),
                t.header.to_string(),
                t.value.to_string(),
            )
        })
    }

    #[test]
    fn cluster_target_names_the_workers_cluster() {
        let json = r#"{"workers":[{"name":"a"},{"name":"b","cluster":"engine_b"}]}"#;
        let t = |w| target(json, w).map(|(_, header, value)| (header, value));
        assert_eq!(t(0), Some(("x-llm-router-cluster".into(), "a".into())));
        assert_eq!(
            t(1),
            Some(("x-llm-router-cluster".into(), "engine_b".into()))
        );
        assert_eq!(t(2), None, "no such worker");
    }

    #[test]
    fn endpoint_target_names_the_workers_address() {
        let json = r#"{"target":"endpoint","endpoint_header":"x-dest",
            "workers":[{"name":"a","address":"10.0.0.1:8000"}]}"#;
        assert_eq!(
            target(json, 0),
            Some(("a".into(), "x-dest".into(), "10.0.0.1:8000".into()))
        );
    }
}
