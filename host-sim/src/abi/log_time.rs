//! Logging, the clock and ticks: `proxy_log` (captured as [`LogEntry`](crate::LogEntry)s
//! of the effective context), `proxy_get_log_level`, the virtual clock, and the tick
//! period that [`Host::advance_time`](crate::Host::advance_time) fires ticks by.

use super::{st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::HostState;
use crate::types::codes::{LogLevel, Status};
use crate::types::values::LogSource;
use wasmtime::Result;

/// Registers the log, clock and tick hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap("proxy_log", |mut c: C, level: i32, ptr: i32, len: i32| {
        let mut g = Guest::new(&mut c);
        let message = g.read_string(ptr, len)?;
        let Some(level) = LogLevel::from_raw(level) else {
            return st(Status::BadArgument);
        };
        g.state().log(level, LogSource::Proxy, message);
        st(Status::Ok)
    })?;
    r.wrap("proxy_get_log_level", |mut c: C, ptr: i32| {
        let mut g = Guest::new(&mut c);
        let level = g.state().cfg.log_level.raw();
        g.write_u32(ptr, level as u32)?;
        st(Status::Ok)
    })?;
    r.wrap(
        "proxy_get_current_time_nanoseconds",
        |mut c: C, ptr: i32| {
            let mut g = Guest::new(&mut c);
            let now = g.state().now_ns();
            g.write_u64(ptr, now)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_set_tick_period_milliseconds",
        |mut c: C, period: i32| {
            let s = c.data_mut();
            s.tick_period_ms = period as u32 as u64;
            let now = s.now_ns();
            let period_ns = s.tick_period_ms * 1_000_000;
            s.next_tick_ns = (period_ns > 0).then(|| now.saturating_add(period_ns));
            st(Status::Ok)
        },
    )?;
    Ok(())
}
