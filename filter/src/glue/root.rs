//! The root context: parses the plugin configuration, creates or reconfigures the
//! VM state, and on each tick catches up with the other VMs, claims the periodic
//! eviction, refreshes the gauges and runs the overload prober.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};

use super::host::{self, HostStore, Metric};
use super::hostcalls;
use super::prober::Prober;
use super::queues;
use super::relay;
use super::relayed::Relayed;
use super::seat;
use super::state::{Shared, State};
use super::stream::Stream;
use crate::background::worker_stats::worker_gauges;
use crate::config::{Config, ConfigError};
use crate::request::kv_bounds::KV_BOUNDS_INTERVAL_MS;
use crate::shared::{ensure_tables, Keys, Op, OpRing};
use crate::support::metric_names::{vm, vm_metric};

/// Takes the push token from the VM's environment when the config names a variable
/// (`stats_token_env`): Envoy sets it from `vm_config.environment_variables`.
fn with_env_token(mut cfg: Config) -> Result<Config, ConfigError> {
    let Some(var) = cfg.stats_token_env.as_deref() else {
        return Ok(cfg);
    };
    match std::env::var(var) {
        Ok(token) if !token.trim().is_empty() => {
            cfg.stats_token = Some(token.trim().to_string());
            Ok(cfg)
        }
        _ => Err(ConfigError {
            field: "stats_token_env".into(),
            rule: format!(
                "names `{var}`, which is unset or empty in the VM's environment (list it in \
                 `vm_config.environment_variables.host_env_keys` and set it for Envoy)"
            ),
        }),
    }
}

pub struct Root {
    state: Shared,
    /// When the last whole tick ran (or the configuration came): in `route_in:
    /// one_vm` the root context ticks more often, for the relay, than the rest of
    /// the tick needs.
    last_tick_ms: u64,
    /// The tick period set last (`relay::tick_period_ms`).
    tick_period_ms: u64,
    /// Created with the first configuration (it needs the host's entropy).
    prober: Option<Prober>,
    /// Defined on the first routing tick (it needs the host's entropy).
    vm_gauges: Option<VmGauges>,
}

/// This VM's own gauges (see `metric_names::VM_PREFIX`), for memory soaks.
struct VmGauges {
    memory_bytes: Metric,
    tree_chars: Metric,
}

impl VmGauges {
    fn define() -> VmGauges {
        let id = format!("{:08x}", host::random_seed() as u32);
        VmGauges {
            memory_bytes: Metric::gauge(&vm_metric(&id, vm::MEMORY_BYTES)),
            tree_chars: Metric::gauge(&vm_metric(&id, vm::TREE_CHARS)),
        }
    }
}

impl Root {
    pub fn new() -> Root {
        Root {
            state: Rc::new(RefCell::new(None)),
            last_tick_ms: 0,
            tick_period_ms: 0,
            prober: None,
            vm_gauges: None,
        }
    }

    /// The tick's work (`on_tick`): catching up, keeping this VM's counts fresh,
    /// eviction, the gauges, the replica export and the prober.
    fn tick(&mut self, now: u64) {
        let mut slot = self.state.borrow_mut();
        let Some(state) = slot.as_mut() else {
            return;
        };
        // The stats listener's instance only stores pushes: no tree, no probes.
        if state.router.config().stats_only {
            return;
        }
        state.shared.recent_ms.set(now);
        if state.serving() {
            state.catch_up();
            // What waits is shared within a tick, whatever the traffic.
            if !state.shared.outbox.is_empty() {
                state.flush();
            }
        } else {
            // No tree to catch up with, but the gauges below read the in-flight
            // counts riding on the head: a stale copy would write zeros over the
            // serving VMs' Envoy-wide values.
            state.shared.ring.head(&HostStore);
        }
        state.refresh_membership();
        // A lost generation stamp leaves a copy stale for one tick at most.
        state.shared.tables.clear();
        // This VM's counts stay fresh while it lives (`crate::shared::owned`).
        state
            .shared
            .inflight
            .refresh(&HostStore, &state.shared.ring, now);
        if state.router.config().uses_predicted_ttft() {
            // What this VM learned goes to the others, and theirs comes in.
            state.shared.costs.publish(&HostStore);
        }
        let interval = state.router.config().eviction_interval_ms;
        if state.shared.eviction.claim(&HostStore, now, interval) {
            state.record_now(&Op::Evict);
        }
        // Whatever `kv_capacity_bound` says: an engine's restart empties its share.
        // A VM without the tree has not counted what was routed since the last bound.
        if state.serving()
            && state
                .shared
                .kv_bounds
                .claim(&HostStore, now, KV_BOUNDS_INTERVAL_MS)
        {
            state.share_kv_bounds();
        }
        let vm_gauges = self.vm_gauges.get_or_insert_with(VmGauges::define);
        if state.serving() {
            let tree_chars = state.router.tree_chars() as u64;
            state.metrics.tree_chars.set(tree_chars);
            vm_gauges.tree_chars.set(tree_chars);
        }
        let pages = core::arch::wasm32::memory_size::<0>() as u64;
        vm_gauges.memory_bytes.set(pages * 65536);
        // One read of the shared tables serves the whole Envoy's in-flight gauge and
        // the per-worker ones.
        let loads = state.loads();
        state.metrics.inflight.set(loads.inflight.total());
        let mut gauges = worker_gauges(state.router.config(), &loads);
        if state.serving() {
            for (i, g) in gauges.iter_mut().enumerate() {
                g.tree = Some(state.router.tree_gauges(i));
            }
        }
        state.metrics.set_worker_gauges(&gauges);
        state.recycle(loads);
        super::replica::tick(state);
        if let Some(prober) = self.prober.as_mut() {
            prober.tick(state, host::now_ms());
        }
    }
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, headers: usize, body: usize, trailers: usize) {
        if queues::callout_answered(token, headers, body, trailers) {
            return;
        }
        let slot = self.state.borrow();
        let now = host::now_ms();
        if let (Some(state), Some(prober)) = (slot.as_ref(), self.prober.as_mut()) {
            prober.on_response(state, token, now);
        }
        // A probe's answer is rare: what it counted is handed over at once.
        host::flush_counters(true, now, true);
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
        let cfg = match Config::from_json(&bytes).and_then(with_env_token) {
            Ok(c) => c,
            Err(e) => {
                host::log(LogLevel::Error, &format!("llm-router: {e}"));
                return false;
            }
        };
        if cfg.stats_token.is_some() && !cfg.stats_only {
            host::log(
                LogLevel::Warn,
                "llm-router: this config routes and takes stats pushes, so every listener it is \
                 on answers pushes; give the stats listener its own config with `stats_only: true` \
                 and leave the token out of the client-facing one",
            );
        }
        let keys = Keys::default();
        let tick = Duration::from_millis(cfg.tick_ms());
        self.prober
            .get_or_insert_with(|| Prober::new(host::random_seed(), &keys))
            .configured(&cfg);
        // Before this VM takes requests: every read-modify-write is then a CAS update.
        ensure_tables(&HostStore, &keys, host::now_ms());
        let ring = OpRing::new(&keys, cfg.sync_ring_slots);
        ring.init_if_missing(&HostStore);
        let mut slot = self.state.borrow_mut();
        match slot.as_mut() {
            Some(state) => state.reconfigure(cfg, ring),
            None => *slot = Some(State::new(cfg, keys, ring)),
        }
        drop(slot);
        seat::join(&self.state, &bytes);
        // Whole ticks come every `tick_ms` from now, whatever the tick period.
        self.last_tick_ms = host::now_ms();
        let tick = self
            .state
            .borrow()
            .as_ref()
            .map_or(tick, |s| Duration::from_millis(relay::tick_period_ms(s)));
        self.tick_period_ms = tick.as_millis() as u64;
        if let Err(e) = hostcalls::set_tick_period(tick) {
            host::log(LogLevel::Warn, &format!("llm-router: no tick: {e:?}"));
        }
        true
    }

    fn on_tick(&mut self) {
        let now = host::now_ms();
        relay::tick(&self.state, now);
        let (whole, short) = self.state.borrow().as_ref().map_or((0, 0), |s| {
            (s.router.config().tick_ms(), relay::tick_period_ms(s))
        });
        // Whole ticks every `tick_ms` from the configuration, in phase whatever the
        // relay's shorter ticks did (a timer fires at or after its time).
        let due = self.last_tick_ms.saturating_add(whole);
        if now >= due {
            self.last_tick_ms = if now < due.saturating_add(whole) {
                due
            } else {
                now
            };
            self.tick(now);
        }
        let next = self.last_tick_ms.saturating_add(whole).saturating_sub(now);
        let period = short.min(next).max(1);
        if period != self.tick_period_ms {
            self.tick_period_ms = period;
            let _ = hostcalls::set_tick_period(Duration::from_millis(period));
        }
        // Whatever the VM counted since its last hand-over, the tick's own included:
        // at once when it holds no request, else when due (`crate::support::counters`).
        let idle = self
            .state
            .borrow()
            .as_ref()
            .is_none_or(State::holds_no_stream);
        host::flush_counters(idle, now, false);
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        if let Some(state) = self.state.borrow_mut().as_mut() {
            state.serve();
        }
        let stream = Stream::new(self.state.clone(), context_id);
        Some(Box::new(Relayed::new(stream)))
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        relay::on_queue_ready(queue_id);
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
