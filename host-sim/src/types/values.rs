//! The values the host hands out and takes in: requests to send, stream and response
//! outcomes, local responses, HTTP calls, log lines, metric values, and the failure
//! policy. Plain data with header lookups; the machinery that fills them lives above.

use super::codes::LogLevel;
use std::collections::BTreeMap;

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
        header_value(&self.headers, name)
    }
}

/// An HTTP call dispatched with `proxy_http_call`, waiting for an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpCall {
    /// Token; answer with [`Host::answer_http_call`](crate::Host::answer_http_call).
    /// Unique across all VMs of a host.
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
    /// Timeout in ms (0: none). On expiry,
    /// [`Host::advance_time`](crate::Host::advance_time) answers it with Envoy's 504
    /// "upstream request timeout".
    pub timeout_ms: u32,
    /// Virtual time of the dispatch.
    pub dispatched_at_ms: u64,
}

impl HttpCall {
    /// First value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header_value(&self.headers, name)
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
    /// Handle for [`VmHandle::respond`](crate::VmHandle::respond),
    /// [`VmHandle::finish`](crate::VmHandle::finish), [`VmHandle::reset`](crate::VmHandle::reset).
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
    /// Request headers the filter read, by name in order (`*`: the whole map): each
    /// found one is a copy into the VM, which costs Envoy a call into the VM's
    /// allocator.
    pub request_header_reads: Vec<String>,
    /// HTTP calls made by this stream that are still pending.
    pub http_calls: Vec<HttpCall>,
    /// Properties set with `proxy_set_property` (path parts joined with '.').
    pub properties: BTreeMap<String, Vec<u8>>,
    /// on_log/on_done/on_delete have run.
    pub finished: bool,
    /// The stream was reset (by [`VmHandle::reset`](crate::VmHandle::reset) or
    /// `proxy_close_stream`).
    pub reset: bool,
}

impl StreamOutcome {
    /// First value of a request header (name in lower case) as the filter left it.
    pub fn header(&self, name: &str) -> Option<&str> {
        header_value(&self.request_headers, name)
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
        header_value(&self.headers, name)
    }
}

pub(crate) fn header_value<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

pub(crate) fn owned_headers(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.to_string()))
        .collect()
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
