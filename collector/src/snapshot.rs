//! The document pushed to the filter: one `llm_router_push::Push` per interval
//! naming every worker, reachable or not.
//!
//! The filter replaces its whole load table with each push, so every known worker
//! is always listed; an unreachable one says so explicitly rather than being left
//! out (left out reads as "never reported") or reported with zeros (reads as idle).
//!
//! `membership` lists the workers the collector knows (from `--engine` flags or
//! Envoy's clusters), with the fields a configured worker has: a filter in
//! discovery mode (`workers_from: collector`) takes it as its worker list, and a
//! filter with static workers skips it, so the one document serves both.
//!
//! The filter refuses a whole push for one number out of range, so the numbers are
//! cleaned here first: NaN and negatives are left out (unknown) and the rest held to
//! the format's ceilings.

use crate::membership::{Naming, Worker};
use crate::metrics::EngineMetrics;
use bytes::Bytes;
use llm_router_push::{
    Push, WorkerStats, MAX_KV_CAPACITY_TOKENS, MAX_KV_USAGE, MAX_PROMPT_TOKENS_TOTAL, MAX_QUEUE,
    MAX_TPOT_S, MAX_TTFT_S,
};

/// The `collector` field: lets the filter's logs tell which pusher sent what.
pub const COLLECTOR_NAME: &str = "llm-collector";

/// A finite, non-negative number held to `max`, or nothing.
fn clean(v: Option<f64>, max: f64) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0).map(|x| x.min(max))
}

/// Gauges arrive as floats ("3.0"); the filter wants whole counts.
fn count(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        (v.round() as u64).min(MAX_QUEUE)
    } else {
        0
    }
}

/// A token count the filter takes: whole, positive and under its ceiling, or left
/// out (an engine stating an absurd cache is not believed).
fn tokens(v: Option<f64>) -> Option<u64> {
    let v = v.filter(|v| v.is_finite() && *v >= 1.0)?.round();
    (v <= MAX_KV_CAPACITY_TOKENS as f64).then_some(v as u64)
}

/// A counter's total the filter takes: whole, not negative and under its ceiling,
/// or left out. Never held to the ceiling: a counter stuck there would read as an
/// engine that stopped counting. Zero is known (an engine that has served nothing).
fn total(v: Option<f64>) -> Option<u64> {
    let v = v.filter(|v| v.is_finite() && *v >= 0.0)?.round();
    (v <= MAX_PROMPT_TOKENS_TOTAL as f64).then_some(v as u64)
}

/// How the filter finds the worker: by name, or by address for pool hosts.
fn identity(w: &Worker) -> (Option<String>, Option<String>) {
    let name = (w.naming == Naming::Named).then(|| w.name.clone());
    (name, Some(w.address.clone()))
}

/// A scraped worker's line, with the windowed latency quantiles.
pub fn reachable(
    w: &Worker,
    m: &EngineMetrics,
    ttft_p90: Option<f64>,
    tpot_p90: Option<f64>,
) -> WorkerStats {
    let (name, address) = identity(w);
    WorkerStats {
        engine: Some(m.engine.as_str().to_string()),
        num_waiting: Some(count(m.num_waiting)),
        num_running: Some(count(m.num_running)),
        kv_usage: clean(m.kv_usage, MAX_KV_USAGE),
        ttft_p90_s: clean(ttft_p90, MAX_TTFT_S),
        tpot_p90_s: clean(tpot_p90, MAX_TPOT_S),
        kv_capacity_tokens: tokens(m.kv_capacity_tokens),
        prompt_tokens_total: total(m.prompt_tokens_total),
        ..WorkerStats::reachable(name, address)
    }
}

/// A worker whose scrape failed (or has not run): why, and no number.
pub fn unreachable(w: &Worker, error: &str) -> WorkerStats {
    let (name, address) = identity(w);
    WorkerStats::unreachable(name, address, error.to_string())
}

/// The request body (and `--once`'s output).
pub fn body(push: &Push) -> Bytes {
    // Strings, integers and floats only: serde_json cannot fail on them.
    Bytes::from(serde_json::to_vec(push).expect("a push serializes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::Engine;

    fn worker(name: &str, naming: Naming) -> Worker {
        Worker {
            name: name.into(),
            address: "127.0.0.1:8001".into(),
            metrics_url: "http://127.0.0.1:8001/metrics".into(),
            naming,
            cluster: None,
        }
    }

    fn snapshot(workers: Vec<WorkerStats>, membership: &[Worker]) -> Push {
        Push {
            collector: Some(COLLECTOR_NAME.into()),
            seq: Some(7),
            interval_ms: Some(1000),
            workers,
            membership: Some(membership.iter().map(Worker::member).collect()),
        }
    }

    #[test]
    fn contract() {
        let m = EngineMetrics {
            engine: Engine::Vllm,
            num_waiting: 3.0,
            num_running: 5.0,
            kv_usage: Some(0.42),
            ttft: None,
            tpot: None,
            kv_capacity_tokens: Some(65536.0),
            prompt_tokens_total: Some(218556.0),
        };
        let w0 = Worker {
            cluster: Some("engine_w0".into()),
            ..worker("w0", Naming::Named)
        };
        let s = snapshot(
            vec![
                reachable(&w0, &m, Some(0.8), None),
                unreachable(&worker("w1", Naming::Named), "connection refused"),
                reachable(
                    &worker("127.0.0.1:8001", Naming::ByAddress),
                    &m,
                    Some(f64::NAN),
                    Some(-1.0),
                ),
            ],
            &[w0],
        );
        // Compared as JSON values: key order is not part of the contract (and depends
        // on serde_json's `preserve_order`, which the workspace turns on).
        let want: serde_json::Value = serde_json::from_str(
            r#"{"collector":"llm-collector","interval_ms":1000,"seq":7,"workers":[{"address":"127.0.0.1:8001","engine":"vllm","kv_capacity_tokens":65536,"kv_usage":0.42,"name":"w0","num_running":5,"num_waiting":3,"prompt_tokens_total":218556,"reachable":true,"ttft_p90_s":0.8},{"address":"127.0.0.1:8001","error":"connection refused","name":"w1","reachable":false},{"address":"127.0.0.1:8001","engine":"vllm","kv_capacity_tokens":65536,"kv_usage":0.42,"num_running":5,"num_waiting":3,"prompt_tokens_total":218556,"reachable":true}],"membership":[{"name":"w0","cluster":"engine_w0","address":"127.0.0.1:8001"}]}"#,
        )
        .unwrap();
        let got: serde_json::Value = serde_json::from_slice(&body(&s)).unwrap();
        assert_eq!(got, want);
    }

    /// What the collector discovers from Envoy, pushed to a filter of either mode:
    /// the discovery filter takes the membership and the samples that name it; a
    /// static filter reads the samples and skips the membership.
    #[test]
    fn both_filter_modes_take_the_snapshot() {
        use llm_router::background::membership::{parse_membership, update};
        use llm_router::config::Config;
        use llm_router::push::parse_push;
        let clusters = r#"{"cluster_statuses":[
            {"name":"engine_w0","host_statuses":[{"address":{"socket_address":{"address":"127.0.0.1","port_value":8001}}}]},
            {"name":"pool","host_statuses":[{"address":{"socket_address":{"address":"10.0.0.8","port_value":8000}}}]}]}"#;
        let (workers, _) = crate::membership::parse_envoy_clusters(
            clusters.as_bytes(),
            "engine_",
            &["pool".into()],
        )
        .unwrap();
        let s = snapshot(
            workers
                .iter()
                .map(|w| unreachable(w, "not scraped yet"))
                .collect(),
            &workers,
        );
        let body = body(&s);

        let discovery =
            Config::from_json(br#"{"workers_from":"collector","stats_token":"t"}"#).unwrap();
        let pushed = parse_membership(&body).unwrap().expect("membership sent");
        let list = update(&discovery, &[], &pushed, 0).expect("a valid worker list");
        let names: Vec<_> = list
            .iter()
            .map(|w| (w.name.as_str(), w.cluster.as_deref()))
            .collect();
        assert_eq!(names, [("10.0.0.8:8000", None), ("w0", Some("engine_w0"))]);
        let reports = parse_push(&body, 1 << 20, &list, 0).expect("samples name the list");
        assert!(reports.iter().all(Option::is_some), "{reports:?}");

        let fixed = Config::from_json(
            br#"{"workers":[{"name":"w0"},{"name":"p","address":"10.0.0.8:8000"}]}"#,
        )
        .unwrap();
        let reports = parse_push(&body, 1 << 20, &fixed.workers, 0).expect("static filters too");
        assert!(reports.iter().all(Option::is_some), "{reports:?}");
    }

    /// The filter refuses a whole push for one number out of range: whatever an
    /// engine exports, the line the collector writes is one the filter reads.
    #[test]
    fn any_scrape_makes_a_line_the_filter_takes() {
        use llm_router::load::Report;
        let wild = [f64::NAN, f64::INFINITY, -1.0, 1e300, 2.6];
        let w = worker("w0", Naming::Named);
        let config =
            llm_router::config::Config::from_json(br#"{"workers":[{"name":"w0"}]}"#).unwrap();
        for v in wild {
            let m = EngineMetrics {
                engine: Engine::Sglang,
                num_waiting: v,
                num_running: v,
                kv_usage: Some(v),
                ttft: None,
                tpot: None,
                kv_capacity_tokens: Some(v),
                prompt_tokens_total: Some(v),
            };
            let s = snapshot(vec![reachable(&w, &m, Some(v), Some(v))], &[]);
            let reports = llm_router::push::parse_push(&body(&s), 1 << 20, &config.workers, 0)
                .unwrap_or_else(|e| panic!("{v}: {}", e.reason()));
            assert!(
                matches!(reports[0], Some(Report::Sample(_))),
                "{v}: {reports:?}"
            );
        }
    }

    #[test]
    fn capacities_are_whole_tokens_within_the_ceiling() {
        assert_eq!(tokens(Some(65536.0)), Some(65536));
        assert_eq!(tokens(Some(2.6)), Some(3));
        for odd in [
            None,
            Some(0.0),
            Some(0.4),
            Some(-5.0),
            Some(f64::NAN),
            Some(1e300),
        ] {
            assert_eq!(tokens(odd), None, "{odd:?}");
        }
    }

    #[test]
    fn prompt_token_totals_are_whole_counts_within_the_ceiling() {
        assert_eq!(total(Some(218556.0)), Some(218556));
        assert_eq!(total(Some(0.0)), Some(0), "nothing served yet is known");
        assert_eq!(total(Some(2.6)), Some(3));
        let ceiling = MAX_PROMPT_TOKENS_TOTAL as f64;
        assert_eq!(total(Some(ceiling)), Some(MAX_PROMPT_TOKENS_TOTAL));
        for odd in [
            None,
            Some(-5.0),
            Some(f64::NAN),
            Some(f64::INFINITY),
            Some(ceiling * 2.0),
            Some(1e300),
        ] {
            assert_eq!(total(odd), None, "{odd:?}");
        }
    }

    #[test]
    fn counts_are_whole_and_never_negative() {
        assert_eq!(count(2.6), 3);
        assert_eq!(count(-1.0), 0);
        assert_eq!(count(f64::NAN), 0);
        assert_eq!(count(1e300), MAX_QUEUE);
        assert_eq!(clean(Some(f64::INFINITY), MAX_TTFT_S), None);
        assert_eq!(clean(Some(5000.0), MAX_TTFT_S), Some(MAX_TTFT_S));
    }
}
