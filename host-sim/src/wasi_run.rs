//! `host-sim wasi-run`: runs a WASI preview1 *command* module (one exporting `_start`),
//! such as the libtest binaries `cargo test --target wasm32-wasip1` builds, on host-sim's
//! wasmtime. Cargo uses it as the target runner (see `.cargo/config.toml` and
//! `host-sim/wasi-runner.sh`).
//!
//! Only what libtest and std need is real: args (passed through), environ (the host's
//! `RUST_*` variables, so `RUST_TEST_THREADS`, `RUST_BACKTRACE` work), `fd_write` to the
//! real stdout/stderr, the real clocks, `random_get`, `proc_exit`, `fd_fdstat_get`,
//! `sched_yield`, and `poll_oneoff` for clock subscriptions (`thread::sleep`). Every other
//! preview1 import answers ENOSYS (52). There is no filesystem. Imports of other
//! modules (e.g. `env.proxy_*` of a proxy-wasm filter's test binary) are linked as
//! functions that trap when called.
//!
//! The exit code is the module's: `proc_exit(n)` gives `n`, returning from `_start`
//! gives 0, a trap (a panic under `panic=abort`, i.e. a failing test) gives 101 after
//! printing the trap.

use std::collections::HashSet;
use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context as _, Result};
use wasmtime::{Caller, Engine, ExternType, Linker, Memory, Module, Store, Val, ValType};

const MODULE: &str = "wasi_snapshot_preview1";

const SUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EFAULT: i32 = 21;
const EINVAL: i32 = 28;
const ENOSYS: i32 = 52;
const ENOTSUP: i32 = 58;

/// Exit code for a trapped module (what a panicking native test binary returns).
const TRAP_EXIT: i32 = 101;

struct Ctx {
    args: Vec<Vec<u8>>,
    env: Vec<Vec<u8>>,
    exit_code: Option<i32>,
    start: Instant,
    rng: u64,
}

type C<'a> = Caller<'a, Ctx>;
type WResult<T> = wasmtime::Result<T>;

fn memory(c: &mut C) -> WResult<Memory> {
    match c.get_export("memory").and_then(|e| e.into_memory()) {
        Some(m) => Ok(m),
        None => wasmtime::bail!("the module exports no `memory`"),
    }
}

/// Bounds-checked access to `len` bytes at `ptr`; `None` when out of bounds.
fn range(mem: &[u8], ptr: i32, len: usize) -> Option<std::ops::Range<usize>> {
    let start = ptr as u32 as usize;
    let end = start.checked_add(len)?;
    (end <= mem.len()).then_some(start..end)
}

fn write_bytes(c: &mut C, ptr: i32, bytes: &[u8]) -> WResult<bool> {
    let mem = memory(c)?;
    let data = mem.data_mut(&mut *c);
    match range(data, ptr, bytes.len()) {
        Some(r) => {
            data[r].copy_from_slice(bytes);
            Ok(true)
        }
        None => Ok(false),
    }
}

fn read_bytes(c: &mut C, ptr: i32, len: usize) -> WResult<Option<Vec<u8>>> {
    let mem = memory(c)?;
    let data = mem.data(&*c);
    Ok(range(data, ptr, len).map(|r| data[r].to_vec()))
}

fn errno(ok: bool) -> i32 {
    if ok {
        SUCCESS
    } else {
        EFAULT
    }
}

/// `*_sizes_get`: the count and the total size of NUL-terminated strings.
fn sizes(c: &mut C, list: fn(&Ctx) -> &[Vec<u8>], count_ptr: i32, size_ptr: i32) -> WResult<i32> {
    let items = list(c.data());
    let count = items.len() as u32;
    let size: usize = items.iter().map(|a| a.len() + 1).sum();
    let ok = write_bytes(c, count_ptr, &count.to_le_bytes())?
        && write_bytes(c, size_ptr, &(size as u32).to_le_bytes())?;
    Ok(errno(ok))
}

/// `args_get` / `environ_get`: pointers into `buf_ptr`, each string NUL-terminated.
fn strings(c: &mut C, list: fn(&Ctx) -> &[Vec<u8>], ptrs: i32, buf_ptr: i32) -> WResult<i32> {
    let items: Vec<Vec<u8>> = list(c.data()).to_vec();
    let mut offset = buf_ptr as u32;
    for (i, item) in items.iter().enumerate() {
        let slot = (ptrs as u32).wrapping_add(4 * i as u32) as i32;
        if !write_bytes(c, slot, &offset.to_le_bytes())? {
            return Ok(EFAULT);
        }
        let mut s = item.clone();
        s.push(0);
        if !write_bytes(c, offset as i32, &s)? {
            return Ok(EFAULT);
        }
        offset = offset.wrapping_add(s.len() as u32);
    }
    Ok(SUCCESS)
}

fn now_ns(c: &C, id: i32) -> Option<u64> {
    match id {
        0 => Some(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64,
        ),
        // Monotonic; process and thread CPU time approximated by it.
        1..=3 => Some(c.data().start.elapsed().as_nanos() as u64 + 1),
        _ => None,
    }
}

fn next_random(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `poll_oneoff` for clock subscriptions only: sleeps until the earliest deadline and
/// reports every subscription due then.
fn poll_oneoff(c: &mut C, input: i32, output: i32, n: i32, nevents_ptr: i32) -> WResult<i32> {
    const SUB: usize = 48;
    const EVENT: usize = 32;
    let n = n.max(0) as usize;
    if n == 0 {
        return Ok(EINVAL);
    }
    let Some(subs) = read_bytes(c, input, n * SUB)? else {
        return Ok(EFAULT);
    };
    let mut deadlines = Vec::with_capacity(n);
    for i in 0..n {
        let s = &subs[i * SUB..(i + 1) * SUB];
        let userdata = u64_at(s, 0);
        if s[8] != 0 {
            // fd_read / fd_write subscriptions: no such thing without files.
            return Ok(ENOTSUP);
        }
        let clock = i32::from_le_bytes(s[16..20].try_into().expect("4 bytes"));
        let timeout = u64_at(s, 24);
        let absolute = u16::from_le_bytes([s[40], s[41]]) & 1 == 1;
        let Some(now) = now_ns(c, clock) else {
            return Ok(EINVAL);
        };
        let wait = if absolute {
            timeout.saturating_sub(now)
        } else {
            timeout
        };
        deadlines.push((wait, userdata));
    }
    let min = deadlines.iter().map(|d| d.0).min().unwrap_or(0);
    std::thread::sleep(Duration::from_nanos(min));
    let mut events = Vec::new();
    for (wait, userdata) in deadlines.iter().filter(|d| d.0 == min) {
        let _ = wait;
        let mut e = [0u8; EVENT];
        e[0..8].copy_from_slice(&userdata.to_le_bytes());
        // error 0, type 0 (clock).
        events.extend_from_slice(&e);
    }
    let count = (events.len() / EVENT) as u32;
    let ok = write_bytes(c, output, &events)? && write_bytes(c, nevents_ptr, &count.to_le_bytes())?;
    Ok(errno(ok))
}

fn define(linker: &mut Linker<Ctx>, names: &mut HashSet<&'static str>) -> WResult<()> {
    let mut add = |name: &'static str| {
        names.insert(name);
        name
    };
    linker.func_wrap(MODULE, add("args_sizes_get"), |mut c: C, a: i32, b: i32| {
        sizes(&mut c, |x| &x.args, a, b)
    })?;
    linker.func_wrap(MODULE, add("args_get"), |mut c: C, a: i32, b: i32| {
        strings(&mut c, |x| &x.args, a, b)
    })?;
    linker.func_wrap(
        MODULE,
        add("environ_sizes_get"),
        |mut c: C, a: i32, b: i32| sizes(&mut c, |x| &x.env, a, b),
    )?;
    linker.func_wrap(MODULE, add("environ_get"), |mut c: C, a: i32, b: i32| {
        strings(&mut c, |x| &x.env, a, b)
    })?;
    linker.func_wrap(
        MODULE,
        add("fd_write"),
        |mut c: C, fd: i32, iovs: i32, iovs_len: i32, written: i32| -> WResult<i32> {
            if fd != 1 && fd != 2 {
                return Ok(EBADF);
            }
            let mut data = Vec::new();
            for i in 0..iovs_len.max(0) {
                let at = (iovs as u32).wrapping_add(8 * i as u32) as i32;
                let Some(iov) = read_bytes(&mut c, at, 8)? else {
                    return Ok(EFAULT);
                };
                let ptr = i32::from_le_bytes(iov[0..4].try_into().expect("4 bytes"));
                let len = u32::from_le_bytes(iov[4..8].try_into().expect("4 bytes"));
                let Some(bytes) = read_bytes(&mut c, ptr, len as usize)? else {
                    return Ok(EFAULT);
                };
                data.extend(bytes);
            }
            let io = if fd == 1 {
                let mut out = std::io::stdout().lock();
                out.write_all(&data).and_then(|_| out.flush())
            } else {
                let mut err = std::io::stderr().lock();
                err.write_all(&data).and_then(|_| err.flush())
            };
            if io.is_err() {
                return Ok(EBADF);
            }
            Ok(errno(write_bytes(
                &mut c,
                written,
                &(data.len() as u32).to_le_bytes(),
            )?))
        },
    )?;
    linker.func_wrap(
        MODULE,
        add("fd_fdstat_get"),
        |mut c: C, fd: i32, ptr: i32| -> WResult<i32> {
            if !(0..=2).contains(&fd) {
                return Ok(EBADF);
            }
            // filetype character_device, no flags, all rights.
            let mut stat = [0u8; 24];
            stat[0] = 2;
            stat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
            stat[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
            Ok(errno(write_bytes(&mut c, ptr, &stat)?))
        },
    )?;
    linker.func_wrap(MODULE, add("fd_prestat_get"), |_: C, _: i32, _: i32| {
        Ok(EBADF)
    })?;
    linker.func_wrap(MODULE, add("fd_close"), |_: C, fd: i32| {
        Ok(if (0..=2).contains(&fd) {
            SUCCESS
        } else {
            EBADF
        })
    })?;
    linker.func_wrap(
        MODULE,
        add("clock_time_get"),
        |mut c: C, id: i32, _precision: i64, ptr: i32| -> WResult<i32> {
            match now_ns(&c, id) {
                Some(t) => Ok(errno(write_bytes(&mut c, ptr, &t.to_le_bytes())?)),
                None => Ok(EINVAL),
            }
        },
    )?;
    linker.func_wrap(
        MODULE,
        add("clock_res_get"),
        |mut c: C, id: i32, ptr: i32| -> WResult<i32> {
            if !(0..=3).contains(&id) {
                return Ok(EINVAL);
            }
            Ok(errno(write_bytes(&mut c, ptr, &1u64.to_le_bytes())?))
        },
    )?;
    linker.func_wrap(
        MODULE,
        add("random_get"),
        |mut c: C, ptr: i32, len: i32| -> WResult<i32> {
            let mut buf = vec![0u8; len as u32 as usize];
            for chunk in buf.chunks_mut(8) {
                let r = next_random(&mut c.data_mut().rng).to_le_bytes();
                chunk.copy_from_slice(&r[..chunk.len()]);
            }
            Ok(errno(write_bytes(&mut c, ptr, &buf)?))
        },
    )?;
    linker.func_wrap(
        MODULE,
        add("proc_exit"),
        |mut c: C, code: i32| -> WResult<()> {
            c.data_mut().exit_code = Some(code);
            wasmtime::bail!("proc_exit({code})")
        },
    )?;
    linker.func_wrap(MODULE, add("sched_yield"), |_: C| {
        std::thread::yield_now();
        Ok(SUCCESS)
    })?;
    linker.func_wrap(
        MODULE,
        add("poll_oneoff"),
        |mut c: C, input: i32, output: i32, n: i32, nevents: i32| {
            poll_oneoff(&mut c, input, output, n, nevents)
        },
    )?;
    Ok(())
}

fn werr(e: wasmtime::Error) -> anyhow::Error {
    anyhow!("{e:?}")
}

/// Runs `module` with `args` (the module path is `argv[0]`) and returns its exit code.
pub fn run(module_path: &Path, args: &[String]) -> Result<i32> {
    let bytes =
        std::fs::read(module_path).with_context(|| format!("reading {}", module_path.display()))?;
    let engine = Engine::default();
    let module = Module::from_binary(&engine, &bytes)
        .map_err(werr)
        .with_context(|| format!("compiling {}", module_path.display()))?;
    let mut linker: Linker<Ctx> = Linker::new(&engine);
    let mut implemented = HashSet::new();
    define(&mut linker, &mut implemented).map_err(werr)?;
    for import in module.imports() {
        let ExternType::Func(ty) = import.ty() else {
            bail!(
                "the module imports a non-function {}.{}",
                import.module(),
                import.name()
            );
        };
        if import.module() != MODULE {
            // E.g. the proxy-wasm hostcalls of a filter's test binary: linked so the
            // module instantiates, but a call traps (the core tests make none).
            let what = format!("{}.{}", import.module(), import.name());
            linker
                .func_new(import.module(), import.name(), ty, move |_, _, _| {
                    wasmtime::bail!("wasi-run implements no {what} (only WASI preview1)")
                })
                .map_err(werr)?;
            continue;
        }
        if implemented.contains(import.name()) {
            continue;
        }
        let results: Vec<ValType> = ty.results().collect();
        if !matches!(results.as_slice(), [ValType::I32]) {
            bail!("unsupported WASI import {MODULE}.{}", import.name());
        }
        linker
            .func_new(MODULE, import.name(), ty, |_, _, out: &mut [Val]| {
                out[0] = Val::I32(ENOSYS);
                Ok(())
            })
            .map_err(werr)?;
    }
    let mut argv = vec![module_path.to_string_lossy().into_owned().into_bytes()];
    argv.extend(args.iter().map(|a| a.clone().into_bytes()));
    let env = std::env::vars()
        .filter(|(k, _)| k.starts_with("RUST_"))
        .map(|(k, v)| format!("{k}={v}").into_bytes())
        .collect();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
        ^ u64::from(std::process::id());
    let ctx = Ctx {
        args: argv,
        env,
        exit_code: None,
        start: Instant::now(),
        rng: seed,
    };
    let mut store = Store::new(&engine, ctx);
    let instance = linker
        .instantiate(&mut store, &module)
        .map_err(werr)
        .context("instantiating the module")?;
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(werr)
        .context("the module exports no `_start` (is it a WASI command?)")?;
    let result = start.call(&mut store, ());
    let _ = std::io::stdout().flush();
    match (result, store.data().exit_code) {
        (_, Some(code)) => Ok(code),
        (Ok(()), None) => Ok(0),
        (Err(trap), None) => {
            eprintln!(
                "host-sim wasi-run: {} trapped: {trap:?}\n\
                 (wasm32 panics abort: a libtest binary dies with the first failing test \
                 and its captured panic message; pass `-- --nocapture` to see it)",
                module_path.display()
            );
            Ok(TRAP_EXIT)
        }
    }
}
