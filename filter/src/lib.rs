//! A cache-aware LLM routing filter for stock Envoy.
//!
//! The core is plain Rust with no proxy-wasm calls, tested natively and in wasm32.
//! Its folders follow the work: `request/` is a request's path after `parse/` (the
//! candidates, the policy's choice through the router, the plan, its target and its
//! bookkeeping), `policy/` holds the policies behind one seam, `background/` what
//! the ticks and the collector's pushes drive (membership, peer replicas,
//! per-worker stats), `shared/` the state every thread of an Envoy shares, and
//! `support/` the helpers; `config/`, `tree/`, `parse/`, the values a decision is
//! made of (`decision`, `load`) and the workers' state machines (`worker/`: health
//! and overload) sit below them.
//!
//! It is layered, each module importing only from the layers below it (a test,
//! `layers.rs`, reads this list and holds the code to it):
//!
//! 1. `config` (the plugin configuration), `rng`, `scan` (the byte scans),
//!    `support::counters`, `support::header_names`, `support::header_pairs`,
//!    `support::small_blocks` (the VM's allocator), `kv_match` (what the engines
//!    hold of a prompt, as the collector says);
//! 2. `tree` (the prefix trees), `parse` (a body's routing inputs);
//! 3. `decision` (what a decision says of itself), `load` (the workers' load as a
//!    request sees it), `request::models` (the `/v1/models` listing),
//!    `request::target` (the header that names the worker), `request::model_trees`
//!    (a VM's trees and their bounds), `request::kv_bounds` (what each engine can
//!    hold of them), `request::pd` (the bootstrap rewrite);
//! 4. `support::metric_names`, `worker::health` (failures and probes),
//!    `worker::overload` (the flag machine), `push` (the collector's snapshot),
//!    `background::worker_stats` (what each tick reports per worker);
//! 5. `shared` (the tables in proxy-wasm shared data and their one key space),
//!    `background::membership` (discovery mode's worker list updates);
//! 6. `background::replica` (peer replicas' reports), `policy` (the policies),
//!    `request::candidates` (the serving set after the screens);
//! 7. `request::router` (trees + candidates + policy), `relay` (one VM routing for
//!    the others: the seat, what crosses the shared queues, each VM's part);
//! 8. `request::plan` (a request's whole decision);
//! 9. `request::bookkeeping` (what an applied plan books);
//! 10. `glue` (wasm32 only), the thin proxy-wasm layer: it gathers inputs from the
//!     host, calls the core, and applies the answer.
//!
//! A request reads top to bottom: parse -> candidates -> policy -> plan -> target
//! -> bookkeeping.

// The filter never panics: a panic kills the Envoy thread's VM.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod background;
pub mod config;
pub mod decision;
pub mod kv_match;
pub mod load;
pub mod parse;
pub mod policy;
pub mod push;
pub mod relay;
pub mod request;
pub mod rng;
pub mod scan;
pub mod shared;
pub mod support;
pub mod tree;
pub mod worker;

#[cfg(all(test, not(target_arch = "wasm32")))]
mod layers;

// Not in the unit tests on wasm32-unknown-unknown: they run under Node, which has
// none of the proxy-wasm hostcalls the glue imports.
#[cfg(all(target_arch = "wasm32", not(all(test, target_os = "unknown"))))]
mod glue;
