//! The JSON document pushed to the filter: one object per interval naming every
//! worker, reachable or not.
//!
//! The filter replaces its whole load table with each push, so every known worker
//! is always listed; an unreachable one says so explicitly rather than being left
//! out (left out reads as "never reported") or reported with zeros (reads as idle).
//!
//! `membership` lists the workers the collector knows (from `--engine` flags or
//! Envoy's clusters), with the fields a configured worker has: a filter in
//! discovery mode (`workers_from: collector`) takes it as its worker list, and a
//! filter with static workers ignores it (unknown fields of a push are not read), so
//! the one document serves both.

use crate::membership::{Naming, Worker};
use crate::metrics::EngineMetrics;
use serde_json::{json, Map, Value};

/// The `collector` field: lets the filter's logs tell which pusher sent what.
pub const COLLECTOR_NAME: &str = "llm-collector";

#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub collector: &'static str,
    /// Increases by one per snapshot built, from 1, so gaps show skipped pushes.
    pub seq: u64,
    pub interval_ms: u64,
    pub workers: Vec<WorkerReport>,
    /// The known workers, `Worker::member_json` each.
    pub membership: Vec<Value>,
}

/// One worker's line, as the filter reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerReport {
    /// `None` for endpoint-mode pool hosts: the filter then matches `address`.
    pub name: Option<String>,
    pub address: String,
    pub state: WorkerState,
}

#[derive(Debug, Clone, PartialEq)]
pub enum WorkerState {
    Reachable {
        engine: &'static str,
        num_waiting: u64,
        num_running: u64,
        /// Unknown numbers are sent as `null`: known to be unknown.
        kv_usage: Option<f64>,
        ttft_p90_s: Option<f64>,
        tpot_p90_s: Option<f64>,
    },
    /// Nothing is known but why: every number is left out.
    Unreachable { error: String },
}

/// A finite, non-negative number or nothing: the filter refuses NaN, infinities and
/// negatives, and one bad number would make it refuse the whole push.
fn clean(v: Option<f64>) -> Option<f64> {
    v.filter(|x| x.is_finite() && *x >= 0.0)
}

/// Gauges arrive as floats ("3.0"); the filter wants whole counts.
fn count(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
}

impl WorkerReport {
    fn name_of(w: &Worker) -> Option<String> {
        (w.naming == Naming::Named).then(|| w.name.clone())
    }

    pub fn reachable(
        w: &Worker,
        m: &EngineMetrics,
        ttft_p90: Option<f64>,
        tpot_p90: Option<f64>,
    ) -> Self {
        WorkerReport {
            name: Self::name_of(w),
            address: w.address.clone(),
            state: WorkerState::Reachable {
                engine: m.engine.as_str(),
                num_waiting: count(m.num_waiting),
                num_running: count(m.num_running),
                kv_usage: clean(m.kv_usage).map(|u| u.min(1.0)),
                ttft_p90_s: clean(ttft_p90),
                tpot_p90_s: clean(tpot_p90),
            },
        }
    }

    pub fn unreachable(w: &Worker, error: &str) -> Self {
        WorkerReport {
            name: Self::name_of(w),
            address: w.address.clone(),
            state: WorkerState::Unreachable {
                error: error.to_string(),
            },
        }
    }

    pub fn is_reachable(&self) -> bool {
        matches!(self.state, WorkerState::Reachable { .. })
    }

    pub fn to_json(&self) -> Value {
        let mut o = Map::new();
        if let Some(name) = &self.name {
            o.insert("name".into(), json!(name));
        }
        o.insert("address".into(), json!(self.address));
        match &self.state {
            WorkerState::Reachable {
                engine,
                num_waiting,
                num_running,
                kv_usage,
                ttft_p90_s,
                tpot_p90_s,
            } => {
                o.insert("reachable".into(), json!(true));
                o.insert("num_waiting".into(), json!(num_waiting));
                o.insert("num_running".into(), json!(num_running));
                o.insert("kv_usage".into(), json!(kv_usage));
                o.insert("ttft_p90_s".into(), json!(ttft_p90_s));
                o.insert("tpot_p90_s".into(), json!(tpot_p90_s));
                o.insert("engine".into(), json!(engine));
            }
            WorkerState::Unreachable { error } => {
                o.insert("reachable".into(), json!(false));
                o.insert("error".into(), json!(error));
            }
        }
        Value::Object(o)
    }
}

impl Snapshot {
    /// The request body (and `--once`'s output).
    pub fn to_json(&self) -> Value {
        json!({
            "collector": self.collector,
            "seq": self.seq,
            "interval_ms": self.interval_ms,
            "workers": self.workers.iter().map(WorkerReport::to_json).collect::<Vec<_>>(),
            "membership": self.membership,
        })
    }
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

    #[test]
    fn contract() {
        let m = EngineMetrics {
            engine: Engine::Vllm,
            num_waiting: 3.0,
            num_running: 5.0,
            kv_usage: Some(0.42),
            ttft: None,
            tpot: None,
        };
        let s = Snapshot {
            collector: COLLECTOR_NAME,
            seq: 7,
            interval_ms: 1000,
            workers: vec![
                WorkerReport::reachable(&worker("w0", Naming::Named), &m, Some(0.8), None),
                WorkerReport::unreachable(&worker("w1", Naming::Named), "connection refused"),
                WorkerReport::reachable(
                    &worker("127.0.0.1:8001", Naming::ByAddress),
                    &m,
                    Some(f64::NAN),
                    Some(-1.0),
                ),
            ],
            membership: vec![json!({"name":"w0","cluster":"engine_w0","address":"127.0.0.1:8001"})],
        };
        // Compared as JSON values: key order is not part of the contract (and depends
        // on serde_json's `preserve_order`, which the workspace turns on).
        let want: serde_json::Value = serde_json::from_str(
            r#"{"collector":"llm-collector","interval_ms":1000,"seq":7,"workers":[{"address":"127.0.0.1:8001","engine":"vllm","kv_usage":0.42,"name":"w0","num_running":5,"num_waiting":3,"reachable":true,"tpot_p90_s":null,"ttft_p90_s":0.8},{"address":"127.0.0.1:8001","error":"connection refused","name":"w1","reachable":false},{"address":"127.0.0.1:8001","engine":"vllm","kv_usage":0.42,"num_running":5,"num_waiting":3,"reachable":true,"tpot_p90_s":null,"ttft_p90_s":null}],"membership":[{"name":"w0","cluster":"engine_w0","address":"127.0.0.1:8001"}]}"#,
        )
        .unwrap();
        assert_eq!(s.to_json(), want);
    }

    /// What the collector discovers from Envoy, pushed to a filter of either mode:
    /// the discovery filter takes the membership and the samples that name it; a
    /// static filter reads the samples and ignores the membership.
    #[test]
    fn both_filter_modes_take_the_snapshot() {
        use llm_router::config::Config;
        use llm_router::membership::{parse_membership, update};
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
        let s = Snapshot {
            collector: COLLECTOR_NAME,
            seq: 1,
            interval_ms: 1000,
            workers: workers
                .iter()
                .map(|w| WorkerReport::unreachable(w, "not scraped yet"))
                .collect(),
            membership: workers.iter().map(Worker::member_json).collect(),
        };
        let body = serde_json::to_vec(&s.to_json()).unwrap();

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

    #[test]
    fn counts_are_whole_and_never_negative() {
        assert_eq!(count(2.6), 3);
        assert_eq!(count(-1.0), 0);
        assert_eq!(count(f64::NAN), 0);
        assert_eq!(clean(Some(f64::INFINITY)), None);
    }
}
