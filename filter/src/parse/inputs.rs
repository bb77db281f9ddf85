//! The prompt-like body fields routing reads, as the JSON streams by (see `fields`):
//! a completion `prompt`, `/generate`'s `text`, and `input` (embeddings and
//! `/v1/responses`). A batch routes by its first element, which decides its shape;
//! token ids read as text so identical token prompts share a prefix.

use super::fields::{drain_map, drain_seq, Leaf, Message, MessageVisitor};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use std::fmt;

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
                    Message(Some((role, content))) => {
                        InputItem::Message(role, content.into_owned())
                    }
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
