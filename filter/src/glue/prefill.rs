//! PD's prefill leg: the rewritten body replaces the client's (with a fixed
//! `content-length`, which Envoy leaves as the client sent it) and the same body goes
//! to the prefill worker with `dispatch_http_call`, alongside the main request to the
//! decode worker. If the prefill fails, the client gets an error at once; Envoy then
//! resets the decode request, which would otherwise wait for KV that never comes.

use std::time::Duration;

use proxy_wasm::types::{BufferType, LogLevel, MapType};

use super::bookkeeping::{self, Held};
use super::host::{self, request_header};
use super::hostcalls;
use super::state::State;
use crate::config::{Config, WorkerConfig};
use crate::decision::Decision;
use crate::policy::predicted_ttft::WorkHold;
use crate::request::pd::PrefillFailure;
use crate::request::plan::Refusal;
use crate::support::header_names::{PREFILL_WORKER_HEADER, REASON_HEADER, WORKER_HEADER};

/// Prefill error bodies quoted back to the client, at most this many bytes.
const PREFILL_ERROR_QUOTE_BYTES: usize = 512;

/// The prefill copy in flight.
pub struct Leg {
    pub decision: Decision,
    pub held: Held,
    /// The `dispatch_http_call` token its answer comes back with.
    pub token: u32,
    /// `predicted_ttft`: the prefill booked on the prefill worker.
    pub work: Option<WorkHold>,
}

/// Headers of the prefill copy: the client's, minus hop-by-hop, length and routing
/// headers (Envoy sets the length of the call's body itself).
fn prefill_headers(cfg: &Config) -> Vec<(String, String)> {
    let skip = |name: &str| {
        name.starts_with(':')
            || name.starts_with("x-envoy-")
            || name == cfg.cluster_header
            || name == cfg.endpoint_header
            || matches!(
                name,
                "content-length"
                    | "transfer-encoding"
                    | "connection"
                    | "keep-alive"
                    | "upgrade"
                    | "te"
                    | "expect"
                    | "proxy-connection"
            )
    };
    hostcalls::get_map(MapType::HttpRequestHeaders)
        .unwrap_or_default()
        .into_iter()
        .filter(|(name, _)| !skip(name))
        .collect()
}

/// Replaces the buffered body (`old_len` bytes) with `body` and dispatches the same
/// body to `prefill`. Returns the call's token.
pub fn send(
    cfg: &Config,
    prefill: &WorkerConfig,
    path: &str,
    old_len: usize,
    body: &[u8],
) -> Result<u32, Refusal> {
    if let Err(e) = hostcalls::set_buffer(BufferType::HttpRequestBody, 0, old_len, body) {
        host::log(
            LogLevel::Error,
            &format!("llm-router: cannot rewrite the body for PD: {e:?}"),
        );
        return Err(Refusal::BodyRewriteFailed);
    }
    let had_length = hostcalls::get_map_value(MapType::HttpRequestHeaders, "content-length")
        .ok()
        .flatten()
        .is_some();
    if had_length {
        let len = body.len().to_string();
        if let Err(e) =
            hostcalls::set_map_value(MapType::HttpRequestHeaders, "content-length", Some(&len))
        {
            host::log(
                LogLevel::Error,
                &format!("llm-router: cannot fix content-length: {e:?}"),
            );
            return Err(Refusal::BodyRewriteFailed);
        }
    }
    let authority = request_header(":authority");
    let extra = prefill_headers(cfg);
    let mut headers: Vec<(&str, &str)> = vec![
        (":method", "POST"),
        (":path", path),
        (":authority", authority.as_str()),
    ];
    headers.extend(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let timeout = Duration::from_millis(cfg.prefill_timeout_ms);
    hostcalls::dispatch_http_call(prefill.cluster(), headers, Some(body), vec![], timeout).map_err(
        |e| {
            host::log(
                LogLevel::Error,
                &format!(
                    "llm-router: cannot send the prefill copy to cluster {}: {e:?}",
                    prefill.cluster()
                ),
            );
            Refusal::PrefillDispatchFailed
        },
    )
}

/// The prefill copy answered (or failed): releases its count; on failure, unless
/// the decode already answered (`response_started`), answers the client and sets
/// `replied` (before the reply goes out, so the response callbacks see it).
pub fn answered(
    state: &State,
    leg: &mut Leg,
    decode: &Decision,
    num_headers: usize,
    body_size: usize,
    response_started: bool,
    replied: &mut bool,
) {
    let status = (num_headers > 0)
        .then(|| {
            hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
                .ok()
                .flatten()
                .and_then(|s| s.parse::<u32>().ok())
        })
        .flatten();
    // The prefill copy's answer is its whole life: first byte and end at once.
    leg.held.first_byte(state);
    leg.held.release(state);
    bookkeeping::first_byte(state, &mut leg.work);
    bookkeeping::end_work(state, &mut leg.work);
    let Some(failure) = PrefillFailure::from_status(status) else {
        return;
    };
    state.metrics.pd_prefill_failures.inc();
    let cfg = state.router.config();
    let name = |d: &Decision| {
        cfg.workers
            .get(d.worker as usize)
            .map(|w| w.name.clone())
            .unwrap_or_default()
    };
    let (prefill, decode) = (name(&leg.decision), name(decode));
    let quoted = hostcalls::get_buffer(
        BufferType::HttpCallResponseBody,
        0,
        body_size.min(PREFILL_ERROR_QUOTE_BYTES),
    )
    .ok()
    .flatten()
    .map(|b| String::from_utf8_lossy(&b).into_owned())
    .unwrap_or_default();
    let status_text = status.map_or("no response".to_string(), |s| format!("HTTP {s}"));
    host::log(
        LogLevel::Warn,
        &format!(
            "llm-router: prefill worker {prefill} failed ({status_text}, {}); decode worker {decode} abandoned",
            failure.as_str()
        ),
    );
    if response_started {
        // The decode already answered; nothing left to save.
        return;
    }
    *replied = true;
    let body = serde_json::json!({"error": {
        "message": format!("prefill worker {prefill} failed: {status_text} {quoted}").trim_end().to_string(),
        "type": failure.as_str(),
    }});
    let sent = hostcalls::send_http_response(
        failure.client_status(),
        vec![
            (REASON_HEADER, failure.as_str()),
            (PREFILL_WORKER_HEADER, prefill.as_str()),
            (WORKER_HEADER, decode.as_str()),
            ("content-type", "application/json"),
        ],
        Some(body.to_string().as_bytes()),
    );
    if let Err(e) = sent {
        host::log(
            LogLevel::Error,
            &format!("llm-router: cannot answer a failed prefill: {e:?}"),
        );
    }
}
