//! Uniform random choice among the candidates.

use super::{decide, Ask, Chosen, Select};
use crate::config::{Config, Policy};
use crate::decision::{Decision, GateAudit, Reason};
use crate::load::Candidate;
use crate::rng::Rng;

#[derive(Debug, Default)]
pub struct Random;

impl Select for Random {
    type Params = ();

    fn params(_: &Config) {}

    fn select(&mut self, _: &(), ask: &Ask<'_>, rng: &mut dyn Rng) -> Chosen {
        Chosen::only(random(ask.candidates, rng))
    }
}

pub fn random(candidates: &[Candidate], rng: &mut dyn Rng) -> Option<Decision> {
    if candidates.is_empty() {
        return None;
    }
    let pick = candidates.get(rng.below(candidates.len()))?;
    Some(decide(
        pick.worker,
        Reason::Picked(Policy::Random),
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
    fn random_covers_all() {
        let c = cands(&[0, 9, 0]);
        let mut rng = SplitMix64(5);
        let mut seen = [false; 3];
        for _ in 0..100 {
            seen[random(&c, &mut rng).unwrap().worker as usize] = true;
        }
        assert_eq!(seen, [true; 3]);
    }
}
