//! The root context: parses the plugin configuration, owns the VM's router and its
//! view of the shared state, and on each tick catches up with the other VMs and
//! claims the periodic eviction.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use super::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};

use super::host::{self, HostStore, Metric};
use super::http::Stream;
use super::overload::{self, Prober};
use crate::config::Config;
use crate::decision::{Decision, Label, Reason};
use crate::load::{decode_table, LoadTable};
use crate::policy::SplitMix64;
use crate::router::Router;
use crate::sync::{EvictionClock, InflightTable, Op, OpRing, SharedStore};

/// Shared-data keys start with this; shared data is already scoped by `vm_id`.
pub const KEY_PREFIX: &str = "llm_router";
/// The collector's last snapshot, as `load::encode_table` writes it.
pub const SAMPLES_KEY: &str = "llm_router.samples";
/// The "gate configured but blind" warning fires once per this many requests.
const GATE_INERT_LOG_SAMPLE: u64 = 64;

/// Stats this VM reports. Envoy shows them as `wasmcustom.<name>` in `/stats` and
/// without the prefix in `/stats/prometheus`; same-named stats of all VMs are one.
pub struct Metrics {
    decisions: [Metric; Label::ALL.len()],
    pub no_worker: Metric,
    pub unreadable: Metric,
    pub tree_chars: Metric,
    /// In-flight requests of the whole Envoy, as the shared table says (each VM's
    /// tick writes the same value).
    pub inflight: Metric,
    /// Tree operations applied from the ring (all VMs together).
    pub sync_applied: Metric,
    /// Operations a VM missed because it fell a whole ring behind.
    pub sync_gaps: Metric,
    /// Operations that could not be shared and were applied on one VM only.
    pub sync_append_failures: Metric,
    /// Chars of matched prefix a `cache_worker_queued` diversion abandoned.
    diverted_overlap: Metric,
    /// Owners the queue gate rejected.
    gate_rejections: Metric,
    /// Owners admitted by the gate only because they had no fresh sample.
    gate_unsampled: Metric,
    saturation_pins: Metric,
    /// Requests routed while the gate was set but no candidate had a fresh sample.
    gate_inert: Metric,
    pub pushes_accepted: Metric,
    pub pushes_rejected: Metric,
    /// PD requests sent as a prefill and decode pair.
    pub pd_pairs: Metric,
    /// PD prefill copies that could not be sent or failed.
    pub pd_prefill_failures: Metric,
    /// Requests whose prefix owners were all filtered out as overloaded: logical
    /// cache hits that became physical misses (seed 003's blind spot).
    pub overload_owner_filtered: Metric,
}

impl Metrics {
    fn define() -> Metrics {
        Metrics {
            decisions: Label::ALL
                .map(|l| Metric::counter(&format!("llm_router_decisions_{}", l.as_str()))),
            no_worker: Metric::counter("llm_router_no_worker"),
            unreadable: Metric::counter("llm_router_unreadable_body"),
            tree_chars: Metric::gauge("llm_router_tree_chars"),
            inflight: Metric::gauge("llm_router_inflight"),
            sync_applied: Metric::counter("llm_router_sync_applied"),
            sync_gaps: Metric::counter("llm_router_sync_gaps"),
            sync_append_failures: Metric::counter("llm_router_sync_append_failures"),
            diverted_overlap: Metric::histogram("llm_router_diverted_overlap_chars"),
            gate_rejections: Metric::counter("llm_router_queue_gate_rejections"),
            gate_unsampled: Metric::counter("llm_router_queue_gate_unsampled"),
            saturation_pins: Metric::counter("llm_router_saturation_pins"),
            gate_inert: Metric::counter("llm_router_queue_gate_inert"),
            pushes_accepted: Metric::counter("llm_router_stats_pushes_accepted"),
            pushes_rejected: Metric::counter("llm_router_stats_pushes_rejected"),
            pd_pairs: Metric::counter("llm_router_pd_pairs"),
            pd_prefill_failures: Metric::counter("llm_router_pd_prefill_failures"),
            overload_owner_filtered: Metric::counter("llm_router_overload_owner_filtered"),
        }
    }

    /// Books one routed request: exactly one decision label, plus what the gate did.
    pub fn decision(&self, d: &Decision) {
        if let Some(pos) = Label::ALL.iter().position(|l| *l == d.label()) {
            if let Some(m) = self.decisions.get(pos) {
                m.inc();
            }
        }
        self.gate(d);
    }

    /// What the gate did for a decision that is not the request's label (PD decode).
    pub fn gate(&self, d: &Decision) {
        self.gate_rejections.add(u64::from(d.gate.rejected));
        self.gate_unsampled.add(u64::from(d.gate.unsampled));
        match d.reason {
            // A diversion that happened is the gate's cost; only those are observed.
            Reason::CacheWorkerQueued => self.diverted_overlap.set(d.matched_chars as u64),
            Reason::SaturationPin => self.saturation_pins.inc(),
            _ => {}
        }
    }
}

/// This VM's handles on the state all VMs share.
pub struct SharedState {
    pub ring: OpRing,
    pub inflight: InflightTable,
    pub eviction: EvictionClock,
    /// The next ring sequence this VM has not applied.
    pub cursor: u64,
}

/// Everything the streams of this VM share.
pub struct State {
    pub router: Router,
    pub shared: SharedState,
    pub rng: SplitMix64,
    pub metrics: Metrics,
    /// Requests routed with the gate blind, for the sampled warning.
    gate_inert_seen: u64,
}

impl State {
    /// The collector's last snapshot, for this config's workers.
    pub fn engine_loads(&self) -> LoadTable {
        let bytes = HostStore
            .get(SAMPLES_KEY)
            .map(|(v, _)| v)
            .unwrap_or_default();
        decode_table(&bytes, &self.router.config().workers)
    }

    /// Counts a request routed with the gate set but no fresh sample anywhere, and
    /// warns on 1 in 64: the condition is steady, so sampling exposes it without
    /// flooding the log.
    pub fn note_gate_inert(&mut self) {
        self.metrics.gate_inert.inc();
        if self.gate_inert_seen.is_multiple_of(GATE_INERT_LOG_SAMPLE) {
            host::log(
                LogLevel::Warn,
                "llm-router: worker_queue_limit is set but no worker has a fresh engine sample, \
                 so the queue gate is inert: check that the collector pushes to the stats endpoint",
            );
        }
        self.gate_inert_seen += 1;
    }

    /// Applies what other VMs recorded since the last call.
    pub fn catch_up(&mut self) {
        let router = &mut self.router;
        let got = self
            .shared
            .ring
            .catch_up(&HostStore, &mut self.shared.cursor, |seq, op| {
                router.apply(seq, &op)
            });
        if got.applied > 0 {
            self.metrics.sync_applied.add(got.applied);
        }
        if got.gaps > 0 {
            self.metrics.sync_gaps.add(got.gaps);
        }
    }

    /// Shares `op` with every VM and applies it here (in ring order).
    pub fn record(&mut self, op: Op) {
        match self.shared.ring.append(&HostStore, &op.encode()) {
            Ok(_) => self.catch_up(),
            Err(e) => {
                self.metrics.sync_append_failures.inc();
                host::log(
                    LogLevel::Warn,
                    &format!("llm-router: tree operation kept on this thread only: {e:?}"),
                );
                self.router.apply_local(&op);
            }
        }
    }

    /// The whole Envoy's in-flight requests, by worker index.
    pub fn inflight(&self) -> Vec<u64> {
        let counts = self.shared.inflight.read(&HostStore);
        self.router
            .config()
            .workers
            .iter()
            .map(|w| {
                counts
                    .iter()
                    .find(|(n, _)| *n == w.name)
                    .map_or(0, |(_, c)| *c)
            })
            .collect()
    }
}

pub type Shared = Rc<RefCell<Option<State>>>;

pub struct Root {
    state: Shared,
    /// Created with the first configuration (it needs the host's entropy).
    prober: Option<Prober>,
}

impl Root {
    pub fn new() -> Root {
        Root {
            state: Rc::new(RefCell::new(None)),
            prober: None,
        }
    }
}

impl Context for Root {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        _body: usize,
        _trailers: usize,
    ) {
        let slot = self.state.borrow();
        if let (Some(state), Some(prober)) = (slot.as_ref(), self.prober.as_mut()) {
            prober.on_response(state, token, host::now_ms());
        }
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size) {
            Ok(Some(b)) => b,
            Ok(None) => Vec::new(),
            Err(e) => {
                host::log(
                    LogLevel::Error,
                    &format!("llm-router: cannot read plugin config: {e:?}"),
                );
                return false;
            }
        };
        let cfg = match Config::from_json(&bytes) {
            Ok(c) => c,
            Err(e) => {
                host::log(LogLevel::Error, &format!("llm-router: {e}"));
                return false;
            }
        };
        let tick = Duration::from_millis(overload::tick_ms(&cfg));
        self.prober
            .get_or_insert_with(|| Prober::new(host::random_seed()))
            .configured(&cfg);
        let ring = OpRing::new(KEY_PREFIX, cfg.sync_ring_slots);
        ring.init_if_missing(&HostStore);
        let mut slot = self.state.borrow_mut();
        match slot.as_mut() {
            Some(state) => {
                if state.shared.ring.slots() != ring.slots() {
                    // A resized ring is a new stream: start reading at its head.
                    state.shared.cursor = ring.head(&HostStore).unwrap_or(0);
                    state.shared.ring = ring;
                }
                state.router.reconfigure(cfg);
            }
            None => {
                // A new VM (or one reloaded after a failure) takes the ring from
                // whatever it still holds.
                let head = ring.head(&HostStore).unwrap_or(0);
                let cursor = head.saturating_sub(ring.slots() as u64);
                let seed = cfg.rng_seed.unwrap_or_else(host::random_seed);
                let mut state = State {
                    router: Router::new(cfg),
                    shared: SharedState {
                        ring,
                        inflight: InflightTable::new(KEY_PREFIX),
                        eviction: EvictionClock::new(KEY_PREFIX),
                        cursor,
                    },
                    rng: SplitMix64(seed),
                    metrics: Metrics::define(),
                    gate_inert_seen: 0,
                };
                state.catch_up();
                *slot = Some(state);
            }
        }
        if let Err(e) = hostcalls::set_tick_period(tick) {
            host::log(LogLevel::Warn, &format!("llm-router: no tick: {e:?}"));
        }
        true
    }

    fn on_tick(&mut self) {
        let mut slot = self.state.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return;
        };
        state.catch_up();
        let interval = state.router.config().eviction_interval_ms;
        if state
            .shared
            .eviction
            .claim(&HostStore, host::now_ms(), interval)
        {
            state.record(Op::Evict);
        }
        state
            .metrics
            .tree_chars
            .set(state.router.tree_chars() as u64);
        state.metrics.inflight.set(state.inflight().iter().sum());
        if let Some(prober) = self.prober.as_mut() {
            prober.tick(state, host::now_ms());
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream::new(self.state.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
