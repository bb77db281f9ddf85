//! `llm-collector`: the companion that tells the llm-router filter how loaded each
//! engine is.
//!
//! The filter runs inside Envoy and cannot scrape engines itself (proxy-wasm has no
//! timers that fan out HTTP calls cheaply, and every Envoy worker thread would scrape
//! the same engines). So this process scrapes each engine's Prometheus `/metrics`
//! once per interval, reduces it to a few numbers (queue depth, running requests, KV
//! usage, windowed p90 latencies) and pushes one JSON snapshot to the filter's stats
//! endpoint.
//!
//! One module per concept: [`cli`] (flags), [`membership`] (which engines, from flags
//! or Envoy's admin API), [`scrape`] (HTTP GET with a timeout), [`metrics`] (what we
//! read from the Prometheus text), [`histogram`] (windowed quantiles, pure),
//! [`backoff`] (retry schedule, pure), [`snapshot`] (the pushed JSON), [`push`] (the
//! POST to the filter) and [`run`] (the loop tying them together).

pub mod backoff;
pub mod cli;
pub mod histogram;
pub mod membership;
pub mod metrics;
pub mod push;
pub mod run;
pub mod scrape;
pub mod snapshot;

/// Writes one log line to stderr. stdout is reserved for `--once`'s snapshot, so
/// scripts can pipe it to `jq` without filtering log lines.
#[macro_export]
macro_rules! log {
    ($($arg:tt)*) => {
        eprintln!("llm-collector: {}", format_args!($($arg)*))
    };
}
