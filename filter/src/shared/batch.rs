//! What one ring slot holds: a batch, the tree operations one VM recorded in one
//! sync window (`super::outbox`), shared under one sequence. A VM appends it with
//! one claim and one slot write, and every other VM reads it with one `get`: in
//! Envoy the reads and writes, not the bytes, are what a request pays for.
//!
//! The payload is a mark byte, then each operation length-prefixed. No operation's
//! tag is the mark, so a payload of one bare operation, as builds before batches
//! wrote it, still reads as one.

use super::{put_bytes, Op, Reader};

const BATCH_MARK: u8 = 0;

/// Operations framed for one slot.
#[derive(Debug, Default)]
pub struct Batch {
    bytes: Vec<u8>,
}

impl Batch {
    /// Adds `op`; where its frame is (start, length) for `remove`.
    pub fn push(&mut self, op: &Op) -> (usize, usize) {
        let at = self.bytes.len();
        self.bytes.reserve(4 + op.encoded_len());
        self.bytes.extend_from_slice(&[0; 4]);
        op.encode_into(&mut self.bytes);
        let len = self.bytes.len() - at;
        if let Some(prefix) = self.bytes.get_mut(at..at + 4) {
            prefix.copy_from_slice(&((len - 4) as u32).to_le_bytes());
        }
        (at, len)
    }

    /// Takes out the frame `push` placed at (start, length).
    pub fn remove(&mut self, start: usize, len: usize) {
        let end = start.saturating_add(len).min(self.bytes.len());
        if start < end {
            self.bytes.drain(start..end);
        }
    }

    /// Adds an operation already encoded (`Op::encode`, `Op::encode_imported`).
    pub fn push_encoded(&mut self, op: &[u8]) {
        put_bytes(&mut self.bytes, op);
    }

    /// Whether it holds no operation (every frame has a prefix).
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// Its encoded size, operations and their prefixes.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
    }

    /// Appends the slot payload (the mark, then the frames) to `out`.
    pub(super) fn encode_into(&self, out: &mut Vec<u8>) {
        out.push(BATCH_MARK);
        out.extend_from_slice(&self.bytes);
    }
}

/// Feeds each operation of a slot's payload to `read`: a batch, or one bare
/// operation. How many `read` took, and how many were garbage (a cut frame ends
/// the payload: what follows cannot be delimited).
pub(super) fn read_payload(payload: &[u8], mut read: impl FnMut(&[u8]) -> bool) -> (u64, u64) {
    let (mut took, mut garbage) = (0, 0);
    let mut tally = |ok: bool| {
        if ok {
            took += 1;
        } else {
            garbage += 1;
        }
    };
    let Some((&BATCH_MARK, frames)) = payload.split_first() else {
        tally(read(payload));
        return (took, garbage);
    };
    let mut r = Reader(frames);
    while !r.0.is_empty() {
        let Some(op) = r.u32().and_then(|n| r.take(n as usize)) else {
            tally(false);
            break;
        };
        tally(read(op));
    }
    (took, garbage)
}
