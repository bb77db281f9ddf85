//! The workload file: JSONL, one request a line:
//! `{"body": {...openai body...}, "session": "optional id", "path": "/v1/..."}`.
//!
//! Parsing happens up front, before any traffic, so a bad file fails the run as a setup
//! error (non-zero exit) instead of showing up as request errors in the middle.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// Default endpoint for bodies with `messages`.
pub const CHAT_PATH: &str = "/v1/chat/completions";
/// Default endpoint for bodies without `messages` (legacy `prompt` completions).
pub const COMPLETIONS_PATH: &str = "/v1/completions";

/// One line of the workload file as written on disk.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct WorkloadLine {
    /// The OpenAI request body, sent verbatim.
    pub body: Value,
    /// Requests with the same session are replayed strictly in order, one at a time,
    /// like a user who waits for each answer before the next turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Endpoint path; derived from the body when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// A parsed, ready-to-send request.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkItem {
    /// 1-based line number in the file, for error messages and tracing.
    pub line: usize,
    /// Serialized body bytes (serialized once here, not per send).
    pub body: bytes::Bytes,
    pub session: Option<String>,
    pub path: String,
    /// Whether the body asks for SSE streaming (`"stream": true`).
    pub stream: bool,
}

/// Parses workload text. Blank lines are skipped; any other malformed line is an error
/// naming its line number.
pub fn parse_workload(text: &str) -> Result<Vec<WorkItem>> {
    let mut items = Vec::new();
    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let parsed: WorkloadLine = serde_json::from_str(raw)
            .map_err(|e| anyhow!("workload line {line_no}: invalid JSON line: {e}"))?;
        items.push(to_item(line_no, parsed)?);
    }
    Ok(items)
}

/// Reads and parses a workload file.
pub fn load_workload(path: &Path) -> Result<Vec<WorkItem>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading workload {}", path.display()))?;
    parse_workload(&text).with_context(|| format!("parsing workload {}", path.display()))
}

fn to_item(line: usize, parsed: WorkloadLine) -> Result<WorkItem> {
    let Value::Object(map) = &parsed.body else {
        bail!("workload line {line}: \"body\" must be a JSON object");
    };
    let path = match parsed.path {
        Some(p) if p.starts_with('/') => p,
        Some(p) => bail!("workload line {line}: \"path\" must start with '/', got {p:?}"),
        None if map.contains_key("messages") => CHAT_PATH.to_string(),
        None => COMPLETIONS_PATH.to_string(),
    };
    let stream = map.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let body = serde_json::to_vec(&parsed.body)
        .map_err(|e| anyhow!("workload line {line}: cannot serialize body: {e}"))?;
    Ok(WorkItem {
        line,
        body: body.into(),
        session: parsed.session,
        path,
        stream,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_paths_sessions_and_blank_lines() {
        let text = concat!(
            "{\"body\":{\"messages\":[],\"stream\":true},\"session\":\"a\"}\n",
            "\n",
            "   \n",
            "{\"body\":{\"prompt\":\"hi\"}}\n",
            "{\"body\":{\"prompt\":\"hi\"},\"path\":\"/custom\"}\n",
        );
        let items = parse_workload(text).unwrap();
        assert_eq!(items.len(), 3);
        assert_eq!(items[0].line, 1);
        assert_eq!(items[0].path, CHAT_PATH);
        assert!(items[0].stream);
        assert_eq!(items[0].session.as_deref(), Some("a"));
        assert_eq!(items[1].line, 4);
        assert_eq!(items[1].path, COMPLETIONS_PATH);
        assert!(!items[1].stream);
        assert_eq!(items[2].path, "/custom");
    }

    #[test]
    fn malformed_line_names_line_number() {
        let text = "{\"body\":{\"prompt\":\"x\"}}\n\n{not json\n";
        let err = format!("{:#}", parse_workload(text).unwrap_err());
        assert!(err.contains("line 3"), "{err}");
        let err = format!("{:#}", parse_workload("{\"body\":3}").unwrap_err());
        assert!(err.contains("line 1"), "{err}");
        let err = format!("{:#}", parse_workload("{\"nobody\":{}}").unwrap_err());
        assert!(err.contains("line 1"), "{err}");
    }
}
