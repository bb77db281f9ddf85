//! One VM routes for the whole Envoy (`route_in: one_vm`): the trees live once, in
//! the VM that holds the seat, and every other VM asks it over proxy-wasm shared
//! queues instead of replaying every routed text into a copy of its own.
//!
//! - `seat`: which VM routes, claimed in shared data with a heartbeat, so that a
//!   router that stops (its VM failed, its configuration was replaced) is taken
//!   over by the next VM that notices;
//! - `wire`: what crosses the queues: a worker VM's question (the request's path
//!   and body, with its notes of ended requests) and the router's answer (the decisions, the worker names, PD's
//!   rewritten body, and what undoes the records if no engine serves it);
//! - `holds`: the router's counts of the requests it decided for other VMs, for
//!   their whole life, and `tell`: what an asking VM tells it of their ends;
//! - `part`: a root context's part (routing, asking, or neither) and what it keeps.
//!
//! Sans-IO like the rest of the core: the glue (`glue::relay`) registers the
//! queues, pauses and resumes the streams.

pub mod holds;
pub mod part;
pub mod seat;
pub mod tell;
pub mod wire;

pub use holds::{Given, Hold, Holds};
pub use part::{Late, Part, Seated};
pub use seat::{Seat, SeatCall};
pub use tell::Tell;
pub use wire::{
    Answer, Ask, Booked, Counted, Event, Inbound, Leg, Note, RecordMeta, Refused, Retold, Routed,
    Told, Verdict,
};
