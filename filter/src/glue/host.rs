//! Small wrappers over hostcalls that never panic: failures are logged or ignored,
//! as fits a best-effort side channel (logs, metrics, entropy, the clock), and the
//! host's shared data as the core's `SharedStore`.

use super::hostcalls;
use crate::support::counters::CounterBatch;
use proxy_wasm::types::{LogLevel, MapType, MetricType};
use std::cell::RefCell;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

pub fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// A seed from the host's entropy: std's `RandomState` draws from WASI `random_get`.
pub fn random_seed() -> u64 {
    RandomState::new().hash_one(0x5eed_u64)
}

#[link(wasm_import_module = "wasi_snapshot_preview1")]
extern "C" {
    /// WASI's entropy source; Envoy fills it from its own random generator.
    fn random_get(buf: *mut u8, buf_len: usize) -> i32;
}

/// One value from the host's entropy (each PD room must be unguessable and unique
/// across threads and Envoys); `None` if the host refuses (see `crate::rng::Rooms`).
pub fn entropy() -> Option<u64> {
    let mut buf = [0u8; 8];
    // SAFETY: the host writes exactly `buf.len()` bytes into `buf`.
    let errno = unsafe { random_get(buf.as_mut_ptr(), buf.len()) };
    (errno == 0).then(|| u64::from_le_bytes(buf))
}

thread_local! {
    /// This VM's counter increments not yet handed to the host.
    static COUNTERS: RefCell<CounterBatch> = RefCell::new(CounterBatch::default());
}

/// A request ended: its counter increments are handed over with the others' if they
/// are due (`flush_counters`).
pub fn request_ended(idle: bool, now_ms: u64) {
    COUNTERS.with(|c| c.borrow_mut().request_ended());
    flush_counters(idle, now_ms, false);
}

/// Hands this VM's summed counter increments to the host if they are due
/// (`crate::support::counters`; `idle`: the VM holds no request), or whatever the time
/// (`force`: a probe's answer).
pub fn flush_counters(idle: bool, now_ms: u64, force: bool) {
    let taken = COUNTERS.with(|c| {
        let mut c = c.borrow_mut();
        (force || c.due(idle, now_ms)).then(|| c.take(now_ms))
    });
    for (id, n) in taken.into_iter().flatten() {
        // Envoy rejects non-positive increments.
        if let Ok(n @ 1..) = i64::try_from(n) {
            let _ = hostcalls::increment_metric(id, n);
        }
    }
}

/// A metric, defined once per VM (Envoy shares stats of the same name across VMs).
#[derive(Debug, Clone, Copy)]
pub struct Metric {
    id: Option<u32>,
    kind: MetricType,
    /// A counter's place in this VM's batch (`crate::support::counters::CounterBatch`).
    slot: u32,
}

impl Metric {
    fn define(kind: MetricType, name: &str) -> Metric {
        let id = hostcalls::define_metric(kind, name).ok();
        let slot = match (id, kind) {
            (Some(id), MetricType::Counter) => COUNTERS.with(|c| c.borrow_mut().slot(id)),
            _ => 0,
        };
        Metric { id, kind, slot }
    }

    pub fn counter(name: &str) -> Metric {
        Metric::define(MetricType::Counter, name)
    }

    pub fn gauge(name: &str) -> Metric {
        Metric::define(MetricType::Gauge, name)
    }

    /// Buckets are Envoy's (`stats_config.histogram_bucket_settings`).
    pub fn histogram(name: &str) -> Metric {
        Metric::define(MetricType::Histogram, name)
    }

    pub fn inc(self) {
        self.add(1);
    }

    /// A counter's increment waits in the VM for `flush_counters`; zero is skipped.
    pub fn add(self, n: u64) {
        match (self.id, self.kind) {
            (Some(_), MetricType::Counter) if n > 0 => {
                COUNTERS.with(|c| c.borrow_mut().add(self.slot, n));
            }
            (Some(id), _) => {
                if let Ok(n @ 1..) = i64::try_from(n) {
                    let _ = hostcalls::increment_metric(id, n);
                }
            }
            (None, _) => {}
        }
    }

    /// A gauge's value, or a histogram observation.
    pub fn set(self, value: u64) {
        if let Some(id) = self.id {
            let _ = hostcalls::record_metric(id, value);
        }
    }
}

/// Proxy-wasm shared data as the core's `SharedStore`.
pub struct HostStore;

impl crate::shared::SharedStore for HostStore {
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        match hostcalls::get_shared_data(key) {
            Ok((Some(value), Some(cas))) => Some((value, cas)),
            _ => None,
        }
    }

    /// Not `get`'s: an empty value comes back as no bytes, which `get` reads as
    /// missing, and the tables' bell is an empty value.
    fn version(&self, key: &str) -> Option<u32> {
        hostcalls::get_shared_data(key)
            .ok()
            .and_then(|(_, cas)| cas)
    }

    fn set(&self, key: &str, value: &[u8], cas: u32) -> crate::shared::SetOutcome {
        use crate::shared::SetOutcome;
        let cas = (cas != 0).then_some(cas);
        let outcome = match hostcalls::set_shared_data(key, Some(value), cas) {
            Ok(()) => SetOutcome::Stored,
            Err(proxy_wasm::types::Status::CasMismatch) => SetOutcome::CasMismatch,
            Err(_) => SetOutcome::Failed,
        };
        // Every VM's copy of the cached tables follows this write.
        let keys = crate::shared::Keys::default();
        crate::shared::stamp_after_write(self, &keys, key, outcome);
        outcome
    }
}

/// Milliseconds since the epoch from the host clock (0 if unavailable).
pub fn now_ms() -> u64 {
    hostcalls::current_time_ns().map_or(0, |ns| ns / 1_000_000)
}

/// A request header's value (empty when missing or unreadable).
pub fn request_header(name: &str) -> String {
    hostcalls::get_map_value(MapType::HttpRequestHeaders, name)
        .ok()
        .flatten()
        .unwrap_or_default()
}
