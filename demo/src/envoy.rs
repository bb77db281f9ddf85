//! Envoy with the filter: the bootstrap we generate (as JSON, which Envoy reads like
//! YAML and which needs no escaping of the embedded plugin configuration), starting
//! it on OS-chosen ports, and reading its stats.
//!
//! The bootstrap carries the settings LLM traffic needs on Envoy 1.40, the same the
//! shipped example configs (`envoy/envoy-*.yaml`) carry:
//! `allow_on_headers_stop_iteration` (else the body callback never runs and the
//! request hangs), `failure_policy: FAIL_RELOAD` (a crashed VM is replaced), route
//! `timeout: 0s` (generations outlive the 15 s default) and the listener's
//! `per_connection_buffer_limit_bytes` (long prompts exceed the 1 MiB default).

use anyhow::{bail, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::admin;
use crate::paths;
use crate::process::{spawn, Guard};

/// The environment variable the shipped example configs take the push token from
/// (`stats_token_env`), and the token `launch` gives them.
pub const EXAMPLE_TOKEN_ENV: &str = "LLM_ROUTER_STATS_TOKEN";
pub const EXAMPLE_TOKEN: &str = "e2e-example-token-0123456789abcdef";

/// Requests up to this size are buffered for routing (long contexts are big).
pub const REQUEST_BODY_LIMIT_BYTES: u64 = 64 * 1024 * 1024;

/// How requests reach the chosen worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A cluster per worker, routed by `cluster_header`.
    Cluster,
    /// One cluster with the `override_host` policy.
    Endpoint,
    /// No router: Envoy's own `RING_HASH` load balancer over one cluster of every
    /// engine, hashing the load tool's session header (what an Envoy user would
    /// configure instead of this filter). The filter answers the collector, and sits
    /// in the request path only as `in_path` says.
    RingHash { in_path: InPath },
}

/// What Envoy's request path holds when its ring hash routes: nothing (what a user
/// of ring hash runs), or a Wasm filter whose routing header the ring-hash route
/// ignores, so that a run prices what a filter in the path costs apart from where
/// it sends requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InPath {
    Nothing,
    /// This filter, as the main run configures it, deciding every request.
    Filter,
    /// `llm-floor`, the buffer-only guest (`benches/floor`): what any filter that
    /// reads the body pays.
    Floor,
}

impl InPath {
    /// Every request path ring hash can run with.
    pub const ALL: [InPath; 3] = [InPath::Nothing, InPath::Filter, InPath::Floor];
}

impl Target {
    pub fn as_str(self) -> &'static str {
        match self {
            Target::Cluster => "cluster",
            Target::Endpoint => "endpoint",
            Target::RingHash { .. } => "ring_hash",
        }
    }
}

/// One upstream engine.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub name: String,
    pub addr: SocketAddr,
    /// The worker's pool: `regular`, `prefill` or `decode`.
    pub pool: &'static str,
    /// Prefill workers: the engine's bootstrap server.
    pub bootstrap: Option<SocketAddr>,
}

/// Everything needed to render a bootstrap.
#[derive(Debug, Clone)]
pub struct EnvoySpec {
    pub upstreams: Vec<Upstream>,
    pub target: Target,
    /// The plugin configuration; `workers` and `target` are filled in from
    /// `upstreams` and `target` unless already present.
    pub plugin_config: Value,
    pub wasm: PathBuf,
    pub concurrency: u32,
    /// The routes' `idle_timeout` (ms): a stream with no bytes either way for this
    /// long is ended (a frozen engine); `None`: Envoy's default (5 min).
    pub route_idle_timeout_ms: Option<u64>,
    /// The collector's `--listen` address, as the cluster [`COLLECTOR_CLUSTER`]
    /// (`kv_match` asks it which engines hold a prompt).
    pub collector: Option<SocketAddr>,
}

/// The collector's cluster, which `kv_match.cluster` names.
pub const COLLECTOR_CLUSTER: &str = "llm_collector";

use llm_load::fleet::cluster_name;
use llm_load::run::envoy_stat;
use llm_router::support::metric_names as names;

/// The plugin configuration as the filter will see it.
pub fn plugin_config(spec: &EnvoySpec) -> Value {
    let mut cfg = spec.plugin_config.clone();
    if let Value::Object(map) = &mut cfg {
        let target = match spec.target {
            // Ring hash routes there: a routing header the filter sets goes unread.
            Target::RingHash { .. } => Target::Cluster,
            t => t,
        };
        map.entry("target")
            .or_insert_with(|| json!(target.as_str()));
        map.entry("workers").or_insert_with(|| {
            spec.upstreams
                .iter()
                .map(|u| {
                    let mut w = json!({
                        "name": u.name,
                        "cluster": cluster_name(&u.name),
                        "address": u.addr.to_string(),
                    });
                    if u.pool != "regular" {
                        w["pool"] = json!(u.pool);
                    }
                    if let Some(b) = u.bootstrap {
                        w["bootstrap_host"] = json!(b.ip().to_string());
                        w["bootstrap_port"] = json!(b.port());
                    }
                    w
                })
                .collect()
        });
    }
    cfg
}

/// One `lb_endpoints` entry.
pub fn endpoint(addr: SocketAddr) -> Value {
    json!({"endpoint": {"address": {"socket_address": {
        "address": addr.ip().to_string(), "port_value": addr.port()}}}})
}

fn static_cluster(name: &str, addrs: &[SocketAddr]) -> Value {
    json!({
        "name": name,
        "type": "STATIC",
        "connect_timeout": "2s",
        "load_assignment": {
            "cluster_name": name,
            "endpoints": [{"lb_endpoints": addrs.iter().map(|a| endpoint(*a)).collect::<Vec<_>>()}]
        }
    })
}

/// Power-of-two buckets (chars) for the diverted-overlap histogram.
fn overlap_buckets() -> Vec<u64> {
    (0..=20).map(|i| 1u64 << i).collect()
}

/// The bootstrap: an admin, the `llm` listener for clients, and the `llm_stats`
/// listener (loopback only) where the collector pushes engine samples to the same
/// filter (same `vm_id`, so the same shared data), all on port 0 (read back after
/// start).
pub fn bootstrap(spec: &EnvoySpec) -> Result<Value> {
    let plugin = serde_json::to_string(&plugin_config(spec))?;
    let wasm_filter = json!({"name": "envoy.filters.http.wasm", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm",
        "config": {
            "name": "llm_router",
            "root_id": "llm_router",
            "vm_config": {
                "vm_id": "llm_router",
                "runtime": "envoy.wasm.runtime.v8",
                "code": {"local": {"filename": spec.wasm.to_string_lossy()}}
            },
            "allow_on_headers_stop_iteration": true,
            "failure_policy": "FAIL_RELOAD",
            "configuration": {
                "@type": "type.googleapis.com/google.protobuf.StringValue",
                "value": plugin
            }
        }
    }});
    let router_filter = json!({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
    }});
    // Each listener's HTTP filters end with Envoy's router.
    let listener = |name: &str, route: Value, wasm: Option<&Value>| {
        let filters: Vec<&Value> = wasm.into_iter().chain([&router_filter]).collect();
        json!({
            "name": name,
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                    "stat_prefix": name,
                    "route_config": {"name": name, "virtual_hosts": [{
                        "name": name, "domains": ["*"], "routes": [route]
                    }]},
                    "http_filters": filters
                }
            }]}]
        })
    };
    let (route, clusters) = match spec.target {
        Target::Cluster => (
            json!({"cluster_header": "x-llm-router-cluster", "timeout": "0s"}),
            spec.upstreams
                .iter()
                .map(|u| static_cluster(&cluster_name(&u.name), &[u.addr]))
                .collect::<Vec<_>>(),
        ),
        Target::Endpoint => {
            let addrs: Vec<SocketAddr> = spec.upstreams.iter().map(|u| u.addr).collect();
            let mut c = static_cluster("engines", &addrs);
            c["load_balancing_policy"] = json!({"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                    "override_host_sources": [{"header": "x-gateway-destination-endpoint"}],
                    "fallback_policy": {"policies": [{"typed_extension_config": {
                        "name": "envoy.load_balancing_policies.round_robin",
                        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}
                    }}]}
                }
            }}]});
            (json!({"cluster": "engines", "timeout": "0s"}), vec![c])
        }
        Target::RingHash { .. } => {
            let addrs: Vec<SocketAddr> = spec.upstreams.iter().map(|u| u.addr).collect();
            let mut c = static_cluster("engines", &addrs);
            c["lb_policy"] = json!("RING_HASH");
            (
                json!({"cluster": "engines", "timeout": "0s", "hash_policy": [
                    {"header": {"header_name": llm_load::client::SESSION_HEADER}}
                ]}),
                vec![c],
            )
        }
    };
    let mut clusters = clusters;
    if let Some(addr) = spec.collector {
        clusters.push(static_cluster(COLLECTOR_CLUSTER, &[addr]));
    }
    let mut route = route;
    if let Some(ms) = spec.route_idle_timeout_ms {
        route["idle_timeout"] = json!(format!("{}.{:03}s", ms / 1000, ms % 1000));
    }
    let in_path = match spec.target {
        Target::RingHash {
            in_path: InPath::Nothing,
        } => None,
        Target::RingHash {
            in_path: InPath::Floor,
        } => {
            // A VM of its own: the router's, which the stats listener's filter runs
            // in, keeps taking the collector's pushes.
            let mut floor = wasm_filter.clone();
            let vm = &mut floor["typed_config"]["config"]["vm_config"];
            vm["vm_id"] = json!("llm_floor");
            vm["code"]["local"]["filename"] = json!(paths::floor_wasm_path()?.to_string_lossy());
            Some(floor)
        }
        _ => Some(wasm_filter.clone()),
    };
    let mut llm = listener(
        "llm",
        json!({"match": {"prefix": "/"}, "route": route}),
        in_path.as_ref(),
    );
    // The listener's limit, as in envoy/*.yaml: a route's request_body_buffer_limit
    // is not applied before Envoy 1.37 when a filter stops at the headers.
    llm["per_connection_buffer_limit_bytes"] = json!(REQUEST_BODY_LIMIT_BYTES);
    // The filter answers pushes itself; anything else here is not found.
    let stats = listener(
        "llm_stats",
        json!({"match": {"prefix": "/"}, "direct_response": {"status": 404}}),
        Some(&wasm_filter),
    );
    Ok(json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "stats_config": {
            "stats_tags": names::STATS_TAGS
                .iter()
                .map(|(tag, regex)| json!({"tag_name": tag, "regex": regex}))
                .collect::<Vec<_>>(),
            "histogram_bucket_settings": [{
                "match": {"prefix": envoy_stat(names::DIVERTED_OVERLAP_CHARS)},
                "buckets": overlap_buckets()
            }]
        },
        "static_resources": {"listeners": [llm, stats], "clusters": clusters}
    }))
}

/// A running Envoy.
pub struct Envoy {
    pub admin: SocketAddr,
    pub listener: SocketAddr,
    /// The `llm_stats` listener, when the config has one.
    pub stats_listener: Option<SocketAddr>,
    pub log: PathBuf,
    _guard: Guard,
}

/// Starts Envoy with `spec`, writing its config and log into `dir`, and waits until
/// the listener is bound.
pub fn start(envoy_bin: &Path, spec: &EnvoySpec, dir: &Path) -> Result<Envoy> {
    let config_path = dir.join("envoy.json");
    std::fs::write(&config_path, serde_json::to_vec_pretty(&bootstrap(spec)?)?)?;
    launch(envoy_bin, &config_path, spec.concurrency, dir)
}

/// Starts Envoy with a config file whose admin and `llm` listener ports may be 0,
/// and waits until the listener is bound.
pub fn launch(envoy_bin: &Path, config_path: &Path, concurrency: u32, dir: &Path) -> Result<Envoy> {
    let admin_path = dir.join("envoy-admin-address");
    let _ = std::fs::remove_file(&admin_path);
    let log = dir.join("envoy.log");
    let mut cmd = Command::new(envoy_bin);
    // The shipped example configs read the collector's token from here.
    cmd.env(EXAMPLE_TOKEN_ENV, EXAMPLE_TOKEN);
    cmd.arg("-c")
        .arg(config_path)
        .arg("--concurrency")
        .arg(concurrency.to_string())
        .arg("--admin-address-path")
        .arg(&admin_path)
        // Several Envoys run at once (parallel tests): each needs its own shared
        // memory region for hot restart.
        .arg("--use-dynamic-base-id")
        .arg("--log-level")
        .arg("warning")
        .arg("--component-log-level")
        .arg("wasm:info")
        // Access logs (the example configs write JSON lines to stdout) reach the log
        // file within 200 ms instead of Envoy's default 10 s.
        .arg("--file-flush-interval-msec")
        .arg("200");
    // Readiness is polled on the admin port; stdout carries only access logs.
    let mut guard = spawn("envoy", cmd, &log)?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = guard.exited() {
            bail!(
                "envoy exited during start ({status}); log {}:\n{}",
                log.display(),
                tail(&log)
            );
        }
        if let Some(admin) = read_addr(&admin_path) {
            if let Some(listener) = listener_addr(admin, "llm") {
                return Ok(Envoy {
                    admin,
                    listener,
                    stats_listener: listener_addr(admin, "llm_stats"),
                    log,
                    _guard: guard,
                });
            }
        }
        if Instant::now() > deadline {
            bail!(
                "envoy not ready in 60 s; log {}:\n{}",
                log.display(),
                tail(&log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn read_addr(path: &Path) -> Option<SocketAddr> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The bound address of listener `name`, from `/listeners?format=json`.
fn listener_addr(admin: SocketAddr, name: &str) -> Option<SocketAddr> {
    let resp = admin::get(admin, "/listeners?format=json").ok()?;
    if resp.status != 200 {
        return None;
    }
    let v: Value = serde_json::from_str(&resp.body).ok()?;
    let sock = v["listener_statuses"]
        .as_array()?
        .iter()
        .find(|l| l["name"] == name)?
        .get("local_address")?
        .get("socket_address")?
        .clone();
    let port = sock["port_value"].as_u64()?;
    if port == 0 {
        return None;
    }
    format!("{}:{port}", sock["address"].as_str()?).parse().ok()
}

/// The last lines of a log file, for error messages.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

impl Envoy {
    /// The Envoy process id (the overhead benchmark reads its CPU time from `/proc`).
    pub fn pid(&self) -> u32 {
        self._guard.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.listener)
    }

    /// Counters and gauges from `/stats` (`name: value` lines; histograms skipped).
    pub fn stats(&self) -> Result<BTreeMap<String, u64>> {
        let resp = admin::get(self.admin, "/stats")?;
        if resp.status != 200 {
            bail!("envoy /stats answered {}", resp.status);
        }
        Ok(resp
            .body
            .lines()
            .filter_map(|l| l.split_once(": "))
            .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
            .collect())
    }

    /// One `wasmcustom.<name>` stat of the filter (0 when absent).
    /// The stats once the filter's own have stopped moving: each VM hands its
    /// counters to Envoy on its own schedule (the routing VM of `route_in: one_vm`
    /// on its tick, a few times a second), so a report read the moment the traffic
    /// ends can miss the last ones. Read until two reads 150 ms apart agree on every
    /// `wasmcustom.` stat, for at most 3 s.
    pub fn settled_stats(&self) -> Result<BTreeMap<String, u64>> {
        let filter = |stats: &BTreeMap<String, u64>| -> Vec<(String, u64)> {
            stats
                .iter()
                .filter(|(k, _)| k.starts_with("wasmcustom."))
                .map(|(k, v)| (k.clone(), *v))
                .collect()
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut last = self.stats()?;
        loop {
            std::thread::sleep(std::time::Duration::from_millis(150));
            let now = self.stats()?;
            if filter(&now) == filter(&last) || std::time::Instant::now() >= deadline {
                return Ok(now);
            }
            last = now;
        }
    }

    pub fn filter_stat(&self, name: &str) -> Result<u64> {
        Ok(self.stats()?.get(&envoy_stat(name)).copied().unwrap_or(0))
    }

    /// `/stats/prometheus` as text.
    pub fn prometheus(&self) -> Result<String> {
        let resp = admin::get(self.admin, "/stats/prometheus")?;
        if resp.status != 200 {
            bail!("envoy /stats/prometheus answered {}", resp.status);
        }
        Ok(resp.body)
    }
}
