//! Layer 4, the `env` import module: every proxy-wasm ABI 0.2.1 hostcall, the way Envoy
//! 1.40 answers it, one file per family, each registering its own functions. A bad
//! argument returns a [`Status`] to the guest; a broken pointer traps (the memory helper
//! fails the call). Faults are checked in front of every function by the registry.
//!
//! Families: [`log_time`] (log, clock, ticks), [`buffers`], [`maps`] (header maps),
//! [`properties`], [`shared`] (shared data and queues), [`stream`] (continue, close,
//! local response, effective context, foreign functions), [`http_calls`] (HTTP calls,
//! call status, gRPC), [`metrics`].

mod buffers;
mod http_calls;
mod log_time;
mod maps;
mod metrics;
mod properties;
mod shared;
mod stream;

use crate::hostcall::{Guest, Registry};
use crate::state::HostState;
use crate::types::codes::Status;
use crate::types::pairs::{deserialize_pairs, pairs_to_strings};
use wasmtime::{Caller, Linker, Result};

/// The import module the proxy-wasm SDK links against.
pub(crate) const MODULE: &str = "env";

type C<'a> = Caller<'a, HostState>;

/// Registers every `env.proxy_*` hostcall with `linker`; returns their names.
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> Result<Vec<&'static str>> {
    let mut r = Registry::new(linker, MODULE);
    log_time::register(&mut r)?;
    buffers::register(&mut r)?;
    maps::register(&mut r)?;
    properties::register(&mut r)?;
    shared::register(&mut r)?;
    stream::register(&mut r)?;
    http_calls::register(&mut r)?;
    metrics::register(&mut r)?;
    Ok(r.into_names())
}

fn st(status: Status) -> Result<i32> {
    Ok(status.code())
}

/// Reads a pairs-encoded header list from the guest; `None` when malformed.
fn read_pairs(
    g: &mut Guest<HostState>,
    ptr: i32,
    len: i32,
) -> Result<Option<Vec<(String, String)>>> {
    Ok(deserialize_pairs(&g.read(ptr, len)?).map(pairs_to_strings))
}
