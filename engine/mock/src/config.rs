//! Command-line configuration.
//!
//! The defaults mirror a small but realistic engine: a few thousand KV blocks, prefill cost that
//! dominates for long uncached prompts, and instant decode so tests stay fast unless they opt in
//! to slowness.

use clap::{Parser, ValueEnum};
use engine_model::engine::EngineSpec;
use engine_model::latency::non_negative;

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
    about = "A vLLM/SGLang engine mock for routing tests",
    after_help = KV_EVENTS_HELP
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
    #[arg(long = "output-tokens", default_value_t = EngineSpec::DEFAULT_OUTPUT_TOKENS)]
    pub output_tokens: u32,

    /// Maximum concurrently running requests; 0 means unlimited. Extra requests wait FIFO.
    #[arg(long = "max-running", default_value_t = 0)]
    pub max_running: usize,

    /// Serve a request whose cached prefix another request is still prefilling
    /// as if that prefix were computed. By default it waits for that prefill, as
    /// SGLang does (vLLM computes it in the same forward pass, which takes as
    /// long); with this flag the prefix counts as computed from when it was
    /// inserted, a free first token no engine gives.
    #[arg(long = "no-prefix-wait", action = clap::ArgAction::SetFalse)]
    pub prefix_wait: bool,

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

    /// Publish KV cache events as vLLM 0.34 does with `--kv-events-config
    /// '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": ...}'`: a
    /// ZMQ PUB socket bound at tcp://HOST:PORT (`*` for every interface, port 0 for a
    /// free one; the bound endpoint is printed in the `listening` line as
    /// `kv-events ENDPOINT`). Needs --block-chars to be a multiple of 4.
    #[arg(long = "kv-events-endpoint", value_name = "tcp://HOST:PORT")]
    pub kv_events_endpoint: Option<String>,

    /// vLLM's `replay_endpoint`: a ZMQ ROUTER socket bound at tcp://HOST:PORT that
    /// answers `["", start_seq]` with every kept batch from `start_seq` on, then
    /// the end marker (seq -1); printed as `kv-events-replay ENDPOINT`.
    #[arg(
        long = "kv-events-replay-endpoint",
        value_name = "tcp://HOST:PORT",
        requires = "kv_events_endpoint"
    )]
    pub kv_events_replay_endpoint: Option<String>,

    /// vLLM's `topic`: the first frame of every KV events message.
    #[arg(long = "kv-events-topic", default_value = "")]
    pub kv_events_topic: String,

    /// vLLM's `buffer_steps`: how many of the last batches the replay socket keeps.
    #[arg(long = "kv-events-buffer-steps", default_value_t = 10_000)]
    pub kv_events_buffer_steps: usize,

    /// Read prompts with a model's tokenizer, as vLLM does: a model directory
    /// (`tokenizer.json`, and `tokenizer_config.json` for the chat template and
    /// special tokens) or a `tokenizer.json`. Chats are rendered by the template and
    /// encoded without special tokens, completions encoded with them; the cache's
    /// blocks are then blocks of the model's tokens (16 a 64-character block) and
    /// the KV events carry its ids. Without it: the mock's own 4-character tokens.
    #[arg(long, value_name = "PATH")]
    pub tokenizer: Option<std::path::PathBuf>,

    /// With --tokenizer: a chat template file replacing the tokenizer config's.
    #[arg(long, value_name = "FILE", requires = "tokenizer")]
    pub chat_template: Option<std::path::PathBuf>,
}

/// The end of `--help`: what `--kv-events-endpoint` publishes.
const KV_EVENTS_HELP: &str = "\
KV cache events (--kv-events-endpoint): the prefix cache's changes, published as vLLM 0.34
publishes them (msgpack, frames [topic, seq, payload], seq dense from 0), one batch per
request that changed the cache: BlockRemoved for each block the LRU evicted, then one
BlockStored per run of newly cached blocks (block_size 16 with 64-char blocks, medium GPU,
group_idx 0). POST /admin/reset_prefix_cache empties the cache and publishes
AllBlocksCleared. Token ids are the mock tokenizer's: the flattened prompt cut into 4-char
chunks, each chunk's id the first 4 bytes of SHA-256 of its UTF-8, big-endian, below 2^31;
block hashes are vLLM's sha256_cbor chain over them (none hash of \"vllm-none-hash\"), as
the digest's last 8 bytes. Both metrics styles publish these vLLM-format events.";

/// Upper bound on output tokens per request: keeps responses small and tests quick.
pub const MAX_OUTPUT_TOKENS: u32 = 64;

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
        assert_eq!(c.kv_events_endpoint, None);
        assert_eq!(c.kv_events_replay_endpoint, None);
        assert_eq!(c.kv_events_topic, "");
        assert_eq!(c.kv_events_buffer_steps, 10_000);
    }

    #[test]
    fn kv_events_flags() {
        let c = Config::parse_from([
            "engine-mock",
            "--kv-events-endpoint",
            "tcp://*:5557",
            "--kv-events-replay-endpoint",
            "tcp://*:5558",
        ]);
        assert_eq!(c.kv_events_endpoint.as_deref(), Some("tcp://*:5557"));
        assert_eq!(c.kv_events_replay_endpoint.as_deref(), Some("tcp://*:5558"));
        assert!(
            Config::try_parse_from(["engine-mock", "--kv-events-replay-endpoint", "tcp://*:1"])
                .is_err(),
            "replay needs a publisher"
        );
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
