//! What the collector reads from an engine's Prometheus text.
//!
//! vLLM and SGLang name the same ideas differently, and both export one series per
//! label set (model name, data-parallel rank, ...). The router wants one number per
//! engine, so counts and counters are summed over label sets, usage takes the max
//! (the fullest rank is the one that will preempt), and histograms are summed bucket
//! by bucket.
//! The KV cache's capacity is one engine's pool: the largest label set's.

use crate::histogram::Buckets;
use prometheus_parse::{Sample, Scrape, Value};

/// Which engine family produced the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Vllm,
    Sglang,
}

impl Engine {
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Vllm => "vllm",
            Engine::Sglang => "sglang",
        }
    }
}

/// The metric names one engine family uses; the first name present wins.
struct Names {
    engine: Engine,
    waiting: &'static str,
    running: &'static str,
    usage: &'static [&'static str],
    ttft: &'static [&'static str],
    tpot: &'static [&'static str],
    capacity: Capacity,
    /// The counter of prompt tokens processed, cached ones included.
    prompt_tokens: &'static str,
}

/// Where an engine family states its KV cache's size in tokens.
enum Capacity {
    /// An info metric (value 1) whose labels hold the block count and the tokens
    /// per block: vLLM's `vllm:cache_config_info{num_gpu_blocks, block_size}`.
    Blocks {
        info: &'static str,
        blocks: &'static str,
        block_size: &'static str,
    },
    /// A gauge of tokens: SGLang's `sglang:max_total_num_tokens`.
    Tokens(&'static str),
}

const VLLM: Names = Names {
    engine: Engine::Vllm,
    waiting: "vllm:num_requests_waiting",
    running: "vllm:num_requests_running",
    // gpu_cache_usage_perc is the pre-V1 name of the same gauge.
    usage: &["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
    ttft: &["vllm:time_to_first_token_seconds"],
    // inter_token_latency_seconds is V1's name; older engines only have the other.
    tpot: &[
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
    ],
    capacity: Capacity::Blocks {
        info: "vllm:cache_config_info",
        blocks: "num_gpu_blocks",
        block_size: "block_size",
    },
    prompt_tokens: "vllm:prompt_tokens_total",
};

const SGLANG: Names = Names {
    engine: Engine::Sglang,
    waiting: "sglang:num_queue_reqs",
    running: "sglang:num_running_reqs",
    usage: &["sglang:token_usage"],
    ttft: &["sglang:time_to_first_token_seconds"],
    tpot: &[
        "sglang:inter_token_latency_seconds",
        "sglang:time_per_output_token_seconds",
    ],
    capacity: Capacity::Tokens("sglang:max_total_num_tokens"),
    prompt_tokens: "sglang:prompt_tokens_total",
};

/// One scrape, reduced to what routing uses.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineMetrics {
    pub engine: Engine,
    pub num_waiting: f64,
    pub num_running: f64,
    /// 0..=1; `None` when the engine does not export it.
    pub kv_usage: Option<f64>,
    /// Cumulative TTFT buckets summed over label sets; `None` when absent.
    pub ttft: Option<Buckets>,
    pub tpot: Option<Buckets>,
    /// Tokens the KV cache holds at most; `None` when the engine does not say.
    pub kv_capacity_tokens: Option<f64>,
    /// Prompt tokens the engine has processed since it started, cached ones
    /// included, summed over label sets; `None` when the engine does not export it.
    pub prompt_tokens_total: Option<f64>,
}

/// prometheus-parse matches metric names with `\w+`, which does not admit the `:`
/// that vLLM and SGLang put in every name (colons are legal in Prometheus names,
/// reserved for recording rules by convention). The name token of each sample,
/// `# HELP` and `# TYPE` line is escaped before parsing and unescaped after, so the
/// parser still does all the real work (labels, histograms, floats).
const COLON: &str = "__colon__";

fn escape_line(line: &str) -> String {
    let trimmed = line.trim_start();
    if let Some(rest) = trimmed.strip_prefix('#') {
        // "# TYPE name type" / "# HELP name doc": escape the third token only.
        let rest = rest.trim_start();
        for kw in ["HELP", "TYPE"] {
            if let Some(after) = rest.strip_prefix(kw) {
                let after = after.trim_start();
                let end = after.find(char::is_whitespace).unwrap_or(after.len());
                let (name, tail) = after.split_at(end);
                return format!("# {kw} {}{tail}", name.replace(':', COLON));
            }
        }
        return line.to_string();
    }
    let end = trimmed
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(trimmed.len());
    let (name, tail) = trimmed.split_at(end);
    format!("{}{tail}", name.replace(':', COLON))
}

/// Parses Prometheus text exposition format into samples with their real names.
pub fn parse(text: &str) -> Result<Vec<Sample>, String> {
    let lines = text.lines().map(|l| Ok(escape_line(l)));
    let scrape = Scrape::parse(lines).map_err(|e| format!("unparseable metrics: {e}"))?;
    Ok(scrape
        .samples
        .into_iter()
        .map(|mut s| {
            s.metric = s.metric.replace(COLON, ":");
            s
        })
        .collect())
}

fn scalar(v: &Value) -> Option<f64> {
    match v {
        Value::Counter(x) | Value::Gauge(x) | Value::Untyped(x) if x.is_finite() => Some(*x),
        _ => None,
    }
}

/// Sum over every label set of a scalar metric; `None` when it is absent.
fn sum(samples: &[Sample], name: &str) -> Option<f64> {
    let mut values = samples
        .iter()
        .filter(|s| s.metric == name)
        .filter_map(|s| scalar(&s.value));
    let first = values.next()?;
    Some(values.fold(first, |a, b| a + b))
}

/// Max over every label set of the first present metric in `names`.
fn max_of(samples: &[Sample], names: &[&str]) -> Option<f64> {
    names.iter().find_map(|name| {
        samples
            .iter()
            .filter(|s| s.metric == *name)
            .filter_map(|s| scalar(&s.value))
            .reduce(f64::max)
    })
}

/// The KV cache's tokens as `capacity` states them, the largest label set's;
/// `None` when absent or not a positive number.
fn capacity_tokens(samples: &[Sample], capacity: &Capacity) -> Option<f64> {
    let tokens = match *capacity {
        Capacity::Tokens(name) => max_of(samples, &[name])?,
        Capacity::Blocks {
            info,
            blocks,
            block_size,
        } => samples
            .iter()
            .filter(|s| s.metric == info)
            .filter_map(|s| {
                let label = |name: &str| {
                    s.labels
                        .get(name)
                        .and_then(|v| v.trim().parse::<f64>().ok())
                };
                Some(label(blocks)? * label(block_size)?)
            })
            .filter(|t| t.is_finite())
            .reduce(f64::max)?,
    };
    (tokens.is_finite() && tokens > 0.0).then_some(tokens)
}

/// Histogram buckets summed over label sets for the first present metric in
/// `names`. Buckets are matched by bound; a bound missing from one label set simply
/// contributes nothing there, which is what summing the series in PromQL does.
fn histogram(samples: &[Sample], names: &[&str]) -> Option<Buckets> {
    names.iter().find_map(|name| {
        let mut merged: Buckets = Vec::new();
        let mut found = false;
        for s in samples.iter().filter(|s| s.metric == *name) {
            let Value::Histogram(counts) = &s.value else {
                continue;
            };
            found = true;
            for hc in counts {
                if hc.less_than.is_nan() || !hc.count.is_finite() {
                    continue;
                }
                match merged.iter_mut().find(|(b, _)| *b == hc.less_than) {
                    Some((_, c)) => *c += hc.count,
                    None => merged.push((hc.less_than, hc.count)),
                }
            }
        }
        merged.sort_by(|a, b| a.0.total_cmp(&b.0));
        (found && !merged.is_empty()).then_some(merged)
    })
}

/// Reduces one scrape. An endpoint that answers but exports neither family's queue
/// gauges is an error, not an idle engine: it is probably not an engine at all (a
/// wrong port, a sidecar), and calling it idle would attract all the traffic.
pub fn extract(text: &str) -> Result<EngineMetrics, String> {
    let samples = parse(text)?;
    for names in [&VLLM, &SGLANG] {
        let (Some(waiting), Some(running)) =
            (sum(&samples, names.waiting), sum(&samples, names.running))
        else {
            continue;
        };
        return Ok(EngineMetrics {
            engine: names.engine,
            num_waiting: waiting,
            num_running: running,
            kv_usage: max_of(&samples, names.usage).map(|u| u.clamp(0.0, 1.0)),
            ttft: histogram(&samples, names.ttft),
            tpot: histogram(&samples, names.tpot),
            kv_capacity_tokens: capacity_tokens(&samples, &names.capacity),
            prompt_tokens_total: sum(&samples, names.prompt_tokens),
        });
    }
    Err("no vLLM or SGLang queue metrics in /metrics".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape of `engine-mock --metrics-style vllm`'s /metrics (buckets trimmed).
    const VLLM_TEXT: &str = r#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="mock"} 3.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="mock"} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="mock"} 0.42
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="4096"} 1.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.001",model_name="mock"} 0
vllm:time_to_first_token_seconds_bucket{le="0.005",model_name="mock"} 1
vllm:time_to_first_token_seconds_bucket{le="0.25",model_name="mock"} 1
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="mock"} 4
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="mock"} 4
vllm:time_to_first_token_seconds_sum{model_name="mock"} 1.201335301
vllm:time_to_first_token_seconds_count{model_name="mock"} 4
# HELP vllm:time_per_output_token_seconds Histogram of time per output token in seconds.
# TYPE vllm:time_per_output_token_seconds histogram
vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="mock"} 7
vllm:time_per_output_token_seconds_bucket{le="0.025",model_name="mock"} 7
vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="mock"} 7
vllm:time_per_output_token_seconds_sum{model_name="mock"} 4.9342e-5
vllm:time_per_output_token_seconds_count{model_name="mock"} 7
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{model_name="mock"} 3
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{model_name="mock"} 1
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{model_name="mock"} 19
"#;

    /// The shape of `engine-mock --metrics-style sglang`'s /metrics (buckets trimmed).
    const SGLANG_TEXT: &str = r#"# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="mock"} 2.0
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="mock"} 1.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="mock"} 0.25
# HELP sglang:max_total_num_tokens Maximum total number of tokens in the KV cache pool.
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="mock"} 65536.0
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="mock"} 0.0
# HELP sglang:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.001",model_name="mock"} 0
sglang:time_to_first_token_seconds_bucket{le="0.005",model_name="mock"} 1
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="mock"} 1
sglang:time_to_first_token_seconds_sum{model_name="mock"} 0.001342143
sglang:time_to_first_token_seconds_count{model_name="mock"} 1
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="mock"} 12
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{model_name="mock"} 4
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="mock"} 8
"#;

    const INF: f64 = f64::INFINITY;

    #[test]
    fn vllm_mock_shape() {
        let m = extract(VLLM_TEXT).unwrap();
        assert_eq!(m.engine, Engine::Vllm);
        assert_eq!(
            (m.num_waiting, m.num_running, m.kv_usage),
            (3.0, 1.0, Some(0.42))
        );
        assert_eq!(
            m.ttft,
            Some(vec![
                (0.001, 0.0),
                (0.005, 1.0),
                (0.25, 1.0),
                (0.5, 4.0),
                (INF, 4.0)
            ])
        );
        assert_eq!(m.tpot, Some(vec![(0.01, 7.0), (0.025, 7.0), (INF, 7.0)]));
        assert_eq!(m.kv_capacity_tokens, Some(4096.0 * 16.0));
        assert_eq!(m.prompt_tokens_total, Some(19.0));
    }

    #[test]
    fn sglang_mock_shape() {
        let m = extract(SGLANG_TEXT).unwrap();
        assert_eq!(m.engine, Engine::Sglang);
        assert_eq!(
            (m.num_waiting, m.num_running, m.kv_usage),
            (2.0, 1.0, Some(0.25))
        );
        assert_eq!(m.ttft, Some(vec![(0.001, 0.0), (0.005, 1.0), (INF, 1.0)]));
        assert_eq!(m.tpot, None, "the mock exports no SGLang TPOT histogram");
        assert_eq!(m.kv_capacity_tokens, Some(65536.0));
        assert_eq!(
            m.prompt_tokens_total,
            Some(12.0),
            "cached tokens not added again"
        );
    }

    #[test]
    fn capacity_is_one_pools_and_absent_or_odd_is_unknown() {
        let queue = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n";
        let vllm = |info: &str| {
            extract(&format!("{queue}{info}"))
                .unwrap()
                .kv_capacity_tokens
        };
        assert_eq!(
            vllm(
                "vllm:cache_config_info{engine=\"0\",block_size=\"16\",num_gpu_blocks=\"100\"} 1\n\
                 vllm:cache_config_info{engine=\"1\",block_size=\"16\",num_gpu_blocks=\"300\"} 1\n"
            ),
            Some(4800.0),
            "data-parallel engines each have their own pool: the largest"
        );
        assert_eq!(vllm(""), None, "not exported");
        for odd in [
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n",
            "vllm:cache_config_info{block_size=\"16\"} 1\n",
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"0\"} 1\n",
            "vllm:cache_config_info{block_size=\"-16\",num_gpu_blocks=\"8\"} 1\n",
        ] {
            assert_eq!(vllm(odd), None, "{odd}");
        }
        let sglang = "sglang:num_queue_reqs 0\nsglang:num_running_reqs 0\n\
                      sglang:max_total_num_tokens{tp_rank=\"0\"} 1000\n\
                      sglang:max_total_num_tokens{tp_rank=\"1\"} 1000\n";
        assert_eq!(extract(sglang).unwrap().kv_capacity_tokens, Some(1000.0));
    }

    #[test]
    fn prompt_tokens_are_summed_over_label_sets_and_absent_is_unknown() {
        // vLLM V1 with two data-parallel engines, as prometheus_client writes it: a
        // counter per label set, and a `_created` gauge beside it that is no count.
        let vllm = r#"# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 2.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 120345.0
vllm:prompt_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 98211.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7512345678e+09
vllm:prompt_tokens_created{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.7512345679e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 51234.0
vllm:generation_tokens_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 40002.0
"#;
        let m = extract(vllm).unwrap();
        assert_eq!((m.num_waiting, m.num_running), (1.0, 5.0));
        assert_eq!(m.prompt_tokens_total, Some(120345.0 + 98211.0));

        let sglang = r#"# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 0.0
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-7B-Instruct"} 4.0
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{model_name="Qwen/Qwen2.5-7B-Instruct"} 5.0421e+06
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen2.5-7B-Instruct"} 812345.0
"#;
        let m = extract(sglang).unwrap();
        assert_eq!(m.engine, Engine::Sglang);
        assert_eq!(m.prompt_tokens_total, Some(5_042_100.0));

        // Not exported (an older engine, or metrics trimmed): unknown, never 0. The
        // other family's name does not count, nor does an unreadable value.
        for text in [
            "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n",
            "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n\
             sglang:prompt_tokens_total 7\n",
            "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n\
             vllm:prompt_tokens_total NaN\n",
        ] {
            assert_eq!(extract(text).unwrap().prompt_tokens_total, None, "{text}");
        }
        // A fresh engine has counted nothing yet: a known 0.
        let fresh = "sglang:num_queue_reqs 0\nsglang:num_running_reqs 0\n\
                     # TYPE sglang:prompt_tokens_total counter\n\
                     sglang:prompt_tokens_total{model_name=\"m\"} 0\n";
        assert_eq!(extract(fresh).unwrap().prompt_tokens_total, Some(0.0));
        // OpenMetrics names the counter without `_total` in its TYPE line; the
        // sample keeps the suffix and is read all the same.
        let openmetrics = "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n\
                           # TYPE vllm:prompt_tokens counter\n\
                           vllm:prompt_tokens_total{engine=\"0\"} 5\n";
        assert_eq!(extract(openmetrics).unwrap().prompt_tokens_total, Some(5.0));
    }

    #[test]
    fn label_sets_are_summed_and_usage_is_maxed() {
        let text = r#"# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="a",engine="0"} 2
vllm:num_requests_waiting{model_name="a",engine="1"} 5
vllm:num_requests_waiting{model_name="b",engine="0"} 1
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="a",engine="0"} 4
vllm:num_requests_running{model_name="a",engine="1"} 4
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.3
vllm:kv_cache_usage_perc{engine="1"} 0.7
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",engine="0"} 1
vllm:time_to_first_token_seconds_bucket{le="1.0",engine="0"} 2
vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="0"} 2
vllm:time_to_first_token_seconds_bucket{le="0.1",engine="1"} 3
vllm:time_to_first_token_seconds_bucket{le="1.0",engine="1"} 3
vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="1"} 4
"#;
        let m = extract(text).unwrap();
        assert_eq!((m.num_waiting, m.num_running), (8.0, 8.0));
        assert_eq!(m.kv_usage, Some(0.7));
        assert_eq!(m.ttft, Some(vec![(0.1, 4.0), (1.0, 5.0), (INF, 6.0)]));
    }

    #[test]
    fn older_vllm_names() {
        let text = "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting 0\n\
                    # TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n\
                    # TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name=\"m\"} 0.9\n\
                    # TYPE vllm:inter_token_latency_seconds histogram\n\
                    vllm:inter_token_latency_seconds_bucket{le=\"0.05\"} 9\n\
                    vllm:inter_token_latency_seconds_bucket{le=\"+Inf\"} 10\n";
        let m = extract(text).unwrap();
        assert_eq!(m.kv_usage, Some(0.9));
        assert_eq!(m.tpot, Some(vec![(0.05, 9.0), (INF, 10.0)]));
        assert_eq!(m.ttft, None);
    }

    #[test]
    fn not_an_engine_is_an_error() {
        assert!(extract("").is_err());
        assert!(extract("# TYPE up gauge\nup 1\n").is_err());
        assert!(extract("<html>not found</html>").is_err());
        // Waiting alone is not enough to call it an engine.
        assert!(extract("vllm:num_requests_waiting 1\n").is_err());
    }

    #[test]
    fn untyped_and_odd_values() {
        // No TYPE lines (untyped), NaN ignored, usage clamped into 0..=1.
        let text = "vllm:num_requests_waiting 1\nvllm:num_requests_waiting{x=\"y\"} NaN\n\
                    vllm:num_requests_running 0\nvllm:kv_cache_usage_perc 1.2\n";
        let m = extract(text).unwrap();
        assert_eq!(
            (m.num_waiting, m.num_running, m.kv_usage),
            (1.0, 0.0, Some(1.0))
        );
    }

    #[test]
    fn colons_in_label_values_survive_escaping() {
        let text =
            "# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{model_name=\"org:m\"} 4\n\
                    sglang:num_running_reqs{model_name=\"org:m\"} 1\n";
        let s = parse(text).unwrap();
        assert_eq!(s[0].labels.get("model_name"), Some("org:m"));
        assert_eq!(extract(text).unwrap().num_waiting, 4.0);
    }
}
