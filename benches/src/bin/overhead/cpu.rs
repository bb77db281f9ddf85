//! A process's CPU time, the benchmark's main figure: unlike latency it barely moves
//! when other processes share the cores. It is read in nanoseconds from every
//! thread's `/proc/<pid>/task/<tid>/schedstat` (the scheduler's own account); where
//! the kernel has no schedstat, from `/proc/<pid>/stat` in clock ticks (10 ms each,
//! which over a few thousand requests is a resolution of a few microseconds per
//! request). Of it, the time in user space, from `/proc/<pid>/stat` in ticks: the
//! filter runs there, while the floor's time is largely the kernel's network work,
//! which a filter that makes no system calls leaves as it is.

use anyhow::{bail, Context, Result};
use std::time::Duration;

/// Clock ticks per second of `/proc` times (`getconf CLK_TCK`; 100 on Linux).
pub fn ticks_per_second() -> u64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|t| *t > 0)
        .unwrap_or(100)
}

/// utime and stime of `pid` (all its threads), in clock ticks.
fn cpu_ticks(pid: u32) -> Result<(u64, u64)> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_stat(&stat).with_context(|| format!("{path}: no utime/stime"))
}

/// Fields 14 and 15 of a `stat` line; the command name (field 2) may hold spaces and
/// parentheses, so fields are counted after its last `)`.
fn parse_stat(stat: &str) -> Option<(u64, u64)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some((utime, stime))
}

/// The CPU time of `pid`'s threads, from their schedstat; `None` where the kernel
/// keeps none (or the process is gone).
pub fn schedstat_time(pid: u32) -> Option<Duration> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns = 0u64;
    for task in tasks {
        let stat = std::fs::read_to_string(task.ok()?.path().join("schedstat")).ok()?;
        ns += parse_schedstat(&stat)?;
    }
    Some(Duration::from_nanos(ns))
}

/// The first field of a schedstat line: nanoseconds spent on a CPU.
fn parse_schedstat(stat: &str) -> Option<u64> {
    stat.split_whitespace().next()?.parse().ok()
}

/// What a process spent on the CPU over some span.
#[derive(Debug, Clone, Copy)]
pub struct Spent {
    /// All of it.
    pub cpu: Duration,
    /// Of it, in user space.
    pub user: Duration,
}

/// What `pid` has spent so far: its CPU time from schedstat (else utime + stime),
/// and its utime.
fn spent_so_far(pid: u32, tps: u64) -> Result<Spent> {
    let ticks = |n: u64| Duration::from_micros(n * 1_000_000 / tps.max(1));
    let (utime, stime) = cpu_ticks(pid)?;
    let cpu = schedstat_time(pid).unwrap_or_else(|| ticks(utime + stime));
    Ok(Spent {
        cpu,
        user: ticks(utime),
    })
}

/// What `pid` spent while `f` ran.
pub fn during<T>(pid: u32, tps: u64, f: impl FnOnce() -> Result<T>) -> Result<(T, Spent)> {
    let before = spent_so_far(pid, tps)?;
    let out = f()?;
    let after = spent_so_far(pid, tps)?;
    let (Some(cpu), Some(user)) = (
        after.cpu.checked_sub(before.cpu),
        after.user.checked_sub(before.user),
    ) else {
        bail!("process {pid}: CPU time went backwards (restarted?)");
    };
    Ok((out, Spent { cpu, user }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_and_system_time_are_fields_14_and_15() {
        let line = "42 (envoy (main)) S 1 42 42 0 -1 4194560 100 0 0 0 250 31 0 0 20 0 9";
        assert_eq!(parse_stat(line), Some((250, 31)));
        assert_eq!(parse_stat("42 (x) S 1"), None);
    }

    #[test]
    fn schedstat_time_is_its_first_field() {
        assert_eq!(
            parse_schedstat("326514942 34649747 1015\n"),
            Some(326514942)
        );
        assert_eq!(parse_schedstat(""), None);
    }

    /// A busy child process, measured alone: this test process's own threads (the
    /// other tests) come and go, and a thread that ends drops out of the schedstat sum
    /// while its time stays in the process's utime, so the process's own figures
    /// cannot be compared with each other while other tests run.
    #[test]
    fn a_busy_process_has_cpu_time_and_its_user_time_within_it() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("sh starts");
        let busy = during(child.id(), ticks_per_second(), || {
            std::thread::sleep(Duration::from_millis(200));
            Ok(())
        });
        child.kill().expect("the busy child is killed");
        child.wait().expect("the busy child is reaped");
        let ((), spent) = busy.expect("CPU time");
        assert!(
            spent.cpu > Duration::ZERO,
            "200 ms of a busy loop shows as CPU time: {spent:?}"
        );
        assert!(
            spent.user <= spent.cpu + Duration::from_millis(20),
            "user time is part of CPU time, within a tick or two: {spent:?}"
        );
    }
}
