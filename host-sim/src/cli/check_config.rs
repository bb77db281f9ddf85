//! `host-sim check-config`: loads the filter with a plugin configuration; the filter's
//! own `on_configure` validation is the judge, and its error names the field and rule.

use super::read_config;
use anyhow::Result;
use host_sim::Host;
use serde_json::{json, Value};
use std::path::PathBuf;

#[derive(clap::Args)]
pub(crate) struct CheckConfigArgs {
    /// Plugin configuration: a file, or inline JSON if it starts with '{'.
    config: String,
    /// The filter's .wasm; defaults to the workspace's built filter.
    #[arg(long)]
    wasm: Option<PathBuf>,
}

/// Loads the filter with the config; the filter's `on_configure` is the judge.
pub(crate) fn check_config(args: CheckConfigArgs) -> Result<Value> {
    let config = read_config(&args.config)?;
    let wasm = args.wasm.unwrap_or_else(host_sim::built_filter_path);
    match Host::builder(&wasm).plugin_config(config).build() {
        Ok(_) => Ok(json!({"valid": true})),
        Err(e) => {
            eprintln!("invalid plugin config ({}):\n{e:#}", wasm.display());
            std::process::exit(2);
        }
    }
}
