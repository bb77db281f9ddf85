//! A real Prometheus for the observability tests: Debian's `prometheus` and
//! `promtool` (as `envoy/get-prometheus` installs them), started on a port the OS
//! picks, scraping the targets it is given, and queried through its HTTP API
//! (`/api/v1/query`, `/api/v1/rules`). Dropping a [`Prometheus`] stops it and
//! removes its data directory.

use anyhow::{bail, Context, Result};
use llm_demo::admin;
use llm_demo::fleet::TempDir;
use llm_demo::process::{spawn, Guard};
use serde_json::{json, Value};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where Debian puts the binaries (on PATH, but not on every caller's PATH).
const SYSTEM_DIRS: [&str; 3] = ["/usr/bin", "/usr/local/bin", "/usr/sbin"];

/// `name` from `env` when set, else from PATH or the system directories; `None`
/// when it is nowhere.
fn find_bin(env: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return Some(PathBuf::from(p));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SYSTEM_DIRS.map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `prometheus`, as `envoy/get-prometheus` installs it; `PROMETHEUS` overrides.
pub fn prometheus_bin() -> Result<PathBuf> {
    find_bin("PROMETHEUS", "prometheus").context(
        "prometheus not found: run `envoy/get-prometheus` (apt-get install prometheus) or set PROMETHEUS",
    )
}

/// `promtool` (Debian's `prometheus` package brings it); `PROMTOOL` overrides.
pub fn promtool_bin() -> Result<PathBuf> {
    find_bin("PROMTOOL", "promtool").context(
        "promtool not found: run `envoy/get-prometheus` (apt-get install prometheus) or set PROMTOOL",
    )
}

/// One scrape job.
pub struct Scrape {
    pub job: String,
    pub target: SocketAddr,
    pub metrics_path: String,
}

/// A running Prometheus.
pub struct Prometheus {
    pub addr: SocketAddr,
    pub log: PathBuf,
    // Stopped before its directory goes.
    _guard: Guard,
    _dir: TempDir,
}

/// How long Prometheus may take to answer `/-/ready`.
const READY: Duration = Duration::from_secs(60);

impl Prometheus {
    /// Starts Prometheus scraping `scrapes` every `interval`, evaluating
    /// `rule_files` as often, and waits until it is ready.
    pub fn start(scrapes: &[Scrape], interval: Duration, rule_files: &[&Path]) -> Result<Self> {
        let bin = prometheus_bin()?;
        let dir = TempDir::new("llm-prometheus")?;
        let every = format!("{}ms", interval.as_millis());
        // JSON is YAML: the config is written with serde_json.
        let config = json!({
            "global": {
                "scrape_interval": every,
                "scrape_timeout": every,
                "evaluation_interval": every,
            },
            "rule_files": rule_files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "scrape_configs": scrapes.iter().map(|s| json!({
                "job_name": s.job,
                "metrics_path": s.metrics_path,
                "static_configs": [{"targets": [s.target.to_string()]}],
            })).collect::<Vec<_>>(),
        });
        let config_path = dir.0.join("prometheus.yml");
        std::fs::write(&config_path, serde_json::to_vec_pretty(&config)?)?;
        let log = dir.0.join("prometheus.log");
        // The port is free when picked; another process may take it before
        // Prometheus binds it, and then Prometheus exits: pick again.
        let mut last_error = None;
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            let addr: SocketAddr = ([127, 0, 0, 1], port).into();
            let mut cmd = Command::new(&bin);
            cmd.arg(format!("--config.file={}", config_path.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.0.join("data").display()
                ))
                .arg(format!("--web.listen-address={addr}"))
                .arg("--log.level=warn");
            let mut guard = spawn("prometheus", cmd, &log)?;
            match wait_ready(&mut guard, addr, &log) {
                Ok(()) => {
                    return Ok(Prometheus {
                        addr,
                        log,
                        _guard: guard,
                        _dir: dir,
                    })
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| anyhow::anyhow!("prometheus did not start")))
    }

    /// An instant query's result (`data.result`: a vector's samples, each with
    /// `metric` and `value`), or the error Prometheus gave.
    pub fn query(&self, expr: &str) -> Result<Vec<Value>> {
        let path = format!("/api/v1/query?query={}", url_encode(expr));
        let v = self.api(&path)?;
        match &v["data"]["result"] {
            Value::Array(samples) => Ok(samples.clone()),
            // A scalar or string: one value.
            other => Ok(vec![json!({"metric": {}, "value": other})]),
        }
    }

    /// A range query's series (`data.result`: each with `metric` and `values`), as
    /// a graph panel draws them, from `start` to `end` (Unix seconds) every `step`.
    pub fn query_range(
        &self,
        expr: &str,
        start: f64,
        end: f64,
        step: Duration,
    ) -> Result<Vec<Value>> {
        let path = format!(
            "/api/v1/query_range?query={}&start={start:.3}&end={end:.3}&step={}",
            url_encode(expr),
            step.as_secs_f64()
        );
        let v = self.api(&path)?;
        Ok(v["data"]["result"].as_array().cloned().unwrap_or_default())
    }

    /// `/api/v1/rules`' groups.
    pub fn rule_groups(&self) -> Result<Vec<Value>> {
        let v = self.api("/api/v1/rules")?;
        Ok(v["data"]["groups"].as_array().cloned().unwrap_or_default())
    }

    /// `/api/v1/targets`' active targets.
    pub fn targets(&self) -> Result<Vec<Value>> {
        let v = self.api("/api/v1/targets")?;
        Ok(v["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    fn api(&self, path: &str) -> Result<Value> {
        let r = admin::get(self.addr, path)?;
        let v: Value = serde_json::from_str(&r.body)
            .with_context(|| format!("prometheus {path} answered {}: {}", r.status, r.body))?;
        if v["status"] != "success" {
            bail!("prometheus {path} answered {}: {}", r.status, r.body);
        }
        Ok(v)
    }
}

/// Polls `/-/ready` until it answers 200; fails when Prometheus exits or
/// [`READY`] passes.
fn wait_ready(guard: &mut Guard, addr: SocketAddr, log: &Path) -> Result<()> {
    let deadline = Instant::now() + READY;
    loop {
        if let Some(status) = guard.exited() {
            bail!(
                "prometheus exited during start ({status}); log {}:\n{}",
                log.display(),
                llm_demo::envoy::tail(log)
            );
        }
        if admin::get(addr, "/-/ready").is_ok_and(|r| r.status == 200) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "prometheus not ready in {READY:?}; log {}:\n{}",
                log.display(),
                llm_demo::envoy::tail(log)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `s` percent-encoded for a query string (every byte but the unreserved ones).
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A sample's value as a number (`value` is `[time, "text"]`); NaN when it is not
/// one.
pub fn sample_value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The numbers of a range query's series (`values` are `[time, "text"]` pairs);
/// NaN where one is not a number.
pub fn series_values(series: &Value) -> Vec<f64> {
    series["values"]
        .as_array()
        .map(|vs| {
            vs.iter()
                .map(|v| {
                    v[1].as_str()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(f64::NAN)
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Now, in Unix seconds (what Prometheus' API takes for times).
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encode_keeps_only_unreserved_bytes() {
        assert_eq!(
            url_encode("sum(rate(x{a=\"b c\"}[4s])) / 2"),
            "sum%28rate%28x%7Ba%3D%22b%20c%22%7D%5B4s%5D%29%29%20%2F%202"
        );
        assert_eq!(url_encode("a-b_c.d~"), "a-b_c.d~");
    }

    #[test]
    fn sample_value_reads_prometheus_text_numbers() {
        assert_eq!(sample_value(&json!({"value": [1.5, "0.25"]})), 0.25);
        assert!(sample_value(&json!({"value": [1.5, "NaN"]})).is_nan());
        assert!(sample_value(&json!({})).is_nan());
    }

    #[test]
    fn series_values_reads_every_point() {
        let v = series_values(&json!({"values": [[1, "0"], [3, "2.5"], [5, "NaN"]]}));
        assert_eq!(v[..2], [0.0, 2.5]);
        assert!(v[2].is_nan());
        assert!(series_values(&json!({})).is_empty());
    }
}
