//! `llm-collector`: the companion that tells the llm-router filter how loaded each
//! engine is.
//!
//! The filter runs inside Envoy and cannot scrape engines itself (proxy-wasm has no
//! timers that fan out HTTP calls cheaply, and every Envoy worker thread would scrape
//! the same engines). So this process scrapes each engine's Prometheus `/metrics`
//! once per interval, reduces it to a few numbers (queue depth, running requests, KV
//! usage, windowed p90 latencies) and pushes one JSON snapshot to the filter's stats
//! endpoint.
//!
//! One module per concept: [`cli`] (flags), [`membership`] (which engines, from flags
//! or Envoy's admin API), [`scrape`] (HTTP GET with a timeout), [`metrics`] (what we
//! read from the Prometheus text), [`histogram`] (windowed quantiles, pure),
//! [`backoff`] (retry schedule, pure), [`snapshot`] (the pushed document, in the
//! types the filter reads: `llm_router_push`), [`push`] (the POST to each filter,
//! one [`push::Target`] per `--push-url`), [`telemetry`] (its own `/healthz` and
//! `/metrics`), [`server`] (the `--listen` server), [`logging`] (structured logs), [`kv_events`] (the engines' KV event
//! streams, `--kv-events`) into [`kv_index`] (one block index per engine, pure),
//! [`kv_match`] (which engines hold a request's prompt, pure; served as
//! `POST /kv/match`) with [`model_tokenizer`] (a model's tokenizer and chat template) and [`run`] (the loop tying them together).

pub mod backoff;
pub mod cli;
pub mod histogram;
pub mod kv_events;
pub mod kv_index;
pub mod kv_match;
pub mod logging;
pub mod membership;
pub mod metrics;
/// A model's tokenizer and chat template, shared with the engine mock.
pub use engine_model::model_tokenizer;
pub mod push;
pub mod run;
pub mod scrape;
pub mod server;
pub mod snapshot;
pub mod telemetry;
