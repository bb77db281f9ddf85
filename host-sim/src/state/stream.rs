//! One HTTP stream as Envoy's filter manager sees it: per direction a [`Flow`] (headers,
//! body buffer, what Envoy holds back and what it already passed on), the stream's
//! properties and foreign calls, and the actions a hostcall defers until the guest call
//! returns. The rules that move these are in `vm::stream`; the hostcalls only read and
//! edit what Envoy exposes at the moment.

use crate::types::values::LocalResponse;
use std::collections::HashMap;

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
    pub request_header_reads: Vec<String>,
    pub reset: bool,
    pub finished: bool,
    pub start_ns: u64,
    /// Envoy's stream info as `response.flags` and `response.code_details` give it:
    /// `via_upstream` once the upstream answered, the router's details when it
    /// failed (see `VmHandle::fail_upstream`).
    pub response_flags: u64,
    pub code_details: String,
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
            request_header_reads: Vec::new(),
            reset: false,
            finished: false,
            start_ns,
            response_flags: 0,
            code_details: String::new(),
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
