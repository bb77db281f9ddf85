//! The collector's stats push to the filter, defined once: the collector serializes
//! these types and the filter deserializes them, so a new engine metric is one field
//! here (its unit, source and ceiling beside it), where the collector fills it and
//! where the filter takes it.
//!
//! A push is one JSON object per interval (`Push`) naming every worker the collector
//! knows, reachable or not. What deserializes is in range: every number is checked
//! as it is read against the ceilings below, and a refusal names the field and the
//! rule (serde_json adds where in the body), so the filter stores nothing from a
//! push that breaks one. Fields it does not know are passed over, so a newer
//! collector that sends a new metric feeds an older filter (collectors and filters
//! are upgraded one at a time, in either order); the collector and the filter name
//! every field through these types, so neither can misspell one.
//!
//! Unknown numbers are left out (or `null`): known to be unknown, never zero. The
//! crate needs only serde, so it builds for the filter's wasm32 target as it does
//! natively.

use core::fmt::Display;
use serde::de::Deserializer;
use serde::{Deserialize, Serialize};

/// Ceiling of `num_waiting` and `num_running`: more is a broken or hostile
/// collector, not an engine.
pub const MAX_QUEUE: u64 = 1_000_000;
/// Ceiling of `kv_usage`, a fraction of the KV cache.
pub const MAX_KV_USAGE: f64 = 1.0;
/// Ceiling of `ttft_p90_s`, seconds: a TTFT of 1e300 would flag every worker
/// overloaded.
pub const MAX_TTFT_S: f64 = 3600.0;
/// Ceiling of `tpot_p90_s`, seconds.
pub const MAX_TPOT_S: f64 = 60.0;
/// Ceiling of `kv_capacity_tokens`: 2^40 tokens is thousands of times any GPU's KV
/// cache today.
pub const MAX_KV_CAPACITY_TOKENS: u64 = 1 << 40;
/// Ceiling of `prompt_tokens_total`: 2^53, the largest count exact in an f64 (the
/// engine exports its counter as one) and in a JSON number any reader takes. At a
/// million prompt tokens a second an engine takes 285 years to count that far: more
/// is a broken collector.
pub const MAX_PROMPT_TOKENS_TOTAL: u64 = 1 << 53;

/// One snapshot, the body of a `POST` to the filter's stats path.
///
/// `M` is a `membership` entry: the collector writes `Member`; the filter reads
/// entries with its own worker-config rules, or skips them (`serde::de::IgnoredAny`)
/// when it wants the samples alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(expecting = "a snapshot object with `workers`")]
pub struct Push<M = Member> {
    /// Which pusher sent it (the collector: `llm-collector`), for people reading a
    /// push; the filter does not use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collector: Option<String>,
    /// Increases by one per snapshot built, from 1, so gaps show skipped pushes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The collector's scrape interval, milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_ms: Option<u64>,
    /// One entry per worker. The filter replaces its whole load table with each
    /// push: a worker left out reads as never reported, so the collector lists an
    /// unreachable one as such rather than leaving it out.
    pub workers: Vec<WorkerStats>,
    /// Discovery mode (`workers_from: collector`): the workers the collector knows,
    /// which become the filter's worker list. Absent keeps the current list; a
    /// filter with static workers ignores it, so one document serves both modes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub membership: Option<Vec<M>>,
}

impl<M> Push<M> {
    /// A push of samples alone, as a test or a simulator sends it: no pusher named,
    /// no membership (the filter keeps its worker list).
    pub fn new(workers: Vec<WorkerStats>) -> Self {
        Push {
            collector: None,
            seq: None,
            interval_ms: None,
            workers,
            membership: None,
        }
    }
}

/// One worker's line: who it is, whether the collector could scrape it, and its
/// engine's numbers at the last scrape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(expecting = "a worker object")]
pub struct WorkerStats {
    /// The worker's `name` in the filter's worker list. Left out for a pool host
    /// the collector knows by address only (`target: endpoint` pools).
    #[serde(default, deserialize_with = "field::name")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `host:port`: names the worker when `name` is left out.
    #[serde(default, deserialize_with = "field::address")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// Whether the last scrape answered. `false` carries no numbers: the filter
    /// takes the worker as unknown, never idle. Left out: `true`.
    #[serde(default = "answered", deserialize_with = "field::reachable")]
    pub reachable: bool,
    /// Why an unreachable worker's scrape failed, for people reading the push.
    #[serde(default, deserialize_with = "field::error")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The engine family whose metric names were read: `vllm` or `sglang`.
    #[serde(default, deserialize_with = "field::engine")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Requests queued in the engine, a count (`vllm:num_requests_waiting`,
    /// `sglang:num_queue_reqs`, summed over label sets). Left out: 0.
    #[serde(default, deserialize_with = "field::num_waiting")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_waiting: Option<u64>,
    /// Requests the engine is decoding, a count (`vllm:num_requests_running`,
    /// `sglang:num_running_reqs`, summed over label sets). Left out: 0.
    #[serde(default, deserialize_with = "field::num_running")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub num_running: Option<u64>,
    /// Fraction of the KV cache in use, 0..=1 (`vllm:kv_cache_usage_perc`, before
    /// V1 `vllm:gpu_cache_usage_perc`; `sglang:token_usage`; the fullest rank's).
    #[serde(default, deserialize_with = "field::kv_usage")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_usage: Option<f64>,
    /// 90th percentile time to first token, seconds, over the collector's window
    /// (`vllm:time_to_first_token_seconds`, `sglang:time_to_first_token_seconds`
    /// histograms). Left out when the window saw no request.
    #[serde(default, deserialize_with = "field::ttft_p90_s")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttft_p90_s: Option<f64>,
    /// 90th percentile time per output token, seconds, over the same window
    /// (`vllm:inter_token_latency_seconds` or `vllm:time_per_output_token_seconds`,
    /// the `sglang:` pair likewise).
    #[serde(default, deserialize_with = "field::tpot_p90_s")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpot_p90_s: Option<f64>,
    /// Tokens the engine's KV cache holds at most: vLLM's `vllm:cache_config_info`
    /// labels `num_gpu_blocks` times `block_size`, SGLang's
    /// `sglang:max_total_num_tokens` (the largest label set's: one engine's pool).
    /// What the engine can keep cached, whatever was routed to it.
    #[serde(default, deserialize_with = "field::kv_capacity_tokens")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_capacity_tokens: Option<u64>,
    /// The engine's cumulative prompt tokens, a counter (`vllm:prompt_tokens_total`,
    /// `sglang:prompt_tokens_total`, summed over label sets), cached ones included:
    /// the filter learns chars per token from it against the text it routed.
    #[serde(default, deserialize_with = "field::prompt_tokens_total")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_tokens_total: Option<u64>,
}

fn answered() -> bool {
    true
}

impl WorkerStats {
    /// A worker whose scrape answered, with no number known yet: the caller fills
    /// in what it read.
    pub fn reachable(name: Option<String>, address: Option<String>) -> Self {
        WorkerStats {
            name,
            address,
            reachable: true,
            error: None,
            engine: None,
            num_waiting: None,
            num_running: None,
            kv_usage: None,
            ttft_p90_s: None,
            tpot_p90_s: None,
            kv_capacity_tokens: None,
            prompt_tokens_total: None,
        }
    }

    /// A worker whose scrape failed: `error` says why, and no number is sent.
    pub fn unreachable(name: Option<String>, address: Option<String>, error: String) -> Self {
        WorkerStats {
            reachable: false,
            error: Some(error),
            ..WorkerStats::reachable(name, address)
        }
    }
}

/// A `membership` entry as the collector writes it: the fields of a worker in the
/// plugin config's `workers`, which the filter checks by the same rules.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Member {
    /// The worker's name: a tenant in the filter's trees, a label in its metrics.
    pub name: String,
    /// The Envoy cluster that reaches it; left out, the filter uses `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// `host:port` of the engine.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// `regular` (left out), `prefill` or `decode`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
    /// Models served; empty serves any model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Prefill workers: the port of the engine's bootstrap server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_port: Option<u16>,
    /// Prefill workers: the host decode engines reach the bootstrap server at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap_host: Option<String>,
}

/// Readers of `WorkerStats`' fields that refuse a value naming the field and the
/// rule: serde's own messages ("invalid type: string, expected u64") name neither.
/// One reader per kind of value, kept out of line: the filter reads a push about
/// once a second, so its code size matters more than its speed.
mod field {
    use super::*;

    fn refuse<E: serde::de::Error>(field: &str, rule: &dyn Display) -> E {
        E::custom(format_args!("`{field}` must be {rule}"))
    }

    #[inline(never)]
    fn text<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<Option<String>, D::Error> {
        Option::deserialize(d).map_err(|_: D::Error| refuse(field, &"a string"))
    }

    #[inline(never)]
    fn flag<'de, D: Deserializer<'de>>(d: D, field: &str) -> Result<bool, D::Error> {
        bool::deserialize(d).map_err(|_: D::Error| refuse(field, &"a boolean"))
    }

    /// A count within `0..=max`, or nothing.
    #[inline(never)]
    fn count<'de, D: Deserializer<'de>>(
        d: D,
        field: &str,
        max: u64,
    ) -> Result<Option<u64>, D::Error> {
        match Option::<u64>::deserialize(d) {
            Ok(v) if v.is_none_or(|v| v <= max) => Ok(v),
            _ => Err(refuse(field, &format_args!("an integer within 0..={max}"))),
        }
    }

    /// A number within `0..=max` (which refuses NaN), or nothing.
    #[inline(never)]
    fn number<'de, D: Deserializer<'de>>(
        d: D,
        field: &str,
        max: f64,
    ) -> Result<Option<f64>, D::Error> {
        match Option::<f64>::deserialize(d) {
            Ok(v) if v.is_none_or(|v| (0.0..=max).contains(&v)) => Ok(v),
            _ => Err(refuse(field, &format_args!("a number within 0..={max}"))),
        }
    }

    macro_rules! fields {
        ($($field:ident: $t:ty = $read:ident($($max:expr)?);)*) => {$(
            pub(super) fn $field<'de, D: Deserializer<'de>>(d: D) -> Result<$t, D::Error> {
                $read(d, stringify!($field) $(, $max)?)
            }
        )*};
    }

    fields! {
        name: Option<String> = text();
        address: Option<String> = text();
        reachable: bool = flag();
        error: Option<String> = text();
        engine: Option<String> = text();
        num_waiting: Option<u64> = count(MAX_QUEUE);
        num_running: Option<u64> = count(MAX_QUEUE);
        kv_capacity_tokens: Option<u64> = count(MAX_KV_CAPACITY_TOKENS);
        prompt_tokens_total: Option<u64> = count(MAX_PROMPT_TOKENS_TOTAL);
        kv_usage: Option<f64> = number(MAX_KV_USAGE);
        ttft_p90_s: Option<f64> = number(MAX_TTFT_S);
        tpot_p90_s: Option<f64> = number(MAX_TPOT_S);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::de::IgnoredAny;

    fn parse(body: &str) -> Result<Push, String> {
        serde_json::from_str(body).map_err(|e| e.to_string())
    }

    fn worker(fields: &str) -> Result<WorkerStats, String> {
        let mut push = parse(&format!(r#"{{"workers":[{{"name":"w0"{fields}}}]}}"#))?;
        Ok(push.workers.remove(0))
    }

    #[test]
    fn a_push_round_trips_and_unknown_numbers_stay_out() {
        let push = Push {
            collector: Some("llm-collector".into()),
            seq: Some(7),
            interval_ms: Some(1000),
            workers: vec![
                WorkerStats {
                    engine: Some("vllm".into()),
                    num_waiting: Some(3),
                    kv_usage: Some(0.5),
                    ttft_p90_s: Some(0.8),
                    kv_capacity_tokens: Some(32768),
                    prompt_tokens_total: Some(123456),
                    ..WorkerStats::reachable(Some("w0".into()), None)
                },
                WorkerStats::unreachable(None, Some("10.0.0.1:8000".into()), "refused".into()),
            ],
            membership: Some(vec![Member {
                name: "w0".into(),
                cluster: Some("engine_w0".into()),
                ..Member::default()
            }]),
        };
        let json = serde_json::to_string(&push).unwrap();
        assert_eq!(
            json,
            r#"{"collector":"llm-collector","seq":7,"interval_ms":1000,"workers":[{"name":"w0","reachable":true,"engine":"vllm","num_waiting":3,"kv_usage":0.5,"ttft_p90_s":0.8,"kv_capacity_tokens":32768,"prompt_tokens_total":123456},{"address":"10.0.0.1:8000","reachable":false,"error":"refused"}],"membership":[{"name":"w0","cluster":"engine_w0"}]}"#,
            "absent numbers are left out, not sent as zeros"
        );
        assert_eq!(parse(&json), Ok(push));
        let samples_only: Push = Push::new(vec![]);
        assert_eq!(
            serde_json::to_string(&samples_only).unwrap(),
            r#"{"workers":[]}"#,
            "a push of samples alone sends no membership: the filter keeps its list"
        );
    }

    #[test]
    fn left_out_fields_read_as_unknown_and_reachable() {
        let w = worker("").unwrap();
        assert_eq!(w, WorkerStats::reachable(Some("w0".into()), None));
        let w = worker(r#","num_waiting":null,"kv_usage":null"#).unwrap();
        assert_eq!((w.num_waiting, w.kv_usage), (None, None), "null is unknown");
        let push: Push<IgnoredAny> =
            serde_json::from_str(r#"{"workers":[],"membership":[{"anything":1}]}"#).unwrap();
        assert_eq!(push.membership.map(|m| m.len()), Some(1), "entries skipped");
    }

    #[test]
    fn numbers_are_read_up_to_their_ceiling() {
        // (field, at the ceiling, just over, far over, below zero, wrong type)
        let cases = [
            (
                "num_waiting",
                "1000000",
                "1000001",
                "18446744073709551615",
                "-1",
                "1.5",
            ),
            (
                "num_running",
                "1000000",
                "1000001",
                "18446744073709551615",
                "-1",
                "\"3\"",
            ),
            ("kv_usage", "1", "1.0001", "1e300", "-0.1", "true"),
            ("ttft_p90_s", "3600", "3600.001", "1e400", "-1", "\"x\""),
            ("tpot_p90_s", "60", "60.5", "1e300", "-1e-9", "[]"),
            (
                "kv_capacity_tokens",
                "1099511627776",
                "1099511627777",
                "18446744073709551615",
                "-1",
                "2.5",
            ),
            (
                "prompt_tokens_total",
                "9007199254740992",
                "9007199254740993",
                "18446744073709551615",
                "-1",
                "\"7\"",
            ),
        ];
        for (field, ceiling, over, far, negative, wrong) in cases {
            assert!(
                worker(&format!(r#","{field}":{ceiling}"#)).is_ok(),
                "{field}"
            );
            for v in [over, far, negative, wrong] {
                let e = worker(&format!(r#","{field}":{v}"#)).unwrap_err();
                assert!(
                    e.starts_with(&format!("`{field}` must be ")) && e.contains("within 0..="),
                    "{field} = {v} is refused naming the field and the rule: {e}"
                );
            }
        }
    }

    #[test]
    fn wrong_shapes_are_refused_by_name() {
        let cases = [
            (r#","reachable":"yes""#, "`reachable` must be a boolean"),
            (r#","address":7"#, "`address` must be a string"),
        ];
        for (fields, want) in cases {
            let e = worker(fields).unwrap_err();
            assert!(e.contains(want), "{fields}: {e}");
        }
        let cases = [
            (r#"{"workers":[7]}"#, "a worker object"),
            (r#"{"workers":{}}"#, "a sequence"),
            (r#"{}"#, "missing field `workers`"),
            (r#"[]"#, "a snapshot object with `workers`"),
            (
                r#"{"workers":[],"membership":[{"name":"a","port":1}]}"#,
                "`port`",
            ),
        ];
        for (body, want) in cases {
            let e = parse(body).unwrap_err();
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn fields_a_newer_collector_adds_are_passed_over() {
        let push = parse(
            r#"{"workers":[{"name":"w0","num_waiting":2,"kv_events_cursor":{"a":[1]}}],"schema":2}"#,
        )
        .expect("a push with fields this build does not know is read");
        assert_eq!(
            push.workers[0].num_waiting,
            Some(2),
            "the known fields are kept"
        );
    }
}
