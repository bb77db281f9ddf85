//! The headers the filter adds to responses (with `decision_headers`, and on its
//! own local replies), and the one a request asks for them with, in one place for
//! the glue and for tools that read them.

/// A request header asking for the decision headers on the response (any value;
/// `decision_headers: "on_request"`, the default).
pub const EXPLAIN_HEADER: &str = "x-llm-router-explain";
/// The worker that served the request (in PD, the decode worker).
pub const WORKER_HEADER: &str = "x-llm-router-worker";
/// The decision label (`cache_hit`, `cache_miss`, ...).
pub const DECISION_HEADER: &str = "x-llm-router-decision";
/// Why the worker was chosen, or why the filter answered itself.
pub const REASON_HEADER: &str = "x-llm-router-reason";
/// `predicted_ttft`: the predicted time to first token on the chosen worker, in ms
/// (in PD, on the prefill worker).
pub const PREDICTED_TTFT_HEADER: &str = "x-llm-router-predicted-ttft-ms";
/// PD: the prefill worker of the pair (`x-llm-router-worker` names the decode one).
pub const PREFILL_WORKER_HEADER: &str = "x-llm-router-prefill-worker";
/// PD: why the decode worker was chosen (`x-llm-router-reason` is the prefill's).
pub const DECODE_REASON_HEADER: &str = "x-llm-router-decode-reason";
