//! Reading an OpenAI-style (or SGLang `/generate`) request body into what routing
//! needs: the model, the stream flag and the routing text.
//!
//! The routing text is what the prefix tree matches on, so it must grow the way the
//! engine's prompt grows: for chat, every message in order as `role: text\n` (content
//! arrays contribute their text parts, joined by newlines; images and other parts
//! are skipped); for completions, the prompt (a batch routes by its first element);
//! for `/generate`, `text` the same way; for embeddings, `input` the same way; for
//! `/v1/responses`, `instructions` as a system message then `input` (a string, or
//! message items read as chat messages). A body we cannot read is never dropped: it
//! is routed by load, and the outcome says why.
//!
//! One shape is what no engine accepts: `messages` given (not `null`) but not an
//! array, or an element of it that is not an object (`Invalid`). Reading stops at
//! the first such element, whatever the body's size, and `request::plan` refuses it
//! when the path names chat. A completion `prompt` and `/generate`'s `text` are not
//! judged: engines validate them with coercions of their own (pydantic's lax mode
//! takes `[1, "2"]` and `[true]` as token ids), so a wrong-looking one is still
//! routed and the engine answers it.
//!
//! `Parsed` keeps the API the path names (`endpoint`), so later stages (PD's body
//! rewrite) read the body the same way without looking at the path again.

mod fields;
mod inputs;
mod json;

use crate::kv_match::EngineHeld;
use fields::Leaf;
use inputs::InputText;
use json::{Json, Malformed, Read, Token};
use std::borrow::Cow;

/// Which API shape the body was read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    Chat,
    Completions,
    Generate,
    Embeddings,
    Responses,
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
    /// What the engines' KV caches hold of the prompt, when the collector said
    /// (`kv_match`): the glue sets it from the answer, parsing never does.
    pub held: Option<EngineHeld>,
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
    /// `messages` is not an array of objects: read no further. Refused when the
    /// path names chat (`request::plan`); routed by load on any other path, where
    /// `messages` is not what the engine reads.
    Invalid(Invalid),
}

/// A `messages` no chat engine accepts: the element and the rule it breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Invalid {
    /// `messages` is given (not `null`) but is not an array.
    MessagesNotArray,
    /// `messages[i]` is not an object.
    MessageNotObject(usize),
}

impl Invalid {
    /// The rule, naming the element, as the client reads it.
    pub fn message(self) -> String {
        match self {
            Invalid::MessagesNotArray => "messages must be an array".to_string(),
            Invalid::MessageNotObject(i) => format!("messages[{i}] must be an object"),
        }
    }
}

impl Unreadable {
    pub fn as_str(self) -> &'static str {
        match self {
            Unreadable::EmptyBody => "empty_body",
            Unreadable::NotJson => "body_not_json",
            Unreadable::NoRoutingText => "no_routing_text",
            Unreadable::Invalid(_) => "messages_invalid",
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

/// The fields routing reads; the rest of the body is skipped unread. A field the
/// body gives twice makes it malformed, and `null` counts as absent (as serde's
/// derived struct read them).
#[derive(Default)]
struct Body<'a> {
    model: Option<Leaf<'a>>,
    stream: Option<Leaf<'a>>,
    messages: Option<Option<String>>,
    prompt: Option<Option<String>>,
    text: Option<Option<String>>,
    input: Option<InputText>,
    instructions: Option<Leaf<'a>>,
    /// `messages` broke a rule: the body was read up to that element only.
    invalid: Option<Invalid>,
}

impl<'a> Body<'a> {
    fn read(bytes: &'a [u8]) -> Read<Body<'a>> {
        let mut json = Json::new(bytes);
        let Token::Object(mut entries) = json.token()? else {
            return Err(Malformed);
        };
        let mut b = Body::default();
        // Which fields were given, `null` or not: a second one is refused.
        let mut seen = [false; 7];
        while let Some(key) = entries.next(&mut json)? {
            let field = match &*key {
                "model" => 0,
                "stream" => 1,
                "messages" => 2,
                "prompt" => 3,
                "text" => 4,
                "input" => 5,
                "instructions" => 6,
                _ => {
                    json.skip()?;
                    continue;
                }
            };
            if std::mem::replace(&mut seen[field], true) {
                return Err(Malformed);
            }
            if json.null()? {
                continue;
            }
            let j = &mut json;
            match field {
                0 => b.model = Some(Leaf::read(j)?),
                1 => b.stream = Some(Leaf::read(j)?),
                2 => match fields::chat_text(j)? {
                    Ok(text) => b.messages = Some(text),
                    Err(invalid) => {
                        b.invalid = Some(invalid);
                        return Ok(b);
                    }
                },
                3 => b.prompt = Some(inputs::prompt_text(j)?),
                4 => b.text = Some(inputs::prompt_text(j)?),
                5 => b.input = Some(inputs::input_text(j)?),
                _ => b.instructions = Some(Leaf::read(j)?),
            }
        }
        json.end()?;
        Ok(b)
    }
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
    } else if path.ends_with("/embeddings") {
        Some(ApiKind::Embeddings)
    } else if path.ends_with("/responses") {
        Some(ApiKind::Responses)
    } else {
        None
    }
}

/// Parses `body` sent to `path`. The path decides the shape where it is a known
/// endpoint; otherwise the first of `messages`, `prompt`, `text` present is used.
pub fn parse(path: &str, body: &[u8]) -> Parsed {
    read(body).parsed(Some(path))
}

/// A body's routing fields, read before the path is known: a body whose shape
/// alone names its API (`Reading::shape`) is routed without asking Envoy for the
/// path, a copy into the VM that costs about 8k Envoy instructions a request
/// (`benches/overhead --callgrind` counts it).
pub struct Reading<'a>(Result<Body<'a>, Unreadable>);

/// Reads `body`'s routing fields (`Reading::parsed` turns them into a `Parsed`).
pub fn read(body: &[u8]) -> Reading<'_> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Reading(Err(Unreadable::EmptyBody));
    }
    Reading(Body::read(body).map_err(|_| Unreadable::NotJson))
}

impl Reading<'_> {
    /// The API the body's shape names by itself: exactly one of `messages`,
    /// `prompt` and `text`, giving a routing text, and no `input` (embeddings and
    /// responses share it). Parsed without a path, such a body routes as it does
    /// sent to that API's path or to an unknown one; only a path naming another API
    /// would differ, and the engine refuses that request either way.
    pub fn shape(&self) -> Option<ApiKind> {
        let Ok(b) = &self.0 else {
            return None;
        };
        // Read only in part: the path decides whether it is refused.
        if b.input.is_some() || b.invalid.is_some() {
            return None;
        }
        let fields = [
            (ApiKind::Chat, &b.messages),
            (ApiKind::Completions, &b.prompt),
            (ApiKind::Generate, &b.text),
        ];
        let mut given = fields.into_iter().filter(|(_, f)| f.is_some());
        let (kind, text) = given.next()?;
        let alone = given.next().is_none();
        (alone && text.as_ref().is_some_and(Option::is_some)).then_some(kind)
    }

    /// What routing reads from the body sent to `path` (`None`: not read, so the
    /// body's fields decide, as for an unknown path).
    pub fn parsed(self, path: Option<&str>) -> Parsed {
        let endpoint = path.and_then(endpoint_of);
        let b = match self.0 {
            Ok(b) => b,
            Err(reason) => {
                return Parsed::Unroutable {
                    reason,
                    model: String::new(),
                    endpoint,
                }
            }
        };
        let model = b
            .model
            .and_then(Leaf::into_text)
            .map(Cow::into_owned)
            .unwrap_or_default();
        if let Some(invalid) = b.invalid {
            return Parsed::Unroutable {
                reason: Unreadable::Invalid(invalid),
                model,
                endpoint,
            };
        }
        let stream = b.stream == Some(Leaf::Bool(true));
        let (mut chat, mut prompt, mut text) =
            (b.messages.flatten(), b.prompt.flatten(), b.text.flatten());
        let mut input = b.input.map(|i| (i.prompt, i.items));
        let instructions = b.instructions.and_then(Leaf::into_text);
        let mut attempt = |kind: ApiKind| -> Option<String> {
            match kind {
                ApiKind::Chat => chat.take(),
                ApiKind::Completions => prompt.take(),
                ApiKind::Generate => text.take(),
                ApiKind::Embeddings => input.take()?.0,
                ApiKind::Responses => {
                    let (as_prompt, items) = input.take()?;
                    let body = items.or_else(|| as_prompt.map(|p| format!("user: {p}\n")))?;
                    Some(match &instructions {
                        Some(i) => format!("system: {i}\n{body}"),
                        None => body,
                    })
                }
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
                    held: None,
                });
            }
        }
        Parsed::Unroutable {
            reason: Unreadable::NoRoutingText,
            model,
            endpoint,
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Chat requests for other modules' tests.
    use super::{parse, Parsed};

    /// A chat body for model `m`: one user message a turn.
    pub fn chat_body(turns: &[&str]) -> String {
        let msgs: Vec<String> = turns
            .iter()
            .map(|t| format!(r#"{{"role":"user","content":"{t}"}}"#))
            .collect();
        format!(r#"{{"model":"m","messages":[{}]}}"#, msgs.join(","))
    }

    /// [`chat_body`] as the router reads it.
    pub fn chat(turns: &[&str]) -> Parsed {
        parse("/v1/chat/completions", chat_body(turns).as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::{Rng, SplitMix64};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The Value-based reader this module replaced, kept as the oracle the streaming
    /// readers must agree with on every body.
    mod reference {
        use super::super::{endpoint_of, ApiKind, Invalid, Parsed, RoutingRequest, Unreadable};
        use serde::Deserialize;
        use serde_json::Value;
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

        pub fn parse(path: &str, body: &[u8]) -> Parsed {
            let endpoint = endpoint_of(path);
            if body.iter().all(u8::is_ascii_whitespace) {
                return Parsed::Unroutable {
                    reason: Unreadable::EmptyBody,
                    model: String::new(),
                    endpoint,
                };
            }
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
            // `messages` given but not an array of objects: the first element
            // that is not one.
            let invalid = match &b.messages {
                None | Some(Value::Null) => None,
                Some(Value::Array(items)) => items
                    .iter()
                    .position(|m| !m.is_object())
                    .map(Invalid::MessageNotObject),
                Some(_) => Some(Invalid::MessagesNotArray),
            };
            if let Some(invalid) = invalid {
                return Parsed::Unroutable {
                    reason: Unreadable::Invalid(invalid),
                    model,
                    endpoint,
                };
            }
            let stream = matches!(b.stream, Some(Value::Bool(true)));
            let attempt = |kind: ApiKind| -> Option<String> {
                match kind {
                    ApiKind::Chat => chat_text(b.messages.as_ref()?),
                    ApiKind::Completions => prompt_text(b.prompt.as_ref()?),
                    ApiKind::Generate => prompt_text(b.text.as_ref()?),
                    ApiKind::Embeddings | ApiKind::Responses => None,
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
                        held: None,
                    });
                }
            }
            Parsed::Unroutable {
                reason: Unreadable::NoRoutingText,
                model,
                endpoint,
            }
        }
    }

    /// Random JSON bodies built from the shapes routing cares about (and junk), so
    /// every branch of the readers meets odd types, duplicates and nesting.
    fn random_body(rng: &mut SplitMix64) -> String {
        fn pick<'a>(rng: &mut SplitMix64, items: &[&'a str]) -> &'a str {
            items[rng.below(items.len())]
        }
        fn scalar(rng: &mut SplitMix64) -> String {
            pick(
                rng,
                &[
                    "0",
                    "7",
                    "-3",
                    "1.5",
                    "1e300",
                    "18446744073709551615",
                    "-0",
                    "true",
                    "false",
                    "null",
                    "\"t\"",
                    "\"text\"",
                    "\"input_text\"",
                    "\"日本\"",
                    "\"a\\\"b\"",
                    "{}",
                    "[]",
                    "[1,[2]]",
                    "{\"text\":\"x\"}",
                ],
            )
            .to_string()
        }
        fn list(rng: &mut SplitMix64, item: fn(&mut SplitMix64) -> String) -> String {
            let n = rng.below(4);
            let items: Vec<String> = (0..n).map(|_| item(rng)).collect();
            format!("[{}]", items.join(","))
        }
        fn part(rng: &mut SplitMix64) -> String {
            match rng.below(4) {
                0 => scalar(rng),
                1 => format!("{{\"type\":{},\"text\":{}}}", scalar(rng), scalar(rng)),
                2 => format!(
                    "{{\"text\":{},\"type\":{},\"text\":{}}}",
                    scalar(rng),
                    scalar(rng),
                    scalar(rng)
                ),
                _ => format!("{{\"text\":\"p{}\"}}", rng.below(9)),
            }
        }
        fn content(rng: &mut SplitMix64) -> String {
            match rng.below(3) {
                0 => scalar(rng),
                1 => list(rng, part),
                _ => format!("\"c{}\"", rng.below(9)),
            }
        }
        fn message(rng: &mut SplitMix64) -> String {
            match rng.below(6) {
                // The shapes `Message::read_plain` takes when both are plain strings.
                4 => format!("{{\"role\":{},\"content\":{}}}", scalar(rng), content(rng)),
                5 => format!(
                    "{{ \"content\" : {} ,\n\"role\":{} }}",
                    content(rng),
                    scalar(rng)
                ),
                0 => scalar(rng),
                1 => format!("{{\"content\":{},\"role\":{}}}", content(rng), scalar(rng)),
                2 => format!(
                    "{{\"role\":\"user\",\"content\":{},\"content\":{}}}",
                    content(rng),
                    content(rng)
                ),
                _ => format!(
                    "{{\"role\":\"r{}\",\"content\":{},\"name\":[1,{{}}]}}",
                    rng.below(3),
                    content(rng)
                ),
            }
        }
        fn prompt(rng: &mut SplitMix64) -> String {
            match rng.below(4) {
                0 => scalar(rng),
                1 => list(rng, scalar),
                2 => list(rng, |r| list(r, scalar)),
                _ => format!("[{},\"x\",3]", scalar(rng)),
            }
        }
        let mut fields: Vec<String> = Vec::new();
        for (key, value) in [
            ("model", scalar as fn(&mut SplitMix64) -> String),
            ("stream", scalar),
            // One `messages` at most: past an invalid one the readers look no
            // further, so a duplicate after it is not seen (the unit tests pin it).
            ("messages", |r: &mut SplitMix64| match r.below(2) {
                0 => list(r, message),
                _ => scalar(r),
            }),
            ("prompt", prompt),
            ("text", prompt),
            ("extra", |r: &mut SplitMix64| list(r, message)),
        ] {
            if rng.below(2) == 0 {
                fields.push(format!("\"{key}\":{}", value(rng)));
            }
        }
        format!("{{{}}}", fields.join(","))
    }

    #[test]
    fn the_streaming_readers_agree_with_the_value_reader_on_random_bodies() {
        let mut rng = SplitMix64(0x5eed);
        let (mut routable, mut invalid) = (0, 0);
        for i in 0..20_000 {
            let body = random_body(&mut rng);
            for path in ["/v1/chat/completions", "/v1/completions", "/generate", "/x"] {
                let got = parse(path, body.as_bytes());
                let want = reference::parse(path, body.as_bytes());
                assert_eq!(got, want, "case {i} on {path}: {body}");
                routable += usize::from(matches!(got, Parsed::Routable(_)));
                invalid += usize::from(matches!(
                    got,
                    Parsed::Unroutable {
                        reason: Unreadable::Invalid(_),
                        ..
                    }
                ));
            }
        }
        assert!(
            routable > 10_000,
            "the bodies exercise routable shapes: {routable}"
        );
        assert!(invalid > 1_000, "and invalid messages: {invalid}");
    }

    /// `parsed` with `endpoint` as a path naming it would set it.
    fn naming(parsed: Parsed, named: Option<ApiKind>) -> Parsed {
        match parsed {
            Parsed::Routable(r) => Parsed::Routable(RoutingRequest {
                endpoint: named,
                ..r
            }),
            Parsed::Unroutable { reason, model, .. } => Parsed::Unroutable {
                reason,
                model,
                endpoint: named,
            },
        }
    }

    #[test]
    fn a_body_whose_shape_names_its_api_parses_without_its_path_as_with_it() {
        let mut rng = SplitMix64(0x5a9e);
        let mut shaped = [0usize; 3];
        for i in 0..20_000 {
            let mut body = random_body(&mut rng);
            if rng.below(4) == 0 {
                let field = if body == "{}" {
                    r#""input":"i""#
                } else {
                    r#""input":"i","#
                };
                body.insert_str(1, field);
            }
            let Some(kind) = read(body.as_bytes()).shape() else {
                continue;
            };
            let unread = read(body.as_bytes()).parsed(None);
            assert!(
                matches!(&unread, Parsed::Routable(r) if r.kind == kind),
                "case {i}: {body} reads as {kind:?}, got {unread:?}"
            );
            shaped[kind as usize] += 1;
            for path in [
                "/v1/chat/completions",
                "/v1/completions",
                "/generate",
                "/v1/embeddings",
                "/v1/responses",
                "/x",
            ] {
                let named = endpoint_of(path);
                if named.is_none_or(|k| k == kind) {
                    assert_eq!(
                        parse(path, body.as_bytes()),
                        naming(unread.clone(), named),
                        "case {i} on {path}: {body}"
                    );
                }
            }
        }
        assert!(
            shaped.iter().all(|&n| n > 500),
            "every shape is exercised: {shaped:?}"
        );
    }

    #[test]
    fn only_one_routing_field_and_no_input_name_the_api() {
        let shape = |body: &str| read(body.as_bytes()).shape();
        let chat = r#"{"model":"m","messages":[{"role":"user","content":"c"}]}"#;
        assert_eq!(shape(chat), Some(ApiKind::Chat));
        assert_eq!(
            shape(r#"{"prompt":"p","stream":true}"#),
            Some(ApiKind::Completions)
        );
        assert_eq!(shape(r#"{"text":"t"}"#), Some(ApiKind::Generate));
        assert_eq!(
            shape(r#"{"prompt":null,"messages":[{"role":"u","content":"c"}]}"#),
            Some(ApiKind::Chat),
            "null is absent"
        );
        for open in [
            r#"{"messages":[{"role":"u","content":"c"}],"prompt":"p"}"#,
            r#"{"prompt":"p","text":"t"}"#,
            // The Responses API's `text` is its output format, beside `input`.
            r#"{"input":"i","text":{"format":{"type":"text"}}}"#,
            r#"{"input":"i"}"#,
            r#"{"prompt":"p","input":"i"}"#,
            r#"{"prompt":{"not":"a prompt"}}"#,
            r#"{"model":"m"}"#,
            "",
            "[1]",
            "{",
        ] {
            assert_eq!(shape(open), None, "{open}");
        }
    }

    #[test]
    fn a_number_out_of_range_in_a_skipped_value_no_longer_hides_the_prompt() {
        // The Value reader refused the whole body (`1e400` is no f64); skipping does
        // not convert numbers, so the prompt it never needed still routes.
        let body = r#"{"prompt":["p",1e400]}"#;
        assert_eq!(
            reference::parse("/v1/completions", body.as_bytes()),
            Parsed::Unroutable {
                reason: Unreadable::NotJson,
                model: String::new(),
                endpoint: Some(ApiKind::Completions)
            }
        );
        assert_eq!(routable("/v1/completions", body).text, "p");
    }

    #[test]
    fn millions_of_tiny_values_cost_their_size_not_values() {
        // 2M numbers: the Value reader would build 2M Values; these readers keep none.
        let mut body = String::from(r#"{"model":"m","messages":[{"role":"user","content":["#);
        body.push_str(&"0,".repeat(2_000_000));
        body.push_str(r#""last"]}]}"#);
        let r = routable("/v1/chat/completions", &body);
        assert_eq!((r.model.as_str(), r.text.as_str()), ("m", "user: last\n"));
    }

    #[test]
    fn messages_not_an_array_of_objects_stop_the_reading_at_the_first_bad_element() {
        let invalid = |body: &[u8]| match parse("/v1/chat/completions", body) {
            Parsed::Unroutable {
                reason: Unreadable::Invalid(i),
                model,
                ..
            } => (i, model),
            other => panic!("expected invalid, got {other:?}"),
        };
        // Refused at its first element at any size: what follows is never read,
        // not even to see that it is JSON.
        for n in [1, 1000, 2_000_000] {
            let mut body = br#"{"model":"m","messages":["#.to_vec();
            body.extend_from_slice(&b"0,".repeat(n));
            assert_eq!(
                invalid(&body),
                (Invalid::MessageNotObject(0), "m".into()),
                "{n} numbers"
            );
        }
        for (body, want) in [
            (
                r#"{"messages":[{"role":"u","content":"c"},{},"s"],"model":"m"}"#,
                Invalid::MessageNotObject(2),
            ),
            (
                r#"{"messages":[{"role":"u","content":"c"},null]}"#,
                Invalid::MessageNotObject(1),
            ),
            (
                r#"{"messages":[[{"role":"u"}]]}"#,
                Invalid::MessageNotObject(0),
            ),
            (r#"{"messages":[true]}"#, Invalid::MessageNotObject(0)),
            (r#"{"messages":"hi"}"#, Invalid::MessagesNotArray),
            (r#"{"messages":7}"#, Invalid::MessagesNotArray),
            (r#"{"messages":{}}"#, Invalid::MessagesNotArray),
            (r#"{"messages":false}"#, Invalid::MessagesNotArray),
            // The first `messages` decides; a second is never reached.
            (
                r#"{"messages":[1],"messages":[{"role":"u","content":"c"}]}"#,
                Invalid::MessageNotObject(0),
            ),
        ] {
            assert_eq!(invalid(body.as_bytes()).0, want, "{body}");
        }
        assert_eq!(
            Invalid::MessageNotObject(3).message(),
            "messages[3] must be an object"
        );
        assert_eq!(
            Invalid::MessagesNotArray.message(),
            "messages must be an array"
        );
        assert_eq!(
            Unreadable::Invalid(Invalid::MessagesNotArray).as_str(),
            "messages_invalid"
        );
        // Valid shapes and absent ones are not invalid.
        for body in [
            r#"{"messages":null}"#,
            r#"{"messages":[]}"#,
            r#"{"messages":[{}]}"#,
            r#"{"messages":[{"role":"u","content":"c"}],"prompt":[{}],"text":7}"#,
        ] {
            assert!(
                !matches!(
                    parse("/v1/chat/completions", body.as_bytes()),
                    Parsed::Unroutable {
                        reason: Unreadable::Invalid(_),
                        ..
                    }
                ),
                "{body}"
            );
        }
        // Read in part, the body names no API by its shape: the path decides.
        for body in [r#"{"prompt":"p","messages":[0]}"#, r#"{"messages":"x"}"#] {
            assert_eq!(read(body.as_bytes()).shape(), None, "{body}");
            assert!(matches!(
                parse("/v1/completions", body.as_bytes()),
                Parsed::Unroutable {
                    reason: Unreadable::Invalid(_),
                    endpoint: Some(ApiKind::Completions),
                    ..
                }
            ));
        }
    }

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
    fn embeddings_route_by_input_and_responses_by_instructions_and_items() {
        let e = routable(
            "/v1/embeddings",
            r#"{"model":"e","input":["first doc","second"]}"#,
        );
        assert_eq!(
            (e.kind, e.text.as_str()),
            (ApiKind::Embeddings, "first doc")
        );
        let ids = routable("/v1/embeddings", r#"{"input":[[5,6],[7]]}"#);
        assert_eq!(ids.text, "5 6 ");
        let r = routable(
            "/v1/responses",
            r#"{"model":"m","instructions":"be brief","input":[
                {"role":"user","content":[{"type":"input_text","text":"hi"}]},
                {"type":"message","role":"assistant","content":"hello"},
                {"role":"user","content":"more"}]}"#,
        );
        assert_eq!(r.kind, ApiKind::Responses);
        assert_eq!(
            r.text, "system: be brief\nuser: hi\nassistant: hello\nuser: more\n",
            "items read as chat messages, instructions first"
        );
        let s = routable("/v1/responses", r#"{"input":"just a question"}"#);
        assert_eq!(s.text, "user: just a question\n");
        let later = routable(
            "/v1/responses",
            r#"{"instructions":"be brief","input":[{"role":"user","content":"hi"},{"role":"assistant","content":"a"},{"role":"user","content":"q2"}]}"#,
        );
        assert!(
            later.text.starts_with("system: be brief\nuser: hi\n"),
            "turns extend the prefix"
        );
        assert_eq!(
            reason("/v1/embeddings", br#"{"input":7}"#),
            Unreadable::NoRoutingText
        );
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
            parse("/v1/chat/completions", br#"{"model":"m","messages":null}"#),
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
