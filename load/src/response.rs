//! Turns a response body into the facts the report needs: usage and worker.
//!
//! Everything here reads untrusted network data, so nothing panics: malformed input
//! becomes an error string that is counted and shown in the report.

use serde_json::Value;

/// Token usage as reported by an OpenAI-compatible server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`; 0 when the details are absent, as
    /// servers omit them when nothing was cached or caching stats are off.
    pub cached_tokens: u64,
}

/// What a response body told us.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BodyFacts {
    pub worker: Option<String>,
    pub usage: Option<Usage>,
}

/// A body that does not count as a successful completion. The worker is still kept when
/// the body named one, so per-worker counts show where failing traffic went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BodyError {
    pub reason: String,
    pub worker: Option<String>,
}

impl BodyError {
    fn new(reason: String, worker: Option<String>) -> Self {
        Self { reason, worker }
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.reason)
    }
}

/// Reads `usage` from a response object (a whole body or one stream chunk).
pub fn usage_of(value: &Value) -> Option<Usage> {
    let usage = value.get("usage")?;
    let prompt_tokens = usage.get("prompt_tokens")?.as_u64()?;
    let cached_tokens = usage
        .get("prompt_tokens_details")
        .and_then(|d| d.get("cached_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some(Usage {
        prompt_tokens,
        cached_tokens,
    })
}

/// Reads the engine's `worker` field, accepting a string or a number.
pub fn worker_of(value: &Value) -> Option<String> {
    match value.get("worker")? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Whether a stream chunk carries generated text: chat (`delta.content`) or
/// completions (`text`) in any choice. The final usage-only chunk carries none.
fn carries_text(value: &Value) -> bool {
    let Some(choices) = value.get("choices").and_then(Value::as_array) else {
        return false;
    };
    choices.iter().any(|c| {
        let text = c
            .get("delta")
            .and_then(|d| d.get("content"))
            .or_else(|| c.get("text"));
        text.and_then(Value::as_str).is_some_and(|t| !t.is_empty())
    })
}

/// Short description of an `error` object in a body, for error reasons.
fn error_message_of(value: &Value) -> Option<String> {
    let err = value.get("error")?;
    Some(match err.get("message").and_then(Value::as_str) {
        Some(m) => m.to_string(),
        None => err.to_string(),
    })
}

/// Parses a non-streaming JSON body. Missing usage is an error: without it the run
/// cannot say anything about caching, and a 2xx without usage usually means the router
/// or engine answered something other than a completion.
pub fn parse_json_body(body: &[u8]) -> Result<BodyFacts, BodyError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        BodyError::new(
            format!("response is not JSON ({e}): {}", snippet(body)),
            None,
        )
    })?;
    let worker = worker_of(&value);
    let usage = usage_of(&value);
    if usage.is_none() {
        let reason = match error_message_of(&value) {
            Some(m) => format!("response without usage; error: {m}"),
            None => format!("response without usage: {}", snippet(body)),
        };
        return Err(BodyError::new(reason, worker));
    }
    Ok(BodyFacts { worker, usage })
}

/// Incremental parser for an SSE (`text/event-stream`) body: feed it body chunks as they
/// arrive (events may be split anywhere, even inside a line) and call [`SseParser::finish`]
/// at the end. Usage and worker come from the chunk that carries `usage` (the final
/// chunk before `data: [DONE]` with `stream_options.include_usage`).
#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of the current, not yet terminated line.
    partial: Vec<u8>,
    /// Number of `data:` events seen, `[DONE]` included.
    pub events: usize,
    /// Whether `data: [DONE]` was seen.
    pub done: bool,
    /// Events that carried generated text (a choice with non-empty `delta.content`
    /// or `text`), for time to first token and inter-token latency.
    pub token_events: usize,
    usage: Option<Usage>,
    usage_worker: Option<String>,
    any_worker: Option<String>,
    error: Option<String>,
}

impl SseParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one chunk of the body.
    pub fn push(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(pos) = rest.iter().position(|&b| b == b'\n') {
            self.partial.extend_from_slice(&rest[..pos]);
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
            rest = &rest[pos + 1..];
        }
        self.partial.extend_from_slice(rest);
    }

    /// Handles one complete line (without its `\n`).
    fn line(&mut self, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            // Comments (`:`), `event:`, `id:`, blank separators: nothing to record.
            return;
        };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        self.events += 1;
        if data.trim_ascii() == b"[DONE]" {
            self.done = true;
            return;
        }
        let value: Value = match serde_json::from_slice(data) {
            Ok(v) => v,
            Err(e) => {
                self.error
                    .get_or_insert_with(|| format!("invalid SSE data ({e}): {}", snippet(data)));
                return;
            }
        };
        if let Some(w) = worker_of(&value) {
            self.any_worker = Some(w);
        }
        if carries_text(&value) {
            self.token_events += 1;
        }
        if let Some(u) = usage_of(&value) {
            self.usage = Some(u);
            self.usage_worker = worker_of(&value);
        } else if let Some(m) = error_message_of(&value) {
            self.error
                .get_or_insert_with(|| format!("stream error event: {m}"));
        }
    }

    /// Ends the stream: flushes a last unterminated line and returns the facts, or an
    /// error when no chunk carried usage or an event was malformed.
    pub fn finish(mut self) -> Result<BodyFacts, BodyError> {
        if !self.partial.is_empty() {
            let line = std::mem::take(&mut self.partial);
            self.line(&line);
        }
        let worker = self.usage_worker.or(self.any_worker);
        if let Some(e) = self.error {
            return Err(BodyError::new(e, worker));
        }
        match self.usage {
            Some(usage) => Ok(BodyFacts {
                worker,
                usage: Some(usage),
            }),
            None => Err(BodyError::new(
                format!(
                    "stream without usage ({} events, [DONE] {})",
                    self.events,
                    if self.done { "seen" } else { "missing" }
                ),
                worker,
            )),
        }
    }
}

/// First bytes of a body, lossily decoded, for error messages.
pub fn snippet(body: &[u8]) -> String {
    const MAX: usize = 120;
    let text = String::from_utf8_lossy(&body[..body.len().min(MAX)]);
    let mut s: String = text.chars().filter(|c| !c.is_control()).collect();
    if body.len() > MAX {
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}],\"worker\":\"w1\"}\n\n",
        ": keep-alive comment\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n",
        "data: {\"choices\":[],\"worker\":\"w2\",\"usage\":{\"prompt_tokens\":120,",
        "\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":96}}}\n\n",
        "data: [DONE]\n\n",
    );

    #[test]
    fn json_body_with_usage_and_worker() {
        let body = br#"{"worker":"w3","usage":{"prompt_tokens":10,"prompt_tokens_details":{"cached_tokens":8}}}"#;
        let facts = parse_json_body(body).unwrap();
        assert_eq!(facts.worker.as_deref(), Some("w3"));
        assert_eq!(
            facts.usage,
            Some(Usage {
                prompt_tokens: 10,
                cached_tokens: 8
            })
        );
        // Details absent: cached = 0, still a success.
        let facts = parse_json_body(br#"{"usage":{"prompt_tokens":5}}"#).unwrap();
        assert_eq!(
            facts.usage,
            Some(Usage {
                prompt_tokens: 5,
                cached_tokens: 0
            })
        );
        assert_eq!(facts.worker, None);
    }

    #[test]
    fn json_body_missing_usage_is_error() {
        assert!(parse_json_body(br#"{"worker":"w0","choices":[]}"#).is_err());
        assert!(parse_json_body(br#"{"usage":{"completion_tokens":3}}"#).is_err());
        let e = parse_json_body(br#"{"error":{"message":"boom"}}"#).unwrap_err();
        assert!(e.reason.contains("boom"), "{e}");
        // The worker is kept even though the response is an error.
        let e = parse_json_body(br#"{"worker":"w5"}"#).unwrap_err();
        assert_eq!(e.worker.as_deref(), Some("w5"));
        assert!(parse_json_body(b"not json").is_err());
        assert!(parse_json_body(b"").is_err());
    }

    #[test]
    fn sse_usage_in_final_chunk() {
        let mut p = SseParser::new();
        p.push(STREAM.as_bytes());
        assert!(p.done);
        assert_eq!(p.events, 4);
        assert_eq!(
            p.token_events, 2,
            "two text chunks; usage and [DONE] carry none"
        );
        let facts = p.finish().unwrap();
        assert_eq!(
            facts.usage,
            Some(Usage {
                prompt_tokens: 120,
                cached_tokens: 96
            })
        );
        // Worker from the usage chunk wins over earlier chunks.
        assert_eq!(facts.worker.as_deref(), Some("w2"));
    }

    #[test]
    fn sse_split_across_reads_at_every_byte() {
        let bytes = STREAM.replace("\n", "\r\n").into_bytes();
        for split in 0..bytes.len() {
            let mut p = SseParser::new();
            p.push(&bytes[..split]);
            p.push(&bytes[split..]);
            assert!(p.done, "split at {split}");
            let facts = p.finish().unwrap();
            assert_eq!(facts.usage.unwrap().cached_tokens, 96, "split at {split}");
        }
        // One byte at a time.
        let mut p = SseParser::new();
        for b in STREAM.as_bytes() {
            p.push(std::slice::from_ref(b));
        }
        assert_eq!(p.finish().unwrap().usage.unwrap().prompt_tokens, 120);
    }

    #[test]
    fn sse_without_usage_or_done() {
        let mut p = SseParser::new();
        p.push(b"data: {\"choices\":[],\"worker\":\"w0\"}\n\ndata: [DONE]\n\n");
        assert!(p.done);
        let e = p.finish().unwrap_err();
        assert!(e.reason.contains("without usage"), "{e}");
        assert_eq!(e.worker.as_deref(), Some("w0"));

        // Usage chunk with no trailing newline and no [DONE] still counts.
        let mut p = SseParser::new();
        p.push(b"data: {\"usage\":{\"prompt_tokens\":3}}");
        assert!(!p.done);
        let facts = p.finish().unwrap();
        assert_eq!(facts.usage.unwrap().prompt_tokens, 3);

        let mut p = SseParser::new();
        p.push(b"data: {oops\n\n");
        p.push(b"data: {\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]\n\n");
        assert!(p.finish().unwrap_err().reason.contains("invalid SSE"));
    }
}
