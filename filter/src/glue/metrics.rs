//! The stats this VM reports, defined once per VM by the names in
//! `crate::metric_names` (same-named stats of all VMs are one in Envoy).

use super::host::Metric;
use crate::bookkeeping::Booking;
use crate::decision::{Decision, Label, Reason};
use crate::metric_names as names;

/// Request-path stats.
pub struct Metrics {
    decisions: [Metric; Label::ALL.len()],
    pub no_worker: Metric,
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
    pub pd_pairs: Metric,
    pub pd_prefill_failures: Metric,
    pub overload_owner_filtered: Metric,
    /// `predicted_ttft`: the chosen worker's predicted TTFT, in ms.
    pub predicted_ttft_ms: Metric,
}

impl Metrics {
    pub fn define() -> Metrics {
        Metrics {
            decisions: Label::ALL.map(|l| Metric::counter(&names::decision_metric(l))),
            no_worker: Metric::counter(names::NO_WORKER),
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
            pd_pairs: Metric::counter(names::PD_PAIRS),
            pd_prefill_failures: Metric::counter(names::PD_PREFILL_FAILURES),
            overload_owner_filtered: Metric::counter(names::OVERLOAD_OWNER_FILTERED),
            predicted_ttft_ms: Metric::histogram(names::PREDICTED_TTFT_MS),
        }
    }

    /// Books one routed request: exactly one decision label, plus the gate's work
    /// of every pool that decided.
    pub fn book(&self, b: &Booking) {
        if let Some(pos) = Label::ALL.iter().position(|l| *l == b.labelled.label()) {
            if let Some(m) = self.decisions.get(pos) {
                m.inc();
            }
        }
        self.gate(b.labelled);
        if let Some(d) = b.gate_only {
            self.gate(d);
        }
        if b.pd_pair {
            self.pd_pairs.inc();
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
