//! Retry schedule for engines whose scrape failed and for a filter that is down.
//!
//! Hammering a dead engine every interval wastes sockets and floods the log; waiting
//! longer after each consecutive failure (interval x2, x4, ... capped at 30 s) finds a
//! recovered engine soon enough, since routing treats it as unreachable meanwhile.

use std::time::{Duration, Instant};

/// Longest wait between attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The wait after `failures` consecutive failures (0: none, retry next interval).
/// Never shorter than `base`, even when `base` is above the cap.
pub fn delay(base: Duration, failures: u32) -> Duration {
    let factor = 1u32.checked_shl(failures.min(31)).unwrap_or(u32::MAX);
    base.checked_mul(factor)
        .unwrap_or(Duration::MAX)
        .min(MAX_BACKOFF.max(base))
}

/// Consecutive-failure state for one target.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    failures: u32,
    retry_at: Option<Instant>,
}

impl Backoff {
    pub fn new(base: Duration) -> Self {
        Self {
            base,
            failures: 0,
            retry_at: None,
        }
    }

    /// Whether an attempt is due at `now`.
    pub fn ready(&self, now: Instant) -> bool {
        self.retry_at.is_none_or(|t| now >= t)
    }

    /// Records a failure at `now` and returns how long until the next attempt.
    pub fn failed(&mut self, now: Instant) -> Duration {
        self.failures = self.failures.saturating_add(1);
        let d = delay(self.base, self.failures);
        self.retry_at = Some(now + d);
        d
    }

    /// Records a success: the next attempt is due at once.
    pub fn succeeded(&mut self) {
        self.failures = 0;
        self.retry_at = None;
    }

    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_doubles_then_caps() {
        let s = Duration::from_secs(1);
        let got: Vec<u64> = (0..8).map(|n| delay(s, n).as_secs()).collect();
        assert_eq!(got, vec![1, 2, 4, 8, 16, 30, 30, 30]);
        assert_eq!(delay(s, u32::MAX), MAX_BACKOFF, "no overflow");
        let ms = Duration::from_millis(50);
        assert_eq!(delay(ms, 1), Duration::from_millis(100));
        assert_eq!(delay(ms, 20), MAX_BACKOFF);
        let slow = Duration::from_secs(60);
        assert_eq!(delay(slow, 3), slow, "never shorter than the interval");
    }

    #[test]
    fn backoff_state() {
        let t0 = Instant::now();
        let mut b = Backoff::new(Duration::from_secs(1));
        assert!(b.ready(t0));
        assert_eq!(b.failed(t0), Duration::from_secs(2));
        assert!(!b.ready(t0 + Duration::from_millis(1999)));
        assert!(b.ready(t0 + Duration::from_secs(2)));
        assert_eq!(
            b.failed(t0 + Duration::from_secs(2)),
            Duration::from_secs(4)
        );
        assert_eq!(b.failures(), 2);
        b.succeeded();
        assert!(b.ready(t0));
        assert_eq!(b.failed(t0), Duration::from_secs(2), "schedule restarts");
    }
}
