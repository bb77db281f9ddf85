//! The health table: the workers that are down (see `crate::health`), in one key, as
//! a JSON object keyed by worker name holding only the down ones, so the steady
//! state is `{}` and costs every request one small `get`. Any VM writes a failure
//! it saw (CAS, so two threads seeing one death flip it once); the prober lease
//! holder steps probes, reports and time.

use serde_json::{json, Value};

use super::{Keys, SetOutcome, SharedStore, CAS_ATTEMPTS};
use crate::config::WorkerConfig;
use crate::health::{DownReason, Health, Transition};

/// Every worker's health, by worker index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HealthStates(pub Vec<Health>);

impl HealthStates {
    /// Down or not, by worker index, as the candidates take it.
    pub fn down(&self) -> Vec<bool> {
        self.0.iter().map(Health::is_down).collect()
    }

    pub fn count(&self) -> usize {
        self.0.iter().filter(|h| h.is_down()).count()
    }

    /// Stored form: name -> state, down workers only.
    pub fn encode(&self, workers: &[WorkerConfig]) -> Vec<u8> {
        let mut map = serde_json::Map::new();
        for (w, h) in workers.iter().zip(&self.0) {
            if let Health::Down {
                since_ms,
                reason,
                probe_successes,
                collector_ok,
            } = h
            {
                let v = json!({"since": since_ms, "reason": reason.as_str(),
                               "probes_ok": probe_successes, "collector_ok": collector_ok});
                map.insert(w.name.clone(), v);
            }
        }
        serde_json::to_vec(&Value::Object(map)).unwrap_or_default()
    }

    /// Reads a stored table for `workers` (absent or garbled entries: up).
    pub fn decode(bytes: &[u8], workers: &[WorkerConfig]) -> HealthStates {
        let map: serde_json::Map<String, Value> = serde_json::from_slice(bytes).unwrap_or_default();
        HealthStates(
            workers
                .iter()
                .map(|w| {
                    let v = map.get(&w.name)?;
                    Some(Health::Down {
                        since_ms: v.get("since")?.as_u64()?,
                        reason: DownReason::parse(v.get("reason")?.as_str()?)?,
                        probe_successes: u32::try_from(v.get("probes_ok")?.as_u64()?).ok()?,
                        collector_ok: v.get("collector_ok")?.as_bool()?,
                    })
                })
                .map(Option::unwrap_or_default)
                .collect(),
        )
    }
}

/// The health table in shared data (one key).
#[derive(Debug, Clone)]
pub struct HealthTable {
    key: String,
}

impl HealthTable {
    pub fn new(keys: &Keys) -> HealthTable {
        HealthTable { key: keys.health() }
    }

    pub fn read(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> HealthStates {
        match store.get(&self.key) {
            Some((v, _)) => HealthStates::decode(&v, workers),
            None => HealthStates(vec![Health::Up; workers.len()]),
        }
    }

    /// Applies `change` with CAS retries; returns the transitions it made (worker
    /// index, transition). Nothing is written when nothing changed.
    pub fn update(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
        mut change: impl FnMut(&mut HealthStates) -> Vec<(usize, Transition)>,
    ) -> Vec<(usize, Transition)> {
        for _ in 0..CAS_ATTEMPTS {
            let (mut states, cas) = match store.get(&self.key) {
                Some((v, cas)) => (HealthStates::decode(&v, workers), cas),
                None => (HealthStates(vec![Health::Up; workers.len()]), 0),
            };
            let before = states.clone();
            let flips = change(&mut states);
            if states == before {
                return flips;
            }
            match store.set(&self.key, &states.encode(workers), cas) {
                SetOutcome::Stored => return flips,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return Vec::new(),
            }
        }
        Vec::new()
    }

    /// Forgets every down worker (health switched off).
    pub fn clear(&self, store: &dyn SharedStore) {
        if store.get(&self.key).is_some_and(|(v, _)| v != b"{}") {
            store.set(&self.key, b"{}", 0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    use crate::health::{Event, Recovery};

    fn workers(n: usize) -> Vec<WorkerConfig> {
        let ws: Vec<String> = (0..n).map(|i| format!(r#"{{"name":"w{i}"}}"#)).collect();
        crate::config::Config::from_json(format!(r#"{{"workers":[{}]}}"#, ws.join(",")).as_bytes())
            .unwrap()
            .workers
    }

    #[test]
    fn states_round_trip_by_name_and_store_only_the_down() {
        let w = workers(3);
        let down = Health::Down {
            since_ms: 7,
            reason: DownReason::Reset,
            probe_successes: 1,
            collector_ok: false,
        };
        let states = HealthStates(vec![Health::Up, down, Health::Up]);
        let bytes = states.encode(&w);
        assert_eq!(HealthStates::decode(&bytes, &w), states);
        assert_eq!(states.down(), vec![false, true, false]);
        assert_eq!(HealthStates(vec![Health::Up; 3]).encode(&w), b"{}");
        let reversed: Vec<WorkerConfig> = w.iter().rev().cloned().collect();
        assert_eq!(
            HealthStates::decode(&bytes, &reversed).down(),
            vec![false, true, false]
        );
        assert_eq!(HealthStates::decode(b"junk", &w).count(), 0);
    }

    #[test]
    fn a_failure_seen_on_two_threads_flips_once() {
        let w = workers(2);
        let store = MemStore::default();
        let table = HealthTable::new(&Keys::new("t"));
        let r = Recovery {
            probes_needed: 1,
            hold_ms: 0,
        };
        let fail = |at| {
            table.update(&store, &w, |s| {
                s.0.get_mut(1)
                    .and_then(|h| h.step(Event::Failed(DownReason::ConnectFailure), at, r))
                    .map(|t| vec![(1, t)])
                    .unwrap_or_default()
            })
        };
        assert_eq!(
            fail(10),
            vec![(1, Transition::Down(DownReason::ConnectFailure))]
        );
        assert_eq!(fail(11), vec![], "already down: no second flip");
        assert_eq!(table.read(&store, &w).down(), vec![false, true]);
        table.clear(&store);
        assert_eq!(table.read(&store, &w).count(), 0);
    }
}
