//! The stats this VM reports, defined once per VM by the names in
//! `crate::support::metric_names` (same-named stats of all VMs are one in Envoy).

use std::cell::Cell;

use super::host::Metric;
use crate::background::worker_stats::WorkerGauges;
use crate::config::Config;
use crate::decision::{Decision, Label, Reason};
use crate::request::bookkeeping::Booking;
use crate::support::metric_names::{self as names, worker, worker_metric};

/// Request-path stats.
pub struct Metrics {
    decisions: [Metric; Label::ALL.len()],
    reasons: [Metric; Reason::ALL.len()],
    /// By worker index of the current configuration.
    workers: Vec<WorkerMetrics>,
    pub no_worker: Metric,
    pub unserved: Metric,
    pub relay_answered: Metric,
    pub relay_late: Metric,
    pub relay_takeovers: Metric,
    pub unreadable: Metric,
    pub tree_chars: Metric,
    /// In-flight requests of the whole Envoy (each VM's tick writes the same value).
    pub inflight: Metric,
    pub sync_applied: Metric,
    pub sync_gaps: Metric,
    pub sync_append_failures: Metric,
    diverted_overlap: Metric,
    gate_rejections: Metric,
    gate_unsampled: Metric,
    saturation_pins: Metric,
    pub gate_inert: Metric,
    pub pushes_accepted: Metric,
    pub pushes_rejected: Metric,
    pub membership_updates: Metric,
    workers_known: Metric,
    workers_leaving: Metric,
    pub pd_pairs: Metric,
    pub pd_prefill_failures: Metric,
    pub overload_owner_filtered: Metric,
    /// `predicted_ttft`: the chosen worker's predicted TTFT, in ms.
    pub predicted_ttft_ms: Metric,
    pub kv_bounds_shared: Metric,
    pub engine_restarts: Metric,
    pub kv_match_ranked: Metric,
    pub kv_match_partial: Metric,
    pub kv_match_deferred: Metric,
    pub kv_match_unanswered: Metric,
    pub kv_match_refused: Metric,
}

/// One worker's stats (`llm_router_worker.<name>.<field>`).
struct WorkerMetrics {
    name: String,
    routed: Metric,
    /// By `Label::ALL` position.
    decisions: [Metric; Label::ALL.len()],
    matched_chars: Metric,
    routed_chars: Metric,
    /// In `worker::GAUGES` order.
    gauges: [Metric; worker::GAUGES.len()],
    /// The values this VM last gave `gauges`: a tick writes only what changed. Each
    /// write is a hostcall, and a fleet of 256 made 1,536 of them a tick per VM. Every
    /// VM writes the same Envoy-wide values, so a value another VM wrote meanwhile is
    /// set right by that VM's next tick.
    last: [Cell<Option<u64>>; worker::GAUGES.len()],
}

impl WorkerMetrics {
    fn define(name: &str) -> WorkerMetrics {
        WorkerMetrics {
            name: name.to_string(),
            routed: Metric::counter(&worker_metric(name, worker::ROUTED)),
            decisions: Label::ALL.map(|l| {
                let field = format!("{}{}", worker::DECISIONS_PREFIX, l.as_str());
                Metric::counter(&worker_metric(name, &field))
            }),
            matched_chars: Metric::counter(&worker_metric(name, worker::MATCHED_CHARS)),
            routed_chars: Metric::counter(&worker_metric(name, worker::ROUTED_CHARS)),
            gauges: worker::GAUGES.map(|f| Metric::gauge(&worker_metric(name, f))),
            last: Default::default(),
        }
    }
}

impl Metrics {
    pub fn define(cfg: &Config) -> Metrics {
        let mut m = Metrics {
            decisions: Label::ALL.map(|l| Metric::counter(&names::decision_metric(l))),
            reasons: Reason::ALL.map(|r| Metric::counter(&names::reason_metric(r))),
            workers: Vec::new(),
            no_worker: Metric::counter(names::NO_WORKER),
            unserved: Metric::counter(names::UNSERVED),
            relay_answered: Metric::counter(names::RELAY_ANSWERED),
            relay_late: Metric::counter(names::RELAY_LATE),
            relay_takeovers: Metric::counter(names::RELAY_TAKEOVERS),
            unreadable: Metric::counter(names::UNREADABLE_BODY),
            tree_chars: Metric::gauge(names::TREE_CHARS),
            inflight: Metric::gauge(names::INFLIGHT),
            sync_applied: Metric::counter(names::SYNC_APPLIED),
            sync_gaps: Metric::counter(names::SYNC_GAPS),
            sync_append_failures: Metric::counter(names::SYNC_APPEND_FAILURES),
            diverted_overlap: Metric::histogram(names::DIVERTED_OVERLAP_CHARS),
            gate_rejections: Metric::counter(names::QUEUE_GATE_REJECTIONS),
            gate_unsampled: Metric::counter(names::QUEUE_GATE_UNSAMPLED),
            saturation_pins: Metric::counter(names::SATURATION_PINS),
            gate_inert: Metric::counter(names::QUEUE_GATE_INERT),
            pushes_accepted: Metric::counter(names::STATS_PUSHES_ACCEPTED),
            pushes_rejected: Metric::counter(names::STATS_PUSHES_REJECTED),
            membership_updates: Metric::counter(names::MEMBERSHIP_UPDATES),
            workers_known: Metric::gauge(names::WORKERS),
            workers_leaving: Metric::gauge(names::WORKERS_LEAVING),
            pd_pairs: Metric::counter(names::PD_PAIRS),
            pd_prefill_failures: Metric::counter(names::PD_PREFILL_FAILURES),
            overload_owner_filtered: Metric::counter(names::OVERLOAD_OWNER_FILTERED),
            predicted_ttft_ms: Metric::histogram(names::PREDICTED_TTFT_MS),
            kv_bounds_shared: Metric::counter(names::KV_BOUNDS_SHARED),
            engine_restarts: Metric::counter(names::ENGINE_RESTARTS),
            kv_match_ranked: Metric::counter(names::KV_MATCH_RANKED),
            kv_match_partial: Metric::counter(names::KV_MATCH_PARTIAL),
            kv_match_deferred: Metric::counter(names::KV_MATCH_DEFERRED),
            kv_match_unanswered: Metric::counter(names::KV_MATCH_UNANSWERED),
            kv_match_refused: Metric::counter(names::KV_MATCH_REFUSED),
        };
        m.reconfigure(cfg);
        m
    }

    /// Per-worker stats for `cfg`'s workers (Envoy returns the same stat for a name
    /// defined again, so a worker that stays keeps its counts).
    fn define_workers(cfg: &Config) -> Vec<WorkerMetrics> {
        cfg.workers
            .iter()
            .map(|w| WorkerMetrics::define(&w.name))
            .collect()
    }

    /// Follows a new configuration's worker list.
    pub fn reconfigure(&mut self, cfg: &Config) {
        // A worker that left leaves no stale gauge (in flight, flags) behind.
        for gone in self
            .workers
            .iter()
            .filter(|m| !cfg.workers.iter().any(|w| w.name == m.name))
        {
            for g in &gone.gauges {
                g.set(0);
            }
        }
        self.workers = Self::define_workers(cfg);
        self.workers_known.set(cfg.workers.len() as u64);
        let leaving = cfg.workers.iter().filter(|w| !w.routable()).count();
        self.workers_leaving.set(leaving as u64);
    }

    /// Books one routed request: exactly one decision label and reason, the workers
    /// it went to, the labelled decision's match over `text_chars` chars of routing
    /// text, plus the gate's work of every pool that decided.
    pub fn book(&self, b: &Booking, text_chars: usize) {
        let d = b.labelled;
        let label = Label::ALL.iter().position(|l| *l == d.label());
        if let Some(m) = label.and_then(|pos| self.decisions.get(pos)) {
            m.inc();
        }
        if let Some(pos) = Reason::ALL.iter().position(|r| *r == d.reason) {
            if let Some(m) = self.reasons.get(pos) {
                m.inc();
            }
        }
        if let Some(w) = self.workers.get(d.worker as usize) {
            w.routed.inc();
            if let Some(m) = label.and_then(|pos| w.decisions.get(pos)) {
                m.inc();
            }
            w.matched_chars.add(d.matched_chars as u64);
            w.routed_chars.add(text_chars as u64);
        }
        self.gate(d);
        if let Some(g) = b.gate_only {
            if let Some(w) = self.workers.get(g.worker as usize) {
                w.routed.inc();
            }
            self.gate(g);
        }
        if b.pd_pair {
            self.pd_pairs.inc();
        }
    }

    /// The per-worker gauges of one tick.
    pub fn set_worker_gauges(&self, gauges: &[WorkerGauges]) {
        for (w, g) in self.workers.iter().zip(gauges) {
            for ((m, last), v) in w.gauges.iter().zip(&w.last).zip(g.values()) {
                let Some(v) = v else { continue };
                if last.replace(Some(v)) != Some(v) {
                    m.set(v);
                }
            }
        }
    }

    /// What the gate did for one decision.
    fn gate(&self, d: &Decision) {
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

/// Overload stats; the transition counters move on the lease holder only, so each
/// flip is counted once per Envoy.
pub struct OverloadMetrics {
    pub entered: Metric,
    pub recovered: Metric,
    /// Workers flagged now.
    pub flagged: Metric,
    pub probes_ok: Metric,
    pub probes_failed: Metric,
}

impl OverloadMetrics {
    pub fn define() -> OverloadMetrics {
        OverloadMetrics {
            entered: Metric::counter(names::OVERLOAD_ENTERED),
            recovered: Metric::counter(names::OVERLOAD_RECOVERED),
            flagged: Metric::gauge(names::OVERLOAD_FLAGGED),
            probes_ok: Metric::counter(names::OVERLOAD_PROBES_OK),
            probes_failed: Metric::counter(names::OVERLOAD_PROBES_FAILED),
        }
    }
}

/// Health stats: a worker going down is counted by the VM whose CAS flipped it, a
/// recovery by the prober lease holder, so each flip is counted once per Envoy.
pub struct HealthMetrics {
    pub down: Metric,
    pub recovered: Metric,
    /// Workers down now (set on the lease holder's tick).
    pub down_now: Metric,
    pub upstream_failures: Metric,
    pub unjudged: Metric,
    pub capped: Metric,
}

impl HealthMetrics {
    pub fn define() -> HealthMetrics {
        HealthMetrics {
            down: Metric::counter(names::HEALTH_DOWN),
            recovered: Metric::counter(names::HEALTH_RECOVERED),
            down_now: Metric::gauge(names::HEALTH_DOWN_NOW),
            upstream_failures: Metric::counter(names::UPSTREAM_FAILURES),
            unjudged: Metric::counter(names::UPSTREAM_FAILURES_UNJUDGED),
            capped: Metric::counter(names::HEALTH_CAPPED),
        }
    }
}

/// The replica bridge endpoint's counters (`super::replica`).
pub struct ReplicaMetrics {
    pub exported: Metric,
    pub imported: Metric,
    pub skipped: Metric,
    pub export_gaps: Metric,
    pub refused: Metric,
    pub peers: Metric,
}

impl ReplicaMetrics {
    pub fn define() -> ReplicaMetrics {
        ReplicaMetrics {
            exported: Metric::counter(names::REPLICA_OPS_EXPORTED),
            imported: Metric::counter(names::REPLICA_OPS_IMPORTED),
            skipped: Metric::counter(names::REPLICA_OPS_SKIPPED),
            export_gaps: Metric::counter(names::REPLICA_EXPORT_GAPS),
            refused: Metric::counter(names::REPLICA_REQUESTS_REFUSED),
            peers: Metric::gauge(names::REPLICA_PEERS),
        }
    }
}
