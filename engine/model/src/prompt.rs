//! Flattening request bodies into the single string the prefix cache hashes.
//!
//! Real engines hash token ids after applying a chat template; the mock approximates that with a
//! fixed, documented text template so the router (which must predict cache hits from the raw
//! request) and the engine agree on what a "shared prefix" is.

use serde_json::Value;
use std::fmt;

/// The API shape a request body follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /v1/chat/completions` (`messages`).
    Chat,
    /// `POST /v1/completions` (`prompt`).
    Completions,
    /// SGLang's `POST /generate` (`text`).
    Generate,
}

/// Why a body has no usable prompt; turned into a 400 by the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PromptError(pub String);

impl fmt::Display for PromptError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for PromptError {}

/// Flattens `body` according to the endpoint's shape.
pub fn flatten(endpoint: Endpoint, body: &Value) -> Result<String, PromptError> {
    match endpoint {
        Endpoint::Chat => flatten_chat(body),
        Endpoint::Completions => string_or_first(body, "prompt"),
        Endpoint::Generate => string_or_first(body, "text"),
    }
}

/// Chat: `role + ": " + text + "\n"` per message, in order.
///
/// Text content is either a string or an array of parts whose `{"type":"text"}` entries are
/// joined with `"\n"`; other parts (images, ...) contribute nothing. A `null`/absent content
/// (assistant tool calls) is empty text, so the message still contributes its role line.
pub fn flatten_chat(body: &Value) -> Result<String, PromptError> {
    let messages = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| PromptError("'messages' must be an array".into()))?;
    let mut out = String::new();
    for (i, msg) in messages.iter().enumerate() {
        let obj = msg
            .as_object()
            .ok_or_else(|| PromptError(format!("messages[{i}] must be an object")))?;
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
        out.push_str(role);
        out.push_str(": ");
        match obj.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(s)) => out.push_str(s),
            Some(Value::Array(parts)) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect();
                out.push_str(&texts.join("\n"));
            }
            Some(_) => {
                return Err(PromptError(format!(
                    "messages[{i}].content must be a string or an array of parts"
                )))
            }
        }
        out.push('\n');
    }
    Ok(out)
}

/// `field` as a string, or the first element of an array of strings (batch prompts: the mock
/// serves only the first, which is all the routing tests need).
fn string_or_first(body: &Value, field: &str) -> Result<String, PromptError> {
    match body.get(field) {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(items)) => match items.first() {
            Some(Value::String(s)) => Ok(s.clone()),
            _ => Err(PromptError(format!(
                "'{field}' must be a string or a non-empty array of strings"
            ))),
        },
        Some(_) => Err(PromptError(format!(
            "'{field}' must be a string or an array of strings"
        ))),
        None => Err(PromptError(format!("missing '{field}'"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chat_string_content() {
        let body = json!({"messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi"}
        ]});
        assert_eq!(flatten_chat(&body).unwrap(), "system: be brief\nuser: hi\n");
    }

    #[test]
    fn chat_content_parts_and_null() {
        let body = json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "first"},
                {"type": "image_url", "image_url": {"url": "http://x"}},
                {"type": "text", "text": "second"}
            ]},
            {"role": "assistant", "content": null},
            {"role": "tool"}
        ]});
        assert_eq!(
            flatten(Endpoint::Chat, &body).unwrap(),
            "user: first\nsecond\nassistant: \ntool: \n"
        );
    }

    #[test]
    fn chat_non_ascii_is_kept_verbatim() {
        let body = json!({"messages": [{"role": "user", "content": "héllo 世界 🦀"}]});
        assert_eq!(flatten_chat(&body).unwrap(), "user: héllo 世界 🦀\n");
    }

    #[test]
    fn chat_errors() {
        assert!(flatten_chat(&json!({})).is_err());
        assert!(flatten_chat(&json!({"messages": "x"})).is_err());
        assert!(flatten_chat(&json!({"messages": [1]})).is_err());
        assert!(flatten_chat(&json!({"messages": [{"role": "u", "content": 3}]})).is_err());
        assert_eq!(flatten_chat(&json!({"messages": []})).unwrap(), "");
    }

    #[test]
    fn completions_prompt_shapes() {
        assert_eq!(
            flatten(Endpoint::Completions, &json!({"prompt": "abc"})).unwrap(),
            "abc"
        );
        assert_eq!(
            flatten(Endpoint::Completions, &json!({"prompt": ["ünï", "b"]})).unwrap(),
            "ünï"
        );
        assert!(flatten(Endpoint::Completions, &json!({"prompt": []})).is_err());
        assert!(flatten(Endpoint::Completions, &json!({"prompt": [1, 2]})).is_err());
        assert!(flatten(Endpoint::Completions, &json!({"prompt": 5})).is_err());
        assert!(flatten(Endpoint::Completions, &json!({"text": "x"})).is_err());
    }

    #[test]
    fn generate_text_shapes() {
        assert_eq!(
            flatten(Endpoint::Generate, &json!({"text": "abc"})).unwrap(),
            "abc"
        );
        assert_eq!(
            flatten(Endpoint::Generate, &json!({"text": ["x", "y"]})).unwrap(),
            "x"
        );
        assert!(flatten(Endpoint::Generate, &json!({"prompt": "abc"})).is_err());
    }
}
