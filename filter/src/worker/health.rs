//! Worker health from failures: a worker whose upstream failed (connect failure,
//! reset, timeout, 5xx) or that the collector reports `reachable: false` is down,
//! and a down worker is out of the candidates on every thread (see `candidates`)
//! until probes show it answers again. Latency flags (`crate::worker::overload`) never see a
//! dead engine: it produces no latency at all.
//!
//! Two inputs, two functions here:
//! - `classify` turns what Envoy says about a finished stream (`response.code`,
//!   `response.flags`, `response.code_details`) into an `Outcome`: served, failed for
//!   a reason that is the worker's, or no verdict (the client left, Envoy's own
//!   limits refused it). Polarity: only what proves the engine failed counts; a client
//!   that hung up says nothing about the engine.
//! - `Health::step`, a two-state machine per worker:
//!   - up -> down at once on one failure (`Failed`) or a fresh `reachable: false`
//!     report: a dead engine refuses every request it gets, so waiting for a run of
//!     failures costs one failed request per thread per step of the run;
//!   - down -> up when the last `probes_needed` probes succeeded AND the collector's
//!     last fresh report, if any, says reachable AND `hold_ms` has passed since it
//!     went down. A failed probe (or a real request failing meanwhile) restarts the
//!     run. Workers that cannot be probed (`target: endpoint`: no cluster of their
//!     own) need no probes but wait `hold_ms`, then take traffic again on trial: a
//!     failure sends them back at once.
//!
//! Every VM writes a failure it sees (any thread must take the worker out at once);
//! probes and reports are stepped by the prober lease holder. The table lives in
//! `crate::shared::HealthTable`; the settings are `crate::config::HealthConfig`.

use crate::load::{LoadTable, Report};

/// Envoy's response flag bits (`StreamInfo::CoreResponseFlag` as the legacy bit
/// vector `response.flags` carries; same values since Envoy 1.10).
pub mod flag {
    pub const UPSTREAM_REQUEST_TIMEOUT: u64 = 0x4; // UT
    pub const LOCAL_RESET: u64 = 0x8; // LR
    pub const UPSTREAM_REMOTE_RESET: u64 = 0x10; // UR
    pub const UPSTREAM_CONNECTION_FAILURE: u64 = 0x20; // UF
    pub const UPSTREAM_CONNECTION_TERMINATION: u64 = 0x40; // UC
    pub const UPSTREAM_OVERFLOW: u64 = 0x80; // UO
    pub const DOWNSTREAM_CONNECTION_TERMINATION: u64 = 0x4000; // DC
    pub const STREAM_IDLE_TIMEOUT: u64 = 0x10000; // SI
    pub const UPSTREAM_PROTOCOL_ERROR: u64 = 0x800000; // UPE
    pub const DOWNSTREAM_REMOTE_RESET: u64 = 0x1000_0000; // DR
}

/// Why a worker went down.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DownReason {
    /// Envoy could not connect (refused, no route to host, connect timeout).
    ConnectFailure,
    /// The engine reset the stream or closed the connection mid-request.
    Reset,
    /// No answer in time: the route's or a try's timeout, or the stream went idle.
    Timeout,
    /// The engine itself answered 5xx.
    ServerError,
    /// The collector's last fresh report says it could not scrape the engine.
    Unreachable,
}

impl DownReason {
    pub const ALL: [DownReason; 5] = [
        DownReason::ConnectFailure,
        DownReason::Reset,
        DownReason::Timeout,
        DownReason::ServerError,
        DownReason::Unreachable,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DownReason::ConnectFailure => "connect_failure",
            DownReason::Reset => "reset",
            DownReason::Timeout => "timeout",
            DownReason::ServerError => "server_error",
            DownReason::Unreachable => "unreachable",
        }
    }

    pub fn parse(s: &str) -> Option<DownReason> {
        DownReason::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// What one finished stream says about its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The engine answered (any status below 500, or a stream that ended cleanly).
    Served,
    /// The worker failed the request.
    Failed(DownReason),
    /// Nothing about the worker: the client went away, or Envoy refused the request
    /// on its own (circuit breaker), or no upstream was tried.
    NoVerdict,
}

/// Judges a finished stream from its status (`None`: no response at all), its
/// response flags and its code details (`via_upstream` when the engine answered).
pub fn classify(status: Option<u64>, flags: u64, details: &str) -> Outcome {
    use flag::*;
    // The client left: Envoy reset the upstream itself; the engine may be fine.
    if flags & (DOWNSTREAM_CONNECTION_TERMINATION | DOWNSTREAM_REMOTE_RESET) != 0 {
        return Outcome::NoVerdict;
    }
    if flags & UPSTREAM_CONNECTION_FAILURE != 0 {
        return Outcome::Failed(DownReason::ConnectFailure);
    }
    if flags & (UPSTREAM_REQUEST_TIMEOUT | STREAM_IDLE_TIMEOUT) != 0 {
        return Outcome::Failed(DownReason::Timeout);
    }
    if flags & (UPSTREAM_REMOTE_RESET | UPSTREAM_CONNECTION_TERMINATION | UPSTREAM_PROTOCOL_ERROR)
        != 0
    {
        return Outcome::Failed(DownReason::Reset);
    }
    if flags & (UPSTREAM_OVERFLOW | LOCAL_RESET) != 0 {
        return Outcome::NoVerdict;
    }
    match status {
        // Only the engine's own 5xx is its failure; Envoy's local replies carry flags.
        Some(s) if (500..600).contains(&s) && details == "via_upstream" => {
            Outcome::Failed(DownReason::ServerError)
        }
        Some(s) if (100..600).contains(&s) && details == "via_upstream" => Outcome::Served,
        _ => Outcome::NoVerdict,
    }
}

/// What a finished stream's own callbacks already tell, before any property is read
/// (two property reads on every stream cost Envoy more than any other hostcall the
/// filter makes): a response that reached its end with a 2xx status came whole from
/// the engine, so it was served. `None`: the properties decide (`classify`). Envoy's
/// local replies for a failed upstream are never 2xx, and an upstream reset leaves
/// the response without its end.
pub fn served_by_callbacks(status: Option<u64>, complete: bool) -> Option<Outcome> {
    match status {
        Some(s) if complete && (200..300).contains(&s) => Some(Outcome::Served),
        _ => None,
    }
}

/// Whether a response refused the request before any engine ran it: a 4xx, the
/// engine's (a malformed request, a prompt longer than its context, a body whose
/// API contradicts its path) or Envoy's own. Nothing of the text was prefilled, so
/// its record in the tree must go, or the prefix would follow a worker that never
/// cached it. No verdict on the worker: the request was at fault.
pub fn refused(status: Option<u64>) -> bool {
    status.is_some_and(|s| (400..500).contains(&s))
}

/// What the machine is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A request on the worker failed.
    Failed(DownReason),
    /// A probe's outcome (a 2xx within the probe timeout, or not).
    Probe { ok: bool },
    /// The collector's last fresh report: scraped or not.
    Report { reachable: bool },
    /// Time passed (the prober's tick): lets the hold time end.
    Tick,
}

/// A flip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Down(DownReason),
    /// After this long down.
    Up {
        after_ms: u64,
    },
}

/// What bringing a down worker back takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recovery {
    /// Consecutive successful probes (0: the worker cannot be probed).
    pub probes_needed: u32,
    /// Least time down.
    pub hold_ms: u64,
}

/// One worker's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Health {
    #[default]
    Up,
    Down {
        since_ms: u64,
        reason: DownReason,
        /// Consecutive successful probes (reset by a failure).
        probe_successes: u32,
        /// The collector's last fresh report did not say unreachable.
        collector_ok: bool,
    },
}

impl Health {
    pub fn is_down(&self) -> bool {
        matches!(self, Health::Down { .. })
    }

    /// Applies `event` at `now_ms`; returns the transition if it flipped.
    pub fn step(&mut self, event: Event, now_ms: u64, recovery: Recovery) -> Option<Transition> {
        match self {
            Health::Up => {
                let reason = match event {
                    Event::Failed(r) => r,
                    Event::Report { reachable: false } => DownReason::Unreachable,
                    _ => return None,
                };
                *self = Health::Down {
                    since_ms: now_ms,
                    reason,
                    probe_successes: 0,
                    collector_ok: reason != DownReason::Unreachable,
                };
                Some(Transition::Down(reason))
            }
            Health::Down {
                since_ms,
                probe_successes,
                collector_ok,
                ..
            } => {
                match event {
                    Event::Failed(_) | Event::Probe { ok: false } => *probe_successes = 0,
                    Event::Probe { ok: true } => {
                        *probe_successes = probe_successes.saturating_add(1)
                    }
                    Event::Report { reachable } => *collector_ok = reachable,
                    Event::Tick => {}
                }
                let held = now_ms.saturating_sub(*since_ms);
                if *collector_ok
                    && *probe_successes >= recovery.probes_needed
                    && held >= recovery.hold_ms
                {
                    *self = Health::Up;
                    return Some(Transition::Up { after_ms: held });
                }
                None
            }
        }
    }
}

/// The collector's verdict on `worker` at `now_ms`, if its last report is fresh.
pub fn report_event(
    table: &LoadTable,
    worker: usize,
    now_ms: u64,
    stale_after_ms: u64,
) -> Option<Event> {
    let (at_ms, reachable) = match table.reports.get(worker)?.as_ref()? {
        Report::Sample(s) => (s.at_ms, true),
        Report::Unreachable { at_ms } => (*at_ms, false),
    };
    (now_ms.saturating_sub(at_ms) < stale_after_ms).then_some(Event::Report { reachable })
}

#[cfg(test)]
mod tests {
    use super::flag::*;
    use super::*;
    use crate::load::EngineSample;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn only_a_4xx_refuses_the_request() {
        for status in [400, 404, 413, 429, 499] {
            assert!(refused(Some(status)), "{status}");
        }
        for status in [None, Some(200), Some(399), Some(500), Some(503)] {
            assert!(!refused(status), "{status:?}");
        }
    }

    #[test]
    fn only_a_whole_2xx_response_is_judged_without_properties() {
        assert_eq!(served_by_callbacks(Some(200), true), Some(Outcome::Served));
        assert_eq!(served_by_callbacks(Some(299), true), Some(Outcome::Served));
        for (status, complete) in [
            (Some(200), false), // reset mid-stream: the flags say how
            (Some(199), true),
            (Some(300), true),
            (Some(408), true), // Envoy's stream idle timeout
            (Some(503), true), // a connect failure's local reply, or the engine's own
            (None, true),
            (None, false),
        ] {
            assert_eq!(
                served_by_callbacks(status, complete),
                None,
                "{status:?} {complete}"
            );
        }
    }

    #[test]
    fn classify_boundaries() {
        use DownReason::*;
        let up = "via_upstream";
        let local = "upstream_reset_before_response_started{connection_failure}";
        // (status, flags, details, outcome, why)
        let cases = [
            (Some(200), 0, up, Outcome::Served, "a 200 from the engine"),
            (Some(404), 0, up, Outcome::Served, "a 4xx is the request's"),
            (Some(499), 0, up, Outcome::Served, "below 500"),
            (Some(500), 0, up, Outcome::Failed(ServerError), "500"),
            (
                Some(503),
                0,
                up,
                Outcome::Failed(ServerError),
                "the engine's 503",
            ),
            (Some(599), 0, up, Outcome::Failed(ServerError), "599"),
            (Some(600), 0, up, Outcome::NoVerdict, "not an HTTP status"),
            (
                Some(503),
                UPSTREAM_CONNECTION_FAILURE,
                local,
                Outcome::Failed(ConnectFailure),
                "Envoy's 503 for a refused connection",
            ),
            (
                Some(503),
                UPSTREAM_CONNECTION_TERMINATION,
                "upstream_reset_before_response_started{connection_termination}",
                Outcome::Failed(Reset),
                "engine died with the request in flight",
            ),
            (
                Some(200),
                UPSTREAM_REMOTE_RESET,
                "upstream_reset_after_response_started{remote_reset}",
                Outcome::Failed(Reset),
                "a stream cut after its headers",
            ),
            (
                Some(502),
                UPSTREAM_PROTOCOL_ERROR,
                "upstream_reset_before_response_started{protocol_error}",
                Outcome::Failed(Reset),
                "garbage from the engine",
            ),
            (
                Some(504),
                UPSTREAM_REQUEST_TIMEOUT,
                "upstream_per_try_idle_timeout",
                Outcome::Failed(Timeout),
                "a frozen engine's try timed out",
            ),
            (
                Some(408),
                STREAM_IDLE_TIMEOUT,
                "stream_idle_timeout",
                Outcome::Failed(Timeout),
                "a frozen engine's stream went idle",
            ),
            (
                Some(503),
                UPSTREAM_OVERFLOW,
                "upstream_reset_before_response_started{overflow}",
                Outcome::NoVerdict,
                "Envoy's circuit breaker is not the engine",
            ),
            (
                None,
                DOWNSTREAM_CONNECTION_TERMINATION | LOCAL_RESET,
                "",
                Outcome::NoVerdict,
                "the client hung up",
            ),
            (
                Some(200),
                DOWNSTREAM_REMOTE_RESET | UPSTREAM_REMOTE_RESET,
                "",
                Outcome::NoVerdict,
                "client gone wins over the reset it caused",
            ),
            (
                Some(503),
                0,
                "cluster_not_found",
                Outcome::NoVerdict,
                "no upstream tried",
            ),
            (None, 0, "", Outcome::NoVerdict, "nothing known"),
        ];
        for (status, flags, details, want, why) in cases {
            assert_eq!(classify(status, flags, details), want, "{why}");
        }
    }

    #[test]
    fn reasons_round_trip() {
        for r in DownReason::ALL {
            assert_eq!(DownReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(DownReason::parse("nope"), None);
    }

    const PROBED: Recovery = Recovery {
        probes_needed: 2,
        hold_ms: 0,
    };

    fn run(events: &[Event], recovery: Recovery) -> (Health, Vec<(u64, Transition)>) {
        let mut h = Health::Up;
        let flips = events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let t = i as u64 * 100;
                h.step(*e, t, recovery).map(|x| (t, x))
            })
            .collect();
        (h, flips)
    }

    const FAIL: Event = Event::Failed(DownReason::ConnectFailure);
    const OK: Event = Event::Probe { ok: true };
    const BAD: Event = Event::Probe { ok: false };

    #[test]
    fn up_goes_down_at_once_on_a_failure_or_an_unreachable_report() {
        for e in [OK, BAD, Event::Tick, Event::Report { reachable: true }] {
            assert_eq!(run(&[e], PROBED).1, vec![], "{e:?} leaves an up worker");
        }
        assert_eq!(
            run(&[FAIL], PROBED).1,
            vec![(0, Transition::Down(DownReason::ConnectFailure))]
        );
        let (h, flips) = run(&[Event::Report { reachable: false }], PROBED);
        assert_eq!(flips, vec![(0, Transition::Down(DownReason::Unreachable))]);
        assert!(h.is_down());
    }

    #[test]
    fn recovery_needs_a_probe_run_and_a_reachable_collector() {
        let (h, _) = run(&[FAIL, OK], PROBED);
        assert!(h.is_down(), "one probe short");
        let (_, flips) = run(&[FAIL, OK, OK], PROBED);
        assert_eq!(flips.last(), Some(&(200, Transition::Up { after_ms: 200 })));
        let (h, _) = run(&[FAIL, OK, BAD, OK], PROBED);
        assert!(h.is_down(), "a failed probe restarts the run");
        let (h, _) = run(&[FAIL, OK, FAIL, OK], PROBED);
        assert!(h.is_down(), "a failed request restarts the run");
        let unreachable = Event::Report { reachable: false };
        let (h, _) = run(&[unreachable, OK, OK, OK], PROBED);
        assert!(h.is_down(), "the collector still cannot reach it");
        let (_, flips) = run(
            &[unreachable, OK, OK, Event::Report { reachable: true }],
            PROBED,
        );
        assert_eq!(flips.last(), Some(&(300, Transition::Up { after_ms: 300 })));
        let (h, _) = run(&[FAIL, OK, unreachable, OK, OK], PROBED);
        assert!(
            h.is_down(),
            "down for a failure, then unreachable: both must clear"
        );
    }

    #[test]
    fn an_unprobed_worker_comes_back_on_trial_after_the_hold() {
        let hold = Recovery {
            probes_needed: 0,
            hold_ms: 300,
        };
        let (h, _) = run(&[FAIL, Event::Tick, Event::Tick], hold);
        assert!(h.is_down(), "200 ms < hold");
        let (h, flips) = run(&[FAIL, Event::Tick, Event::Tick, Event::Tick], hold);
        assert_eq!(h, Health::Up);
        assert_eq!(flips.last(), Some(&(300, Transition::Up { after_ms: 300 })));
        let (_, flips) = run(&[FAIL, Event::Tick, Event::Tick, Event::Tick, FAIL], hold);
        assert_eq!(
            flips.last(),
            Some(&(400, Transition::Down(DownReason::ConnectFailure))),
            "on trial: one failure and it is out again"
        );
    }

    #[test]
    fn report_events_need_a_fresh_report() {
        let sample = EngineSample::queue(0, 0, 1000);
        let t = LoadTable {
            reports: vec![
                Some(Report::Sample(sample)),
                Some(Report::Unreachable { at_ms: 1000 }),
                None,
            ],
        };
        assert_eq!(
            report_event(&t, 0, 1999, 1000),
            Some(Event::Report { reachable: true })
        );
        assert_eq!(
            report_event(&t, 1, 1999, 1000),
            Some(Event::Report { reachable: false })
        );
        assert_eq!(report_event(&t, 1, 2000, 1000), None, "stale");
        assert_eq!(report_event(&t, 2, 1000, 1000), None, "never reported");
        assert_eq!(report_event(&t, 7, 1000, 1000), None, "no such worker");
    }
}
