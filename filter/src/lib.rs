//! A cache-aware LLM routing filter for stock Envoy.
//!
//! The core is plain Rust with no proxy-wasm calls, tested natively and in wasm32.
//! It is layered, each module importing only from the layers below it:
//!
//! 1. `config` (the plugin configuration, overload settings included);
//! 2. `rng`, `tree`, `decision`, `parse`, `load`, `metric_names`, `header_names`,
//!    `models` (the `/v1/models` listing);
//! 3. `overload` (the flag machine), `health` (failures and probes), `pd` (the
//!    bootstrap rewrite), `push` (the collector's snapshot), `membership`
//!    (discovery mode's worker list updates);
//! 4. `shared`: the tables in proxy-wasm shared data and their one key space;
//! 5. `policy`, then `candidates`;
//! 6. `model_trees` (a VM's trees and their bounds), then `router` (trees +
//!    candidates + policy);
//! 7. `target`, then `plan` (a request's whole decision), then `bookkeeping`, and
//!    `worker_stats` (what each tick reports per worker).
//!
//! A request reads top to bottom: parse -> candidates -> policy -> plan -> target
//! -> bookkeeping. The `glue` module, compiled only for wasm32, is the thin
//! proxy-wasm layer: it gathers inputs from the host, calls the core, and applies
//! the answer. `small_blocks`, the VM's allocator, imports nothing of the rest.

// The filter never panics: a panic kills the Envoy thread's VM.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod bookkeeping;
pub mod candidates;
pub mod config;
pub mod counters;
pub mod decision;
pub mod header_names;
pub mod header_pairs;
pub mod health;
pub mod load;
pub mod membership;
pub mod metric_names;
pub mod model_trees;
pub mod models;
pub mod overload;
pub mod parse;
pub mod pd;
pub mod plan;
pub mod policy;
pub mod push;
pub mod replica;
pub mod rng;
pub mod router;
pub mod scan;
pub mod shared;
pub mod small_blocks;
pub mod target;
pub mod tree;
pub mod worker_stats;

// Not in the unit tests on wasm32-unknown-unknown: they run under Node, which has
// none of the proxy-wasm hostcalls the glue imports.
#[cfg(all(target_arch = "wasm32", not(all(test, target_os = "unknown"))))]
mod glue;
