//! Layer 6, the simulator on top of the host: a [`fleet::SimFleet`] of simulated
//! engines behind the filter, [`replay`], which runs a whole workload through the
//! filter against one in virtual time, and [`sweep`], which runs every policy over a
//! seeded family of workloads and fleets. Re-exported at the crate root as
//! `host_sim::fleet`, `host_sim::replay` and `host_sim::sweep`.

pub mod fleet;
pub mod replay;
pub mod sweep;
