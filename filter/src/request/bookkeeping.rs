//! What a routed request books once its plan was applied: exactly one decision
//! label (so labels sum to the routed count), the queue gate's work of every pool
//! that decided, and in PD the pair. The glue turns a `Booking` into metric
//! increments, holds the in-flight counts, and records the plan's tree operations.

use crate::decision::Decision;
use crate::request::plan::Plan;

/// The counts one routed request adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booking<'a> {
    /// Counted under its label, with its gate work.
    pub labelled: &'a Decision,
    /// PD: the decode pool's decision, whose gate work is counted without a label.
    pub gate_only: Option<&'a Decision>,
    /// PD: one prefill/decode pair sent.
    pub pd_pair: bool,
}

/// The prefill pool holds the prompt cache, so in PD its decision is the request's
/// label; a PD request without a body (no prefill) is labelled by its decode.
pub fn booking(plan: &Plan) -> Booking<'_> {
    booking_of(&plan.main, plan.prefill.as_ref().map(|leg| &leg.decision))
}

/// [`booking`] of a plan's decisions: the request itself's (`main`) and in PD the
/// prefill leg's (as the routing VM answers them to the VM that asked).
pub fn booking_of<'a>(main: &'a Decision, prefill: Option<&'a Decision>) -> Booking<'a> {
    match prefill {
        Some(prefill) => Booking {
            labelled: prefill,
            gate_only: Some(main),
            pd_pair: true,
        },
        None => Booking {
            labelled: main,
            gate_only: None,
            pd_pair: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Policy;
    use crate::decision::{GateAudit, Reason};
    use crate::request::plan::PrefillLeg;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn decision(worker: u32, reason: Reason) -> Decision {
        Decision {
            worker,
            reason,
            matched_chars: 0,
            gate: GateAudit::default(),
            predicted: None,
        }
    }

    fn plan(prefill: Option<Decision>) -> Plan {
        Plan {
            main: decision(1, Reason::Picked(Policy::PowerOfTwo)),
            prefill: prefill.map(|decision| PrefillLeg {
                decision,
                body: Vec::new(),
            }),
            records: Vec::new(),
        }
    }

    #[test]
    fn a_regular_request_is_labelled_by_its_decision() {
        let p = plan(None);
        let b = booking(&p);
        assert_eq!(b.labelled, &p.main);
        assert_eq!((b.gate_only, b.pd_pair), (None, false));
    }

    #[test]
    fn a_pd_pair_is_labelled_by_its_prefill_and_gates_its_decode() {
        let p = plan(Some(decision(0, Reason::CacheHit)));
        let b = booking(&p);
        assert_eq!(b.labelled.reason, Reason::CacheHit);
        assert_eq!(b.gate_only, Some(&p.main));
        assert!(b.pd_pair);
    }
}
