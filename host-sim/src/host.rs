//! The [`Host`]: VMs, their lifecycle, and the Envoy-like HTTP stream state machine.

use crate::abi::{LogLevel, Status};
use crate::env::{self, Registry};
use crate::fault::Fault;
use crate::state::{
    lock, CallResponse, Config, Deferred, Flow, HeaderState, HostState, MetricValue, Shared,
};
use crate::wasi;
use anyhow::{anyhow, bail, Context as _, Result};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use wasmtime::{
    Engine, ExternType, Instance, InstancePre, Linker, Module, Store, TypedFunc, WasmParams,
    WasmResults,
};

/// Where a log line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogSource {
    /// `proxy_log` (the SDK's `log` calls).
    Proxy,
    /// WASI stdout (`println!`).
    Stdout,
    /// WASI stderr (`eprintln!`, Rust panic messages).
    Stderr,
    /// A note from host-sim itself.
    Host,
}

/// What a trap of the guest (a Rust panic, an out-of-bounds access...) does, as Envoy's
/// plugin `failure_policy` says. A failed VM runs no more callbacks (no ticks, no
/// queue deliveries, no `on_log`); shared data, metrics and the other VMs live on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailurePolicy {
    /// host-sim's default for tests: the API call that ran into the trap returns an
    /// error carrying the trap and the last guest logs, and the VM refuses later calls.
    #[default]
    Strict,
    /// Envoy's default: the stream that trapped, and every later stream on that VM, get
    /// a local 503 (`wasm_fail_stream`) without the filter.
    FailClosed,
    /// The stream that trapped, and every later one on that VM, pass through untouched.
    FailOpen,
    /// As `FailClosed` for the stream that trapped; the next stream on that VM starts a
    /// fresh VM (new linear memory, `on_vm_start`, `on_configure`) on the same shared
    /// data, so what other VMs stored survives.
    FailReload,
}

/// One captured log line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LogEntry {
    /// The VM (worker) that logged it.
    pub vm: usize,
    /// The (effective) context the VM was running.
    pub context_id: u32,
    /// Level (stdout is `Info`, stderr is `Error`).
    pub level: LogLevel,
    /// Origin.
    pub source: LogSource,
    /// The text.
    pub message: String,
    /// Virtual time, ms since the Unix epoch.
    pub time_ms: u64,
}

/// A local response sent with `proxy_send_local_response`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalResponse {
    /// HTTP status (from the response headers the filter finally left, if it changed it).
    pub status: u32,
    /// Headers: in [`StreamOutcome::local_response`] these are the response headers as the
    /// filter left them in `on_response_headers` (Envoy runs the encoder path on local
    /// replies), including `:status`, `content-length` and `content-type` added by Envoy.
    pub headers: Vec<(String, String)>,
    /// Body (after the filter's `on_response_body`).
    pub body: Vec<u8>,
    /// `details` argument (Envoy's response code details).
    pub details: String,
    /// gRPC status argument (-1 when not set).
    pub grpc_status: i32,
}

impl LocalResponse {
    /// First value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
}

/// An HTTP call dispatched with `proxy_http_call`, waiting for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    /// Token; answer with [`Host::answer_http_call`]. Unique across all VMs of a host.
    pub token: u32,
    /// The VM that made the call.
    pub vm: usize,
    /// The context that made the call (root or stream).
    pub context_id: u32,
    /// Cluster name.
    pub cluster: String,
    /// Request headers (Envoy adds `content-length` when there is a body).
    pub headers: Vec<(String, String)>,
    /// Request body.
    pub body: Vec<u8>,
    /// Request trailers.
    pub trailers: Vec<(String, String)>,
    /// Timeout in ms (0: none). On expiry, [`Host::advance_time`] answers it with Envoy's
    /// 504 "upstream request timeout".
    pub timeout_ms: u32,
    /// Virtual time of the dispatch.
    pub dispatched_at_ms: u64,
}

impl HttpCall {
    /// First value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
}

/// A request to send through the filter.
#[derive(Debug, Clone, Default)]
pub struct RequestSpec<'a> {
    /// Request headers including pseudo-headers (`:method`, `:path`, `:authority`). Names are
    /// lower-cased like Envoy does.
    pub headers: Vec<(&'a str, &'a str)>,
    /// Request body; empty means a headers-only request (`end_of_stream` on the headers).
    pub body: Vec<u8>,
    /// Number of chunks the body arrives in (0 or 1: one chunk).
    pub body_chunks: usize,
}

impl<'a> RequestSpec<'a> {
    /// A `POST` with `content-type: application/json` to `path` on authority `host-sim`.
    pub fn post_json(path: &'a str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            headers: vec![
                (":method", "POST"),
                (":path", path),
                (":authority", "host-sim"),
                (":scheme", "http"),
                ("content-type", "application/json"),
            ],
            body: body.into(),
            body_chunks: 1,
        }
    }
}

/// Identifies a stream: the VM it runs on and its context id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle {
    /// VM index.
    pub vm: usize,
    /// Context id of the stream in that VM.
    pub context_id: u32,
}

/// The state of a stream as seen from outside Envoy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOutcome {
    /// Handle for [`VmHandle::respond`], [`VmHandle::finish`], [`VmHandle::reset`].
    pub handle: StreamHandle,
    /// Request headers as the filter left them: as sent upstream if they were forwarded,
    /// else the current map.
    pub request_headers: Vec<(String, String)>,
    /// The request body as sent upstream (plus, if not all sent, what is still buffered).
    pub request_body: Vec<u8>,
    /// The request headers were passed on to the router (upstream).
    pub headers_forwarded: bool,
    /// Headers and the whole body were passed upstream (`end_stream` reached the router).
    pub continued: bool,
    /// Local response sent by the filter, if any (the stream then never goes upstream).
    pub local_response: Option<LocalResponse>,
    /// Number of successful `clear_route_cache` foreign-function calls.
    pub clear_route_cache: u32,
    /// Names of all foreign functions the stream called, in order.
    pub foreign_calls: Vec<String>,
    /// HTTP calls made by this stream that are still pending.
    pub http_calls: Vec<HttpCall>,
    /// Properties set with `proxy_set_property` (path parts joined with '.').
    pub properties: BTreeMap<String, Vec<u8>>,
    /// on_log/on_done/on_delete have run.
    pub finished: bool,
    /// The stream was reset (by [`VmHandle::reset`] or `proxy_close_stream`).
    pub reset: bool,
}

impl StreamOutcome {
    /// First value of a request header (name in lower case) as the filter left it.
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.request_headers, name)
    }
}

/// The response as it leaves the filter towards the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseOutcome {
    /// Response headers as the filter left them (including `:status`).
    pub headers: Vec<(String, String)>,
    /// Response body as sent downstream (plus what is still buffered).
    pub body: Vec<u8>,
    /// Headers and the whole body went downstream.
    pub continued: bool,
}

impl ResponseOutcome {
    /// First value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        find(&self.headers, name)
    }
}

fn find<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

fn owned_headers(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect()
}

/// A compiled filter: engine, module and pre-linked imports. Cheap to clone; build many
/// hosts from one `Filter` to compile the `.wasm` only once.
#[derive(Clone)]
pub struct Filter {
    engine: Engine,
    module: Module,
    pre: InstancePre<HostState>,
}

impl Filter {
    /// Compiles the `.wasm` file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).with_context(|| format!("reading wasm {}", path.display()))?;
        Self::from_bytes(&bytes).with_context(|| format!("loading {}", path.display()))
    }

    /// Compiles a `.wasm` binary. Fails, naming them, if the module imports anything this
    /// host does not implement, or if it does not export a proxy-wasm 0.2.x ABI marker.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let engine = Engine::default();
        let module = Module::from_binary(&engine, bytes)
            .map_err(wasm_err)
            .context("compiling the wasm module")?;
        let mut linker = Linker::new(&engine);
        let mut implemented = HashSet::new();
        for (name, register) in [
            (
                "env",
                env::register as fn(&mut Registry) -> wasmtime::Result<()>,
            ),
            ("wasi_snapshot_preview1", wasi::register),
        ] {
            let mut registry = Registry {
                linker: &mut linker,
                module: name,
                names: Vec::new(),
            };
            register(&mut registry).map_err(wasm_err)?;
            implemented.extend(registry.names.iter().map(|n| (name, *n)));
        }
        let missing: Vec<String> = module
            .imports()
            .filter(|i| {
                !matches!(i.ty(), ExternType::Func(_))
                    || !implemented.contains(&(i.module(), i.name()))
            })
            .map(|i| format!("{}.{}", i.module(), i.name()))
            .collect();
        if !missing.is_empty() {
            bail!(
                "the module imports functions host-sim does not implement: {}",
                missing.join(", ")
            );
        }
        let abi = ["proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0"];
        if !module.exports().any(|e| abi.contains(&e.name())) {
            bail!("the module exports no proxy_abi_version_0_2_1 (is it a proxy-wasm filter?)");
        }
        let pre = linker
            .instantiate_pre(&module)
            .map_err(wasm_err)
            .context("linking the module's imports")?;
        Ok(Self {
            engine,
            module,
            pre,
        })
    }

    /// The module's imports as `(module, name)`.
    pub fn imports(&self) -> Vec<(String, String)> {
        self.module
            .imports()
            .map(|i| (i.module().to_string(), i.name().to_string()))
            .collect()
    }
}

enum Source {
    Path(PathBuf),
    Bytes(Vec<u8>),
    Filter(Filter),
}

/// Builder for a [`Host`]; see [`Host::builder`].
pub struct HostBuilder {
    source: Source,
    vms: usize,
    faults: Vec<Fault>,
    start_time_ms: u64,
    cfg: Config,
}

impl HostBuilder {
    fn new(source: Source) -> Self {
        Self {
            source,
            vms: 1,
            faults: Vec::new(),
            start_time_ms: 1_700_000_000_000,
            cfg: Config {
                plugin_config: Vec::new(),
                vm_config: Vec::new(),
                plugin_name: "host-sim".into(),
                root_id: String::new(),
                vm_id: String::new(),
                clusters: Vec::new(),
                log_level: LogLevel::Info,
                allow_on_headers_stop_iteration: false,
                seed: 0,
                properties: Vec::new(),
                failure_policy: FailurePolicy::Strict,
            },
        }
    }

    /// Plugin configuration bytes (`configuration` of the plugin config in Envoy), read by the
    /// filter in `on_configure` (BufferType PluginConfiguration).
    pub fn plugin_config(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.cfg.plugin_config = bytes.into();
        self
    }

    /// VM configuration bytes (`vm_config.configuration`), BufferType VmConfiguration.
    pub fn vm_config(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.cfg.vm_config = bytes.into();
        self
    }

    /// Number of VMs, i.e. Envoy worker threads (`--concurrency`). Default 1.
    pub fn vms(mut self, n: usize) -> Self {
        self.vms = n;
        self
    }

    /// Seed of the per-VM random generators behind WASI `random_get`. Default 0.
    pub fn seed(mut self, seed: u64) -> Self {
        self.cfg.seed = seed;
        self
    }

    /// Cluster names `proxy_http_call` accepts (others: BadArgument, like Envoy).
    pub fn clusters<S: AsRef<str>>(mut self, names: &[S]) -> Self {
        self.cfg.clusters = names.iter().map(|n| n.as_ref().to_string()).collect();
        self
    }

    /// Plugin name (`plugin_name` property). Default "host-sim".
    pub fn plugin_name(mut self, name: &str) -> Self {
        self.cfg.plugin_name = name.into();
        self
    }

    /// Root id (`plugin_root_id` property). Default "".
    pub fn root_id(mut self, id: &str) -> Self {
        self.cfg.root_id = id.into();
        self
    }

    /// VM id (`plugin_vm_id`; scopes shared data and queues). Default "".
    pub fn vm_id(mut self, id: &str) -> Self {
        self.cfg.vm_id = id.into();
        self
    }

    /// Level returned by `proxy_get_log_level` (all logs are captured regardless).
    /// Default Info, as Envoy's default.
    pub fn log_level(mut self, level: LogLevel) -> Self {
        self.cfg.log_level = level;
        self
    }

    /// Envoy's plugin option `allow_on_headers_stop_iteration` (default false, as in Envoy
    /// 1.40). When false, `Pause` from a headers callback becomes StopAllIterationAndWatermark:
    /// Envoy holds the body back and the filter sees no body callback until it calls
    /// `continue_stream`. When true, `Pause` is StopIteration: body callbacks still run and
    /// the headers stay editable until the filter continues.
    pub fn allow_on_headers_stop_iteration(mut self, allow: bool) -> Self {
        self.cfg.allow_on_headers_stop_iteration = allow;
        self
    }

    /// Initial virtual time (ms since the Unix epoch). Default 1_700_000_000_000.
    pub fn start_time_ms(mut self, ms: u64) -> Self {
        self.start_time_ms = ms;
        self
    }

    /// What a trap of the guest does (Envoy's `failure_policy`). Default
    /// [`FailurePolicy::Strict`].
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.cfg.failure_policy = policy;
        self
    }

    /// A fault injected from the start, so it can hit the VMs' start-up
    /// (`on_vm_start`, `on_configure`); see [`Host::inject`].
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// An extra property for `proxy_get_property`, by dotted path (e.g. "node.id").
    pub fn property(mut self, path: &str, value: impl Into<Vec<u8>>) -> Self {
        self.cfg.properties.push((path.into(), value.into()));
        self
    }

    /// Compiles (unless given a [`Filter`]), instantiates every VM and runs its lifecycle:
    /// `_initialize` (else `_start`), `proxy_on_context_create(root, 0)`,
    /// `proxy_on_vm_start`, `proxy_on_configure`. A `false` from either is an error.
    pub fn build(self) -> Result<Host> {
        if self.vms == 0 {
            bail!("a host needs at least one VM");
        }
        let filter = match self.source {
            Source::Path(path) => Filter::load(path)?,
            Source::Bytes(bytes) => Filter::from_bytes(&bytes)?,
            Source::Filter(filter) => filter,
        };
        let cfg = Arc::new(self.cfg);
        let mut shared = Shared::new(self.start_time_ms, cfg.seed);
        shared.faults.rules = self.faults;
        let shared = Arc::new(Mutex::new(shared));
        let mut host = Host {
            cfg: cfg.clone(),
            shared: shared.clone(),
            filter: filter.clone(),
            vms: Vec::new(),
            depth: 0,
        };
        for vm in 0..self.vms {
            let slot = Slot::instantiate(&filter, vm, cfg.clone(), shared.clone())
                .with_context(|| format!("instantiating VM {vm}"))?;
            host.vms.push(slot);
            host.start_vm(vm)?;
        }
        host.pump()?;
        Ok(host)
    }
}

type Export<P, R> = Option<TypedFunc<P, R>>;

struct Exports {
    context_create: Export<(i32, i32), ()>,
    vm_start: Export<(i32, i32), i32>,
    configure: Export<(i32, i32), i32>,
    tick: Export<i32, ()>,
    queue_ready: Export<(i32, i32), ()>,
    request_headers: Export<(i32, i32, i32), i32>,
    request_body: Export<(i32, i32, i32), i32>,
    response_headers: Export<(i32, i32, i32), i32>,
    response_body: Export<(i32, i32, i32), i32>,
    http_call_response: Export<(i32, i32, i32, i32, i32), ()>,
    log: Export<i32, ()>,
    done: Export<i32, i32>,
    delete: Export<i32, ()>,
}

struct Slot {
    store: Store<HostState>,
    ex: Exports,
    failed: Option<String>,
    /// Fresh VMs that replaced a failed one ([`FailurePolicy::FailReload`]).
    reloads: u32,
}

fn export<P: WasmParams, R: WasmResults>(
    instance: &Instance,
    store: &mut Store<HostState>,
    name: &str,
) -> Result<Export<P, R>> {
    match instance.get_func(&mut *store, name) {
        None => Ok(None),
        Some(f) => Ok(Some(f.typed(&*store).map_err(wasm_err).with_context(
            || format!("export {name} does not have the proxy-wasm 0.2.1 signature"),
        )?)),
    }
}

impl Slot {
    fn instantiate(
        filter: &Filter,
        vm: usize,
        cfg: Arc<Config>,
        shared: Arc<Mutex<Shared>>,
    ) -> Result<Self> {
        let mut store = Store::new(&filter.engine, HostState::new(vm, cfg, shared));
        let instance = filter.pre.instantiate(&mut store).map_err(wasm_err)?;
        let memory = instance.get_memory(&mut store, "memory");
        let alloc = match export::<i32, i32>(&instance, &mut store, "proxy_on_memory_allocate")? {
            Some(f) => Some(f),
            None => export(&instance, &mut store, "malloc")?,
        };
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc;
        let s = &mut store;
        let ex = Exports {
            context_create: export(&instance, s, "proxy_on_context_create")?,
            vm_start: export(&instance, s, "proxy_on_vm_start")?,
            configure: export(&instance, s, "proxy_on_configure")?,
            tick: export(&instance, s, "proxy_on_tick")?,
            queue_ready: export(&instance, s, "proxy_on_queue_ready")?,
            request_headers: export(&instance, s, "proxy_on_request_headers")?,
            request_body: export(&instance, s, "proxy_on_request_body")?,
            response_headers: export(&instance, s, "proxy_on_response_headers")?,
            response_body: export(&instance, s, "proxy_on_response_body")?,
            http_call_response: export(&instance, s, "proxy_on_http_call_response")?,
            log: export(&instance, s, "proxy_on_log")?,
            done: export(&instance, s, "proxy_on_done")?,
            delete: export(&instance, s, "proxy_on_delete")?,
        };
        if ex.context_create.is_none() {
            bail!("the module does not export proxy_on_context_create");
        }
        let init = match export::<(), ()>(&instance, s, "_initialize")? {
            Some(f) => Some(f),
            None => export::<(), ()>(&instance, s, "_start")?,
        };
        if let Some(init) = init {
            if let Err(e) = init.call(&mut store, ()) {
                store.data_mut().flush_stdio();
                let tail = tail_logs(&store.data().logs);
                bail!("_initialize/_start trapped: {e:?}\nrecent guest logs:\n{tail}");
            }
        }
        Ok(Self {
            store,
            ex,
            failed: None,
            reloads: 0,
        })
    }
}

/// wasmtime 48 has its own error type; keep its full report (with the wasm backtrace).
fn wasm_err(e: wasmtime::Error) -> anyhow::Error {
    anyhow!("{e:?}")
}

fn tail_logs(logs: &[LogEntry]) -> String {
    let start = logs.len().saturating_sub(12);
    logs[start..]
        .iter()
        .map(|l| format!("  [{:?} {:?}] {}", l.source, l.level, l.message))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A set of VMs running one filter, like the worker threads of one Envoy process.
pub struct Host {
    cfg: Arc<Config>,
    shared: Arc<Mutex<Shared>>,
    filter: Filter,
    vms: Vec<Slot>,
    depth: u32,
}

impl Host {
    /// Starts building a host for the `.wasm` file at `wasm_path`.
    pub fn builder(wasm_path: impl AsRef<Path>) -> HostBuilder {
        HostBuilder::new(Source::Path(wasm_path.as_ref().to_path_buf()))
    }

    /// Starts building a host for a `.wasm` binary.
    pub fn builder_from_bytes(wasm: impl Into<Vec<u8>>) -> HostBuilder {
        HostBuilder::new(Source::Bytes(wasm.into()))
    }

    /// Starts building a host for an already compiled [`Filter`].
    pub fn builder_for(filter: &Filter) -> HostBuilder {
        HostBuilder::new(Source::Filter(filter.clone()))
    }

    /// One VM (worker thread). Out-of-range indexes make every call on the handle fail.
    pub fn vm(&mut self, index: usize) -> VmHandle<'_> {
        VmHandle {
            host: self,
            vm: index,
        }
    }

    /// Number of VMs.
    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// Virtual time, ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        lock(&self.shared).now_ns / 1_000_000
    }

    /// Advances the virtual clock by `ms`, firing in time order every due `proxy_on_tick` (on
    /// every VM whose tick period elapsed, as every Envoy worker ticks) and answering HTTP
    /// calls whose timeout expired with a 504, then delivering queue notifications.
    pub fn advance_time(&mut self, ms: u64) -> Result<()> {
        let target = lock(&self.shared)
            .now_ns
            .saturating_add(ms.saturating_mul(1_000_000));
        loop {
            let next_tick = self
                .vms
                .iter()
                .enumerate()
                .filter(|(_, slot)| slot.failed.is_none())
                .filter_map(|(vm, slot)| slot.store.data().next_tick_ns.map(|t| (t, vm)))
                .min();
            let next_timeout = lock(&self.shared)
                .http_calls
                .values()
                .filter(|c| c.timeout_ms > 0)
                .map(|c| {
                    let deadline_ms = c.dispatched_at_ms.saturating_add(c.timeout_ms as u64);
                    (deadline_ms.saturating_mul(1_000_000), c.token)
                })
                .min();
            let timeout_first = match (next_tick, next_timeout) {
                (_, Some((t, _))) if t > target => false,
                (Some((tick, _)), Some((t, _))) => t < tick,
                (None, Some(_)) => true,
                _ => false,
            };
            if timeout_first {
                let (t, token) = next_timeout.unwrap_or_default();
                self.set_now(t);
                let call = lock(&self.shared).http_calls.remove(&token);
                if let Some(call) = call {
                    let headers = vec![
                        (":status".to_string(), "504".to_string()),
                        ("content-length".to_string(), "24".to_string()),
                        ("content-type".to_string(), "text/plain".to_string()),
                    ];
                    let body = b"upstream request timeout".to_vec();
                    self.deliver_call_response(call, Some(CallResponse { headers, body }))?;
                }
                continue;
            }
            let Some((t, vm)) = next_tick.filter(|(t, _)| *t <= target) else {
                break;
            };
            self.set_now(t);
            let s = self.vms[vm].store.data_mut();
            s.next_tick_ns = Some(t.saturating_add(s.tick_period_ms * 1_000_000));
            let root = s.root_ctx;
            self.invoke(vm, root, |e| e.tick.clone(), root as i32, "proxy_on_tick")?;
            self.settle(vm)?;
            self.pump()?;
        }
        self.set_now(target);
        Ok(())
    }

    fn set_now(&self, t: u64) {
        let mut shared = lock(&self.shared);
        shared.now_ns = shared.now_ns.max(t);
    }

    /// Log lines captured on one VM (empty for an unknown VM).
    pub fn logs(&self, vm: usize) -> &[LogEntry] {
        self.vms
            .get(vm)
            .map_or(&[], |s| s.store.data().logs.as_slice())
    }

    /// Log lines of all VMs, VM by VM.
    pub fn all_logs(&self) -> Vec<LogEntry> {
        self.vms
            .iter()
            .flat_map(|s| s.store.data().logs.iter().cloned())
            .collect()
    }

    /// Drops captured logs of all VMs.
    pub fn clear_logs(&mut self) {
        for slot in &mut self.vms {
            slot.store.data_mut().logs.clear();
        }
    }

    /// Value of a counter or gauge by its Envoy name (`wasmcustom.NAME`).
    pub fn metric(&self, name: &str) -> Option<u64> {
        match lock(&self.shared).metrics.get(name)? {
            MetricValue::Counter(v) | MetricValue::Gauge(v) => Some(*v),
            MetricValue::Histogram(_) => None,
        }
    }

    /// Values recorded into a histogram (`wasmcustom.NAME`).
    pub fn histogram(&self, name: &str) -> Option<Vec<u64>> {
        match lock(&self.shared).metrics.get(name)? {
            MetricValue::Histogram(values) => Some(values.clone()),
            _ => None,
        }
    }

    /// All metrics defined by the filter.
    pub fn metrics(&self) -> BTreeMap<String, MetricValue> {
        lock(&self.shared).metrics.clone()
    }

    /// Shared-data value (common to all VMs).
    pub fn shared_data(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.shared).data.get(key).map(|(v, _)| v.clone())
    }

    /// Shared-data keys, sorted.
    pub fn shared_data_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = lock(&self.shared).data.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Shared-data value with its CAS.
    pub fn shared_data_with_cas(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        lock(&self.shared).data.get(key).cloned()
    }

    /// Delivers a new plugin configuration to every VM (`proxy_on_configure` again, as
    /// on a config update that keeps the VMs); an error if a VM rejects it.
    pub fn reconfigure(&mut self, plugin_config: impl Into<Vec<u8>>) -> Result<()> {
        Arc::make_mut(&mut self.cfg).plugin_config = plugin_config.into();
        for vm in 0..self.vms.len() {
            self.state(vm).cfg = self.cfg.clone();
            self.configure(vm)?;
        }
        Ok(())
    }

    /// Sets shared data unconditionally (as another plugin would), bumping the CAS.
    pub fn set_shared_data(&mut self, key: &str, value: impl Into<Vec<u8>>) {
        lock(&self.shared).set_data(key, value.into(), 0);
    }

    /// All HTTP calls still waiting for an answer, by token.
    pub fn pending_http_calls(&self) -> Vec<HttpCall> {
        lock(&self.shared).http_calls.values().cloned().collect()
    }

    /// Total `clear_route_cache` calls over all VMs and contexts.
    pub fn clear_route_cache_total(&self) -> u64 {
        lock(&self.shared).clear_route_cache_total
    }

    /// Answers a pending HTTP call: runs `proxy_on_http_call_response` on the calling
    /// context with `:status` plus `headers` and `body`, then deferred actions (e.g. the
    /// filter resuming its stream).
    pub fn answer_http_call(
        &mut self,
        token: u32,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<()> {
        let call = self.take_call(token)?;
        let mut all = vec![(":status".to_string(), status.to_string())];
        all.extend(owned_headers(headers));
        let response = CallResponse {
            headers: all,
            body: body.to_vec(),
        };
        self.deliver_call_response(call, Some(response))
    }

    /// Fails a pending HTTP call like a connection reset: the callback sees 0 headers and
    /// `proxy_get_status` returns BrokenConnection / "reset".
    pub fn fail_http_call(&mut self, token: u32) -> Result<()> {
        let call = self.take_call(token)?;
        self.deliver_call_response(call, None)
    }

    /// Enqueues `data` on a shared queue registered by the filter (as another VM would).
    pub fn enqueue(&mut self, queue: &str, data: &[u8]) -> Result<()> {
        {
            let mut shared = lock(&self.shared);
            let key = (self.cfg.vm_id.clone(), queue.to_string());
            let token = *shared
                .queue_names
                .get(&key)
                .ok_or_else(|| anyhow!("no shared queue named {queue:?}"))?;
            let Some(q) = shared.queues.get_mut(&token) else {
                bail!("no shared queue named {queue:?}");
            };
            q.items.push_back(data.to_vec());
            let ready = (q.vm, q.context_id, token);
            shared.queue_ready.push_back(ready);
        }
        self.pump()
    }

    /// Injects a fault: from now on, the hostcall answers the fault's status when its
    /// trigger fires (see [`Fault`]).
    pub fn inject(&mut self, fault: Fault) {
        lock(&self.shared).faults.rules.push(fault);
    }

    /// Removes every injected fault (call counts keep running).
    pub fn clear_faults(&mut self) {
        lock(&self.shared).faults.rules.clear();
    }

    /// How many hostcalls answered an injected fault so far.
    pub fn faults_fired(&self) -> u64 {
        lock(&self.shared).faults.fired
    }

    /// Calls per hostcall so far, over all VMs (faulted calls included).
    pub fn hostcall_counts(&self) -> BTreeMap<String, u64> {
        let shared = lock(&self.shared);
        let calls = shared.faults.calls.iter();
        calls.map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// How many times a VM was replaced by a fresh one ([`FailurePolicy::FailReload`]).
    pub fn reloads(&self, vm: usize) -> u32 {
        self.vms.get(vm).map_or(0, |s| s.reloads)
    }

    /// Why a VM failed (a trap), if it did and was not reloaded since.
    pub fn failure(&self, vm: usize) -> Option<&str> {
        self.vms.get(vm)?.failed.as_deref()
    }

    fn take_call(&mut self, token: u32) -> Result<HttpCall> {
        lock(&self.shared)
            .http_calls
            .remove(&token)
            .ok_or_else(|| anyhow!("no pending HTTP call with token {token}"))
    }

    fn state(&mut self, vm: usize) -> &mut HostState {
        self.vms[vm].store.data_mut()
    }

    fn check_vm(&self, vm: usize) -> Result<()> {
        match self.vms.get(vm) {
            None => bail!("no VM {vm} (the host has {})", self.vms.len()),
            Some(Slot {
                failed: Some(why), ..
            }) if self.cfg.failure_policy == FailurePolicy::Strict => {
                bail!("VM {vm} failed earlier: {why}")
            }
            Some(_) => Ok(()),
        }
    }

    /// Calls a guest export with `ctx` as current and effective context. `Ok(None)` when the
    /// guest does not export it. A trap marks the VM failed and returns an error with the
    /// last guest logs (a Rust panic message is on stderr).
    fn invoke<P: WasmParams, R: WasmResults>(
        &mut self,
        vm: usize,
        ctx: u32,
        pick: impl FnOnce(&Exports) -> Export<P, R>,
        args: P,
        what: &str,
    ) -> Result<Option<R>> {
        self.check_vm(vm)?;
        if self.vms[vm].failed.is_some() {
            self.fail_stream(vm, ctx);
            return Ok(None);
        }
        let slot = &mut self.vms[vm];
        let Some(f) = pick(&slot.ex) else {
            return Ok(None);
        };
        let s = slot.store.data_mut();
        s.current_ctx = ctx;
        s.effective_ctx = ctx;
        s.stop_next_iteration = false;
        match f.call(&mut slot.store, args) {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                slot.store.data_mut().flush_stdio();
                let why = format!("{what}(context {ctx}) trapped: {e:?}");
                let tail = tail_logs(&slot.store.data().logs);
                slot.failed = Some(why.clone());
                if self.cfg.failure_policy == FailurePolicy::Strict {
                    return Err(anyhow!("VM {vm}: {why}\nrecent guest logs:\n{tail}"));
                }
                let policy = self.cfg.failure_policy;
                let s = slot.store.data_mut();
                s.log(
                    LogLevel::Critical,
                    LogSource::Host,
                    format!("{why} ({policy:?})"),
                );
                lock(&self.shared)
                    .http_calls
                    .retain(|_, c| c.vm != vm || c.context_id == ctx);
                self.fail_stream(vm, ctx);
                Ok(None)
            }
        }
    }

    /// Envoy's `failStream` on a failed VM: a local 503 `wasm_fail_stream` that does not
    /// go through the filter (unless the policy is fail-open), and the stream's HTTP
    /// calls are cancelled.
    fn fail_stream(&mut self, vm: usize, ctx: u32) {
        if self.cfg.failure_policy == FailurePolicy::FailOpen {
            return;
        }
        let Some(stream) = self.vms[vm].store.data_mut().streams.get_mut(&ctx) else {
            return;
        };
        if stream.finished {
            return;
        }
        stream.local_reply.get_or_insert_with(|| LocalResponse {
            status: 503,
            headers: vec![(":status".into(), "503".into())],
            body: Vec::new(),
            details: "wasm_fail_stream".into(),
            grpc_status: 14,
        });
        stream.finished = true;
        lock(&self.shared)
            .http_calls
            .retain(|_, c| !(c.vm == vm && c.context_id == ctx));
    }

    /// [`FailurePolicy::FailReload`]: a fresh VM replaces a failed one, on the same shared
    /// state.
    fn reload(&mut self, vm: usize) -> Result<()> {
        let slot = Slot::instantiate(&self.filter, vm, self.cfg.clone(), self.shared.clone())
            .with_context(|| format!("reloading VM {vm}"))?;
        let reloads = self.vms[vm].reloads + 1;
        self.vms[vm] = Slot { reloads, ..slot };
        lock(&self.shared).http_calls.retain(|_, c| c.vm != vm);
        self.start_vm(vm)
    }

    fn start_vm(&mut self, vm: usize) -> Result<()> {
        let root = self.state(vm).root_ctx as i32;
        let vm_size = self.cfg.vm_config.len() as i32;
        let what = "proxy_on_context_create";
        self.invoke(
            vm,
            root as u32,
            |e| e.context_create.clone(),
            (root, 0),
            what,
        )?;
        let what = "proxy_on_vm_start";
        let ok = self.invoke(
            vm,
            root as u32,
            |e| e.vm_start.clone(),
            (root, vm_size),
            what,
        )?;
        if ok == Some(0) {
            let tail = tail_logs(self.logs(vm));
            bail!("VM {vm}: proxy_on_vm_start returned false\nrecent guest logs:\n{tail}");
        }
        self.configure(vm)
    }

    /// `proxy_on_configure` on `vm` with the current plugin configuration.
    fn configure(&mut self, vm: usize) -> Result<()> {
        let root = self.state(vm).root_ctx as i32;
        let plugin_size = self.cfg.plugin_config.len() as i32;
        self.state(vm).in_configure = true;
        let what = "proxy_on_configure";
        let ok = self.invoke(
            vm,
            root as u32,
            |e| e.configure.clone(),
            (root, plugin_size),
            what,
        );
        self.state(vm).in_configure = false;
        if ok? == Some(0) {
            let tail = tail_logs(self.logs(vm));
            bail!(
                "VM {vm}: proxy_on_configure returned false (plugin configuration rejected)\n\
                 recent guest logs:\n{tail}"
            );
        }
        self.settle(vm)
    }

    /// Runs actions deferred by the last guest calls (Envoy's after-VM-call actions).
    fn settle(&mut self, vm: usize) -> Result<()> {
        if self.depth > 32 {
            bail!("VM {vm}: deferred actions nest too deeply (filter loops on continue/reply?)");
        }
        self.depth += 1;
        let mut result = Ok(());
        while let Some(action) = self.state(vm).deferred.pop_front() {
            result = match action {
                Deferred::Continue { ctx, response } => self.resume(vm, ctx, response),
                Deferred::LocalReply { ctx, reply } => self.local_reply(vm, ctx, reply),
                Deferred::Close { ctx } => self.end_stream(vm, ctx, true),
            };
            if result.is_err() {
                break;
            }
        }
        self.depth -= 1;
        result
    }

    /// Delivers queue notifications (Envoy posts them to the registrant's worker).
    fn pump(&mut self) -> Result<()> {
        for _ in 0..100_000 {
            let next = lock(&self.shared).queue_ready.pop_front();
            let Some((vm, ctx, token)) = next else {
                return Ok(());
            };
            if self.vms.get(vm).is_none_or(|s| s.failed.is_some()) {
                continue;
            }
            let args = (ctx as i32, token as i32);
            self.invoke(
                vm,
                ctx,
                |e| e.queue_ready.clone(),
                args,
                "proxy_on_queue_ready",
            )?;
            self.settle(vm)?;
        }
        bail!("shared queue notifications keep coming (enqueue loop?)")
    }

    fn deliver_call_response(
        &mut self,
        call: HttpCall,
        response: Option<CallResponse>,
    ) -> Result<()> {
        let (vm, ctx) = (call.vm, call.context_id);
        self.check_vm(vm)?;
        let s = self.state(vm);
        if ctx != s.root_ctx && s.streams.get(&ctx).is_none_or(|st| st.finished) {
            bail!(
                "HTTP call {} was cancelled: its context {ctx} is gone",
                call.token
            );
        }
        let (headers, body) = match &response {
            Some(r) => (r.headers.len(), r.body.len()),
            None => (0, 0),
        };
        if response.is_none() {
            s.status = (Status::BrokenConnection as u32, b"reset".to_vec());
        }
        s.call_response = response;
        let args = (
            ctx as i32,
            call.token as i32,
            headers as i32,
            body as i32,
            0,
        );
        let what = "proxy_on_http_call_response";
        let r = self.invoke(vm, ctx, |e| e.http_call_response.clone(), args, what);
        let s = self.state(vm);
        s.call_response = None;
        s.status.1.clear();
        r?;
        self.settle(vm)?;
        self.pump()
    }

    fn alive(&mut self, vm: usize, ctx: u32, response: bool) -> bool {
        self.state(vm)
            .streams
            .get(&ctx)
            .is_some_and(|s| !s.finished && !s.reset && (response || s.local_reply.is_none()))
    }

    fn flow(&mut self, vm: usize, ctx: u32, response: bool) -> Result<&mut Flow> {
        let stream = self
            .state(vm)
            .streams
            .get_mut(&ctx)
            .ok_or_else(|| anyhow!("VM {vm} has no stream {ctx}"))?;
        Ok(stream.flow(response))
    }

    fn forward_headers(flow: &mut Flow) {
        flow.fwd_headers = Some(flow.headers.clone());
        flow.headers_live = false;
        flow.hstate = HeaderState::Forwarded;
        if flow.headers_eos {
            flow.fwd_eos = true;
        }
    }

    /// `decodeHeaders` / `encodeHeaders`.
    fn headers_phase(&mut self, vm: usize, ctx: u32, response: bool, eos: bool) -> Result<()> {
        if !self.alive(vm, ctx, response) {
            return Ok(());
        }
        let flow = self.flow(vm, ctx, response)?;
        flow.headers_live = true;
        flow.headers_eos = eos;
        let args = (ctx as i32, flow.headers.len() as i32, eos as i32);
        let r = if response {
            let what = "proxy_on_response_headers";
            self.invoke(vm, ctx, |e| e.response_headers.clone(), args, what)?
        } else {
            let what = "proxy_on_request_headers";
            self.invoke(vm, ctx, |e| e.request_headers.clone(), args, what)?
        };
        if !self.alive(vm, ctx, response) {
            return self.settle(vm);
        }
        let stop = self.state(vm).stop_next_iteration;
        let allow = self.cfg.allow_on_headers_stop_iteration;
        let flow = self.flow(vm, ctx, response)?;
        match r.unwrap_or(0) {
            _ if stop => flow.hstate = HeaderState::StopAll,
            0 => Self::forward_headers(flow),
            1 if allow => flow.hstate = HeaderState::Stopped,
            _ => flow.hstate = HeaderState::StopAll,
        }
        self.settle(vm)
    }

    /// One body chunk arriving at the filter (`decodeData` / `encodeData`).
    fn body_chunk(
        &mut self,
        vm: usize,
        ctx: u32,
        response: bool,
        chunk: Vec<u8>,
        eos: bool,
    ) -> Result<()> {
        if !self.alive(vm, ctx, response) {
            return Ok(());
        }
        let flow = self.flow(vm, ctx, response)?;
        if flow.hstate == HeaderState::StopAll {
            flow.held.extend(chunk);
            flow.held_any = true;
            flow.held_eos = eos;
            return Ok(());
        }
        if flow.buffering {
            flow.body.extend(chunk);
        } else {
            flow.body = chunk;
        }
        self.deliver_body(vm, ctx, response, eos)
    }

    fn deliver_body(&mut self, vm: usize, ctx: u32, response: bool, eos: bool) -> Result<()> {
        let flow = self.flow(vm, ctx, response)?;
        flow.body_live = true;
        let args = (ctx as i32, flow.body.len() as i32, eos as i32);
        let r = if response {
            let what = "proxy_on_response_body";
            self.invoke(vm, ctx, |e| e.response_body.clone(), args, what)?
        } else {
            let what = "proxy_on_request_body";
            self.invoke(vm, ctx, |e| e.request_body.clone(), args, what)?
        };
        if !self.alive(vm, ctx, response) {
            return self.settle(vm);
        }
        let stop = self.state(vm).stop_next_iteration;
        let flow = self.flow(vm, ctx, response)?;
        flow.buffering = false;
        match r.unwrap_or(0) {
            // StopIterationNoBuffer (also forced after a local reply): data is dropped.
            action if stop || action >= 3 => {
                flow.body.clear();
                flow.body_live = false;
            }
            0 => {
                if flow.hstate != HeaderState::Forwarded {
                    Self::forward_headers(flow);
                }
                flow.fwd_body.append(&mut flow.body);
                flow.body_live = false;
                flow.fwd_eos |= eos;
            }
            // StopIterationAndBuffer / AndWatermark: Envoy keeps accumulating.
            _ => {
                flow.buffering = true;
                flow.stalled_eos = eos;
            }
        }
        self.settle(vm)
    }

    /// `continueDecoding` / `continueEncoding` after `proxy_continue_stream`.
    fn resume(&mut self, vm: usize, ctx: u32, response: bool) -> Result<()> {
        if !self.alive(vm, ctx, response) {
            return Ok(());
        }
        let flow = self.flow(vm, ctx, response)?;
        let was_stop_all = flow.hstate == HeaderState::StopAll;
        if matches!(flow.hstate, HeaderState::Stopped | HeaderState::StopAll) {
            Self::forward_headers(flow);
        }
        if flow.buffering {
            flow.fwd_body.append(&mut flow.body);
            flow.buffering = false;
            flow.body_live = false;
            flow.fwd_eos |= flow.stalled_eos;
        }
        if was_stop_all && flow.held_any {
            // Envoy now hands the data it held back to this filter, in one piece.
            flow.body = std::mem::take(&mut flow.held);
            flow.held_any = false;
            let eos = flow.held_eos;
            return self.deliver_body(vm, ctx, response, eos);
        }
        Ok(())
    }

    /// `sendLocalReply`: the reply goes through the encoder path (this filter's response
    /// callbacks), then the stream completes.
    fn local_reply(&mut self, vm: usize, ctx: u32, mut reply: LocalResponse) -> Result<()> {
        if !self.alive(vm, ctx, false) {
            return Ok(());
        }
        let stream = self.state(vm).streams.get_mut(&ctx).expect("alive stream");
        if stream.resp.hstate != HeaderState::Pending {
            // The response already started: Envoy can only reset the stream.
            stream.local_reply = Some(reply);
            return self.end_stream(vm, ctx, true);
        }
        let mut headers = vec![(":status".to_string(), reply.status.to_string())];
        headers.extend(reply.headers.iter().cloned());
        if !reply.body.is_empty() {
            if find(&headers, "content-length").is_none() {
                headers.push(("content-length".into(), reply.body.len().to_string()));
            }
            if find(&headers, "content-type").is_none() {
                headers.push(("content-type".into(), "text/plain".into()));
            }
        }
        let body = std::mem::take(&mut reply.body);
        stream.local_reply = Some(reply);
        stream.resp = Flow::new(headers);
        self.headers_phase(vm, ctx, true, body.is_empty())?;
        if !body.is_empty() {
            self.body_chunk(vm, ctx, true, body, true)?;
        }
        let stream = self.state(vm).streams.get_mut(&ctx).expect("stream");
        let out = response_outcome(&stream.resp);
        if let Some(reply) = stream.local_reply.as_mut() {
            if let Some(status) = find(&out.headers, ":status").and_then(|s| s.parse().ok()) {
                reply.status = status;
            }
            reply.headers = out.headers;
            reply.body = out.body;
        }
        self.end_stream(vm, ctx, false)
    }

    /// Stream completion: `proxy_on_log` (access-log phase), `proxy_on_done`,
    /// `proxy_on_delete`; pending HTTP calls of the context are cancelled.
    fn end_stream(&mut self, vm: usize, ctx: u32, reset: bool) -> Result<()> {
        let Some(stream) = self.state(vm).streams.get_mut(&ctx) else {
            bail!("VM {vm} has no stream {ctx}");
        };
        if stream.finished {
            return Ok(());
        }
        stream.reset |= reset;
        stream.log_phase = true;
        let r = self.invoke(vm, ctx, |e| e.log.clone(), ctx as i32, "proxy_on_log");
        if let Some(stream) = self.state(vm).streams.get_mut(&ctx) {
            stream.log_phase = false;
        }
        r?;
        self.settle(vm)?;
        self.invoke(vm, ctx, |e| e.done.clone(), ctx as i32, "proxy_on_done")?;
        self.settle(vm)?;
        self.invoke(vm, ctx, |e| e.delete.clone(), ctx as i32, "proxy_on_delete")?;
        if let Some(stream) = self.state(vm).streams.get_mut(&ctx) {
            stream.finished = true;
        }
        lock(&self.shared)
            .http_calls
            .retain(|_, c| !(c.vm == vm && c.context_id == ctx));
        self.settle(vm)
    }

    fn outcome(&mut self, vm: usize, ctx: u32) -> Result<StreamOutcome> {
        let calls: Vec<HttpCall> = lock(&self.shared)
            .http_calls
            .values()
            .filter(|c| c.vm == vm && c.context_id == ctx)
            .cloned()
            .collect();
        let Some(s) = self.state(vm).streams.get(&ctx) else {
            bail!("VM {vm} has no stream {ctx}");
        };
        let req = &s.req;
        let mut body = req.fwd_body.clone();
        if !req.fwd_eos {
            body.extend_from_slice(&req.body);
            body.extend_from_slice(&req.held);
        }
        Ok(StreamOutcome {
            handle: StreamHandle {
                vm,
                context_id: ctx,
            },
            request_headers: req.fwd_headers.clone().unwrap_or(req.headers.clone()),
            request_body: body,
            headers_forwarded: req.fwd_headers.is_some(),
            continued: req.fwd_eos && s.local_reply.is_none() && !s.reset,
            local_response: s.local_reply.clone(),
            clear_route_cache: s.clear_route_cache,
            foreign_calls: s.foreign_calls.clone(),
            http_calls: calls,
            properties: s
                .properties
                .iter()
                .map(|(k, v)| (String::from_utf8_lossy(k).replace('\0', "."), v.clone()))
                .collect(),
            finished: s.finished,
            reset: s.reset,
        })
    }

    fn stream_ctx(&mut self, vm: usize, handle: StreamHandle) -> Result<u32> {
        if handle.vm != vm {
            bail!("stream {handle:?} belongs to VM {}, not VM {vm}", handle.vm);
        }
        self.check_vm(vm)?;
        if !self.state(vm).streams.contains_key(&handle.context_id) {
            bail!("VM {vm} has no stream {}", handle.context_id);
        }
        Ok(handle.context_id)
    }
}

fn response_outcome(flow: &Flow) -> ResponseOutcome {
    let mut body = flow.fwd_body.clone();
    if !flow.fwd_eos {
        body.extend_from_slice(&flow.body);
        body.extend_from_slice(&flow.held);
    }
    ResponseOutcome {
        headers: flow.fwd_headers.clone().unwrap_or(flow.headers.clone()),
        body,
        continued: flow.fwd_eos,
    }
}

fn split_body(body: Vec<u8>, chunks: usize) -> Vec<Vec<u8>> {
    if body.is_empty() {
        return Vec::new();
    }
    let n = chunks.clamp(1, body.len());
    let size = body.len().div_ceil(n);
    body.chunks(size).map(<[u8]>::to_vec).collect()
}

/// One VM (worker thread) of a [`Host`]; see [`Host::vm`].
pub struct VmHandle<'a> {
    host: &'a mut Host,
    vm: usize,
}

impl VmHandle<'_> {
    /// Sends a request: `proxy_on_context_create`, `proxy_on_request_headers`, then the body
    /// chunks through `proxy_on_request_body` with Envoy's buffering rules, then deferred
    /// actions and queue notifications. Returns where the stream stands; if the filter
    /// paused it (e.g. waiting for an HTTP call), answer the call and look again with
    /// [`VmHandle::outcome`].
    pub fn request(&mut self, spec: RequestSpec<'_>) -> Result<StreamOutcome> {
        let (host, vm) = (&mut *self.host, self.vm);
        host.check_vm(vm)?;
        if host.cfg.failure_policy == FailurePolicy::FailReload && host.vms[vm].failed.is_some() {
            host.reload(vm)?;
        }
        let chunks = split_body(spec.body, spec.body_chunks);
        let now = lock(&host.shared).now_ns;
        let s = host.state(vm);
        let (ctx, root) = (s.next_ctx, s.root_ctx);
        s.next_ctx += 1;
        let stream = crate::state::StreamState::new(owned_headers(&spec.headers), now);
        s.streams.insert(ctx, stream);
        let args = (ctx as i32, root as i32);
        let what = "proxy_on_context_create";
        host.invoke(vm, ctx, |e| e.context_create.clone(), args, what)?;
        host.settle(vm)?;
        host.headers_phase(vm, ctx, false, chunks.is_empty())?;
        let count = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            host.body_chunk(vm, ctx, false, chunk, i + 1 == count)?;
        }
        host.pump()?;
        host.outcome(vm, ctx)
    }

    /// The current state of a stream.
    pub fn outcome(&mut self, handle: StreamHandle) -> Result<StreamOutcome> {
        let ctx = self.host.stream_ctx(self.vm, handle)?;
        self.host.outcome(self.vm, ctx)
    }

    /// The upstream answers: `proxy_on_response_headers` (with `:status` first) and, if
    /// `body` is not empty, `proxy_on_response_body` with `end_of_stream`. Returns the
    /// response as the filter lets it go downstream. The request headers must have been
    /// forwarded upstream.
    pub fn respond(
        &mut self,
        handle: StreamHandle,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<ResponseOutcome> {
        let (host, vm) = (&mut *self.host, self.vm);
        let ctx = host.stream_ctx(vm, handle)?;
        let stream = host.state(vm).streams.get_mut(&ctx).expect("checked");
        if stream.finished || stream.reset || stream.local_reply.is_some() {
            bail!("stream {ctx} already ended (finished, reset or answered locally)");
        }
        if stream.req.fwd_headers.is_none() {
            bail!("stream {ctx} was not sent upstream: the filter still holds its request");
        }
        if stream.resp.hstate != HeaderState::Pending {
            bail!("stream {ctx} already has a response");
        }
        let mut all = vec![(":status".to_string(), status.to_string())];
        all.extend(owned_headers(headers));
        stream.resp = Flow::new(all);
        host.headers_phase(vm, ctx, true, body.is_empty())?;
        if !body.is_empty() {
            host.body_chunk(vm, ctx, true, body.to_vec(), true)?;
        }
        host.pump()?;
        let stream = host.state(vm).streams.get(&ctx).expect("checked");
        Ok(response_outcome(&stream.resp))
    }

    /// Completes the stream: `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`. A no-op if
    /// it already completed (local replies complete on their own, as in Envoy).
    pub fn finish(&mut self, handle: StreamHandle) -> Result<()> {
        let ctx = self.host.stream_ctx(self.vm, handle)?;
        self.host.end_stream(self.vm, ctx, false)?;
        self.host.pump()
    }

    /// Client disconnect: the stream ends without (further) response, through
    /// `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`; its HTTP calls are cancelled.
    pub fn reset(&mut self, handle: StreamHandle) -> Result<()> {
        let ctx = self.host.stream_ctx(self.vm, handle)?;
        self.host.end_stream(self.vm, ctx, true)?;
        self.host.pump()
    }

    /// Fires `proxy_on_tick` on this VM now (without moving the clock).
    pub fn tick(&mut self) -> Result<()> {
        let (host, vm) = (&mut *self.host, self.vm);
        host.check_vm(vm)?;
        let root = host.state(vm).root_ctx;
        host.invoke(vm, root, |e| e.tick.clone(), root as i32, "proxy_on_tick")?;
        host.settle(vm)?;
        host.pump()
    }

    /// Log lines captured on this VM.
    pub fn logs(&self) -> &[LogEntry] {
        self.host.logs(self.vm)
    }

    /// The tick period the filter set on this VM (ms, 0 = none).
    pub fn tick_period_ms(&self) -> u64 {
        self.host
            .vms
            .get(self.vm)
            .map_or(0, |s| s.store.data().tick_period_ms)
    }
}
