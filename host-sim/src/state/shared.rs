//! The state one [`crate::Host`] shares among all its VMs, as Envoy shares it across worker
//! threads: the virtual clock, shared data (with Envoy's CAS rules), shared queues,
//! metrics, pending HTTP calls and the fault rules. It sits behind one
//! `Arc<Mutex<Shared>>` that every VM's store holds; there are no globals.

use crate::types::codes::{LogLevel, Status};
use crate::types::fault::Faults;
use crate::types::values::{FailurePolicy, HttpCall, MetricValue};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

/// Immutable configuration common to all VMs of a host.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub plugin_config: Vec<u8>,
    pub vm_config: Vec<u8>,
    pub plugin_name: String,
    pub root_id: String,
    pub vm_id: String,
    pub clusters: Vec<String>,
    pub log_level: LogLevel,
    pub allow_on_headers_stop_iteration: bool,
    pub seed: u64,
    pub properties: Vec<(String, Vec<u8>)>,
    /// The VM's environment, `NAME=value` (Envoy's
    /// `vm_config.environment_variables`).
    pub environ: Vec<Vec<u8>>,
    pub failure_policy: FailurePolicy,
    /// A VM's linear memory may not grow past this many bytes.
    pub max_memory_bytes: usize,
}

/// The linear memory cap of Envoy's Wasm VMs (proxy-wasm-cpp-host's limit): an
/// allocation past it fails, and the Rust guest aborts with a trap, as in Envoy.
pub const DEFAULT_MAX_MEMORY_BYTES: usize = 1 << 30;

/// A shared queue: its items and the registrant's VM and root context, which
/// `proxy_on_queue_ready` goes to (the last registrant wins, as in Envoy).
pub(crate) struct Queue {
    pub vm: usize,
    pub context_id: u32,
    pub items: VecDeque<Vec<u8>>,
}

/// A shared-data entry: the value and its CAS.
pub(crate) type Entry = (Vec<u8>, u32);

/// State shared by all VMs of one host.
pub(crate) struct Shared {
    pub now_ns: u64,
    pub start_ns: u64,
    pub data: HashMap<String, (Vec<u8>, u32)>,
    /// `(vm, key)` reads answered from an earlier state until that VM writes the key
    /// (`Host::pin_reads`).
    pub pinned_reads: HashMap<(usize, String), Option<Entry>>,
    pub next_cas: u32,
    pub queue_names: HashMap<(String, String), u32>,
    pub queues: HashMap<u32, Queue>,
    pub next_queue_token: u32,
    /// `(vm, root context, queue token)` notifications not yet delivered.
    pub queue_ready: VecDeque<(usize, u32, u32)>,
    pub metrics: BTreeMap<String, MetricValue>,
    pub http_calls: BTreeMap<u32, HttpCall>,
    pub next_http_token: u32,
    pub clear_route_cache_total: u64,
    pub faults: Faults,
}

impl Shared {
    pub fn new(start_ms: u64, seed: u64) -> Self {
        let start_ns = start_ms.saturating_mul(1_000_000);
        Self {
            now_ns: start_ns,
            start_ns,
            data: HashMap::new(),
            pinned_reads: HashMap::new(),
            next_cas: 1,
            queue_names: HashMap::new(),
            queues: HashMap::new(),
            next_queue_token: 1,
            queue_ready: VecDeque::new(),
            metrics: BTreeMap::new(),
            http_calls: BTreeMap::new(),
            next_http_token: 1,
            clear_route_cache_total: 0,
            faults: Faults::new(seed),
        }
    }

    /// Envoy's `nextCas()`: never 0.
    pub fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1).max(1);
        cas
    }

    /// Envoy's `SharedData::get`, or what `Host::pin_reads` pinned for `vm`.
    pub fn get_data(&self, vm: usize, key: &str) -> Option<Entry> {
        match self.pinned_reads.get(&(vm, key.to_string())) {
            Some(pinned) => pinned.clone(),
            None => self.data.get(key).cloned(),
        }
    }

    /// A write of `key` by `vm`: its pinned reads end, then Envoy's `set`.
    pub fn set_data_from(&mut self, vm: usize, key: &str, value: Vec<u8>, cas: u32) -> Status {
        self.pinned_reads.remove(&(vm, key.to_string()));
        self.set_data(key, value, cas)
    }

    /// Envoy's `SharedData::set` (proxy-wasm-cpp-host): the CAS is checked only
    /// against a key that exists; a missing key is created whatever the CAS.
    pub fn set_data(&mut self, key: &str, value: Vec<u8>, cas: u32) -> Status {
        if let Some((_, current)) = self.data.get(key) {
            if cas != 0 && cas != *current {
                return Status::CasMismatch;
            }
        }
        let next = self.next_cas();
        self.data.insert(key.to_string(), (value, next));
        Status::Ok
    }
}

/// Locks the shared state, ignoring poisoning (a panic elsewhere must not cascade).
pub(crate) fn lock(shared: &Arc<Mutex<Shared>>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}
