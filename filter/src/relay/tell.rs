//! What an asking VM tells the routing VM of the requests the routing VM counts
//! for it (`super::holds`): each request's first byte (when it booked prefill)
//! and its end. While the VM asks at least once a sync window (`sync_batch_ms`),
//! notes ride on its next question for free; a note written when the VM has not
//! asked for a window goes alone at once, as does the end of the VM's last
//! counted request, so an idle VM never leaves the router counting load it does
//! not hold. A note that waits is sent by the VM's next event after a window (a
//! question, another note, its tick). Meanwhile the router sees an ended request's
//! worker busier than it is: it steers away a little longer, never onto it.
//!
//! `predicted_ttft`'s notes go at once (`urgent`): the router's next prediction
//! counts a booked request's prefill until it hears the first byte, and learns the
//! engine's speed from the time it carries. Told at once, its decisions at any
//! thread count are one VM's (the workload family: the same on 40 seeds of 40;
//! batched, within 0.002 on 27); a note alone costs the asking thread a queue
//! write and the routing thread a wake-up.
//!
//! It also keeps what the routing VM counts for this VM, request by request: a new
//! routing VM (after a takeover) never counted those, and is told them
//! (`super::wire::Retold`).
//!
//! Kept in cells: a stream gives its counts back where the host state is only
//! borrowed (`glue::bookkeeping::Held`).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use super::wire::{Counted, Event, Leg, Note};

#[derive(Debug, Default)]
pub struct Tell {
    notes: RefCell<Vec<Note>>,
    /// When the oldest waiting note was written.
    since_ms: Cell<Option<u64>>,
    /// When this VM last told the routing VM anything (a question, or notes).
    told_ms: Cell<u64>,
    /// The requests (legs) the routing VM counts for this VM, by stream and leg:
    /// what a new routing VM is told (`holding`).
    counted: RefCell<HashMap<(u32, Leg), Counted>>,
    /// A waiting note must go at once.
    urgent: Cell<bool>,
}

impl Tell {
    /// The routing VM counts one more of this VM's requests.
    pub fn counted(&self, c: Counted) {
        self.counted.borrow_mut().insert((c.ctx, c.leg), c);
    }

    /// Writes `note`; `counted`: of a request the routing VM counts for this VM
    /// (an end for a request it answered too late, or for a stream gone before
    /// its answer, is told all the same: the router counts it until then);
    /// `urgent`: it goes at once.
    pub fn note(&self, note: Note, (counted, urgent): (bool, bool), now_ms: u64) {
        if urgent {
            self.urgent.set(true);
        }
        if counted {
            let mut all = self.counted.borrow_mut();
            match note.event {
                Event::End { .. } => {
                    all.remove(&(note.ctx, note.leg));
                }
                Event::FirstByte { .. } => {
                    if let Some(c) = all.get_mut(&(note.ctx, note.leg)) {
                        c.booked = None;
                    }
                }
            }
        }
        self.notes.borrow_mut().push(note);
        if self.since_ms.get().is_none() {
            self.since_ms.set(Some(now_ms));
        }
    }

    /// Whether the notes go alone now: no question carried any for `window_ms`
    /// (the oldest waited that long, or this VM has not asked for that long), or
    /// none is left counted; or, with requests counted, nothing was told for
    /// `beat_ms` (the router keeps this VM's holds while it hears from it).
    pub fn due(&self, now_ms: u64, window_ms: u64, beat_ms: u64) -> bool {
        if self.urgent.get() {
            return true;
        }
        let counting = self.counting() > 0;
        let quiet = now_ms.saturating_sub(self.told_ms.get());
        match self.since_ms.get() {
            Some(since) => {
                !counting || now_ms.saturating_sub(since) >= window_ms || quiet >= window_ms
            }
            None => counting && quiet >= beat_ms,
        }
    }

    /// The waiting notes, told now (on a question, or alone).
    pub fn take(&self, now_ms: u64) -> Vec<Note> {
        self.told_ms.set(now_ms);
        self.since_ms.set(None);
        self.urgent.set(false);
        std::mem::take(&mut *self.notes.borrow_mut())
    }

    /// This VM's requests the routing VM counts.
    pub fn counting(&self) -> usize {
        self.counted.borrow().len()
    }

    /// Every request the routing VM counts for this VM, as a new routing VM is told
    /// them (it did not count them), bookings still held included.
    pub fn holding(&self) -> Vec<Counted> {
        self.counted.borrow().values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::wire::Booked;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn counted(t: &Tell, ctx: u32) {
        t.counted(Counted {
            ctx,
            leg: Leg::Main,
            worker: format!("w{ctx}"),
            booked: None,
        });
    }

    fn end(ctx: u32) -> Note {
        Note {
            ctx,
            leg: Leg::Main,
            event: Event::ENDED,
        }
    }

    #[test]
    fn notes_wait_a_window_while_requests_are_counted() {
        let t = Tell::default();
        counted(&t, 1);
        counted(&t, 2);
        t.take(99);
        t.note(end(1), (true, false), 100);
        assert_eq!(t.counting(), 1);
        assert!(
            !t.due(100, 2, 1_000),
            "asked a moment ago, one request counted"
        );
        assert!(t.due(102, 2, 1_000), "waited a window");
        assert_eq!(t.take(102), vec![end(1)]);
        assert!(!t.due(103, 2, 1_000));
        // A VM that has not asked for a window tells at once.
        t.note(end(2), (false, false), 110);
        assert!(t.due(110, 2, 1_000));
    }

    #[test]
    fn the_last_counted_end_goes_at_once() {
        let t = Tell::default();
        counted(&t, 1);
        t.note(
            Note {
                ctx: 1,
                leg: Leg::Main,
                event: Event::FirstByte { after_ms: 3 },
            },
            (true, false),
            0,
        );
        assert_eq!(t.counting(), 1, "a first byte is no end");
        assert!(!t.due(0, 2, 1_000));
        t.note(end(1), (true, false), 0);
        assert!(t.due(0, 2, 1_000));
        assert_eq!(t.take(0).len(), 2);
        // The end of an answer that came too late counts nothing down.
        counted(&t, 7);
        t.note(end(7), (false, false), 1);
        assert_eq!(t.counting(), 1);
        assert!(
            !t.due(1, 2, 1_000),
            "asked a moment ago, one request counted"
        );
    }

    #[test]
    fn a_vm_with_counted_requests_beats_and_an_idle_one_is_silent() {
        let t = Tell::default();
        assert!(!t.due(10_000, 2, 1_000), "nothing counted, nothing to tell");
        counted(&t, 1);
        t.take(500);
        assert!(!t.due(1_499, 2, 1_000));
        assert!(t.due(1_500, 2, 1_000));
        assert!(t.take(1_500).is_empty());
        assert!(!t.due(1_600, 2, 1_000));
    }

    #[test]
    fn an_urgent_note_goes_at_once_and_only_until_told() {
        let t = Tell::default();
        counted(&t, 1);
        counted(&t, 2);
        t.take(100);
        t.note(end(1), (true, true), 100);
        assert!(
            t.due(100, 2, 1_000),
            "with a request still counted and a question just sent"
        );
        t.take(100);
        t.note(end(2), (false, false), 100);
        assert!(!t.due(100, 2, 1_000), "the next is batched again");
    }

    #[test]
    fn a_new_router_is_told_what_is_still_counted_with_the_bookings_still_held() {
        let t = Tell::default();
        let booked = Booked {
            chars: 800,
            work_chars: 1_600,
        };
        for ctx in [1, 2, 3] {
            t.counted(Counted {
                ctx,
                leg: Leg::Main,
                worker: "w0".into(),
                booked: Some(booked),
            });
        }
        let first = |ctx| Note {
            ctx,
            leg: Leg::Main,
            event: Event::FirstByte { after_ms: 9 },
        };
        t.note(first(2), (true, true), 0);
        t.note(end(3), (true, true), 0);
        let mut held: Vec<(u32, Option<Booked>)> =
            t.holding().into_iter().map(|c| (c.ctx, c.booked)).collect();
        held.sort_by_key(|(ctx, _)| *ctx);
        assert_eq!(held, vec![(1, Some(booked)), (2, None)]);
    }
}
