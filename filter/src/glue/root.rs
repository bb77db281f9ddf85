//! The root context: parses the plugin configuration, owns the VM's router and
//! in-flight counts, and runs periodic eviction on its tick.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType, LogLevel};

use super::host::{self, Metric};
use super::http::Stream;
use crate::config::Config;
use crate::decision::Label;
use crate::policy::SplitMix64;
use crate::router::Router;

/// Stats this VM reports. Envoy shows them as `wasmcustom.<name>` in `/stats` and
/// without the prefix in `/stats/prometheus`; same-named stats of all VMs are one.
pub struct Metrics {
    decisions: [Metric; Label::ALL.len()],
    pub no_worker: Metric,
    pub unreadable: Metric,
    pub tree_chars: Metric,
}

impl Metrics {
    fn define() -> Metrics {
        Metrics {
            decisions: Label::ALL
                .map(|l| Metric::counter(&format!("llm_router_decisions_{}", l.as_str()))),
            no_worker: Metric::counter("llm_router_no_worker"),
            unreadable: Metric::counter("llm_router_unreadable_body"),
            tree_chars: Metric::gauge("llm_router_tree_chars"),
        }
    }

    pub fn decision(&self, label: Label) {
        if let Some(pos) = Label::ALL.iter().position(|l| *l == label) {
            if let Some(m) = self.decisions.get(pos) {
                m.inc();
            }
        }
    }
}

/// Everything the streams of this VM share.
pub struct State {
    pub router: Router,
    /// Router-side in-flight requests per worker index, on this VM.
    pub inflight: Vec<u64>,
    pub rng: SplitMix64,
    pub metrics: Metrics,
}

pub type Shared = Rc<RefCell<Option<State>>>;

pub struct Root {
    state: Shared,
}

impl Root {
    pub fn new() -> Root {
        Root {
            state: Rc::new(RefCell::new(None)),
        }
    }
}

impl Context for Root {}

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
        let interval = Duration::from_millis(cfg.eviction_interval_ms);
        let workers = cfg.workers.len();
        let mut slot = self.state.borrow_mut();
        match slot.as_mut() {
            Some(state) => {
                state.router.reconfigure(cfg);
                state.inflight.resize(workers, 0);
            }
            None => {
                *slot = Some(State {
                    router: Router::new(cfg),
                    inflight: vec![0; workers],
                    rng: SplitMix64(host::random_seed()),
                    metrics: Metrics::define(),
                });
            }
        }
        if let Err(e) = hostcalls::set_tick_period(interval) {
            host::log(
                LogLevel::Warn,
                &format!("llm-router: no eviction tick: {e:?}"),
            );
        }
        true
    }

    fn on_tick(&mut self) {
        if let Some(state) = self.state.borrow_mut().as_mut() {
            state.router.evict();
            state
                .metrics
                .tree_chars
                .set(state.router.tree_chars() as u64);
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream::new(self.state.clone())))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}
