//! The replay guard: an authentic message is taken once, and only while it is
//! fresh, so a captured batch played back later (or twice) changes nothing.
//!
//! Each sender stamps its messages with its run's boot nonce and a sequence number
//! that only grows, plus its wall-clock send time. The guard takes a message when
//! - its send time is within `window` of the receiver's clock, either way (transit
//!   plus clock skew: the fleet's clocks must agree to within it, as NTP keeps
//!   them), and
//! - its sequence number is above the highest taken from the same (sender, boot).
//!
//! Memory is bounded by time: a run's entry is kept until its newest send time is
//! `window` old, after which every message it ever sent is stale anyway, so a
//! forgotten run's capture still cannot come back. A sender that restarts has a
//! new boot nonce and starts its own entry, so a bridge restart costs nothing; a
//! receiver that restarts remembers nothing, and may take, once, messages sealed
//! within the last `window` (recent routing, which the fleet already agreed on).
//! At most `max_runs` runs are remembered; past that a new run is refused until old
//! ones age out, rather than forgetting a run still inside the window.

use std::collections::HashMap;

use crate::envelope::{Refusal, Stamp};

/// A send time this far from the receiver's clock, either way, is stale.
pub const DEFAULT_WINDOW_MS: u64 = 30_000;
/// Runs remembered at once: far more restarts than a fleet has in one window.
pub const DEFAULT_MAX_RUNS: usize = 4096;

#[derive(Debug, Clone, Copy)]
struct Run {
    highest_seq: u64,
    newest_sent_ms: u64,
}

#[derive(Debug)]
pub struct ReplayGuard {
    window_ms: u64,
    max_runs: usize,
    runs: HashMap<(String, u64), Run>,
}

impl ReplayGuard {
    pub fn new(window_ms: u64, max_runs: usize) -> ReplayGuard {
        ReplayGuard {
            window_ms,
            max_runs,
            runs: HashMap::new(),
        }
    }

    /// Takes the message stamped (`sender`, `stamp`, `sent_ms`) at `now_ms`, or says
    /// why not; a refusal changes nothing.
    pub fn admit(
        &mut self,
        sender: &str,
        stamp: Stamp,
        sent_ms: u64,
        now_ms: u64,
    ) -> Result<(), Refusal> {
        if sent_ms.abs_diff(now_ms) > self.window_ms {
            return Err(Refusal::Stale);
        }
        let key = (sender.to_string(), stamp.boot);
        if let Some(run) = self.runs.get_mut(&key) {
            if stamp.seq <= run.highest_seq {
                return Err(Refusal::Replayed);
            }
            run.highest_seq = stamp.seq;
            run.newest_sent_ms = run.newest_sent_ms.max(sent_ms);
            return Ok(());
        }
        if self.runs.len() >= self.max_runs {
            let window = self.window_ms;
            self.runs
                .retain(|_, r| r.newest_sent_ms.saturating_add(window) >= now_ms);
            if self.runs.len() >= self.max_runs {
                return Err(Refusal::Crowded);
            }
        }
        self.runs.insert(
            key,
            Run {
                highest_seq: stamp.seq,
                newest_sent_ms: sent_ms,
            },
        );
        Ok(())
    }

    /// Runs remembered now.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;
    const W: u64 = 30_000;

    fn s(boot: u64, seq: u64) -> Stamp {
        Stamp { boot, seq }
    }

    #[test]
    fn each_message_is_taken_once_and_in_order() {
        let mut g = ReplayGuard::new(W, 16);
        assert_eq!(g.admit("a", s(1, 1), NOW, NOW), Ok(()));
        assert_eq!(g.admit("a", s(1, 1), NOW, NOW), Err(Refusal::Replayed));
        assert_eq!(g.admit("a", s(1, 5), NOW, NOW), Ok(()), "gaps are fine");
        assert_eq!(
            g.admit("a", s(1, 4), NOW, NOW),
            Err(Refusal::Replayed),
            "older than the newest taken"
        );
        assert_eq!(
            g.admit("b", s(1, 1), NOW, NOW),
            Ok(()),
            "senders are judged apart"
        );
    }

    #[test]
    fn the_window_bounds_both_ways() {
        let mut g = ReplayGuard::new(W, 16);
        assert_eq!(g.admit("a", s(1, 1), NOW - W, NOW), Ok(()), "at the edge");
        assert_eq!(g.admit("a", s(1, 2), NOW - W - 1, NOW), Err(Refusal::Stale));
        assert_eq!(g.admit("a", s(1, 3), NOW + W, NOW), Ok(()), "a clock ahead");
        assert_eq!(g.admit("a", s(1, 4), NOW + W + 1, NOW), Err(Refusal::Stale));
        assert_eq!(g.admit("a", s(1, 5), 0, NOW), Err(Refusal::Stale));
        assert_eq!(g.admit("a", s(1, 6), u64::MAX, NOW), Err(Refusal::Stale));
    }

    #[test]
    fn a_restarted_sender_is_taken_and_its_old_run_stays_refused() {
        let mut g = ReplayGuard::new(W, 16);
        assert_eq!(g.admit("a", s(1, 100), NOW, NOW), Ok(()));
        assert_eq!(
            g.admit("a", s(2, 1), NOW + 10, NOW + 10),
            Ok(()),
            "a new boot starts again at 1"
        );
        assert_eq!(
            g.admit("a", s(1, 90), NOW, NOW + 20),
            Err(Refusal::Replayed),
            "the old run is remembered while it could be fresh"
        );
        assert_eq!(
            g.admit("a", s(1, 90), NOW, NOW + W + 1),
            Err(Refusal::Stale),
            "and is stale after"
        );
    }

    #[test]
    fn memory_is_bounded_and_forgets_only_what_is_stale() {
        let mut g = ReplayGuard::new(W, 2);
        assert_eq!(g.admit("a", s(1, 1), NOW, NOW), Ok(()));
        assert_eq!(g.admit("b", s(1, 1), NOW, NOW), Ok(()));
        assert_eq!(
            g.admit("c", s(1, 1), NOW, NOW + 1),
            Err(Refusal::Crowded),
            "full of runs still inside the window: a new one waits"
        );
        assert_eq!(g.runs(), 2);
        assert_eq!(
            g.admit("a", s(1, 2), NOW + 1, NOW + 1),
            Ok(()),
            "known runs go on"
        );
        let later = NOW + W + 1;
        assert_eq!(g.admit("c", s(1, 1), later, later), Ok(()), "b aged out");
        assert_eq!(g.runs(), 2);
        assert_eq!(
            g.admit("b", s(1, 1), NOW, later),
            Err(Refusal::Stale),
            "what the guard forgot is stale"
        );
    }
}
