//! What the load tool keeps about one request. Kept separate from the HTTP client so the
//! statistics can be computed and tested without any network.

/// Outcome of one replayed request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    /// Line number (1-based) of the request in the workload file, to trace errors back.
    pub line: usize,
    /// HTTP status, absent when no response arrived (connection failure, timeout).
    pub status: Option<u16>,
    /// Milliseconds from sending the request to the last body byte (or to the failure).
    pub latency_ms: f64,
    /// Milliseconds from sending to the first body byte; only recorded for streams,
    /// where it approximates time to first token.
    pub ttfb_ms: Option<f64>,
    /// Engine worker that served the request (body field `worker` or `x-engine-worker`).
    pub worker: Option<String>,
    /// The router's decision label (`x-llm-router-decision` response header).
    pub decision: Option<String>,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (0 when usage lacks the details).
    pub cached_tokens: Option<u64>,
    /// Why this request counts as an error; `None` means success.
    pub error: Option<String>,
}

impl Record {
    /// A request counts as successful only if it got a 2xx with usage; see `error`.
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
}
