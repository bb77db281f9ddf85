//! The overload flag table: every worker's `Flag` (see `crate::overload`) in one
//! key, as a JSON object keyed by worker name, so VMs on another config version
//! still find their workers. Only the prober lease holder writes it; every request
//! reads it (through `crate::shared::read_loads`).

use serde_json::{json, Value};

use super::{Keys, SetOutcome, SharedStore, CAS_ATTEMPTS};
use crate::config::WorkerConfig;
use crate::overload::{EnterReason, Flag, Transition};

/// Every worker's flag, by worker index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags(pub Vec<Flag>);

impl Flags {
    /// Overloaded or not, by worker index, as the router takes it.
    pub fn overloaded(&self) -> Vec<bool> {
        self.0.iter().map(Flag::is_overloaded).collect()
    }

    pub fn count(&self) -> usize {
        self.0.iter().filter(|f| f.is_overloaded()).count()
    }

    /// Stored form: worker name -> flag, so VMs on another config version still find
    /// their workers.
    pub fn encode(&self, workers: &[WorkerConfig]) -> Vec<u8> {
        let mut map = serde_json::Map::new();
        for (w, f) in workers.iter().zip(&self.0) {
            let v = match f {
                Flag::Healthy { since_ms } => json!({"since": since_ms}),
                Flag::Overloaded {
                    since_ms,
                    reason,
                    probe_successes,
                    latency_recovered,
                } => json!({"since": since_ms, "reason": reason.as_str(),
                            "probes_ok": probe_successes, "latency_ok": latency_recovered}),
            };
            map.insert(w.name.clone(), v);
        }
        serde_json::to_vec(&Value::Object(map)).unwrap_or_default()
    }

    /// Reads a stored table for `workers` (absent or garbled entries: healthy).
    pub fn decode(bytes: &[u8], workers: &[WorkerConfig]) -> Flags {
        let map: serde_json::Map<String, Value> = serde_json::from_slice(bytes).unwrap_or_default();
        Flags(
            workers
                .iter()
                .map(|w| {
                    let v = map.get(&w.name)?;
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
                })
                .map(Option::unwrap_or_default)
                .collect(),
        )
    }
}

/// The flag table in shared data (one key).
#[derive(Debug, Clone)]
pub struct FlagTable {
    key: String,
}

impl FlagTable {
    pub fn new(keys: &Keys) -> FlagTable {
        FlagTable { key: keys.flags() }
    }

    pub fn read(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> Flags {
        store
            .get(&self.key)
            .map(|(v, _)| Flags::decode(&v, workers))
            .unwrap_or_else(|| Flags(vec![Flag::default(); workers.len()]))
    }

    /// Applies `change` to the stored flags with CAS retries and returns the
    /// transitions it made (worker index, transition). Nothing is written when
    /// nothing changed, so a steady state costs one `get`.
    pub fn update(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
        mut change: impl FnMut(&mut Flags) -> Vec<(usize, Transition)>,
    ) -> Vec<(usize, Transition)> {
        for _ in 0..CAS_ATTEMPTS {
            let (mut flags, cas) = match store.get(&self.key) {
                Some((v, cas)) => (Flags::decode(&v, workers), cas),
                None => (Flags(vec![Flag::default(); workers.len()]), 0),
            };
            let before = flags.clone();
            let flips = change(&mut flags);
            if flags == before {
                return flips;
            }
            match store.set(&self.key, &flags.encode(workers), cas) {
                SetOutcome::Stored => return flips,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return Vec::new(),
            }
        }
        Vec::new()
    }

    /// Forgets every flag (overload detection switched off): no stale flag is left
    /// for when it is switched on again.
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

    use crate::overload::observe_latencies;
    use crate::overload::testing::{cfg, sample};

    fn workers(n: usize) -> Vec<WorkerConfig> {
        let ws: Vec<String> = (0..n).map(|i| format!(r#"{{"name":"w{i}"}}"#)).collect();
        crate::config::Config::from_json(format!(r#"{{"workers":[{}]}}"#, ws.join(",")).as_bytes())
            .unwrap()
            .workers
    }

    #[test]
    fn flags_round_trip_by_name() {
        let w = workers(3);
        let flagged = Flag::Overloaded {
            since_ms: 7,
            reason: EnterReason::Tpot,
            probe_successes: 1,
            latency_recovered: true,
        };
        let flags = Flags(vec![
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
