//! The chat fields routing reads (`model`, `stream`, `messages`; the prompt-like
//! fields are in `inputs`), read as the JSON streams by: each field builds only
//! what routing keeps (a string, the routing text) and skips everything else without
//! materialising it. A body of millions of tiny values (`{"messages":[0,0,...]}`) then
//! costs its own size in time and next to nothing in memory, where building
//! `serde_json::Value`s for it ran Envoy's 1 GiB Wasm VM out of memory.
//!
//! The readers keep the meaning the fields always had (`mod.rs` documents it): a
//! non-object message adds no text but counts, a content part's `type` must be
//! `text`/`input_text` or not a string, the first element of a prompt batch decides
//! its shape, and for duplicate keys the last wins.

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::borrow::Cow;
use std::fmt;

/// Drains what is left of a sequence or map without keeping it.
pub(super) fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

pub(super) fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
    Ok(())
}

/// A value routing looks at only if it is a string, `true`, or an unsigned integer.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Leaf {
    Str(String),
    Bool(bool),
    U64(u64),
    /// Any other number (negative, fractional): kept as "a number" for prompts.
    OtherNumber,
    Other,
}

impl Leaf {
    pub(super) fn into_string(self) -> Option<String> {
        match self {
            Leaf::Str(s) => Some(s),
            _ => None,
        }
    }
}

struct LeafVisitor;

impl<'de> Visitor<'de> for LeafVisitor {
    type Value = Leaf;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<Leaf, E> {
        Ok(Leaf::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Leaf, E> {
        Ok(Leaf::Str(v))
    }
    fn visit_bool<E>(self, v: bool) -> Result<Leaf, E> {
        Ok(Leaf::Bool(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Leaf, E> {
        Ok(Leaf::U64(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Leaf, E> {
        Ok(u64::try_from(v).map_or(Leaf::OtherNumber, Leaf::U64))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Leaf, E> {
        Ok(Leaf::OtherNumber)
    }
    fn visit_unit<E>(self) -> Result<Leaf, E> {
        Ok(Leaf::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Leaf, A::Error> {
        drain_seq(seq)?;
        Ok(Leaf::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Leaf, A::Error> {
        drain_map(map)?;
        Ok(Leaf::Other)
    }
}

impl<'de> Deserialize<'de> for Leaf {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Leaf, D::Error> {
        d.deserialize_any(LeafVisitor)
    }
}

/// `messages` as routing text: every message as `role: text\n` in order; `None`
/// unless it is a non-empty array.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ChatText(pub Option<String>);

struct ChatVisitor;

impl<'de> Visitor<'de> for ChatVisitor {
    type Value = ChatText;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ChatText, A::Error> {
        let mut out = String::new();
        let mut any = false;
        while let Some(m) = seq.next_element::<Message<'de>>()? {
            any = true;
            if let Message(Some((role, content))) = m {
                out.push_str(&role);
                out.push_str(": ");
                out.push_str(&content);
                out.push('\n');
            }
        }
        Ok(ChatText(any.then_some(out)))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ChatText, A::Error> {
        drain_map(map)?;
        Ok(ChatText(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<ChatText, E> {
        Ok(ChatText(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<ChatText, E> {
        Ok(ChatText(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<ChatText, E> {
        Ok(ChatText(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<ChatText, E> {
        Ok(ChatText(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<ChatText, E> {
        Ok(ChatText(None))
    }
    fn visit_unit<E>(self) -> Result<ChatText, E> {
        Ok(ChatText(None))
    }
}

impl<'de> Deserialize<'de> for ChatText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<ChatText, D::Error> {
        d.deserialize_any(ChatVisitor)
    }
}

/// One message: `(role, content text)` if it is an object (role `""` unless a
/// string), `None` otherwise. The content is borrowed from the body when it has no
/// escapes: the kilobytes of a prompt are copied once, into the routing text.
pub(super) struct Message<'de>(pub(super) Option<(String, Cow<'de, str>)>);

pub(super) struct MessageVisitor;

impl<'de> Visitor<'de> for MessageVisitor {
    type Value = Message<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message<'de>, A::Error> {
        let mut role = String::new();
        let mut content = Cow::Borrowed("");
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Role => role = map.next_value::<Leaf>()?.into_string().unwrap_or_default(),
                Key::Content => content = map.next_value::<Content<'de>>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Message(Some((role, content))))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Message<'de>, A::Error> {
        drain_seq(seq)?;
        Ok(Message(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Message<'de>, E> {
        Ok(Message(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Message<'de>, E> {
        Ok(Message(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Message<'de>, E> {
        Ok(Message(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Message<'de>, E> {
        Ok(Message(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Message<'de>, E> {
        Ok(Message(None))
    }
    fn visit_unit<E>(self) -> Result<Message<'de>, E> {
        Ok(Message(None))
    }
}

impl<'de> Deserialize<'de> for Message<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Message<'de>, D::Error> {
        d.deserialize_any(MessageVisitor)
    }
}

/// The object keys the readers look at.
enum Key {
    Role,
    Content,
    Type,
    Text,
    Other,
}

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Key, D::Error> {
        struct KeyVisitor;
        impl Visitor<'_> for KeyVisitor {
            type Value = Key;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object key")
            }
            fn visit_str<E>(self, v: &str) -> Result<Key, E> {
                Ok(match v {
                    "role" => Key::Role,
                    "content" => Key::Content,
                    "type" => Key::Type,
                    "text" => Key::Text,
                    _ => Key::Other,
                })
            }
        }
        d.deserialize_identifier(KeyVisitor)
    }
}

/// A message's content as text: a string, or an array's text parts joined by `\n`.
struct Content<'de>(Cow<'de, str>);

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Owned(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Owned(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content<'de>, A::Error> {
        let mut out = String::new();
        let mut first = true;
        while let Some(Part(text)) = seq.next_element::<Part>()? {
            if let Some(t) = text {
                if !first {
                    out.push('\n');
                }
                out.push_str(&t);
                first = false;
            }
        }
        Ok(Content(Cow::Owned(out)))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content<'de>, A::Error> {
        drain_map(map)?;
        Ok(Content(Cow::Borrowed("")))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Borrowed("")))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Borrowed("")))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Borrowed("")))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Borrowed("")))
    }
    fn visit_unit<E>(self) -> Result<Content<'de>, E> {
        Ok(Content(Cow::Borrowed("")))
    }
}

impl<'de> Deserialize<'de> for Content<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Content<'de>, D::Error> {
        d.deserialize_any(ContentVisitor)
    }
}

/// One content part's text: a string, or an object's `text` string when its `type`
/// is `text`, `input_text`, absent, or not a string.
struct Part(Option<String>);

impl<'de> Deserialize<'de> for Part {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Part, D::Error> {
        struct PartVisitor;
        impl<'de> Visitor<'de> for PartVisitor {
            type Value = Part;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<Part, E> {
                Ok(Part(Some(v.to_string())))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Part, A::Error> {
                let mut kind: Option<Leaf> = None;
                let mut text: Option<Leaf> = None;
                while let Some(key) = map.next_key::<Key>()? {
                    match key {
                        Key::Type => kind = Some(map.next_value()?),
                        Key::Text => text = Some(map.next_value()?),
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let is_text = match &kind {
                    Some(Leaf::Str(t)) => t == "text" || t == "input_text",
                    _ => true,
                };
                Ok(Part(
                    is_text.then(|| text.and_then(Leaf::into_string)).flatten(),
                ))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Part, A::Error> {
                drain_seq(seq)?;
                Ok(Part(None))
            }
            fn visit_bool<E>(self, _: bool) -> Result<Part, E> {
                Ok(Part(None))
            }
            fn visit_u64<E>(self, _: u64) -> Result<Part, E> {
                Ok(Part(None))
            }
            fn visit_i64<E>(self, _: i64) -> Result<Part, E> {
                Ok(Part(None))
            }
            fn visit_f64<E>(self, _: f64) -> Result<Part, E> {
                Ok(Part(None))
            }
            fn visit_unit<E>(self) -> Result<Part, E> {
                Ok(Part(None))
            }
        }
        d.deserialize_any(PartVisitor)
    }
}
