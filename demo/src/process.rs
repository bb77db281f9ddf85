//! Child processes that cannot outlive their owner.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// Kills and reaps the process when dropped.
pub struct Guard {
    pub name: String,
    child: Child,
}

impl Guard {
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process already exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `cmd` with stdout and stderr going to `log`.
pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Guard> {
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out.try_clone()?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err));
    let child = cmd
        .spawn()
        .with_context(|| format!("starting {name} ({cmd:?})"))?;
    Ok(Guard {
        name: name.to_string(),
        child,
    })
}

/// Starts `cmd` with stdout piped and waits (up to `timeout`) for a stdout line that
/// `ready` accepts, returning what it extracted. Stderr goes to `log`; stdout lines
/// after the ready line are drained so the child never blocks on a full pipe.
pub fn spawn_until<T: Send + 'static>(
    name: &str,
    mut cmd: Command,
    log: &Path,
    timeout: Duration,
    ready: impl Fn(&str) -> Option<T> + Send + 'static,
) -> Result<(Guard, T)> {
    let log_file =
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log_file));
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {name} ({cmd:?})"))?;
    let stdout = child.stdout.take();
    let mut guard = Guard {
        name: name.to_string(),
        child,
    };
    let Some(stdout) = stdout else {
        bail!("{name}: no stdout pipe");
    };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !sent {
                if let Some(v) = ready(&line) {
                    let _ = tx.send(v);
                    sent = true;
                }
            }
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(v) => Ok((guard, v)),
        Err(_) => {
            let status = guard.exited();
            bail!(
                "{name} did not become ready within {timeout:?} (exit status: {status:?}); see {}",
                log.display()
            )
        }
    }
}

/// A loopback port free now: the OS picks it, and the process the caller starts
/// binds it a moment later (a race lost to another process shows as that process
/// failing to start).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// [`free_port`] as the loopback address a process is told to listen on.
pub fn free_addr() -> Result<SocketAddr> {
    Ok(SocketAddr::from(([127, 0, 0, 1], free_port()?)))
}
