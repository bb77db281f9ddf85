//! The body fields routing reads, read as the JSON streams by: each field builds only
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
use std::fmt;

/// Drains what is left of a sequence or map without keeping it.
fn drain_seq<'de, A: SeqAccess<'de>>(mut seq: A) -> Result<(), A::Error> {
    while seq.next_element::<IgnoredAny>()?.is_some() {}
    Ok(())
}

fn drain_map<'de, A: MapAccess<'de>>(mut map: A) -> Result<(), A::Error> {
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
        while let Some(m) = seq.next_element::<Message>()? {
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
/// string), `None` otherwise.
struct Message(Option<(String, String)>);

struct MessageVisitor;

impl<'de> Visitor<'de> for MessageVisitor {
    type Value = Message;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Message, A::Error> {
        let mut role = String::new();
        let mut content = String::new();
        while let Some(key) = map.next_key::<Key>()? {
            match key {
                Key::Role => role = map.next_value::<Leaf>()?.into_string().unwrap_or_default(),
                Key::Content => content = map.next_value::<Content>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Message(Some((role, content))))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Message, A::Error> {
        drain_seq(seq)?;
        Ok(Message(None))
    }
    fn visit_str<E>(self, _: &str) -> Result<Message, E> {
        Ok(Message(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Message, E> {
        Ok(Message(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Message, E> {
        Ok(Message(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Message, E> {
        Ok(Message(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Message, E> {
        Ok(Message(None))
    }
    fn visit_unit<E>(self) -> Result<Message, E> {
        Ok(Message(None))
    }
}

impl<'de> Deserialize<'de> for Message {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Message, D::Error> {
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
struct Content(String);

struct ContentVisitor;

impl<'de> Visitor<'de> for ContentVisitor {
    type Value = Content;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<Content, E> {
        Ok(Content(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Content, E> {
        Ok(Content(v))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Content, A::Error> {
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
        Ok(Content(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Content, A::Error> {
        drain_map(map)?;
        Ok(Content(String::new()))
    }
    fn visit_bool<E>(self, _: bool) -> Result<Content, E> {
        Ok(Content(String::new()))
    }
    fn visit_u64<E>(self, _: u64) -> Result<Content, E> {
        Ok(Content(String::new()))
    }
    fn visit_i64<E>(self, _: i64) -> Result<Content, E> {
        Ok(Content(String::new()))
    }
    fn visit_f64<E>(self, _: f64) -> Result<Content, E> {
        Ok(Content(String::new()))
    }
    fn visit_unit<E>(self) -> Result<Content, E> {
        Ok(Content(String::new()))
    }
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Content, D::Error> {
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

/// A completion prompt (or `/generate` text) as routing text: a string, or a batch's
/// first element (a string, or token ids rendered as text so identical token prompts
/// share a prefix: `[1,2]` and `[[1,2],[3]]` both read `"1 2 "`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct PromptText(pub Option<String>);

/// Appends a token id (an unsigned integer) and a space; other values add nothing.
fn push_id(out: &mut String, leaf: &Leaf) {
    if let Leaf::U64(n) = leaf {
        out.push_str(&n.to_string());
        out.push(' ');
    }
}

/// A batch's first element, which decides how the batch reads.
enum First {
    Str(String),
    /// A number (of any kind): the batch is one prompt of token ids.
    Number(Leaf),
    /// A nested array: the first prompt's token ids.
    Ids(String),
    Other,
}

impl<'de> Deserialize<'de> for First {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<First, D::Error> {
        struct FirstVisitor;
        impl<'de> Visitor<'de> for FirstVisitor {
            type Value = First;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<First, E> {
                Ok(First::Str(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<First, E> {
                Ok(First::Number(Leaf::U64(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<First, E> {
                Ok(First::Number(
                    u64::try_from(v).map_or(Leaf::OtherNumber, Leaf::U64),
                ))
            }
            fn visit_f64<E>(self, _: f64) -> Result<First, E> {
                Ok(First::Number(Leaf::OtherNumber))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First, A::Error> {
                let mut out = String::new();
                while let Some(leaf) = seq.next_element::<Leaf>()? {
                    push_id(&mut out, &leaf);
                }
                Ok(First::Ids(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<First, A::Error> {
                drain_map(map)?;
                Ok(First::Other)
            }
            fn visit_bool<E>(self, _: bool) -> Result<First, E> {
                Ok(First::Other)
            }
            fn visit_unit<E>(self) -> Result<First, E> {
                Ok(First::Other)
            }
        }
        d.deserialize_any(FirstVisitor)
    }
}

struct PromptVisitor;

impl<'de> Visitor<'de> for PromptVisitor {
    type Value = PromptText;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<PromptText, E> {
        Ok(PromptText(Some(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<PromptText, E> {
        Ok(PromptText(Some(v)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PromptText, A::Error> {
        let text = match seq.next_element::<First>()? {
            None => return Ok(PromptText(None)),
            Some(First::Str(s)) => Some(s),
            Some(First::Ids(ids)) => Some(ids),
            Some(First::Number(leaf)) => {
                let mut out = String::new();
                push_id(&mut out, &leaf);
                while let Some(leaf) = seq.next_element::<Leaf>()? {
                    push_id(&mut out, &leaf);
                }
                Some(out)
            }
            Some(First::Other) => None,
        };
        drain_seq(seq)?;
        Ok(PromptText(text))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<PromptText, A::Error> {
        drain_map(map)?;
        Ok(PromptText(None))
    }
    fn visit_bool<E>(self, _: bool) -> Result<PromptText, E> {
        Ok(PromptText(None))
    }
    fn visit_u64<E>(self, _: u64) -> Result<PromptText, E> {
        Ok(PromptText(None))
    }
    fn visit_i64<E>(self, _: i64) -> Result<PromptText, E> {
        Ok(PromptText(None))
    }
    fn visit_f64<E>(self, _: f64) -> Result<PromptText, E> {
        Ok(PromptText(None))
    }
    fn visit_unit<E>(self) -> Result<PromptText, E> {
        Ok(PromptText(None))
    }
}

impl<'de> Deserialize<'de> for PromptText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<PromptText, D::Error> {
        d.deserialize_any(PromptVisitor)
    }
}

/// `input` (embeddings, `/v1/responses`) read both ways at once, since it is one pass:
/// as a prompt (a string, or a batch's first element) and, when it is an array, as
/// chat message items (`role: text\n` each; items that are not objects add nothing).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct InputText {
    pub prompt: Option<String>,
    pub items: Option<String>,
}

struct InputVisitor;

impl<'de> Visitor<'de> for InputVisitor {
    type Value = InputText;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_str<E>(self, v: &str) -> Result<InputText, E> {
        Ok(InputText {
            prompt: Some(v.to_string()),
            items: None,
        })
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<InputText, A::Error> {
        // The first element decides the prompt reading; messages read every element.
        let mut prompt: Option<String> = None;
        let mut items = String::new();
        let mut any = false;
        let mut ids: Option<String> = None;
        while let Some(item) = seq.next_element::<InputItem>()? {
            if !any {
                match &item {
                    InputItem::Str(s) => prompt = Some(s.clone()),
                    InputItem::Ids(t) => prompt = Some(t.clone()),
                    InputItem::Number(leaf) => {
                        let mut out = String::new();
                        push_id(&mut out, leaf);
                        ids = Some(out);
                    }
                    _ => {}
                }
            } else if let (Some(out), InputItem::Number(leaf)) = (ids.as_mut(), &item) {
                push_id(out, leaf);
            }
            any = true;
            if let InputItem::Message(role, content) = item {
                items.push_str(&role);
                items.push_str(": ");
                items.push_str(&content);
                items.push('\n');
            }
        }
        Ok(InputText {
            prompt: prompt.or(ids),
            items: (any && !items.is_empty()).then_some(items),
        })
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<InputText, A::Error> {
        drain_map(map)?;
        Ok(InputText::none())
    }
    fn visit_bool<E>(self, _: bool) -> Result<InputText, E> {
        Ok(InputText::none())
    }
    fn visit_u64<E>(self, _: u64) -> Result<InputText, E> {
        Ok(InputText::none())
    }
    fn visit_i64<E>(self, _: i64) -> Result<InputText, E> {
        Ok(InputText::none())
    }
    fn visit_f64<E>(self, _: f64) -> Result<InputText, E> {
        Ok(InputText::none())
    }
    fn visit_unit<E>(self) -> Result<InputText, E> {
        Ok(InputText::none())
    }
}

impl InputText {
    fn none() -> InputText {
        InputText {
            prompt: None,
            items: None,
        }
    }
}

impl<'de> Deserialize<'de> for InputText {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<InputText, D::Error> {
        d.deserialize_any(InputVisitor)
    }
}

/// One element of an `input` array.
enum InputItem {
    Str(String),
    Number(Leaf),
    /// A nested array: token ids.
    Ids(String),
    /// An object: a message item's role and content text.
    Message(String, String),
    Other,
}

impl<'de> Deserialize<'de> for InputItem {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<InputItem, D::Error> {
        struct ItemVisitor;
        impl<'de> Visitor<'de> for ItemVisitor {
            type Value = InputItem;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_str<E>(self, v: &str) -> Result<InputItem, E> {
                Ok(InputItem::Str(v.to_string()))
            }
            fn visit_u64<E>(self, v: u64) -> Result<InputItem, E> {
                Ok(InputItem::Number(Leaf::U64(v)))
            }
            fn visit_i64<E>(self, v: i64) -> Result<InputItem, E> {
                Ok(InputItem::Number(
                    u64::try_from(v).map_or(Leaf::OtherNumber, Leaf::U64),
                ))
            }
            fn visit_f64<E>(self, _: f64) -> Result<InputItem, E> {
                Ok(InputItem::Number(Leaf::OtherNumber))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<InputItem, A::Error> {
                let mut out = String::new();
                while let Some(leaf) = seq.next_element::<Leaf>()? {
                    push_id(&mut out, &leaf);
                }
                Ok(InputItem::Ids(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<InputItem, A::Error> {
                Ok(match MessageVisitor.visit_map(map)? {
                    Message(Some((role, content))) => InputItem::Message(role, content),
                    Message(None) => InputItem::Other,
                })
            }
            fn visit_bool<E>(self, _: bool) -> Result<InputItem, E> {
                Ok(InputItem::Other)
            }
            fn visit_unit<E>(self) -> Result<InputItem, E> {
                Ok(InputItem::Other)
            }
        }
        d.deserialize_any(ItemVisitor)
    }
}
