//! `llm-load`: load tool for the cache-aware LLM router. All logic lives in the
//! `llm_load` library so it can be unit-tested; this only wires up the runtime.

use clap::Parser;
use llm_load::cli::{generate_cmd, run_cmd, Cli, Command};
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match &cli.command {
        Command::Generate(args) => generate_cmd(args).map(|()| 0),
        Command::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(run_cmd(args)))
            .map(|summary| summary.errors),
    };
    match result {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("llm-load: {failed} requests failed");
            ExitCode::from(3)
        }
        Err(e) => {
            eprintln!("llm-load: error: {e:#}");
            ExitCode::from(2)
        }
    }
}
