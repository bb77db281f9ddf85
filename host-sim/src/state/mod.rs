//! Layer 2, host state: what lives in a VM's wasmtime `Store` ([`HostState`]: contexts,
//! streams, logs, random generator, WASI stdio buffers) and what the VMs of one host
//! share ([`Shared`]). Only plain types below it; the hostcalls above read and change it
//! through `Caller::data_mut`, never through globals.

mod shared;
mod stream;

pub(crate) use shared::{lock, Config, Queue, Shared, DEFAULT_MAX_MEMORY_BYTES};
pub(crate) use stream::{CallResponse, Deferred, Flow, HeaderState, StreamState};

use crate::types::codes::{self, LogLevel, Status};
use crate::types::rng::Rng;
use crate::types::values::{HttpCall, LogEntry, LogSource};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use wasmtime::{Memory, TypedFunc};

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
    /// The memory cap, as wasmtime's resource limiter.
    pub limits: wasmtime::StoreLimits,
}

/// VM `vm`'s random seed in its `generation` (0, then one more per reload).
fn vm_seed(seed: u64, vm: usize, generation: u32) -> u64 {
    seed.wrapping_mul(0x100_0000_01B3)
        .wrapping_add(vm as u64 + 1)
        .wrapping_add(u64::from(generation).wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

impl HostState {
    /// A VM started afresh draws randomness of its own, as Envoy's does, not its
    /// predecessor's (still the same from run to run).
    pub fn reseed(&mut self, generation: u32) {
        self.rng = Rng::new(vm_seed(self.cfg.seed, self.vm, generation));
    }

    pub fn new(vm: usize, cfg: Arc<Config>, shared: Arc<Mutex<Shared>>) -> Self {
        let seed = vm_seed(cfg.seed, vm, 0);
        Self {
            vm,
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
            limits: wasmtime::StoreLimitsBuilder::new()
                .memory_size(cfg.max_memory_bytes)
                .build(),
            cfg,
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
        use codes::map::*;
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
            codes::map::HTTP_REQUEST_HEADERS => false,
            codes::map::HTTP_RESPONSE_HEADERS => true,
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
