//! Every stat the filter defines, by name, in one place: the glue defines them and
//! other tools (the demo report, dashboards) read them. Envoy shows them as
//! `wasmcustom.<name>` in `/stats` and without the prefix in `/stats/prometheus`;
//! same-named stats of all VMs are one.

use crate::decision::Label;

/// Decision counters are this prefix plus `Label::as_str()` (see `decision_metric`).
pub const DECISIONS_PREFIX: &str = "llm_router_decisions_";
/// Requests refused with a 503 because no worker could be chosen.
pub const NO_WORKER: &str = "llm_router_no_worker";
/// Bodies without routing text (routed by load).
pub const UNREADABLE_BODY: &str = "llm_router_unreadable_body";
/// Gauge: chars held by this VM's trees.
pub const TREE_CHARS: &str = "llm_router_tree_chars";
/// Gauge: in-flight requests of the whole Envoy, as the shared table says.
pub const INFLIGHT: &str = "llm_router_inflight";
/// Tree operations applied from the ring (all VMs together).
pub const SYNC_APPLIED: &str = "llm_router_sync_applied";
/// Operations a VM missed because it fell a whole ring behind.
pub const SYNC_GAPS: &str = "llm_router_sync_gaps";
/// Operations that could not be shared and were applied on one VM only.
pub const SYNC_APPEND_FAILURES: &str = "llm_router_sync_append_failures";
/// Histogram: chars of matched prefix a `cache_worker_queued` diversion abandoned.
pub const DIVERTED_OVERLAP_CHARS: &str = "llm_router_diverted_overlap_chars";
/// Owners the queue gate rejected.
pub const QUEUE_GATE_REJECTIONS: &str = "llm_router_queue_gate_rejections";
/// Owners admitted by the gate only because they had no fresh sample.
pub const QUEUE_GATE_UNSAMPLED: &str = "llm_router_queue_gate_unsampled";
pub const SATURATION_PINS: &str = "llm_router_saturation_pins";
/// Requests routed while the gate was set but no candidate had a fresh sample.
pub const QUEUE_GATE_INERT: &str = "llm_router_queue_gate_inert";
pub const STATS_PUSHES_ACCEPTED: &str = "llm_router_stats_pushes_accepted";
pub const STATS_PUSHES_REJECTED: &str = "llm_router_stats_pushes_rejected";
/// PD requests sent as a prefill and decode pair.
pub const PD_PAIRS: &str = "llm_router_pd_pairs";
/// PD prefill copies that could not be sent or failed.
pub const PD_PREFILL_FAILURES: &str = "llm_router_pd_prefill_failures";
/// Requests whose prefix owners were all filtered out as overloaded: logical cache
/// hits that became physical misses.
pub const OVERLOAD_OWNER_FILTERED: &str = "llm_router_overload_owner_filtered";
/// Histogram: `predicted_ttft`'s prediction for the chosen worker, in ms.
pub const PREDICTED_TTFT_MS: &str = "llm_router_predicted_ttft_ms";
/// Overload flips, counted on the prober lease holder only (once per Envoy).
pub const OVERLOAD_ENTERED: &str = "llm_router_overload_entered";
pub const OVERLOAD_RECOVERED: &str = "llm_router_overload_recovered";
/// Gauge: workers flagged now.
pub const OVERLOAD_FLAGGED: &str = "llm_router_overload_flagged";
pub const OVERLOAD_PROBES_OK: &str = "llm_router_overload_probes_ok";
pub const OVERLOAD_PROBES_FAILED: &str = "llm_router_overload_probes_failed";

/// The counter of one decision label, e.g. `llm_router_decisions_cache_hit`.
pub fn decision_metric(label: Label) -> String {
    format!("{DECISIONS_PREFIX}{}", label.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_counters_are_named_by_label() {
        let names: Vec<String> = Label::ALL.iter().map(|l| decision_metric(*l)).collect();
        assert_eq!(
            names,
            [
                "llm_router_decisions_cache_hit",
                "llm_router_decisions_cache_miss",
                "llm_router_decisions_cache_worker_queued",
                "llm_router_decisions_all_queued",
            ]
        );
    }
}
