//! Worker health on the host: every finished routed stream is judged from what
//! Envoy says about it (`response.code`, `response.flags`, `response.code_details`;
//! see `crate::worker::health::classify`), and a failure takes its worker out on every
//! thread at once through the shared health table. The prober lease holder steps
//! the table on the collector's reports, on time and on probe answers
//! (`super::prober`).

use proxy_wasm::types::LogLevel;

use super::host::{self, HostStore};
use super::hostcalls;
use super::metrics::HealthMetrics;
use super::state::State;
use crate::config::{probe_cluster, Config};
use crate::load::LoadTable;
use crate::shared::HealthTable;
use crate::worker::health::{
    classify, report_event, served_by_callbacks, Event, Outcome, Recovery, Transition,
};

/// What a routed stream's response callbacks saw: its status (read only with health
/// on) and whether the response reached its end.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen {
    pub status: Option<u64>,
    pub complete: bool,
}

/// The response's `:status`, read once its headers arrive (health on only).
pub fn response_status(state: &State) -> Option<u64> {
    if !state.router.config().health.enabled {
        return None;
    }
    hostcalls::get_map_value(proxy_wasm::types::MapType::HttpResponseHeaders, ":status")
        .ok()
        .flatten()
        .and_then(|s| s.parse().ok())
}

/// An integer property (8 bytes little-endian, as Envoy encodes them).
fn int_property(path: &[&str]) -> Option<u64> {
    let bytes = hostcalls::get_property(path).ok()??;
    Some(u64::from_le_bytes(bytes.get(..8)?.try_into().ok()?))
}

/// What bringing worker `index` back takes: probes through its own cluster, or
/// (no cluster of its own) the hold time alone.
fn recovery(cfg: &Config, index: usize) -> Recovery {
    let probeable = cfg
        .workers
        .get(index)
        .is_some_and(|w| probe_cluster(cfg, w).is_some());
    if probeable {
        Recovery {
            probes_needed: cfg.health.probe_successes_to_recover,
            hold_ms: 0,
        }
    } else {
        Recovery {
            probes_needed: 0,
            hold_ms: cfg.health.unprobed_hold_ms,
        }
    }
}

/// Steps worker `index` (or every worker, for `None`) with `event(i)`, counting and
/// logging the flips.
pub fn step(
    state: &State,
    index: Option<usize>,
    now_ms: u64,
    event: impl Fn(usize) -> Option<Event>,
) -> Vec<(usize, Transition)> {
    let cfg = state.router.config();
    let table = HealthTable::new(&state.shared.keys);
    let flips = table.update(&HostStore, &cfg.workers, |s| {
        s.0.iter_mut()
            .enumerate()
            .filter(|(i, _)| index.is_none_or(|want| want == *i))
            .filter_map(|(i, h)| {
                let e = event(i)?;
                h.step(e, now_ms, recovery(cfg, i)).map(|t| (i, t))
            })
            .collect()
    });
    let metrics = HealthMetrics::define();
    for (i, t) in &flips {
        let name = cfg.workers.get(*i).map_or("?", |w| w.name.as_str());
        match t {
            Transition::Down(reason) => {
                metrics.down.inc();
                host::log(
                    LogLevel::Warn,
                    &format!(
                        "llm-router: worker `{name}` out of rotation ({}); probing it",
                        reason.as_str()
                    ),
                );
            }
            Transition::Up { after_ms } => {
                metrics.recovered.inc();
                host::log(
                    LogLevel::Info,
                    &format!(
                        "llm-router: worker `{name}` back in rotation after {:.1} s down",
                        *after_ms as f64 / 1000.0
                    ),
                );
            }
        }
    }
    flips
}

/// Judges a routed stream that just ended on `worker` and takes the worker out if
/// its upstream failed; whether it failed (never judged with health off: the
/// judgement costs property reads on every stream).
pub fn observe(state: &State, worker: &str, seen: Seen) -> bool {
    let cfg = state.router.config();
    if !cfg.health.enabled || served_by_callbacks(seen.status, seen.complete).is_some() {
        return false;
    }
    let flags = int_property(&["response", "flags"]).unwrap_or(0);
    let status = int_property(&["response", "code"]);
    // The details are a string; read them only when the flags alone do not decide.
    let details = if flags != 0 || status.is_some_and(|s| s >= 500) {
        hostcalls::get_property(&["response", "code_details"])
            .ok()
            .flatten()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    } else {
        "via_upstream".to_string()
    };
    let Outcome::Failed(reason) = classify(status, flags, &details) else {
        return false;
    };
    HealthMetrics::define().upstream_failures.inc();
    if let Some(index) = cfg.workers.iter().position(|w| w.name == worker) {
        step(state, Some(index), host::now_ms(), |_| {
            Some(Event::Failed(reason))
        });
    }
    true
}

/// The lease holder's tick: the collector's fresh reports and the passing of time;
/// returns which workers are down now, by index.
pub fn tick(state: &State, table: &LoadTable, now_ms: u64) -> Vec<bool> {
    let cfg = state.router.config();
    let stale = cfg.stale_after_ms;
    step(state, None, now_ms, |i| {
        Some(report_event(table, i, now_ms, stale).unwrap_or(Event::Tick))
    });
    let states = HealthTable::new(&state.shared.keys).read(&HostStore, &cfg.workers);
    HealthMetrics::define().down_now.set(states.count() as u64);
    states.down()
}

/// Health switched off: nothing stays out.
pub fn clear(state: &State) {
    HealthTable::new(&state.shared.keys).clear(&HostStore);
    HealthMetrics::define().down_now.set(0);
}
