//! When requests arrive in `--request-rate` mode: a Poisson process, as `vllm bench
//! serve` models independent users, so bursts and lulls come at the rate's natural
//! variance rather than on a metronome (a metronome hides queueing).
//!
//! The gaps are exponential with mean `1 / rate`, drawn from a seeded generator so
//! two runs with the same seed send on the same schedule.

use crate::generate::Draws;
use std::time::Duration;

/// The arrival schedule: an endless sequence of gaps between arrivals.
#[derive(Debug, Clone)]
pub struct Arrivals {
    rate_per_s: f64,
    rng: Draws,
}

impl Arrivals {
    /// Poisson arrivals at `rate_per_s` (must be finite and > 0; the CLI checks).
    pub fn poisson(rate_per_s: f64, seed: u64) -> Self {
        Self {
            rate_per_s,
            rng: Draws::new(seed, 0xA7, 0, 0),
        }
    }

    /// The time until the next arrival.
    pub fn next_gap(&mut self) -> Duration {
        // 1 - U is in (0, 1], so the logarithm is finite.
        let u = 1.0 - self.rng.unit();
        Duration::from_secs_f64(-u.ln() / self.rate_per_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_average_to_the_rate_and_repeat_with_the_seed() {
        let mut a = Arrivals::poisson(50.0, 7);
        let gaps: Vec<f64> = (0..20_000).map(|_| a.next_gap().as_secs_f64()).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!(
            (mean - 0.02).abs() < 0.001,
            "mean gap {mean} s, expected 1/50"
        );
        // Exponential: about 1/e of the gaps exceed the mean.
        let over = gaps.iter().filter(|g| **g > 0.02).count() as f64 / gaps.len() as f64;
        assert!(
            (over - (-1f64).exp()).abs() < 0.02,
            "share over mean {over}"
        );
        let mut b = Arrivals::poisson(50.0, 7);
        let again: Vec<f64> = (0..100).map(|_| b.next_gap().as_secs_f64()).collect();
        assert_eq!(again, gaps[..100], "same seed, same schedule");
    }
}
