//! The overload flag table: every worker's `Flag` (see `crate::worker::overload`) in one
//! key (`super::worker_states`), every worker stored. Only the prober lease holder
//! writes it; every request reads it (through `crate::shared::read_loads`).

use serde_json::{json, Value};

use super::worker_states::{StateTable, States, WorkerState};
use super::Keys;
use crate::worker::overload::{EnterReason, Flag};

/// Every worker's flag, by worker index.
pub type Flags = States<Flag>;
/// The flag table in shared data.
pub type FlagTable = StateTable<Flag>;

impl Flags {
    /// Overloaded or not, by worker index, as the router takes it.
    pub fn overloaded(&self) -> Vec<bool> {
        self.0.iter().map(Flag::is_overloaded).collect()
    }

    pub fn count(&self) -> usize {
        self.0.iter().filter(|f| f.is_overloaded()).count()
    }
}

impl FlagTable {
    pub fn new(keys: &Keys) -> FlagTable {
        StateTable::with_key(keys.flags())
    }
}

impl WorkerState for Flag {
    fn to_json(&self) -> Option<Value> {
        Some(match self {
            Flag::Healthy { since_ms } => json!({"since": since_ms}),
            Flag::Overloaded {
                since_ms,
                reason,
                probe_successes,
                latency_recovered,
            } => json!({"since": since_ms, "reason": reason.as_str(),
                        "probes_ok": probe_successes, "latency_ok": latency_recovered}),
        })
    }

    fn from_json(v: &Value) -> Option<Flag> {
        let since_ms = v.get("since")?.as_u64()?;
        let Some(reason) = v.get("reason") else {
            return Some(Flag::Healthy { since_ms });
        };
        Some(Flag::Overloaded {
            since_ms,
            reason: EnterReason::parse(reason.as_str()?)?,
            probe_successes: u32::try_from(v.get("probes_ok")?.as_u64()?).ok()?,
            latency_recovered: v.get("latency_ok")?.as_bool()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    use crate::config::testing::named_workers as workers;
    use crate::config::WorkerConfig;
    use crate::worker::overload::Transition;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    use crate::worker::overload::observe_latencies;
    use crate::worker::overload::testing::{cfg, sample};

    #[test]
    fn flags_round_trip_by_name() {
        let w = workers(3);
        let flagged = Flag::Overloaded {
            since_ms: 7,
            reason: EnterReason::Tpot,
            probe_successes: 1,
            latency_recovered: true,
        };
        let flags = States(vec![
            Flag::default(),
            flagged,
            Flag::Healthy { since_ms: 9 },
        ]);
        let bytes = flags.encode(&w);
        assert_eq!(Flags::decode(&bytes, &w), flags);
        assert_eq!(flags.overloaded(), vec![false, true, false]);
        assert_eq!(flags.count(), 1);
        let reversed: Vec<WorkerConfig> = w.iter().rev().cloned().collect();
        assert_eq!(
            Flags::decode(&bytes, &reversed).overloaded(),
            vec![false, true, false]
        );
        assert_eq!(Flags::decode(b"junk", &w).count(), 0);
    }

    #[test]
    fn table_updates_and_clears() {
        let w = workers(2);
        let store = MemStore::default();
        let table = FlagTable::new(&Keys::new("t"));
        let c = cfg();
        let hot = sample(Some(40.0), None, 100);
        let flips = table.update(&store, &w, |f| {
            observe_latencies(&mut f.0, &hot, 100, 5000, &c, &[])
        });
        assert_eq!(flips, vec![(0, Transition::Entered(EnterReason::Ttft))]);
        assert_eq!(table.read(&store, &w).overloaded(), vec![true, false]);
        let flips = table.update(&store, &w, |f| {
            observe_latencies(&mut f.0, &hot, 200, 5000, &c, &[])
        });
        assert_eq!(flips, vec![], "already flagged");
        // Cooled down: a probeable worker waits for its probes, one that cannot be
        // probed recovers on latency alone.
        let cool = sample(Some(1.0), None, 300);
        let flips = table.update(&store, &w, |f| {
            observe_latencies(&mut f.0, &cool, 300, 5000, &c, &[true])
        });
        assert_eq!(flips, vec![], "probes pending");
        let flips = table.update(&store, &w, |f| {
            observe_latencies(&mut f.0, &cool, 300, 5000, &c, &[false])
        });
        assert_eq!(flips, vec![(0, Transition::Recovered { after_ms: 200 })]);
        table.update(&store, &w, |f| {
            observe_latencies(&mut f.0, &hot, 400, 5000, &c, &[])
        });
        table.clear(&store);
        assert_eq!(table.read(&store, &w).count(), 0, "no stale flag left");
    }
}
