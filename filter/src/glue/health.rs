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
use crate::shared::{HealthStates, HealthTable};
use crate::worker::health::{
    cap_has_room, classify, report_event, served_by_callbacks, DownReason, Event, Health, Outcome,
    Rules, Transition,
};

/// What a routed stream's response callbacks saw: its status (read only with health
/// on) and whether the response reached its end; and whether its request was one
/// a failure would be judged on (`judged`: a body the filter read, within
/// `health.judged_body_bytes`) and when it was routed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Seen {
    pub status: Option<u64>,
    pub complete: bool,
    pub judged: bool,
    pub routed_ms: u64,
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

/// The rules for worker `index` given every worker's health now: probes through
/// its own cluster, or (no cluster of its own) the hold time alone; and whether its
/// pool's cap has room for one more out.
fn rules(cfg: &Config, states: &HealthStates, index: usize) -> Rules {
    let h = &cfg.health;
    let pool = cfg.workers.get(index).map(|w| w.pool);
    let (mut size, mut down) = (0, 0);
    for (w, s) in cfg.workers.iter().zip(&states.0) {
        if Some(w.pool) == pool {
            size += 1;
            down += usize::from(s.is_down());
        }
    }
    let probeable = cfg
        .workers
        .get(index)
        .is_some_and(|w| probe_cluster(cfg, w).is_some());
    Rules {
        consecutive_failures: h.consecutive_failures,
        room: cap_has_room(down, size, h.max_ejection_percent),
        probes_needed: if probeable {
            h.probe_successes_to_recover
        } else {
            0
        },
        hold_ms: if probeable { 0 } else { h.unprobed_hold_ms },
        backoff_ms: h.backoff_ms,
        max_backoff_ms: h.max_backoff_ms,
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
    let mut capped = 0;
    let flips = table.update(&HostStore, &cfg.workers, |s| {
        let mut flips = Vec::new();
        capped = 0;
        for i in 0..s.0.len() {
            if index.is_some_and(|want| want != i) {
                continue;
            }
            let Some(e) = event(i) else {
                continue;
            };
            // The cap counts the workers out as this step finds them.
            let r = rules(cfg, s, i);
            let Some(h) = s.0.get_mut(i) else {
                continue;
            };
            match h.step(e, now_ms, r) {
                Some(t) => flips.push((i, t)),
                None => capped += u64::from(held_by_cap(h, e, r)),
            }
        }
        flips
    });
    let metrics = HealthMetrics::define();
    if capped > 0 {
        metrics.capped.add(capped);
    }
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

/// Whether a failure left `h` in rotation only because its pool's cap had no room.
fn held_by_cap(h: &Health, e: Event, r: Rules) -> bool {
    let run = matches!(e, Event::Failed(reason) if reason != DownReason::ConnectFailure);
    let long = matches!(h, Health::Watched { failures, .. } if *failures >= r.consecutive_failures);
    run && long && !r.room
}

/// Judges a routed stream that just ended on `worker`: a failure on evidence about
/// the engine steps its health (out at once for a refused connect, else after a run;
/// see `crate::worker::health`), and a served request clears the record of a worker
/// that has one. Returns whether the upstream failed (never judged with health off:
/// the judgement costs property reads on every stream).
pub fn observe(state: &State, worker: &str, seen: Seen) -> bool {
    let cfg = state.router.config();
    if !cfg.health.enabled {
        return false;
    }
    let outcome = match served_by_callbacks(seen.status, seen.complete) {
        Some(o) => o,
        None => judge(),
    };
    let index = cfg.workers.iter().position(|w| w.name == worker);
    match outcome {
        Outcome::Failed(reason) => {
            HealthMetrics::define().upstream_failures.inc();
            // A refused connect is the engine's whatever the request was.
            let counts = seen.judged || reason == DownReason::ConnectFailure;
            if !counts {
                HealthMetrics::define().unjudged.inc();
            }
            if let (true, Some(i)) = (counts, index) {
                step(state, Some(i), host::now_ms(), |_| {
                    Some(Event::Failed(reason))
                });
            }
            true
        }
        Outcome::Served => {
            if let Some(i) = index.filter(|i| tracked(state, *i)) {
                let served = Event::Served {
                    routed_ms: seen.routed_ms,
                };
                step(state, Some(i), host::now_ms(), |_| Some(served));
            }
            false
        }
        Outcome::NoVerdict => false,
    }
}

/// Whether worker `index` has a health record, as this VM's copy of the tables says
/// (a copy at most one tick old; no read while nothing changed).
fn tracked(state: &State, index: usize) -> bool {
    let s = &state.shared;
    let cfg = state.router.config();
    let tables = s.tables.tables(
        &HostStore,
        &s.keys,
        (cfg, state.router.names()),
        s.ring.generation(),
    );
    tables.tracked.get(index).copied().unwrap_or(false)
}

/// `classify` on the properties Envoy keeps for the stream.
fn judge() -> Outcome {
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
    classify(status, flags, &details)
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
