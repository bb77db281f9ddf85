//! A fleet: N engine mock processes behind one Envoy with the filter.

use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::engine_args;
use crate::envoy::{self, Envoy, EnvoySpec, Target, Upstream};
use crate::paths;
use crate::process::{spawn_until, Guard};
use llm_router::support::metric_names as names;

/// What to start.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub workers: usize,
    /// Prefill/decode disaggregation: this many prefill and decode engines
    /// (`p0..`, `d0..`) instead of `workers` regular ones.
    pub pd: Option<(usize, usize)>,
    /// Extra `engine-mock` arguments for every worker (e.g. `--max-running 2`).
    pub engine_args: Vec<String>,
    /// Arguments of the named engines alone (`w2`: a slower one), replacing the
    /// same flags of `engine_args` (see `engine_args::merged`).
    pub engine_args_for: BTreeMap<String, Vec<String>>,
    pub target: Target,
    /// Plugin configuration; `workers`/`target` are filled in when absent.
    pub plugin_config: Value,
    pub envoy_concurrency: u32,
    /// Where configs and logs go; a fresh temporary directory when `None`.
    pub dir: Option<PathBuf>,
    /// Run the companion collector, pushing every this many ms.
    pub collector_interval_ms: Option<u64>,
    /// Extra `llm-collector` arguments (e.g. `--window-s 1`).
    pub collector_args: Vec<String>,
    /// The route's `idle_timeout` in ms (see `EnvoySpec::route_idle_timeout_ms`).
    pub route_idle_timeout_ms: Option<u64>,
    /// Every engine publishes its KV cache events (vLLM's format, on ports the OS
    /// picks), and the collector follows them (`--kv-events`).
    pub kv_events: bool,
}

impl Default for FleetSpec {
    fn default() -> Self {
        FleetSpec {
            workers: 4,
            pd: None,
            engine_args: Vec::new(),
            engine_args_for: BTreeMap::new(),
            target: Target::Cluster,
            plugin_config: serde_json::json!({}),
            envoy_concurrency: 1,
            dir: None,
            collector_interval_ms: None,
            collector_args: Vec::new(),
            route_idle_timeout_ms: None,
            kv_events: false,
        }
    }
}

/// A running engine mock.
pub struct Engine {
    pub name: String,
    pub addr: SocketAddr,
    /// `regular`, `prefill` or `decode`.
    pub pool: &'static str,
    /// Prefill engines: their bootstrap server.
    pub bootstrap: Option<SocketAddr>,
    /// Where it publishes its KV events, and replays them.
    pub kv_events: Option<(String, String)>,
    pub guard: Guard,
}

/// The flags that make an engine mock publish its KV events on ports the OS picks.
const KV_EVENT_ARGS: [&str; 4] = [
    "--kv-events-endpoint",
    "tcp://127.0.0.1:0",
    "--kv-events-replay-endpoint",
    "tcp://127.0.0.1:0",
];

/// The word after `key` in an engine's startup line.
fn after<'l>(line: &'l str, key: &str) -> Option<&'l str> {
    let mut words = line.split_whitespace();
    words.find(|w| *w == key)?;
    words.next()
}

/// A running fleet; dropping it stops the collector, Envoy and every engine.
pub struct Fleet {
    // Dropped in this order: the collector, Envoy, then the engines behind it.
    pub collector: Option<Guard>,
    pub envoy: Envoy,
    pub engines: Vec<Engine>,
    pub dir: PathBuf,
    _tmp: Option<TempDir>,
}

/// A directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(prefix: &str) -> Result<TempDir> {
        let base = std::env::temp_dir().join(format!(
            "{prefix}-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&base)?;
        Ok(TempDir(base))
    }
}

static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts one engine mock named `name`, on a port the OS picks.
pub fn start_engine(name: &str, args: &[String], dir: &Path) -> Result<Engine> {
    start_engine_in(name, "regular", args, dir)
}

/// Starts an engine mock of `pool` (its `--role`).
pub fn start_engine_in(
    name: &str,
    pool: &'static str,
    args: &[String],
    dir: &Path,
) -> Result<Engine> {
    let mut cmd = Command::new(paths::bin_path("engine-mock")?);
    cmd.args(["--port", "0", "--worker-id", name, "--role", pool])
        .args(args);
    let log = dir.join(format!("engine-{name}.log"));
    let (guard, (addr, bootstrap, kv_events)) =
        spawn_until(name, cmd, &log, Duration::from_secs(30), |line| {
            let (head, addr) = line.rsplit_once(" listening on ")?;
            let addr = addr.trim().parse::<SocketAddr>().ok()?;
            let bootstrap = after(head, "bootstrap").and_then(|b| b.parse().ok());
            let kv_events = after(head, "kv-events")
                .zip(after(head, "kv-events-replay"))
                .map(|(e, r)| (e.to_string(), r.to_string()));
            Some((addr, bootstrap, kv_events))
        })?;
    Ok(Engine {
        name: name.to_string(),
        addr,
        pool,
        bootstrap,
        kv_events,
        guard,
    })
}

/// The engines of `spec` (`w0..`, or `p0..` and `d0..` with PD), started in `dir`,
/// each with the common arguments and its own.
pub fn start_engines(spec: &FleetSpec, dir: &Path) -> Result<Vec<Engine>> {
    let roster: Vec<(String, &'static str)> = match spec.pd {
        None => (0..spec.workers)
            .map(|i| (llm_load::fleet::worker_name(i), "regular"))
            .collect(),
        Some((prefill, decode)) => (0..prefill)
            .map(|i| (format!("p{i}"), "prefill"))
            .chain((0..decode).map(|i| (format!("d{i}"), "decode")))
            .collect(),
    };
    if let Some(name) = spec
        .engine_args_for
        .keys()
        .find(|name| !roster.iter().any(|(n, _)| n == *name))
    {
        bail!("engine arguments for {name}, which is no engine of the fleet");
    }
    roster
        .iter()
        .map(|(name, pool)| {
            let own = spec
                .engine_args_for
                .get(name)
                .map_or(&[][..], Vec::as_slice);
            let mut args = engine_args::merged(&spec.engine_args, own);
            if spec.kv_events {
                args.extend(KV_EVENT_ARGS.map(String::from));
            }
            start_engine_in(name, pool, &args, dir)
        })
        .collect()
}

/// An Envoy in front of `engines` as `spec` says, with `plugin_config`.
pub fn envoy_spec(spec: &FleetSpec, engines: &[Engine], plugin_config: Value) -> Result<EnvoySpec> {
    Ok(EnvoySpec {
        upstreams: engines
            .iter()
            .map(|e| Upstream {
                name: e.name.clone(),
                addr: e.addr,
                pool: e.pool,
                bootstrap: e.bootstrap,
            })
            .collect(),
        target: spec.target,
        plugin_config,
        wasm: paths::wasm_path()?,
        concurrency: spec.envoy_concurrency,
        route_idle_timeout_ms: spec.route_idle_timeout_ms,
        collector: None,
    })
}

/// A value for tokens and names that must not collide between runs.
pub fn random_u64() -> u64 {
    use std::hash::BuildHasher;
    std::collections::hash_map::RandomState::new().hash_one(std::process::id())
}

/// Waits until the filter has taken the collector's first push (up to a minute: a
/// loaded 2-core machine is slow). A deployed collector runs before traffic comes,
/// so a run's first request meets engine samples, as every later one does; without
/// the wait, whether it did was a race between the collector's first scrape and the
/// load's first request.
fn first_push(envoy: &Envoy) -> Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while envoy.filter_stat(names::STATS_PUSHES_ACCEPTED)? == 0 {
        if std::time::Instant::now() >= deadline {
            bail!("the collector's first push did not reach the filter within 60 s (its log: collector.log)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Starts `llm-collector` scraping `engines` and pushing to Envoy's stats listener.
pub fn start_collector(
    envoy: &Envoy,
    engines: &[Engine],
    token: &str,
    interval_ms: u64,
    extra_args: &[String],
    dir: &Path,
) -> Result<Guard> {
    let Some(stats) = envoy.stats_listener else {
        anyhow::bail!("the Envoy config has no llm_stats listener for the collector");
    };
    let mut cmd = Command::new(paths::bin_path("llm-collector")?);
    cmd.arg("--push-url")
        .arg(format!("http://{stats}/llm-router/stats"))
        .arg("--token")
        .arg(token)
        .arg("--interval-ms")
        .arg(interval_ms.to_string())
        .args(extra_args);
    for e in engines {
        cmd.arg("--engine")
            .arg(format!("{}=http://{}", e.name, e.addr));
        if let Some((events, replay)) = &e.kv_events {
            cmd.arg("--kv-events")
                .arg(format!("{}={events},replay={replay}", e.name));
        }
    }
    crate::process::spawn("llm-collector", cmd, &dir.join("collector.log"))
}

/// `kv_match: true` in `plugin_config` (or settings without a `cluster`) asks the
/// fleet's collector: the plugin config's `kv_match` names Envoy's cluster for it,
/// and the address returned (free now) is where the collector will listen and the
/// cluster point (Envoy starts before the collector, which needs its stats
/// listener). `None` without it.
pub fn kv_match_listen(plugin_config: &mut Value, kv_events: bool) -> Result<Option<SocketAddr>> {
    let settings = match plugin_config.get("kv_match") {
        Some(Value::Bool(true)) => serde_json::json!({}),
        Some(Value::Object(s)) if !s.contains_key("cluster") => Value::Object(s.clone()),
        _ => return Ok(None),
    };
    if !kv_events {
        bail!("kv_match asks the collector what the engines' KV events say: it needs kv_events");
    }
    plugin_config["kv_match"] = settings;
    plugin_config["kv_match"]["cluster"] = Value::from(envoy::COLLECTOR_CLUSTER);
    Ok(Some(crate::process::free_addr()?))
}

/// The collector's arguments with `kv_events`, beside those `given`: its /metrics
/// say what it indexed (`Fleet::kv_blocks`), and `/kv/match` which engines hold a
/// prompt, tokenized as the engine mocks do unless `given` names a tokenizer; on
/// `listen` (`kv_match_listen`), or a port the OS picks.
pub fn kv_collector_args(listen: Option<SocketAddr>, given: &[String]) -> Vec<String> {
    let listen = listen.map_or_else(|| "127.0.0.1:0".to_string(), |a| a.to_string());
    let mut args = vec!["--listen".to_string(), listen];
    if !given.iter().any(|a| a == "--kv-tokenizer") {
        args.extend(["--kv-tokenizer", "engine-mock"].map(String::from));
    }
    args
}

/// The `--listen` address of the collector whose log is in `dir`.
pub fn collector_listen_in(dir: &Path) -> Result<SocketAddr> {
    let log = std::fs::read_to_string(dir.join("collector.log"))?;
    log.lines()
        .find(|l| l.contains("serving /healthz"))
        .and_then(|l| l.split("addr=").nth(1)?.split_whitespace().next())
        .and_then(|a| a.parse::<SocketAddr>().ok())
        .context("the collector serves no /metrics (start it with kv_events)")
}

/// The answer of the collector whose log is in `dir` to `POST /kv/match` for a
/// request to `path` with `body` (its status and JSON).
pub fn kv_match_in(dir: &Path, path: &str, body: &Value) -> Result<(u16, Value)> {
    let r = crate::admin::request(
        collector_listen_in(dir)?,
        "POST",
        &format!("/kv/match?path={path}"),
        &[("content-type", "application/json")],
        body.to_string().as_bytes(),
    )?;
    Ok((r.status, serde_json::from_str(&r.body)?))
}

impl Fleet {
    pub fn start(spec: &FleetSpec) -> Result<Fleet> {
        let (dir, tmp) = match &spec.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.clone(), None)
            }
            None => {
                let t = TempDir::new("llm-fleet")?;
                (t.0.clone(), Some(t))
            }
        };
        let engines = start_engines(spec, &dir)?;
        let mut plugin_config = spec.plugin_config.clone();
        let token = format!("{:016x}", random_u64());
        if spec.collector_interval_ms.is_some() {
            if let Value::Object(map) = &mut plugin_config {
                map.entry("stats_token")
                    .or_insert_with(|| Value::from(token.clone()));
            }
        }
        let token = plugin_config["stats_token"]
            .as_str()
            .unwrap_or(&token)
            .to_string();
        let listen = kv_match_listen(&mut plugin_config, spec.kv_events)?;
        let mut envoy_spec = envoy_spec(spec, &engines, plugin_config)?;
        envoy_spec.collector = listen;
        let envoy = envoy::start(&paths::envoy_bin()?, &envoy_spec, &dir)
            .context("starting Envoy with the filter")?;
        let mut collector_args = spec.collector_args.clone();
        if spec.kv_events {
            let kv = kv_collector_args(listen, &collector_args);
            collector_args.extend(kv);
        }
        let collector = match spec.collector_interval_ms {
            Some(interval) => {
                let collector =
                    start_collector(&envoy, &engines, &token, interval, &collector_args, &dir)?;
                first_push(&envoy)?;
                Some(collector)
            }
            None => None,
        };
        Ok(Fleet {
            collector,
            envoy,
            engines,
            dir,
            _tmp: tmp,
        })
    }

    pub fn url(&self) -> String {
        self.envoy.url()
    }

    pub fn engine(&self, name: &str) -> Option<&Engine> {
        self.engines.iter().find(|e| e.name == name)
    }

    /// A counter each engine of `pool` exports, by engine name (0 when absent).
    pub fn engine_counter(&self, pool: &str, metric: &str) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for e in self.engines.iter().filter(|e| e.pool == pool) {
            let text = crate::admin::get(e.addr, "/metrics")?.body;
            out.insert(e.name.clone(), metric_sum(&text, metric) as u64);
        }
        Ok(out)
    }

    /// The collector's `--listen` address (with `kv_events`), from its log.
    pub fn collector_listen(&self) -> Result<SocketAddr> {
        collector_listen_in(&self.dir)
    }

    /// With `kv_events`: the collector's answer to `POST /kv/match` for a request to
    /// `path` with `body` (its status and JSON).
    pub fn kv_match(&self, path: &str, body: &Value) -> Result<(u16, Value)> {
        kv_match_in(&self.dir, path, body)
    }

    /// With `kv_events`: per engine, the blocks the collector's index says it holds
    /// (from its KV events) and the blocks its cache holds (its KV usage times its
    /// blocks, from its own metrics).
    pub fn kv_blocks(&self) -> Result<BTreeMap<String, (u64, u64)>> {
        let collector = crate::admin::get(self.collector_listen()?, "/metrics")?.body;
        let mut out = BTreeMap::new();
        for e in &self.engines {
            let held = collector
                .lines()
                .find(|l| {
                    l.starts_with(&format!(
                        "llm_collector_kv_blocks{{engine=\"{}\"}} ",
                        e.name
                    ))
                })
                .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .unwrap_or(0);
            let text = crate::admin::get(e.addr, "/metrics")?.body;
            let blocks = text
                .lines()
                .find(|l| l.starts_with("vllm:cache_config_info{"))
                .and_then(|l| l.split("num_gpu_blocks=\"").nth(1)?.split('"').next())
                .and_then(|b| b.parse::<f64>().ok())
                .unwrap_or(0.0);
            let usage = metric_sum(&text, "vllm:kv_cache_usage_perc");
            out.insert(e.name.clone(), (held, (usage * blocks).round() as u64));
        }
        Ok(out)
    }
}

/// The sum of `metric`'s samples in Prometheus text.
fn metric_sum(text: &str, metric: &str) -> f64 {
    text.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(metric))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Starts one of the shipped example configs (`envoy/*.yaml`) as a user would, with
/// only what a test must change: engine `i`'s port `8001 + i` becomes `engines[i]`'s,
/// a prefill engine's `"bootstrap_port": 8998 + i` its bootstrap server's, the
/// listener and admin ports OS-chosen, and the `.wasm` path absolute.
pub fn launch_example(file: &str, engines: &[Engine], dir: &Path) -> Result<Envoy> {
    let root = paths::workspace_root();
    let mut yaml =
        std::fs::read_to_string(root.join(file)).with_context(|| format!("reading {file}"))?;
    for (i, e) in engines.iter().enumerate() {
        yaml = yaml.replace(&format!("127.0.0.1:{}", 8001 + i), &e.addr.to_string());
        yaml = yaml.replace(
            &format!("port_value: {} ", 8001 + i),
            &format!("port_value: {} ", e.addr.port()),
        );
        if let Some(b) = e.bootstrap {
            yaml = yaml.replace(
                &format!("\"bootstrap_port\": {}", 8998 + i),
                &format!("\"bootstrap_port\": {}", b.port()),
            );
        }
    }
    yaml = yaml
        .replace("port_value: 10000", "port_value: 0")
        .replace("port_value: 9901", "port_value: 0")
        .replace("port_value: 10001", "port_value: 0")
        .replace(
            "filename: target/wasm32-wasip1/wasm/llm_router.wasm",
            &format!("filename: {}", paths::wasm_path()?.display()),
        );
    let config = dir.join("example.yaml");
    std::fs::write(&config, yaml)?;
    envoy::launch(&paths::envoy_bin()?, &config, 1, dir)
        .with_context(|| format!("{file} does not start"))
}
