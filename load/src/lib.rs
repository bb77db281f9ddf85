//! `llm-load`: replays an OpenAI-style workload against a URL (normally Envoy with the
//! cache-aware routing filter in front of several engines) and reports what happened:
//! which worker served each request, how many prompt tokens were served from cache, and
//! latency. It exists so routing changes can be judged by numbers, in the spirit of
//! `vllm bench serve`.
//!
//! Each module holds one concept:
//! - [`workload`]: the JSONL workload format and its parser.
//! - [`generate`]: the deterministic multi-turn chat workload generator.
//! - [`family`]: a seeded family of workloads and fleets, one member a seed (the
//!   policy sweep's, `host-sim sweep`).
//! - [`scheduler`]: dispatch order and concurrency (session ordering, in-flight cap).
//! - [`arrivals`]: Poisson arrival times for `--request-rate`.
//! - [`response`]: turning a response body (JSON or SSE) into usage and worker.
//! - [`client`]: the HTTP side: sends one request, times it, yields a [`record::Record`].
//! - [`record`]: what is kept about one request.
//! - [`stats`]: percentiles and the aggregate summary.
//! - [`report`]: the human report and the machine-readable JSON line.
//! - [`html`]: the run as one HTML page of charts (`--html-out`).
//! - [`cli`]: command-line arguments and the `run` / `generate` entry points.
//! - [`fleet`]: how a simulated fleet's engines and clusters are named, its PD shape.
//! - [`run`]: one run of a policy over a fleet: its plugin config and its report
//!   (`envoy/demo`, `host-sim replay`).
//!
//! The HTTP side ([`cli`], [`client`], the tokio half of [`scheduler`]) is the default
//! feature `net`; without it the crate is I/O-free, for `host-sim replay`.

pub mod arrivals;
#[cfg(feature = "net")]
pub mod cli;
#[cfg(feature = "net")]
pub mod client;
pub mod family;
pub mod fleet;
pub mod generate;
pub mod html;
pub mod record;
pub mod report;
pub mod response;
pub mod run;
pub mod scheduler;
pub mod stats;
pub mod workload;
