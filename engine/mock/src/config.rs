//! Command-line configuration.
//!
//! The defaults mirror a small but realistic engine: a few thousand KV blocks, prefill cost that
//! dominates for long uncached prompts, and instant decode so tests stay fast unless they opt in
//! to slowness.

use clap::{Parser, ValueEnum};

/// Which engine's metric names `/metrics` should imitate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum MetricsStyle {
    /// `vllm:*` metric names.
    Vllm,
    /// `sglang:*` metric names.
    Sglang,
}

/// The engine's part in prefill/decode disaggregation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Role {
    /// Prefill and decode in one engine.
    Regular,
    /// Computes the prompt and publishes its KV by `bootstrap_room` on the bootstrap server.
    Prefill,
    /// Fetches the room's KV from the prefill engine before generating.
    Decode,
}

/// Command line of `engine-mock`.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "engine-mock",
    version,
    about = "A vLLM/SGLang engine mock for routing tests"
)]
pub struct Config {
    /// Port to listen on; 0 picks a free port (printed on stdout at startup).
    #[arg(long, default_value_t = 0)]
    pub port: u16,

    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,

    /// Identity reported in the `x-engine-worker` header and the `worker` JSON field, so tests
    /// can tell which upstream served a request.
    #[arg(long = "worker-id", default_value = "w0")]
    pub worker_id: String,

    /// Prefix cache capacity in blocks (LRU beyond it).
    #[arg(long = "cache-blocks", default_value_t = 4096)]
    pub cache_blocks: usize,

    /// Characters per cache block (a "page"); only full blocks are cached.
    #[arg(long = "block-chars", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub block_chars: u32,

    /// Simulated prefill time per uncached prompt token, in microseconds.
    #[arg(long = "prefill-us-per-token", default_value_t = 20.0, value_parser = non_negative)]
    pub prefill_us_per_token: f64,

    /// Simulated time between output tokens (TPOT), in milliseconds (changeable via
    /// /admin/latency as `decode_ms_per_token` or `tpot_ms`).
    #[arg(long = "decode-ms-per-token", visible_alias = "tpot-ms", default_value_t = 0.0, value_parser = non_negative)]
    pub decode_ms_per_token: f64,

    /// Output tokens per request unless the request sets max_tokens (capped at 64).
    #[arg(long = "output-tokens", default_value_t = 8)]
    pub output_tokens: u32,

    /// Maximum concurrently running requests; 0 means unlimited. Extra requests wait FIFO.
    #[arg(long = "max-running", default_value_t = 0)]
    pub max_running: usize,

    /// Metric naming scheme of `/metrics`.
    #[arg(long = "metrics-style", value_enum, default_value_t = MetricsStyle::Vllm)]
    pub metrics_style: MetricsStyle,

    /// Extra fixed latency before the first token, in milliseconds (changeable via /admin/latency).
    #[arg(long = "ttft-ms", default_value_t = 0.0, value_parser = non_negative)]
    pub ttft_ms: f64,

    /// Role in prefill/decode disaggregation.
    #[arg(long, value_enum, default_value_t = Role::Regular)]
    pub role: Role,

    /// Prefill role: port of the bootstrap server decode engines fetch KV from; 0 picks a
    /// free one (printed in the `listening` line as `bootstrap HOST:PORT`).
    #[arg(long = "bootstrap-port", default_value_t = 0)]
    pub bootstrap_port: u16,

    /// Decode role: how long to wait for a room's KV before failing the request.
    #[arg(long = "kv-wait-ms", default_value_t = 5000)]
    pub kv_wait_ms: u64,
}

/// Upper bound on output tokens per request: keeps responses small and tests quick.
pub const MAX_OUTPUT_TOKENS: u32 = 64;

fn non_negative(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err("must be a finite number >= 0".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults() {
        let c = Config::parse_from(["engine-mock"]);
        assert_eq!(c.port, 0);
        assert_eq!(c.host, "127.0.0.1");
        assert_eq!(c.worker_id, "w0");
        assert_eq!(c.cache_blocks, 4096);
        assert_eq!(c.block_chars, 64);
        assert_eq!(c.prefill_us_per_token, 20.0);
        assert_eq!(c.output_tokens, 8);
        assert_eq!(c.max_running, 0);
        assert_eq!(c.metrics_style, MetricsStyle::Vllm);
        assert_eq!(c.role, Role::Regular);
        assert_eq!(c.kv_wait_ms, 5000);
    }

    #[test]
    fn parses_flags_and_rejects_bad_values() {
        let c = Config::parse_from([
            "engine-mock",
            "--port",
            "8000",
            "--worker-id",
            "w7",
            "--metrics-style",
            "sglang",
            "--ttft-ms",
            "12.5",
            "--max-running",
            "2",
        ]);
        assert_eq!(c.port, 8000);
        assert_eq!(c.worker_id, "w7");
        assert_eq!(c.metrics_style, MetricsStyle::Sglang);
        assert_eq!(c.ttft_ms, 12.5);
        assert_eq!(c.max_running, 2);
        assert!(Config::try_parse_from(["engine-mock", "--ttft-ms", "-1"]).is_err());
        let c = Config::parse_from(["engine-mock", "--tpot-ms", "40"]);
        assert_eq!(
            c.decode_ms_per_token, 40.0,
            "--tpot-ms names the decode delay"
        );
        assert!(Config::try_parse_from(["engine-mock", "--block-chars", "0"]).is_err());
    }
}
