//! What the filter holds of each worker besides its load, as state machines the
//! shared tables store (`crate::shared`) and the glue drives from failures, probes,
//! pushes and latencies: up or down (`health`), flagged overloaded or not
//! (`overload`). Both screen the candidates before any policy runs.

pub mod health;
pub mod overload;
