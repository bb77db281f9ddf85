//! What crosses the shared queues between a VM that asks and the VM that routes.
//! Envoy copies each message into the receiving VM, so they carry only what the
//! other side needs: the question is the request's path and body (the router
//! parses it, as it would its own), the answer the decisions by worker name (a
//! worker list that changed between the two VMs' copies is caught by name), PD's
//! rewritten body, and per tree record what undoes it.
//!
//! Little-endian fixed fields, LEB128 counts and lengths where they vary; decoding
//! never panics and refuses trailing bytes.
//!
//! `inbound`: what the route queue carries to the routing VM (a question, notes
//! alone, a VM's counted requests after a takeover); `answer`: the routing VM's
//! answer. Both read their counts with `item_count`.

mod answer;
mod inbound;

pub use answer::{Answer, RecordMeta, Refused, Routed, Verdict};
pub use inbound::{Ask, Booked, Counted, Event, Inbound, Leg, Note, Retold, Told};

use crate::shared::Reader;

const TAG_ASK: u8 = 1;
const TAG_ROUTED: u8 = 2;
const TAG_REFUSED: u8 = 3;
const TAG_TOLD: u8 = 4;
const TAG_RETOLD: u8 = 5;

/// A count of items that take at least `min_bytes` each: a count beyond what the
/// message still holds is a lie, refused before anything is allocated for it.
fn item_count(r: &mut Reader<'_>, min_bytes: u64) -> Option<u64> {
    let n = r.varint()?;
    (n <= r.0.len() as u64 / min_bytes).then_some(n)
}
