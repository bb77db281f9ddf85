//! Envoy's own instructions per request, counted by valgrind's callgrind: exact and
//! reproducible where CPU time from `/proc` spreads over 20-30 us on a shared machine.
//!
//! Envoy runs under `valgrind --tool=callgrind --instr-atstart=no`, so nothing is
//! counted until `callgrind_control -i on`; the measured requests run between that and
//! `-i off`, and `callgrind_control -d` dumps the count, a file per thread
//! (`callgrind.out.1-01`, `-02`, ...). The count is every user-space instruction of
//! every Envoy thread (V8-compiled guest code, hostcalls, Envoy's own work), not kernel
//! time; the main thread's (`-01`) is also given apart. It does no request's work:
//! its timers (the stats flush over every cluster, the plugin's tick on the main
//! thread's VM) run by the clock, so under valgrind, 50 times slower, a request is
//! charged 50 times its share of them, more for a variant whose run takes longer,
//! and with 256 clusters that moved the floor by 20k-50k from run to run.
//! `envoy::start` runs whatever binary it is given, so Envoy is started through a
//! script that execs valgrind with the real binary; exec keeps the pid, which is how
//! `callgrind_control` finds it.
//!
//! glibc copies and clears blocks of a few KiB and up with `rep movsb` / `rep stosb`,
//! and valgrind counts each byte such an instruction moves as an instruction: a 4 KiB
//! body copied counted 4k, where the CPU moves it in a few hundred cycles, so every
//! byte a variant copied (the batches it shares, above all) weighed as much as a
//! branch. The script sets glibc's thresholds for them out of reach
//! (`GLIBC_TUNABLES`), and the copies run glibc's vector loops, which count about
//! what they cost: the floor counts about 4% fewer instructions with them, and a
//! variant that copies more, more.

use anyhow::{bail, Context, Result};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What callgrind writes at exit; each dump writes `<this>.<n>`.
const OUT_FILE: &str = "callgrind.out";
/// valgrind's gdbserver FIFOs, through which `callgrind_control` talks to it. Under
/// the Envoy's own directory rather than `/tmp`, because Envoy is stopped with SIGKILL
/// and valgrind leaves them behind.
const VGDB_PREFIX: &str = "vgdb";
const INSTALL: &str = "install valgrind (apt-get install valgrind)";
/// glibc's `rep movsb` and `rep stosb` thresholds, out of reach (see the module's doc).
const TUNABLES: &str =
    "glibc.cpu.x86_rep_movsb_threshold=1000000000:glibc.cpu.x86_rep_stosb_threshold=1000000000";

/// Fails with how to install them when valgrind or `callgrind_control` is missing.
pub fn check_tools() -> Result<()> {
    for tool in ["valgrind", "callgrind_control"] {
        match Command::new(tool).arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => bail!("`{tool} --version` failed ({}): {INSTALL}", out.status),
            Err(e) => bail!("{tool} not found ({e}): {INSTALL}"),
        }
    }
    Ok(())
}

/// One Envoy's counter: its script and its files live in `dir`.
pub struct Counter {
    dir: PathBuf,
}

impl Counter {
    /// Writes `dir/envoy-callgrind`, which runs `envoy_bin` under callgrind with the
    /// arguments it is given; pass its [`Counter::launcher`] to `envoy::start` in
    /// place of Envoy.
    /// With `cache_sim`, valgrind simulates the caches too (slower; the same
    /// instructions).
    pub fn new(dir: &Path, envoy_bin: &Path, cache_sim: bool) -> Result<Counter> {
        let counter = Counter {
            dir: dir.to_path_buf(),
        };
        let script = format!(
            "#!/bin/sh\n\
             # Envoy under callgrind, counting nothing until `callgrind_control -i on`.\n\
             # --smc-check=all-non-file: V8 writes and patches code in anonymous memory.\n\
             # No rep movsb/stosb, which valgrind counts a byte at a time (see callgrind.rs).\n\
             GLIBC_TUNABLES={TUNABLES}; export GLIBC_TUNABLES\n\
             exec valgrind --tool=callgrind --instr-atstart=no --smc-check=all-non-file \\\n  \
             --separate-threads=yes{} \\\n  \
             --vgdb-prefix={} --callgrind-out-file={} \\\n  \
             {} \"$@\"\n",
            if cache_sim { " --cache-sim=yes" } else { "" },
            sh_quote(&dir.join(VGDB_PREFIX))?,
            sh_quote(&dir.join(OUT_FILE))?,
            sh_quote(envoy_bin)?,
        );
        let launcher = counter.launcher();
        std::fs::write(&launcher, script)
            .with_context(|| format!("writing {}", launcher.display()))?;
        std::fs::set_permissions(&launcher, std::fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", launcher.display()))?;
        Ok(counter)
    }

    /// The script that starts Envoy under callgrind.
    pub fn launcher(&self) -> PathBuf {
        self.dir.join("envoy-callgrind")
    }

    /// Envoy's (`pid`) instructions while `f` ran.
    pub fn counting<T>(&self, pid: u32, f: impl FnOnce() -> Result<T>) -> Result<(T, Count)> {
        self.control(pid, &["-i", "on"])?;
        let out = f()?;
        self.control(pid, &["-i", "off"])?;
        self.control(pid, &["-d"])?;
        Ok((out, count(dumps(&self.dir)?)?))
    }

    /// Copies the dumps so far to `dir` as `<name>.<k>`.
    pub fn keep(&self, dir: &Path, name: &str) -> Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for (k, (_, file)) in dumps(&self.dir)?.iter().enumerate() {
            let to = dir.join(format!("{name}.{}", k + 1));
            std::fs::copy(file, &to)
                .with_context(|| format!("copying {} to {}", file.display(), to.display()))?;
        }
        Ok(())
    }

    /// `callgrind_control ARGS pid`, which waits for valgrind to carry the command
    /// out. It exits 0 even when it found no such process, so success is its `OK.`.
    fn control(&self, pid: u32, args: &[&str]) -> Result<()> {
        let mut prefix = std::ffi::OsString::from("--vgdb-prefix=");
        prefix.push(self.dir.join(VGDB_PREFIX));
        let out = Command::new("callgrind_control")
            .arg(prefix)
            .args(args)
            .arg(pid.to_string())
            .output()
            .with_context(|| format!("running callgrind_control ({INSTALL})"))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() || !stdout.lines().any(|l| l.trim() == "OK.") {
            bail!(
                "callgrind_control {} {pid} failed ({}): {}{}",
                args.join(" "),
                out.status,
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    }
}

/// The thread valgrind numbers 1: Envoy's main thread.
const MAIN_THREAD: u32 = 1;

/// Envoy's instructions over a count: all its threads', and of them the main
/// thread's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Count {
    pub all: u64,
    pub main: u64,
}

/// What the dumps (`dumps`) count: all of them, and the main thread's.
fn count(files: Vec<(u32, PathBuf)>) -> Result<Count> {
    let (main, rest): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|(thread, _)| *thread == MAIN_THREAD);
    let paths = |files: Vec<(u32, PathBuf)>| files.into_iter().map(|(_, f)| f).collect::<Vec<_>>();
    let main = instructions(&paths(main))?;
    let rest = instructions(&paths(rest))?;
    Ok(Count {
        all: main.saturating_add(rest),
        main,
    })
}

/// The dumps in `dir` (`callgrind.out.<n>-<thread>`, or `callgrind.out.<n>` for a
/// count of all threads in one, taken as thread 0) with their thread, in order. The
/// files without a dump number are left out: callgrind creates them empty at start
/// and fills them only at exit.
fn dumps(dir: &Path) -> Result<Vec<(u32, PathBuf)>> {
    let entries = std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))?;
    let mut numbered = Vec::new();
    for entry in entries {
        let path = entry
            .with_context(|| format!("listing {}", dir.display()))?
            .path();
        let n = path
            .file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.strip_prefix(OUT_FILE)?.strip_prefix('.'))
            .and_then(|n| {
                let (n, thread) = n.split_once('-').unwrap_or((n, "0"));
                Some((n.parse::<u32>().ok()?, thread.parse::<u32>().ok()?))
            });
        if let Some(n) = n {
            numbered.push((n, path));
        }
    }
    if numbered.is_empty() {
        bail!(
            "{} missing after `callgrind_control -d`",
            dir.join(format!("{OUT_FILE}.1")).display()
        );
    }
    numbered.sort();
    Ok(numbered
        .into_iter()
        .map(|((_, thread), path)| (thread, path))
        .collect())
}

/// The sum of the `totals:` of callgrind output files.
fn instructions(files: &[PathBuf]) -> Result<u64> {
    let mut sum = 0u64;
    for file in files {
        let text =
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
        let n = totals(&text).with_context(|| format!("{}: no `totals:` line", file.display()))?;
        sum = sum
            .checked_add(n)
            .with_context(|| format!("{}: totals overflow", file.display()))?;
    }
    Ok(sum)
}

/// The first event count of a callgrind output's `totals:` line; the only event
/// without cache simulation is `Ir`, instructions executed.
fn totals(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("totals:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `path` quoted for `sh`.
fn sh_quote(path: &Path) -> Result<String> {
    let s = path
        .to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))?;
    Ok(format!("'{}'", s.replace('\'', r"'\''")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_demo::fleet::TempDir;

    fn dump(total: &str) -> String {
        format!(
            "# callgrind format\nversion: 1\ncreator: callgrind-3.19.0\npid: 7\n\
             events: Ir\nsummary: {total}\n\nfn=(1) main\n0 12\n\ntotals: {total}\n"
        )
    }

    #[test]
    fn totals_is_the_first_count_of_its_line() {
        assert_eq!(totals(&dump("67682700")), Some(67_682_700));
        assert_eq!(totals("events: Ir Dr\ntotals: 5 9\n"), Some(5));
        assert_eq!(totals("summary: 5\n"), None, "summary alone is not a total");
        assert_eq!(totals("totals: lots\n"), None);
        assert_eq!(
            totals(""),
            None,
            "an empty file (callgrind.out before exit)"
        );
    }

    #[test]
    fn every_dump_counts_and_the_exit_file_does_not() {
        let tmp = TempDir::new("llm-callgrind-test").expect("temp dir");
        std::fs::write(tmp.0.join("callgrind.out"), "").expect("write");
        std::fs::write(tmp.0.join("callgrind.out.1"), dump("1000")).expect("write");
        std::fs::write(tmp.0.join("callgrind.out.2"), dump("234")).expect("write");
        std::fs::write(tmp.0.join("callgrind.outlier"), "").expect("write");
        let files = dumps(&tmp.0).expect("two dumps");
        assert_eq!(files.len(), 2, "{files:?}");
        assert_eq!(
            count(files).expect("both parse"),
            Count { all: 1234, main: 0 },
            "one file for all threads: none of it apart"
        );
    }

    #[test]
    fn each_threads_dump_is_numbered_with_its_thread() {
        let tmp = TempDir::new("llm-callgrind-test").expect("temp dir");
        std::fs::write(tmp.0.join("callgrind.out-01"), "").expect("write");
        std::fs::write(tmp.0.join("callgrind.out.1-02"), dump("700")).expect("write");
        std::fs::write(tmp.0.join("callgrind.out.1-01"), dump("300")).expect("write");
        std::fs::write(tmp.0.join("callgrind.out.1-x"), dump("9")).expect("write");
        let files = dumps(&tmp.0).expect("two dumps");
        let threads: Vec<u32> = files.iter().map(|(t, _)| *t).collect();
        assert_eq!(threads, vec![1, 2], "by dump, then thread: {files:?}");
        assert_eq!(
            count(files).expect("both parse"),
            Count {
                all: 1000,
                main: 300
            }
        );
    }

    #[test]
    fn missing_or_broken_files_are_named() {
        let tmp = TempDir::new("llm-callgrind-test").expect("temp dir");
        let err = dumps(&tmp.0).expect_err("no dump yet");
        assert!(format!("{err:#}").contains("callgrind.out.1"), "{err:#}");

        let missing = tmp.0.join("callgrind.out.9");
        let err = instructions(&[missing]).expect_err("no such file");
        assert!(format!("{err:#}").contains("callgrind.out.9"), "{err:#}");

        let broken = tmp.0.join("callgrind.out.3");
        std::fs::write(&broken, "events: Ir\nsummary: 12\n").expect("write");
        let err = instructions(&[broken]).expect_err("no totals line");
        assert!(
            format!("{err:#}").contains("callgrind.out.3: no `totals:`"),
            "{err:#}"
        );
    }

    #[test]
    fn quoted_paths_survive_quotes() {
        assert_eq!(
            sh_quote(Path::new("/tmp/it's")).expect("utf-8"),
            r"'/tmp/it'\''s'"
        );
    }
}
