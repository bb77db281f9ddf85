//! Prefill/decode disaggregation: the body rewrite that lets a prefill and a decode
//! engine meet.
//!
//! The same body goes to both engines. SGLang pairs them by `bootstrap_room` on the
//! prefill engine's bootstrap server (`bootstrap_host:bootstrap_port`), from which
//! the decode engine pulls the KV. A batch gets one room per prompt, and host and
//! port as arrays of the same length, as SMG sends them. Rooms are uniform in
//! `[0, 2^63-1]`, matching SGLang's `random.randint(0, 2**63 - 1)`.
//!
//! Bootstrap fields the client sent are replaced: a client must not choose where a
//! decode engine fetches KV from. Everything else in the body is kept in its order.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

use crate::parse::ApiKind;
use crate::rng::Rng;

pub const BOOTSTRAP_HOST: &str = "bootstrap_host";
pub const BOOTSTRAP_PORT: &str = "bootstrap_port";
pub const BOOTSTRAP_ROOM: &str = "bootstrap_room";

/// Prompts in one request beyond which the rewrite refuses: rooms, hosts and ports
/// are one JSON value each per prompt, and engines cap batches far below this.
pub const MAX_BATCH: usize = 4096;

/// The prefill worker decode engines fetch the KV from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bootstrap<'a> {
    pub host: &'a str,
    pub port: u16,
}

/// The body both engines get, and the rooms in it (one per prompt).
#[derive(Debug, Clone, PartialEq)]
pub struct Rewritten {
    pub body: Vec<u8>,
    pub rooms: Vec<u64>,
}

/// Why a body cannot be sent disaggregated; the client gets a 400 saying so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RewriteError {
    /// Engines take a JSON object; anything else has nowhere to put a room.
    NotJsonObject,
    BatchTooLarge,
}

impl RewriteError {
    pub fn as_str(self) -> &'static str {
        match self {
            RewriteError::NotJsonObject => "body_not_json_object",
            RewriteError::BatchTooLarge => "batch_too_large",
        }
    }
}

/// A room: uniform in `[0, 2^63-1]`.
pub fn room(rng: &mut dyn Rng) -> u64 {
    rng.next_u64() >> 1
}

/// The body's top-level members, each value left as the text the client sent: the
/// rewrite copies values through, so a body of millions of values costs one scan
/// and one copy, never a tree of JSON values (which ran a VM out of memory).
struct Members<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'a> Members<'a> {
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
    }
}

impl<'de> serde::Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut members = Vec::new();
                while let Some(Key(k)) = map.next_key()? {
                    members.push((k, map.next_value()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(V)
    }
}

/// A member name, borrowed from the body unless it had escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        d.deserialize_str(V)
    }
}

/// How many prompts an array of prompts holds, read without building them: `None`
/// for anything but an array whose first item is not a number (an array of numbers
/// is one tokenised prompt).
struct PromptCount(Option<usize>);

impl<'de> serde::Deserialize<'de> for PromptCount {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = PromptCount;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let Some(first) = seq.next_element::<IsNumber>()? else {
                    return Ok(PromptCount(None));
                };
                let mut n = 1usize;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    n = n.saturating_add(1);
                }
                Ok(PromptCount((!first.0).then_some(n)))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_map(map).map(|_| PromptCount(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(PromptCount(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(PromptCount(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(PromptCount(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(PromptCount(None))
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(PromptCount(None))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(PromptCount(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// Whether a value is a number; anything else is skipped without being built.
struct IsNumber(bool);

impl<'de> serde::Deserialize<'de> for IsNumber {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IsNumber;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                Ok(IsNumber(true))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                Ok(IsNumber(true))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                Ok(IsNumber(true))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                Ok(IsNumber(false))
            }
            fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                Ok(IsNumber(false))
            }
            fn visit_unit<E>(self) -> Result<Self::Value, E> {
                Ok(IsNumber(false))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_seq(seq).map(|_| IsNumber(false))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
                IgnoredAny.visit_map(map).map(|_| IsNumber(false))
            }
        }
        d.deserialize_any(V)
    }
}

/// Prompts in the request when it is a batch (`None`: one prompt, scalar fields).
/// Completions batch by a `prompt` array of prompts (strings or token-id arrays; an
/// array of numbers is one tokenised prompt); `/generate` by a `text` or `input_ids`
/// array likewise; chat by `n > 1` (one room per choice, as SMG does).
fn batch_size(kind: Option<ApiKind>, body: &Members) -> Option<usize> {
    let prompts = |key: &str| {
        let raw = body.get(key)?;
        serde_json::from_str::<PromptCount>(raw.get()).ok()?.0
    };
    let chat = || match body
        .get("n")
        .and_then(|raw| serde_json::from_str::<u64>(raw.get()).ok())
    {
        Some(n) if n > 1 => usize::try_from(n).ok(),
        _ => None,
    };
    let completions = || prompts("prompt");
    let generate = || prompts("text").or_else(|| prompts("input_ids"));
    match kind {
        Some(ApiKind::Chat) => chat(),
        Some(ApiKind::Completions) => completions(),
        Some(ApiKind::Generate) => generate(),
        Some(ApiKind::Embeddings) => prompts("input"),
        Some(ApiKind::Responses) => None,
        None if body.get("messages").is_some() => chat(),
        None => completions().or_else(generate),
    }
}

/// Adds the bootstrap fields to `body` (sent to the API `endpoint` names, as
/// `crate::parse` read it), drawing one room per prompt from `rng`. The client's
/// members are copied through as sent, in their order, less its bootstrap fields.
pub fn inject_bootstrap(
    endpoint: Option<ApiKind>,
    body: &[u8],
    target: Bootstrap,
    rng: &mut dyn Rng,
) -> Result<Rewritten, RewriteError> {
    let members: Members = serde_json::from_slice(body).map_err(|_| RewriteError::NotJsonObject)?;
    let batch = batch_size(endpoint, &members);
    if batch.is_some_and(|n| n > MAX_BATCH) {
        return Err(RewriteError::BatchTooLarge);
    }
    let rooms: Vec<u64> = (0..batch.unwrap_or(1)).map(|_| room(rng)).collect();
    let host = serde_json::to_string(target.host).map_err(|_| RewriteError::NotJsonObject)?;
    let port = target.port.to_string();
    let (host, port, room_value) = match batch {
        Some(n) => (
            json_array(std::iter::repeat_n(host.as_str(), n)),
            json_array(std::iter::repeat_n(port.as_str(), n)),
            json_array(rooms.iter().map(|r| r.to_string())),
        ),
        None => (
            host,
            port,
            rooms.first().copied().unwrap_or_default().to_string(),
        ),
    };
    let mut out = Vec::with_capacity(body.len() + host.len() + port.len() + room_value.len() + 64);
    out.push(b'{');
    let bootstrap = [BOOTSTRAP_HOST, BOOTSTRAP_PORT, BOOTSTRAP_ROOM];
    for (key, value) in members
        .0
        .iter()
        .filter(|(k, _)| !bootstrap.contains(&k.as_ref()))
    {
        push_member(&mut out, key, value.get())?;
    }
    for (key, value) in bootstrap.into_iter().zip([host, port, room_value]) {
        push_member(&mut out, key, &value)?;
    }
    out.push(b'}');
    Ok(Rewritten { body: out, rooms })
}

/// `"key":value` (after a comma unless it is the first member).
fn push_member(out: &mut Vec<u8>, key: &str, value: &str) -> Result<(), RewriteError> {
    if out.len() > 1 {
        out.push(b',');
    }
    serde_json::to_writer(&mut *out, key).map_err(|_| RewriteError::NotJsonObject)?;
    out.push(b':');
    out.extend_from_slice(value.as_bytes());
    Ok(())
}

fn json_array<S: AsRef<str>>(items: impl Iterator<Item = S>) -> String {
    let mut s = String::from("[");
    for (i, item) in items.enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push_str(item.as_ref());
    }
    s.push(']');
    s
}

/// Why the prefill copy failed, and what the client gets instead of a decode that
/// would wait for KV until its own timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillFailure {
    /// No response: connection refused or reset, no healthy host.
    Unreachable,
    /// Envoy's timeout for the call (`prefill_timeout_ms`) answered 504.
    TimedOut,
    /// The prefill engine answered with an error status.
    Error(u32),
}

impl PrefillFailure {
    /// The status of the prefill response, `None` when there was none.
    pub fn from_status(status: Option<u32>) -> Option<PrefillFailure> {
        match status {
            None => Some(PrefillFailure::Unreachable),
            Some(200..=299) => None,
            Some(504) => Some(PrefillFailure::TimedOut),
            Some(s) => Some(PrefillFailure::Error(s)),
        }
    }

    /// The status the client gets: the gateway failed to get a good answer upstream.
    pub fn client_status(self) -> u32 {
        match self {
            PrefillFailure::TimedOut => 504,
            PrefillFailure::Unreachable | PrefillFailure::Error(_) => 502,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            PrefillFailure::Unreachable => "prefill_unreachable",
            PrefillFailure::TimedOut => "prefill_timeout",
            PrefillFailure::Error(_) => "prefill_error",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::endpoint_of;
    use crate::rng::SplitMix64;
    use serde_json::Value;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const P: Bootstrap = Bootstrap {
        host: "10.0.0.7",
        port: 8998,
    };

    fn rewrite(path: &str, body: &str) -> (Value, Vec<u64>) {
        let out =
            inject_bootstrap(endpoint_of(path), body.as_bytes(), P, &mut SplitMix64(7)).unwrap();
        (serde_json::from_slice(&out.body).unwrap(), out.rooms)
    }

    #[test]
    fn chat_gets_scalar_fields_and_keeps_everything_else_in_order() {
        let body = r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.7,"stream":true}"#;
        let out =
            inject_bootstrap(Some(ApiKind::Chat), body.as_bytes(), P, &mut SplitMix64(7)).unwrap();
        let text = String::from_utf8(out.body.clone()).unwrap();
        assert!(
            text.starts_with(r#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.7,"stream":true,"bootstrap_host":"10.0.0.7","bootstrap_port":8998,"bootstrap_room":"#),
            "{text}"
        );
        let v: Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(out.rooms.len(), 1);
        assert_eq!(v[BOOTSTRAP_ROOM], out.rooms[0]);
    }

    #[test]
    fn completions_batch_gets_one_room_per_prompt() {
        let (v, rooms) = rewrite(
            "/v1/completions",
            r#"{"prompt":["a","b","c"],"max_tokens":4}"#,
        );
        assert_eq!(rooms.len(), 3);
        assert_eq!(
            v[BOOTSTRAP_HOST],
            serde_json::json!(["10.0.0.7", "10.0.0.7", "10.0.0.7"])
        );
        assert_eq!(v[BOOTSTRAP_PORT], serde_json::json!([8998, 8998, 8998]));
        assert_eq!(v[BOOTSTRAP_ROOM], serde_json::json!(rooms));
        let distinct: std::collections::HashSet<_> = rooms.iter().collect();
        assert_eq!(distinct.len(), 3, "rooms of one batch differ");
    }

    #[test]
    fn token_prompts_batch_by_prompt_not_by_token() {
        let (v, rooms) = rewrite("/v1/completions", r#"{"prompt":[1,2,3]}"#);
        assert_eq!(rooms.len(), 1, "an array of token ids is one prompt");
        assert!(v[BOOTSTRAP_ROOM].is_u64());
        let (v, rooms) = rewrite("/v1/completions", r#"{"prompt":[[1,2],[3]]}"#);
        assert_eq!(rooms.len(), 2);
        assert!(v[BOOTSTRAP_ROOM].is_array());
        let (_, rooms) = rewrite("/generate", r#"{"input_ids":[[1],[2],[3],[4]]}"#);
        assert_eq!(rooms.len(), 4);
        let (_, rooms) = rewrite("/generate", r#"{"text":["x","y"]}"#);
        assert_eq!(rooms.len(), 2);
        let (v, rooms) = rewrite("/generate", r#"{"text":"x"}"#);
        assert_eq!((rooms.len(), v[BOOTSTRAP_PORT].as_u64()), (1, Some(8998)));
    }

    #[test]
    fn chat_with_n_choices_is_a_batch() {
        let (v, rooms) = rewrite("/v1/chat/completions", r#"{"messages":[],"n":3}"#);
        assert_eq!(rooms.len(), 3);
        assert_eq!(v[BOOTSTRAP_HOST].as_array().map(Vec::len), Some(3));
        let (v, _) = rewrite("/v1/chat/completions", r#"{"messages":[],"n":1}"#);
        assert!(v[BOOTSTRAP_HOST].is_string());
    }

    #[test]
    fn unknown_paths_read_the_shape() {
        let (_, rooms) = rewrite("/custom", r#"{"messages":[],"n":2}"#);
        assert_eq!(rooms.len(), 2);
        let (_, rooms) = rewrite("/custom", r#"{"prompt":["a","b"]}"#);
        assert_eq!(rooms.len(), 2);
        let (_, rooms) = rewrite("/custom", r#"{"text":["a","b","c"]}"#);
        assert_eq!(rooms.len(), 3);
    }

    #[test]
    fn non_ascii_text_survives() {
        let body = r#"{"messages":[{"role":"user","content":"缓存命中 🚀 é\u00e9"}]}"#;
        let (v, _) = rewrite("/v1/chat/completions", body);
        assert_eq!(v["messages"][0]["content"], "缓存命中 🚀 éé");
    }

    #[test]
    fn client_bootstrap_fields_are_replaced() {
        let (v, rooms) = rewrite(
            "/v1/completions",
            r#"{"bootstrap_host":"evil","bootstrap_port":1,"bootstrap_room":5,"prompt":"x"}"#,
        );
        assert_eq!(v[BOOTSTRAP_HOST], "10.0.0.7");
        assert_eq!(v[BOOTSTRAP_PORT], 8998);
        assert_eq!(v[BOOTSTRAP_ROOM], rooms[0]);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["prompt", BOOTSTRAP_HOST, BOOTSTRAP_PORT, BOOTSTRAP_ROOM]
        );
    }

    #[test]
    fn members_are_copied_as_sent_and_escaped_bootstrap_names_still_go() {
        let body =
            r#"{ "a\u0062" : 1.50e2 , "bootstrap_\u0072oom" : 5, "prompt" : [ "x" , "y" ] }"#;
        let out = inject_bootstrap(
            Some(ApiKind::Completions),
            body.as_bytes(),
            P,
            &mut SplitMix64(7),
        )
        .unwrap();
        let text = String::from_utf8(out.body).unwrap();
        assert!(
            text.starts_with(
                r#"{"ab":1.50e2,"prompt":[ "x" , "y" ],"bootstrap_host":["10.0.0.7","10.0.0.7"],"#
            ),
            "names re-encoded, values verbatim, the client's room dropped: {text}"
        );
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v[BOOTSTRAP_ROOM], serde_json::json!(out.rooms));
    }

    #[test]
    fn numbers_past_f64_pass_through_as_the_client_wrote_them() {
        let body = r#"{"prompt":"x","temperature":1e6313}"#;
        let out = inject_bootstrap(None, body.as_bytes(), P, &mut SplitMix64(7)).unwrap();
        let text = String::from_utf8(out.body).unwrap();
        assert!(
            text.starts_with(r#"{"prompt":"x","temperature":1e6313,"#),
            "{text}"
        );
    }

    #[test]
    fn duplicate_members_pass_through_and_the_last_decides_the_batch() {
        let (v, rooms) = rewrite(
            "/v1/completions",
            r#"{"prompt":"one","prompt":["a","b"],"bootstrap_port":1,"bootstrap_port":2}"#,
        );
        assert_eq!(rooms.len(), 2, "the engine reads the last `prompt`");
        assert_eq!(v[BOOTSTRAP_PORT], serde_json::json!([8998, 8998]));
    }

    #[test]
    fn a_long_token_prompt_is_one_prompt_and_is_not_rebuilt() {
        let ids = vec!["7"; 200_000].join(",");
        let body = format!(r#"{{"prompt":[{ids}],"max_tokens":1}}"#);
        let out = inject_bootstrap(
            Some(ApiKind::Completions),
            body.as_bytes(),
            P,
            &mut SplitMix64(3),
        )
        .unwrap();
        assert_eq!(out.rooms.len(), 1);
        let end = body.len() - 1;
        assert_eq!(out.body.get(..end), body.as_bytes().get(..end));
    }

    #[test]
    fn bodies_without_an_object_are_refused() {
        for body in ["", "[1,2]", "\"x\"", "{not json", "null"] {
            assert_eq!(
                inject_bootstrap(
                    Some(ApiKind::Completions),
                    body.as_bytes(),
                    P,
                    &mut SplitMix64(1)
                ),
                Err(RewriteError::NotJsonObject),
                "{body:?}"
            );
        }
        let huge = format!(r#"{{"prompt":[{}"x"]}}"#, "\"x\",".repeat(MAX_BATCH));
        assert_eq!(
            inject_bootstrap(
                Some(ApiKind::Completions),
                huge.as_bytes(),
                P,
                &mut SplitMix64(1)
            ),
            Err(RewriteError::BatchTooLarge)
        );
    }

    #[test]
    fn prefill_outcomes() {
        assert_eq!(PrefillFailure::from_status(Some(200)), None);
        assert_eq!(PrefillFailure::from_status(Some(299)), None);
        let cases = [
            (None, 502, "prefill_unreachable"),
            (Some(504), 504, "prefill_timeout"),
            (Some(500), 502, "prefill_error"),
            (Some(503), 502, "prefill_error"),
            (Some(429), 502, "prefill_error"),
            (Some(300), 502, "prefill_error"),
            (Some(199), 502, "prefill_error"),
        ];
        for (status, client, reason) in cases {
            let f = PrefillFailure::from_status(status).unwrap();
            assert_eq!(
                (f.client_status(), f.as_str()),
                (client, reason),
                "{status:?}"
            );
        }
    }

    #[test]
    fn rooms_are_in_range_and_distinct() {
        let mut rng = SplitMix64(42);
        let rooms: Vec<u64> = (0..10_000).map(|_| room(&mut rng)).collect();
        assert!(rooms.iter().all(|&r| r < (1 << 63)));
        let distinct: std::collections::HashSet<_> = rooms.iter().collect();
        assert_eq!(distinct.len(), rooms.len());
        // Uniform over the range: the top bit of the 63 is set about half the time.
        let high = rooms.iter().filter(|&&r| r >= 1 << 62).count();
        assert!((4_500..5_500).contains(&high), "{high}");
        // An all-ones draw maps to the top of the range, never past it.
        struct Max;
        impl Rng for Max {
            fn next_u64(&mut self) -> u64 {
                u64::MAX
            }
        }
        assert_eq!(room(&mut Max), (1 << 63) - 1);
    }
}
