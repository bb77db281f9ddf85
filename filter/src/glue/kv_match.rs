//! `kv_match`: the question to the collector before a decision (which engines'
//! KV caches hold the prompt), sent from the stream with `dispatch_http_call` and
//! its timeout, and the answer read into `crate::kv_match::EngineHeld`. No answer
//! in time, or one that is not the collector's: the tree decides, and the metrics
//! say which.

use std::time::Duration;

use proxy_wasm::types::{BufferType, LogLevel, MapType};

use super::host;
use super::hostcalls;
use super::state::State;
use crate::config::KvMatchConfig;
use crate::kv_match::EngineHeld;
use crate::parse::ApiKind;

/// Asks the collector about a request with `body`, whose shape names the API
/// `shape`; the call's token, or `None`: an API whose prompt the collector does not
/// read, or a call that could not be sent (counted as unanswered).
pub fn ask(state: &State, cfg: &KvMatchConfig, shape: ApiKind, body: &[u8]) -> Option<u32> {
    // The collector reads the prompt as the engine would at that API's path.
    let target = match shape {
        ApiKind::Chat => "/kv/match?path=/v1/chat/completions",
        ApiKind::Completions => "/kv/match?path=/v1/completions",
        _ => return None,
    };
    let headers = vec![
        (":method", "POST"),
        (":path", target),
        (":authority", cfg.cluster.as_str()),
        ("content-type", "application/json"),
    ];
    let timeout = Duration::from_millis(cfg.timeout_ms);
    match hostcalls::dispatch_http_call(&cfg.cluster, headers, Some(body), vec![], timeout) {
        Ok(token) => Some(token),
        Err(e) => {
            state.metrics.kv_match_unanswered.inc();
            host::log(
                LogLevel::Warn,
                &format!(
                    "llm-router: cannot ask cluster {} which engines hold a prompt: {e:?}",
                    cfg.cluster
                ),
            );
            None
        }
    }
}

/// The collector's answer to `ask`'s call: what the engines hold, or `None` (the
/// tree decides). Unanswered: no response, or Envoy's own 5xx (its 504 past the
/// timeout, its 503 without a healthy collector). Refused: the collector's 4xx,
/// or a body that is not its match.
pub fn answer(state: &State, num_headers: usize, body_size: usize) -> Option<EngineHeld> {
    let status = (num_headers > 0)
        .then(|| hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status"))
        .and_then(|s| s.ok().flatten())
        .and_then(|s| s.parse::<u32>().ok());
    let body = || {
        hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default()
    };
    let why = match status {
        Some(200) => match EngineHeld::from_answer(&body()) {
            Ok(held) => return Some(held),
            Err(e) => e.as_str().to_string(),
        },
        None | Some(500..) => {
            state.metrics.kv_match_unanswered.inc();
            return None;
        }
        Some(status) => {
            let body = body();
            let quoted = body.get(..body.len().min(200)).unwrap_or_default();
            format!("status {status}: {}", String::from_utf8_lossy(quoted))
        }
    };
    state.metrics.kv_match_refused.inc();
    host::log(
        LogLevel::Debug,
        &format!("llm-router: the collector's match is not usable ({why}): routing by the tree"),
    );
    None
}
