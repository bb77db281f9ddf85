//! What a routed request books once its plan was applied: exactly one decision
//! label (so labels sum to the routed count), the queue gate's work of every pool
//! that decided, and in PD the pair. The glue turns a `Booking` into metric
//! increments, holds the in-flight counts, and records the plan's tree operations.

use crate::decision::Decision;
use crate::plan::Plan;

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
    match &plan.prefill {
        Some(leg) => Booking {
            labelled: &leg.decision,
            gate_only: Some(&plan.main),
            pd_pair: true,
        },
        None => Booking {
            labelled: &plan.main,
            gate_only: None,
            pd_pair: false,
        },
    }
}
