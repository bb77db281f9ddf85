//! How the chosen worker reaches Envoy's router (`target`) and the request headers
//! that carry it (`cluster_header`, `endpoint_header`): flat keys of the plugin
//! configuration, each header checked as Envoy will match it.

use serde::Deserialize;

use super::{err, Config, ConfigError};

pub const DEFAULT_CLUSTER_HEADER: &str = "x-llm-router-cluster";
/// The Gateway API Inference Extension's header, read by Envoy's `override_host`
/// load balancing policy.
pub const DEFAULT_ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";

/// How the chosen worker reaches Envoy's router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    /// One Envoy cluster per worker; the route reads `cluster_header`.
    #[default]
    Cluster,
    /// One cluster for the pool with the `override_host` policy reading
    /// `endpoint_header: ip:port`.
    Endpoint,
}

pub(super) fn default_cluster_header() -> String {
    DEFAULT_CLUSTER_HEADER.to_string()
}
pub(super) fn default_endpoint_header() -> String {
    DEFAULT_ENDPOINT_HEADER.to_string()
}

fn is_header_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

impl Config {
    pub(super) fn validate_target_headers(&self) -> Result<(), ConfigError> {
        for (field, name) in [
            ("cluster_header", &self.cluster_header),
            ("endpoint_header", &self.endpoint_header),
        ] {
            if !is_header_name(name) {
                return Err(err(field, "must be a lowercase HTTP header name"));
            }
        }
        Ok(())
    }
}
