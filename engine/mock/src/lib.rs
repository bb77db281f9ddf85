//! `engine-mock`: a stand-in for a vLLM / SGLang inference engine.
//!
//! End-to-end tests and the demo need upstreams that behave like real engines in the ways a
//! cache-aware router can observe: prompts that share a prefix get cheaper (a simulated paged
//! prefix cache), concurrency beyond a limit queues up, and the engine exports the same
//! Prometheus gauges the router scrapes. Everything else (the "model") is deliberately trivial
//! and deterministic so assertions stay simple.
//!
//! The crate is split so the pure parts can be reused without any I/O:
//! - [`config`]: the command line,
//! - [`prompt`], [`cache`]: the request-to-text flattening and the paged prefix cache,
//!   from `engine-model`, which host-sim's simulated fleet runs too,
//! - [`slots`]: the running-slot limiter with its FIFO wait queue,
//! - [`metrics`]: histograms and the Prometheus text rendering,
//! - [`tokenizer`] (from `engine-model`), [`kv_events`]: the mock's token ids and the
//!   KV cache events it publishes as vLLM does (`--kv-events-endpoint`),
//! - [`prompting`]: how a prompt is read, by the mock's tokens or a model's
//!   tokenizer and chat template (`--tokenizer`),
//! - [`server`]: the hyper HTTP server tying it together.

pub use engine_model::{cache, prompt, tokenizer};
pub mod config;
pub mod kv_events;
pub mod metrics;
pub mod pd;
pub mod prompting;
pub mod server;
pub mod slots;
