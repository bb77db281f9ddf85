//! The `llm-collector` binary: parse flags, then run forever or once.

use clap::Parser;
use llm_collector::cli::Args;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Args::parse().into_config()?;
    if config.once {
        let snapshot = llm_collector::run::run_once(config).await?;
        println!("{}", snapshot.to_json());
        Ok(())
    } else {
        llm_collector::run::run(config).await
    }
}
