use clap::Parser;
use llm_bridge::cli::Args;
use std::io::IsTerminal;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let settings = match Args::parse().settings() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("llm-bridge: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    tokio::select! {
        r = llm_bridge::run::run(settings) => {
            if let Err(e) = r {
                tracing::error!("{e:#}");
            }
            std::process::ExitCode::FAILURE
        }
        _ = tokio::signal::ctrl_c() => std::process::ExitCode::SUCCESS,
    }
}
