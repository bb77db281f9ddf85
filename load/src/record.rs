//! What the load tool keeps about one request. Kept separate from the HTTP client so the
//! statistics can be computed and tested without any network.

/// Outcome of one replayed request.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Record {
    /// Line number (1-based) of the request in the workload file, to trace errors back.
    pub line: usize,
    /// When the request was sent: milliseconds since the run started, and since the
    /// Unix epoch (0 where time is virtual, as in `host-sim replay`), so records line
    /// up with engine and proxy logs.
    pub start_ms: f64,
    pub start_unix_ms: u64,
    /// HTTP status, absent when no response arrived (connection failure, timeout).
    pub status: Option<u16>,
    /// Milliseconds from sending the request to the last body byte (or to the failure).
    pub latency_ms: f64,
    /// Milliseconds from sending to the first body byte; only recorded for streams.
    pub ttfb_ms: Option<f64>,
    /// Streams: milliseconds from sending to the first event carrying a token (time to
    /// first token), and the gaps between later token-carrying reads (inter-token
    /// latency, one sample per read, as `vllm bench serve` counts it).
    pub ttft_ms: Option<f64>,
    pub itl_ms: Vec<f64>,
    /// Engine worker that served the request: the engine's own name for itself (body
    /// field `worker` or `x-engine-worker`), else the router's choice
    /// (`x-llm-router-worker`), which is all a real vLLM or SGLang answer carries.
    pub worker: Option<String>,
    /// The router's decision label (`x-llm-router-decision` response header).
    pub decision: Option<String>,
    /// Why the router chose the worker (`x-llm-router-reason`), and for
    /// `predicted_ttft` its predicted time to first token there
    /// (`x-llm-router-predicted-ttft-ms`): where a run went wrong, which rung sent
    /// the request where it went.
    pub reason: Option<String>,
    pub predicted_ttft_ms: Option<f64>,
    /// `usage.prompt_tokens`.
    pub prompt_tokens: Option<u64>,
    /// `usage.prompt_tokens_details.cached_tokens` (0 when usage lacks the details).
    pub cached_tokens: Option<u64>,
    /// Why this request counts as an error; `None` means success.
    pub error: Option<String>,
}

/// Writes `records` as one JSON object per line (`--records-out`, the demo's
/// `.demo/<run>.jsonl`, `host-sim replay --records-dir`).
pub fn write_jsonl(path: &std::path::Path, records: &[Record]) -> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut out = String::new();
    for r in records {
        out += &serde_json::to_string(r)?;
        out.push('\n');
    }
    std::fs::write(path, out).with_context(|| format!("writing {}", path.display()))
}

impl Record {
    /// Takes the router's decision headers from a response's `header` lookup.
    pub fn read_decision<'a>(&mut self, header: impl Fn(&str) -> Option<&'a str>) {
        use llm_router::support::header_names::{
            DECISION_HEADER, PREDICTED_TTFT_HEADER, REASON_HEADER,
        };
        let text = |name| header(name).map(str::trim).filter(|v| !v.is_empty());
        self.decision = text(DECISION_HEADER).map(str::to_string);
        self.reason = text(REASON_HEADER).map(str::to_string);
        self.predicted_ttft_ms = text(PREDICTED_TTFT_HEADER).and_then(|v| v.parse().ok());
    }

    /// A request counts as successful only if it got a 2xx with usage; see `error`.
    pub fn is_ok(&self) -> bool {
        self.error.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_headers_are_read_trimmed_and_the_prediction_as_a_number() {
        const HEADERS: [(&str, &str); 3] = [
            ("x-llm-router-decision", "cache_hit"),
            ("x-llm-router-reason", " ttft_cache "),
            ("x-llm-router-predicted-ttft-ms", "12.5"),
        ];
        fn lookup(set: &'static [(&str, &str)]) -> impl Fn(&str) -> Option<&'static str> {
            move |name| set.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        }
        let mut r = Record::default();
        r.read_decision(lookup(&HEADERS));
        assert_eq!(r.decision.as_deref(), Some("cache_hit"));
        assert_eq!(r.reason.as_deref(), Some("ttft_cache"));
        assert_eq!(r.predicted_ttft_ms, Some(12.5));
        // A policy without a prediction, a blank reason, a prediction that is no number.
        const OTHER: [(&str, &str); 3] = [
            ("x-llm-router-decision", "cache_miss"),
            ("x-llm-router-reason", "  "),
            ("x-llm-router-predicted-ttft-ms", "soon"),
        ];
        r.read_decision(lookup(&OTHER));
        assert_eq!(r.decision.as_deref(), Some("cache_miss"));
        assert_eq!((r.reason.as_deref(), r.predicted_ttft_ms), (None, None));
        r.read_decision(|_| None);
        assert_eq!(r.decision, None, "no headers: nothing kept from before");
    }
}
