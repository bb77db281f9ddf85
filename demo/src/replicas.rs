//! Several Envoy replicas in front of one set of engine mocks, each with its own
//! collector and (with sharing on) its bridge (`llm-bridge`), and the NATS server
//! the bridges share. The bus is set up as a deployment should be: the server
//! requires a token, and the bridges seal every message under a fleet key (both
//! generated per run, in files in the run's directory). The bus can be stopped and
//! resumed on the same port, and a replica can join late, which is what the
//! end-to-end tests and `envoy/demo --envoys N` exercise.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::ffi::OsString;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::envoy::{self, Envoy, EnvoySpec};
use crate::fleet::{
    envoy_spec, kv_collector_args, kv_match_listen, random_u64, start_collector, start_engines,
    Engine, FleetSpec, TempDir,
};
use crate::paths;
use crate::process::{free_addr, free_port, spawn, spawn_until, Guard};

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

/// A secret of `bytes` random bytes, hex-encoded (twice as many characters).
pub fn random_secret(bytes: usize) -> String {
    (0..bytes.div_ceil(8))
        .map(|_| format!("{:016x}", random_u64()))
        .collect::<String>()[..2 * bytes]
        .to_string()
}

/// A NATS server on a fixed loopback port, which can be stopped and resumed.
pub struct Nats {
    pub port: u16,
    bin: PathBuf,
    log: PathBuf,
    /// The server's flags beyond address and port (authorization, TLS).
    args: Vec<String>,
    guard: Option<Guard>,
}

impl Nats {
    /// Starts `nats-server` with `args` added (e.g. `--auth TOKEN`), logging to
    /// `dir/nats.log`.
    pub fn start(dir: &Path, args: &[&str]) -> Result<Nats> {
        let mut nats = Nats {
            port: free_port()?,
            bin: nats_server_bin()?,
            log: dir.join("nats.log"),
            args: args.iter().map(|a| a.to_string()).collect(),
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
        cmd.args(["-a", "127.0.0.1", "-p", &self.port.to_string()])
            .args(&self.args);
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

/// What a bridge needs to join the fleet's bus: where it is, the NATS token, and
/// the fleet key (files, as a deployment mounts secrets).
#[derive(Debug, Clone)]
pub struct BusAccess {
    pub url: String,
    pub nats_token_file: PathBuf,
    pub fleet_key_file: PathBuf,
}

impl BusAccess {
    /// Writes `nats_token` and a fresh fleet key into `dir`, for the bus at `url`.
    pub fn write(dir: &Path, url: String, nats_token: &str) -> Result<BusAccess> {
        let access = BusAccess {
            url,
            nats_token_file: dir.join("nats.token"),
            fleet_key_file: dir.join("fleet.key"),
        };
        std::fs::write(&access.nats_token_file, nats_token)?;
        std::fs::write(&access.fleet_key_file, random_secret(32))?;
        Ok(access)
    }

    pub fn nats_token(&self) -> Result<String> {
        Ok(std::fs::read_to_string(&self.nats_token_file)?
            .trim()
            .to_string())
    }

    /// The bridge's flags for this bus.
    pub fn bridge_args(&self) -> Vec<OsString> {
        vec![
            "--nats".into(),
            self.url.clone().into(),
            "--nats-token-file".into(),
            self.nats_token_file.clone().into(),
            "--fleet-key-file".into(),
            self.fleet_key_file.clone().into(),
        ]
    }
}

/// A running bridge and where it serves its /metrics.
pub struct Bridge {
    pub guard: Guard,
    pub metrics: SocketAddr,
}

impl Bridge {
    /// A counter or gauge from the bridge's /metrics, by its full series name (as
    /// `llm_bridge_messages_refused{reason="replayed"}`); absent is an error.
    pub fn stat(&self, series: &str) -> Result<u64> {
        let resp = crate::admin::get(self.metrics, "/metrics")?;
        if resp.status != 200 {
            bail!("llm-bridge /metrics answered {}", resp.status);
        }
        resp.body
            .lines()
            .find_map(|l| {
                l.strip_prefix(series)?
                    .strip_prefix(' ')?
                    .trim()
                    .parse()
                    .ok()
            })
            .with_context(|| format!("llm-bridge /metrics has no `{series}`"))
    }
}

/// One replica: its Envoy, and the processes beside it.
pub struct Replica {
    pub name: String,
    // Dropped in this order: the bridge and the collector, then Envoy.
    pub bridge: Option<Bridge>,
    pub collector: Option<Guard>,
    pub envoy: Envoy,
}

impl Replica {
    pub fn url(&self) -> String {
        self.envoy.url()
    }
}

/// Replicas with the engines' KV events.
#[derive(Debug, Clone, Copy)]
struct KvFollow {
    /// The plugin config asks its collector (`kv_match`).
    kv_match: bool,
}

/// Replicas of one Envoy config; dropping it stops every process it started.
pub struct Replicas {
    // Dropped in this order: the replicas, the bus, the engines.
    pub replicas: Vec<Replica>,
    pub nats: Option<Nats>,
    /// How bridges join the bus (with sharing on).
    pub access: Option<BusAccess>,
    pub engines: Vec<Engine>,
    pub token: String,
    spec: EnvoySpec,
    collector: Option<(u64, Vec<String>)>,
    /// Each replica's collector follows the engines' KV events; with `kv_match`,
    /// its Envoy asks it.
    kv: Option<KvFollow>,
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
        let kv_match = kv_match_listen(&mut plugin_config, fleet.kv_events)?.is_some();
        let (nats, access) = if sharing {
            let token = random_secret(16);
            let nats = Nats::start(&dir, &["--auth", &token])?;
            let access = BusAccess::write(&dir, nats.url(), &token)?;
            (Some(nats), Some(access))
        } else {
            (None, None)
        };
        let mut replicas = Replicas {
            replicas: Vec::new(),
            nats,
            access,
            spec: envoy_spec(fleet, &engines, plugin_config)?,
            engines,
            token,
            collector: fleet
                .collector_interval_ms
                .map(|ms| (ms, fleet.collector_args.clone())),
            kv: fleet.kv_events.then_some(KvFollow { kv_match }),
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
        // Each replica's own collector, and with `kv_match` its own cluster for it.
        let listen = match self.kv {
            Some(KvFollow { kv_match: true }) => Some(free_addr()?),
            _ => None,
        };
        let mut spec = EnvoySpec {
            collector: listen,
            ..self.spec.clone()
        };
        // Each replica breaks ties from a seed of its own, as replicas seeded by
        // their hosts do: with one seed, replicas that know nothing of each other
        // all send their first requests to the same worker.
        let index = self.replicas.len() as u64;
        if let Some(seed) = spec.plugin_config.get("rng_seed").and_then(Value::as_u64) {
            spec.plugin_config["rng_seed"] = Value::from(seed.wrapping_add(index));
        }
        let envoy = envoy::start(&paths::envoy_bin()?, &spec, &dir)
            .with_context(|| format!("starting {name}"))?;
        let collector = match &self.collector {
            Some((ms, args)) => {
                let mut args = args.clone();
                if self.kv.is_some() {
                    let kv = kv_collector_args(listen, &args);
                    args.extend(kv);
                }
                Some(start_collector(
                    &envoy,
                    &self.engines,
                    &self.token,
                    *ms,
                    &args,
                    &dir,
                )?)
            }
            None => None,
        };
        let bridge = match &self.access {
            Some(access) => Some(start_bridge(&name, &envoy, &self.token, access, &dir)?),
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

/// Starts `llm-bridge` beside `envoy` on the bus `access` describes, serving its
/// /metrics on a free port, and waits until it runs.
pub fn start_bridge(
    name: &str,
    envoy: &Envoy,
    token: &str,
    access: &BusAccess,
    dir: &Path,
) -> Result<Bridge> {
    let Some(stats) = envoy.stats_listener else {
        bail!("the Envoy config has no llm_stats listener for the bridge");
    };
    let metrics = free_addr()?;
    let mut cmd = Command::new(paths::bin_path("llm-bridge")?);
    cmd.arg("--envoy-url")
        .arg(format!("http://{stats}{REPLICAS_PATH}"))
        .arg("--token")
        .arg(token)
        .args(access.bridge_args())
        .arg("--replica")
        .arg(name)
        .arg("--listen")
        .arg(metrics.to_string());
    let log = dir.join("bridge.log");
    let (guard, ()) = spawn_until("llm-bridge", cmd, &log, Duration::from_secs(30), |line| {
        line.starts_with("llm-bridge started").then_some(())
    })?;
    Ok(Bridge { guard, metrics })
}
