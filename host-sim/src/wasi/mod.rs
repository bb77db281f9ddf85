//! Layer 4, the `wasi_snapshot_preview1` import module, implemented once for two hosts
//! that differ only in where things come from ([`WasiHost`]):
//!
//! * a filter VM ([`vm`]): what Rust's std needs inside a proxy, as Envoy provides it.
//!   stdout/stderr become log entries, clocks read the host's virtual clock,
//!   `random_get` draws from the VM's seeded generator, there are no args, no
//!   environment, no files, and `poll_oneoff` cannot block (ENOSYS);
//! * `host-sim wasi-run` ([`command`]): a WASI command module such as a wasm32 libtest
//!   binary, with real args (passed through), the host's `RUST_*` variables, the real
//!   stdout/stderr and clocks, and `poll_oneoff` sleeping on clock subscriptions.
//!
//! Both go through the same [`Registry`] (faults apply to a filter VM's WASI calls) and
//! the same memory helper: a broken pointer traps. There is no filesystem: the stdio
//! descriptors 0..=2 exist, every other fd is EBADF, and there are no preopens.

pub(crate) mod command;
mod vm;

use crate::hostcall::{Faultable, Guest, GuestMemory, Registry};
use std::time::Duration;
use wasmtime::{bail, Caller, Linker, Result};

/// The import module Rust's wasm32-wasip1 std links against.
pub(crate) const MODULE: &str = "wasi_snapshot_preview1";

const SUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EINVAL: i32 = 28;
const ENOSYS: i32 = 52;
const ENOTSUP: i32 = 58;
const ESPIPE: i32 = 70;

/// Where a WASI host takes args, output, time and randomness from.
pub(crate) trait WasiHost: GuestMemory + Faultable {
    /// `poll_oneoff` may block the thread until a clock deadline (real time only).
    const SLEEPS: bool;
    /// The module's `argv`, without NULs.
    fn args(&self) -> &[Vec<u8>];
    /// The module's environment, `NAME=value` without NULs.
    fn environ(&self) -> &[Vec<u8>];
    /// Writes to stdout (1) or stderr (2); `false` if the output failed.
    fn output(&mut self, fd: i32, data: &[u8]) -> bool;
    /// Clock `id` (realtime, monotonic, process and thread CPU time) in ns; `None` for
    /// an unknown clock.
    fn clock_ns(&self, id: i32) -> Option<u64>;
    /// Fills `buf` for `random_get`.
    fn fill_random(&mut self, buf: &mut [u8]);
    /// `proc_exit(code)` was called (the call then traps to unwind the guest).
    fn exit(&mut self, code: i32);
    /// `sched_yield`.
    fn yield_now(&mut self) {}
}

fn ok(errno: i32) -> Result<i32> {
    Ok(errno)
}

fn stdio(fd: i32) -> bool {
    (0..=2).contains(&fd)
}

/// Registers the WASI preview1 functions with `linker`; returns their names.
pub(crate) fn add_to_linker<T: WasiHost>(linker: &mut Linker<T>) -> Result<Vec<&'static str>> {
    let mut r = Registry::new(linker, MODULE);
    fd(&mut r)?;
    strings(&mut r)?;
    r.wrap("clock_res_get", |mut c: Caller<T>, id: i32, ptr: i32| {
        if !(0..=3).contains(&id) {
            return ok(EINVAL);
        }
        Guest::new(&mut c).write_u64(ptr, 1)?;
        ok(SUCCESS)
    })?;
    r.wrap(
        "clock_time_get",
        |mut c: Caller<T>, id: i32, _: i64, ptr: i32| {
            let Some(value) = c.data().clock_ns(id) else {
                return ok(EINVAL);
            };
            Guest::new(&mut c).write_u64(ptr, value)?;
            ok(SUCCESS)
        },
    )?;
    r.wrap("random_get", |mut c: Caller<T>, ptr: i32, len: i32| {
        let mut g = Guest::new(&mut c);
        // Checked before allocating a buffer of guest-chosen size.
        g.check(ptr as u32 as usize, len as u32 as usize)?;
        let mut buf = vec![0u8; len as u32 as usize];
        g.state().fill_random(&mut buf);
        g.write(ptr, &buf)?;
        ok(SUCCESS)
    })?;
    r.wrap_plain("proc_exit", |mut c: Caller<T>, code: i32| -> Result<()> {
        c.data_mut().exit(code);
        bail!("guest called proc_exit({code})")
    })?;
    r.wrap("proc_raise", |_: Caller<T>, _: i32| ok(ENOSYS))?;
    r.wrap("sched_yield", |mut c: Caller<T>| {
        c.data_mut().yield_now();
        ok(SUCCESS)
    })?;
    r.wrap(
        "poll_oneoff",
        |mut c: Caller<T>, input: i32, output: i32, n: i32, nevents_ptr: i32| {
            if !T::SLEEPS {
                return ok(ENOSYS);
            }
            poll_oneoff(&mut Guest::new(&mut c), input, output, n, nevents_ptr)
        },
    )?;
    Ok(r.into_names())
}

/// The stdio descriptors: writes to 1 and 2, stdin at end of file, no seeking, no files.
fn fd<T: WasiHost>(r: &mut Registry<T>) -> Result<()> {
    r.wrap(
        "fd_write",
        |mut c: Caller<T>, fd: i32, iovs: i32, iovs_len: i32, written_ptr: i32| {
            let mut g = Guest::new(&mut c);
            if fd != 1 && fd != 2 {
                return ok(EBADF);
            }
            let mut data = Vec::new();
            for i in 0..iovs_len.max(0) {
                let iov = g.read(iovs.wrapping_add(i.wrapping_mul(8)), 8)?;
                let ptr = i32::from_le_bytes([iov[0], iov[1], iov[2], iov[3]]);
                let len = i32::from_le_bytes([iov[4], iov[5], iov[6], iov[7]]);
                data.extend(g.read(ptr, len)?);
            }
            if !g.state().output(fd, &data) {
                return ok(EBADF);
            }
            g.write_u32(written_ptr, data.len() as u32)?;
            ok(SUCCESS)
        },
    )?;
    r.wrap(
        "fd_read",
        |mut c: Caller<T>, fd: i32, _: i32, _: i32, read_ptr: i32| {
            if fd != 0 {
                return ok(EBADF);
            }
            Guest::new(&mut c).write_u32(read_ptr, 0)?;
            ok(SUCCESS)
        },
    )?;
    r.wrap("fd_close", |_: Caller<T>, fd: i32| {
        ok(if stdio(fd) { SUCCESS } else { EBADF })
    })?;
    r.wrap(
        "fd_seek",
        |_: Caller<T>, fd: i32, _: i64, _: i32, _: i32| ok(if stdio(fd) { ESPIPE } else { EBADF }),
    )?;
    r.wrap("fd_fdstat_get", |mut c: Caller<T>, fd: i32, ptr: i32| {
        if !stdio(fd) {
            return ok(EBADF);
        }
        // filetype character_device, no flags, all rights.
        let mut stat = [0u8; 24];
        stat[0] = 2;
        stat[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        stat[16..24].copy_from_slice(&u64::MAX.to_le_bytes());
        Guest::new(&mut c).write(ptr, &stat)?;
        ok(SUCCESS)
    })?;
    r.wrap("fd_fdstat_set_flags", |_: Caller<T>, fd: i32, _: i32| {
        ok(if stdio(fd) { ENOSYS } else { EBADF })
    })?;
    r.wrap("fd_prestat_get", |_: Caller<T>, _: i32, _: i32| ok(EBADF))?;
    r.wrap(
        "fd_prestat_dir_name",
        |_: Caller<T>, _: i32, _: i32, _: i32| ok(EBADF),
    )?;
    Ok(())
}

/// `args_*` and `environ_*`: counts and total size, then the strings, NUL-terminated,
/// with their pointers.
fn strings<T: WasiHost>(r: &mut Registry<T>) -> Result<()> {
    type List<T> = fn(&T) -> &[Vec<u8>];
    let lists: [(&str, &str, List<T>); 2] = [
        ("args_sizes_get", "args_get", |s| s.args()),
        ("environ_sizes_get", "environ_get", |s| s.environ()),
    ];
    for (sizes, get, list) in lists {
        r.wrap(
            sizes,
            move |mut c: Caller<T>, count_ptr: i32, size_ptr: i32| {
                let items = list(c.data());
                let count = items.len() as u32;
                let size: usize = items.iter().map(|a| a.len() + 1).sum();
                let mut g = Guest::new(&mut c);
                g.write_u32(count_ptr, count)?;
                g.write_u32(size_ptr, size as u32)?;
                ok(SUCCESS)
            },
        )?;
        r.wrap(get, move |mut c: Caller<T>, ptrs: i32, buf_ptr: i32| {
            let items = list(c.data()).to_vec();
            let mut g = Guest::new(&mut c);
            let mut offset = buf_ptr as u32;
            for (i, item) in items.iter().enumerate() {
                let slot = (ptrs as u32).wrapping_add(4 * i as u32) as i32;
                g.write_u32(slot, offset)?;
                let mut s = item.clone();
                s.push(0);
                g.write(offset as i32, &s)?;
                offset = offset.wrapping_add(s.len() as u32);
            }
            ok(SUCCESS)
        })?;
    }
    Ok(())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// `poll_oneoff` for clock subscriptions only: sleeps until the earliest deadline and
/// reports every subscription due then.
fn poll_oneoff<T: WasiHost>(
    g: &mut Guest<T>,
    input: i32,
    output: i32,
    n: i32,
    nevents_ptr: i32,
) -> Result<i32> {
    const SUB: usize = 48;
    const EVENT: usize = 32;
    let n = n.max(0) as usize;
    if n == 0 {
        return ok(EINVAL);
    }
    let subs = g.read(input, (n * SUB) as i32)?;
    let mut deadlines = Vec::with_capacity(n);
    for s in subs.chunks_exact(SUB) {
        let userdata = u64_at(s, 0);
        if s[8] != 0 {
            // fd_read / fd_write subscriptions: no such thing without files.
            return ok(ENOTSUP);
        }
        let clock = i32::from_le_bytes(s[16..20].try_into().expect("4 bytes"));
        let timeout = u64_at(s, 24);
        let absolute = u16::from_le_bytes([s[40], s[41]]) & 1 == 1;
        let Some(now) = g.state().clock_ns(clock) else {
            return ok(EINVAL);
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
    for (_, userdata) in deadlines.iter().filter(|d| d.0 == min) {
        let mut e = [0u8; EVENT];
        e[0..8].copy_from_slice(&userdata.to_le_bytes());
        // error 0, type 0 (clock).
        events.extend_from_slice(&e);
    }
    let count = (events.len() / EVENT) as u32;
    g.write(output, &events)?;
    g.write_u32(nevents_ptr, count)?;
    ok(SUCCESS)
}
