//! Several Envoy replicas in front of one set of engine mocks, each with its own
//! collector and (with sharing on) its bridge (`llm-bridge`), and the NATS server
//! the bridges share. The bus can be stopped and resumed on the same port, and a
//! replica can join late, which is what the end-to-end tests and `envoy/demo
//! --envoys N` exercise.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::envoy::{self, Envoy, EnvoySpec};
use crate::fleet::{
    envoy_spec, random_u64, start_collector, start_engines, Engine, FleetSpec, TempDir,
};
use crate::paths;
use crate::process::{spawn, spawn_until, Guard};

/// The filter's replicas endpoint (`replicas.path`'s default).
pub const REPLICAS_PATH: &str = llm_router::config::DEFAULT_REPLICAS_PATH;

/// `nats-server`, as `envoy/get-nats` installs it (Debian puts it in /usr/sbin,
/// which is not on every PATH); `NATS_SERVER` overrides.
pub fn nats_server_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("NATS_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/usr/bin"].map(PathBuf::from))
        .map(|d| d.join("nats-server"))
        .find(|p| p.is_file())
        .context("nats-server not found: run `envoy/get-nats` (apt-get install nats-server) or set NATS_SERVER")
}

/// A port free now (the OS picks it; the caller binds it soon after).
fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A NATS server on a fixed loopback port, which can be stopped and resumed.
pub struct Nats {
    pub port: u16,
    bin: PathBuf,
    log: PathBuf,
    guard: Option<Guard>,
}

impl Nats {
    pub fn start(dir: &Path) -> Result<Nats> {
        let mut nats = Nats {
            port: free_port()?,
            bin: nats_server_bin()?,
            log: dir.join("nats.log"),
            guard: None,
        };
        nats.resume()?;
        Ok(nats)
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn is_running(&self) -> bool {
        self.guard.is_some()
    }

    /// Stops the server (the bridges lose their connection).
    pub fn stop(&mut self) {
        self.guard = None;
    }

    /// Starts the server again on its port and waits until it accepts connections.
    pub fn resume(&mut self) -> Result<()> {
        if self.guard.is_some() {
            return Ok(());
        }
        let mut cmd = Command::new(&self.bin);
        cmd.args(["-a", "127.0.0.1", "-p", &self.port.to_string()]);
        let mut guard = spawn("nats-server", cmd, &self.log)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            if let Some(status) = guard.exited() {
                bail!("nats-server exited ({status}); see {}", self.log.display());
            }
            if Instant::now() > deadline {
                bail!(
                    "nats-server not listening on {addr} within 30 s; see {}",
                    self.log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.guard = Some(guard);
        Ok(())
    }
}

/// One replica: its Envoy, and the processes beside it.
pub struct Replica {
    pub name: String,
    // Dropped in this order: the bridge and the collector, then Envoy.
    pub bridge: Option<Guard>,
    pub collector: Option<Guard>,
    pub envoy: Envoy,
}

impl Replica {
    pub fn url(&self) -> String {
        self.envoy.url()
    }
}

/// Replicas of one Envoy config; dropping it stops every process it started.
pub struct Replicas {
    // Dropped in this order: the replicas, the bus, the engines.
    pub replicas: Vec<Replica>,
    pub nats: Option<Nats>,
    pub engines: Vec<Engine>,
    pub token: String,
    spec: EnvoySpec,
    collector: Option<(u64, Vec<String>)>,
    pub dir: PathBuf,
    _tmp: Option<TempDir>,
}

impl Replicas {
    /// `envoys` replicas of `fleet`'s Envoy over its engines; with `sharing`, a
    /// NATS server and a bridge per replica.
    pub fn start(fleet: &FleetSpec, envoys: usize, sharing: bool) -> Result<Replicas> {
        let (dir, tmp) = match &fleet.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.clone(), None)
            }
            None => {
                let t = TempDir::new("llm-replicas")?;
                (t.0.clone(), Some(t))
            }
        };
        let engines = start_engines(fleet, &dir)?;
        let mut plugin_config = fleet.plugin_config.clone();
        if let Value::Object(map) = &mut plugin_config {
            map.entry("stats_token")
                .or_insert_with(|| Value::from(format!("{:016x}", random_u64())));
        }
        let token = plugin_config["stats_token"]
            .as_str()
            .context("stats_token must be a string")?
            .to_string();
        let nats = if sharing {
            Some(Nats::start(&dir)?)
        } else {
            None
        };
        let mut replicas = Replicas {
            replicas: Vec::new(),
            nats,
            spec: envoy_spec(fleet, &engines, plugin_config)?,
            engines,
            token,
            collector: fleet
                .collector_interval_ms
                .map(|ms| (ms, fleet.collector_args.clone())),
            dir,
            _tmp: tmp,
        };
        for _ in 0..envoys {
            replicas.add_replica()?;
        }
        Ok(replicas)
    }

    /// Starts one more replica (with its bridge when sharing is on): a replica
    /// joining late catches up from its peers.
    pub fn add_replica(&mut self) -> Result<&Replica> {
        let name = format!("envoy-{}", self.replicas.len());
        let dir = self.dir.join(&name);
        std::fs::create_dir_all(&dir)?;
        let envoy = envoy::start(&paths::envoy_bin()?, &self.spec, &dir)
            .with_context(|| format!("starting {name}"))?;
        let collector = match &self.collector {
            Some((ms, args)) => Some(start_collector(
                &envoy,
                &self.engines,
                &self.token,
                *ms,
                args,
                &dir,
            )?),
            None => None,
        };
        let bridge = match &self.nats {
            Some(nats) => Some(start_bridge(&name, &envoy, &self.token, &nats.url(), &dir)?),
            None => None,
        };
        self.replicas.push(Replica {
            name,
            bridge,
            collector,
            envoy,
        });
        self.replicas.last().context("just added")
    }

    pub fn urls(&self) -> Vec<String> {
        self.replicas.iter().map(Replica::url).collect()
    }

    /// A filter stat summed over the replicas (`name` as in `metric_names`).
    pub fn filter_stat_sum(&self, name: &str) -> Result<u64> {
        self.replicas
            .iter()
            .map(|r| r.envoy.filter_stat(name))
            .sum()
    }

    pub fn nats_mut(&mut self) -> Result<&mut Nats> {
        self.nats
            .as_mut()
            .context("sharing is off: there is no bus")
    }
}

/// Starts `llm-bridge` beside `envoy` and waits until it runs.
pub fn start_bridge(
    name: &str,
    envoy: &Envoy,
    token: &str,
    nats: &str,
    dir: &Path,
) -> Result<Guard> {
    let Some(stats) = envoy.stats_listener else {
        bail!("the Envoy config has no llm_stats listener for the bridge");
    };
    let mut cmd = Command::new(paths::bin_path("llm-bridge")?);
    cmd.arg("--envoy-url")
        .arg(format!("http://{stats}{REPLICAS_PATH}"))
        .arg("--token")
        .arg(token)
        .arg("--nats")
        .arg(nats)
        .arg("--replica")
        .arg(name);
    let log = dir.join("bridge.log");
    let (guard, ()) = spawn_until("llm-bridge", cmd, &log, Duration::from_secs(30), |line| {
        line.starts_with("llm-bridge started").then_some(())
    })?;
    Ok(guard)
}
