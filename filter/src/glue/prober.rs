//! The prober: on every root tick, the VM holding the prober lease steps the
//! overload flags on the collector's latest latencies and the health table on its
//! reports (`super::health`), and probes each flagged or down worker every
//! `probe_interval_ms` with `dispatch_http_call`; the answer comes back to this
//! root context and steps both again. Every other VM only reads them (and writes a
//! failure it sees to the health table).
//!
//! A probe goes to the worker's own cluster. With `target: endpoint` the pool shares
//! one cluster, and a call to it could land on any engine, so only workers with a
//! `cluster` of their own are probed; the others recover on latency alone, and the
//! log says so once per configuration.

use std::time::Duration;

use proxy_wasm::types::{LogLevel, MapType};

use super::health;
use super::host::{self, HostStore};
use super::hostcalls;
use super::metrics::OverloadMetrics;
use super::state::State;
use crate::config::{probe_cluster, Config, OverloadConfig, WorkerConfig};
use crate::shared::{FlagTable, Keys, ProbeLease};
use crate::worker::health::Event as HealthEvent;
use crate::worker::overload::{observe_latencies, Event, Transition};

/// A probe waiting for its answer.
struct Pending {
    token: u32,
    worker: String,
}

pub struct Prober {
    /// This VM's identity in the lease.
    me: u64,
    lease: ProbeLease,
    flags: FlagTable,
    pending: Vec<Pending>,
    /// When each worker was last probed (by name).
    last_probe_ms: Vec<(String, u64)>,
    metrics: OverloadMetrics,
}

impl Prober {
    pub fn new(me: u64, keys: &Keys) -> Prober {
        Prober {
            me,
            lease: ProbeLease::new(keys),
            flags: FlagTable::new(keys),
            pending: Vec::new(),
            last_probe_ms: Vec::new(),
            metrics: OverloadMetrics::define(),
        }
    }

    /// Logs, once per configuration, the workers that cannot be probed.
    pub fn configured(&mut self, cfg: &Config) {
        if !cfg.overload.enabled {
            return;
        }
        let blind: Vec<&str> = cfg
            .workers
            .iter()
            .filter(|w| probe_cluster(cfg, w).is_none())
            .map(|w| w.name.as_str())
            .collect();
        if !blind.is_empty() {
            host::log(
                LogLevel::Warn,
                &format!(
                    "llm-router: overload probes cannot pick a host in the shared `target: endpoint` \
                     cluster; workers {blind:?} recover on latency alone (give a worker a `cluster` \
                     holding only its engine to have it probed)"
                ),
            );
        }
    }

    pub fn tick(&mut self, state: &State, now_ms: u64) {
        let cfg = state.router.config();
        let (overload, healthy) = (cfg.overload.enabled, cfg.health.enabled);
        if !overload {
            self.flags.clear(&HostStore);
            self.metrics.flagged.set(0);
        }
        if !healthy {
            health::clear(state);
        }
        if !overload && !healthy {
            self.pending.clear();
            return;
        }
        let ttl = OverloadConfig::lease_ms(cfg.tick_ms());
        if !self.lease.acquire(&HostStore, self.me, now_ms, ttl) {
            return;
        }
        let table = state.engine_loads();
        let mut probe_wanted = vec![false; cfg.workers.len()];
        if overload {
            let probe_ok: Vec<bool> = cfg
                .workers
                .iter()
                .map(|w| probe_cluster(cfg, w).is_some())
                .collect();
            let flips = self.flags.update(&HostStore, &cfg.workers, |f| {
                observe_latencies(
                    &mut f.0,
                    &table,
                    now_ms,
                    cfg.stale_after_ms,
                    &cfg.overload,
                    &probe_ok,
                )
            });
            self.book(&flips, cfg);
            let flags = self.flags.read(&HostStore, &cfg.workers);
            self.metrics.flagged.set(flags.count() as u64);
            probe_wanted = flags.overloaded();
        }
        if healthy {
            let down = health::tick(state, &table, now_ms);
            for (want, down) in probe_wanted.iter_mut().zip(down) {
                *want |= down;
            }
        }
        for (w, want) in cfg.workers.iter().zip(probe_wanted) {
            if let (true, Some(cluster)) = (want, probe_cluster(cfg, w)) {
                self.probe_if_due(state, w, cluster, now_ms);
            }
        }
    }

    fn probe_if_due(&mut self, state: &State, w: &WorkerConfig, cluster: &str, now_ms: u64) {
        let cfg = state.router.config();
        if self.pending.iter().any(|p| p.worker == w.name) {
            return;
        }
        let last = self
            .last_probe_ms
            .iter()
            .find(|(n, _)| *n == w.name)
            .map(|(_, t)| *t);
        if last.is_some_and(|t| now_ms.saturating_sub(t) < cfg.overload.probe_interval_ms) {
            return;
        }
        let o = &cfg.overload;
        let method = if o.probe_body.is_some() {
            "POST"
        } else {
            "GET"
        };
        let authority = w.address.as_deref().unwrap_or(w.name.as_str());
        let headers = vec![
            (":method", method),
            (":path", o.probe_path.as_str()),
            (":authority", authority),
            ("content-type", "application/json"),
            ("user-agent", "llm-router-probe"),
        ];
        let body = o.probe_body.as_deref().map(str::as_bytes);
        let timeout = Duration::from_millis(o.probe_timeout_ms);
        match hostcalls::dispatch_http_call(cluster, headers, body, vec![], timeout) {
            Ok(token) => self.pending.push(Pending {
                token,
                worker: w.name.clone(),
            }),
            Err(e) => {
                // The cluster is missing or the call was refused: the worker cannot
                // be shown healthy, so this is a failed probe.
                host::log(
                    LogLevel::Warn,
                    &format!(
                        "llm-router: cannot probe worker `{}` via cluster `{cluster}`: {e:?}",
                        w.name
                    ),
                );
                self.apply_probe(state, &w.name, false, now_ms);
            }
        }
        match self.last_probe_ms.iter_mut().find(|(n, _)| *n == w.name) {
            Some((_, t)) => *t = now_ms,
            None => self.last_probe_ms.push((w.name.clone(), now_ms)),
        }
    }

    /// A probe's answer (a timeout or reset arrives with no headers: a failure).
    pub fn on_response(&mut self, state: &State, token: u32, now_ms: u64) {
        let Some(pos) = self.pending.iter().position(|p| p.token == token) else {
            return;
        };
        let p = self.pending.swap_remove(pos);
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .and_then(|s| s.parse::<u32>().ok());
        let ok = status.is_some_and(|s| (200..300).contains(&s));
        self.apply_probe(state, &p.worker, ok, now_ms);
    }

    /// A probe's outcome steps the worker's overload flag and its health (each
    /// ignores it unless the worker is flagged or down there).
    fn apply_probe(&mut self, state: &State, worker: &str, ok: bool, now_ms: u64) {
        if ok {
            self.metrics.probes_ok.inc();
        } else {
            self.metrics.probes_failed.inc();
        }
        let cfg = state.router.config();
        let Some(index) = cfg.workers.iter().position(|w| w.name == worker) else {
            return;
        };
        if cfg.health.enabled {
            health::step(state, Some(index), now_ms, |_| {
                Some(HealthEvent::Probe { ok })
            });
        }
        if !cfg.overload.enabled {
            return;
        }
        let needed = cfg.overload.probes_needed(true);
        let flips = self.flags.update(&HostStore, &cfg.workers, |f| {
            f.0.get_mut(index)
                .and_then(|flag| flag.step(Event::Probe { ok }, now_ms, needed))
                .map(|t| vec![(index, t)])
                .unwrap_or_default()
        });
        self.book(&flips, cfg);
    }

    /// Counts and logs flips.
    fn book(&self, flips: &[(usize, Transition)], cfg: &Config) {
        for (i, t) in flips {
            let name = cfg.workers.get(*i).map_or("?", |w| w.name.as_str());
            match t {
                Transition::Entered(reason) => {
                    self.metrics.entered.inc();
                    host::log(
                        LogLevel::Info,
                        &format!(
                            "llm-router: worker `{name}` flagged overloaded ({} p90 at or over its threshold)",
                            reason.as_str()
                        ),
                    );
                }
                Transition::Recovered { after_ms } => {
                    self.metrics.recovered.inc();
                    host::log(
                        LogLevel::Info,
                        &format!(
                            "llm-router: worker `{name}` recovered after {:.1} s overloaded",
                            *after_ms as f64 / 1000.0
                        ),
                    );
                }
            }
        }
    }
}
