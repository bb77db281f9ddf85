//! The health table: the workers that are down or on record (failures in a row,
//! recent ejections; see `crate::worker::health`), in one key
//! (`super::worker_states`) holding only those, so the steady state is `{}`
//! and costs every request one small `get`. Any VM writes a failure it saw (CAS, so
//! two threads seeing one death flip it once); the prober lease holder steps
//! probes, reports and time.

use serde_json::{json, Value};

use super::worker_states::{StateTable, States, WorkerState};
use super::Keys;
use crate::worker::health::{DownReason, Health};

/// Every worker's health, by worker index.
pub type HealthStates = States<Health>;
/// The health table in shared data.
pub type HealthTable = StateTable<Health>;

impl HealthStates {
    /// Down or not, by worker index, as the candidates take it.
    pub fn down(&self) -> Vec<bool> {
        self.0.iter().map(Health::is_down).collect()
    }

    /// Down with their last connect failed, by worker index (`all_down` passes
    /// them over while another may answer).
    pub fn refused(&self) -> Vec<bool> {
        self.0.iter().map(Health::refused).collect()
    }

    /// With anything on record, by worker index: a served request is told to these.
    pub fn tracked(&self) -> Vec<bool> {
        self.0.iter().map(|h| *h != Health::Up).collect()
    }

    pub fn count(&self) -> usize {
        self.0.iter().filter(|h| h.is_down()).count()
    }
}

impl HealthTable {
    pub fn new(keys: &Keys) -> HealthTable {
        StateTable::with_key(keys.health())
    }
}

impl WorkerState for Health {
    fn to_json(&self) -> Option<Value> {
        match *self {
            Health::Up => None,
            Health::Watched {
                failures,
                ejections,
                since_ms,
            } => Some(json!({"failures": failures, "ejections": ejections, "back": since_ms})),
            Health::Down {
                since_ms,
                reason,
                probe_successes,
                collector_ok,
                refused,
                ejections,
            } => Some(json!({"since": since_ms, "reason": reason.as_str(),
                    "probes_ok": probe_successes, "collector_ok": collector_ok,
                    "refused": refused, "ejections": ejections})),
        }
    }

    fn from_json(v: &Value) -> Option<Health> {
        let count = |key: &str| u32::try_from(v.get(key)?.as_u64()?).ok();
        if v.get("reason").is_none() {
            return Some(Health::Watched {
                failures: count("failures")?,
                ejections: count("ejections")?,
                since_ms: v.get("back")?.as_u64()?,
            });
        }
        Some(Health::Down {
            since_ms: v.get("since")?.as_u64()?,
            reason: DownReason::parse(v.get("reason")?.as_str()?)?,
            probe_successes: count("probes_ok")?,
            collector_ok: v.get("collector_ok")?.as_bool()?,
            refused: v.get("refused")?.as_bool()?,
            ejections: count("ejections")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    use crate::config::testing::named_workers as workers;
    use crate::config::WorkerConfig;
    use crate::worker::health::Transition;
    use crate::worker::health::{Event, Rules};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn states_round_trip_by_name_and_store_only_the_down() {
        let w = workers(3);
        let down = Health::Down {
            since_ms: 7,
            reason: DownReason::ConnectFailure,
            probe_successes: 1,
            collector_ok: false,
            refused: true,
            ejections: 2,
        };
        let watched = Health::Watched {
            failures: 3,
            ejections: 1,
            since_ms: 9,
        };
        let states = States(vec![Health::Up, down, watched]);
        let bytes = states.encode(&w);
        assert_eq!(HealthStates::decode(&bytes, &w), states);
        assert_eq!(states.down(), vec![false, true, false]);
        assert_eq!(states.refused(), vec![false, true, false]);
        assert_eq!(states.tracked(), vec![false, true, true]);
        let states = States(vec![Health::Up, down, Health::Up]);
        let bytes = states.encode(&w);
        assert_eq!(States(vec![Health::Up; 3]).encode(&w), b"{}");
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
        let r = Rules {
            consecutive_failures: 1,
            room: true,
            probes_needed: 1,
            hold_ms: 0,
            backoff_ms: 0,
            max_backoff_ms: 0,
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
