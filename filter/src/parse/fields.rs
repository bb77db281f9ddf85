//! The chat fields routing reads (`model`, `stream`, `messages`; the prompt-like
//! fields are in `inputs`), read as the JSON streams by: each field builds only
//! what routing keeps (a string, the routing text) and skips everything else without
//! materialising it. A body of millions of tiny values (a content array `[0,0,...]`) then
//! costs its own size in time and next to nothing in memory, where building
//! `serde_json::Value`s for it ran Envoy's 1 GiB Wasm VM out of memory.
//!
//! The readers keep the meaning the fields always had (`mod.rs` documents it): a
//! non-object message ends the reading (`Invalid`), a content part's `type` must be
//! `text`/`input_text` or not a string, the first element of a prompt batch decides
//! its shape, and for duplicate keys the last wins.

use super::json::{Entries, Json, Read, Token};
use super::Invalid;
use std::borrow::Cow;

/// A value routing looks at only if it is a string, `true`, or an unsigned integer.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Leaf<'a> {
    Str(Cow<'a, str>),
    Bool(bool),
    U64(u64),
    /// Any other number (negative, fractional): kept as "a number" for prompts.
    OtherNumber,
    Other,
}

impl<'a> Leaf<'a> {
    pub(super) fn read(json: &mut Json<'a>) -> Read<Leaf<'a>> {
        Ok(match json.token()? {
            Token::Str(s) => Leaf::Str(s),
            Token::Bool(b) => Leaf::Bool(b),
            Token::U64(n) => Leaf::U64(n),
            Token::OtherNumber => Leaf::OtherNumber,
            other => {
                other.drain(json)?;
                Leaf::Other
            }
        })
    }

    pub(super) fn into_text(self) -> Option<Cow<'a, str>> {
        match self {
            Leaf::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Messages the list has room for before it grows.
const MESSAGES_AT_ONCE: usize = 8;

/// `messages` as routing text: every message as `role: text\n` in order; `None`
/// for an empty array. A value that is not an array, or an element that is not an
/// object, is what no engine accepts (`Invalid`): reading stops there, at the first
/// such element, with nothing built for the rest.
pub(super) fn chat_text(json: &mut Json) -> Read<Result<Option<String>, Invalid>> {
    let Token::Array(mut items) = json.token()? else {
        return Ok(Err(Invalid::MessagesNotArray));
    };
    // Room for a conversation of a few turns at once: growing from empty reallocated
    // it twice a request (a message is a few words: two borrowed strings).
    let mut messages = Vec::with_capacity(MESSAGES_AT_ONCE);
    let mut index = 0;
    while items.next(json)? {
        match Message::read_plain(json) {
            Some(m) => messages.push(m),
            None => match Message::read(json)? {
                Some(m) => messages.push(m),
                None => return Ok(Err(Invalid::MessageNotObject(index))),
            },
        }
        index += 1;
    }
    Ok(Ok((index > 0).then(|| Message::lines(&messages))))
}

/// One message read as an object: its role (`""` unless a string) and content text.
/// The strings are borrowed from the body when they have no escapes: the kilobytes
/// of a prompt are copied once, into the routing text.
pub(super) struct Message<'a> {
    role: Cow<'a, str>,
    content: Cow<'a, str>,
}

impl<'a> Message<'a> {
    /// `None` if the value is not an object (read no further than its first token).
    pub(super) fn read(json: &mut Json<'a>) -> Read<Option<Message<'a>>> {
        match json.token()? {
            Token::Object(entries) => Message::read_entries(entries, json).map(Some),
            _ => Ok(None),
        }
    }

    /// A message written the way clients write them, `{"role":"…","content":"…"}`
    /// in either order, both strings free of escapes (`Json::plain_pair`), read in
    /// one pass; `None` (nothing read) for any other shape, which `read` takes and
    /// reads into the same two strings.
    pub(super) fn read_plain(json: &mut Json<'a>) -> Option<Message<'a>> {
        let mut past = *json;
        let [(k1, v1), (k2, v2)] = past.plain_pair()?;
        let (role, content) = match (k1, k2) {
            (b"role", b"content") => (v1, v2),
            (b"content", b"role") => (v2, v1),
            _ => return None,
        };
        *json = past;
        Some(Message {
            role: Cow::Borrowed(role),
            content: Cow::Borrowed(content),
        })
    }

    /// The rest of an object whose `{` has been read.
    pub(super) fn read_entries(mut entries: Entries, json: &mut Json<'a>) -> Read<Message<'a>> {
        let mut m = Message {
            role: Cow::Borrowed(""),
            content: Cow::Borrowed(""),
        };
        while let Some(key) = entries.next(json)? {
            match &*key {
                "role" => m.role = Leaf::read(json)?.into_text().unwrap_or_default(),
                "content" => m.content = content(json)?,
                _ => json.skip()?,
            }
        }
        Ok(m)
    }

    /// The messages as routing text, `role: content\n` each, built in one
    /// allocation of the right size (a prompt's kilobytes are copied once).
    pub(super) fn lines(messages: &[Message]) -> String {
        let len = messages.iter().map(|m| m.role.len() + m.content.len() + 3);
        let mut out = String::with_capacity(len.sum());
        for m in messages {
            out.push_str(&m.role);
            out.push_str(": ");
            out.push_str(&m.content);
            out.push('\n');
        }
        out
    }
}

/// A message's content as text: a string, or an array's text parts joined by `\n`.
fn content<'a>(json: &mut Json<'a>) -> Read<Cow<'a, str>> {
    let mut items = match json.token()? {
        Token::Str(s) => return Ok(s),
        Token::Array(items) => items,
        other => return other.drain(json).map(|()| Cow::Borrowed("")),
    };
    let mut out = String::new();
    let mut first = true;
    while items.next(json)? {
        if let Some(t) = part(json)? {
            if !first {
                out.push('\n');
            }
            out.push_str(&t);
            first = false;
        }
    }
    Ok(Cow::Owned(out))
}

/// One content part's text: a string, or an object's `text` string when its `type`
/// is `text`, `input_text`, absent, or not a string.
fn part<'a>(json: &mut Json<'a>) -> Read<Option<Cow<'a, str>>> {
    let mut entries = match json.token()? {
        Token::Str(s) => return Ok(Some(s)),
        Token::Object(entries) => entries,
        other => return other.drain(json).map(|()| None),
    };
    let mut kind: Option<Leaf> = None;
    let mut text: Option<Leaf> = None;
    while let Some(key) = entries.next(json)? {
        match &*key {
            "type" => kind = Some(Leaf::read(json)?),
            "text" => text = Some(Leaf::read(json)?),
            _ => json.skip()?,
        }
    }
    let is_text = match &kind {
        Some(Leaf::Str(t)) => t == "text" || t == "input_text",
        _ => true,
    };
    Ok(is_text.then(|| text.and_then(Leaf::into_text)).flatten())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_plain_message_is_a_role_and_a_content_in_either_order_or_nothing_read() {
        for (body, want) in [
            (r#"{"role":"user","content":"hi"}"#, Some(("user", "hi"))),
            (r#"{"content":"hi","role":"user"}"#, Some(("user", "hi"))),
            (
                r#" { "role" : "u" , "content" : "日本" } "#,
                Some(("u", "日本")),
            ),
            // Two plain members, but not the message's two: left to `read`.
            (r#"{"role":"user","role":"x"}"#, None),
            (r#"{"content":"x","content":"y"}"#, None),
            (r#"{"role":"user","name":"n"}"#, None),
            (r#"{"type":"text","text":"x"}"#, None),
            // Not two plain members at all.
            (r#"{"role":"user","content":"x","name":"n"}"#, None),
            (r#"{"role":"user","content":["x"]}"#, None),
        ] {
            let mut json = Json::new(body.as_bytes());
            let got = Message::read_plain(&mut json);
            assert_eq!(
                got.as_ref().map(|m| (&*m.role, &*m.content)),
                want,
                "{body}"
            );
            if got.is_none() {
                // Nothing read: the general reader takes the whole message.
                let general = Message::read(&mut json).map(|m| m.is_some());
                assert_eq!(general, Ok(true), "{body}");
            }
        }
    }
}
