//! `engine-model`: what a simulated vLLM / SGLang engine does, without I/O or clocks.
//!
//! The engine mock (`engine/mock`, real HTTP on tokio) and host-sim's simulated
//! fleet (virtual time) both run this model, so a workload sees the same prefix-cache
//! hits and the same prefill cost in either:
//! - [`prompt`]: flattening a request body into the text the cache hashes,
//! - [`cache`]: the paged prefix cache (chained SHA-256 blocks, LRU),
//! - [`computing`]: the blocks still being computed, which a request that finds them
//!   cached waits for,
//! - [`tokenizer`]: the token ids the mock publishes in its KV cache events, which
//!   the collector computes too to look a prompt up in them,
//! - `model_tokenizer` (feature `hf`): a model's own tokenizer and chat template,
//!   as vLLM applies them (the engine mock's `--tokenizer`, the collector's
//!   `--kv-tokenizer`),
//! - [`latency`]: the cost model (fixed TTFT + prefill per uncached token + decode),
//! - [`engine`]: one engine in virtual time: FIFO admission to `max_running` slots,
//!   the cache lookup when a request starts, and the `num_waiting` / `num_running`
//!   gauges the collector scrapes.

pub mod cache;
pub mod computing;
pub mod engine;
pub mod latency;
#[cfg(feature = "hf")]
pub mod model_tokenizer;
pub mod prompt;
pub mod tokenizer;
