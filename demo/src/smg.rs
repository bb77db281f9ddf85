//! SGLang's model gateway (SMG) from PyPI, the router people would pick instead of
//! this filter, run in front of the same engine mocks so a comparison needs no
//! second harness.
//!
//! SMG is installed with pip into a venv under `target/` (made on first use, reused
//! after; `SMG_BIN` names another `smg`), pinned to [`SMG_VERSION`], and launched as
//! `smg launch --policy cache_aware --worker-urls ...`, its other settings at their
//! defaults. It learns each worker's models from the engines' `/v1/models` and is
//! ready once its `/readiness` counts every worker healthy. Both of its ports (the
//! router's and Prometheus's, whose default 29000 would collide between two runs)
//! are free ports picked here; SMG cannot report a port it chose itself.

use anyhow::{bail, Context, Result};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::admin;
use crate::paths::workspace_root;
use crate::process::{free_port, spawn, Guard};

/// The PyPI release the comparison runs (`pip install smg==SMG_VERSION`).
pub const SMG_VERSION: &str = "1.13.0";
/// SMG's policy in the comparison: the one this filter's `cache_aware` follows.
pub const SMG_POLICY: &str = "cache_aware";
/// How long SMG may take to register every worker.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// Launches tried when a picked port was taken before SMG bound it.
const LAUNCH_ATTEMPTS: usize = 3;

/// The venv the demo installs SMG into.
pub fn venv_dir() -> PathBuf {
    workspace_root().join(format!("target/smg/venv-{SMG_VERSION}"))
}

/// The `smg` executable: `SMG_BIN`, else the venv's, installed first when missing
/// (`python3 -m venv`, then pip from PyPI; pip's output goes to `install.log` beside
/// the venv).
pub fn smg_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("SMG_BIN") {
        return Ok(PathBuf::from(p));
    }
    let venv = venv_dir();
    let bin = venv.join("bin/smg");
    if bin.is_file() {
        return Ok(bin);
    }
    let log = venv.with_file_name("install.log");
    std::fs::create_dir_all(venv.parent().unwrap_or(&venv))?;
    eprintln!(
        "llm-demo: installing smg=={SMG_VERSION} from PyPI into {} (log {})",
        venv.display(),
        log.display()
    );
    let out = std::fs::File::create(&log)?;
    for (program, args) in install_commands(&venv) {
        let status = Command::new(&program)
            .args(&args)
            .stdout(out.try_clone()?)
            .stderr(out.try_clone()?)
            .status()
            .with_context(|| format!("running {program}"))?;
        if !status.success() {
            bail!(
                "`{program} {}` failed ({status}); see {}",
                args.join(" "),
                log.display()
            );
        }
    }
    if !bin.is_file() {
        bail!("pip installed smg but {} is missing", bin.display());
    }
    Ok(bin)
}

/// The commands that make the venv and install the pinned SMG into it.
fn install_commands(venv: &Path) -> [(String, Vec<String>); 2] {
    let venv_s = venv.display().to_string();
    [
        ("python3".into(), vec!["-m".into(), "venv".into(), venv_s]),
        (
            venv.join("bin/pip").display().to_string(),
            vec![
                "install".into(),
                "--quiet".into(),
                format!("smg=={SMG_VERSION}"),
            ],
        ),
    ]
}

/// `smg`'s arguments: the router on loopback at `port`, its Prometheus exporter at
/// `prometheus_port`, [`SMG_POLICY`] over `workers`. Its log at `warn`, as Envoy's is
/// at `warning`, so neither router pays for per-request logging.
pub fn launch_args(port: u16, prometheus_port: u16, workers: &[SocketAddr]) -> Vec<String> {
    let mut args: Vec<String> = [
        "launch",
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "--prometheus-host",
        "127.0.0.1",
        "--prometheus-port",
        &prometheus_port.to_string(),
        "--policy",
        SMG_POLICY,
        "--log-level",
        "warn",
        // Takes every value after it, so it comes last.
        "--worker-urls",
    ]
    .map(String::from)
    .into();
    args.extend(workers.iter().map(|w| format!("http://{w}")));
    args
}

/// A running SMG; dropping it kills it.
pub struct Smg {
    pub addr: SocketAddr,
    pub log: PathBuf,
    _guard: Guard,
}

impl Smg {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Starts `bin` in front of `workers`, logging to `dir/smg.log`, and waits until it
/// counts every worker healthy.
pub fn start(bin: &Path, workers: &[SocketAddr], dir: &Path) -> Result<Smg> {
    let log = dir.join("smg.log");
    for _ in 0..LAUNCH_ATTEMPTS {
        let (port, prometheus_port) = (free_port()?, free_port()?);
        let mut cmd = Command::new(bin);
        cmd.args(launch_args(port, prometheus_port, workers));
        let mut guard = spawn("smg", cmd, &log)?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if guard.exited().is_some() {
                break;
            }
            if healthy_workers(addr) == Some(workers.len()) {
                return Ok(Smg {
                    addr,
                    log,
                    _guard: guard,
                });
            }
            if Instant::now() > deadline {
                bail!(
                    "smg did not count {} healthy workers in {READY_TIMEOUT:?}; log {}:\n{}",
                    workers.len(),
                    log.display(),
                    crate::envoy::tail(&log)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    bail!(
        "smg exited during start {LAUNCH_ATTEMPTS} times; last log {}:\n{}",
        log.display(),
        crate::envoy::tail(&log)
    )
}

/// The worker count SMG's `/readiness` reports healthy (`None` until it answers).
fn healthy_workers(addr: SocketAddr) -> Option<usize> {
    let resp = admin::get(addr, "/readiness").ok()?;
    let n = resp.json().ok()?["healthy_workers"].as_u64()?;
    usize::try_from(n).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_runs_cache_aware_on_loopback_with_both_ports_off_their_defaults() {
        let workers: Vec<SocketAddr> = vec![
            "127.0.0.1:8001".parse().unwrap(),
            "127.0.0.1:8002".parse().unwrap(),
        ];
        let args = launch_args(40000, 40001, &workers);
        let after = |flag: &str| {
            let i = args.iter().position(|a| a == flag);
            i.and_then(|i| args.get(i + 1)).map(String::as_str)
        };
        assert_eq!(args[0], "launch", "the router-only subcommand");
        assert_eq!(after("--port"), Some("40000"));
        assert_eq!(
            after("--prometheus-port"),
            Some("40001"),
            "two SMGs at once must not both take 29000"
        );
        assert_eq!(after("--host"), Some("127.0.0.1"));
        assert_eq!(after("--prometheus-host"), Some("127.0.0.1"));
        assert_eq!(after("--policy"), Some("cache_aware"));
        let urls = args.iter().position(|a| a == "--worker-urls").unwrap();
        assert_eq!(
            args[urls + 1..],
            ["http://127.0.0.1:8001", "http://127.0.0.1:8002"],
            "the worker URLs close the command line, nothing after them"
        );
    }

    #[test]
    fn install_pins_the_release_in_its_own_venv() {
        let venv = Path::new("/x/venv");
        let [(python, venv_args), (pip, pip_args)] = install_commands(venv);
        assert_eq!(
            (python.as_str(), venv_args),
            (
                "python3",
                vec!["-m".to_string(), "venv".into(), "/x/venv".into()]
            )
        );
        assert_eq!(pip, "/x/venv/bin/pip", "pip of the venv, not the system's");
        assert!(
            pip_args.contains(&"smg==1.13.0".to_string()),
            "{pip_args:?}"
        );
        assert!(venv_dir().ends_with("target/smg/venv-1.13.0"));
    }
}
