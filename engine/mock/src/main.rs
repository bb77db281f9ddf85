//! The `engine-mock` binary: parse the command line and serve until SIGTERM / SIGINT.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cfg = engine_mock::config::Config::parse();
    engine_mock::server::run(cfg).await
}
