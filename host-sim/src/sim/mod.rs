//! Layer 6, the simulator on top of the host: a [`fleet::SimFleet`] of simulated
//! engines behind the filter, and [`replay`], which runs a whole workload through the
//! filter against one in virtual time. Re-exported at the crate root as
//! `host_sim::fleet` and `host_sim::replay`.

pub mod fleet;
pub mod replay;
