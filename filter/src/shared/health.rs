//! The health table: the workers that are down (see `crate::worker::health`), in one key
//! (`super::worker_states`) holding only the down ones, so the steady state is `{}`
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
        let Health::Down {
            since_ms,
            reason,
            probe_successes,
            collector_ok,
        } = self
        else {
            return None;
        };
        Some(json!({"since": since_ms, "reason": reason.as_str(),
                    "probes_ok": probe_successes, "collector_ok": collector_ok}))
    }

    fn from_json(v: &Value) -> Option<Health> {
        Some(Health::Down {
            since_ms: v.get("since")?.as_u64()?,
            reason: DownReason::parse(v.get("reason")?.as_str()?)?,
            probe_successes: u32::try_from(v.get("probes_ok")?.as_u64()?).ok()?,
            collector_ok: v.get("collector_ok")?.as_bool()?,
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
    use crate::worker::health::{Event, Recovery};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn states_round_trip_by_name_and_store_only_the_down() {
        let w = workers(3);
        let down = Health::Down {
            since_ms: 7,
            reason: DownReason::Reset,
            probe_successes: 1,
            collector_ok: false,
        };
        let states = States(vec![Health::Up, down, Health::Up]);
        let bytes = states.encode(&w);
        assert_eq!(HealthStates::decode(&bytes, &w), states);
        assert_eq!(states.down(), vec![false, true, false]);
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
