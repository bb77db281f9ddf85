//! Latency quantiles from Prometheus histograms, over a sliding window.
//!
//! Engines export cumulative histograms since process start, so a quantile of the raw
//! counts describes the whole uptime and barely moves under a new load spike. Routing
//! needs "how slow is it now", so we keep each engine's cumulative bucket counts per
//! scrape and take the quantile of (newest - oldest within the window), the way
//! `histogram_quantile(0.9, rate(x_bucket[30s]))` would.
//!
//! Everything here is pure (the caller supplies the clock) so it is unit-tested.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Cumulative buckets `(upper bound, count)`, sorted by bound; the last bound is
/// `+Inf` in any well-formed histogram.
pub type Buckets = Vec<(f64, f64)>;

/// The `q` quantile of cumulative `buckets`, interpolated linearly inside the bucket
/// as Prometheus' `histogram_quantile` does. `None` when there are no observations
/// or the histogram is malformed (no `+Inf` bucket, fewer than two buckets): an
/// unknown latency must never read as a zero latency.
pub fn quantile(q: f64, buckets: &[(f64, f64)]) -> Option<f64> {
    if !(0.0..=1.0).contains(&q) || buckets.len() < 2 {
        return None;
    }
    let (last_bound, total) = *buckets.last()?;
    if last_bound != f64::INFINITY || buckets.iter().any(|(b, c)| b.is_nan() || !c.is_finite()) {
        return None;
    }
    // Counts are cumulative and so must not decrease; scraping races can make them
    // do so by a hair, which Prometheus also smooths over by taking a running max.
    let mut counts = Vec::with_capacity(buckets.len());
    let mut max = 0.0_f64;
    for &(bound, count) in buckets {
        max = max.max(count);
        counts.push((bound, max));
    }
    let total = total.max(max);
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let finite = &counts[..counts.len() - 1];
    let b = finite.iter().position(|&(_, c)| c >= rank);
    let Some(b) = b else {
        // The rank falls in the +Inf bucket: the best we can say is "at least the
        // highest finite bound".
        return Some(finite[finite.len() - 1].0);
    };
    let (bucket_end, count_end) = counts[b];
    let (bucket_start, count_start) = if b == 0 {
        if bucket_end <= 0.0 {
            return Some(bucket_end);
        }
        (0.0, 0.0)
    } else {
        counts[b - 1]
    };
    let in_bucket = count_end - count_start;
    if in_bucket <= 0.0 {
        return Some(bucket_end);
    }
    Some(bucket_start + (bucket_end - bucket_start) * ((rank - count_start) / in_bucket))
}

/// `newer - older`, bucket by bucket; `None` when the bucket layouts differ.
fn delta(newer: &[(f64, f64)], older: &[(f64, f64)]) -> Option<Buckets> {
    if newer.len() != older.len() {
        return None;
    }
    newer
        .iter()
        .zip(older)
        .map(|(&(bn, cn), &(bo, co))| (bn == bo).then_some((bn, cn - co)))
        .collect()
}

/// One engine's scrapes of one histogram within the window.
#[derive(Debug, Clone)]
pub struct Window {
    span: Duration,
    samples: VecDeque<(Instant, Buckets)>,
}

impl Window {
    pub fn new(span: Duration) -> Self {
        Self {
            span,
            samples: VecDeque::new(),
        }
    }

    /// Records a scrape taken at `at`. A counter reset (any count lower than in the
    /// previous scrape: the engine restarted) or a changed bucket layout makes the
    /// history meaningless, so it is dropped and the window starts over from here.
    pub fn observe(&mut self, at: Instant, buckets: Buckets) {
        if let Some((_, prev)) = self.samples.back() {
            let reset = match delta(&buckets, prev) {
                Some(d) => d.iter().any(|&(_, c)| c < 0.0),
                None => true,
            };
            if reset {
                self.samples.clear();
            }
        }
        self.samples.push_back((at, buckets));
        while let Some((oldest, _)) = self.samples.front() {
            if at.saturating_duration_since(*oldest) > self.span {
                self.samples.pop_front();
            } else {
                break;
            }
        }
    }

    /// Forgets everything (the histogram disappeared from the engine's metrics).
    pub fn clear(&mut self) {
        self.samples.clear();
    }

    /// The `q` quantile of the observations made within the window; `None` when the
    /// window holds fewer than two scrapes or no new observations.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let (_, oldest) = self.samples.front()?;
        let (_, newest) = self.samples.back()?;
        if self.samples.len() < 2 {
            return None;
        }
        quantile(q, &delta(newest, oldest)?)
    }

    pub fn p90(&self) -> Option<f64> {
        self.quantile(0.9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    fn close(a: Option<f64>, b: f64) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-9)
    }

    #[test]
    fn all_in_first_bucket_interpolates_from_zero() {
        let b = [(0.1, 10.0), (0.5, 10.0), (INF, 10.0)];
        assert!(close(quantile(0.9, &b), 0.09));
        assert!(close(quantile(0.5, &b), 0.05));
    }

    #[test]
    fn all_in_inf_returns_highest_finite_bound() {
        let b = [(0.1, 0.0), (0.5, 0.0), (INF, 7.0)];
        assert_eq!(quantile(0.9, &b), Some(0.5));
    }

    #[test]
    fn exactly_at_a_bound() {
        // Half the observations at or below 1, the rest in (1, 2].
        let b = [(1.0, 5.0), (2.0, 10.0), (INF, 10.0)];
        assert!(close(quantile(0.5, &b), 1.0));
        assert!(close(quantile(1.0, &b), 2.0));
        // p90 inside the second bucket: 1 + 1 * (9 - 5) / 5.
        assert!(close(quantile(0.9, &b), 1.8));
    }

    #[test]
    fn empty_and_malformed_are_unknown() {
        assert_eq!(quantile(0.9, &[(0.1, 0.0), (INF, 0.0)]), None);
        assert_eq!(quantile(0.9, &[(0.1, 1.0), (0.2, 1.0)]), None, "no +Inf");
        assert_eq!(quantile(0.9, &[(INF, 3.0)]), None, "only +Inf");
        assert_eq!(quantile(0.9, &[]), None);
        assert_eq!(quantile(0.9, &[(0.1, f64::NAN), (INF, 1.0)]), None);
        assert_eq!(quantile(1.5, &[(0.1, 1.0), (INF, 1.0)]), None);
    }

    #[test]
    fn negative_first_bound_is_returned_as_is() {
        assert_eq!(quantile(0.5, &[(-1.0, 4.0), (INF, 4.0)]), Some(-1.0));
    }

    #[test]
    fn non_monotonic_counts_are_smoothed() {
        let b = [(1.0, 10.0), (2.0, 9.999), (INF, 10.0)];
        assert!(close(quantile(0.5, &b), 0.5));
    }

    fn h(counts: &[f64]) -> Buckets {
        [0.1, 0.5, 1.0, INF]
            .iter()
            .copied()
            .zip(counts.iter().copied())
            .collect()
    }

    #[test]
    fn window_uses_deltas_between_oldest_and_newest() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(30));
        // 100 fast requests before the window starts.
        w.observe(t0, h(&[100.0, 100.0, 100.0, 100.0]));
        assert_eq!(w.p90(), None, "one scrape: no delta yet");
        w.observe(
            t0 + Duration::from_secs(1),
            h(&[100.0, 100.0, 100.0, 100.0]),
        );
        assert_eq!(w.p90(), None, "no new observations is unknown, not 0");
        // 10 slow ones (0.5..1.0) arrive: the raw p90 would still say 0.1.
        w.observe(
            t0 + Duration::from_secs(2),
            h(&[100.0, 100.0, 110.0, 110.0]),
        );
        assert!(close(w.p90(), 0.5 + 0.5 * 0.9));
        // Long after, the window only spans quiet scrapes again.
        w.observe(
            t0 + Duration::from_secs(40),
            h(&[100.0, 100.0, 110.0, 110.0]),
        );
        assert_eq!(w.p90(), None, "old samples fell out of the window");
    }

    #[test]
    fn counter_reset_drops_history() {
        let t0 = Instant::now();
        let mut w = Window::new(Duration::from_secs(30));
        w.observe(t0, h(&[50.0, 60.0, 70.0, 80.0]));
        w.observe(t0 + Duration::from_secs(1), h(&[50.0, 60.0, 70.0, 90.0]));
        assert_eq!(w.p90(), Some(1.0), "all ten new ones in +Inf");
        // The engine restarted: counts went down.
        w.observe(t0 + Duration::from_secs(2), h(&[1.0, 1.0, 1.0, 1.0]));
        assert_eq!(w.p90(), None, "history dropped, one sample left");
        w.observe(t0 + Duration::from_secs(3), h(&[3.0, 3.0, 3.0, 3.0]));
        assert!(close(w.p90(), 0.09));
        // A different bucket layout is a reset too.
        w.observe(t0 + Duration::from_secs(4), vec![(1.0, 9.0), (INF, 9.0)]);
        assert_eq!(w.p90(), None);
    }
}
