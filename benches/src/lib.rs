//! What the benchmark binaries share.

pub mod envoy_memory;
