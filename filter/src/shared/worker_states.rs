//! A per-worker state machine's table in one shared key: a JSON object keyed by
//! worker name (so VMs on another config version still find their workers) holding
//! each worker's state, or only the non-default ones where the default is the
//! steady state, so a healthy fleet costs every request one small `get`. Writers
//! change it with CAS retries and write nothing when nothing changed. The overload
//! flags and the health table are two such tables.

use std::marker::PhantomData;

use serde_json::Value;

use super::{SetOutcome, SharedStore, CAS_ATTEMPTS};
use crate::config::WorkerConfig;

/// One worker's state as the table stores it.
pub trait WorkerState: Clone + Default + PartialEq {
    /// The stored entry; `None` leaves the worker out (read back as the default).
    fn to_json(&self) -> Option<Value>;
    /// A stored entry read back; `None` (garbled) is taken as the default.
    fn from_json(v: &Value) -> Option<Self>;
}

/// Every worker's state, by worker index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct States<S>(pub Vec<S>);

impl<S: WorkerState> States<S> {
    /// Stored form: worker name -> entry.
    pub fn encode(&self, workers: &[WorkerConfig]) -> Vec<u8> {
        let map: serde_json::Map<String, Value> = workers
            .iter()
            .zip(&self.0)
            .filter_map(|(w, s)| Some((w.name.clone(), s.to_json()?)))
            .collect();
        serde_json::to_vec(&Value::Object(map)).unwrap_or_default()
    }

    /// Reads a stored table for `workers` (absent or garbled entries: the default).
    pub fn decode(bytes: &[u8], workers: &[WorkerConfig]) -> States<S> {
        let map: serde_json::Map<String, Value> = serde_json::from_slice(bytes).unwrap_or_default();
        States(
            workers
                .iter()
                .map(|w| map.get(&w.name).and_then(S::from_json).unwrap_or_default())
                .collect(),
        )
    }

    fn initial(workers: &[WorkerConfig]) -> States<S> {
        States(vec![S::default(); workers.len()])
    }
}

/// The table in shared data (one key).
#[derive(Debug, Clone)]
pub struct StateTable<S> {
    key: String,
    state: PhantomData<S>,
}

impl<S: WorkerState> StateTable<S> {
    pub fn with_key(key: String) -> StateTable<S> {
        StateTable {
            key,
            state: PhantomData,
        }
    }

    pub fn read(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> States<S> {
        match store.get(&self.key) {
            Some((v, _)) => States::decode(&v, workers),
            None => States::initial(workers),
        }
    }

    /// Applies `change` with CAS retries and returns what it reported (the
    /// transitions it made); nothing is written when nothing changed.
    pub fn update<T>(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
        mut change: impl FnMut(&mut States<S>) -> Vec<T>,
    ) -> Vec<T> {
        for _ in 0..CAS_ATTEMPTS {
            let (mut states, cas) = match store.get(&self.key) {
                Some((v, cas)) => (States::decode(&v, workers), cas),
                None => (States::initial(workers), 0),
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

    /// Forgets every state (the feature switched off): nothing stale is left for
    /// when it is switched on again.
    pub fn clear(&self, store: &dyn SharedStore) {
        if store.get(&self.key).is_some_and(|(v, _)| v != b"{}") {
            store.set(&self.key, b"{}", 0);
        }
    }
}
