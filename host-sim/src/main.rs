//! `host-sim` CLI: run the filter's `.wasm` in host-sim without Envoy.
//!
//! `host-sim run --wasm F --config C --body FILE [--path P]` sends one request and prints the
//! outcome as JSON: whether it went upstream, the decision headers (request headers the
//! filter added, changed or removed), any local response, HTTP calls, logs and metrics.
//!
//! `host-sim check-config C [--wasm F]` loads the filter with plugin configuration C
//! (a file, or inline JSON) and reports whether the filter's own validation accepts
//! it, printing the filter's error (which names the field and the rule) when not.
//!
//! `host-sim replay --workload W [--wasm F] [--config C] [--workers N] [--vms T]
//! [--concurrency C] [--policy P]` replays a workload through the filter against a
//! simulated engine fleet in virtual time and prints `envoy/demo`'s report, whose last
//! line is the same JSON; the flags mean what the demo's do. It exits 3 when any
//! request failed, as `envoy/demo` and `llm-load` do.
//!
//! `host-sim sweep [--seeds N] [--default P] [--policies ...]` runs every policy over N
//! members of `llm-load`'s seeded workload family, each against its own simulated
//! fleet in virtual time, and prints each seed's parameters and every policy's cached
//! ratio and TTFT, then where the default loses to the best of the others.
//!
//! `host-sim wasi-run MODULE.wasm [ARGS...]` runs a WASI preview1 command module (e.g. a
//! libtest binary from `cargo test --target wasm32-wasip1`) and exits with its exit code;
//! it is the cargo runner for that target (`.cargo/config.toml`).

mod cli;

use clap::{Parser, Subcommand};
use cli::{check_config, replay, run, sweep};
use serde_json::Value;
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "host-sim",
    version,
    about = "Run a proxy-wasm filter like Envoy 1.40, without Envoy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Send one request through the filter and print the outcome as JSON.
    Run(run::RunArgs),
    /// Validate a plugin configuration with the filter's own validation.
    CheckConfig(check_config::CheckConfigArgs),
    /// Replay a workload through the filter against a simulated engine fleet, in
    /// virtual time, and print `envoy/demo`'s summary (same last-line JSON).
    Replay(replay::ReplayArgs),
    /// Run every policy over a seeded family of workloads and fleets, in virtual
    /// time, and print where the default loses to the best of the others.
    Sweep(sweep::SweepArgs),
    /// Run a WASI preview1 command module (`_start`), e.g. a wasm32-wasip1 test binary,
    /// passing ARGS through; exits with the module's exit code.
    WasiRun(WasiRunArgs),
}

#[derive(clap::Args)]
struct WasiRunArgs {
    /// The module (.wasm).
    module: PathBuf,
    /// Arguments for the module (its argv[0] is the module path).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Run(args) => run::run(args),
        Command::CheckConfig(args) => check_config::check_config(args),
        Command::Replay(args) => match replay::replay(args) {
            Ok(0) => Ok(Value::Null),
            Ok(failed) => {
                eprintln!("host-sim replay: {failed} requests failed");
                std::process::exit(3);
            }
            Err(e) => Err(e),
        },
        Command::Sweep(args) => sweep::sweep(args).map(|()| Value::Null),
        Command::WasiRun(args) => match host_sim::run_wasi_command(&args.module, &args.args) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("host-sim wasi-run: {e:#}");
                std::process::exit(1);
            }
        },
    };
    match result {
        Ok(Value::Null) => {}
        Ok(value) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&value).unwrap_or_else(|e| e.to_string())
            );
        }
        Err(e) => {
            eprintln!("host-sim: {e:#}");
            std::process::exit(1);
        }
    }
}
