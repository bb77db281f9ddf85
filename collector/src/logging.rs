//! Structured logs on stderr via `tracing`: RFC 3339 UTC timestamps, levels, fields,
//! as text lines or JSON lines (`--log-format json`, one object per line with
//! `timestamp`, `level`, `message` and the event's fields at the top level).
//!
//! stdout stays reserved for `--once`'s snapshot, so scripts can pipe it to `jq`.

use anyhow::Context as _;
use std::io::IsTerminal as _;
use tracing_subscriber::EnvFilter;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The filter: `--log-filter`, else `RUST_LOG`, else `info`. A malformed filter is
/// an error naming where it came from, not a silently ignored setting.
pub fn filter(flag: Option<&str>) -> anyhow::Result<EnvFilter> {
    match flag {
        Some(f) => EnvFilter::try_new(f).with_context(|| format!("--log-filter {f}: not a filter")),
        None => match std::env::var("RUST_LOG") {
            Ok(f) if !f.trim().is_empty() => {
                EnvFilter::try_new(&f).with_context(|| format!("RUST_LOG={f}: not a filter"))
            }
            _ => Ok(EnvFilter::new("info")),
        },
    }
}

/// Installs the global subscriber.
pub fn init(format: LogFormat, filter_flag: Option<&str>) -> anyhow::Result<()> {
    let filter = filter(filter_flag)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false);
    let installed = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .try_init(),
    };
    installed.map_err(|e| anyhow::anyhow!("installing the logger: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters() {
        assert!(filter(Some("debug")).is_ok());
        assert!(filter(Some("llm_collector=debug,info")).is_ok());
        let e = filter(Some("=[")).unwrap_err().to_string();
        assert!(e.contains("--log-filter"), "{e}");
    }
}
