//! Metric state and Prometheus text rendering (format 0.0.4).
//!
//! The router scrapes the same names real engines export, so these are named and bucketed like
//! vLLM (`vllm:*`) or SGLang (`sglang:*`). Rendering is a pure function of a [`Snapshot`] so it
//! can be tested without a server.

use crate::config::MetricsStyle;
use std::fmt::Write as _;

/// vLLM's time-to-first-token buckets, in seconds.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's time-per-output-token buckets, in seconds.
pub const TPOT_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// The label every sample carries, as both engines do.
const LABELS: &str = "model_name=\"mock\"";

/// A cumulative Prometheus histogram (the `+Inf` bucket is `count`).
#[derive(Clone, Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Non-cumulative counts per finite bucket.
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending upper bounds, without `+Inf`).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|b| v <= *b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, help, "histogram");
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{}\",{LABELS}}} {cumulative}",
                fmt_f64(*bound)
            );
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\",{LABELS}}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{LABELS}}} {}", fmt_f64(self.sum));
        let _ = writeln!(out, "{name}_count{{{LABELS}}} {}", self.count);
    }
}

/// Metrics that accumulate over the server's life (guarded by one mutex in the server).
#[derive(Clone, Debug)]
pub struct Registry {
    /// Request arrival to first token, queueing included (as vLLM measures it).
    pub ttft: Histogram,
    /// Time between consecutive output tokens.
    pub tpot: Histogram,
    /// Requests that emitted their last token.
    pub request_success: u64,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens: u64,
    /// Output tokens produced.
    pub generation_tokens: u64,
    /// Decode role: rooms whose KV arrived from the prefill engine.
    pub pd_pairs: u64,
    /// Decode role: rooms whose KV never came (the request failed).
    pub pd_kv_failures: u64,
}

impl Default for Registry {
    fn default() -> Self {
        Self {
            ttft: Histogram::new(TTFT_BUCKETS),
            tpot: Histogram::new(TPOT_BUCKETS),
            request_success: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            pd_pairs: 0,
            pd_kv_failures: 0,
        }
    }
}

/// Everything `/metrics` shows, gathered at scrape time.
#[derive(Clone, Debug)]
pub struct Snapshot {
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Requests holding a slot.
    pub running: usize,
    /// Cached blocks / capacity, 0..=1.
    pub kv_usage: f64,
    /// The prefix cache's size: blocks, and tokens a block holds.
    pub cache_blocks: usize,
    pub block_tokens: usize,
    /// Prompt tokens looked up in the prefix cache.
    pub cache_query_tokens: u64,
    /// Tokens found in the prefix cache.
    pub cache_hit_tokens: u64,
    /// The accumulated histograms and counters.
    pub registry: Registry,
}

/// Renders `snap` in the given engine's naming scheme.
pub fn render(style: MetricsStyle, snap: &Snapshot) -> String {
    let mut out = String::with_capacity(4096);
    let r = &snap.registry;
    match style {
        MetricsStyle::Vllm => {
            gauge(
                &mut out,
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                snap.waiting as f64,
            );
            gauge(
                &mut out,
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                snap.running as f64,
            );
            gauge(
                &mut out,
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                snap.kv_usage,
            );
            // An info metric: its labels are the cache's configuration (vLLM's own
            // carries more of them, and no model name).
            header(
                &mut out,
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                "gauge",
            );
            let _ = writeln!(
                out,
                "vllm:cache_config_info{{block_size=\"{}\",enable_prefix_caching=\"True\",num_gpu_blocks=\"{}\"}} 1.0",
                snap.block_tokens, snap.cache_blocks
            );
            r.ttft.render(
                &mut out,
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
            );
            r.tpot.render(
                &mut out,
                "vllm:time_per_output_token_seconds",
                "Histogram of time per output token in seconds.",
            );
            counter(
                &mut out,
                "vllm:prefix_cache_queries_total",
                "Prefix cache queries, in terms of number of queried tokens.",
                snap.cache_query_tokens,
            );
            counter(
                &mut out,
                "vllm:prefix_cache_hits_total",
                "Prefix cache hits, in terms of number of cached tokens.",
                snap.cache_hit_tokens,
            );
            counter(
                &mut out,
                "vllm:request_success_total",
                "Count of successfully processed requests.",
                r.request_success,
            );
            counter(
                &mut out,
                "vllm:prompt_tokens_total",
                "Number of prefill tokens processed.",
                r.prompt_tokens,
            );
            counter(
                &mut out,
                "vllm:generation_tokens_total",
                "Number of generation tokens processed.",
                r.generation_tokens,
            );
        }
        MetricsStyle::Sglang => {
            gauge(
                &mut out,
                "sglang:num_queue_reqs",
                "The number of requests in the waiting queue.",
                snap.waiting as f64,
            );
            gauge(
                &mut out,
                "sglang:num_running_reqs",
                "The number of running requests.",
                snap.running as f64,
            );
            gauge(
                &mut out,
                "sglang:token_usage",
                "The token usage.",
                snap.kv_usage,
            );
            gauge(
                &mut out,
                "sglang:max_total_num_tokens",
                "Maximum total number of tokens in the KV cache pool.",
                (snap.cache_blocks * snap.block_tokens) as f64,
            );
            let hit_rate = if snap.cache_query_tokens == 0 {
                0.0
            } else {
                snap.cache_hit_tokens as f64 / snap.cache_query_tokens as f64
            };
            gauge(
                &mut out,
                "sglang:cache_hit_rate",
                "The prefix cache hit rate.",
                hit_rate,
            );
            r.ttft.render(
                &mut out,
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
            );
            counter(
                &mut out,
                "sglang:prompt_tokens_total",
                "Number of prefill tokens processed.",
                r.prompt_tokens,
            );
            counter(
                &mut out,
                "sglang:cached_tokens_total",
                "Number of cached prompt tokens.",
                snap.cache_hit_tokens,
            );
            counter(
                &mut out,
                "sglang:generation_tokens_total",
                "Number of generation tokens processed.",
                r.generation_tokens,
            );
            counter(
                &mut out,
                "sglang:num_requests_total",
                "Number of requests processed.",
                r.request_success,
            );
        }
    }
    if r.pd_pairs > 0 || r.pd_kv_failures > 0 {
        counter(
            &mut out,
            "engine_mock:pd_pairs_total",
            "Rooms whose KV this decode engine received from a prefill engine.",
            r.pd_pairs,
        );
        counter(
            &mut out,
            "engine_mock:pd_kv_failures_total",
            "Rooms whose KV never arrived.",
            r.pd_kv_failures,
        );
    }
    out
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn gauge(out: &mut String, name: &str, help: &str, v: f64) {
    header(out, name, help, "gauge");
    let _ = writeln!(out, "{name}{{{LABELS}}} {}", fmt_f64(v));
}

fn counter(out: &mut String, name: &str, help: &str, v: u64) {
    header(out, name, help, "counter");
    let _ = writeln!(out, "{name}{{{LABELS}}} {v}");
}

/// Prometheus float text. `Debug` formatting matches Python's `repr` that vLLM/SGLang output goes
/// through (`1.0`, `0.25`, `1e-09`-style exponents only for extreme values), all of which
/// Prometheus parsers accept.
fn fmt_f64(v: f64) -> String {
    if v.is_finite() {
        format!("{v:?}")
    } else if v.is_nan() {
        "NaN".into()
    } else if v > 0.0 {
        "+Inf".into()
    } else {
        "-Inf".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap() -> Snapshot {
        let mut registry = Registry::default();
        registry.ttft.observe(0.003);
        registry.ttft.observe(0.3);
        registry.ttft.observe(5000.0);
        registry.tpot.observe(0.02);
        registry.request_success = 3;
        Snapshot {
            waiting: 1,
            running: 2,
            kv_usage: 0.25,
            cache_blocks: 4096,
            block_tokens: 16,
            cache_query_tokens: 100,
            cache_hit_tokens: 40,
            registry,
        }
    }

    /// Every non-comment line is `name{labels} value` with a parseable value.
    fn check_lines(text: &str) {
        for line in text.lines() {
            if line.starts_with('#') {
                assert!(
                    line.starts_with("# HELP ") || line.starts_with("# TYPE "),
                    "{line}"
                );
                continue;
            }
            let (series, value) = line.rsplit_once(' ').expect(line);
            assert!(series.ends_with('}') && series.contains('{'), "{line}");
            let v = value.replace("+Inf", "inf");
            assert!(v.parse::<f64>().is_ok(), "{line}");
        }
    }

    #[test]
    fn vllm_rendering() {
        let text = render(MetricsStyle::Vllm, &snap());
        check_lines(&text);
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"mock\"} 1.0\n"));
        assert!(text.contains("vllm:num_requests_running{model_name=\"mock\"} 2.0\n"));
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"mock\"} 0.25\n"));
        assert!(text.contains(
            "vllm:cache_config_info{block_size=\"16\",enable_prefix_caching=\"True\",num_gpu_blocks=\"4096\"} 1.0\n"
        ));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{le=\"0.005\",model_name=\"mock\"} 1\n"
        ));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{le=\"2560.0\",model_name=\"mock\"} 2\n"
        ));
        assert!(text.contains(
            "vllm:time_to_first_token_seconds_bucket{le=\"+Inf\",model_name=\"mock\"} 3\n"
        ));
        assert!(text.contains("vllm:time_to_first_token_seconds_count{model_name=\"mock\"} 3\n"));
        assert!(text.contains("vllm:prefix_cache_queries_total{model_name=\"mock\"} 100\n"));
        assert!(text.contains("vllm:prefix_cache_hits_total{model_name=\"mock\"} 40\n"));
        assert!(text.contains("vllm:request_success_total{model_name=\"mock\"} 3\n"));
        assert!(text.contains("# TYPE vllm:time_per_output_token_seconds histogram\n"));
        assert_eq!(
            text.matches("vllm:time_to_first_token_seconds_bucket")
                .count(),
            23
        );
        assert_eq!(
            text.matches("vllm:time_per_output_token_seconds_bucket")
                .count(),
            20
        );
    }

    #[test]
    fn sglang_rendering() {
        let text = render(MetricsStyle::Sglang, &snap());
        check_lines(&text);
        assert!(text.contains("sglang:num_queue_reqs{model_name=\"mock\"} 1.0\n"));
        assert!(text.contains("sglang:num_running_reqs{model_name=\"mock\"} 2.0\n"));
        assert!(text.contains("sglang:token_usage{model_name=\"mock\"} 0.25\n"));
        assert!(text.contains("sglang:max_total_num_tokens{model_name=\"mock\"} 65536.0\n"));
        assert!(text.contains("sglang:cache_hit_rate{model_name=\"mock\"} 0.4\n"));
        assert!(text.contains("# TYPE sglang:time_to_first_token_seconds histogram\n"));
        assert!(!text.contains("vllm:"));
    }

    #[test]
    fn float_formatting() {
        assert_eq!(fmt_f64(0.001), "0.001");
        assert_eq!(fmt_f64(1.0), "1.0");
        assert_eq!(fmt_f64(f64::INFINITY), "+Inf");
        assert_eq!(fmt_f64(2560.0), "2560.0");
        assert!(fmt_f64(1e-9).parse::<f64>().is_ok());
    }
}
