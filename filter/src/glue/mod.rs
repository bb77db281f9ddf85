//! The proxy-wasm layer, compiled for wasm32 only: it gathers inputs from the host,
//! calls the core, and applies the answer. Every hostcall goes through
//! [`hostcalls`], whose functions return `Result` for every status: the SDK's trait
//! helpers and its own `hostcalls` panic on an unexpected status, and a panic kills
//! this Envoy thread's VM.
//!
//! One file per concern: `root` (configuration, tick), `state` (the VM state),
//! `stream` (the HTTP callbacks), `push` (the collector's endpoint), `membership`
//! (discovery mode's worker list from pushes), `prefill` (PD's
//! prefill leg), `bookkeeping` (in-flight holds, metrics, recorded operations),
//! `replica` (the replica bridge's endpoint), `reply` (local replies), `prober`
//! (overload and health probes), `health` (failed upstreams take their worker out),
//! `decide` (a request's decision, here or for another VM), `relay` (one VM routes
//! for the others: asking, waiting, the deadline), `seat` (which VM routes),
//! `queues` (this VM's relay queues and the streams they serve), `answering` (the
//! routing VM's side), `relayed` (the stream handle the relay shares), `telling`
//! (what an asking VM tells the routing VM of the requests it counts), `kv_match`
//! (the collector's word on what the engines hold of a prompt), `metrics` and
//! `host`.

mod answering;
mod bookkeeping;
mod decide;
mod health;
mod host;
mod hostcalls;
mod kv_match;
mod membership;
mod metrics;
mod prefill;
mod prober;
mod push;
mod queues;
mod relay;
mod relayed;
mod replica;
mod reply;
mod root;
mod seat;
mod state;
mod stream;
mod telling;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::Root::new())
    });
}}
