//! The operation ring: how tree operations reach every VM in one order.
//!
//! A fixed set of slot keys plus a head key holding the next sequence number. A
//! writer claims sequence `h` by writing slot `h % slots` with that slot's CAS, then
//! advances the head (any writer that finds slot `h` already written advances the
//! head for it, so a stalled writer never blocks the others). Readers only read
//! sequences below the head, which are complete. Every VM, the writer included,
//! applies operations in sequence order to its local tree before it matches, and
//! uses the sequence number as the tree clock, so all VMs that applied the same
//! prefix of the stream hold identical trees and evict identically. When nothing
//! changed, catching up costs one `get` of the head. A VM that falls more than
//! `slots` behind skips what was overwritten and counts the gap.
//!
//! The head's value also carries the cached tables' generation (`super::generation`):
//! every request reads the head anyway, and in Envoy each read that returns data
//! costs a call back into the VM, so the generation rides along instead of having a
//! key of its own. A writer that advances the head keeps the generation it read, and
//! a stamp keeps the head: whichever writes second fails its CAS and retries.

use std::cell::Cell;

use super::{create_if_missing, Keys, Op, Reader, SetOutcome, SharedStore, CAS_ATTEMPTS};

const EMPTY_SEQ: u64 = u64::MAX;

/// The result of catching up with the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CatchUp {
    /// Operations applied.
    pub applied: u64,
    /// Operations lost because this VM fell more than a ring behind, or unreadable.
    pub gaps: u64,
}

/// Why an append did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendError {
    /// The ring's keys do not exist (not initialised) or cannot be read.
    Unavailable,
    /// CAS contention outlasted `CAS_ATTEMPTS`.
    Contended,
}

/// The operation ring's layout.
#[derive(Debug, Clone)]
pub struct OpRing {
    head_key: String,
    slot_keys: Vec<String>,
    /// The head as this VM last read it: a request catches up, then appends, and the
    /// append starts from this instead of reading the head again. A stale hint is
    /// safe: the slot's CAS and sequence decide, as for any writer that read the
    /// head a while ago, and a failed attempt reads the head afresh.
    head_hint: Cell<Option<Head>>,
    /// The tables' generation as of this VM's last read of the head.
    generation: Cell<Option<u64>>,
}

/// The head key's value as read: the next sequence number, the cached tables'
/// generation, and the key's CAS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    seq: u64,
    generation: u64,
    cas: u32,
}

/// The head key's value: the next sequence number, then the tables' generation.
pub(super) fn encode_head(seq: u64, generation: u64) -> [u8; 16] {
    let mut out = [0; 16];
    let (a, b) = out.split_at_mut(8);
    a.copy_from_slice(&seq.to_le_bytes());
    b.copy_from_slice(&generation.to_le_bytes());
    out
}

/// The sequence number and generation of a head value (a head without a
/// generation, as an older build wrote it, is at generation 0).
pub(super) fn decode_head(value: &[u8]) -> Option<(u64, u64)> {
    let mut r = Reader(value);
    let seq = r.u64()?;
    Some((seq, r.u64().unwrap_or(0)))
}

fn seq_of(slot: &[u8]) -> Option<u64> {
    Reader(slot).u64()
}

impl OpRing {
    pub fn new(keys: &Keys, slots: usize) -> OpRing {
        OpRing {
            head_key: keys.ring_head(),
            slot_keys: (0..slots.max(1)).map(|i| keys.ring_slot(i)).collect(),
            head_hint: Cell::new(None),
            generation: Cell::new(None),
        }
    }

    pub fn slots(&self) -> usize {
        self.slot_keys.len()
    }

    fn slot_key(&self, seq: u64) -> &str {
        let i = (seq % self.slot_keys.len() as u64) as usize;
        self.slot_keys
            .get(i)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// Creates whatever keys are missing: the head at 0 and empty slots. Envoy
    /// configures the main thread's VM before worker threads serve traffic, so the
    /// first initialisation happens before any append; a later config with more
    /// slots adds the new ones without touching the live ones.
    pub fn init_if_missing(&self, store: &dyn SharedStore) {
        let empty = EMPTY_SEQ.to_le_bytes();
        for key in &self.slot_keys {
            create_if_missing(store, key, &empty);
        }
        create_if_missing(store, &self.head_key, &encode_head(0, 0));
    }

    /// The next sequence number (operations ever appended).
    pub fn head(&self, store: &dyn SharedStore) -> Option<u64> {
        self.read_head(store).map(|h| h.seq)
    }

    /// The cached tables' generation as of this VM's last read of the head (`None`:
    /// never read, or unreadable).
    pub fn generation(&self) -> Option<u64> {
        self.generation.get()
    }

    /// The head, kept as the next append's hint and as the generation seen.
    fn read_head(&self, store: &dyn SharedStore) -> Option<Head> {
        let read = store.get(&self.head_key).and_then(|(v, cas)| {
            let (seq, generation) = decode_head(&v)?;
            Some(Head {
                seq,
                generation,
                cas,
            })
        });
        self.head_hint.set(read);
        self.generation.set(read.map(|h| h.generation));
        read
    }

    /// Moves the head past `claimed`, whose slot is written: from `head` as read,
    /// keeping its generation, and again from a fresh read when a stamp moved the
    /// generation in between (the head must not stay behind a written slot: readers
    /// would not see the operation until the next append).
    fn advance_past(&self, store: &dyn SharedStore, claimed: u64, mut head: Head) {
        for _ in 0..CAS_ATTEMPTS {
            if head.seq > claimed {
                return;
            }
            let value = encode_head(claimed + 1, head.generation);
            if store.set(&self.head_key, &value, head.cas) != SetOutcome::CasMismatch {
                return;
            }
            let Some(fresh) = self.read_head(store) else {
                return;
            };
            head = fresh;
        }
    }

    /// Appends `op`, returning its sequence number.
    pub fn append(&self, store: &dyn SharedStore, op: &[u8]) -> Result<u64, AppendError> {
        for _ in 0..CAS_ATTEMPTS {
            let read = match self.head_hint.take() {
                Some(hint) => hint,
                None => self.read_head(store).ok_or(AppendError::Unavailable)?,
            };
            let head = read.seq;
            let key = self.slot_key(head);
            let (slot, slot_cas) = store.get(key).ok_or(AppendError::Unavailable)?;
            match seq_of(&slot) {
                // Someone wrote `head` but has not advanced the head yet: help.
                Some(s) if s == head => {
                    self.advance_past(store, head, read);
                    continue;
                }
                // Our view of the head is stale.
                Some(s) if s != EMPTY_SEQ && s > head => continue,
                _ => {}
            }
            let mut value = Vec::with_capacity(8 + op.len());
            value.extend_from_slice(&head.to_le_bytes());
            value.extend_from_slice(op);
            match store.set(key, &value, slot_cas) {
                SetOutcome::Stored => {
                    self.advance_past(store, head, read);
                    return Ok(head);
                }
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return Err(AppendError::Unavailable),
            }
        }
        Err(AppendError::Contended)
    }

    /// Applies every operation from `*cursor` up to the head, in order, and moves the
    /// cursor. `apply(seq, op)` gets each decodable operation.
    pub fn catch_up(
        &self,
        store: &dyn SharedStore,
        cursor: &mut u64,
        mut apply: impl FnMut(u64, Op),
    ) -> CatchUp {
        self.walk(store, cursor, u64::MAX, |seq, bytes| {
            match Op::decode(bytes) {
                Some(op) => {
                    apply(seq, op);
                    true
                }
                None => false,
            }
        })
    }

    /// Reads the raw operations from `*cursor` up to the head, at most `max` of
    /// them, and moves the cursor past them. `read(seq, bytes)` returns whether the
    /// operation was well formed (garbage counts as a gap). The replica export reads
    /// this way: it stops early, and skips what is not its own.
    pub fn walk(
        &self,
        store: &dyn SharedStore,
        cursor: &mut u64,
        max: u64,
        mut read: impl FnMut(u64, &[u8]) -> bool,
    ) -> CatchUp {
        let mut out = CatchUp::default();
        let Some(head) = self.head(store) else {
            return out;
        };
        if head <= *cursor {
            return out;
        }
        let oldest = head.saturating_sub(self.slots() as u64);
        if *cursor < oldest {
            out.gaps += oldest - *cursor;
            *cursor = oldest;
        }
        let end = head.min(cursor.saturating_add(max));
        while *cursor < end {
            let seq = *cursor;
            let ok = store
                .get(self.slot_key(seq))
                .filter(|(v, _)| seq_of(v) == Some(seq))
                .is_some_and(|(v, _)| v.get(8..).is_some_and(|op| read(seq, op)));
            if ok {
                out.applied += 1;
            } else {
                // Overwritten by a writer a whole ring ahead, or garbage.
                out.gaps += 1;
            }
            *cursor += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::ops::insert_op;
    use super::super::testing::MemStore;
    use super::*;

    #[test]
    fn appended_ops_are_read_in_order_by_every_reader() {
        let store = MemStore::default();
        let ring = OpRing::new(&Keys::new("t"), 8);
        ring.init_if_missing(&store);
        for i in 0..5 {
            assert_eq!(
                ring.append(&store, &insert_op(&format!("t{i}"), "w").encode()),
                Ok(i)
            );
        }
        let mut cursor = 0;
        let mut seen = Vec::new();
        let c = ring.catch_up(&store, &mut cursor, |seq, op| seen.push((seq, op)));
        assert_eq!(
            c,
            CatchUp {
                applied: 5,
                gaps: 0
            }
        );
        assert_eq!(cursor, 5);
        assert_eq!(seen[3], (3, insert_op("t3", "w")));
        let again = ring.catch_up(&store, &mut cursor, |_, _| panic!("nothing new"));
        assert_eq!(again, CatchUp::default());
    }

    #[test]
    fn an_append_after_a_stale_head_read_never_overwrites_and_keeps_the_order() {
        let store = MemStore::default();
        let (a, b) = (
            OpRing::new(&Keys::new("t"), 4),
            OpRing::new(&Keys::new("t"), 4),
        );
        a.init_if_missing(&store);
        let op = |i: u64| insert_op(&format!("t{i}"), "w").encode();
        let mut cursor = 0;
        // VM `a` reads the head (its hint), then VM `b` appends past it: once, then
        // more than a whole ring, before `a` appends from its stale hint.
        for others in [1, 9] {
            a.catch_up(&store, &mut cursor, |_, _| {});
            let start = a.head(&store).unwrap();
            for i in 0..others {
                assert_eq!(b.append(&store, &op(start + i)), Ok(start + i));
            }
            let mine = start + others;
            assert_eq!(a.append(&store, &op(mine)), Ok(mine), "the next sequence");
            assert_eq!(a.head(&store), Some(mine + 1));
            let mut read = mine.saturating_sub(3);
            let mut seen = Vec::new();
            a.catch_up(&store, &mut read, |seq, op| seen.push((seq, op)));
            let want: Vec<_> = (mine.saturating_sub(3)..=mine)
                .map(|i| (i, insert_op(&format!("t{i}"), "w")))
                .collect();
            assert_eq!(seen, want, "every sequence holds its own operation");
        }
    }

    #[test]
    fn a_reader_a_ring_behind_counts_the_gap() {
        let store = MemStore::default();
        let ring = OpRing::new(&Keys::new("t"), 4);
        ring.init_if_missing(&store);
        for i in 0..10 {
            ring.append(&store, &insert_op(&format!("t{i}"), "w").encode())
                .unwrap();
        }
        let mut cursor = 0;
        let mut seqs = Vec::new();
        let c = ring.catch_up(&store, &mut cursor, |seq, _| seqs.push(seq));
        assert_eq!(
            c,
            CatchUp {
                applied: 4,
                gaps: 6
            }
        );
        assert_eq!(seqs, vec![6, 7, 8, 9], "only what the ring still holds");
    }

    #[test]
    fn a_writer_that_stalled_after_its_slot_write_is_helped() {
        let store = MemStore::default();
        let ring = OpRing::new(&Keys::new("t"), 4);
        ring.init_if_missing(&store);
        // Simulate a writer that wrote slot 0 with seq 0 and died before the head.
        let mut v = 0u64.to_le_bytes().to_vec();
        v.extend(insert_op("stalled", "w").encode());
        store.set("t.ring.slot.0", &v, 0);
        assert_eq!(ring.append(&store, &insert_op("next", "w").encode()), Ok(1));
        let mut cursor = 0;
        let mut texts = Vec::new();
        ring.catch_up(&store, &mut cursor, |_, op| {
            if let Op::Insert { text, .. } = op {
                texts.push(text)
            }
        });
        assert_eq!(texts, vec!["stalled", "next"]);
    }

    #[test]
    fn init_does_not_wipe_a_live_ring() {
        let store = MemStore::default();
        let ring = OpRing::new(&Keys::new("t"), 4);
        ring.init_if_missing(&store);
        ring.append(&store, &Op::Evict.encode()).unwrap();
        ring.init_if_missing(&store);
        assert_eq!(ring.head(&store), Some(1));
    }

    #[test]
    fn a_larger_ring_adds_slots_and_keeps_the_stream() {
        let store = MemStore::default();
        OpRing::new(&Keys::new("t"), 2).init_if_missing(&store);
        let small = OpRing::new(&Keys::new("t"), 2);
        small.append(&store, &Op::Evict.encode()).unwrap();
        let big = OpRing::new(&Keys::new("t"), 8);
        big.init_if_missing(&store);
        assert_eq!(big.head(&store), Some(1), "the head survives");
        for _ in 0..6 {
            big.append(&store, &Op::Evict.encode()).unwrap();
        }
        assert_eq!(big.head(&store), Some(7));
    }

    #[test]
    fn append_without_init_is_unavailable() {
        let store = MemStore::default();
        let ring = OpRing::new(&Keys::new("t"), 4);
        assert_eq!(
            ring.append(&store, &Op::Evict.encode()),
            Err(AppendError::Unavailable)
        );
    }
}
