//! A cache-aware LLM routing filter for stock Envoy.
//!
//! The core (tree, request parsing, policies, router, config) is plain Rust with no
//! proxy-wasm calls, tested natively and in wasm32. The `glue` module, compiled only
//! for wasm32, is the thin proxy-wasm layer: it gathers inputs from the host, calls
//! the core, and applies the answer.

pub mod config;
pub mod decision;
pub mod load;
pub mod overload;
pub mod pd;
pub mod policy;
pub mod request;
pub mod router;
pub mod sync;
pub mod tree;

#[cfg(target_arch = "wasm32")]
mod glue;
