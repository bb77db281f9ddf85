//! The CLI's subcommands, each a thin layer over host-sim's public API: [`run`] (one
//! request, printed as JSON), [`check_config`] (the filter's own validation),
//! [`replay`] (a workload against the simulated fleet, reported as `envoy/demo` does)
//! and [`sweep`] (every policy over a seeded family of workloads and fleets).

pub(crate) mod check_config;
pub(crate) mod replay;
pub(crate) mod run;
pub(crate) mod sweep;

use anyhow::{Context as _, Result};

/// A `--config` value: inline JSON when it starts with '{', else a file to read.
pub(crate) fn read_config(arg: &str) -> Result<Vec<u8>> {
    if arg.trim_start().starts_with('{') {
        Ok(arg.as_bytes().to_vec())
    } else {
        std::fs::read(arg).with_context(|| format!("reading {arg}"))
    }
}
