//! The prompt-like body fields routing reads, as the JSON streams by (see `fields`):
//! a completion `prompt`, `/generate`'s `text`, and `input` (embeddings and
//! `/v1/responses`). A batch routes by its first element, which decides its shape;
//! token ids read as text so identical token prompts share a prefix.

use super::fields::{Leaf, Message};
use super::json::{Items, Json, Read, Token};

/// Appends a token id (an unsigned integer) and a space; other values add nothing.
fn push_id(out: &mut String, leaf: &Leaf) {
    if let Leaf::U64(n) = leaf {
        out.push_str(&n.to_string());
        out.push(' ');
    }
}

/// The rest of an array read as token ids (every element looked at).
fn push_ids(out: &mut String, items: &mut Items, json: &mut Json) -> Read<()> {
    while items.next(json)? {
        push_id(out, &Leaf::read(json)?);
    }
    Ok(())
}

/// One element of a batch (`prompt`, `text`, `input`), by the shape that decides how
/// the batch reads.
enum Element<'a> {
    Str(String),
    /// A number (of any kind): the batch is one prompt of token ids.
    Number(Leaf<'a>),
    /// A nested array: one prompt's token ids.
    Ids(String),
    /// An object: a message item (`input` reads these as chat).
    Message(Message<'a>),
    Other,
}

/// What an object in a batch is: a message item (`input`), or nothing (`prompt`,
/// whose objects are skipped unread but for their keys).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Objects {
    Messages,
    Skipped,
}

impl<'a> Element<'a> {
    fn read(json: &mut Json<'a>, objects: Objects) -> Read<Element<'a>> {
        Ok(match json.token()? {
            Token::Str(s) => Element::Str(s.into_owned()),
            Token::U64(n) => Element::Number(Leaf::U64(n)),
            Token::OtherNumber => Element::Number(Leaf::OtherNumber),
            Token::Array(mut items) => {
                let mut ids = String::new();
                push_ids(&mut ids, &mut items, json)?;
                Element::Ids(ids)
            }
            Token::Object(entries) if objects == Objects::Messages => {
                Element::Message(Message::read_entries(entries, json)?)
            }
            Token::Object(entries) => {
                entries.drain(json)?;
                Element::Other
            }
            Token::Bool(_) | Token::Null => Element::Other,
        })
    }
}

/// A completion prompt (or `/generate` text) as routing text: a string, or a batch's
/// first element (a string, or token ids rendered as text so identical token prompts
/// share a prefix: `[1,2]` and `[[1,2],[3]]` both read `"1 2 "`).
pub(super) fn prompt_text(json: &mut Json) -> Read<Option<String>> {
    let mut items = match json.token()? {
        Token::Str(s) => return Ok(Some(s.into_owned())),
        Token::Array(items) => items,
        other => return other.drain(json).map(|()| None),
    };
    if !items.next(json)? {
        return Ok(None);
    }
    let text = match Element::read(json, Objects::Skipped)? {
        Element::Str(s) | Element::Ids(s) => Some(s),
        Element::Number(leaf) => {
            let mut out = String::new();
            push_id(&mut out, &leaf);
            push_ids(&mut out, &mut items, json)?;
            return Ok(Some(out));
        }
        Element::Message(_) | Element::Other => None,
    };
    items.drain(json)?;
    Ok(text)
}

/// `input` (embeddings, `/v1/responses`) read both ways at once, since it is one pass:
/// as a prompt (a string, or a batch's first element) and, when it is an array, as
/// chat message items (`role: text\n` each; items that are not objects add nothing).
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct InputText {
    pub prompt: Option<String>,
    pub items: Option<String>,
}

pub(super) fn input_text(json: &mut Json) -> Read<InputText> {
    let mut elements = match json.token()? {
        Token::Str(s) => {
            return Ok(InputText {
                prompt: Some(s.into_owned()),
                items: None,
            })
        }
        Token::Array(items) => items,
        other => return other.drain(json).map(|()| InputText::default()),
    };
    // The first element decides the prompt reading; messages read every element.
    let mut prompt: Option<String> = None;
    let mut messages = Vec::new();
    let mut any = false;
    let mut ids: Option<String> = None;
    while elements.next(json)? {
        let element = Element::read(json, Objects::Messages)?;
        if !any {
            match &element {
                Element::Str(s) | Element::Ids(s) => prompt = Some(s.clone()),
                Element::Number(leaf) => {
                    let mut out = String::new();
                    push_id(&mut out, leaf);
                    ids = Some(out);
                }
                _ => {}
            }
        } else if let (Some(out), Element::Number(leaf)) = (ids.as_mut(), &element) {
            push_id(out, leaf);
        }
        any = true;
        if let Element::Message(m) = element {
            messages.push(m);
        }
    }
    Ok(InputText {
        prompt: prompt.or(ids),
        items: (!messages.is_empty()).then(|| Message::lines(&messages)),
    })
}
