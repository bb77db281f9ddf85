//! What the route queue carries to the routing VM: a worker VM's question with
//! its notes, its notes alone, and what it holds, told to a new routing VM.

use super::{item_count, TAG_ASK, TAG_RETOLD, TAG_TOLD};
use crate::decision::Prediction;
use crate::kv_match::EngineHeld;
use crate::shared::{put_bytes, put_varint, Reader};

/// A worker VM's question: route the stream `ctx`, and answer on queue `reply`;
/// with it, what the VM tells of the streams the routing VM counts for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ask<'a> {
    pub reply: u32,
    pub ctx: u32,
    /// `:path`, when the asking VM read it (PD, or a body that leaves its API open).
    pub path: Option<&'a str>,
    pub body: &'a [u8],
    pub notes: Vec<Note>,
    /// What the engines hold of the prompt, when the asking VM asked the collector
    /// (`kv_match`): the router decides by it as by its own question's.
    pub held: Option<EngineHeld>,
}

/// What a VM tells the routing VM of one stream it decided for it
/// (`super::holds`): the routing VM counts the request until it hears its end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Note {
    pub ctx: u32,
    pub leg: Leg,
    pub event: Event,
}

/// Which of a stream's requests a count is for: the request itself, or PD's copy
/// to the prefill worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Leg {
    Main,
    Prefill,
}

/// What happened to the request, with what the asking VM measured of it for
/// `predicted_ttft`'s costs, which the routing VM learns (it decides by them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// The first response byte, `after_ms` after the answer was applied: the
    /// booked prefill is done. Told only of a request with a booking.
    FirstByte { after_ms: u64 },
    /// The request ended, however it ended (or never went out); `streamed_ms`: how
    /// long it ran after its first byte, for a booked request that had one.
    End { streamed_ms: Option<u64> },
}

impl Event {
    /// An end with nothing measured.
    pub const ENDED: Event = Event::End { streamed_ms: None };

    pub fn is_end(&self) -> bool {
        matches!(self, Event::End { .. })
    }
}

impl Note {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.ctx.to_le_bytes());
        let leg = u8::from(self.leg == Leg::Prefill);
        let (event, ms) = match self.event {
            Event::FirstByte { after_ms } => (0, after_ms),
            // 0: nothing measured.
            Event::End { streamed_ms } => (1, streamed_ms.map_or(0, |ms| ms.saturating_add(1))),
        };
        out.push(leg << 1 | event);
        put_varint(out, ms);
    }

    fn decode(r: &mut Reader<'_>) -> Option<Note> {
        let ctx = r.u32()?;
        let bits = r.u8()?;
        if bits > 3 {
            return None;
        }
        let leg = if bits & 2 == 0 {
            Leg::Main
        } else {
            Leg::Prefill
        };
        let ms = r.varint()?;
        let event = if bits & 1 == 0 {
            Event::FirstByte { after_ms: ms }
        } else {
            Event::End {
                streamed_ms: ms.checked_sub(1),
            }
        };
        Some(Note { ctx, leg, event })
    }
}

/// Each note takes at least six bytes.
const NOTE_BYTES: u64 = 6;

fn put_notes(out: &mut Vec<u8>, notes: &[Note]) {
    put_varint(out, notes.len() as u64);
    for n in notes {
        n.encode(out);
    }
}

fn notes(r: &mut Reader<'_>) -> Option<Vec<Note>> {
    let n = item_count(r, NOTE_BYTES)?;
    (0..n).map(|_| Note::decode(r)).collect()
}

/// The engines' answer: absent (0), or present (1) with its tokens, block size and
/// per engine its name and held blocks (0: not whole, else one more than held).
fn put_held(out: &mut Vec<u8>, held: Option<&EngineHeld>) {
    let Some(h) = held else {
        out.push(0);
        return;
    };
    out.push(1);
    put_varint(out, u64::from(h.tokens));
    put_varint(out, u64::from(h.block_tokens));
    put_varint(out, h.engines.len() as u64);
    for (name, blocks) in &h.engines {
        put_bytes(out, name.as_bytes());
        put_varint(out, blocks.map_or(0, |b| u64::from(b) + 1));
    }
}

/// Each engine takes at least five bytes (a name's length and a count).
const ENGINE_BYTES: u64 = 5;

/// `put_held`'s answer; `None`: damaged, `Some(None)`: absent.
fn held(r: &mut Reader<'_>) -> Option<Option<EngineHeld>> {
    match r.u8()? {
        0 => return Some(None),
        1 => {}
        _ => return None,
    }
    let small = |v: u64| u32::try_from(v).ok();
    let tokens = small(r.varint()?)?;
    let block_tokens = small(r.varint()?)?;
    let n = item_count(r, ENGINE_BYTES)?;
    let engines = (0..n)
        .map(|_| {
            let name = r.string()?;
            let blocks = match r.varint()? {
                0 => None,
                b => Some(small(b - 1)?),
            };
            Some((name, blocks))
        })
        .collect::<Option<Vec<_>>>()?;
    Some(Some(EngineHeld {
        tokens,
        block_tokens,
        engines,
    }))
}

/// A worker VM's notes alone (no question to carry them), or its heartbeat (none):
/// the routing VM keeps the VM's counts while it hears from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Told {
    pub reply: u32,
    pub notes: Vec<Note>,
}

impl Told {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.notes.len() * NOTE_BYTES as usize);
        out.push(TAG_TOLD);
        out.extend_from_slice(&self.reply.to_le_bytes());
        put_notes(&mut out, &self.notes);
        out
    }
}

/// A booking: the request's uncached prefill chars, and the prefill its prediction
/// put before its first byte (ahead, and its own), which its first byte's time
/// teaches the worker's cost by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Booked {
    pub chars: u64,
    pub work_chars: u64,
}

impl Booked {
    /// What a `predicted_ttft` decision's prediction books.
    pub fn of(p: &Prediction) -> Booked {
        Booked {
            chars: p.uncached_chars,
            work_chars: p.ahead_chars.saturating_add(p.uncached_chars),
        }
    }
}

/// One request a VM holds that a routing VM counts: what it tells a new routing VM
/// (after a takeover), which did not count it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    pub ctx: u32,
    pub leg: Leg,
    pub worker: String,
    pub booked: Option<Booked>,
}

/// Every request a VM holds that a routing VM counts, told to a new routing VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retold {
    pub reply: u32,
    pub counted: Vec<Counted>,
}

impl Retold {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(8 + self.counted.len() * 24);
        out.push(TAG_RETOLD);
        out.extend_from_slice(&self.reply.to_le_bytes());
        put_varint(&mut out, self.counted.len() as u64);
        for c in &self.counted {
            out.extend_from_slice(&c.ctx.to_le_bytes());
            out.push(u8::from(c.leg == Leg::Prefill));
            put_bytes(&mut out, c.worker.as_bytes());
            match c.booked {
                None => out.push(0),
                Some(b) => {
                    out.push(1);
                    put_varint(&mut out, b.chars);
                    put_varint(&mut out, b.work_chars);
                }
            }
        }
        out
    }

    fn decode(r: &mut Reader<'_>) -> Option<Retold> {
        let reply = r.u32()?;
        // Each takes at least seven bytes.
        let n = item_count(r, 7)?;
        let mut counted = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let ctx = r.u32()?;
            let leg = match r.u8()? {
                0 => Leg::Main,
                1 => Leg::Prefill,
                _ => return None,
            };
            let worker = r.string()?;
            let booked = match r.u8()? {
                0 => None,
                1 => Some(Booked {
                    chars: r.varint()?,
                    work_chars: r.varint()?,
                }),
                _ => return None,
            };
            counted.push(Counted {
                ctx,
                leg,
                worker,
                booked,
            });
        }
        r.0.is_empty().then_some(Retold { reply, counted })
    }
}

/// What the route queue carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inbound<'a> {
    Ask(Ask<'a>),
    Told(Told),
    Retold(Retold),
}

impl<'a> Inbound<'a> {
    pub fn decode(bytes: &'a [u8]) -> Option<Inbound<'a>> {
        match *bytes.first()? {
            TAG_ASK => Ask::decode(bytes).map(Inbound::Ask),
            TAG_TOLD => {
                let mut r = Reader(bytes.get(1..)?);
                let reply = r.u32()?;
                let notes = notes(&mut r)?;
                r.0.is_empty()
                    .then_some(Inbound::Told(Told { reply, notes }))
            }
            TAG_RETOLD => Retold::decode(&mut Reader(bytes.get(1..)?)).map(Inbound::Retold),
            _ => None,
        }
    }
}

impl<'a> Ask<'a> {
    pub fn encode(&self) -> Vec<u8> {
        let path = self.path.map_or(0, str::len);
        let notes = self.notes.len() * NOTE_BYTES as usize;
        let mut out = Vec::with_capacity(16 + notes + path + self.body.len());
        out.push(TAG_ASK);
        out.extend_from_slice(&self.reply.to_le_bytes());
        out.extend_from_slice(&self.ctx.to_le_bytes());
        put_notes(&mut out, &self.notes);
        match self.path {
            None => out.push(0),
            Some(p) => {
                out.push(1);
                put_bytes(&mut out, p.as_bytes());
            }
        }
        put_held(&mut out, self.held.as_ref());
        // The body is the rest: no length, no copy of its own.
        out.extend_from_slice(self.body);
        out
    }

    pub fn decode(bytes: &'a [u8]) -> Option<Ask<'a>> {
        let mut r = Reader(bytes);
        if r.u8()? != TAG_ASK {
            return None;
        }
        let reply = r.u32()?;
        let ctx = r.u32()?;
        let notes = notes(&mut r)?;
        let path = match r.u8()? {
            0 => None,
            1 => Some(r.str()?),
            _ => return None,
        };
        let held = held(&mut r)?;
        Some(Ask {
            reply,
            ctx,
            path,
            body: r.0,
            notes,
            held,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::TAG_ROUTED;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn every_note() -> Vec<Note> {
        let mut all = Vec::new();
        for (ctx, leg) in [(7, Leg::Main), (u32::MAX, Leg::Prefill)] {
            for event in [
                Event::FirstByte { after_ms: 0 },
                Event::FirstByte { after_ms: 1 << 40 },
                Event::ENDED,
                Event::End {
                    streamed_ms: Some(0),
                },
                Event::End {
                    streamed_ms: Some(u64::MAX - 1),
                },
            ] {
                all.push(Note { ctx, leg, event });
            }
        }
        all
    }

    #[test]
    fn an_ask_round_trips_with_and_without_a_path_and_notes() {
        let body = br#"{"model":"m","prompt":"hello"}"#;
        let answer = EngineHeld {
            tokens: 232,
            block_tokens: 16,
            engines: vec![
                ("w0".into(), Some(14)),
                ("w1".into(), Some(0)),
                ("w2".into(), None),
            ],
        };
        for path in [None, Some("/v1/completions"), Some("")] {
            for notes in [Vec::new(), every_note()] {
                for held in [None, Some(answer.clone()), Some(EngineHeld::default())] {
                    let ask = Ask {
                        reply: 3,
                        ctx: 17,
                        path,
                        body,
                        notes: notes.clone(),
                        held,
                    };
                    let bytes = ask.encode();
                    assert_eq!(Ask::decode(&bytes), Some(ask.clone()));
                    assert_eq!(Inbound::decode(&bytes), Some(Inbound::Ask(ask)));
                }
            }
        }
        // Cut inside the answer: refused (the body, the rest, may be cut anywhere).
        let ask = Ask {
            reply: 3,
            ctx: 17,
            path: None,
            body: b"",
            notes: Vec::new(),
            held: Some(answer),
        };
        let bytes = ask.encode();
        let answer_starts = 1 + 4 + 4 + 1 + 1;
        for n in 0..bytes.len() {
            let cut = Ask::decode(&bytes[..n]);
            assert!(cut.is_none() || n < answer_starts, "cut at {n}: {cut:?}");
        }
        let empty = Ask {
            reply: 1,
            ctx: 2,
            path: None,
            body: b"",
            notes: Vec::new(),
            held: None,
        };
        assert_eq!(Ask::decode(&empty.encode()), Some(empty));
    }

    #[test]
    fn what_a_vm_holds_round_trips_to_a_new_router_and_damage_is_refused() {
        let retold = Retold {
            reply: 4,
            counted: vec![
                Counted {
                    ctx: 9,
                    leg: Leg::Main,
                    worker: "w1".into(),
                    booked: Some(Booked {
                        chars: 1200,
                        work_chars: 1 << 33,
                    }),
                },
                Counted {
                    ctx: 9,
                    leg: Leg::Prefill,
                    worker: "p0".into(),
                    booked: None,
                },
            ],
        };
        let bytes = retold.encode();
        assert_eq!(Inbound::decode(&bytes), Some(Inbound::Retold(retold)));
        for n in 0..bytes.len() {
            assert_eq!(Inbound::decode(&bytes[..n]), None, "cut at {n}");
        }
        let mut bad_leg = bytes.clone();
        bad_leg[10] = 2;
        assert_eq!(Inbound::decode(&bad_leg), None);
        let empty = Retold {
            reply: 1,
            counted: Vec::new(),
        };
        assert_eq!(
            Inbound::decode(&empty.encode()),
            Some(Inbound::Retold(empty))
        );
    }

    #[test]
    fn notes_alone_round_trip_and_a_damaged_message_is_refused() {
        for notes in [Vec::new(), every_note()] {
            let told = Told { reply: 9, notes };
            let bytes = told.encode();
            assert_eq!(Inbound::decode(&bytes), Some(Inbound::Told(told)));
            for n in 0..bytes.len() {
                assert_eq!(Inbound::decode(&bytes[..n]), None, "cut at {n}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(Inbound::decode(&longer), None);
        }
        let mut bad_event = Told {
            reply: 1,
            notes: vec![Note {
                ctx: 1,
                leg: Leg::Main,
                event: Event::ENDED,
            }],
        }
        .encode();
        let bits = bad_event.len() - 2;
        bad_event[bits] = 4;
        assert_eq!(Inbound::decode(&bad_event), None);
        // A count of notes no message could hold.
        let mut lying = vec![TAG_TOLD, 1, 0, 0, 0];
        put_varint(&mut lying, u64::MAX);
        assert_eq!(Inbound::decode(&lying), None);
        assert_eq!(Inbound::decode(&[TAG_ROUTED, 1, 0, 0, 0]), None);
    }
}
