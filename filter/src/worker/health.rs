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
//!   that hung up says nothing about the engine. The glue also tells no failure that
//!   followed a request the client made unusual (a body the filter could not read,
//!   or over `health.judged_body_bytes`): an engine that resets such a request
//!   answered the client, and counting it would let any client eject any engine.
//! - `Health::step`, a machine per worker (Envoy's outlier detection is the anchor:
//!   `consecutive_5xx` 5, `max_ejection_percent` 10 with at least one host always
//!   ejectable, ejection time growing with each ejection):
//!   - in rotation -> out at once on a refused connect (`ConnectFailure`) or a fresh
//!     `reachable: false` report: nothing a client sends causes either, and a dead
//!     engine refuses every request it gets;
//!   - in rotation -> out after `consecutive_failures` resets, timeouts or 5xx in a
//!     row (a served request ends the run), and only while the pool's cap has room
//!     (`cap_has_room`): a client that can make an engine fail requests can take
//!     out at most the cap's share of a pool;
//!   - out -> in when the hold has passed (0 the first time, plus `backoff_ms` for
//!     each ejection after the first, up to `max_backoff_ms`; an unprobed worker's
//!     trial hold on top), the collector's last fresh report, if any, does not say
//!     unreachable, and either `probes_needed` probes or served requests in a row
//!     answered or, out for a refused connect or an unreachable report, the
//!     collector reached it after it went out. A failed probe (or a real request
//!     failing meanwhile) restarts the run. Workers that cannot be probed
//!     (`target: endpoint`: no cluster of their own) need no probes but wait the
//!     hold, then take traffic again on trial.
//!   - A worker back in rotation keeps its ejections on record (`Watched`) for
//!     `max_backoff_ms`, so one that fails again soon is held out longer.
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
    /// A request on the worker failed, on evidence about the engine (a failure that
    /// followed a request the client made unusual is never told: `judged`).
    Failed(DownReason),
    /// A real request on the worker, routed at `routed_ms`, was served (told only
    /// when the worker has a record): it ends a run of failures, and one routed
    /// after the worker went out (in `all_down`) counts as a good probe; one routed
    /// before says nothing about the engine since.
    Served { routed_ms: u64 },
    /// A probe's outcome (a 2xx within the probe timeout, or not).
    Probe { ok: bool },
    /// The collector's last fresh report, received at `at_ms`: scraped or not.
    Report { reachable: bool, at_ms: u64 },
    /// Time passed (the prober's tick): lets a hold end and an old record go.
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

/// The rules one step applies: when a worker goes out and what bringing it back
/// takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Consecutive failures on request evidence that take a worker out.
    pub consecutive_failures: u32,
    /// The pool's cap has room for one more worker out (`cap_has_room`): a run of
    /// failures takes a worker out only then; connect failures and the collector's
    /// `reachable: false` always do.
    pub room: bool,
    /// Consecutive successful probes (0: the worker cannot be probed).
    pub probes_needed: u32,
    /// Least time down the first time (an unprobed worker's trial hold; 0 when
    /// probes decide).
    pub hold_ms: u64,
    /// Added to the least time down for each ejection after the first, up to
    /// `max_backoff_ms`, which is also how long a worker back in rotation keeps
    /// its ejections on record.
    pub backoff_ms: u64,
    pub max_backoff_ms: u64,
}

impl Rules {
    /// Least time down for a worker out for the `ejections`-th time in a row.
    pub fn hold_for(&self, ejections: u32) -> u64 {
        let repeats = u64::from(ejections.saturating_sub(1));
        self.hold_ms.saturating_add(
            self.backoff_ms
                .saturating_mul(repeats)
                .min(self.max_backoff_ms),
        )
    }
}

/// Envoy's `max_ejection_percent` rule: one more worker of a pool of `pool` may go
/// out while `down + 1` stay within `max_percent` of it, and one always may when
/// none is out (so a pool of 4 at 10% has room for one, not none).
pub fn cap_has_room(down: usize, pool: usize, max_percent: u32) -> bool {
    down == 0 || (down as u64 + 1) * 100 <= pool as u64 * u64::from(max_percent)
}

/// One worker's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Health {
    /// In rotation, nothing on record.
    #[default]
    Up,
    /// In rotation with a record: `failures` in a row on request evidence, and
    /// `ejections` not yet forgotten since it came back at `since_ms`.
    Watched {
        failures: u32,
        ejections: u32,
        since_ms: u64,
    },
    Down {
        since_ms: u64,
        reason: DownReason,
        /// Consecutive successful probes or served requests (reset by a failure).
        probe_successes: u32,
        /// The collector's last fresh report did not say unreachable.
        collector_ok: bool,
        /// Its last connect failed (and nothing answered since): `all_down` passes
        /// it over while another down worker may answer.
        refused: bool,
        /// Times out in a row, this one included (the backoff).
        ejections: u32,
    },
}

impl Health {
    pub fn is_down(&self) -> bool {
        matches!(self, Health::Down { .. })
    }

    /// Down, and its last connect failed.
    pub fn refused(&self) -> bool {
        matches!(self, Health::Down { refused: true, .. })
    }

    /// Applies `event` at `now_ms`; returns the transition if it flipped.
    pub fn step(&mut self, event: Event, now_ms: u64, rules: Rules) -> Option<Transition> {
        match *self {
            Health::Up => self.step_up((0, 0, 0), event, now_ms, rules),
            Health::Watched {
                failures,
                ejections,
                since_ms,
            } => self.step_up((failures, ejections, since_ms), event, now_ms, rules),
            Health::Down { .. } => self.step_down(event, now_ms, rules),
        }
    }

    /// In rotation: a connect failure or a fresh `reachable: false` is out at once
    /// (nothing a client sends causes either); a reset, timeout or 5xx only after
    /// `consecutive_failures` in a row, and only while the pool's cap has room; a
    /// served request ends the run.
    fn step_up(
        &mut self,
        (failures, ejections, back_ms): (u32, u32, u64),
        event: Event,
        now_ms: u64,
        rules: Rules,
    ) -> Option<Transition> {
        let down = |reason| Health::Down {
            since_ms: now_ms,
            reason,
            probe_successes: 0,
            collector_ok: reason != DownReason::Unreachable,
            refused: reason == DownReason::ConnectFailure,
            ejections: ejections.saturating_add(1),
        };
        let failures = match event {
            Event::Failed(DownReason::ConnectFailure) => {
                *self = down(DownReason::ConnectFailure);
                return Some(Transition::Down(DownReason::ConnectFailure));
            }
            // A report from before it came back is old news.
            Event::Report {
                reachable: false,
                at_ms,
            } if at_ms >= back_ms => {
                *self = down(DownReason::Unreachable);
                return Some(Transition::Down(DownReason::Unreachable));
            }
            Event::Failed(reason) => {
                let failures = failures.saturating_add(1);
                if failures >= rules.consecutive_failures && rules.room {
                    *self = down(reason);
                    return Some(Transition::Down(reason));
                }
                failures
            }
            Event::Served { .. } => 0,
            _ => failures,
        };
        let remembered = ejections > 0 && now_ms.saturating_sub(back_ms) < rules.max_backoff_ms;
        *self = if failures == 0 && !remembered {
            Health::Up
        } else {
            Health::Watched {
                failures,
                ejections: if remembered { ejections } else { 0 },
                since_ms: back_ms,
            }
        };
        None
    }

    /// Out of rotation: back when the hold (with its backoff) has passed, the
    /// collector does not say unreachable, and either `probes_needed` probes or
    /// served requests in a row answered, or (out for a failed connect or an
    /// unreachable report) the collector reached it after it went out.
    fn step_down(&mut self, event: Event, now_ms: u64, rules: Rules) -> Option<Transition> {
        let Health::Down {
            since_ms,
            reason,
            probe_successes,
            collector_ok,
            refused,
            ejections,
        } = self
        else {
            return None;
        };
        let mut vouched = false;
        match event {
            Event::Failed(r) => {
                *probe_successes = 0;
                *refused |= r == DownReason::ConnectFailure;
            }
            Event::Probe { ok: false } => *probe_successes = 0,
            Event::Probe { ok: true } => {
                *probe_successes = probe_successes.saturating_add(1);
                *refused = false;
            }
            Event::Served { routed_ms } if routed_ms >= *since_ms => {
                *probe_successes = probe_successes.saturating_add(1);
                *refused = false;
                // A real request served outweighs a scrape that failed.
                *collector_ok = true;
            }
            Event::Served { .. } => {}
            Event::Report { reachable, at_ms } => {
                *collector_ok = reachable;
                let unreached =
                    matches!(reason, DownReason::ConnectFailure | DownReason::Unreachable);
                vouched = reachable && unreached && at_ms >= *since_ms;
                if vouched {
                    *refused = false;
                }
            }
            Event::Tick => {}
        }
        let held = now_ms.saturating_sub(*since_ms);
        let answered = vouched || *probe_successes >= rules.probes_needed;
        if *collector_ok && answered && held >= rules.hold_for(*ejections) {
            *self = Health::Watched {
                failures: 0,
                ejections: *ejections,
                since_ms: now_ms,
            };
            return Some(Transition::Up { after_ms: held });
        }
        None
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
    (now_ms.saturating_sub(at_ms) < stale_after_ms).then_some(Event::Report { reachable, at_ms })
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

    const PROBED: Rules = Rules {
        consecutive_failures: 3,
        room: true,
        probes_needed: 2,
        hold_ms: 0,
        backoff_ms: 1000,
        max_backoff_ms: 5000,
    };

    fn run(events: &[Event], rules: Rules) -> (Health, Vec<(u64, Transition)>) {
        let mut h = Health::Up;
        let flips = events
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let t = i as u64 * 100;
                h.step(*e, t, rules).map(|x| (t, x))
            })
            .collect();
        (h, flips)
    }

    const FAIL: Event = Event::Failed(DownReason::ConnectFailure);
    const RESET: Event = Event::Failed(DownReason::Reset);
    const OK: Event = Event::Probe { ok: true };
    const SERVED: Event = Event::Served { routed_ms: 0 };
    const BAD: Event = Event::Probe { ok: false };
    const fn report(reachable: bool, at_ms: u64) -> Event {
        Event::Report { reachable, at_ms }
    }

    #[test]
    fn a_refused_connect_or_an_unreachable_report_is_out_at_once() {
        for e in [OK, BAD, Event::Tick, SERVED, report(true, 0)] {
            assert_eq!(run(&[e], PROBED).1, vec![], "{e:?} leaves an up worker");
        }
        let (h, flips) = run(&[FAIL], PROBED);
        assert_eq!(
            flips,
            vec![(0, Transition::Down(DownReason::ConnectFailure))]
        );
        assert!(h.refused(), "its last connect failed");
        let (h, flips) = run(&[report(false, 0)], PROBED);
        assert_eq!(flips, vec![(0, Transition::Down(DownReason::Unreachable))]);
        assert!(
            h.is_down() && !h.refused(),
            "a failed scrape is not a refused connect"
        );
        let capped = Rules {
            room: false,
            ..PROBED
        };
        assert_eq!(
            run(&[FAIL], capped).1.len(),
            1,
            "a dead engine is out whatever the cap"
        );
    }

    #[test]
    fn request_failures_take_a_worker_out_only_in_a_run_within_the_cap() {
        for reason in [
            DownReason::Reset,
            DownReason::Timeout,
            DownReason::ServerError,
        ] {
            let f = Event::Failed(reason);
            let (h, flips) = run(&[f, f], PROBED);
            assert_eq!(flips, vec![], "{reason:?}: two of three");
            assert_eq!(
                h,
                Health::Watched {
                    failures: 2,
                    ejections: 0,
                    since_ms: 0
                }
            );
            assert_eq!(
                run(&[f, f, f], PROBED).1,
                vec![(200, Transition::Down(reason))],
                "{reason:?}: the third in a row"
            );
            let (h, flips) = run(&[f, f, SERVED, f, f], PROBED);
            assert_eq!(flips, vec![], "{reason:?}: a served request ends the run");
            assert!(!h.is_down());
            let (h, _) = run(&[f, SERVED], PROBED);
            assert_eq!(h, Health::Up, "nothing left on record");
        }
        let capped = Rules {
            room: false,
            ..PROBED
        };
        let (h, flips) = run(&[RESET; 5], capped);
        assert_eq!(flips, vec![], "the pool's cap is full");
        assert!(matches!(h, Health::Watched { failures: 5, .. }));
        let mut h = h;
        assert_eq!(
            h.step(RESET, 600, PROBED),
            Some(Transition::Down(DownReason::Reset)),
            "room again: the run still counts"
        );
    }

    #[test]
    fn the_cap_is_envoys_max_ejection_percent_with_one_always_allowed() {
        // (down, pool, percent, room)
        let cases = [
            (0, 4, 10, true),  // 10% of 4 rounds to none: one may still go
            (1, 4, 10, false), // a second would be 50%
            (0, 1, 10, true),
            (1, 10, 10, false),
            (1, 20, 10, true), // 2 of 20 is 10%
            (2, 20, 10, false),
            (1, 4, 50, true),
            (2, 4, 50, false),
            (3, 4, 100, true),
            (0, 4, 0, true),
        ];
        for (down, pool, pct, room) in cases {
            assert_eq!(
                cap_has_room(down, pool, pct),
                room,
                "{down} of {pool} at {pct}%"
            );
        }
    }

    #[test]
    fn recovery_needs_a_probe_run_and_a_reachable_collector() {
        let (h, _) = run(&[RESET, RESET, RESET, OK], PROBED);
        assert!(h.is_down(), "one probe short");
        let (_, flips) = run(&[RESET, RESET, RESET, OK, OK], PROBED);
        assert_eq!(flips.last(), Some(&(400, Transition::Up { after_ms: 200 })));
        let (h, _) = run(&[FAIL, OK, BAD, OK], PROBED);
        assert!(h.is_down(), "a failed probe restarts the run");
        let (h, _) = run(&[FAIL, OK, FAIL, OK], PROBED);
        assert!(h.is_down(), "a failed request restarts the run");
        let (_, flips) = run(&[FAIL, SERVED, OK], PROBED);
        assert_eq!(
            flips.last(),
            Some(&(200, Transition::Up { after_ms: 200 })),
            "a served request routed after it went out counts as a good probe"
        );
        let early = Event::Served { routed_ms: 0 };
        let (h, _) = run(&[Event::Tick, FAIL, early, OK], PROBED);
        assert!(
            h.is_down(),
            "one routed before it went out says nothing since"
        );
        let one = Rules {
            probes_needed: 1,
            ..PROBED
        };
        let (h, _) = run(&[report(false, 0), SERVED], one);
        assert!(
            !h.is_down(),
            "served after a failed scrape: back, the request outweighs the scrape"
        );
        let (h, _) = run(&[report(false, 0), OK, OK, OK], PROBED);
        assert!(h.is_down(), "the collector still cannot reach it");
        let (h, _) = run(&[FAIL, OK, report(false, 200), OK, OK], PROBED);
        assert!(h.is_down(), "probed, but the collector says unreachable");
    }

    #[test]
    fn the_collector_reaching_it_again_brings_it_back_at_once() {
        let (_, flips) = run(&[report(false, 0), report(true, 100)], PROBED);
        assert_eq!(
            flips.last(),
            Some(&(100, Transition::Up { after_ms: 100 })),
            "out for unreachable, reachable again: no probe needed"
        );
        let (_, flips) = run(&[Event::Tick, FAIL, report(true, 100)], PROBED);
        assert_eq!(
            flips.last(),
            Some(&(200, Transition::Up { after_ms: 100 })),
            "a refused connect, then the collector connected"
        );
        let (h, _) = run(&[Event::Tick, FAIL, report(true, 50)], PROBED);
        assert!(
            h.is_down(),
            "a scrape from before the failure vouches for nothing"
        );
        let (h, _) = run(&[RESET, RESET, RESET, report(true, 300)], PROBED);
        assert!(
            h.is_down(),
            "an engine that fails requests but serves /metrics needs its probes"
        );
        let (h, _) = run(&[FAIL, report(false, 0)], PROBED);
        assert!(h.refused());
        let (h, _) = run(&[FAIL, Event::Tick, report(true, 100)], PROBED);
        assert!(!h.is_down() && !h.refused());
        let (h, _) = run(
            &[report(false, 0), report(true, 100), report(false, 50)],
            PROBED,
        );
        assert!(
            !h.is_down(),
            "an unreachable report from before it came back is old news"
        );
    }

    #[test]
    fn re_ejection_backs_off_and_is_forgotten_after_the_longest_hold() {
        let r = PROBED;
        let mut h = Health::Up;
        h.step(FAIL, 0, r);
        assert!(
            h.step(OK, 10, r).is_none() && h.step(OK, 20, r).is_some(),
            "first: probes alone"
        );
        assert_eq!(
            h.step(FAIL, 30, r),
            Some(Transition::Down(DownReason::ConnectFailure))
        );
        h.step(OK, 40, r);
        assert_eq!(h.step(OK, 50, r), None, "second time out: held 1000 ms");
        assert_eq!(h.step(Event::Tick, 1029, r), None);
        assert_eq!(
            h.step(Event::Tick, 1030, r),
            Some(Transition::Up { after_ms: 1000 })
        );
        h.step(FAIL, 1100, r);
        h.step(OK, 1200, r);
        h.step(OK, 1300, r);
        assert!(h.step(Event::Tick, 3099, r).is_none(), "third: 2000 ms");
        assert!(h.step(Event::Tick, 3100, r).is_some());
        for _ in 0..10 {
            let t = if let Health::Watched { since_ms, .. } = h {
                since_ms + 1
            } else {
                unreachable!()
            };
            h.step(FAIL, t, r);
            h.step(OK, t, r);
            h.step(OK, t, r);
            h.step(Event::Tick, t + 5000, r);
        }
        assert!(!h.is_down(), "the hold stops growing at max_backoff_ms");
        let Health::Watched {
            since_ms,
            ejections,
            ..
        } = h
        else {
            unreachable!()
        };
        assert!(ejections > 3);
        h.step(Event::Tick, since_ms + 4999, r);
        assert!(matches!(h, Health::Watched { .. }), "still remembered");
        h.step(Event::Tick, since_ms + 5000, r);
        assert_eq!(h, Health::Up, "up for the longest hold: forgotten");
        h.step(FAIL, since_ms + 6000, r);
        h.step(OK, since_ms + 6001, r);
        assert!(
            h.step(OK, since_ms + 6002, r).is_some(),
            "forgotten: the next time out is a first time"
        );
    }

    #[test]
    fn an_unprobed_worker_comes_back_on_trial_after_the_hold() {
        let hold = Rules {
            probes_needed: 0,
            hold_ms: 300,
            ..PROBED
        };
        let (h, _) = run(&[FAIL, Event::Tick, Event::Tick], hold);
        assert!(h.is_down(), "200 ms < hold");
        let (h, flips) = run(&[FAIL, Event::Tick, Event::Tick, Event::Tick], hold);
        assert!(!h.is_down());
        assert_eq!(flips.last(), Some(&(300, Transition::Up { after_ms: 300 })));
        let (_, flips) = run(&[FAIL, Event::Tick, Event::Tick, Event::Tick, FAIL], hold);
        assert_eq!(
            flips.last(),
            Some(&(400, Transition::Down(DownReason::ConnectFailure))),
            "on trial: one refused connect and it is out again"
        );
        assert_eq!(hold.hold_for(1), 300);
        assert_eq!(hold.hold_for(3), 2300);
        assert_eq!(hold.hold_for(100), 5300, "the backoff is capped");
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
        assert_eq!(report_event(&t, 0, 1999, 1000), Some(report(true, 1000)));
        assert_eq!(report_event(&t, 1, 1999, 1000), Some(report(false, 1000)));
        assert_eq!(report_event(&t, 1, 2000, 1000), None, "stale");
        assert_eq!(report_event(&t, 2, 1000, 1000), None, "never reported");
        assert_eq!(report_event(&t, 7, 1000, 1000), None, "no such worker");
    }
}
