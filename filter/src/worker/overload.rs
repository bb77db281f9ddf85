//! Latency-aware overload flags: a marker, not a policy. A flagged worker is removed
//! from the candidates before any policy runs (see `candidates`). Detecting it is the
//! point: a latency-blind router keeps sending a hot prefix to an engine whose TTFT
//! already runs to tens of seconds.
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
//! filters the same set. The flag table and the lease (`crate::shared`) store what
//! this module computes; the settings are `crate::config::OverloadConfig`.

use crate::config::OverloadConfig;
use crate::load::LoadTable;

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

    pub(crate) fn parse(s: &str) -> Option<EnterReason> {
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

/// Steps every worker's flag on its latency at `now_ms`; `probeable` by worker
/// index (missing: probeable).
pub fn observe_latencies(
    flags: &mut [Flag],
    table: &LoadTable,
    now_ms: u64,
    stale_after_ms: u64,
    cfg: &OverloadConfig,
    probeable: &[bool],
) -> Vec<(usize, Transition)> {
    flags
        .iter_mut()
        .enumerate()
        .filter_map(|(i, f)| {
            let l = assess(table, i, now_ms, stale_after_ms, cfg);
            let needed = cfg.probes_needed(probeable.get(i).copied().unwrap_or(true));
            f.step(Event::Latency(l), now_ms, needed).map(|t| (i, t))
        })
        .collect()
}

/// Fixtures the overload tests and the flag table's tests share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::config::OverloadConfig;
    use crate::load::{EngineSample, LoadTable, Report};

    pub(crate) fn cfg() -> OverloadConfig {
        OverloadConfig {
            probe_successes_to_recover: 2,
            ..OverloadConfig::default()
        }
    }

    /// One worker's table: a sample with these latencies, taken at `at_ms`.
    pub(crate) fn sample(ttft: Option<f64>, tpot: Option<f64>, at_ms: u64) -> LoadTable {
        LoadTable {
            reports: vec![Some(Report::Sample(EngineSample {
                ttft_p90_s: ttft,
                tpot_p90_s: tpot,
                ..EngineSample::queue(0, 0, at_ms)
            }))],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{cfg, sample};
    use super::*;
    use crate::load::Report;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

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
}
