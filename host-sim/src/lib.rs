//! # host-sim: a proxy-wasm ABI 0.2.1 host that runs a filter like Envoy 1.40 does
//!
//! `host-sim` loads a filter's real `.wasm` (wasm32-wasip1, proxy-wasm Rust SDK 0.2.5) into
//! wasmtime and implements every `env.proxy_*` hostcall plus the WASI functions Rust's std
//! needs, so integration tests run the real filter without Envoy.
//!
//! ## Model
//!
//! * **VMs are worker threads.** Envoy runs one copy (VM) of a plugin per worker thread.
//!   A [`Host`] holds N VMs: N wasmtime `Store`s instantiating the same compiled `Module`.
//!   Each VM has its own linear memory, root context (id 1) and stream contexts (ids 2, 3,
//!   ...), exactly like separate workers: nothing in guest memory is shared.
//! * **One shared store.** What Envoy shares across workers is shared across VMs through
//!   one `Arc<Mutex<..>>`: shared data (`proxy_get/set_shared_data`, with Envoy's CAS rules),
//!   shared queues (delivery to the last registrant, `proxy_on_queue_ready` on its VM),
//!   metrics (`wasmcustom.NAME`, one value per name over all VMs), pending HTTP calls.
//! * **Virtual clock.** Time only moves with [`Host::advance_time`]. `proxy_get_current_time_
//!   nanoseconds` and WASI clocks read it; ticks (`proxy_set_tick_period_milliseconds`) fire
//!   in time order on *every* VM whose period elapsed; HTTP-call timeouts expire with a 504.
//!   Randomness (WASI `random_get`) comes from a per-VM generator seeded from
//!   [`HostBuilder::seed`], so runs are deterministic.
//! * **Envoy's stream rules.** Callback results are interpreted as Envoy 1.40 does: `Pause`
//!   from a headers callback is StopAllIterationAndWatermark unless
//!   [`HostBuilder::allow_on_headers_stop_iteration`] (then the body is held back until the
//!   filter calls `continue_stream`); `Pause` from a body callback buffers (the next body
//!   callback sees the accumulated size); request headers are only readable/writable while
//!   Envoy exposes them (until they are continued; reads in `on_log`); local replies and
//!   `continue_stream` run after the callback returns and local replies go through the
//!   filter's own response callbacks.
//! * **Faults.** [`Host::inject`] (or [`HostBuilder::fault`] for start-up) makes any
//!   hostcall answer a chosen status, or trap, at a chosen call count or probability;
//!   [`envoy_failures`] lists what Envoy itself can answer per hostcall.
//! * **Failure policies.** [`HostBuilder::failure_policy`]: a trap is an API error
//!   ([`FailurePolicy::Strict`], the default for tests), or handled as Envoy's
//!   `FAIL_CLOSED` / `FAIL_OPEN` / `FAIL_RELOAD` (a 503 `wasm_fail_stream`; a fresh VM
//!   on the same shared data).
//! * **Traffic.** HTTP calls are answered by the test ([`Host::answer_http_call`]) or
//!   time out; upstreams can be a [`fleet::SimFleet`] of simulated engines;
//!   [`replay`] runs a whole workload against one in virtual time.
//! * **WASI.** The preview1 functions Rust's std needs are implemented once, for the
//!   filter VMs (output captured as logs, virtual clocks, seeded randomness) and for
//!   `host-sim wasi-run` ([`run_wasi_command`]), which runs wasm32 libtest binaries.
//! * **Errors.** A bad argument returns a status to the guest (BadArgument, NotFound,
//!   CasMismatch...) as Envoy does; a broken pointer traps. A trap fails the VM and the API
//!   call returns an error carrying the last guest logs (Rust panic messages are on stderr,
//!   captured as logs).
//!
//! ## Layers
//!
//! Bottom to top; a module only imports from the layers below it:
//!
//! 1. `types`: the ABI's codes, the pairs encoding, the values of the API
//!    ([`RequestSpec`], [`StreamOutcome`], [`HttpCall`], [`LogEntry`], [`MetricValue`]...),
//!    [`Fault`] descriptions, the seeded generator.
//! 2. `state`: what lives in a VM's `Store` (`HostState`) and what VMs share (`Shared`).
//! 3. `hostcall`: registration behind the fault check, and the one guest-memory helper.
//! 4. `abi` (the `env.proxy_*` hostcalls, one file per family) and `wasi` (preview1).
//! 5. `vm`: [`Filter`], [`HostBuilder`], [`Host`], [`VmHandle`], guest calls and the
//!    stream state machine.
//! 6. [`sim`]: [`fleet`], [`replay`] and [`sweep`]. The CLI (`main.rs`, `cli/`) sits on
//!    the public API.
//!
//! ## Example
//!
//! ```no_run
//! use host_sim::{Host, RequestSpec};
//!
//! # fn main() -> anyhow::Result<()> {
//! let mut host = Host::builder("target/wasm32-wasip1/wasm/llm_router.wasm")
//!     .plugin_config(br#"{"workers": [{"name": "w0", "cluster": "engine_0"}]}"#.to_vec())
//!     .vms(4)
//!     .seed(7)
//!     .clusters(&["engine_0", "engine_1"])
//!     .allow_on_headers_stop_iteration(true)
//!     .build()?;
//! let out = host.vm(0).request(RequestSpec {
//!     headers: vec![
//!         (":method", "POST"),
//!         (":path", "/v1/chat/completions"),
//!         (":authority", "x"),
//!         ("content-type", "application/json"),
//!     ],
//!     body: br#"{"messages": [{"role": "user", "content": "hi"}]}"#.to_vec(),
//!     body_chunks: 1,
//! })?;
//! assert!(out.continued);
//! assert_eq!(out.header("x-llm-router-cluster"), Some("engine_0"));
//! let resp = host.vm(0).respond(out.handle, 200, &[("content-type", "application/json")], b"{}")?;
//! assert_eq!(resp.header(":status"), Some("200"));
//! host.vm(0).finish(out.handle)?;
//! host.advance_time(1_000)?;
//! println!("{:?} {:?}", host.metric("wasmcustom.llm_router_decisions_cache_miss"), host.logs(0));
//! # Ok(())
//! # }
//! ```

/// Where `cargo build -p llm-router --target wasm32-wasip1 --profile wasm` leaves the
/// routing filter in this workspace (honouring `CARGO_TARGET_DIR`);
/// `LLM_ROUTER_WASM` overrides it.
pub fn built_filter_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("LLM_ROUTER_WASM") {
        return p.into();
    }
    std::env::var_os("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("wasm32-wasip1/wasm/llm_router.wasm")
}

/// [`built_filter_path`], or a panic that says how to build it (for tests).
pub fn require_built_filter() -> std::path::PathBuf {
    let path = built_filter_path();
    assert!(
        path.is_file(),
        "the filter is not built at {}: run `cargo build -p llm-router --target wasm32-wasip1 --profile wasm` (or set LLM_ROUTER_WASM)",
        path.display()
    );
    path
}

mod abi;
mod hostcall;
pub mod sim;
mod state;
mod types;
mod vm;
mod wasi;

pub use sim::{fleet, replay, sweep};
pub use types::codes::{LogLevel, Status};
pub use types::fault::{envoy_failures, Answer, Fault, Trigger};
pub use types::values::{
    FailurePolicy, HttpCall, LocalResponse, LogEntry, LogSource, MetricValue, RequestSpec,
    ResponseOutcome, StreamHandle, StreamOutcome,
};
pub use vm::{Filter, Host, HostBuilder, VmHandle};

/// Runs a WASI preview1 command module (`host-sim wasi-run`, the cargo runner for
/// wasm32-wasip1 test binaries) with `args`, and returns its exit code; see
/// `wasi::command`.
pub fn run_wasi_command(module: &std::path::Path, args: &[String]) -> anyhow::Result<i32> {
    wasi::command::run(module, args)
}
