//! Which engines to scrape: from `--engine NAME=URL` flags, or from Envoy's admin
//! `/clusters?format=json`, so that Envoy's own service discovery (EDS, DNS, static
//! config) decides membership and the collector never disagrees with the proxy.

use anyhow::{bail, Context as _};
use llm_router_push::Member;
use serde::Deserialize;

/// How the filter knows a worker, which decides how the snapshot names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Naming {
    /// The filter config has a worker of this name (cluster target mode, `--engine`).
    Named,
    /// Only the endpoint's `ip:port` is known (a pool cluster in endpoint target
    /// mode); the snapshot sends `address` alone and the filter matches it against
    /// its workers' `address`.
    ByAddress,
}

/// One engine to scrape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// Worker name; for pool hosts the `ip:port`. Also the key for per-engine state.
    pub name: String,
    /// `host:port` as the filter knows it.
    pub address: String,
    /// Full URL of the engine's Prometheus endpoint.
    pub metrics_url: String,
    pub naming: Naming,
    /// The Envoy cluster holding only this engine, when Envoy named one (a
    /// `--cluster-prefix` cluster); pool hosts share their pool's and have none.
    pub cluster: Option<String>,
}

impl Worker {
    /// The worker as the snapshot's `membership` lists it, with the fields a
    /// configured worker has, so a filter in discovery mode (`workers_from:
    /// collector`) takes the collector's list as its own.
    pub fn member(&self) -> Member {
        Member {
            name: self.name.clone(),
            cluster: self.cluster.clone(),
            address: Some(self.address.clone()),
            ..Member::default()
        }
    }
}

/// Parses `NAME=http://host:port` or `NAME=https://...` (a path other than `/` is
/// the metrics path; default `/metrics`).
pub fn parse_static(spec: &str) -> anyhow::Result<Worker> {
    let Some((name, url)) = spec.split_once('=') else {
        bail!("expected NAME=http://host:port");
    };
    let name = name.trim();
    if name.is_empty() {
        bail!("empty worker name");
    }
    let uri: hyper::Uri = url.trim().parse().context("not a URL")?;
    let scheme = match uri.scheme_str() {
        Some(s @ ("http" | "https")) => s,
        _ => bail!("the engine URL must start with http:// or https://"),
    };
    let Some(authority) = uri.authority() else {
        bail!("the URL has no host:port");
    };
    let path = uri.path().trim_end_matches('/');
    let path = if path.is_empty() { "/metrics" } else { path };
    Ok(Worker {
        name: name.to_string(),
        address: authority.as_str().to_string(),
        metrics_url: format!("{scheme}://{authority}{path}"),
        naming: Naming::Named,
        cluster: None,
    })
}

#[derive(Deserialize)]
struct Clusters {
    #[serde(default)]
    cluster_statuses: Vec<ClusterStatus>,
}

#[derive(Deserialize)]
struct ClusterStatus {
    name: String,
    #[serde(default)]
    host_statuses: Vec<HostStatus>,
}

#[derive(Deserialize)]
struct HostStatus {
    #[serde(default)]
    address: Option<Address>,
}

#[derive(Deserialize)]
struct Address {
    #[serde(default)]
    socket_address: Option<SocketAddress>,
}

#[derive(Deserialize)]
struct SocketAddress {
    address: String,
    #[serde(default)]
    port_value: u16,
}

/// `ip:port` of a host, bracketing IPv6 so the result is a valid URL authority.
fn host_address(h: &HostStatus) -> Option<String> {
    let sa = h.address.as_ref()?.socket_address.as_ref()?;
    if sa.port_value == 0 || sa.address.is_empty() {
        return None;
    }
    Some(if sa.address.contains(':') {
        format!("[{}]:{}", sa.address, sa.port_value)
    } else {
        format!("{}:{}", sa.address, sa.port_value)
    })
}

/// Workers named by Envoy's `/clusters?format=json`, sorted by name, plus warnings
/// about clusters that look like engines but cannot be used (so the operator sees
/// why a worker is missing instead of a silent gap).
pub fn parse_envoy_clusters(
    json: &[u8],
    cluster_prefix: &str,
    pool_clusters: &[String],
) -> anyhow::Result<(Vec<Worker>, Vec<String>)> {
    let clusters: Clusters = serde_json::from_slice(json)
        .context("Envoy /clusters?format=json is not the expected JSON")?;
    let mut workers: Vec<Worker> = Vec::new();
    let mut warnings = Vec::new();
    for c in &clusters.cluster_statuses {
        if pool_clusters.contains(&c.name) {
            for h in &c.host_statuses {
                let Some(address) = host_address(h) else {
                    warnings.push(format!(
                        "pool cluster `{}`: a host has no socket address",
                        c.name
                    ));
                    continue;
                };
                workers.push(Worker {
                    name: address.clone(),
                    metrics_url: format!("http://{address}/metrics"),
                    address,
                    naming: Naming::ByAddress,
                    // The pool's cluster is not the worker's own: the filter's
                    // overload probes would land on any of its hosts.
                    cluster: None,
                });
            }
        } else if let Some(name) = c
            .name
            .strip_prefix(cluster_prefix)
            .filter(|n| !n.is_empty())
        {
            let addresses: Vec<String> = c.host_statuses.iter().filter_map(host_address).collect();
            match addresses.as_slice() {
                [address] => workers.push(Worker {
                    name: name.to_string(),
                    address: address.clone(),
                    metrics_url: format!("http://{address}/metrics"),
                    naming: Naming::Named,
                    cluster: Some(c.name.clone()),
                }),
                [] => warnings.push(format!("cluster `{}` has no host with a socket address", c.name)),
                more => warnings.push(format!(
                    "cluster `{}` has {} hosts; a worker cluster needs exactly one (use --pool-cluster for pools)",
                    c.name,
                    more.len()
                )),
            }
        }
    }
    workers.sort_by(|a, b| a.name.cmp(&b.name));
    // The same endpoint in two pools would be reported twice, which the filter refuses.
    workers.dedup_by(|a, b| a.name == b.name);
    Ok((workers, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Trimmed from a real Envoy 1.3x admin `/clusters?format=json`.
    const CLUSTERS: &str = r#"{"cluster_statuses":[
      {"name":"engine_w0","added_via_api":false,"host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":8001}},
        "stats":[{"name":"cx_active","type":"GAUGE","value":"1"}],"health_status":{"eds_health_status":"HEALTHY"},"weight":1,"locality":{}}]},
      {"name":"engine_w1","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":8002}}}]},
      {"name":"engine_empty","host_statuses":[]},
      {"name":"engine_two","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.1","port_value":1}}},{"address":{"socket_address":{"address":"10.0.0.2","port_value":1}}}]},
      {"name":"pool","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.8","port_value":8000}}},{"address":{"socket_address":{"address":"::1","port_value":8000}}}]},
      {"name":"llm_router_admin","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":9901}}}]},
      {"name":"engine_pipe","host_statuses":[{"address":{"pipe":{"path":"/tmp/x.sock"}}}]}
    ]}"#;

    #[test]
    fn static_specs() {
        let w = parse_static("w0=http://127.0.0.1:8001").unwrap();
        assert_eq!(
            serde_json::to_value(w.member()).unwrap(),
            serde_json::json!({"name":"w0","address":"127.0.0.1:8001"}),
            "a flag names no cluster: the filter's default (the name) applies"
        );
        assert_eq!(
            (w.name.as_str(), w.address.as_str()),
            ("w0", "127.0.0.1:8001")
        );
        assert_eq!(w.metrics_url, "http://127.0.0.1:8001/metrics");
        let w = parse_static("w1=http://localhost:9/custom/metrics/").unwrap();
        assert_eq!(w.metrics_url, "http://localhost:9/custom/metrics");
        assert!(parse_static("http://127.0.0.1:1").is_err());
        assert!(parse_static("=http://127.0.0.1:1").is_err());
        let w = parse_static("w=https://engine.example:443").unwrap();
        assert_eq!(w.metrics_url, "https://engine.example:443/metrics");
        assert!(parse_static("w=ftp://127.0.0.1:1").is_err());
        assert!(parse_static("w=127.0.0.1:1").is_err());
    }

    #[test]
    fn cluster_mode_takes_single_host_prefixed_clusters() {
        let (w, warnings) = parse_envoy_clusters(CLUSTERS.as_bytes(), "engine_", &[]).unwrap();
        let names: Vec<_> = w
            .iter()
            .map(|w| (w.name.as_str(), w.address.as_str()))
            .collect();
        assert_eq!(
            names,
            vec![("w0", "127.0.0.1:8001"), ("w1", "127.0.0.1:8002")]
        );
        assert!(w.iter().all(|w| w.naming == Naming::Named));
        assert_eq!(w[0].metrics_url, "http://127.0.0.1:8001/metrics");
        assert_eq!(
            serde_json::to_value(w[0].member()).unwrap(),
            serde_json::json!({"name":"w0","cluster":"engine_w0","address":"127.0.0.1:8001"}),
            "the filter reaches the worker through the cluster Envoy named"
        );
        assert_eq!(warnings.len(), 3, "{warnings:?}");
        assert!(warnings
            .iter()
            .any(|m| m.contains("engine_two") && m.contains("2 hosts")));
        assert!(warnings.iter().any(|m| m.contains("engine_pipe")));
    }

    #[test]
    fn pool_mode_takes_every_host_by_address() {
        let (w, _) =
            parse_envoy_clusters(CLUSTERS.as_bytes(), "engine_", &["pool".into()]).unwrap();
        let pool: Vec<_> = w.iter().filter(|w| w.naming == Naming::ByAddress).collect();
        assert_eq!(pool.len(), 2);
        assert_eq!(pool[0].name, "10.0.0.8:8000");
        assert_eq!(pool[1].name, "[::1]:8000");
        assert_eq!(pool[1].metrics_url, "http://[::1]:8000/metrics");
        assert_eq!(
            serde_json::to_value(pool[0].member()).unwrap(),
            serde_json::json!({"name":"10.0.0.8:8000","address":"10.0.0.8:8000"}),
            "a pool host is named by its address, with no cluster of its own"
        );
        // A prefix that matches nothing leaves only the pool.
        let (w, _) =
            parse_envoy_clusters(CLUSTERS.as_bytes(), "nomatch_", &["pool".into()]).unwrap();
        assert_eq!(w.len(), 2);
    }

    #[test]
    fn bad_json_is_an_error_and_missing_fields_are_tolerated() {
        assert!(parse_envoy_clusters(b"<html>", "engine_", &[]).is_err());
        let (w, _) = parse_envoy_clusters(b"{}", "engine_", &[]).unwrap();
        assert!(w.is_empty());
        let (w, _) = parse_envoy_clusters(
            br#"{"cluster_statuses":[{"name":"engine_a"}]}"#,
            "engine_",
            &[],
        )
        .unwrap();
        assert!(w.is_empty());
    }
}
