//! The `llm-collector` binary: parse flags, then run forever or once.
//!
//! Exit status: 0 on a clean shutdown or a `--once` every push URL accepted; 1 when a
//! `--once` push failed or the collector could not run; 2 for bad flags.

use clap::Parser;
use llm_collector::cli::Args;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = llm_collector::logging::init(args.log_format, args.log_filter.as_deref()) {
        eprintln!("llm-collector: error: {e:#}");
        return ExitCode::from(2);
    }
    let config = match args.into_config() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("invalid flags: {e:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        if config.once {
            match llm_collector::run::run_once(config).await {
                Ok(result) => {
                    println!(
                        "{}",
                        String::from_utf8_lossy(&llm_collector::snapshot::body(&result.snapshot))
                    );
                    let failures = result.failures();
                    if failures.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        tracing::error!(
                            failed = failures.len(),
                            of = result.pushes.len(),
                            "--once: push not accepted: {}",
                            failures.join("; ")
                        );
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    tracing::error!("--once: {e:#}");
                    ExitCode::FAILURE
                }
            }
        } else {
            match llm_collector::run::run(config).await {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!("{e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    })
}
