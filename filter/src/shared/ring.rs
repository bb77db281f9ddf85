//! The operation ring: how tree operations reach every VM in one order.
//!
//! A fixed set of slot keys plus a head key holding the next sequence number. A
//! writer claims sequence `h` by moving the head from `h` to `h + 1` under the head's
//! CAS, then writes slot `h % slots` (no other writer touches that slot until the head
//! has gone a whole ring past it, so the write needs no CAS and no read before it).
//! Every VM applies the others' operations in sequence order to its local tree
//! before it matches, and uses the sequence number as the tree clock; the writer
//! applied its own when it recorded them (`super::outbox`), at the clock of the
//! sequence it then claims unless another VM claimed first. A sequence's slot holds
//! a batch (`super::batch`). When nothing changed, catching up costs one `get` of
//! the head. A VM that falls more than `slots` behind skips what was overwritten
//! and counts the gap.
//!
//! A reader can find a sequence below the head whose slot is not written yet: its
//! writer is between its two writes (on another thread, for a few microseconds). The
//! reader stops there and resumes at its next catch-up. A slot still unwritten after
//! `HOLE_PATIENCE_MS` (its writer's VM died between the two writes, or the write
//! failed) is skipped and counted as a gap. Claiming first costs one `set` of the
//! head and one of the slot; writing the slot first needed its CAS, so a `get` of the
//! slot before every append, and in Envoy a `get` that returns data is the dearest
//! hostcall of a request.
//!
//! The head's value also carries the cached tables' generation (`super::generation`)
//! and, after it, the in-flight table (`super::inflight`, the `Rider`): every sync
//! (`super::outbox`) reads the head anyway and writes it to claim its batch, and in
//! Envoy each read that returns data costs a call back into the VM, so the two ride
//! along instead of having keys of their own. The bookings since a VM's last sync
//! are published by its claim. Every
//! write of the head keeps what it does not own: a claim keeps the generation (and
//! the table, unless it carries this VM's counts), a stamp keeps the sequence and
//! the table, a publication of the counts keeps the sequence and the generation;
//! whichever writes second fails its CAS and retries from a fresh read.

use std::cell::{Cell, Ref, RefCell};

use super::batch::{read_payload, Batch};
use super::{create_if_missing, Keys, OpRef, Reader, SetOutcome, SharedStore, CAS_ATTEMPTS};

const EMPTY_SEQ: u64 = u64::MAX;

/// How long a claimed sequence may stay unwritten before readers skip it as a gap.
pub const HOLE_PATIENCE_MS: u64 = 1_000;

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
    /// safe: its claim fails the head's CAS, and the next attempt reads the head
    /// afresh.
    head_hint: Cell<Option<Head>>,
    /// The rider's bytes as this VM last read or wrote them: what its requests
    /// route by, and what a write with the hint starts from.
    tail: RefCell<Vec<u8>>,
    /// The buffer a slot's value is built in (sequence, then operation).
    slot_value: RefCell<Vec<u8>>,
    /// The tables' generation as of this VM's last read of the head.
    generation: Cell<Option<u64>>,
    /// The claimed but unwritten sequence this VM's reads stopped at, and when they
    /// first did (the caller's clock).
    hole: Cell<Option<(u64, u64)>>,
}

/// What a slot holds for the sequence a reader expects there.
enum Slot<'a> {
    /// The operation of that sequence.
    Written(&'a [u8]),
    /// Not yet: it holds an older sequence, or nothing.
    Unwritten,
    /// A later sequence (the reader is a ring behind), or garbage.
    Lost,
}

fn slot_for(seq: u64, value: Option<&[u8]>) -> Slot<'_> {
    let Some(value) = value else {
        return Slot::Unwritten;
    };
    match seq_of(value) {
        Some(s) if s == seq => Slot::Written(value.get(8..).unwrap_or_default()),
        Some(s) if s == EMPTY_SEQ || s < seq => Slot::Unwritten,
        _ => Slot::Lost,
    }
}

/// The head key's value as read (its rider's bytes aside): the next sequence
/// number, the cached tables' generation, and the key's CAS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    seq: u64,
    generation: u64,
    cas: u32,
}

/// What rides in the head's value after the sequence number and the generation:
/// the in-flight table, published by the head writes a request makes anyway.
pub trait Rider {
    /// The bytes to store in place of `tail` (as read with the head), or `None` to
    /// leave them as they are.
    fn rewrite(&self, tail: &[u8]) -> Option<Vec<u8>>;
    /// What `rewrite` returned was stored.
    fn stored(&self);
}

/// A write of the head that carries nothing of its own.
pub struct NoRider;

impl Rider for NoRider {
    fn rewrite(&self, _: &[u8]) -> Option<Vec<u8>> {
        None
    }
    fn stored(&self) {}
}

/// The head key's value: the next sequence number, the tables' generation, the
/// rider's bytes.
pub(super) fn encode_head(seq: u64, generation: u64, tail: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + tail.len());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&generation.to_le_bytes());
    out.extend_from_slice(tail);
    out
}

/// The sequence number, generation and rider's bytes of a head value (a head
/// without a generation, as an older build wrote it, is at generation 0 and
/// carries nothing).
pub(super) fn decode_head(value: &[u8]) -> Option<(u64, u64, &[u8])> {
    let mut r = Reader(value);
    let seq = r.u64()?;
    let generation = r.u64().unwrap_or(0);
    Some((seq, generation, value.get(16..).unwrap_or_default()))
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
            tail: RefCell::new(Vec::new()),
            slot_value: RefCell::new(Vec::new()),
            generation: Cell::new(None),
            hole: Cell::new(None),
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
        create_if_missing(store, &self.head_key, &encode_head(0, 0, &[]));
    }

    /// The cached tables' generation as of this VM's last read of the head (`None`:
    /// never read, or unreadable).
    pub fn generation(&self) -> Option<u64> {
        self.generation.get()
    }

    /// Reads the head: the next sequence number (operations ever appended). What
    /// it read is kept as the next write's hint, the generation seen and the
    /// rider's bytes.
    pub fn head(&self, store: &dyn SharedStore) -> Option<u64> {
        let read = store.get(&self.head_key).and_then(|(v, cas)| {
            let (seq, generation, tail) = decode_head(&v)?;
            let mut kept = self.tail.borrow_mut();
            kept.clear();
            kept.extend_from_slice(tail);
            Some(Head {
                seq,
                generation,
                cas,
            })
        });
        if read.is_none() {
            self.tail.borrow_mut().clear();
        }
        self.head_hint.set(read);
        self.generation.set(read.map(|h| h.generation));
        read.map(|h| h.seq)
    }

    /// The hint of the last read (taken: it serves one write), else a fresh read.
    fn take_head(&self, store: &dyn SharedStore) -> Option<Head> {
        if let Some(hint) = self.head_hint.take() {
            return Some(hint);
        }
        self.head(store)?;
        self.head_hint.take()
    }

    /// Writes the head under `head`'s CAS: `seq`, the generation read, and the
    /// rider's `rewritten` bytes (`None`: this VM's copy of them, kept).
    fn write_head(
        &self,
        store: &dyn SharedStore,
        (head, seq): (Head, u64),
        rewritten: Option<Vec<u8>>,
        rider: &dyn Rider,
    ) -> SetOutcome {
        let outcome = {
            let tail = self.tail.borrow();
            let bytes = rewritten.as_deref().unwrap_or(&tail);
            store.set(
                &self.head_key,
                &encode_head(seq, head.generation, bytes),
                head.cas,
            )
        };
        if let (SetOutcome::Stored, Some(bytes)) = (outcome, rewritten) {
            *self.tail.borrow_mut() = bytes;
            rider.stored();
        }
        outcome
    }

    /// The rider's bytes as this VM last read or wrote them (empty when the head
    /// was never read, or unreadable): no hostcall.
    pub fn tail(&self) -> Ref<'_, [u8]> {
        Ref::map(self.tail.borrow(), Vec::as_slice)
    }

    /// Reads the head now; its rider's bytes (empty when unreadable).
    pub fn read_tail(&self, store: &dyn SharedStore) -> Ref<'_, [u8]> {
        self.head(store);
        self.tail()
    }

    /// Appends one encoded operation as a batch of its own, for tests.
    #[cfg(test)]
    pub fn append_one(&self, store: &dyn SharedStore, op: &[u8]) -> Result<u64, AppendError> {
        let mut batch = Batch::default();
        batch.push_encoded(op);
        self.append(store, &batch)
    }

    /// Appends `batch` with nothing riding (`append_riding`).
    pub fn append(&self, store: &dyn SharedStore, batch: &Batch) -> Result<u64, AppendError> {
        self.append_riding(store, batch, &NoRider)
    }

    /// Appends `batch` under one sequence number, which it returns: claims it on
    /// the head (from the hint of the last read, else a fresh read; a stale one
    /// fails its CAS and reads afresh), with `rider`'s bytes in the same write,
    /// then writes its slot.
    pub fn append_riding(
        &self,
        store: &dyn SharedStore,
        batch: &Batch,
        rider: &dyn Rider,
    ) -> Result<u64, AppendError> {
        for _ in 0..CAS_ATTEMPTS {
            let head = self.take_head(store).ok_or(AppendError::Unavailable)?;
            let claimed = head.seq;
            let rewritten = rider.rewrite(&self.tail.borrow());
            match self.write_head(store, (head, claimed.saturating_add(1)), rewritten, rider) {
                SetOutcome::Stored => {}
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return Err(AppendError::Unavailable),
            }
            // The slot's value is built in a buffer kept for it: a batch is
            // kilobytes, and allocating as much per append showed in the counts.
            let mut value = self.slot_value.borrow_mut();
            value.clear();
            value.extend_from_slice(&claimed.to_le_bytes());
            batch.encode_into(&mut value);
            // The sequence is this writer's alone: no CAS (0 writes unconditionally).
            return match store.set(self.slot_key(claimed), &value, 0) {
                SetOutcome::Failed => Err(AppendError::Unavailable),
                _ => Ok(claimed),
            };
        }
        Err(AppendError::Contended)
    }

    /// Stores `rider`'s bytes in the head, keeping its sequence number and
    /// generation (from the hint of the last read, else a fresh read; CAS retries).
    /// Whether they were stored (or there was nothing to store).
    pub fn ride(&self, store: &dyn SharedStore, rider: &dyn Rider) -> bool {
        for _ in 0..CAS_ATTEMPTS {
            let Some(head) = self.take_head(store) else {
                return false;
            };
            let Some(rewritten) = rider.rewrite(&self.tail.borrow()) else {
                // Nothing to store: the read still serves the next write.
                self.head_hint.set(Some(head));
                return true;
            };
            match self.write_head(store, (head, head.seq), Some(rewritten), rider) {
                SetOutcome::Stored => return true,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return false,
            }
        }
        false
    }

    /// Applies every operation from `*cursor` up to the head (or up to a slot not yet
    /// written: see the module's doc; `now_ms` times it), in order, and moves the
    /// cursor. `apply(seq, op)` gets each decodable operation.
    pub fn catch_up(
        &self,
        store: &dyn SharedStore,
        cursor: &mut u64,
        now_ms: u64,
        mut apply: impl FnMut(u64, OpRef<'_>),
    ) -> CatchUp {
        self.catch_up_past(
            store,
            cursor,
            now_ms,
            |_| false,
            |seq, bytes| OpRef::decode(bytes).map(|op| apply(seq, op)).is_some(),
        )
    }

    /// `catch_up`, passing over the sequences `mine` names without reading them
    /// (batches the caller applied when it recorded them: reading one back is a
    /// `get` of kilobytes and a decode of every text in it, for nothing), and
    /// giving `apply` each operation encoded: it decodes and applies it and says
    /// whether it was well formed (garbage counts as a gap). The VMs decode as
    /// they apply (`crate::request::router::Router::apply_encoded`), an insert's text
    /// checked as UTF-8 only past what the tree holds of it.
    pub fn catch_up_past(
        &self,
        store: &dyn SharedStore,
        cursor: &mut u64,
        now_ms: u64,
        mine: impl Fn(u64) -> bool,
        apply: impl FnMut(u64, &[u8]) -> bool,
    ) -> CatchUp {
        self.walk_past(store, cursor, (u64::MAX, now_ms), mine, apply)
    }

    /// Reads the raw operations from `*cursor` up to the head, at most `max`
    /// sequences of them (a sequence holds a batch: one operation or more), and moves
    /// the cursor past them; it stops early at a slot not yet written, unless that
    /// has lasted `HOLE_PATIENCE_MS` by `now_ms`. `read(seq, bytes)` gets each
    /// operation and returns whether it was well formed (garbage counts as a gap).
    /// The replica export reads this way: it stops early, and skips what is not its
    /// own.
    pub fn walk(
        &self,
        store: &dyn SharedStore,
        cursor: &mut u64,
        max: u64,
        now_ms: u64,
        read: impl FnMut(u64, &[u8]) -> bool,
    ) -> CatchUp {
        self.walk_past(store, cursor, (max, now_ms), |_| false, read)
    }

    fn walk_past(
        &self,
        store: &dyn SharedStore,
        cursor: &mut u64,
        (max, now_ms): (u64, u64),
        mine: impl Fn(u64) -> bool,
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
            if mine(seq) {
                *cursor += 1;
                continue;
            }
            let value = store.get(self.slot_key(seq)).map(|(v, _)| v);
            match slot_for(seq, value.as_deref()) {
                Slot::Written(payload) => {
                    let (applied, gaps) = read_payload(payload, |op| read(seq, op));
                    out.applied += applied;
                    out.gaps += gaps;
                }
                // Overwritten by a writer a whole ring ahead, or garbage.
                Slot::Lost => out.gaps += 1,
                Slot::Unwritten if self.waited_out(seq, now_ms) => out.gaps += 1,
                Slot::Unwritten => break,
            }
            *cursor += 1;
        }
        out
    }

    /// Whether the unwritten slot of `seq` has kept readers waiting long enough to
    /// be skipped; starts its clock the first time.
    fn waited_out(&self, seq: u64, now_ms: u64) -> bool {
        match self.hole.get() {
            Some((s, since)) if s == seq => now_ms.saturating_sub(since) >= HOLE_PATIENCE_MS,
            _ => {
                self.hole.set(Some((seq, now_ms)));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::ops::insert_op;
    use super::super::testing::{owned, ring, MemStore};
    use super::super::Op;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn appended_ops_are_read_in_order_by_every_reader() {
        let store = MemStore::default();
        let ring = ring(&store, 8);
        for i in 0..5 {
            assert_eq!(
                ring.append_one(&store, &insert_op(&format!("t{i}"), "w").encode()),
                Ok(i)
            );
        }
        let mut cursor = 0;
        let mut seen = Vec::new();
        let c = ring.catch_up(&store, &mut cursor, 0, |seq, op| {
            seen.push((seq, owned(op)))
        });
        assert_eq!(
            c,
            CatchUp {
                applied: 5,
                gaps: 0
            }
        );
        assert_eq!(cursor, 5);
        assert_eq!(seen[3], (3, insert_op("t3", "w")));
        let again = ring.catch_up(&store, &mut cursor, 0, |_, _| panic!("nothing new"));
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
            a.catch_up(&store, &mut cursor, 0, |_, _| {});
            let start = a.head(&store).unwrap();
            for i in 0..others {
                assert_eq!(b.append_one(&store, &op(start + i)), Ok(start + i));
            }
            let mine = start + others;
            assert_eq!(
                a.append_one(&store, &op(mine)),
                Ok(mine),
                "the next sequence"
            );
            assert_eq!(a.head(&store), Some(mine + 1));
            let mut read = mine.saturating_sub(3);
            let mut seen = Vec::new();
            a.catch_up(&store, &mut read, 0, |seq, op| seen.push((seq, owned(op))));
            let want: Vec<_> = (mine.saturating_sub(3)..=mine)
                .map(|i| (i, insert_op(&format!("t{i}"), "w")))
                .collect();
            assert_eq!(seen, want, "every sequence holds its own operation");
        }
    }

    #[test]
    fn a_reader_a_ring_behind_counts_the_gap() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        for i in 0..10 {
            ring.append_one(&store, &insert_op(&format!("t{i}"), "w").encode())
                .unwrap();
        }
        let mut cursor = 0;
        let mut seqs = Vec::new();
        let c = ring.catch_up(&store, &mut cursor, 0, |seq, _| seqs.push(seq));
        assert_eq!(
            c,
            CatchUp {
                applied: 4,
                gaps: 6
            }
        );
        assert_eq!(seqs, vec![6, 7, 8, 9], "only what the ring still holds");
    }

    fn texts(ring: &OpRing, store: &dyn SharedStore, cursor: &mut u64, now: u64) -> Vec<String> {
        let mut texts = Vec::new();
        ring.catch_up(store, cursor, now, |_, op| {
            if let Op::Insert { text, .. } = op {
                texts.push(text.to_string())
            }
        });
        texts
    }

    /// Another writer claims the next sequence and has not written its slot yet.
    fn claim_without_writing(store: &MemStore, seq: u64) {
        store.set("t.ring.head", &encode_head(seq + 1, 0, &[]), 0);
    }

    #[test]
    fn readers_wait_for_a_claimed_slot_and_skip_it_once_it_is_overdue() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        claim_without_writing(&store, 0);
        assert_eq!(
            ring.append_one(&store, &insert_op("next", "w").encode()),
            Ok(1)
        );
        let mut cursor = 0;
        assert!(texts(&ring, &store, &mut cursor, 0).is_empty(), "held at 0");
        assert_eq!(cursor, 0);
        // The first writer's slot write lands.
        let mut v = 0u64.to_le_bytes().to_vec();
        v.extend(insert_op("late", "w").encode());
        store.set("t.ring.slot.0", &v, 0);
        assert_eq!(texts(&ring, &store, &mut cursor, 10), vec!["late", "next"]);

        // A writer that never writes its slot holds readers back for the patience.
        claim_without_writing(&store, 2);
        assert_eq!(
            ring.append_one(&store, &insert_op("after", "w").encode()),
            Ok(3)
        );
        assert!(texts(&ring, &store, &mut cursor, 100).is_empty());
        assert!(texts(&ring, &store, &mut cursor, 100 + HOLE_PATIENCE_MS - 1).is_empty());
        let mut seen = Vec::new();
        let got = ring.catch_up(&store, &mut cursor, 100 + HOLE_PATIENCE_MS, |seq, _| {
            seen.push(seq)
        });
        assert_eq!(
            (got, seen),
            (
                CatchUp {
                    applied: 1,
                    gaps: 1
                },
                vec![3]
            )
        );
        assert_eq!(cursor, 4);
    }

    #[test]
    fn an_append_after_a_catch_up_reads_nothing() {
        let store = super::super::testing::Counting::default();
        let ring = ring(&store, 4);
        let mut cursor = 0;
        ring.catch_up(&store, &mut cursor, 0, |_, _| {});
        store.gets.set(0);
        assert_eq!(ring.append_one(&store, &Op::Evict.encode()), Ok(0));
        assert_eq!(store.gets.get(), 0, "the claim used the catch-up's read");
        assert_eq!(ring.append_one(&store, &Op::Evict.encode()), Ok(1));
        assert_eq!(
            store.gets.get(),
            1,
            "a read is used once: then the head is read"
        );
    }

    #[test]
    fn a_slot_reads_as_a_batch_as_a_bare_operation_and_counts_a_cut_frame() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        let mut batch = Batch::default();
        batch.push(&insert_op("a", "w"));
        batch.push_encoded(&insert_op("b", "w").encode());
        assert_eq!(ring.append_riding(&store, &batch, &NoRider), Ok(0));
        // A bare operation, as builds before batches wrote one, at sequence 1.
        claim_without_writing(&store, 1);
        let mut bare = 1u64.to_le_bytes().to_vec();
        bare.extend(insert_op("c", "w").encode());
        store.set("t.ring.slot.1", &bare, 0);
        // A batch whose second frame is cut short, at sequence 2.
        claim_without_writing(&store, 2);
        let mut cut = 2u64.to_le_bytes().to_vec();
        let mut first = Batch::default();
        first.push(&insert_op("d", "w"));
        first.encode_into(&mut cut);
        cut.extend_from_slice(&100u32.to_le_bytes());
        cut.extend_from_slice(b"short");
        store.set("t.ring.slot.2", &cut, 0);
        let mut cursor = 0;
        let mut seen = Vec::new();
        let got = ring.catch_up(&store, &mut cursor, 0, |seq, op| {
            if let Op::Insert { text, .. } = op {
                seen.push((seq, text.to_string()));
            }
        });
        assert_eq!((got.applied, got.gaps, cursor), (4, 1, 3));
        let want = [(0, "a"), (0, "b"), (1, "c"), (2, "d")];
        let want: Vec<_> = want.iter().map(|(q, t)| (*q, t.to_string())).collect();
        assert_eq!(seen, want);
    }

    #[test]
    fn catching_up_passes_over_the_callers_own_batches_without_reading_them() {
        let store = super::super::testing::Counting::default();
        let ring = ring(&store, 8);
        for text in ["a", "mine", "b"] {
            ring.append_one(&store, &insert_op(text, "w").encode())
                .unwrap();
        }
        store.gets.set(0);
        let mut cursor = 0;
        let mut seen = Vec::new();
        let got = ring.catch_up_past(
            &store,
            &mut cursor,
            0,
            |seq| seq == 1,
            |seq, bytes| {
                seen.push((seq, owned(OpRef::decode(bytes).unwrap())));
                true
            },
        );
        assert_eq!((got.applied, got.gaps, cursor), (2, 0, 3));
        assert_eq!(
            seen,
            vec![(0, insert_op("a", "w")), (2, insert_op("b", "w"))]
        );
        assert_eq!(store.gets.get(), 3, "the head and the two others' slots");
    }

    #[test]
    fn init_does_not_wipe_a_live_ring() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        ring.append_one(&store, &Op::Evict.encode()).unwrap();
        ring.init_if_missing(&store);
        assert_eq!(ring.head(&store), Some(1));
    }

    #[test]
    fn a_larger_ring_adds_slots_and_keeps_the_stream() {
        let store = MemStore::default();
        OpRing::new(&Keys::new("t"), 2).init_if_missing(&store);
        let small = OpRing::new(&Keys::new("t"), 2);
        small.append_one(&store, &Op::Evict.encode()).unwrap();
        let big = OpRing::new(&Keys::new("t"), 8);
        big.init_if_missing(&store);
        assert_eq!(big.head(&store), Some(1), "the head survives");
        for _ in 0..6 {
            big.append_one(&store, &Op::Evict.encode()).unwrap();
        }
        assert_eq!(big.head(&store), Some(7));
    }

    #[test]
    fn append_without_init_is_unavailable() {
        let store = MemStore::default();
        let ring = OpRing::new(&Keys::new("t"), 4);
        assert_eq!(
            ring.append_one(&store, &Op::Evict.encode()),
            Err(AppendError::Unavailable)
        );
    }
}
