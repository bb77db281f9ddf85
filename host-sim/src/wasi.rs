//! The `wasi_snapshot_preview1` import module: just what Rust's std needs on
//! wasm32-wasip1 inside a proxy, as Envoy provides it. stdout/stderr become log entries,
//! clocks read the host's virtual clock, `random_get` draws from the seeded RNG, there are
//! no args, no environment and no files.

use crate::env::Registry;
use crate::memory::Guest;
use crate::state::HostState;
use wasmtime::{bail, Caller, Result};

type C<'a> = Caller<'a, HostState>;

const SUCCESS: i32 = 0;
const EBADF: i32 = 8;
const EINVAL: i32 = 28;
const ENOSYS: i32 = 52;
const ESPIPE: i32 = 70;

fn ok(errno: i32) -> Result<i32> {
    Ok(errno)
}

fn stdio(fd: i32) -> bool {
    (0..=2).contains(&fd)
}

/// Registers the WASI functions.
pub(crate) fn register(r: &mut Registry) -> Result<()> {
    r.wrap(
        "fd_write",
        |mut c: C, fd: i32, iovs: i32, iovs_len: i32, written_ptr: i32| {
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
            g.state().write_stdio(fd, &data);
            g.write_u32(written_ptr, data.len() as u32)?;
            ok(SUCCESS)
        },
    )?;
    r.wrap(
        "fd_read",
        |mut c: C, fd: i32, _: i32, _: i32, read_ptr: i32| {
            if fd != 0 {
                return ok(EBADF);
            }
            Guest::new(&mut c).write_u32(read_ptr, 0)?;
            ok(SUCCESS)
        },
    )?;
    r.wrap("fd_close", |_: C, fd: i32| {
        ok(if stdio(fd) { SUCCESS } else { EBADF })
    })?;
    r.wrap("fd_seek", |_: C, fd: i32, _: i64, _: i32, _: i32| {
        ok(if stdio(fd) { ESPIPE } else { EBADF })
    })?;
    r.wrap("fd_fdstat_get", |mut c: C, fd: i32, ptr: i32| {
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
    r.wrap("fd_fdstat_set_flags", |_: C, fd: i32, _: i32| {
        ok(if stdio(fd) { ENOSYS } else { EBADF })
    })?;
    r.wrap("fd_prestat_get", |_: C, _: i32, _: i32| ok(EBADF))?;
    r.wrap("fd_prestat_dir_name", |_: C, _: i32, _: i32, _: i32| {
        ok(EBADF)
    })?;
    for name in ["environ_sizes_get", "args_sizes_get"] {
        r.wrap(name, |mut c: C, count_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            g.write_u32(count_ptr, 0)?;
            g.write_u32(size_ptr, 0)?;
            ok(SUCCESS)
        })?;
    }
    for name in ["environ_get", "args_get"] {
        r.wrap(name, |_: C, _: i32, _: i32| ok(SUCCESS))?;
    }
    r.wrap("clock_res_get", |mut c: C, id: i32, ptr: i32| {
        if !(0..=3).contains(&id) {
            return ok(EINVAL);
        }
        Guest::new(&mut c).write_u64(ptr, 1)?;
        ok(SUCCESS)
    })?;
    r.wrap("clock_time_get", |mut c: C, id: i32, _: i64, ptr: i32| {
        let mut g = Guest::new(&mut c);
        let (now, start) = {
            let shared = crate::state::lock(&g.state().shared);
            (shared.now_ns, shared.start_ns)
        };
        let value = match id {
            0 => now,
            // Monotonic and CPU clocks: time since the host started, plus one second.
            1..=3 => now.saturating_sub(start).saturating_add(1_000_000_000),
            _ => return ok(EINVAL),
        };
        g.write_u64(ptr, value)?;
        ok(SUCCESS)
    })?;
    r.wrap("random_get", |mut c: C, ptr: i32, len: i32| {
        let mut g = Guest::new(&mut c);
        g.check(ptr as u32 as usize, len as u32 as usize)?;
        let mut buf = vec![0u8; len as u32 as usize];
        g.state().rng.fill(&mut buf);
        g.write(ptr, &buf)?;
        ok(SUCCESS)
    })?;
    r.wrap_plain("proc_exit", |_: C, code: i32| -> Result<()> {
        bail!("guest called proc_exit({code})")
    })?;
    r.wrap("proc_raise", |_: C, _: i32| ok(ENOSYS))?;
    r.wrap("sched_yield", |_: C| ok(SUCCESS))?;
    r.wrap("poll_oneoff", |_: C, _: i32, _: i32, _: i32, _: i32| {
        ok(ENOSYS)
    })?;
    Ok(())
}
