//! The engine samples table: the collector's last snapshot, one key, stored as a
//! JSON object keyed by worker name, so readers on another config version still
//! find their workers. A push replaces the whole table (all or nothing).

use serde_json::Value;

use super::{Keys, SetOutcome, SharedStore};
use crate::config::WorkerConfig;
use crate::load::{EngineSample, LoadTable, Report};

/// The samples table in shared data.
#[derive(Debug, Clone)]
pub struct SamplesTable {
    key: String,
}

impl SamplesTable {
    pub fn new(keys: &Keys) -> SamplesTable {
        SamplesTable {
            key: keys.samples(),
        }
    }

    /// The last snapshot, for `workers` (never stored or unreadable: no reports).
    pub fn read(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> LoadTable {
        let bytes = store.get(&self.key).map(|(v, _)| v).unwrap_or_default();
        decode_table(&bytes, workers)
    }

    /// Replaces the snapshot; whether it was stored.
    pub fn write(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
        reports: &[Option<Report>],
    ) -> bool {
        store.set(&self.key, &encode_table(workers, reports), 0) == SetOutcome::Stored
    }
}

/// Stored form: worker name -> report, so readers on another config version still
/// find their workers.
fn encode_table(workers: &[WorkerConfig], reports: &[Option<Report>]) -> Vec<u8> {
    let mut map = serde_json::Map::new();
    for (w, r) in workers.iter().zip(reports) {
        let v = match r {
            Some(Report::Sample(s)) => serde_json::json!({
                "w": s.num_waiting, "r": s.num_running, "kv": s.kv_usage,
                "ttft": s.ttft_p90_s, "tpot": s.tpot_p90_s, "cap": s.kv_capacity_tokens,
                "pt": s.prompt_tokens_total,
                "at": s.at_ms,
            }),
            Some(Report::Unreachable { at_ms }) => serde_json::json!({"down": true, "at": at_ms}),
            None => continue,
        };
        map.insert(w.name.clone(), v);
    }
    serde_json::to_vec(&Value::Object(map)).unwrap_or_default()
}

/// Reads a stored table for the given workers (unknown or garbled entries: `None`).
fn decode_table(bytes: &[u8], workers: &[WorkerConfig]) -> LoadTable {
    let map: serde_json::Map<String, Value> = serde_json::from_slice(bytes).unwrap_or_default();
    let reports = workers
        .iter()
        .map(|w| {
            let v = map.get(&w.name)?;
            let at_ms = v.get("at")?.as_u64()?;
            if v.get("down").and_then(Value::as_bool) == Some(true) {
                return Some(Report::Unreachable { at_ms });
            }
            Some(Report::Sample(EngineSample {
                num_waiting: v.get("w")?.as_u64()?,
                num_running: v.get("r")?.as_u64()?,
                kv_usage: v.get("kv").and_then(Value::as_f64),
                ttft_p90_s: v.get("ttft").and_then(Value::as_f64),
                tpot_p90_s: v.get("tpot").and_then(Value::as_f64),
                kv_capacity_tokens: v.get("cap").and_then(Value::as_u64),
                prompt_tokens_total: v.get("pt").and_then(Value::as_u64),
                at_ms,
            }))
        })
        .collect();
    LoadTable { reports }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::workers;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn sample(waiting: u64, running: u64, at_ms: u64) -> Report {
        Report::Sample(EngineSample {
            kv_usage: Some(0.5),
            tpot_p90_s: Some(0.02),
            kv_capacity_tokens: Some(8192),
            prompt_tokens_total: Some(123_456),
            ..EngineSample::queue(waiting, running, at_ms)
        })
    }

    #[test]
    fn table_round_trips_by_name() {
        let w = workers();
        let reports = vec![
            Some(sample(2, 1, 5)),
            Some(Report::Unreachable { at_ms: 5 }),
        ];
        let bytes = encode_table(&w, &reports);
        assert_eq!(decode_table(&bytes, &w).reports, reports);
        // A reader whose config lists the workers in another order still finds them.
        let reversed: Vec<WorkerConfig> = w.iter().rev().cloned().collect();
        let t = decode_table(&bytes, &reversed);
        assert_eq!(t.reports[0], reports[1]);
        assert_eq!(decode_table(b"garbage", &w).reports, vec![None, None]);
    }

    #[test]
    fn the_table_reads_what_was_written() {
        let store = super::super::testing::MemStore::default();
        let table = SamplesTable::new(&Keys::new("t"));
        let w = workers();
        assert_eq!(table.read(&store, &w).reports, vec![None, None]);
        let reports = vec![None, Some(sample(4, 0, 9))];
        assert!(table.write(&store, &w, &reports));
        assert_eq!(table.read(&store, &w).reports, reports);
        assert!(store.map.borrow().contains_key("t.samples"));
    }
}
