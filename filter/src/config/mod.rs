//! The plugin configuration: the JSON object Envoy hands the filter in
//! `configuration`, parsed once per (re)configure and validated before any of it is
//! used.
//!
//! Defaults follow SGLang model gateway's command line (the values deployments
//! actually run with): `cache_threshold 0.3`, `balance_abs_threshold 64`,
//! `balance_rel_threshold 1.5`, `max_tree_size 2^26` chars per tenant, eviction every
//! 120 s. Validation reports the first broken rule and names the field, so an
//! operator reading Envoy's log knows what to change.
//!
//! This is the bottom layer of the crate: it imports nothing else from it. The
//! worker list (`workers`) and the overload settings (`overload`) are submodules,
//! and so are the rules across the whole (`rules`).

use serde::Deserialize;
use std::fmt;

mod decision_headers;
mod gate;
mod health;
mod kv_match;
mod overload;
mod policies;
mod replicas;
mod rules;
mod stats;
mod target;
mod ttft;
mod workers;

pub use decision_headers::DecisionHeaders;
pub use health::*;
pub use kv_match::*;
pub use overload::*;
pub(crate) use policies::policies;
pub use policies::Policy;
pub use replicas::*;
pub use target::*;
pub use ttft::*;
pub use workers::{Pool, WorkerConfig, WorkerNames, WorkersFrom};

pub const DEFAULT_CACHE_THRESHOLD: f64 = 0.3;
pub const DEFAULT_BALANCE_ABS_THRESHOLD: u64 = 64;
pub const DEFAULT_BALANCE_REL_THRESHOLD: f64 = 1.5;
pub const DEFAULT_MAX_TREE_SIZE_CHARS: usize = 1 << 26;
/// Per-VM budget for all trees together. Every Envoy worker thread holds a copy and
/// a VM's linear memory is capped at 1 GiB; 2^25 chars leaves ample headroom for
/// node overhead.
pub const DEFAULT_MAX_TOTAL_TREE_CHARS: usize = 1 << 25;
pub const DEFAULT_EVICTION_INTERVAL_MS: u64 = 120_000;
/// Distinct models that get a tree of their own; the least recently used tree is
/// dropped beyond it, so client-chosen model names cannot grow memory without bound.
pub const DEFAULT_MAX_MODELS: usize = 64;
/// Tree operations kept in shared data for VMs to catch up with. A VM more than this
/// many operations behind loses the overwritten ones (and counts them).
pub const DEFAULT_SYNC_RING_SLOTS: usize = 1024;
/// Routing text used per request: longer texts are matched and recorded by this
/// prefix. It bounds what one shared tree operation carries, hence the ring's memory
/// (`slots * bytes`, 256 MiB worst case), and the per-request tree walk. Matching and
/// recording the same prefix keeps the match rate meaningful for longer prompts.
pub const DEFAULT_MAX_ROUTING_TEXT_BYTES: usize = 256 * 1024;
/// How often each VM catches up with the ring when it routes nothing, and checks
/// whether an eviction is due.
pub const DEFAULT_SYNC_INTERVAL_MS: u64 = 1000;
/// A thread shares its routed texts and counts with the others at most this often
/// under load: a few requests' worth at a thread's rate, far below a turn's answer.
/// Tables (stats pushes, flags, health) reach it at once whatever the window.
pub const DEFAULT_SYNC_BATCH_MS: u64 = 2;
pub const MAX_SYNC_BATCH_MS: u64 = 1000;
/// An engine sample older than this is not used (the collector pushes every 1 s).
pub const DEFAULT_STALE_AFTER_MS: u64 = 5_000;
/// A request body past this (32 MiB) is refused by the filter itself (413) as soon
/// as it grows past it: reading a body costs the Envoy thread its size in time, and
/// engines refuse bodies past their own limits their own ways (a 400 or a reset).
pub const DEFAULT_MAX_BODY_BYTES: u64 = 32 * 1024 * 1024;
pub const DEFAULT_STATS_PATH: &str = "/llm-router/stats";
pub const DEFAULT_STATS_MAX_BYTES: usize = 1 << 20;
/// The prefill pool is where prompts are cached: the default policy, as the
/// regular pool's.
pub const DEFAULT_PREFILL_POLICY: Policy = Policy::PredictedTtft;
/// Decode holds no prefix worth following (the KV arrives from prefill): spread the
/// load, as SMG's PD deployments usually configure it.
pub const DEFAULT_DECODE_POLICY: Policy = Policy::PowerOfTwo;
/// Workers one filter knows at most, configured or discovered: every request walks
/// them, and every shared table holds a row per worker.
pub const DEFAULT_MAX_WORKERS: usize = 256;
/// Discovery mode: how long a worker the collector stopped reporting keeps its
/// tenants (it takes no new requests meanwhile), so a flapping endpoint does not lose
/// its cache affinity. Ten collector intervals at the default 1 s.
pub const DEFAULT_LEAVE_GRACE_MS: u64 = 10_000;
/// How long the prefill copy of a PD request may take before the client gets a 504.
/// SGLang's decode side waits this long for KV before giving up.
pub const DEFAULT_PREFILL_TIMEOUT_MS: u64 = 300_000;

fn default_max_tree_size() -> usize {
    DEFAULT_MAX_TREE_SIZE_CHARS
}
fn default_max_total() -> usize {
    DEFAULT_MAX_TOTAL_TREE_CHARS
}
fn default_eviction_interval() -> u64 {
    DEFAULT_EVICTION_INTERVAL_MS
}
fn default_max_models() -> usize {
    DEFAULT_MAX_MODELS
}
fn default_sync_ring_slots() -> usize {
    DEFAULT_SYNC_RING_SLOTS
}
fn default_max_routing_text_bytes() -> usize {
    DEFAULT_MAX_ROUTING_TEXT_BYTES
}
fn default_sync_interval() -> u64 {
    DEFAULT_SYNC_INTERVAL_MS
}
fn default_relay_deadline() -> u64 {
    DEFAULT_RELAY_DEADLINE_MS
}

/// `relay_deadline_ms`'s default: a main thread busy for longer than this is
/// applying configuration, not routing.
pub const DEFAULT_RELAY_DEADLINE_MS: u64 = 200;

/// Where the trees live and requests are decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RouteIn {
    /// One VM per Envoy (the first configured: the main thread's) holds the trees
    /// and decides for every worker thread, which asks it over shared queues: a
    /// request costs the same whatever the thread count, and the trees exist once.
    #[default]
    OneVm,
    /// Every worker thread's VM keeps a replica of the trees, replayed from the
    /// others' through shared data, and decides its own requests.
    EveryVm,
}

fn default_sync_batch() -> u64 {
    DEFAULT_SYNC_BATCH_MS
}
fn default_stale_after() -> u64 {
    DEFAULT_STALE_AFTER_MS
}
fn default_max_body() -> u64 {
    DEFAULT_MAX_BODY_BYTES
}
fn default_stats_path() -> String {
    DEFAULT_STATS_PATH.to_string()
}
fn default_stats_max_bytes() -> usize {
    DEFAULT_STATS_MAX_BYTES
}
fn default_max_workers() -> usize {
    DEFAULT_MAX_WORKERS
}
fn default_prefill_policy() -> Policy {
    DEFAULT_PREFILL_POLICY
}
fn default_decode_policy() -> Policy {
    DEFAULT_DECODE_POLICY
}
fn default_prefill_timeout() -> u64 {
    DEFAULT_PREFILL_TIMEOUT_MS
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The regular pool's policy.
    #[serde(default)]
    pub policy: Policy,
    /// PD mode (prefill and decode workers configured): the prefill pool's policy.
    #[serde(default = "default_prefill_policy")]
    pub prefill_policy: Policy,
    /// PD mode: the decode pool's policy.
    #[serde(default = "default_decode_policy")]
    pub decode_policy: Policy,
    /// PD mode: the prefill copy's timeout; past it the client gets a 504.
    #[serde(default = "default_prefill_timeout")]
    pub prefill_timeout_ms: u64,
    #[serde(default)]
    pub target: Target,
    /// The workers (`workers_from: config`); in discovery mode the collector's
    /// current membership, which the router swaps in (never from the plugin config).
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    /// Where the worker list comes from: the plugin config, or the collector's
    /// membership pushes (service discovery).
    #[serde(default)]
    pub workers_from: WorkersFrom,
    /// Workers known at most, configured or discovered.
    #[serde(default = "default_max_workers")]
    pub max_workers: usize,
    /// Discovery mode: how long a worker missing from the collector's membership
    /// keeps its tenants before they are dropped (default `DEFAULT_LEAVE_GRACE_MS`).
    #[serde(default)]
    pub leave_grace_ms: Option<u64>,
    /// `cache_aware`: a prefix hit must cover strictly more than this share of the
    /// input's chars (`DEFAULT_CACHE_THRESHOLD` when unset). Settings are `None`
    /// until set, so one set where no pool routes by `cache_aware` is refused
    /// rather than ignored.
    #[serde(default)]
    pub cache_threshold: Option<f64>,
    /// `cache_aware`'s spill gate (SMG 1.13's): an owner with more in flight than
    /// the mean plus `min(abs, max(4, 2 * sqrt(mean)))` AND more than `rel * mean`
    /// is skipped for the least loaded.
    #[serde(default)]
    pub balance_abs_threshold: Option<u64>,
    #[serde(default)]
    pub balance_rel_threshold: Option<f64>,
    /// SMG's per-tenant limit, in chars.
    #[serde(default = "default_max_tree_size")]
    pub max_tree_size: usize,
    /// All trees of one VM together, in chars held.
    #[serde(default = "default_max_total")]
    pub max_total_tree_chars: usize,
    #[serde(default = "default_eviction_interval")]
    pub eviction_interval_ms: u64,
    #[serde(default = "default_max_models")]
    pub max_models: usize,
    /// Each worker's share of the trees is bounded by what its engine's KV cache
    /// holds, once the collector states the capacity (`crate::request::kv_bounds`),
    /// and `cache_aware` sends a miss to the holders of its start
    /// (`crate::policy::cache_aware`). Unset: on where `predicted_ttft` routes
    /// (`bounds_kv`), whose predictions price what an engine holds, so a tree that
    /// still claims what the engine evicted keeps a conversation on an engine that
    /// prefills it all again while another waits idle; off where `cache_aware` does,
    /// whose decisions are SMG's. An engine's restart empties its worker's share
    /// either way.
    #[serde(default)]
    pub kv_capacity_bound: Option<bool>,
    /// `cache_aware` ranks by what the engines' KV caches hold, asked of the
    /// collector before each decision (`crate::kv_match`). Unset: the tree alone.
    #[serde(default)]
    pub kv_match: Option<KvMatchConfig>,
    /// Queue gate: a prefix owner whose engine has this many requests waiting (or
    /// more) is no cache candidate. Unset: no gate.
    #[serde(default)]
    pub worker_queue_limit: Option<u64>,
    /// Saturation pin: with every owner gated and no worker provably below this
    /// queue, stay with the owner. Needs `worker_queue_limit`.
    #[serde(default)]
    pub saturation_queue_floor: Option<u64>,
    /// `predicted_ttft`: bounded-load factor (default `DEFAULT_LOAD_FACTOR`).
    #[serde(default)]
    pub load_factor: Option<f64>,
    /// `predicted_ttft`: prefill cost per uncached char until learned.
    #[serde(default)]
    pub prefill_us_per_char: Option<f64>,
    /// `predicted_ttft`: per-request service time after first byte until learned.
    #[serde(default)]
    pub service_ms: Option<f64>,
    /// `predicted_ttft`: how much slower the cache's holder may be predicted and
    /// still keep the request.
    #[serde(default)]
    pub stay_factor: Option<f64>,
    /// `predicted_ttft`: a fleet larger than this is sampled, this many workers a
    /// request (default `DEFAULT_TTFT_SAMPLE_SIZE`: 16; 0 scores every worker).
    #[serde(default)]
    pub ttft_sample_size: Option<usize>,
    #[serde(default = "default_stale_after")]
    pub stale_after_ms: u64,
    /// A routed request's body past this many bytes gets the filter's 413.
    #[serde(default = "default_max_body")]
    pub max_body_bytes: u64,
    /// Bearer token of the stats push endpoint; unset disables the endpoint.
    #[serde(default)]
    pub stats_token: Option<String>,
    /// The name of an environment variable of the VM holding the token instead
    /// (Envoy passes it with `vm_config.environment_variables.host_env_keys`), so
    /// the token can come from a file rather than sit in the Envoy config.
    #[serde(default)]
    pub stats_token_env: Option<String>,
    /// This plugin instance is the stats listener's: it answers the collector's
    /// pushes and nothing else (a local 404, nothing routed or recorded). Give the
    /// client-facing listener a config without a token, so it never takes a push.
    #[serde(default)]
    pub stats_only: bool,
    #[serde(default = "default_stats_path")]
    pub stats_path: String,
    #[serde(default = "default_stats_max_bytes")]
    pub stats_max_bytes: usize,
    #[serde(default = "default_sync_ring_slots")]
    pub sync_ring_slots: usize,
    #[serde(default = "default_max_routing_text_bytes")]
    pub max_routing_text_bytes: usize,
    #[serde(default = "default_sync_interval")]
    pub sync_interval_ms: u64,
    /// How long a thread may route by what it has before it syncs with the others
    /// (`crate::shared::Outbox`); 0 syncs on every request.
    #[serde(default = "default_sync_batch")]
    pub sync_batch_ms: u64,
    /// Where the trees live and requests are decided (`crate::relay`).
    #[serde(default)]
    pub route_in: RouteIn,
    /// `route_in: one_vm`: a request whose answer has not come back after this
    /// long is routed by its own VM, by load (a stalled main thread stalls no
    /// request longer).
    #[serde(default = "default_relay_deadline")]
    pub relay_deadline_ms: u64,
    #[serde(default = "target::default_cluster_header")]
    pub cluster_header: String,
    #[serde(default = "target::default_endpoint_header")]
    pub endpoint_header: String,
    /// Which responses get `x-llm-router-worker`, `-decision` and `-reason`.
    #[serde(default)]
    pub decision_headers: DecisionHeaders,
    /// Latency-aware overload flags; see `crate::worker::overload`.
    #[serde(default)]
    pub overload: OverloadConfig,
    /// Failed workers out of rotation until probed back; see `crate::worker::health`.
    #[serde(default)]
    pub health: HealthConfig,
    /// The replica bridge's endpoint (`crate::background::replica`).
    #[serde(default)]
    pub replicas: ReplicasConfig,
    /// Seeds the tie-break generator so a run can be replayed decision for decision
    /// (the demo and `host-sim replay` set it); unset: the host's entropy.
    #[serde(default)]
    pub rng_seed: Option<u64>,
}

/// A configuration rule that does not hold, naming the field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub field: String,
    pub rule: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid plugin config: `{}` {}", self.field, self.rule)
    }
}

fn err(field: impl Into<String>, rule: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        rule: rule.into(),
    }
}

impl Config {
    /// Parses and validates plugin configuration bytes.
    pub fn from_json(bytes: &[u8]) -> Result<Config, ConfigError> {
        let cfg: Config = serde_json::from_slice(bytes).map_err(|e| {
            let msg = e.to_string();
            // serde names the offending field in its message; keep it whole.
            err("configuration", format!("is not valid: {msg}"))
        })?;
        if cfg.discovers() && !cfg.workers.is_empty() {
            return Err(err(
                "workers",
                "must be left out with `workers_from: collector` (the collector's membership lists them)",
            ));
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Whether `policy` routes some request: the regular pool's, or in PD the
    /// prefill or decode pool's.
    fn routes_by(&self, policy: Policy) -> bool {
        if self.is_pd() {
            self.prefill_policy == policy || self.decode_policy == policy
        } else {
            self.policy == policy
        }
    }

    /// Prefill/decode disaggregation: every request gets a prefill and a decode
    /// worker. Validation makes the pools all-or-nothing (`validate_pools`), so the
    /// first worker says it: every request asks, and a scan of the fleet was a
    /// pass over 256 workers each time.
    pub fn is_pd(&self) -> bool {
        self.workers
            .first()
            .is_some_and(|w| w.pool != Pool::Regular)
    }

    /// The root tick period: the ring's sync interval, or the probe interval when
    /// that is shorter and overload or health probing is on.
    pub fn tick_ms(&self) -> u64 {
        if self.overload.enabled || self.health.enabled {
            self.sync_interval_ms.min(self.overload.probe_interval_ms)
        } else {
            self.sync_interval_ms
        }
    }

    /// Whether any pool routes by `predicted_ttft` (the work and cost tables are
    /// read and written only then).
    pub fn uses_predicted_ttft(&self) -> bool {
        [Pool::Regular, Pool::Prefill, Pool::Decode]
            .iter()
            .any(|p| self.policy_of(*p) == Policy::PredictedTtft && self.has_pool(*p))
    }

    fn has_pool(&self, pool: Pool) -> bool {
        self.workers.iter().any(|w| w.pool == pool)
    }

    /// Whether the workers of `pool` hold no more of the trees than their engines
    /// can (`kv_capacity_bound`, unset: where `predicted_ttft` routes).
    pub fn bounds_kv(&self, pool: Pool) -> bool {
        self.kv_capacity_bound
            .unwrap_or(self.policy_of(pool) == Policy::PredictedTtft)
    }

    /// The policy that picks workers of `pool`.
    pub fn policy_of(&self, pool: Pool) -> Policy {
        match pool {
            Pool::Regular => self.policy,
            Pool::Prefill => self.prefill_policy,
            Pool::Decode => self.decode_policy,
        }
    }
}

/// Fixtures other modules' tests share.
#[cfg(test)]
pub(crate) mod testing {
    use super::{Config, WorkerConfig, WorkerNames};

    /// Two workers: `w0` at `10.0.0.1:8000`, and `w1` with no address.
    pub(crate) fn workers() -> Vec<WorkerConfig> {
        let cfg = Config::from_json(
            br#"{"workers":[{"name":"w0","address":"10.0.0.1:8000"},{"name":"w1"}]}"#,
        )
        .unwrap();
        cfg.workers
    }

    /// `workers()` by name.
    pub(crate) fn names() -> WorkerNames {
        WorkerNames::new(&workers())
    }

    /// `n` workers `w0`, `w1`, ... with nothing but names.
    pub(crate) fn named_workers(n: usize) -> Vec<WorkerConfig> {
        let ws: Vec<String> = (0..n).map(|i| format!(r#"{{"name":"w{i}"}}"#)).collect();
        Config::from_json(format!(r#"{{"workers":[{}]}}"#, ws.join(",")).as_bytes())
            .unwrap()
            .workers
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const TWO_WORKERS: &str = r#"{"workers":[{"name":"w0"},{"name":"w1"}]}"#;

    fn with(extra: &str) -> Result<Config, ConfigError> {
        let json = format!(r#"{{"workers":[{{"name":"w0"}},{{"name":"w1"}}]{extra}}}"#);
        Config::from_json(json.as_bytes())
    }

    /// `with` under `policy: cache_aware`, whose settings it tests.
    fn aware(extra: &str) -> Result<Config, ConfigError> {
        with(&format!(r#","policy":"cache_aware"{extra}"#))
    }

    fn field_of(r: Result<Config, ConfigError>) -> String {
        r.expect_err("must be rejected").field
    }

    #[test]
    fn defaults_follow_smg_command_line() {
        let c = Config::from_json(TWO_WORKERS.as_bytes()).unwrap();
        // The default policy is ours; `cache_aware`'s settings default to SMG's.
        assert_eq!(c.policy, Policy::PredictedTtft);
        assert_eq!(Policy::default(), Policy::PredictedTtft);
        assert_eq!(c.prefill_policy, Policy::PredictedTtft);
        assert_eq!(c.target, Target::Cluster);
        use crate::policy::Select;
        let aware = crate::policy::cache_aware::CacheAware::params(&c);
        assert_eq!(aware.cache_threshold, 0.3);
        assert_eq!(aware.balance_abs_threshold, 64);
        assert_eq!(aware.balance_rel_threshold, 1.5);
        assert_eq!(c.max_tree_size, 67_108_864);
        assert_eq!(c.kv_capacity_bound, None, "the KV bound is asked for");
        assert!(c.bounds_kv(Pool::Regular), "where predicted_ttft routes");
        assert_eq!(c.eviction_interval_ms, 120_000);
        assert_eq!(c.cluster_header, "x-llm-router-cluster");
        assert_eq!(c.endpoint_header, "x-gateway-destination-endpoint");
        assert_eq!(c.workers[0].cluster(), "w0", "cluster defaults to the name");
        assert!(c.workers[0].serves("any-model"));
    }

    #[test]
    fn unknown_fields_are_named() {
        let e = with(r#","cache_treshold":0.5"#).unwrap_err();
        assert!(e.rule.contains("cache_treshold"), "{e}");
    }

    #[test]
    fn not_json_is_an_error_not_a_panic() {
        assert_eq!(field_of(Config::from_json(b"not json")), "configuration");
        assert_eq!(field_of(Config::from_json(b"")), "configuration");
        let e = Config::from_json(br#"{"policy":"cache_aware"}"#).unwrap_err();
        assert_eq!(e.field, "workers");
        assert!(e.rule.contains("workers_from: collector"), "{e}");
    }

    #[test]
    fn threshold_ranges() {
        assert!(aware(r#","cache_threshold":0.0"#).is_ok());
        assert!(aware(r#","cache_threshold":1.0"#).is_ok());
        assert_eq!(
            field_of(with(r#","cache_threshold":1.01"#)),
            "cache_threshold"
        );
        assert_eq!(
            field_of(with(r#","cache_threshold":-0.1"#)),
            "cache_threshold"
        );
        assert!(aware(r#","balance_rel_threshold":1.0"#).is_ok());
        // `cache_aware`'s settings under another policy (the default's, left out)
        // are refused, naming what to add: a tuned threshold is never ignored.
        for field in [
            "cache_threshold",
            "balance_abs_threshold",
            "balance_rel_threshold",
        ] {
            let e = with(&format!(r#","{field}":1"#)).unwrap_err();
            assert_eq!(
                (e.field.as_str(), e.rule.as_str()),
                (field, "requires `policy: cache_aware`")
            );
        }
        assert_eq!(
            field_of(with(r#","balance_rel_threshold":0.99"#)),
            "balance_rel_threshold"
        );
        assert_eq!(field_of(with(r#","max_tree_size":0"#)), "max_tree_size");
        assert_eq!(
            field_of(with(r#","max_total_tree_chars":0"#)),
            "max_total_tree_chars"
        );
        assert_eq!(
            field_of(with(r#","eviction_interval_ms":0"#)),
            "eviction_interval_ms"
        );
        assert_eq!(field_of(with(r#","max_models":0"#)), "max_models");
        assert_eq!(field_of(with(r#","sync_ring_slots":0"#)), "sync_ring_slots");
        assert_eq!(
            field_of(with(r#","sync_ring_slots":65537"#)),
            "sync_ring_slots"
        );
        assert!(with(r#","sync_ring_slots":65536"#).is_ok());
        assert_eq!(
            field_of(with(r#","max_routing_text_bytes":0"#)),
            "max_routing_text_bytes"
        );
        assert_eq!(
            field_of(with(r#","sync_interval_ms":9"#)),
            "sync_interval_ms"
        );
        assert!(with(r#","sync_interval_ms":10"#).is_ok());
        assert_eq!(field_of(with(r#","sync_batch_ms":1001"#)), "sync_batch_ms");
        assert!(with(r#","sync_batch_ms":1000"#).is_ok());
        assert!(with(r#","sync_batch_ms":0"#).is_ok());
        for deadline in [9, 60_001] {
            let refused = with(&format!(r#","relay_deadline_ms":{deadline}"#));
            assert_eq!(field_of(refused), "relay_deadline_ms");
        }
        assert!(with(r#","relay_deadline_ms":10"#).is_ok());
        let one = with(r#","route_in":"one_vm""#).map(|c| c.route_in);
        assert_eq!(one, Ok(RouteIn::OneVm));
        assert!(with(r#","route_in":"main""#).is_err());
        assert_eq!(
            field_of(with(r#","cluster_header":"X-Bad Header""#)),
            "cluster_header"
        );
    }

    #[test]
    fn policies_parse_by_name() {
        for p in ["cache_aware", "round_robin", "random", "power_of_two"] {
            let c = with(&format!(r#","policy":"{p}""#)).unwrap();
            assert_eq!(c.policy.as_str(), p);
        }
        assert_eq!(
            field_of(with(r#","policy":"prefix_hash""#)),
            "configuration"
        );
    }

    #[test]
    fn workers_rules() {
        assert_eq!(field_of(Config::from_json(br#"{"workers":[]}"#)), "workers");
        let dup = br#"{"workers":[{"name":"a"},{"name":"a"}]}"#;
        assert_eq!(field_of(Config::from_json(dup)), "workers[1].name");
        let empty = br#"{"workers":[{"name":""}]}"#;
        assert_eq!(field_of(Config::from_json(empty)), "workers[0].name");
        let bad_addr = br#"{"workers":[{"name":"a","address":"127.0.0.1"}]}"#;
        assert_eq!(field_of(Config::from_json(bad_addr)), "workers[0].address");
        let port0 = br#"{"workers":[{"name":"a","address":"127.0.0.1:0"}]}"#;
        assert_eq!(field_of(Config::from_json(port0)), "workers[0].address");
        let no_addr = br#"{"target":"endpoint","workers":[{"name":"a"}]}"#;
        let e = Config::from_json(no_addr).unwrap_err();
        assert_eq!(e.field, "workers[0].address");
        assert!(e.to_string().contains("target: endpoint"), "{e}");
        let ok = br#"{"target":"endpoint","workers":[{"name":"a","address":"10.0.0.1:8000"}]}"#;
        assert!(Config::from_json(ok).is_ok());
        let only_prefill = br#"{"workers":[{"name":"p","pool":"prefill"}]}"#;
        assert_eq!(field_of(Config::from_json(only_prefill)), "workers");
    }

    fn pd(prefill: &str, extra: &str) -> Result<Config, ConfigError> {
        let json = format!(
            r#"{{"workers":[{{"name":"p0","pool":"prefill",{prefill}}},{{"name":"d0","pool":"decode"}}]{extra}}}"#
        );
        Config::from_json(json.as_bytes())
    }

    #[test]
    fn pd_pools_and_policies() {
        let c = pd(r#""address":"10.0.0.5:30000","bootstrap_port":8998"#, "").unwrap();
        assert!(c.is_pd());
        assert_eq!(c.policy_of(Pool::Prefill), Policy::PredictedTtft);
        assert_eq!(c.policy_of(Pool::Decode), Policy::PowerOfTwo);
        assert_eq!(c.workers[0].bootstrap_host(), Some("10.0.0.5"));
        assert_eq!(c.prefill_timeout_ms, DEFAULT_PREFILL_TIMEOUT_MS);
        let named = pd(
            r#""bootstrap_host":"prefill-0.svc","bootstrap_port":8998"#,
            r#","prefill_policy":"round_robin","decode_policy":"cache_aware""#,
        )
        .unwrap();
        assert_eq!(named.workers[0].bootstrap_host(), Some("prefill-0.svc"));
        assert_eq!(named.policy_of(Pool::Prefill), Policy::RoundRobin);
        assert_eq!(named.policy_of(Pool::Decode), Policy::CacheAware);
        assert!(pd(r#""bootstrap_port":1"#, r#","prefill_policy":"fastest""#).is_err());
    }

    #[test]
    fn pd_rules_name_the_field() {
        let port = r#""address":"10.0.0.5:30000","bootstrap_port":8998"#;
        assert_eq!(
            field_of(pd(r#""address":"10.0.0.5:30000""#, "")),
            "workers[0].bootstrap_port"
        );
        assert_eq!(
            field_of(pd(r#""address":"10.0.0.5:30000","bootstrap_port":0"#, "")),
            "workers[0].bootstrap_port"
        );
        assert_eq!(
            field_of(pd(r#""bootstrap_port":8998"#, "")),
            "workers[0].bootstrap_host"
        );
        assert_eq!(
            field_of(pd(r#""bootstrap_port":8998,"bootstrap_host":"""#, "")),
            "workers[0].bootstrap_host"
        );
        let only_decode = br#"{"workers":[{"name":"d","pool":"decode"}]}"#;
        assert_eq!(field_of(Config::from_json(only_decode)), "workers");
        let mixed = format!(
            r#"{{"workers":[{{"name":"p","pool":"prefill",{port}}},{{"name":"d","pool":"decode"}},{{"name":"r"}}]}}"#
        );
        assert_eq!(
            field_of(Config::from_json(mixed.as_bytes())),
            "workers[2].pool"
        );
        let regular_first = format!(
            r#"{{"workers":[{{"name":"r"}},{{"name":"p","pool":"prefill",{port}}},{{"name":"d","pool":"decode"}}]}}"#
        );
        assert_eq!(
            field_of(Config::from_json(regular_first.as_bytes())),
            "workers[0].pool",
            "a mix is refused whichever pool comes first"
        );
        let port_on_decode = format!(
            r#"{{"workers":[{{"name":"p","pool":"prefill",{port}}},{{"name":"d","pool":"decode","bootstrap_port":1}}]}}"#
        );
        assert_eq!(
            field_of(Config::from_json(port_on_decode.as_bytes())),
            "workers[1].bootstrap_port"
        );
        assert_eq!(
            field_of(pd(port, r#","prefill_timeout_ms":0"#)),
            "prefill_timeout_ms"
        );
        // The gate needs a cache_aware pool to act on.
        assert!(pd(
            port,
            r#","prefill_policy":"cache_aware","worker_queue_limit":4"#
        )
        .is_ok());
        let e = pd(port, r#","worker_queue_limit":4"#).unwrap_err();
        assert_eq!(e.field, "worker_queue_limit");
        assert!(e.rule.contains("prefill_policy"), "{e}");
        // The engines' word needs a pool that reads a tree: the default prefill
        // pool does.
        let kv = r#","kv_match":{"cluster":"c"}"#;
        assert!(pd(port, kv).is_ok());
        let e = pd(
            port,
            &format!(r#","prefill_policy":"random","decode_policy":"round_robin"{kv}"#),
        )
        .unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.rule.as_str()),
            (
                "kv_match",
                "requires `prefill_policy` or `decode_policy` to be `predicted_ttft` or `cache_aware`"
            )
        );
    }

    #[test]
    fn queue_knobs_are_checked_value_first_then_dependency() {
        let rule = |extra: &str| aware(extra).unwrap_err();
        assert!(aware(r#","worker_queue_limit":1"#).is_ok());
        assert!(aware(r#","worker_queue_limit":4,"saturation_queue_floor":4"#).is_ok());
        assert!(aware(r#","worker_queue_limit":4,"saturation_queue_floor":1"#).is_ok());
        // Left out, `policy` is `predicted_ttft`, which has no queue gate: the error
        // says what to add.
        let e = with(r#","worker_queue_limit":4"#).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.rule.as_str()),
            ("worker_queue_limit", "requires `policy: cache_aware`")
        );
        let e = rule(r#","worker_queue_limit":0"#);
        assert_eq!(
            (e.field.as_str(), e.rule.as_str()),
            ("worker_queue_limit", "must be at least 1")
        );
        let e = rule(r#","saturation_queue_floor":2"#);
        assert_eq!(e.field, "saturation_queue_floor");
        assert!(e.rule.contains("requires `worker_queue_limit`"), "{e}");
        let e = rule(r#","worker_queue_limit":4,"saturation_queue_floor":0"#);
        assert_eq!(e.rule, "must be at least 1");
        let e = rule(r#","worker_queue_limit":4,"saturation_queue_floor":5"#);
        assert!(
            e.rule
                .contains("(5) must be at most `worker_queue_limit` (4)"),
            "{e}"
        );
        // Policy errors come after value errors.
        let rule = |extra: &str| with(extra).unwrap_err();
        let e = rule(r#","policy":"round_robin","worker_queue_limit":0"#);
        assert_eq!(
            (e.field.as_str(), e.rule.as_str()),
            ("worker_queue_limit", "must be at least 1")
        );
        let e = rule(r#","policy":"round_robin","saturation_queue_floor":2"#);
        assert!(
            e.rule.contains("requires `worker_queue_limit`"),
            "value rule first: {e}"
        );
        let e = rule(r#","policy":"random","worker_queue_limit":3"#);
        assert_eq!(
            (e.field.as_str(), e.rule.as_str()),
            ("worker_queue_limit", "requires `policy: cache_aware`")
        );
        let e = rule(r#","policy":"random","worker_queue_limit":3,"saturation_queue_floor":1"#);
        assert_eq!(e.field, "worker_queue_limit");
    }

    #[test]
    fn kv_match_settings() {
        let c = aware(r#","kv_match":{"cluster":"llm_collector"}"#).unwrap();
        let kv = c.kv_match.unwrap();
        assert_eq!((kv.cluster.as_str(), kv.timeout_ms), ("llm_collector", 25));
        for (extra, field) in [
            (r#"{"cluster":""}"#, "kv_match.cluster"),
            (r#"{"cluster":"c","timeout_ms":0}"#, "kv_match.timeout_ms"),
            (
                r#"{"cluster":"c","timeout_ms":10001}"#,
                "kv_match.timeout_ms",
            ),
            (r#"{"cluster":"c","path":"/kv"}"#, "configuration"),
            (r#"{"timeout_ms":5}"#, "configuration"),
            (r#"{"cluster":"c","timout_ms":5}"#, "configuration"),
        ] {
            assert_eq!(field_of(aware(&format!(r#","kv_match":{extra}"#))), field);
        }
        let e = with(r#","policy":"round_robin","kv_match":{"cluster":"c"}"#).unwrap_err();
        assert_eq!(
            (e.field.as_str(), e.rule.as_str()),
            (
                "kv_match",
                "requires `policy: predicted_ttft` (the default) or `cache_aware`"
            )
        );
        let c = with(r#","kv_match":{"cluster":"c"}"#).unwrap();
        assert!(
            c.kv_match.is_some(),
            "the default policy reads the engines too"
        );
    }

    #[test]
    fn stats_endpoint_settings() {
        let c = with(r#","stats_token":"t""#).unwrap();
        assert_eq!(
            (c.stats_path.as_str(), c.stats_max_bytes, c.stale_after_ms),
            ("/llm-router/stats", 1 << 20, 5000)
        );
        assert_eq!(field_of(with(r#","stats_token":"""#)), "stats_token");
        assert_eq!(
            field_of(with(r#","stats_token_env":"""#)),
            "stats_token_env"
        );
        assert_eq!(
            field_of(with(r#","stats_token":"t","stats_token_env":"T""#)),
            "stats_token_env"
        );
        assert_eq!(field_of(with(r#","stats_only":true"#)), "stats_only");
        let s = with(r#","stats_only":true,"stats_token_env":"LLM_ROUTER_STATS_TOKEN""#).unwrap();
        assert!(s.stats_only);
        assert_eq!(field_of(with(r#","stats_path":"stats""#)), "stats_path");
        assert_eq!(field_of(with(r#","stats_max_bytes":0"#)), "stats_max_bytes");
        assert_eq!(field_of(with(r#","stale_after_ms":0"#)), "stale_after_ms");
    }

    #[test]
    fn max_body_bytes_defaults_to_32_mib_and_must_be_positive() {
        assert_eq!(with("").unwrap().max_body_bytes, 32 << 20);
        assert_eq!(with(r#","max_body_bytes":1"#).unwrap().max_body_bytes, 1);
        assert_eq!(field_of(with(r#","max_body_bytes":0"#)), "max_body_bytes");
    }

    #[test]
    fn overload_is_one_nested_object() {
        let c = with(r#","overload":{"ttft_enter_s":3,"ttft_recover_s":1.5}"#).unwrap();
        assert_eq!(
            (c.overload.ttft_enter_s, c.overload.ttft_recover_s),
            (3.0, 1.5)
        );
        assert_eq!(
            c.overload.tpot_enter_s, 0.3,
            "unset keys keep their defaults"
        );
        assert!(c.overload.enabled);
        let e = with(r#","overload":{"ttft_recover_s":40}"#).unwrap_err();
        assert_eq!(e.field, "overload.ttft_recover_s");
        assert!(e.to_string().contains("must be below"), "{e}");
        let e = with(r#","overload":{"ttft_enter":3}"#).unwrap_err();
        assert!(e.rule.contains("ttft_enter"), "unknown keys are named: {e}");
    }

    #[test]
    fn the_tick_follows_the_shorter_of_sync_and_probe_intervals() {
        let tick = |extra: &str| with(extra).unwrap().tick_ms();
        assert_eq!(tick(r#","sync_interval_ms":800"#), 800);
        assert_eq!(
            tick(r#","sync_interval_ms":8000,"overload":{"probe_interval_ms":500}"#),
            500
        );
        assert_eq!(
            tick(
                r#","sync_interval_ms":8000,"overload":{"enabled":false,"probe_interval_ms":500}"#
            ),
            500,
            "health probes still run"
        );
        assert_eq!(
            tick(
                r#","sync_interval_ms":8000,"overload":{"enabled":false,"probe_interval_ms":500},"health":{"enabled":false}"#
            ),
            8000,
            "no probes: the sync interval alone"
        );
    }

    #[test]
    fn discovery_mode_rules() {
        let c = Config::from_json(br#"{"workers_from":"collector","stats_token":"t"}"#).unwrap();
        assert!(c.discovers() && c.workers.is_empty());
        assert_eq!(c.max_workers, DEFAULT_MAX_WORKERS);
        let e = Config::from_json(br#"{"workers_from":"collector"}"#).unwrap_err();
        assert_eq!(e.field, "stats_token", "membership arrives as pushes");
        let listed = br#"{"workers_from":"collector","stats_token":"t","workers":[{"name":"a"}]}"#;
        assert_eq!(field_of(Config::from_json(listed)), "workers");
        assert_eq!(
            field_of(with(r#","leave_grace_ms":5"#)),
            "leave_grace_ms",
            "the grace applies to discovered workers only"
        );
        assert_eq!(field_of(with(r#","max_workers":1"#)), "workers");
        assert_eq!(field_of(with(r#","max_workers":0"#)), "max_workers");
        assert!(with(r#","max_workers":2"#).is_ok());
        let grown = c
            .with_workers(Config::from_json(TWO_WORKERS.as_bytes()).unwrap().workers)
            .unwrap();
        assert_eq!(grown.workers.len(), 2, "a pushed list swaps in");
        assert!(!grown.is_pd());
    }

    #[test]
    fn models_restrict_serving() {
        let c = Config::from_json(br#"{"workers":[{"name":"a","models":["m1"]}]}"#).unwrap();
        assert!(c.workers[0].serves("m1"));
        assert!(!c.workers[0].serves("m2"));
    }

    #[test]
    fn predicted_ttft_knobs_have_defaults_and_rules() {
        let c = with(r#","policy":"predicted_ttft""#).unwrap();
        assert_eq!(c.policy, Policy::PredictedTtft);
        assert!(c.uses_predicted_ttft());
        with(r#","policy":"predicted_ttft","load_factor":0,"prefill_us_per_char":2.5,"service_ms":0"#)
            .unwrap();
        assert!(
            with(r#","ttft_sample_size":8"#).is_ok(),
            "the default policy's"
        );
        let e = aware(r#","ttft_sample_size":8"#).unwrap_err();
        assert_eq!(
            e.field, "ttft_sample_size",
            "refused where no pool routes by it"
        );
        for (extra, field) in [
            (r#","load_factor":-0.1"#, "load_factor"),
            (r#","prefill_us_per_char":0"#, "prefill_us_per_char"),
            (r#","service_ms":-1"#, "service_ms"),
        ] {
            let e = with(&format!(r#","policy":"predicted_ttft"{extra}"#)).unwrap_err();
            assert_eq!(e.field, field, "{extra}: a bad value names its field");
        }
        let e = aware(r#","load_factor":0.5"#).unwrap_err();
        assert_eq!(e.field, "load_factor");
        assert!(e.rule.contains("predicted_ttft"), "{}", e.rule);
        assert!(!aware("").unwrap().uses_predicted_ttft());
        assert!(with("").unwrap().uses_predicted_ttft());
        let port = r#""address":"10.0.0.5:30000","bootstrap_port":8998"#;
        let pdc = pd(
            port,
            r#","prefill_policy":"predicted_ttft","load_factor":1"#,
        )
        .unwrap();
        assert!(pdc.uses_predicted_ttft());
        assert!(pd(port, r#","load_factor":1"#).is_ok(), "the default's");
        assert_eq!(
            pd(port, r#","prefill_policy":"cache_aware","load_factor":1"#)
                .unwrap_err()
                .field,
            "load_factor"
        );
    }
}
