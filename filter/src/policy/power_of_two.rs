//! Power of two choices: two distinct random candidates, the less loaded wins; it
//! spreads load nearly as well as least-load without herding on one worker.

use super::{decide, Ask, Chosen, Select};
use crate::config::{Config, Policy};
use crate::decision::{Decision, GateAudit, Reason};
use crate::load::Candidate;
use crate::rng::Rng;

#[derive(Debug, Default)]
pub struct PowerOfTwo;

impl Select for PowerOfTwo {
    type Params = ();

    fn params(_: &Config) {}

    fn select(&mut self, _: &(), ask: &Ask<'_>, rng: &mut dyn Rng) -> Chosen {
        Chosen::only(power_of_two(ask.candidates, rng))
    }
}

/// Two distinct random candidates, the less loaded wins (ties: the first drawn).
pub fn power_of_two(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<Decision> {
    let n = candidates.len();
    if n == 0 {
        return None;
    }
    let a = rng.below(n);
    let first = candidates.get(a)?;
    let pick = if n == 1 {
        first
    } else {
        let second = candidates.get((a + 1 + rng.below(n - 1)) % n)?;
        if second.inflight < first.inflight {
            second
        } else {
            first
        }
    };
    Some(decide(
        pick.worker,
        Reason::Picked(Policy::PowerOfTwo),
        0,
        GateAudit::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testing::cands;
    use super::*;
    use crate::rng::SplitMix64;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn power_of_two_never_picks_the_busiest_of_two() {
        let c = cands(&[5, 0]);
        let mut rng = SplitMix64(9);
        for _ in 0..50 {
            assert_eq!(power_of_two(&c, &mut rng).unwrap().worker, 1);
        }
        let one = cands(&[3]);
        assert_eq!(power_of_two(&one, &mut rng).unwrap().worker, 0);
    }
}
