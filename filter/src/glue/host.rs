//! Small wrappers over hostcalls that never panic: failures are logged or ignored,
//! as fits a best-effort side channel (logs, metrics).

use proxy_wasm::hostcalls;
use proxy_wasm::types::{LogLevel, MetricType};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

pub fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// A seed from the host's entropy: std's `RandomState` draws from WASI `random_get`.
pub fn random_seed() -> u64 {
    RandomState::new().hash_one(0x5eed_u64)
}

/// A counter, defined once per VM (Envoy shares stats of the same name across VMs).
#[derive(Debug, Clone, Copy)]
pub struct Metric(Option<u32>);

impl Metric {
    pub fn counter(name: &str) -> Metric {
        Metric(hostcalls::define_metric(MetricType::Counter, name).ok())
    }

    pub fn gauge(name: &str) -> Metric {
        Metric(hostcalls::define_metric(MetricType::Gauge, name).ok())
    }

    pub fn inc(self) {
        if let Some(id) = self.0 {
            let _ = hostcalls::increment_metric(id, 1);
        }
    }

    pub fn set(self, value: u64) {
        if let Some(id) = self.0 {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}
