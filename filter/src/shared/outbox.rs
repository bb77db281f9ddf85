//! The tree operations this VM recorded and has not shared yet, and when it shares
//! them: the sync window (`sync_batch_ms`).
//!
//! Sharing costs a read of the ring's head, a claim and a slot write, and every
//! other VM pays a read of the slot: in Envoy those calls cost a request more than
//! its tree work does. So a VM syncs (catches up, then appends everything it
//! recorded since its last sync as one batch under one sequence) at most once per
//! window; in between, its requests route by what it has. What a request records
//! is applied here at once, ahead of its ring place, at the clock of the sequence
//! this VM expects to claim next (its cursor): when no other VM appended in the
//! meantime, that is the sequence it gets, and every VM applies the batch at the
//! same clock; else this VM's copy is a few sequences older, which only its LRU
//! order sees (a forget undoes it all the same: `crate::tree::Tree::forget`).
//! Either way the batch is not applied here twice (`applied_ahead`): a second
//! insert of a routed text cost more than the sync it batched. A window of 0 syncs
//! on every request.
//!
//! What the window costs: another VM sees this VM's texts and in-flight counts up
//! to one window late (a conversation's next turn comes a whole answer later), and
//! an eviction that lands inside a window may find a waiting text here and not in
//! other VMs.

use std::cell::Cell;
use std::rc::Rc;

use super::batch::Batch;
use super::ring::{AppendError, OpRing, Rider};
use super::{Op, SharedStore};

/// Where a recorded operation is on its way to the other VMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Held for the next sync; applied here already at the tree clock of sequence
    /// `applied_at`, or not (`None`: a VM without a tree, or an operation every VM
    /// applies in ring order only).
    Waiting { applied_at: Option<u64> },
    /// In the ring at this sequence.
    Shared(u64),
    /// The ring refused it: applied on this VM only.
    Kept,
    /// Taken back before it was shared (its request was never served).
    Withdrawn,
}

/// One recorded operation: its stage, and while it waits, where its encoding is in
/// the batch. The operation itself is its request's (to undo it); the batch holds
/// only its bytes, so a window's texts are not kept alive in the heap in between.
#[derive(Debug)]
pub struct Recorded {
    stage: Cell<Stage>,
    /// The frame's start and length in the batch.
    frame: Cell<(usize, usize)>,
}

impl Recorded {
    pub fn stage(&self) -> Stage {
        self.stage.get()
    }
}

/// What a flush did with the waiting operations.
#[derive(Debug, PartialEq, Eq)]
pub enum Flushed {
    /// Nothing waited.
    Nothing,
    /// `ops` shared as one batch at `seq`; `ahead`: every one of them was applied
    /// here already.
    Shared { seq: u64, ops: usize, ahead: bool },
    /// The ring refused the batch (`ops` operations): they stay on this VM.
    Refused { error: AppendError, ops: usize },
}

/// A batch this big is shared at once, whatever the window: a slot's value is
/// copied whole by every reader, and the guest's count per request measured lower
/// at 64 KiB than at 256 KiB (85.0k against 88.7k, 8 requests in flight).
const MAX_BATCH_BYTES: usize = 64 * 1024;

#[derive(Debug)]
pub struct Outbox {
    waiting: Vec<Rc<Recorded>>,
    /// What waits, encoded: a buffer kept between syncs.
    batch: Batch,
    /// Whether everything waiting was applied here already.
    ahead: bool,
    window_ms: u64,
    /// When this VM last synced (`None`: never).
    synced_ms: Option<u64>,
    /// The sequences of this VM's batches that it applied ahead and its cursor has
    /// not passed yet: catching up skips them.
    claimed: Vec<u64>,
}

impl Outbox {
    pub fn new(window_ms: u64) -> Outbox {
        Outbox {
            waiting: Vec::new(),
            batch: Batch::default(),
            ahead: true,
            window_ms,
            synced_ms: None,
            claimed: Vec::new(),
        }
    }

    pub fn set_window(&mut self, window_ms: u64) {
        self.window_ms = window_ms;
    }

    /// Whether requests sync less often than each one (a window above 0).
    pub fn windowed(&self) -> bool {
        self.window_ms > 0
    }

    /// Whether a request at `now_ms` syncs: the window has passed since the last
    /// sync (always, for a window of 0).
    pub fn due(&self, now_ms: u64) -> bool {
        self.window_ms == 0
            || self
                .synced_ms
                .is_none_or(|at| now_ms.saturating_sub(at) >= self.window_ms)
    }

    /// Whether anything waits to be shared.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Whether what waits is big enough to be shared now (`MAX_BATCH_BYTES`).
    pub fn full(&self) -> bool {
        self.batch.bytes() >= MAX_BATCH_BYTES
    }

    /// Holds `op` for the next flush, applied here already at the clock of
    /// sequence `applied_at` (or not: `None`).
    pub fn push(&mut self, op: &Op, applied_at: Option<u64>) -> Rc<Recorded> {
        let rec = Rc::new(Recorded {
            stage: Cell::new(Stage::Waiting { applied_at }),
            frame: Cell::new(self.batch.push(op)),
        });
        self.ahead &= applied_at.is_some();
        self.waiting.push(Rc::clone(&rec));
        rec
    }

    /// Takes `rec` back if it still waits (its bytes leave the batch). Whether it
    /// did.
    pub fn withdraw(&mut self, rec: &Rc<Recorded>) -> bool {
        let Some(pos) = self.waiting.iter().position(|w| Rc::ptr_eq(w, rec)) else {
            return false;
        };
        self.waiting.remove(pos);
        let (start, len) = rec.frame.get();
        self.batch.remove(start, len);
        for later in self.waiting.iter().skip(pos) {
            let (s, l) = later.frame.get();
            later.frame.set((s.saturating_sub(len), l));
        }
        rec.stage.set(Stage::Withdrawn);
        true
    }

    /// Appends what waits to `ring` as one batch, with `rider`'s bytes on the
    /// claim, and starts a new window at `now_ms`. Nothing waiting writes nothing
    /// (the caller publishes its counts its own way).
    pub fn flush(
        &mut self,
        store: &dyn SharedStore,
        ring: &OpRing,
        rider: &dyn Rider,
        now_ms: u64,
    ) -> Flushed {
        self.synced_ms = Some(now_ms);
        if self.waiting.is_empty() {
            return Flushed::Nothing;
        }
        let appended = ring.append_riding(store, &self.batch, rider);
        let (ops, ahead) = (self.waiting.len(), self.ahead);
        let stage = match appended {
            Ok(seq) => Stage::Shared(seq),
            Err(_) => Stage::Kept,
        };
        for rec in self.waiting.drain(..) {
            rec.stage.set(stage);
        }
        self.batch.clear();
        self.ahead = true;
        match appended {
            Ok(seq) => {
                if ahead {
                    self.claimed.push(seq);
                }
                Flushed::Shared { seq, ops, ahead }
            }
            Err(error) => Flushed::Refused { error, ops },
        }
    }

    /// Whether sequence `seq` holds a batch of this VM's that it applied ahead.
    pub fn applied_ahead(&self, seq: u64) -> bool {
        self.claimed.contains(&seq)
    }

    /// The cursor reached `cursor`: the batches below it are behind.
    pub fn passed(&mut self, cursor: u64) {
        self.claimed.retain(|&seq| seq >= cursor);
    }
}

#[cfg(test)]
mod tests {
    use super::super::ops::insert_op;
    use super::super::ring::NoRider;
    use super::super::testing::{ring, Counting, MemStore};
    use super::super::Keys;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_window_of_zero_is_always_due_and_a_window_runs_from_the_last_sync() {
        let store = MemStore::default();
        let ring = ring(&store, 8);
        assert!(Outbox::new(0).due(0));
        let mut out = Outbox::new(5);
        assert!(out.due(100), "never synced");
        assert_eq!(out.flush(&store, &ring, &NoRider, 100), Flushed::Nothing);
        assert!(!out.due(100), "a flush of nothing starts a window too");
        assert!(!out.due(104));
        assert!(out.due(105));
        out.set_window(0);
        assert!(out.due(100));
    }

    fn texts(ring: &OpRing, store: &dyn SharedStore, cursor: &mut u64) -> Vec<(u64, String)> {
        let mut seen = Vec::new();
        let got = ring.catch_up(store, cursor, 0, |seq, op| {
            if let Op::Insert { text, .. } = op {
                seen.push((seq, text.to_string()));
            }
        });
        assert_eq!(got.gaps, 0);
        seen
    }

    #[test]
    fn a_flush_shares_what_waits_as_one_batch_in_order_without_what_was_withdrawn() {
        let store = Counting::default();
        let ring = ring(&store, 8);
        let mut out = Outbox::new(5);
        let a = out.push(&insert_op("a", "w1"), Some(0));
        let b = out.push(&insert_op("bb", "w2"), Some(0));
        let c = out.push(&insert_op("ccc", "w1"), Some(0));
        let d = out.push(&insert_op("dddd", "w1"), Some(0));
        assert!(out.withdraw(&b));
        assert_eq!(b.stage(), Stage::Withdrawn);
        assert!(!out.withdraw(&b), "once");
        assert!(out.withdraw(&d), "the last one too");
        assert_eq!(
            a.stage(),
            Stage::Waiting {
                applied_at: Some(0)
            }
        );
        store.gets.set(0);
        let flushed = out.flush(&store, &ring, &NoRider, 0);
        assert_eq!(
            flushed,
            Flushed::Shared {
                seq: 0,
                ops: 2,
                ahead: true
            }
        );
        assert!(store.gets.get() <= 1, "one read of the head at most");
        assert_eq!((a.stage(), c.stage()), (Stage::Shared(0), Stage::Shared(0)));
        assert!(out.is_empty());
        assert!(out.applied_ahead(0));
        let mut cursor = 0;
        assert_eq!(
            texts(&ring, &store, &mut cursor),
            vec![(0, "a".to_string()), (0, "ccc".to_string())],
            "one sequence, the batch's order, the withdrawn ones absent"
        );
        assert_eq!(out.flush(&store, &ring, &NoRider, 1), Flushed::Nothing);
        // A batch not all applied ahead is not skipped by catching up.
        out.push(&insert_op("e", "w1"), Some(1));
        out.push(&insert_op("f", "w1"), None);
        let flushed = out.flush(&store, &ring, &NoRider, 2);
        assert_eq!(
            flushed,
            Flushed::Shared {
                seq: 1,
                ops: 2,
                ahead: false
            }
        );
        assert!(!out.applied_ahead(1));
        out.passed(0);
        assert!(out.applied_ahead(0), "the cursor is not past it");
        out.passed(1);
        assert!(!out.applied_ahead(0));
    }

    #[test]
    fn a_refused_flush_keeps_the_operations_here() {
        let store = MemStore::default();
        // No ring keys: the append is unavailable.
        let ring = OpRing::new(&Keys::new("t"), 8);
        let mut out = Outbox::new(5);
        let a = out.push(&insert_op("a", "w1"), Some(0));
        assert_eq!(
            out.flush(&store, &ring, &NoRider, 0),
            Flushed::Refused {
                error: AppendError::Unavailable,
                ops: 1
            }
        );
        assert_eq!(a.stage(), Stage::Kept);
        assert!(out.is_empty());
        assert!(!out.applied_ahead(0));
    }

    #[test]
    fn a_batch_is_full_at_its_byte_bound() {
        let mut out = Outbox::new(5);
        let text = "x".repeat(MAX_BATCH_BYTES / 4);
        for _ in 0..3 {
            out.push(&insert_op(&text, "w"), None);
            assert!(!out.full());
        }
        out.push(&insert_op(&text, "w"), None);
        assert!(out.full());
    }
}
