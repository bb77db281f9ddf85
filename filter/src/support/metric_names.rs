//! Every stat the filter defines, by name, in one place: the glue defines them and
//! other tools (the demo report, dashboards) read them. Envoy shows them as
//! `wasmcustom.<name>` in `/stats` and without the prefix in `/stats/prometheus`;
//! same-named stats of all VMs are one.
//!
//! Proxy-wasm stats carry no labels; dimensions (decision, reason, worker) are parts
//! of the name, and Envoy's tag extraction ([`STATS_TAGS`], in the example configs'
//! `stats_config.stats_tags`) turns them into Prometheus labels:
//! `llm_router_decisions_cache_hit` is `llm_router_decisions{decision="cache_hit"}`,
//! `llm_router_worker.w0.routed` is `llm_router_worker_routed{worker="w0"}`.

use crate::decision::{Label, Reason};

/// Decision counters are this prefix plus `Label::as_str()` (see `decision_metric`).
pub const DECISIONS_PREFIX: &str = "llm_router_decisions_";
/// Routed requests no engine served (the upstream failed, or the filter answered
/// after routing): their decisions were counted when made, their tree records are
/// undone. Served requests are the decisions minus these.
pub const UNSERVED: &str = "llm_router_unserved";
/// `route_in: one_vm`: requests the routing VM decided for another VM.
pub const RELAY_ANSWERED: &str = "llm_router_relay_answered";
/// `route_in: one_vm`: requests whose answer did not come back within
/// `relay_deadline_ms` (or could not be asked): routed by their own VM, by load.
pub const RELAY_LATE: &str = "llm_router_relay_late";
/// `route_in: one_vm`: a VM took the seat over from a routing VM that stopped.
pub const RELAY_TAKEOVERS: &str = "llm_router_relay_takeovers";
/// `kv_match`: decisions the engines' match made (every candidate's index whole).
pub const KV_MATCH_RANKED: &str = "llm_router_kv_match_ranked";
/// `kv_match`: answers covering every candidate that left the decision to the
/// tree (the engines hold less than the threshold where the tree misses too, or
/// hold nothing of the prompt, or the fleet was imbalanced).
pub const KV_MATCH_DEFERRED: &str = "llm_router_kv_match_deferred";
/// `kv_match`: answers that left a candidate out (an index not whole, a worker the
/// collector does not follow): the tree decided.
pub const KV_MATCH_PARTIAL: &str = "llm_router_kv_match_partial";
/// `kv_match`: questions with no answer from the collector: none within
/// `kv_match.timeout_ms`, Envoy's 503 without a healthy collector, a call that
/// could not be sent (an unknown cluster): the tree decided.
pub const KV_MATCH_UNANSWERED: &str = "llm_router_kv_match_unanswered";
/// `kv_match`: answers that were not a match (the collector's 4xx: a body without a
/// prompt, an API its tokenizer does not read; a 200 that is not its JSON): the
/// tree decided.
pub const KV_MATCH_REFUSED: &str = "llm_router_kv_match_refused";
/// Every `kv_match` outcome above, as the reports list them.
pub const KV_MATCH_COUNTERS: [&str; 5] = [
    KV_MATCH_RANKED,
    KV_MATCH_DEFERRED,
    KV_MATCH_PARTIAL,
    KV_MATCH_UNANSWERED,
    KV_MATCH_REFUSED,
];
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
/// Discovery mode: worker list changes taken from collector pushes (joins, leaves,
/// removals, changed fields).
pub const MEMBERSHIP_UPDATES: &str = "llm_router_membership_updates";
/// Gauge: workers known (discovered or configured, leaving ones included).
pub const WORKERS: &str = "llm_router_workers";
/// Gauge: discovered workers leaving (no new requests, tenants kept for the grace).
pub const WORKERS_LEAVING: &str = "llm_router_workers_leaving";
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
/// Workers taken out after a failure (counted by the VM that saw it flip) and
/// brought back by probes (counted on the prober lease holder).
pub const HEALTH_DOWN: &str = "llm_router_health_down";
pub const HEALTH_RECOVERED: &str = "llm_router_health_recovered";
/// Gauge: workers down now.
pub const HEALTH_DOWN_NOW: &str = "llm_router_health_down_now";
/// Finished requests whose upstream failed (connect failure, reset, timeout, 5xx).
pub const UPSTREAM_FAILURES: &str = "llm_router_upstream_failures";
/// Of those, the ones after a request the client made unusual (a body with no text
/// the filter can read, or over `health.judged_body_bytes`): not counted against
/// the engine.
pub const UPSTREAM_FAILURES_UNJUDGED: &str = "llm_router_upstream_failures_unjudged";
/// Failures that made a run long enough to take a worker out while its pool's cap
/// (`health.max_ejection_percent`) held it in rotation.
pub const HEALTH_CAPPED: &str = "llm_router_health_capped";

/// Replica bridge (`crate::background::replica`): local inserts exported to the bridge.
pub const REPLICA_OPS_EXPORTED: &str = "llm_router_replica_ops_exported";
/// Peer inserts imported into the ring.
pub const REPLICA_OPS_IMPORTED: &str = "llm_router_replica_ops_imported";
/// Peer inserts naming a worker this replica does not configure.
pub const REPLICA_OPS_SKIPPED: &str = "llm_router_replica_ops_skipped";
/// Local inserts the ring overwrote before the bridge exported them.
pub const REPLICA_EXPORT_GAPS: &str = "llm_router_replica_export_gaps";
/// Requests to the replicas endpoint refused (token, method, shape, size).
pub const REPLICA_REQUESTS_REFUSED: &str = "llm_router_replica_requests_refused";
/// Gauge: peer replicas whose in-flight report is fresh (0: alone, or the bus is
/// down).
pub const REPLICA_PEERS: &str = "llm_router_replica_peers";
/// Engines' KV bounds shared through the operation stream
/// (`crate::request::kv_bounds`), once per Envoy.
pub const KV_BOUNDS_SHARED: &str = "llm_router_kv_bounds_shared";
/// Engines whose prompt-token counter went back (a restart): their share of the
/// trees was dropped, once per Envoy.
pub const ENGINE_RESTARTS: &str = "llm_router_engine_restarts";

/// The counter of one decision label, e.g. `llm_router_decisions_cache_hit`.
pub fn decision_metric(label: Label) -> String {
    format!("{DECISIONS_PREFIX}{}", label.as_str())
}

/// Per-reason counters are this prefix plus `Reason::as_str()` (one per routed
/// request, the labelled decision's reason, so they sum like the decisions).
pub const REASONS_PREFIX: &str = "llm_router_reasons_";

/// The counter of one reason, e.g. `llm_router_reasons_imbalanced`.
pub fn reason_metric(reason: Reason) -> String {
    format!("{REASONS_PREFIX}{}", reason.as_str())
}

/// Per-worker stats are `llm_router_worker.<worker>.<field>`, fields below.
pub const WORKER_PREFIX: &str = "llm_router_worker.";

/// The fields of a worker's stats.
pub mod worker {
    /// Counter: requests routed to the worker (PD: both legs count, each on its own
    /// worker).
    pub const ROUTED: &str = "routed";
    /// Counters: requests labelled on the worker, this prefix plus the label
    /// (`decisions_cache_hit`): with the tag rules, `llm_router_worker_decisions
    /// {worker, decision}`, so hit rates are per worker too.
    pub const DECISIONS_PREFIX: &str = "decisions_";
    /// Counter: chars of routing text the tree matched for requests labelled on the
    /// worker; with `ROUTED_CHARS`, the cached-prefix share.
    pub const MATCHED_CHARS: &str = "matched_chars";
    /// Counter: chars of routing text of requests labelled on the worker.
    pub const ROUTED_CHARS: &str = "routed_chars";
    /// Gauge: the router's in-flight requests on the worker (the whole Envoy).
    pub const INFLIGHT: &str = "inflight";
    /// Gauge: 1 while the worker is flagged overloaded.
    pub const OVERLOADED: &str = "overloaded";
    /// Gauge: 1 while the collector's last report says it could not scrape the engine.
    pub const UNREACHABLE: &str = "unreachable";
    /// Gauges from the collector's last sample (0 when none is fresh).
    pub const ENGINE_WAITING: &str = "engine_waiting";
    pub const ENGINE_RUNNING: &str = "engine_running";
    /// KV cache usage in percent (0-100).
    pub const ENGINE_KV_USAGE_PCT: &str = "engine_kv_usage_pct";
    /// The KV cache's capacity in tokens, as the engine states it.
    pub const ENGINE_KV_CAPACITY_TOKENS: &str = "engine_kv_capacity_tokens";
    /// Chars of the trees the worker holds (this Envoy's).
    pub const TREE_CHARS: &str = "tree_chars";
    /// The chars its engine can hold (`crate::request::kv_bounds`); 0: unbounded.
    pub const KV_BOUND_CHARS: &str = "kv_bound_chars";
    /// Chars of routed text per engine prompt token, in thousandths; 0: not learned.
    pub const CHARS_PER_TOKEN_MILLI: &str = "chars_per_token_milli";

    /// Every gauge field, in the order `WorkerGauges::values` gives them.
    pub const GAUGES: [&str; 10] = [
        INFLIGHT,
        OVERLOADED,
        UNREACHABLE,
        ENGINE_WAITING,
        ENGINE_RUNNING,
        ENGINE_KV_USAGE_PCT,
        ENGINE_KV_CAPACITY_TOKENS,
        TREE_CHARS,
        KV_BOUND_CHARS,
        CHARS_PER_TOKEN_MILLI,
    ];
}

/// One stat of one worker, e.g. `llm_router_worker.w0.routed`.
pub fn worker_metric(worker: &str, field: &str) -> String {
    format!("{WORKER_PREFIX}{worker}.{field}")
}

/// Per-VM gauges are `llm_router_vm.<id>.<field>`: a gauge of one name is one value
/// for all VMs (the last writer wins), so each VM names its own with a random id
/// (VMs are clones; nothing else tells them apart). Read by `benches/soak`.
pub const VM_PREFIX: &str = "llm_router_vm.";

/// The fields of a VM's gauges.
pub mod vm {
    /// The VM's Wasm linear memory in bytes (it only grows: a high-water mark).
    pub const MEMORY_BYTES: &str = "memory_bytes";
    /// Chars held by the VM's trees.
    pub const TREE_CHARS: &str = "tree_chars";
}

/// One gauge of one VM, e.g. `llm_router_vm.1a2b3c4d.memory_bytes`.
pub fn vm_metric(id: &str, field: &str) -> String {
    format!("{VM_PREFIX}{id}.{field}")
}

/// The VM id and field of a [`vm_metric`] name; `None` for any other stat.
pub fn split_vm_metric(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix(VM_PREFIX)?.split_once('.')
}

/// Envoy `stats_config.stats_tags` entries `(tag_name, regex)` that turn the name
/// dimensions into labels. Each regex's first group is cut from the name and its
/// second is the label's value. A worker name may contain dots: the field after the
/// last dot has none.
pub const STATS_TAGS: [(&str, &str); 4] = [
    ("decision", r"^wasmcustom\.llm_router_decisions(_(.+))$"),
    (
        "decision",
        r"^wasmcustom\.llm_router_worker\..+\.decisions(_([a-z_]+))$",
    ),
    ("reason", r"^wasmcustom\.llm_router_reasons(_(.+))$"),
    (
        "worker",
        r"^wasmcustom\.llm_router_worker(\.(.+))\.[a-z_]+$",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn worker_and_reason_stats_are_named_for_tag_extraction() {
        assert_eq!(
            worker_metric("w0", worker::ROUTED),
            "llm_router_worker.w0.routed"
        );
        assert_eq!(
            reason_metric(Reason::Imbalanced),
            "llm_router_reasons_imbalanced"
        );
        let reasons: std::collections::BTreeSet<&str> =
            Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(reasons.len(), Reason::ALL.len(), "every reason once");
    }

    #[test]
    fn vm_gauge_names_split_back_into_id_and_field() {
        let name = vm_metric("1a2b3c4d", vm::MEMORY_BYTES);
        assert_eq!(name, "llm_router_vm.1a2b3c4d.memory_bytes");
        assert_eq!(split_vm_metric(&name), Some(("1a2b3c4d", vm::MEMORY_BYTES)));
        assert_eq!(split_vm_metric("llm_router_worker.w0.routed"), None);
    }

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
