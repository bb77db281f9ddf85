//! Latency-aware overload flags (seed 003): a marker, not a policy. A flagged worker
//! is removed from the candidates before any policy runs (see `router`).
//!
//! Per worker, a two-state machine with hysteresis:
//! - healthy -> overloaded when the engine's fresh TTFT p90 >= `ttft_enter_s` or its
//!   TPOT p90 >= `tpot_enter_s` (defaults 30 s and 0.3 s);
//! - overloaded -> healthy only when the latency is below both recover thresholds
//!   (TTFT p90 < `ttft_recover_s`, TPOT p90 < `tpot_recover_s`; defaults 16 s and
//!   0.08 s) AND the last `probe_successes_to_recover` active probes succeeded. A
//!   failed probe resets the run, so consecutive failures keep the worker flagged.
//!
//! Between the thresholds lies the grey zone: it changes nothing, so latency that
//! oscillates inside it cannot make the flag thrash (and thrashing is what ruins
//! cache affinity: every flip moves a hot prefix to another engine).
//!
//! Missing or stale signals never flip a flag: no fresh sample, or a sample without
//! either p90 (the engine saw no requests in the collector's window), is `Unknown`
//! and leaves the state as it is. A fresh sample lacking one of the two p90s (SGLang
//! exports no TPOT histogram) is judged on the other. While a worker is flagged it
//! gets no traffic, so its engine's p90s would go silent; the probes are what keeps
//! them current (each probe is a real, tiny generation the engine measures).
//!
//! Probes run on a timer, from one VM per Envoy: the holder of a lease in shared
//! data, renewed on every tick and taken over by any VM once it has expired. The
//! lease holder is also the only writer of the flag table, so every Envoy thread
//! filters the same set.

use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::{Config, ConfigError, Target, WorkerConfig};
use crate::load::LoadTable;
use crate::sync::{SetOutcome, SharedStore, CAS_ATTEMPTS};

pub const DEFAULT_TTFT_ENTER_S: f64 = 30.0;
pub const DEFAULT_TTFT_RECOVER_S: f64 = 16.0;
pub const DEFAULT_TPOT_ENTER_S: f64 = 0.3;
pub const DEFAULT_TPOT_RECOVER_S: f64 = 0.08;
pub const DEFAULT_PROBE_INTERVAL_MS: u64 = 5_000;
/// Below the default TTFT recover threshold: a probe that waits longer than that
/// says the worker cannot take work promptly yet.
pub const DEFAULT_PROBE_TIMEOUT_MS: u64 = 10_000;
pub const DEFAULT_PROBE_PATH: &str = "/v1/completions";
/// Two output tokens, so the probe gives the engine one TTFT and one TPOT
/// observation; no `model`, which vLLM and SGLang fill in with the served model.
pub const DEFAULT_PROBE_BODY: &str = r#"{"prompt":"ping","max_tokens":2}"#;
pub const DEFAULT_PROBE_SUCCESSES_TO_RECOVER: u32 = 3;
/// The lease outlives this many prober ticks, so one late tick does not hand it
/// over, and a VM that stopped ticking loses it within a few.
pub const LEASE_TICKS: u64 = 3;

fn default_true() -> bool {
    true
}
fn default_ttft_enter() -> f64 {
    DEFAULT_TTFT_ENTER_S
}
fn default_ttft_recover() -> f64 {
    DEFAULT_TTFT_RECOVER_S
}
fn default_tpot_enter() -> f64 {
    DEFAULT_TPOT_ENTER_S
}
fn default_tpot_recover() -> f64 {
    DEFAULT_TPOT_RECOVER_S
}
fn default_probe_interval() -> u64 {
    DEFAULT_PROBE_INTERVAL_MS
}
fn default_probe_timeout() -> u64 {
    DEFAULT_PROBE_TIMEOUT_MS
}
fn default_probe_path() -> String {
    DEFAULT_PROBE_PATH.to_string()
}
fn default_probe_body() -> Option<String> {
    Some(DEFAULT_PROBE_BODY.to_string())
}
fn default_probe_successes() -> u32 {
    DEFAULT_PROBE_SUCCESSES_TO_RECOVER
}

/// The `overload` object of the plugin configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverloadConfig {
    /// `false`: no flags, no filtering, no probes; the flag table is cleared.
    #[serde(default = "default_true")]
    pub enabled: bool,
    #[serde(default = "default_ttft_enter")]
    pub ttft_enter_s: f64,
    #[serde(default = "default_ttft_recover")]
    pub ttft_recover_s: f64,
    #[serde(default = "default_tpot_enter")]
    pub tpot_enter_s: f64,
    #[serde(default = "default_tpot_recover")]
    pub tpot_recover_s: f64,
    #[serde(default = "default_probe_interval")]
    pub probe_interval_ms: u64,
    #[serde(default = "default_probe_timeout")]
    pub probe_timeout_ms: u64,
    #[serde(default = "default_probe_path")]
    pub probe_path: String,
    /// POSTed to `probe_path`; `null` sends a GET (e.g. to `/health`).
    #[serde(default = "default_probe_body")]
    pub probe_body: Option<String>,
    #[serde(default = "default_probe_successes")]
    pub probe_successes_to_recover: u32,
}

impl Default for OverloadConfig {
    fn default() -> Self {
        OverloadConfig {
            enabled: true,
            ttft_enter_s: DEFAULT_TTFT_ENTER_S,
            ttft_recover_s: DEFAULT_TTFT_RECOVER_S,
            tpot_enter_s: DEFAULT_TPOT_ENTER_S,
            tpot_recover_s: DEFAULT_TPOT_RECOVER_S,
            probe_interval_ms: DEFAULT_PROBE_INTERVAL_MS,
            probe_timeout_ms: DEFAULT_PROBE_TIMEOUT_MS,
            probe_path: DEFAULT_PROBE_PATH.to_string(),
            probe_body: default_probe_body(),
            probe_successes_to_recover: DEFAULT_PROBE_SUCCESSES_TO_RECOVER,
        }
    }
}

fn rule(field: &str, rule: impl Into<String>) -> ConfigError {
    ConfigError {
        field: format!("overload.{field}"),
        rule: rule.into(),
    }
}

impl OverloadConfig {
    /// Each value on its own first, then recover below enter (the hysteresis).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("ttft_enter_s", self.ttft_enter_s),
            ("ttft_recover_s", self.ttft_recover_s),
            ("tpot_enter_s", self.tpot_enter_s),
            ("tpot_recover_s", self.tpot_recover_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return Err(rule(field, "must be a finite number > 0"));
            }
        }
        if self.probe_interval_ms < 10 {
            return Err(rule("probe_interval_ms", "must be >= 10"));
        }
        if self.probe_timeout_ms == 0 {
            return Err(rule("probe_timeout_ms", "must be >= 1"));
        }
        if !self.probe_path.starts_with('/') {
            return Err(rule("probe_path", "must start with `/`"));
        }
        if self.probe_successes_to_recover == 0 {
            return Err(rule("probe_successes_to_recover", "must be >= 1"));
        }
        for (field, recover, enter_field, enter) in [
            (
                "ttft_recover_s",
                self.ttft_recover_s,
                "ttft_enter_s",
                self.ttft_enter_s,
            ),
            (
                "tpot_recover_s",
                self.tpot_recover_s,
                "tpot_enter_s",
                self.tpot_enter_s,
            ),
        ] {
            if recover >= enter {
                return Err(rule(
                    field,
                    format!(
                        "({recover}) must be below `overload.{enter_field}` ({enter}): \
                         equal thresholds leave no hysteresis and the flag thrashes"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The run of successful probes a worker needs to recover. A worker that cannot
    /// be probed (`target: endpoint` without a cluster of its own: a probe to the
    /// shared cluster would land on any engine) recovers on latency alone; the glue
    /// says so in the log rather than pretending to probe it.
    pub fn probes_needed(&self, probeable: bool) -> u32 {
        if probeable {
            self.probe_successes_to_recover
        } else {
            0
        }
    }

    /// How long a prober lease lasts when the prober ticks every `tick_ms`.
    pub fn lease_ms(tick_ms: u64) -> u64 {
        tick_ms.saturating_mul(LEASE_TICKS)
    }
}

/// The cluster that reaches exactly this worker, for its probes: its own cluster
/// with `target: cluster`; with `target: endpoint` the pool shares one cluster and a
/// probe to it could land on any engine, so only a `cluster` set on the worker (one
/// holding just its engine) will do.
pub fn probe_cluster<'a>(cfg: &Config, w: &'a WorkerConfig) -> Option<&'a str> {
    match cfg.target {
        Target::Cluster => Some(w.cluster()),
        Target::Endpoint => w.cluster.as_deref(),
    }
}

/// Which latency made a worker overloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EnterReason {
    Ttft,
    Tpot,
}

impl EnterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            EnterReason::Ttft => "ttft",
            EnterReason::Tpot => "tpot",
        }
    }

    fn parse(s: &str) -> Option<EnterReason> {
        match s {
            "ttft" => Some(EnterReason::Ttft),
            "tpot" => Some(EnterReason::Tpot),
            _ => None,
        }
    }
}

/// A worker's latency against the thresholds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Latency {
    /// At or above an enter threshold (TTFT is checked first).
    Over(EnterReason),
    /// Below both recover thresholds (of the p90s the engine reports).
    Under,
    /// Between the thresholds: changes nothing.
    Grey,
    /// No fresh sample with a p90: changes nothing.
    Unknown,
}

/// Judges one worker's fresh sample (if any) against the thresholds.
pub fn assess(
    table: &LoadTable,
    worker: usize,
    now_ms: u64,
    stale_after_ms: u64,
    cfg: &OverloadConfig,
) -> Latency {
    let Some(s) = table.fresh(worker, now_ms, stale_after_ms) else {
        return Latency::Unknown;
    };
    match (s.ttft_p90_s, s.tpot_p90_s) {
        (None, None) => Latency::Unknown,
        (ttft, tpot) => {
            if ttft.is_some_and(|v| v >= cfg.ttft_enter_s) {
                Latency::Over(EnterReason::Ttft)
            } else if tpot.is_some_and(|v| v >= cfg.tpot_enter_s) {
                Latency::Over(EnterReason::Tpot)
            } else if ttft.is_none_or(|v| v < cfg.ttft_recover_s)
                && tpot.is_none_or(|v| v < cfg.tpot_recover_s)
            {
                Latency::Under
            } else {
                Latency::Grey
            }
        }
    }
}

/// What the machine is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Latency(Latency),
    /// A probe's outcome: a 2xx answer within `probe_timeout_ms`, or not.
    Probe {
        ok: bool,
    },
}

/// A flip of the flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Entered(EnterReason),
    /// After this long flagged.
    Recovered {
        after_ms: u64,
    },
}

/// One worker's flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flag {
    Healthy {
        since_ms: u64,
    },
    Overloaded {
        since_ms: u64,
        reason: EnterReason,
        /// Consecutive successful probes (reset by a failure).
        probe_successes: u32,
        /// The last known latency was below both recover thresholds.
        latency_recovered: bool,
    },
}

impl Default for Flag {
    fn default() -> Self {
        Flag::Healthy { since_ms: 0 }
    }
}

impl Flag {
    pub fn is_overloaded(&self) -> bool {
        matches!(self, Flag::Overloaded { .. })
    }

    /// Applies `event` at `now_ms`; returns the transition if the flag flipped.
    /// `probes_needed` is the run of successful probes recovery takes (see
    /// `OverloadConfig::probes_needed`).
    pub fn step(&mut self, event: Event, now_ms: u64, probes_needed: u32) -> Option<Transition> {
        match self {
            Flag::Healthy { .. } => match event {
                Event::Latency(Latency::Over(reason)) => {
                    *self = Flag::Overloaded {
                        since_ms: now_ms,
                        reason,
                        probe_successes: 0,
                        latency_recovered: false,
                    };
                    Some(Transition::Entered(reason))
                }
                // Probes only matter while flagged; a late answer changes nothing.
                _ => None,
            },
            Flag::Overloaded {
                since_ms,
                probe_successes,
                latency_recovered,
                ..
            } => {
                match event {
                    Event::Latency(Latency::Under) => *latency_recovered = true,
                    Event::Latency(Latency::Over(_) | Latency::Grey) => *latency_recovered = false,
                    Event::Latency(Latency::Unknown) => {}
                    Event::Probe { ok: true } => {
                        *probe_successes = probe_successes.saturating_add(1)
                    }
                    Event::Probe { ok: false } => *probe_successes = 0,
                }
                if *latency_recovered && *probe_successes >= probes_needed {
                    let after_ms = now_ms.saturating_sub(*since_ms);
                    *self = Flag::Healthy { since_ms: now_ms };
                    return Some(Transition::Recovered { after_ms });
                }
                None
            }
        }
    }
}

/// Every worker's flag, by worker index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flags(pub Vec<Flag>);

impl Flags {
    /// Overloaded or not, by worker index, as the router takes it.
    pub fn overloaded(&self) -> Vec<bool> {
        self.0.iter().map(Flag::is_overloaded).collect()
    }

    pub fn count(&self) -> usize {
        self.0.iter().filter(|f| f.is_overloaded()).count()
    }

    /// Stored form: worker name -> flag, so VMs on another config version still find
    /// their workers.
    pub fn encode(&self, workers: &[WorkerConfig]) -> Vec<u8> {
        let mut map = serde_json::Map::new();
        for (w, f) in workers.iter().zip(&self.0) {
            let v = match f {
                Flag::Healthy { since_ms } => json!({"since": since_ms}),
                Flag::Overloaded {
                    since_ms,
                    reason,
                    probe_successes,
                    latency_recovered,
                } => json!({"since": since_ms, "reason": reason.as_str(),
                            "probes_ok": probe_successes, "latency_ok": latency_recovered}),
            };
            map.insert(w.name.clone(), v);
        }
        serde_json::to_vec(&Value::Object(map)).unwrap_or_default()
    }

    /// Reads a stored table for `workers` (absent or garbled entries: healthy).
    pub fn decode(bytes: &[u8], workers: &[WorkerConfig]) -> Flags {
        let map: serde_json::Map<String, Value> = serde_json::from_slice(bytes).unwrap_or_default();
        Flags(
            workers
                .iter()
                .map(|w| {
                    let v = map.get(&w.name)?;
                    let since_ms = v.get("since")?.as_u64()?;
                    let Some(reason) = v.get("reason") else {
                        return Some(Flag::Healthy { since_ms });
                    };
                    Some(Flag::Overloaded {
                        since_ms,
                        reason: EnterReason::parse(reason.as_str()?)?,
                        probe_successes: u32::try_from(v.get("probes_ok")?.as_u64()?).ok()?,
                        latency_recovered: v.get("latency_ok")?.as_bool()?,
                    })
                })
                .map(Option::unwrap_or_default)
                .collect(),
        )
    }
}

/// The flag table in shared data (one key).
#[derive(Debug, Clone)]
pub struct FlagTable {
    key: String,
}

impl FlagTable {
    pub fn new(prefix: &str) -> FlagTable {
        FlagTable {
            key: format!("{prefix}.overload.flags"),
        }
    }

    pub fn read(&self, store: &dyn SharedStore, workers: &[WorkerConfig]) -> Flags {
        store
            .get(&self.key)
            .map(|(v, _)| Flags::decode(&v, workers))
            .unwrap_or_else(|| Flags(vec![Flag::default(); workers.len()]))
    }

    /// Applies `change` to the stored flags with CAS retries and returns the
    /// transitions it made (worker index, transition). Nothing is written when
    /// nothing changed, so a steady state costs one `get`.
    pub fn update(
        &self,
        store: &dyn SharedStore,
        workers: &[WorkerConfig],
        mut change: impl FnMut(&mut Flags) -> Vec<(usize, Transition)>,
    ) -> Vec<(usize, Transition)> {
        for _ in 0..CAS_ATTEMPTS {
            let (mut flags, cas) = match store.get(&self.key) {
                Some((v, cas)) => (Flags::decode(&v, workers), cas),
                None => (Flags(vec![Flag::default(); workers.len()]), 0),
            };
            let before = flags.clone();
            let flips = change(&mut flags);
            if flags == before {
                return flips;
            }
            match store.set(&self.key, &flags.encode(workers), cas) {
                SetOutcome::Stored => return flips,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return Vec::new(),
            }
        }
        Vec::new()
    }

    /// Forgets every flag (overload detection switched off): no stale flag is left
    /// for when it is switched on again.
    pub fn clear(&self, store: &dyn SharedStore) {
        if store.get(&self.key).is_some_and(|(v, _)| v != b"{}") {
            store.set(&self.key, b"{}", 0);
        }
    }
}

/// Steps every worker's flag on its latency at `now_ms`; `probeable` by worker
/// index (missing: probeable).
pub fn observe_latencies(
    flags: &mut Flags,
    table: &LoadTable,
    now_ms: u64,
    stale_after_ms: u64,
    cfg: &OverloadConfig,
    probeable: &[bool],
) -> Vec<(usize, Transition)> {
    flags
        .0
        .iter_mut()
        .enumerate()
        .filter_map(|(i, f)| {
            let l = assess(table, i, now_ms, stale_after_ms, cfg);
            let needed = cfg.probes_needed(probeable.get(i).copied().unwrap_or(true));
            f.step(Event::Latency(l), now_ms, needed).map(|t| (i, t))
        })
        .collect()
}

/// The prober's lease: which VM probes, until when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub holder: u64,
    pub until_ms: u64,
}

impl Lease {
    pub fn encode(&self) -> Vec<u8> {
        format!("{}:{}", self.holder, self.until_ms).into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Option<Lease> {
        let s = std::str::from_utf8(bytes).ok()?;
        let (h, u) = s.split_once(':')?;
        Some(Lease {
            holder: h.parse().ok()?,
            until_ms: u.parse().ok()?,
        })
    }
}

/// The lease `me` should write at `now_ms`, if it may hold it: it holds it already
/// (renewal), there is none, or the holder stopped renewing (takeover).
pub fn claim(current: Option<Lease>, me: u64, now_ms: u64, ttl_ms: u64) -> Option<Lease> {
    let free = match current {
        None => true,
        Some(l) => l.holder == me || now_ms >= l.until_ms,
    };
    free.then_some(Lease {
        holder: me,
        until_ms: now_ms.saturating_add(ttl_ms),
    })
}

/// The lease key in shared data.
#[derive(Debug, Clone)]
pub struct ProbeLease {
    key: String,
}

impl ProbeLease {
    pub fn new(prefix: &str) -> ProbeLease {
        ProbeLease {
            key: format!("{prefix}.overload.lease"),
        }
    }

    /// Takes or renews the lease for `me`; whether `me` holds it now. Two VMs that
    /// both see it free race on the CAS and one wins.
    pub fn acquire(&self, store: &dyn SharedStore, me: u64, now_ms: u64, ttl_ms: u64) -> bool {
        let (current, cas) = match store.get(&self.key) {
            Some((v, cas)) => (Lease::decode(&v), cas),
            None => (None, 0),
        };
        match claim(current, me, now_ms, ttl_ms) {
            Some(l) => store.set(&self.key, &l.encode(), cas) == SetOutcome::Stored,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{EngineSample, Report};
    use crate::sync::testing::MemStore;

    fn cfg() -> OverloadConfig {
        OverloadConfig {
            probe_successes_to_recover: 2,
            ..OverloadConfig::default()
        }
    }

    fn sample(ttft: Option<f64>, tpot: Option<f64>, at_ms: u64) -> LoadTable {
        LoadTable {
            reports: vec![Some(Report::Sample(EngineSample {
                num_waiting: 0,
                num_running: 0,
                kv_usage: None,
                ttft_p90_s: ttft,
                tpot_p90_s: tpot,
                at_ms,
            }))],
        }
    }

    fn judge(ttft: Option<f64>, tpot: Option<f64>) -> Latency {
        assess(&sample(ttft, tpot, 0), 0, 0, 5000, &cfg())
    }

    #[test]
    fn latency_boundaries() {
        use EnterReason::*;
        use Latency::*;
        // (ttft, tpot, verdict, why)
        let cases = [
            (Some(30.0), Some(0.0), Over(Ttft), "ttft at enter is over"),
            (Some(29.99), Some(0.01), Grey, "just below enter"),
            (Some(16.0), Some(0.01), Grey, "ttft at recover is not under"),
            (Some(15.99), Some(0.079), Under, "both below recover"),
            (Some(1.0), Some(0.3), Over(Tpot), "tpot at enter is over"),
            (Some(1.0), Some(0.08), Grey, "tpot at recover is not under"),
            (Some(31.0), Some(0.5), Over(Ttft), "ttft is named first"),
            (None, Some(0.01), Under, "no ttft: judged on tpot"),
            (Some(1.0), None, Under, "no tpot (SGLang): judged on ttft"),
            (None, Some(0.4), Over(Tpot), "tpot alone can flag"),
            (None, None, Unknown, "no p90 at all"),
        ];
        for (ttft, tpot, want, why) in cases {
            assert_eq!(judge(ttft, tpot), want, "{why}");
        }
    }

    #[test]
    fn stale_or_missing_samples_are_unknown() {
        let t = sample(Some(99.0), None, 1000);
        assert_eq!(assess(&t, 0, 6000, 5000, &cfg()), Latency::Unknown, "stale");
        assert_eq!(
            assess(&t, 0, 5999, 5000, &cfg()),
            Latency::Over(EnterReason::Ttft)
        );
        assert_eq!(
            assess(&t, 1, 1000, 5000, &cfg()),
            Latency::Unknown,
            "never reported"
        );
        let down = LoadTable {
            reports: vec![Some(Report::Unreachable { at_ms: 1000 })],
        };
        assert_eq!(assess(&down, 0, 1000, 5000, &cfg()), Latency::Unknown);
    }

    fn over() -> Event {
        Event::Latency(Latency::Over(EnterReason::Ttft))
    }
    fn lat(l: Latency) -> Event {
        Event::Latency(l)
    }
    const OK: Event = Event::Probe { ok: true };
    const FAIL: Event = Event::Probe { ok: false };

    /// Runs `events` from healthy; returns the transitions, in order, with their step.
    fn run(events: &[Event]) -> (Flag, Vec<(usize, Transition)>) {
        let c = cfg();
        let mut f = Flag::default();
        let flips = events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                f.step(*e, i as u64, c.probe_successes_to_recover)
                    .map(|t| (i, t))
            })
            .collect();
        (f, flips)
    }

    #[test]
    fn healthy_flips_only_on_over() {
        for e in [
            lat(Latency::Grey),
            lat(Latency::Under),
            lat(Latency::Unknown),
            OK,
            FAIL,
        ] {
            assert_eq!(run(&[e]).1, vec![], "{e:?} leaves a healthy worker alone");
        }
        let (f, flips) = run(&[over()]);
        assert_eq!(flips, vec![(0, Transition::Entered(EnterReason::Ttft))]);
        assert_eq!(
            f,
            Flag::Overloaded {
                since_ms: 0,
                reason: EnterReason::Ttft,
                probe_successes: 0,
                latency_recovered: false
            }
        );
    }

    #[test]
    fn recovery_needs_low_latency_and_a_probe_run() {
        let under = lat(Latency::Under);
        let (f, flips) = run(&[over(), under]);
        assert!(
            f.is_overloaded(),
            "latency alone does not recover: {flips:?}"
        );
        let (f, _) = run(&[over(), OK, OK]);
        assert!(f.is_overloaded(), "probes alone do not recover");
        let (f, _) = run(&[over(), under, OK]);
        assert!(f.is_overloaded(), "one probe short");
        let (_, flips) = run(&[over(), under, OK, OK]);
        assert_eq!(
            flips.last(),
            Some(&(3, Transition::Recovered { after_ms: 3 }))
        );
        let (_, flips) = run(&[over(), OK, OK, under]);
        assert_eq!(
            flips.last(),
            Some(&(3, Transition::Recovered { after_ms: 3 })),
            "either order"
        );
    }

    #[test]
    fn a_failed_probe_restarts_the_run() {
        let under = lat(Latency::Under);
        let (f, _) = run(&[over(), under, OK, FAIL, OK]);
        assert!(f.is_overloaded(), "the run was broken");
        let (f, flips) = run(&[over(), under, OK, FAIL, FAIL, OK, OK]);
        assert!(!f.is_overloaded());
        assert_eq!(
            flips.last(),
            Some(&(6, Transition::Recovered { after_ms: 6 }))
        );
    }

    #[test]
    fn latency_back_up_withdraws_the_latency_half() {
        let (f, _) = run(&[over(), lat(Latency::Under), lat(Latency::Grey), OK, OK]);
        assert!(f.is_overloaded(), "grey after under: not recovered");
        let (f, _) = run(&[over(), lat(Latency::Under), lat(Latency::Unknown), OK, OK]);
        assert!(!f.is_overloaded(), "unknown keeps the last verdict");
    }

    #[test]
    fn grey_zone_oscillation_does_not_thrash() {
        // Latency swinging between just under enter and just over recover, with
        // probes succeeding, from both states: no flip at all.
        let c = cfg();
        let swing = |i: u64| {
            let ttft = if i.is_multiple_of(2) { 29.9 } else { 16.1 };
            assess(&sample(Some(ttft), Some(0.1), i), 0, i, 5000, &c)
        };
        for start in [
            Flag::default(),
            Flag::Overloaded {
                since_ms: 0,
                reason: EnterReason::Ttft,
                probe_successes: 0,
                latency_recovered: false,
            },
        ] {
            let mut f = start;
            for i in 0..100 {
                assert_eq!(f.step(Event::Latency(swing(i)), i, 2), None);
                assert_eq!(f.step(OK, i, 2), None);
            }
            assert_eq!(f.is_overloaded(), start.is_overloaded());
        }
    }

    #[test]
    fn re_entry_after_recovery_starts_a_fresh_run() {
        let under = lat(Latency::Under);
        let (f, flips) = run(&[over(), under, OK, OK, over(), under, OK]);
        assert_eq!(flips.len(), 3, "{flips:?}");
        assert_eq!(
            f,
            Flag::Overloaded {
                since_ms: 4,
                reason: EnterReason::Ttft,
                probe_successes: 1,
                latency_recovered: true
            }
        );
    }

    fn workers(n: usize) -> Vec<WorkerConfig> {
        let ws: Vec<String> = (0..n).map(|i| format!(r#"{{"name":"w{i}"}}"#)).collect();
        crate::config::Config::from_json(format!(r#"{{"workers":[{}]}}"#, ws.join(",")).as_bytes())
            .unwrap()
            .workers
    }

    #[test]
    fn flags_round_trip_by_name() {
        let w = workers(3);
        let flagged = Flag::Overloaded {
            since_ms: 7,
            reason: EnterReason::Tpot,
            probe_successes: 1,
            latency_recovered: true,
        };
        let flags = Flags(vec![
            Flag::default(),
            flagged,
            Flag::Healthy { since_ms: 9 },
        ]);
        let bytes = flags.encode(&w);
        assert_eq!(Flags::decode(&bytes, &w), flags);
        assert_eq!(flags.overloaded(), vec![false, true, false]);
        assert_eq!(flags.count(), 1);
        let reversed: Vec<WorkerConfig> = w.iter().rev().cloned().collect();
        assert_eq!(
            Flags::decode(&bytes, &reversed).overloaded(),
            vec![false, true, false]
        );
        assert_eq!(Flags::decode(b"junk", &w).count(), 0);
    }

    #[test]
    fn table_updates_and_clears() {
        let w = workers(2);
        let store = MemStore::default();
        let table = FlagTable::new("t");
        let c = cfg();
        let hot = sample(Some(40.0), None, 100);
        let flips = table.update(&store, &w, |f| {
            observe_latencies(f, &hot, 100, 5000, &c, &[])
        });
        assert_eq!(flips, vec![(0, Transition::Entered(EnterReason::Ttft))]);
        assert_eq!(table.read(&store, &w).overloaded(), vec![true, false]);
        let flips = table.update(&store, &w, |f| {
            observe_latencies(f, &hot, 200, 5000, &c, &[])
        });
        assert_eq!(flips, vec![], "already flagged");
        // Cooled down: a probeable worker waits for its probes, one that cannot be
        // probed recovers on latency alone.
        let cool = sample(Some(1.0), None, 300);
        let flips = table.update(&store, &w, |f| {
            observe_latencies(f, &cool, 300, 5000, &c, &[true])
        });
        assert_eq!(flips, vec![], "probes pending");
        let flips = table.update(&store, &w, |f| {
            observe_latencies(f, &cool, 300, 5000, &c, &[false])
        });
        assert_eq!(flips, vec![(0, Transition::Recovered { after_ms: 200 })]);
        table.update(&store, &w, |f| {
            observe_latencies(f, &hot, 400, 5000, &c, &[])
        });
        table.clear(&store);
        assert_eq!(table.read(&store, &w).count(), 0, "no stale flag left");
    }

    #[test]
    fn lease_is_held_renewed_and_taken_over_when_it_expires() {
        let store = MemStore::default();
        let lease = ProbeLease::new("t");
        assert!(lease.acquire(&store, 1, 0, 300), "free: taken");
        assert!(!lease.acquire(&store, 2, 100, 300), "held by another");
        assert!(lease.acquire(&store, 1, 200, 300), "renewed by its holder");
        assert!(
            !lease.acquire(&store, 2, 499, 300),
            "renewal moved the expiry"
        );
        assert!(
            lease.acquire(&store, 2, 500, 300),
            "holder stopped renewing: taken over"
        );
        assert!(
            !lease.acquire(&store, 1, 600, 300),
            "the old holder lost it"
        );
        assert_eq!(
            claim(None, 9, 10, 5),
            Some(Lease {
                holder: 9,
                until_ms: 15
            })
        );
        assert_eq!(Lease::decode(b"garbage"), None);
        assert_eq!(OverloadConfig::lease_ms(1000), 3000);
    }

    #[test]
    fn endpoint_workers_are_probed_only_through_a_cluster_of_their_own() {
        let c = |json: &str| Config::from_json(json.as_bytes()).unwrap();
        let cluster = c(r#"{"workers":[{"name":"a"}]}"#);
        assert_eq!(probe_cluster(&cluster, &cluster.workers[0]), Some("a"));
        let endpoint = c(
            r#"{"target":"endpoint","workers":[{"name":"a","address":"10.0.0.1:80"},
                {"name":"b","address":"10.0.0.2:80","cluster":"only_b"}]}"#,
        );
        assert_eq!(probe_cluster(&endpoint, &endpoint.workers[0]), None);
        assert_eq!(
            probe_cluster(&endpoint, &endpoint.workers[1]),
            Some("only_b")
        );
    }

    #[test]
    fn config_defaults_and_rules() {
        let d = OverloadConfig::default();
        assert_eq!(
            (
                d.ttft_enter_s,
                d.ttft_recover_s,
                d.tpot_enter_s,
                d.tpot_recover_s
            ),
            (30.0, 16.0, 0.3, 0.08)
        );
        assert!(d.enabled);
        assert_eq!(d.validate(), Ok(()));
        let bad = |f: fn(&mut OverloadConfig)| {
            let mut c = OverloadConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert_eq!(
            bad(|c| c.ttft_recover_s = 30.0).field,
            "overload.ttft_recover_s"
        );
        assert!(bad(|c| c.ttft_recover_s = 31.0)
            .rule
            .contains("must be below `overload.ttft_enter_s`"));
        assert_eq!(
            bad(|c| c.tpot_recover_s = 0.3).field,
            "overload.tpot_recover_s"
        );
        assert_eq!(
            bad(|c| c.tpot_enter_s = f64::NAN).field,
            "overload.tpot_enter_s"
        );
        assert_eq!(
            bad(|c| c.ttft_recover_s = 0.0).field,
            "overload.ttft_recover_s"
        );
        assert_eq!(
            bad(|c| c.probe_interval_ms = 9).field,
            "overload.probe_interval_ms"
        );
        assert_eq!(
            bad(|c| c.probe_timeout_ms = 0).field,
            "overload.probe_timeout_ms"
        );
        assert_eq!(
            bad(|c| c.probe_path = "x".into()).field,
            "overload.probe_path"
        );
        assert_eq!(
            bad(|c| c.probe_successes_to_recover = 0).field,
            "overload.probe_successes_to_recover"
        );
    }
}
