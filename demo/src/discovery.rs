//! A fleet whose engines Envoy learns through service discovery, for membership
//! from discovery (`workers_from: collector`): one pool cluster of type EDS fed from
//! a file Envoy watches (file-based xDS, the same protocol an EDS server speaks), the
//! filter in `target: endpoint` mode with no worker in its config, and the collector
//! following the pool cluster's endpoints through Envoy's admin API and pushing them
//! as the membership.
//!
//! Adding an engine starts it and lists it in the file; removing one drops it from
//! the file and leaves the process running, as a Kubernetes endpoint leaves before
//! its pod stops, so requests already on it finish. Endpoint mode is what makes a
//! removal safe: until the filter hears of it, a request it sends to the gone address
//! falls back to another endpoint of the pool (Envoy's `override_host`), never to an
//! error.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::envoy::{self, endpoint, Envoy, EnvoySpec, Target};
use crate::fleet::{start_engine, Engine, TempDir};
use crate::paths;
use crate::process::Guard;
use llm_router::support::metric_names as names;

/// The pool cluster Envoy discovers the engines of.
pub const POOL_CLUSTER: &str = "engines";
const EDS_FILE: &str = "eds.json";

/// What to start.
#[derive(Debug, Clone)]
pub struct DiscoverySpec {
    /// Engines listed from the start (`w0..`).
    pub workers: usize,
    pub engine_args: Vec<String>,
    /// Merged over `{"workers_from": "collector", "target": "endpoint", ...}`.
    pub plugin_config: Value,
    pub envoy_concurrency: u32,
    pub collector_interval_ms: u64,
    pub dir: Option<PathBuf>,
}

/// A running fleet; dropping it stops the collector, Envoy and every engine.
pub struct DiscoveryFleet {
    // Dropped in this order: the collector, Envoy, then the engines behind it.
    pub collector: Guard,
    pub envoy: Envoy,
    pub engines: Vec<Engine>,
    /// The engines the discovery file lists now.
    pub listed: Vec<String>,
    engine_args: Vec<String>,
    /// The discovery file's version.
    version: u64,
    /// Where the discovery file lives (Envoy watches the directory).
    xds: PathBuf,
    /// Configs and logs.
    pub dir: PathBuf,
    _tmp: Option<TempDir>,
}

/// Writes the discovery file listing `listed` (aside, then renamed in, so Envoy
/// never reads half a file).
fn write_eds(xds: &Path, version: u64, engines: &[Engine], listed: &[String]) -> Result<()> {
    let endpoints: Vec<Value> = listed
        .iter()
        .filter_map(|n| engines.iter().find(|e| &e.name == n))
        .map(|e| endpoint(e.addr))
        .collect();
    let doc = json!({
        "version_info": version.to_string(),
        "resources": [{
            "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "cluster_name": POOL_CLUSTER,
            "endpoints": [{"lb_endpoints": endpoints}]
        }]
    });
    let tmp = xds.join(format!("{EDS_FILE}.tmp"));
    std::fs::write(&tmp, serde_json::to_vec(&doc)?)?;
    std::fs::rename(&tmp, xds.join(EDS_FILE))?;
    Ok(())
}

/// The demo's discovery-mode plugin config under `overrides`.
pub fn plugin_config(token: &str, overrides: &Value) -> Value {
    let mut cfg = json!({
        "workers_from": "collector",
        "target": "endpoint",
        "stats_token": token,
        "leave_grace_ms": 3000,
        "rng_seed": 42,
    });
    if let (Value::Object(base), Value::Object(over)) = (&mut cfg, overrides) {
        for (k, v) in over {
            base.insert(k.clone(), v.clone());
        }
    }
    cfg
}

impl DiscoveryFleet {
    pub fn start(spec: &DiscoverySpec) -> Result<DiscoveryFleet> {
        let (dir, tmp) = match &spec.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.clone(), None)
            }
            None => {
                let t = TempDir::new("llm-discovery")?;
                (t.0.clone(), Some(t))
            }
        };
        let engines = (0..spec.workers)
            .map(|i| start_engine(&llm_load::fleet::worker_name(i), &spec.engine_args, &dir))
            .collect::<Result<Vec<_>>>()?;
        let token = format!("{:016x}", std::process::id() ^ 0x5eed);
        let cfg = plugin_config(&token, &spec.plugin_config);
        let token = cfg["stats_token"].as_str().unwrap_or(&token).to_string();
        let xds = dir.join("xds");
        std::fs::create_dir_all(&xds)?;
        let mut bootstrap = envoy::bootstrap(&EnvoySpec {
            upstreams: Vec::new(),
            target: Target::Endpoint,
            plugin_config: cfg,
            wasm: paths::wasm_path()?,
            concurrency: spec.envoy_concurrency,
            route_idle_timeout_ms: None,
            collector: None,
        })?;
        // xDS from files still names the node, as a management server would see it.
        bootstrap["node"] = json!({"id": "llm-demo", "cluster": "llm-demo"});
        let pool = bootstrap["static_resources"]["clusters"]
            .as_array_mut()
            .and_then(|cs| cs.iter_mut().find(|c| c["name"] == POOL_CLUSTER))
            .context("the endpoint-mode bootstrap has a pool cluster")?;
        if let Value::Object(c) = pool {
            c.remove("load_assignment");
            c.insert("type".into(), json!("EDS"));
            c.insert(
                "eds_cluster_config".into(),
                json!({"eds_config": {
                    "resource_api_version": "V3",
                    "path_config_source": {
                        "path": xds.join(EDS_FILE).to_string_lossy(),
                        "watched_directory": {"path": xds.to_string_lossy()}
                    }
                }}),
            );
        }
        let listed: Vec<String> = engines.iter().map(|e| e.name.clone()).collect();
        write_eds(&xds, 1, &engines, &listed)?;
        let config_path = dir.join("envoy.json");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&bootstrap)?)?;
        let envoy = envoy::launch(
            &paths::envoy_bin()?,
            &config_path,
            spec.envoy_concurrency,
            &dir,
        )
        .context("starting Envoy with the filter in discovery mode")?;
        let Some(stats) = envoy.stats_listener else {
            bail!("the Envoy config has no llm_stats listener for the collector");
        };
        let mut cmd = Command::new(paths::bin_path("llm-collector")?);
        cmd.arg("--push-url")
            .arg(format!("http://{stats}/llm-router/stats"))
            .arg("--token")
            .arg(&token)
            .arg("--interval-ms")
            .arg(spec.collector_interval_ms.to_string())
            .arg("--envoy-admin")
            .arg(format!("http://{}", envoy.admin))
            .arg("--pool-cluster")
            .arg(POOL_CLUSTER);
        let collector = crate::process::spawn("llm-collector", cmd, &dir.join("collector.log"))?;
        Ok(DiscoveryFleet {
            collector,
            envoy,
            engines,
            listed,
            engine_args: spec.engine_args.clone(),
            version: 1,
            xds,
            dir,
            _tmp: tmp,
        })
    }

    pub fn url(&self) -> String {
        self.envoy.url()
    }

    /// Starts engine `name` and lists it: Envoy adds the endpoint, the collector
    /// sees it, the filter hears of it.
    pub fn add(&mut self, name: &str) -> Result<()> {
        let engine = start_engine(name, &self.engine_args, &self.dir)?;
        self.engines.push(engine);
        self.listed.push(name.to_string());
        self.version += 1;
        write_eds(&self.xds, self.version, &self.engines, &self.listed)
    }

    /// Drops engine `name` from the discovery file; the process keeps serving what
    /// it already has.
    pub fn remove(&mut self, name: &str) -> Result<()> {
        self.listed.retain(|n| n != name);
        self.version += 1;
        write_eds(&self.xds, self.version, &self.engines, &self.listed)
    }

    /// The filter's worker gauges: (known, leaving).
    pub fn filter_workers(&self) -> Result<(u64, u64)> {
        let stats = self.envoy.stats()?;
        let get = |n: &str| {
            stats
                .get(&llm_load::run::envoy_stat(n))
                .copied()
                .unwrap_or(0)
        };
        Ok((get(names::WORKERS), get(names::WORKERS_LEAVING)))
    }

    /// Waits until the filter's worker gauges satisfy `ok`; how long it took.
    pub fn wait_workers(
        &self,
        timeout: Duration,
        ok: impl Fn(u64, u64) -> bool,
    ) -> Result<Duration> {
        let start = Instant::now();
        loop {
            let (known, leaving) = self.filter_workers()?;
            if ok(known, leaving) {
                return Ok(start.elapsed());
            }
            if start.elapsed() > timeout {
                bail!(
                    "the filter's workers stayed at {known} known, {leaving} leaving for {timeout:?}; collector log {}",
                    self.dir.join("collector.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
