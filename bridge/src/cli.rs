//! The bridge's flags, checked together before anything starts.

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "llm-bridge",
    version,
    about = "Shares one Envoy replica's routing state with its peers over NATS"
)]
// A flag given twice takes its last value (as a supervisor appending overrides expects).
#[command(args_override_self = true)]
#[command(group = clap::ArgGroup::new("auth").required(true).args(["token", "token_file"]))]
pub struct Args {
    /// The filter's replicas endpoint on this replica's loopback listener, e.g.
    /// http://127.0.0.1:9901/llm-router/replicas.
    #[arg(long)]
    pub envoy_url: String,
    /// Bearer token the filter expects (its `stats_token`; prefer --token-file).
    #[arg(long)]
    pub token: Option<String>,
    /// File holding the bearer token (surrounding whitespace is ignored).
    #[arg(long)]
    pub token_file: Option<PathBuf>,
    /// NATS server URL(s), comma-separated.
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    pub nats: String,
    /// This replica's id, unique in the fleet (A-Z a-z 0-9 - _ .).
    #[arg(long)]
    pub replica: String,
    /// Subject prefix, so several fleets can share one bus.
    #[arg(long, default_value = "llm-router")]
    pub subject_prefix: String,
    /// How often the filter is asked for new operations.
    #[arg(long, default_value_t = 50)]
    pub poll_ms: u64,
    /// How often the in-flight counts are published when no operation is.
    #[arg(long, default_value_t = 250)]
    pub load_ms: u64,
    /// Bytes of own batches kept for peers' catch-up.
    #[arg(long, default_value_t = 8 << 20)]
    pub retain_bytes: usize,
    /// How long a catch-up waits for peers' answers.
    #[arg(long, default_value_t = 1000)]
    pub catchup_ms: u64,
    /// Serve /metrics (Prometheus text) and /healthz here.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
}

/// The flags, checked.
#[derive(Debug, Clone)]
pub struct Settings {
    pub envoy_url: String,
    pub token: String,
    pub nats: String,
    pub replica: String,
    pub prefix: String,
    pub poll: Duration,
    pub load: Duration,
    pub retain_bytes: usize,
    pub catchup: Duration,
    pub listen: Option<SocketAddr>,
}

impl Args {
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => t.trim().to_string(),
            (None, Some(p)) => std::fs::read_to_string(p)
                .map_err(|e| anyhow::anyhow!("--token-file {}: {e}", p.display()))?
                .trim()
                .to_string(),
            (None, None) => String::new(),
        };
        anyhow::ensure!(
            !token.is_empty(),
            "the token is empty (--token or --token-file)"
        );
        anyhow::ensure!(
            !self.replica.is_empty()
                && self.replica.len() <= 128
                && self
                    .replica
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)),
            "--replica `{}`: 1 to 128 of A-Z a-z 0-9 - _ .",
            self.replica
        );
        anyhow::ensure!(
            !self.subject_prefix.is_empty() && !self.subject_prefix.contains([' ', '*', '>']),
            "--subject-prefix must be a NATS subject without wildcards"
        );
        let url: hyper::Uri = self
            .envoy_url
            .parse()
            .map_err(|e| anyhow::anyhow!("--envoy-url `{}`: {e}", self.envoy_url))?;
        anyhow::ensure!(
            url.scheme_str() == Some("http") && url.query().is_none(),
            "--envoy-url must be http:// (the loopback listener) and have no query"
        );
        anyhow::ensure!(
            self.poll_ms >= 1 && self.load_ms >= 1,
            "--poll-ms and --load-ms must be >= 1"
        );
        Ok(Settings {
            envoy_url: self.envoy_url.clone(),
            token,
            nats: self.nats.clone(),
            replica: self.replica.clone(),
            prefix: self.subject_prefix.clone(),
            poll: Duration::from_millis(self.poll_ms),
            load: Duration::from_millis(self.load_ms),
            retain_bytes: self.retain_bytes,
            catchup: Duration::from_millis(self.catchup_ms),
            listen: self.listen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(extra: &[&str]) -> anyhow::Result<Settings> {
        let mut argv = vec![
            "llm-bridge",
            "--envoy-url",
            "http://127.0.0.1:1/r",
            "--token",
            "t",
            "--replica",
            "a",
        ];
        argv.extend_from_slice(extra);
        Args::try_parse_from(argv)?.settings()
    }

    #[test]
    fn flags_are_checked() {
        assert_eq!(parse(&[]).unwrap().replica, "a");
        assert!(parse(&["--replica", "a b"])
            .unwrap_err()
            .to_string()
            .contains("--replica"));
        assert!(parse(&["--envoy-url", "https://x/r"])
            .unwrap_err()
            .to_string()
            .contains("http://"));
        assert!(parse(&["--envoy-url", "http://x/r?after=1"]).is_err());
        assert!(parse(&["--token", " "])
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(parse(&["--subject-prefix", "a.*"]).is_err());
        assert!(parse(&["--poll-ms", "0"]).is_err());
    }
}
