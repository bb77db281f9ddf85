//! A run: one policy over one workload on a fresh fleet behind the filter, its plugin
//! configuration and its report. `envoy/demo` (real Envoy and engine mocks) and
//! `host-sim replay` (the same filter in virtual time) both report through this, so
//! the two print the same summary and the same last-line JSON.
//!
//! The report shows the load tool's [`Summary`] plus the filter's own counters
//! (decision labels, tree sync, queue gate) as Envoy names them,
//! `wasmcustom.llm_router_*`. The last line of stdout is one JSON object: the main
//! run's fields, `envoy_concurrency`, `workers`, and the baseline run under `baseline`.

use crate::report::JsonSummary;
use crate::stats::Summary;
use anyhow::{bail, Result};
use llm_router::decision::{Label, Reason};
use llm_router::support::metric_names as names;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;

/// The knobs the `no_gate` baseline removes.
pub const GATE_KNOBS: [&str; 2] = ["worker_queue_limit", "saturation_queue_floor"];
/// Queue gate and collector counters (`kv_match`'s are `names::KV_MATCH_COUNTERS`),
/// reported under their names without the `llm_router_` prefix.
const GATE_COUNTERS: [&str; 5] = [
    names::QUEUE_GATE_REJECTIONS,
    names::QUEUE_GATE_INERT,
    names::SATURATION_PINS,
    names::STATS_PUSHES_ACCEPTED,
    names::STATS_PUSHES_REJECTED,
];
/// Cross-thread tree sync counters, reported without the `llm_router_sync_` prefix:
/// `applied` counts ring operations applied by all threads together (about routed
/// requests x threads); `gaps` operations a thread missed by falling a ring behind;
/// `append_failures` operations kept on one thread.
const SYNC_COUNTERS: [&str; 3] = [
    names::SYNC_APPLIED,
    names::SYNC_GAPS,
    names::SYNC_APPEND_FAILURES,
];
/// `route_in: one_vm`'s counters, reported with the sync's without the
/// `llm_router_` prefix: requests the routing VM decided for another thread, those
/// routed by load after the deadline, routing VMs replaced.
const RELAY_COUNTERS: [&str; 3] = [
    names::RELAY_ANSWERED,
    names::RELAY_LATE,
    names::RELAY_TAKEOVERS,
];

/// A filter stat as Envoy's `/stats` names it.
pub fn envoy_stat(name: &str) -> String {
    format!("wasmcustom.{name}")
}

/// The config key a run's `--policy` sets: the regular pool's `policy`, or with
/// prefill/decode disaggregation the prefill pool's (where the prompt cache is).
pub fn policy_key(pd: bool) -> &'static str {
    if pd {
        "prefill_policy"
    } else {
        "policy"
    }
}

/// A run's plugin config: `policy` (under `policy_key`), a fixed `rng_seed` (so
/// two runs of the same workload take the same decisions), then `extra`
/// (`--filter-config` / `--config`) merged over it. The baseline keeps its own policy
/// (`policy != main_policy`); `no_gate` drops the gate knobs.
pub fn plugin_config(
    policy_key: &str,
    policy: &str,
    main_policy: &str,
    extra: Option<&Value>,
    no_gate: bool,
    seed: u64,
) -> Result<Value> {
    let mut cfg = Map::new();
    cfg.insert(policy_key.into(), json!(policy));
    cfg.insert("rng_seed".into(), json!(seed));
    match extra {
        None => {}
        Some(Value::Object(extra)) => {
            for (k, v) in extra {
                if (k != policy_key || policy == main_policy)
                    && !(no_gate && GATE_KNOBS.contains(&k.as_str()))
                {
                    cfg.insert(k.clone(), v.clone());
                }
            }
        }
        Some(_) => bail!("the extra plugin config must be a JSON object"),
    }
    Ok(Value::Object(cfg))
}

/// A policy variant, `policy+key=value+...`: the policy and the plugin settings it
/// adds (a value is read as JSON, else as a string), so one build can be measured
/// with a setting and without, side by side (`benches/overhead --variants`,
/// `host-sim sweep --policies`).
pub fn policy_variant(variant: &str) -> Result<(&str, Map<String, Value>)> {
    let mut parts = variant.split('+');
    let policy = parts.next().unwrap_or_default();
    let mut settings = Map::new();
    for part in parts {
        let Some((key, value)) = part.split_once('=') else {
            bail!("variant setting `{part}`: expected key=value");
        };
        let value = serde_json::from_str(value).unwrap_or_else(|_| Value::from(value));
        settings.insert(key.to_string(), value);
    }
    Ok((policy, settings))
}

/// What one run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct RunResult {
    /// The policy, or `<policy>+no_gate` for the gate-less baseline.
    pub policy: String,
    pub summary: Summary,
    /// Decision counts per label.
    pub decisions: BTreeMap<String, u64>,
    /// Why each decision was taken (`x-llm-router-reason`), the reasons seen.
    pub reasons: BTreeMap<String, u64>,
    /// Cross-thread tree sync counters.
    pub sync: BTreeMap<String, u64>,
    /// Queue gate and collector counters.
    pub gate: BTreeMap<String, u64>,
    /// What a particular run adds (PD pairs, overload phases): report lines...
    pub notes: Vec<String>,
    /// ...and keys of its JSON.
    pub fields: Map<String, Value>,
}

impl RunResult {
    /// The filter's counters from stats by Envoy name (`wasmcustom.NAME`), 0 if absent.
    pub fn new(policy: String, summary: Summary, stat: impl Fn(&str) -> Option<u64>) -> Self {
        let pick = |prefix: &str, metrics: &[&str]| -> BTreeMap<String, u64> {
            metrics
                .iter()
                .map(|m| {
                    let key = m.strip_prefix(prefix).unwrap_or(m);
                    (key.to_string(), stat(&envoy_stat(m)).unwrap_or(0))
                })
                .collect()
        };
        let decisions = Label::ALL
            .iter()
            .map(|l| {
                let v = stat(&envoy_stat(&names::decision_metric(*l))).unwrap_or(0);
                (l.as_str().to_string(), v)
            })
            .collect();
        let reasons = Reason::ALL
            .iter()
            .filter_map(|r| {
                let v = stat(&envoy_stat(&names::reason_metric(*r)))?;
                (v > 0).then(|| (r.as_str().to_string(), v))
            })
            .collect();
        Self {
            policy,
            summary,
            decisions,
            reasons,
            sync: pick("llm_router_sync_", &SYNC_COUNTERS)
                .into_iter()
                .chain(pick("llm_router_", &RELAY_COUNTERS))
                .collect(),
            gate: pick("llm_router_", &GATE_COUNTERS)
                .into_iter()
                .chain(pick("llm_router_", &names::KV_MATCH_COUNTERS))
                .collect(),
            notes: Vec::new(),
            fields: Map::new(),
        }
    }

    /// The human report of the run.
    pub fn report(&self) -> String {
        let s = &self.summary;
        let mut out = format!("== policy {} ==\n", self.policy);
        out += &format!(
            "  requests {}  errors {}  wall {:.2}s  ({:.1} req/s)\n",
            s.requests, s.errors, s.wall_s, s.req_per_s
        );
        for (line, reason, n) in &s.error_reasons {
            out += &format!("  error x{n} (first at workload line {line}): {reason}\n");
        }
        let total: u64 = s.per_worker.values().sum();
        for (w, n) in &s.per_worker {
            let share = if total > 0 {
                100.0 * *n as f64 / total as f64
            } else {
                0.0
            };
            out += &format!("  {w:>6}: {n:>5} requests ({share:5.1}%)\n");
        }
        out += &format!(
            "  engine-reported cached tokens: {} of {} prompt tokens = {:.1}%\n",
            s.cached_tokens,
            s.prompt_tokens,
            100.0 * s.cached_token_ratio
        );
        out += &format!("  latency p50 {}  p99 {}\n", ms(s.p50_ms), ms(s.p99_ms));
        if s.streams > 0 {
            out += &format!(
                "  TTFT ({} streams) p50 {}  p99 {}\n",
                s.streams,
                ms(s.ttft_p50_ms),
                ms(s.ttft_p99_ms)
            );
        }
        let join = |m: &BTreeMap<String, u64>| -> String {
            let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v}")).collect();
            parts.join(", ")
        };
        out += &format!(
            "  router decisions (Envoy stats): {}\n",
            join(&self.decisions)
        );
        out += &format!("  reasons: {}\n", join(&self.reasons));
        out += &format!("  tree sync across Envoy threads: {}\n", join(&self.sync));
        // `kv_match`'s counters only where it asked (they are all 0 without it).
        let asked = self
            .gate
            .iter()
            .any(|(k, v)| k.starts_with("kv_match") && *v > 0);
        let gate: BTreeMap<String, u64> = self
            .gate
            .iter()
            .filter(|(k, _)| asked || !k.starts_with("kv_match"))
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        out += &format!("  queue gate and collector: {}\n", join(&gate));
        for note in &self.notes {
            out += &format!("  {note}\n");
        }
        out
    }

    /// The run as JSON.
    pub fn json(&self) -> Value {
        let j = JsonSummary::from(&self.summary);
        let mut out = json!({
            "requests": j.requests,
            "errors": j.errors,
            "per_worker": j.per_worker,
            "cached_token_ratio": j.cached_token_ratio,
            "p50_ms": j.p50_ms,
            "p99_ms": j.p99_ms,
            "ttft_p50_ms": j.ttft_p50_ms,
            "ttft_p99_ms": j.ttft_p99_ms,
            "policy": self.policy,
            "decisions": self.decisions,
            "reasons": self.reasons,
            "sync": self.sync,
            "gate": self.gate,
            "prompt_tokens": j.prompt_tokens,
            "cached_tokens": j.cached_tokens,
        });
        if let Value::Object(map) = &mut out {
            map.extend(self.fields.clone());
        }
        out
    }
}

/// PD: pairs as the decode engines report them, failures as the filter counts them,
/// and the prefill pool's share of the work.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PdCounts {
    /// Rooms whose KV reached a decode engine from its prefill engine.
    pub pairs: u64,
    /// Rooms whose KV never came.
    pub kv_failures: u64,
    /// The filter's `llm_router_pd_prefill_failures`.
    pub prefill_failures: u64,
    /// Prompts each prefill engine computed.
    pub prefill_per_worker: BTreeMap<String, u64>,
}

impl PdCounts {
    /// The pairs' report lines and summary keys.
    pub fn add_to(&self, r: &mut RunResult) {
        let p: Vec<String> = self
            .prefill_per_worker
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        r.notes
            .push(format!("prefill pool (prompts computed): {}", p.join(", ")));
        r.notes.push(format!(
            "PD pairs met by room (decode engines): {}  KV never arrived: {}  prefill failures (filter): {}",
            self.pairs, self.kv_failures, self.prefill_failures
        ));
        r.fields.insert("pd_pairs".into(), json!(self.pairs));
        r.fields
            .insert("pd_kv_failures".into(), json!(self.kv_failures));
        r.fields
            .insert("pd_prefill_failures".into(), json!(self.prefill_failures));
        r.fields
            .insert("prefill_per_worker".into(), json!(self.prefill_per_worker));
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or("n/a".to_string(), |v| format!("{v:.1} ms"))
}

/// The whole report after the runs: each run, the comparison line, where the logs are
/// (if anywhere), then the last-line JSON.
pub fn print_report(
    main: &RunResult,
    baseline: Option<&RunResult>,
    envoy_concurrency: u32,
    workers: usize,
    logs: Option<&str>,
) {
    println!();
    print!("{}", main.report());
    if let Some(b) = baseline {
        print!("{}", b.report());
        println!(
            "== {} vs {}: cached token ratio {:.1}% vs {:.1}%, p99 {} vs {} ==",
            main.policy,
            b.policy,
            100.0 * main.summary.cached_token_ratio,
            100.0 * b.summary.cached_token_ratio,
            ms(main.summary.p99_ms),
            ms(b.summary.p99_ms)
        );
    }
    if let Some(logs) = logs {
        println!("logs and configs: {logs}");
    }
    println!("{}", last_line(main, baseline, envoy_concurrency, workers));
}

/// The last-line JSON.
pub fn last_line(
    main: &RunResult,
    baseline: Option<&RunResult>,
    envoy_concurrency: u32,
    workers: usize,
) -> Value {
    let mut out = main.json();
    out["envoy_concurrency"] = json!(envoy_concurrency);
    out["workers"] = json!(workers);
    if let Some(b) = baseline {
        out["baseline"] = b.json();
    }
    out
}

/// The baseline run's name when none is given: `no_gate` if the main run sets the
/// gate, else `round_robin`.
pub fn default_baseline(main_config: &Value) -> &'static str {
    if main_config.get("worker_queue_limit").is_some() {
        "no_gate"
    } else {
        "round_robin"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variant_names_its_policy_and_its_settings() {
        let (policy, settings) = policy_variant("predicted_ttft+load_factor=1.5+x=abc").unwrap();
        assert_eq!(policy, "predicted_ttft");
        assert_eq!(settings["load_factor"], 1.5, "a value is read as JSON");
        assert_eq!(settings["x"], "abc", "else as a string");
        assert_eq!(policy_variant("random").unwrap(), ("random", Map::new()));
        let err = policy_variant("random+oops").unwrap_err().to_string();
        assert!(err.contains("`oops`"), "{err}");
    }

    #[test]
    fn baseline_keeps_its_policy_and_no_gate_drops_the_gate() {
        let extra = json!({"policy": "random", "worker_queue_limit": 2, "cache_threshold": 0.5});
        let main = plugin_config("policy", "random", "random", Some(&extra), false, 42).unwrap();
        assert_eq!(main["policy"], "random");
        assert_eq!(main["worker_queue_limit"], 2);
        assert_eq!(main["rng_seed"], 42);
        assert_eq!(default_baseline(&main), "no_gate");
        let rr = plugin_config("policy", "round_robin", "random", Some(&extra), true, 42).unwrap();
        assert_eq!(rr["policy"], "round_robin");
        assert!(rr.get("worker_queue_limit").is_none());
        assert_eq!(rr["cache_threshold"], 0.5);
        assert!(plugin_config("policy", "x", "x", Some(&json!([1])), false, 0).is_err());
        let pd_extra = json!({"prefill_policy": "random"});
        let pd = plugin_config(
            policy_key(true),
            "round_robin",
            "cache_aware",
            Some(&pd_extra),
            false,
            1,
        )
        .unwrap();
        assert_eq!(
            pd["prefill_policy"], "round_robin",
            "the baseline keeps its own"
        );
        assert!(pd.get("policy").is_none());
    }

    #[test]
    fn counters_are_read_by_envoy_name() {
        let mut r = RunResult::new(
            "cache_aware".into(),
            Summary::default(),
            |name| match name {
                "wasmcustom.llm_router_decisions_cache_hit" => Some(7),
                "wasmcustom.llm_router_reasons_cache_hit" => Some(7),
                "wasmcustom.llm_router_reasons_imbalanced" => Some(0),
                _ => None,
            },
        );
        r.notes.push("PD pairs 3".into());
        r.fields.insert("pd_pairs".into(), json!(3));
        assert_eq!(r.decisions["cache_hit"], 7);
        assert_eq!(r.decisions["cache_miss"], 0);
        assert_eq!(
            r.reasons,
            BTreeMap::from([("cache_hit".to_string(), 7)]),
            "the reasons seen, none that never happened"
        );
        assert!(r.report().contains("  reasons: cache_hit 7\n"));
        let line = last_line(&r, Some(&r), 1, 4);
        assert_eq!(line["decisions"]["cache_hit"], 7);
        assert_eq!(line["reasons"], json!({"cache_hit": 7}));
        assert_eq!(line["baseline"]["policy"], "cache_aware");
        assert_eq!(
            (line["workers"].clone(), line["envoy_concurrency"].clone()),
            (json!(4), json!(1))
        );
        assert!(r
            .report()
            .contains("router decisions (Envoy stats): all_queued 0"));
        assert!(r.report().ends_with("  PD pairs 3\n"));
        assert_eq!(line["pd_pairs"], 3);
    }
}
