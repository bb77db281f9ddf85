//! One VM routes for the whole Envoy (`route_in: one_vm`): the trees live once, in
//! the VM that holds the seat, and every other VM asks it over proxy-wasm shared
//! queues instead of replaying every routed text into a copy of its own.
//!
//! - `seat`: which VM routes, claimed in shared data with a heartbeat, so that a
//!   router that stops (its VM failed, its configuration was replaced) is taken
//!   over by the next VM that notices;
//! - `wire`: what crosses the queues: a worker VM's question (the request's path
//!   and body) and the router's answer (the decisions, the worker names, PD's
//!   rewritten body, and what undoes the records if no engine serves it);
//! - `handover`: the router's own count of a decision, held until the asking VM's
//!   count of it is shared;
//! - `part`: a root context's part (routing, asking, or neither) and what it keeps.
//!
//! Sans-IO like the rest of the core: the glue (`glue::relay`) registers the
//! queues, pauses and resumes the streams.

pub mod handover;
pub mod part;
pub mod seat;
pub mod wire;

pub use handover::Handover;
pub use part::{Late, Part, Seated};
pub use seat::{Seat, SeatCall};
pub use wire::{Answer, Ask, RecordMeta, Refused, Routed, Verdict};
