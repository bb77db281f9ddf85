//! A real fleet on loopback: engine mock processes, the companion collector, the real
//! Envoy with the built filter, and helpers to talk to them. `envoy/demo` (the
//! `llm-demo` binary) and the end-to-end tests use the same code, so what the demo
//! shows is what the tests check.
//!
//! Every process is owned by a guard that kills it on drop, on success and on
//! failure alike, and every port is chosen by the OS (port 0, read back), so runs
//! never collide.

pub mod admin;
pub mod discovery;
pub mod engine_args;
pub mod envoy;
pub mod family;
pub mod fleet;
pub mod paths;
pub mod process;
pub mod replicas;
pub mod side_by_side;
pub mod smg;
