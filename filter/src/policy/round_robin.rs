//! Round robin: each pool keeps its own counter (its own `Selectors`), so one
//! pool's traffic does not skew another's.

use super::{decide, Ask, Chosen, Select};
use crate::config::{Config, Policy};
use crate::decision::{Decision, GateAudit, Reason};
use crate::load::Candidate;
use crate::rng::Rng;

/// The counter of one pool's requests.
#[derive(Debug, Default)]
pub struct RoundRobin {
    counter: u64,
}

impl Select for RoundRobin {
    type Params = ();

    fn params(_: &Config) {}

    fn select(&mut self, _: &(), ask: &Ask<'_>, _: &mut dyn Rng) -> Chosen {
        Chosen::only(round_robin(ask.candidates, &mut self.counter))
    }
}

/// Round robin over the candidates, advancing a caller-held counter.
pub fn round_robin(candidates: &[Candidate], counter: &mut u64) -> Option<Decision> {
    if candidates.is_empty() {
        return None;
    }
    let pick = candidates.get((*counter % candidates.len() as u64) as usize)?;
    *counter = counter.wrapping_add(1);
    Some(decide(
        pick.worker,
        Reason::Picked(Policy::RoundRobin),
        0,
        GateAudit::default(),
    ))
}

#[cfg(test)]
mod tests {
    use super::super::testing::cands;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn round_robin_cycles() {
        let c = cands(&[0, 0, 0]);
        let mut counter = 0;
        let picks: Vec<_> = (0..6)
            .map(|_| round_robin(&c, &mut counter).unwrap().worker)
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
    }
}
