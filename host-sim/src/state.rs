//! Host state: [`Shared`] (one per [`crate::Host`], shared by every VM through an
//! `Arc<Mutex<..>>`: clock, shared data, queues, metrics, pending HTTP calls) and
//! [`HostState`] (the data of one VM's wasmtime `Store`: contexts, streams, logs, RNG...).

use crate::abi::{self, LogLevel, Status};
use crate::fault::Faults;
use crate::{HttpCall, LocalResponse, LogEntry, LogSource};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use wasmtime::{Memory, TypedFunc};

/// Immutable configuration common to all VMs of a host.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub plugin_config: Vec<u8>,
    pub vm_config: Vec<u8>,
    pub plugin_name: String,
    pub root_id: String,
    pub vm_id: String,
    pub clusters: Vec<String>,
    pub log_level: LogLevel,
    pub allow_on_headers_stop_iteration: bool,
    pub seed: u64,
    pub properties: Vec<(String, Vec<u8>)>,
    pub failure_policy: crate::FailurePolicy,
}

/// A metric value as Envoy's stats store keeps it (shared by all VMs).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricValue {
    /// Monotonic counter.
    Counter(u64),
    /// Gauge.
    Gauge(u64),
    /// All values recorded into a histogram, in order.
    Histogram(Vec<u64>),
}

pub(crate) struct Queue {
    pub vm: usize,
    pub context_id: u32,
    pub items: VecDeque<Vec<u8>>,
}

/// State shared by all VMs of one host.
pub(crate) struct Shared {
    pub now_ns: u64,
    pub start_ns: u64,
    pub data: HashMap<String, (Vec<u8>, u32)>,
    pub next_cas: u32,
    pub queue_names: HashMap<(String, String), u32>,
    pub queues: HashMap<u32, Queue>,
    pub next_queue_token: u32,
    /// `(vm, root context, queue token)` notifications not yet delivered.
    pub queue_ready: VecDeque<(usize, u32, u32)>,
    pub metrics: BTreeMap<String, MetricValue>,
    pub http_calls: BTreeMap<u32, HttpCall>,
    pub next_http_token: u32,
    pub clear_route_cache_total: u64,
    pub faults: Faults,
}

impl Shared {
    pub fn new(start_ms: u64, seed: u64) -> Self {
        let start_ns = start_ms.saturating_mul(1_000_000);
        Self {
            now_ns: start_ns,
            start_ns,
            data: HashMap::new(),
            next_cas: 1,
            queue_names: HashMap::new(),
            queues: HashMap::new(),
            next_queue_token: 1,
            queue_ready: VecDeque::new(),
            metrics: BTreeMap::new(),
            http_calls: BTreeMap::new(),
            next_http_token: 1,
            clear_route_cache_total: 0,
            faults: Faults::new(seed),
        }
    }

    /// Envoy's `nextCas()`: never 0.
    pub fn next_cas(&mut self) -> u32 {
        let cas = self.next_cas;
        self.next_cas = self.next_cas.wrapping_add(1).max(1);
        cas
    }

    /// Envoy's `SharedData::set`.
    pub fn set_data(&mut self, key: &str, value: Vec<u8>, cas: u32) -> Status {
        if let Some((_, current)) = self.data.get(key) {
            if cas != 0 && cas != *current {
                return Status::CasMismatch;
            }
        }
        let next = self.next_cas();
        self.data.insert(key.to_string(), (value, next));
        Status::Ok
    }
}

/// Locks the shared state, ignoring poisoning (a panic elsewhere must not cascade).
pub(crate) fn lock(shared: &Arc<Mutex<Shared>>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where a header map or body stands in Envoy's filter chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderState {
    /// Headers not delivered yet.
    Pending,
    /// `StopIteration` (only with `allow_on_headers_stop_iteration`): body still delivered.
    Stopped,
    /// `StopAllIterationAndWatermark`: body held by Envoy until the filter continues.
    StopAll,
    /// Passed on to the next filter (upstream / downstream).
    Forwarded,
}

/// One direction (request or response) of an HTTP stream.
#[derive(Debug, Clone)]
pub(crate) struct Flow {
    pub headers: Vec<(String, String)>,
    /// Envoy's `request_headers_` / `response_headers_` pointer is set.
    pub headers_live: bool,
    pub hstate: HeaderState,
    /// `end_stream` came with the headers (no body).
    pub headers_eos: bool,
    /// The body buffer the filter sees (current chunk, or the accumulated buffer).
    pub body: Vec<u8>,
    /// Envoy's `*_body_buffer_` pointer is set.
    pub body_live: bool,
    /// The last body callback returned `StopIterationAndBuffer`.
    pub buffering: bool,
    /// The filter paused on the final chunk.
    pub stalled_eos: bool,
    /// Data Envoy holds back while headers are `StopAll`.
    pub held: Vec<u8>,
    pub held_any: bool,
    pub held_eos: bool,
    pub fwd_headers: Option<Vec<(String, String)>>,
    pub fwd_body: Vec<u8>,
    pub fwd_eos: bool,
}

impl Flow {
    pub fn new(headers: Vec<(String, String)>) -> Self {
        Self {
            headers,
            headers_live: false,
            hstate: HeaderState::Pending,
            headers_eos: false,
            body: Vec::new(),
            body_live: false,
            buffering: false,
            stalled_eos: false,
            held: Vec::new(),
            held_any: false,
            held_eos: false,
            fwd_headers: None,
            fwd_body: Vec::new(),
            fwd_eos: false,
        }
    }
}

/// One HTTP stream context.
#[derive(Debug, Clone)]
pub(crate) struct StreamState {
    pub req: Flow,
    pub resp: Flow,
    pub log_phase: bool,
    pub local_reply: Option<LocalResponse>,
    pub properties: HashMap<Vec<u8>, Vec<u8>>,
    pub clear_route_cache: u32,
    pub foreign_calls: Vec<String>,
    pub reset: bool,
    pub finished: bool,
    pub start_ns: u64,
}

impl StreamState {
    pub fn new(headers: Vec<(String, String)>, start_ns: u64) -> Self {
        Self {
            req: Flow::new(headers),
            resp: Flow::new(Vec::new()),
            log_phase: false,
            local_reply: None,
            properties: HashMap::new(),
            clear_route_cache: 0,
            foreign_calls: Vec::new(),
            reset: false,
            finished: false,
            start_ns,
        }
    }

    pub fn flow(&mut self, response: bool) -> &mut Flow {
        if response {
            &mut self.resp
        } else {
            &mut self.req
        }
    }
}

/// Actions Envoy runs after the current VM call returns (`addAfterVmCallAction`).
#[derive(Debug, Clone)]
pub(crate) enum Deferred {
    Continue { ctx: u32, response: bool },
    LocalReply { ctx: u32, reply: LocalResponse },
    Close { ctx: u32 },
}

/// The response of an HTTP call while `proxy_on_http_call_response` runs.
pub(crate) struct CallResponse {
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Deterministic SplitMix64 generator behind WASI `random_get`.
pub(crate) struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let bytes = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&bytes[..chunk.len()]);
        }
    }
}

/// The data of one VM's `Store`: everything Envoy keeps per `Wasm` instance.
pub(crate) struct HostState {
    pub vm: usize,
    pub cfg: Arc<Config>,
    pub shared: Arc<Mutex<Shared>>,
    pub memory: Option<Memory>,
    pub alloc: Option<TypedFunc<i32, i32>>,
    pub root_ctx: u32,
    pub next_ctx: u32,
    /// The context of the callback being run.
    pub current_ctx: u32,
    /// `proxy_set_effective_context` target (defaults to `current_ctx`).
    pub effective_ctx: u32,
    pub in_configure: bool,
    pub streams: BTreeMap<u32, StreamState>,
    pub deferred: VecDeque<Deferred>,
    /// Set by `proxy_send_local_response`: the running callback's result becomes "stop".
    pub stop_next_iteration: bool,
    pub call_response: Option<CallResponse>,
    pub status: (u32, Vec<u8>),
    pub metric_ids: HashMap<u32, String>,
    pub next_metric_id: [u32; 3],
    pub tick_period_ms: u64,
    pub next_tick_ns: Option<u64>,
    pub logs: Vec<LogEntry>,
    pub rng: Rng,
    pub root_properties: HashMap<Vec<u8>, Vec<u8>>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl HostState {
    pub fn new(vm: usize, cfg: Arc<Config>, shared: Arc<Mutex<Shared>>) -> Self {
        let seed = cfg
            .seed
            .wrapping_mul(0x100_0000_01B3)
            .wrapping_add(vm as u64 + 1);
        Self {
            vm,
            cfg,
            shared,
            memory: None,
            alloc: None,
            root_ctx: 1,
            next_ctx: 2,
            current_ctx: 0,
            effective_ctx: 0,
            in_configure: false,
            streams: BTreeMap::new(),
            deferred: VecDeque::new(),
            stop_next_iteration: false,
            call_response: None,
            status: (0, Vec::new()),
            metric_ids: HashMap::new(),
            next_metric_id: [0, 1, 2],
            tick_period_ms: 0,
            next_tick_ns: None,
            logs: Vec::new(),
            rng: Rng::new(seed),
            root_properties: HashMap::new(),
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    pub fn now_ns(&self) -> u64 {
        lock(&self.shared).now_ns
    }

    pub fn log(&mut self, level: LogLevel, source: LogSource, message: String) {
        let time_ms = self.now_ns() / 1_000_000;
        self.logs.push(LogEntry {
            vm: self.vm,
            context_id: self.effective_ctx,
            level,
            source,
            message,
            time_ms,
        });
    }

    /// Line-buffers WASI stdout/stderr into log entries.
    pub fn write_stdio(&mut self, fd: i32, data: &[u8]) {
        let (buf, level, source) = if fd == 1 {
            (&mut self.stdout, LogLevel::Info, LogSource::Stdout)
        } else {
            (&mut self.stderr, LogLevel::Error, LogSource::Stderr)
        };
        buf.extend_from_slice(data);
        let mut lines = Vec::new();
        while let Some(pos) = buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = buf.drain(..=pos).collect();
            lines.push(String::from_utf8_lossy(&line[..line.len() - 1]).into_owned());
        }
        for line in lines {
            self.log(level, source, line);
        }
    }

    /// Flushes partial stdout/stderr lines (after a trap, so panics are visible).
    pub fn flush_stdio(&mut self) {
        for fd in [1, 2] {
            let buf = if fd == 1 { &self.stdout } else { &self.stderr };
            if !buf.is_empty() {
                self.write_stdio(fd, b"\n");
            }
        }
    }

    /// The stream behind the effective context, if it is a live stream.
    pub fn stream(&mut self) -> Option<&mut StreamState> {
        let ctx = self.effective_ctx;
        self.streams.get_mut(&ctx).filter(|s| !s.finished)
    }

    /// Envoy's `getConstMap`: the header map readable now, if any.
    pub fn map_for_read(&mut self, map_type: i32) -> Result<Vec<(String, String)>, Status> {
        use abi::map::*;
        match map_type {
            HTTP_CALL_RESPONSE_HEADERS => self
                .call_response
                .as_ref()
                .map(|r| r.headers.clone())
                .ok_or(Status::BadArgument),
            HTTP_CALL_RESPONSE_TRAILERS => self
                .call_response
                .as_ref()
                .map(|_| Vec::new())
                .ok_or(Status::BadArgument),
            HTTP_REQUEST_HEADERS | HTTP_RESPONSE_HEADERS => {
                let response = map_type == HTTP_RESPONSE_HEADERS;
                let Some(stream) = self.stream() else {
                    return Err(Status::BadArgument);
                };
                let log_phase = stream.log_phase;
                let flow = stream.flow(response);
                if log_phase {
                    let started = flow.hstate != HeaderState::Pending;
                    return if started {
                        Ok(flow.headers.clone())
                    } else {
                        Err(Status::NotFound)
                    };
                }
                if flow.headers_live {
                    Ok(flow.headers.clone())
                } else {
                    Err(Status::BadArgument)
                }
            }
            HTTP_REQUEST_TRAILERS | HTTP_RESPONSE_TRAILERS => {
                let log_phase = self.stream().is_some_and(|s| s.log_phase);
                Err(if log_phase {
                    Status::NotFound
                } else {
                    Status::BadArgument
                })
            }
            GRPC_RECEIVE_INITIAL_METADATA | GRPC_RECEIVE_TRAILING_METADATA => {
                Err(Status::BadArgument)
            }
            _ => Err(Status::BadArgument),
        }
    }

    /// Envoy's `getMap`: the header map writable now, if any.
    pub fn map_for_write(&mut self, map_type: i32) -> Option<&mut Vec<(String, String)>> {
        let response = match map_type {
            abi::map::HTTP_REQUEST_HEADERS => false,
            abi::map::HTTP_RESPONSE_HEADERS => true,
            _ => return None,
        };
        let stream = self.stream()?;
        if stream.log_phase {
            return None;
        }
        let flow = stream.flow(response);
        flow.headers_live.then_some(&mut flow.headers)
    }

    /// The HTTP body buffer of the effective stream, when Envoy exposes it.
    pub fn body_mut(&mut self, response: bool) -> Option<&mut Vec<u8>> {
        let flow = self.stream()?.flow(response);
        flow.body_live.then_some(&mut flow.body)
    }

    /// Records an HTTP call and returns its token.
    pub fn push_http_call(&mut self, mut call: HttpCall) -> u32 {
        let mut shared = lock(&self.shared);
        let token = shared.next_http_token;
        shared.next_http_token = shared.next_http_token.wrapping_add(1).max(1);
        call.token = token;
        call.dispatched_at_ms = shared.now_ns / 1_000_000;
        shared.http_calls.insert(token, call);
        token
    }
}
