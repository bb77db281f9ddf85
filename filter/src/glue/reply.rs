//! Local replies: the filter answers the client itself (a refused request, a
//! collector push, a failed PD prefill). The stream stays paused; Envoy ends it.

use proxy_wasm::types::{Action, LogLevel};

use super::host;
use super::hostcalls;
use crate::request::plan::Refusal;
use crate::support::header_names::REASON_HEADER;

/// A local reply with a JSON body, the reason in `x-llm-router-reason`.
pub fn json(status: u32, reason: &str, body: &str) -> Action {
    let sent = hostcalls::send_http_response(
        status,
        vec![
            (REASON_HEADER, reason),
            ("content-type", "application/json"),
        ],
        Some(body.as_bytes()),
    );
    if let Err(e) = sent {
        host::log(
            LogLevel::Error,
            &format!("llm-router: cannot send {status}: {e:?}"),
        );
    }
    Action::Pause
}

/// A refused request: an OpenAI-style error body.
pub fn refusal(r: Refusal) -> Action {
    refused(r.status(), r.as_str(), r.detail())
}

/// A refusal by its status, reason and detail (as the routing VM answers one).
pub fn refused(status: u32, reason: &str, detail: Option<String>) -> Action {
    let message = match (status, detail) {
        (_, Some(detail)) => detail,
        (400, None) => format!("request cannot be routed: {reason}"),
        (413, None) => {
            format!("request body too large: {reason} (over the router's max_body_bytes)")
        }
        _ => format!("no worker available: {reason}"),
    };
    let kind = match status {
        400 | 413 => "invalid_request_error",
        _ => "service_unavailable",
    };
    let body = serde_json::json!({"error": {"message": message, "type": kind}});
    json(status, reason, &body.to_string())
}
