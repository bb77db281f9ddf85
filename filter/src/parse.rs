//! Reading an OpenAI-style (or SGLang `/generate`) request body into what routing
//! needs: the model, the stream flag and the routing text.
//!
//! The routing text is what the prefix tree matches on, so it must grow the way the
//! engine's prompt grows: for chat, every message in order as `role: text\n` (content
//! arrays contribute their text parts, joined by newlines; images and other parts
//! are skipped); for completions, the prompt (a batch routes by its first element);
//! for `/generate`, `text` the same way. A body we cannot read is never dropped: it
//! is routed by load, and the outcome says why.
//!
//! `Parsed` keeps the API the path names (`endpoint`), so later stages (PD's body
//! rewrite) read the body the same way without looking at the path again.

use serde::Deserialize;
use serde_json::Value;

/// Which API shape the body was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    Chat,
    Completions,
    Generate,
}

/// A body that could be routed by its text.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingRequest {
    /// The shape the routing text was read as.
    pub kind: ApiKind,
    /// The API the path names (`None`: an unknown path, where the body's fields
    /// decided `kind`). PD's rewrite reads the body by this, as it always has.
    pub endpoint: Option<ApiKind>,
    /// The model, empty when the body names none.
    pub model: String,
    pub stream: bool,
    pub text: String,
}

/// Why a body gives no routing text. It is still routed (least-load).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unreadable {
    /// No body at all (a GET, or an empty POST).
    EmptyBody,
    /// Not a JSON object.
    NotJson,
    /// JSON, but neither `messages`, `prompt` nor `text` in a usable shape.
    NoRoutingText,
}

impl Unreadable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unreadable::EmptyBody => "empty_body",
            Unreadable::NotJson => "body_not_json",
            Unreadable::NoRoutingText => "no_routing_text",
        }
    }
}

/// What parsing gave: a routing request, or the reason there is none plus whatever
/// model name could still be read (so a model-specific fleet can still be chosen).
#[derive(Debug, Clone, PartialEq)]
pub enum Parsed {
    Routable(RoutingRequest),
    Unroutable {
        reason: Unreadable,
        model: String,
        /// The API the path names, as in `RoutingRequest::endpoint`.
        endpoint: Option<ApiKind>,
    },
}

impl Parsed {
    /// The API the path names (`None`: unknown path).
    pub fn endpoint(&self) -> Option<ApiKind> {
        match self {
            Parsed::Routable(r) => r.endpoint,
            Parsed::Unroutable { endpoint, .. } => *endpoint,
        }
    }

    /// The model the body names (empty: none, or unreadable).
    pub fn model(&self) -> &str {
        match self {
            Parsed::Routable(r) => &r.model,
            Parsed::Unroutable { model, .. } => model,
        }
    }
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    model: Option<Value>,
    #[serde(default)]
    stream: Option<Value>,
    #[serde(default)]
    messages: Option<Value>,
    #[serde(default)]
    prompt: Option<Value>,
    #[serde(default)]
    text: Option<Value>,
}

fn push_content(out: &mut String, content: &Value) {
    match content {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            let mut first = true;
            for part in parts {
                let text = match part {
                    Value::String(s) => Some(s.as_str()),
                    Value::Object(o) => match o.get("type").and_then(Value::as_str) {
                        Some("text") | Some("input_text") | None => {
                            o.get("text").and_then(Value::as_str)
                        }
                        _ => None,
                    },
                    _ => None,
                };
                if let Some(t) = text {
                    if !first {
                        out.push('\n');
                    }
                    out.push_str(t);
                    first = false;
                }
            }
        }
        _ => {}
    }
}

fn chat_text(messages: &Value) -> Option<String> {
    let messages = messages.as_array()?;
    let mut out = String::new();
    for m in messages {
        let Some(obj) = m.as_object() else { continue };
        let role = obj.get("role").and_then(Value::as_str).unwrap_or("");
        out.push_str(role);
        out.push_str(": ");
        if let Some(c) = obj.get("content") {
            push_content(&mut out, c);
        }
        out.push('\n');
    }
    (!messages.is_empty()).then_some(out)
}

/// A prompt string, or a batch's first element (a string, or token ids rendered as
/// text so identical token prompts still share a prefix).
fn prompt_text(prompt: &Value) -> Option<String> {
    match prompt {
        Value::String(s) => Some(s.clone()),
        Value::Array(items) => match items.first()? {
            Value::String(s) => Some(s.clone()),
            Value::Number(_) => Some(token_ids_text(items)),
            Value::Array(ids) => Some(token_ids_text(ids)),
            _ => None,
        },
        _ => None,
    }
}

fn token_ids_text(ids: &[Value]) -> String {
    let mut out = String::new();
    for id in ids {
        if let Some(n) = id.as_u64() {
            out.push_str(&n.to_string());
            out.push(' ');
        }
    }
    out
}

/// The API a path names, by its suffix (query string ignored).
pub fn endpoint_of(path: &str) -> Option<ApiKind> {
    let path = path.split('?').next().unwrap_or(path);
    if path.ends_with("/chat/completions") {
        Some(ApiKind::Chat)
    } else if path.ends_with("/completions") {
        Some(ApiKind::Completions)
    } else if path.ends_with("/generate") {
        Some(ApiKind::Generate)
    } else {
        None
    }
}

/// Parses `body` sent to `path`. The path decides the shape where it is a known
/// endpoint; otherwise the first of `messages`, `prompt`, `text` present is used.
pub fn parse(path: &str, body: &[u8]) -> Parsed {
    let endpoint = endpoint_of(path);
    if body.iter().all(u8::is_ascii_whitespace) {
        return Parsed::Unroutable {
            reason: Unreadable::EmptyBody,
            model: String::new(),
            endpoint,
        };
    }
    // serde would read a struct from a JSON array by position; only objects count.
    let is_object = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let Some(b) = is_object
        .then(|| serde_json::from_slice::<Body>(body).ok())
        .flatten()
    else {
        return Parsed::Unroutable {
            reason: Unreadable::NotJson,
            model: String::new(),
            endpoint,
        };
    };
    let model = match &b.model {
        Some(Value::String(s)) => s.clone(),
        _ => String::new(),
    };
    let stream = matches!(b.stream, Some(Value::Bool(true)));
    let attempt = |kind: ApiKind| -> Option<String> {
        match kind {
            ApiKind::Chat => chat_text(b.messages.as_ref()?),
            ApiKind::Completions => prompt_text(b.prompt.as_ref()?),
            ApiKind::Generate => prompt_text(b.text.as_ref()?),
        }
    };
    let order: &[ApiKind] = match endpoint {
        Some(k) => &[k][..],
        None => &[ApiKind::Chat, ApiKind::Completions, ApiKind::Generate][..],
    };
    for &kind in order {
        if let Some(text) = attempt(kind) {
            return Parsed::Routable(RoutingRequest {
                kind,
                endpoint,
                model,
                stream,
                text,
            });
        }
    }
    Parsed::Unroutable {
        reason: Unreadable::NoRoutingText,
        model,
        endpoint,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routable(path: &str, body: &str) -> RoutingRequest {
        match parse(path, body.as_bytes()) {
            Parsed::Routable(r) => r,
            other => panic!("expected routable, got {other:?}"),
        }
    }

    fn reason(path: &str, body: &[u8]) -> Unreadable {
        match parse(path, body) {
            Parsed::Unroutable { reason, .. } => reason,
            other => panic!("expected unroutable, got {other:?}"),
        }
    }

    #[test]
    fn chat_concatenates_every_message_in_order() {
        let r = routable(
            "/v1/chat/completions",
            r#"{"model":"m","stream":true,"messages":[
                {"role":"system","content":"be brief"},
                {"role":"user","content":"hi"},
                {"role":"assistant","content":"hello"},
                {"role":"user","content":"more"}]}"#,
        );
        assert_eq!(r.kind, ApiKind::Chat);
        assert_eq!(r.model, "m");
        assert!(r.stream);
        assert_eq!(
            r.text,
            "system: be brief\nuser: hi\nassistant: hello\nuser: more\n"
        );
    }

    #[test]
    fn a_later_turn_extends_the_earlier_text() {
        let t1 = routable(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"q1"}]}"#,
        );
        let t2 = routable(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"q1"},{"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]}"#,
        );
        assert!(t2.text.starts_with(&t1.text), "growth keeps the prefix");
    }

    #[test]
    fn content_arrays_keep_text_parts_only() {
        let r = routable(
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":[
                {"type":"text","text":"look at"},
                {"type":"image_url","image_url":{"url":"data:..."}},
                {"type":"text","text":"this"}]},
                {"role":"tool","content":null}]}"#,
        );
        assert_eq!(r.text, "user: look at\nthis\ntool: \n");
    }

    #[test]
    fn completions_prompt_string_and_batch() {
        let r = routable("/v1/completions", r#"{"model":"m","prompt":"once upon"}"#);
        assert_eq!(
            (r.kind, r.text.as_str()),
            (ApiKind::Completions, "once upon")
        );
        let b = routable("/v1/completions", r#"{"prompt":["first","second"]}"#);
        assert_eq!(b.text, "first", "a batch routes by its first prompt");
        let ids = routable("/v1/completions", r#"{"prompt":[1,2,3]}"#);
        assert_eq!(ids.text, "1 2 3 ");
        let id_batch = routable("/v1/completions", r#"{"prompt":[[4,5],[6]]}"#);
        assert_eq!(id_batch.text, "4 5 ");
    }

    #[test]
    fn sglang_generate_text() {
        let r = routable("/generate", r#"{"text":"hello","sampling_params":{}}"#);
        assert_eq!((r.kind, r.text.as_str()), (ApiKind::Generate, "hello"));
    }

    #[test]
    fn unknown_path_guesses_by_field() {
        assert_eq!(
            routable("/other", r#"{"prompt":"p"}"#).kind,
            ApiKind::Completions
        );
        assert_eq!(
            routable("/x?y=1", r#"{"messages":[{"role":"user","content":"c"}]}"#).kind,
            ApiKind::Chat
        );
        assert_eq!(
            routable(
                "/v1/chat/completions?a=b",
                r#"{"messages":[{"role":"u","content":"c"}]}"#
            )
            .kind,
            ApiKind::Chat
        );
    }

    #[test]
    fn the_endpoint_is_what_the_path_names() {
        let chat = r#"{"messages":[{"role":"user","content":"c"}]}"#;
        assert_eq!(
            parse("/v1/chat/completions?a=b", chat.as_bytes()).endpoint(),
            Some(ApiKind::Chat)
        );
        let r = routable("/other", chat);
        assert_eq!(
            (r.kind, r.endpoint),
            (ApiKind::Chat, None),
            "shape, not path"
        );
        assert_eq!(parse("/generate", b"").endpoint(), Some(ApiKind::Generate));
        assert_eq!(
            parse("/v1/completions", b"[").endpoint(),
            Some(ApiKind::Completions)
        );
        assert_eq!(parse("/v1/completions", br#"{"model":"m"}"#).model(), "m");
    }

    #[test]
    fn multibyte_text_is_kept_whole() {
        let r = routable("/v1/completions", r#"{"prompt":"日本語 café 🦀"}"#);
        assert_eq!(r.text, "日本語 café 🦀");
    }

    #[test]
    fn unreadable_bodies_say_why_and_keep_the_model() {
        assert_eq!(reason("/v1/chat/completions", b""), Unreadable::EmptyBody);
        assert_eq!(
            reason("/v1/chat/completions", b"  \n"),
            Unreadable::EmptyBody
        );
        assert_eq!(
            reason("/v1/chat/completions", b"{not json"),
            Unreadable::NotJson
        );
        assert_eq!(
            reason("/v1/chat/completions", b"[1,2]"),
            Unreadable::NotJson
        );
        assert_eq!(
            reason("/v1/chat/completions", &[0xff, 0xfe]),
            Unreadable::NotJson
        );
        assert_eq!(
            parse("/v1/chat/completions", br#"{"model":"m","messages":"hi"}"#),
            Parsed::Unroutable {
                reason: Unreadable::NoRoutingText,
                model: "m".into(),
                endpoint: Some(ApiKind::Chat),
            }
        );
        assert_eq!(
            reason("/v1/chat/completions", br#"{"messages":[]}"#),
            Unreadable::NoRoutingText
        );
        assert_eq!(
            reason("/v1/completions", br#"{"prompt":7}"#),
            Unreadable::NoRoutingText
        );
        assert_eq!(
            reason("/v1/completions", br#"{"prompt":[]}"#),
            Unreadable::NoRoutingText
        );
        assert_eq!(
            reason("/v1/completions", br#"{"model":5,"prompt":{}}"#),
            Unreadable::NoRoutingText
        );
    }

    #[test]
    fn stream_flag_only_when_true() {
        assert!(!routable("/v1/completions", r#"{"prompt":"p","stream":"yes"}"#).stream);
        assert!(!routable("/v1/completions", r#"{"prompt":"p"}"#).stream);
    }
}
