//! A routed request's bookkeeping on the host: the in-flight counts it holds until
//! its stream ends, its metrics (`crate::request::bookkeeping::Booking`), the tree
//! operations its plan records, and their undoing if no engine served it.

use std::rc::Rc;

use super::host::{self, HostStore};
use super::state::State;
use super::telling;
use crate::decision::Decision;
use crate::parse::{self, Parsed};
use crate::policy::predicted_ttft::WorkHold;
use crate::relay::{Booked, Counted, Event, Leg, Note, Part, RecordMeta};
use crate::request::bookkeeping::booking;
use crate::request::plan::Plan;
use crate::request::router::Record;
use crate::shared::{truncate_text, Op, Recorded, Stage};

/// An in-flight count held on a worker, by name: counts are keyed by name, so one is
/// released correctly even if a config update reorders the workers meanwhile. The
/// count is this VM's (`crate::shared::InflightTable`): kept in memory even when
/// its publication failed, so it is released whatever happened to the write. Or,
/// for a request the routing VM decided (`route_in: one_vm`), the routing VM's,
/// which this VM tells of the request's first byte and end (`super::telling`).
pub struct Held {
    worker: String,
    counted: bool,
    by: CountedBy,
}

/// Whose count a request holds.
#[derive(Debug, Clone, Copy)]
enum CountedBy {
    This,
    /// The routing VM's, for this VM's stream `ctx`; `timed`: with a prefill
    /// booking, whose first byte and end this VM times for the routing VM to learn
    /// costs by.
    Router {
        ctx: u32,
        leg: Leg,
        timed: Option<Timed>,
    },
}

/// When a booked request's answer was applied, and when its first byte came.
#[derive(Debug, Clone, Copy)]
struct Timed {
    since_ms: u64,
    first_ms: Option<u64>,
}

impl Held {
    /// Published by this VM's next sync: `book`'s, if the request syncs.
    fn take(state: &State, worker: &str) -> Held {
        take_count(state, worker);
        Held {
            worker: worker.to_string(),
            counted: true,
            by: CountedBy::This,
        }
    }

    /// The count the routing VM took for this VM's stream `ctx` (`booked`: with
    /// `predicted_ttft`'s prefill booking, the answer applied at `now`).
    fn told(
        state: &State,
        worker: &str,
        (ctx, leg): (u32, Leg),
        booked: Option<Booked>,
        now: u64,
    ) -> Held {
        if let Part::Asker { tell, .. } = &state.relay {
            tell.counted(Counted {
                ctx,
                leg,
                worker: worker.to_string(),
                booked,
            });
        }
        let timed = booked.map(|_| Timed {
            since_ms: now,
            first_ms: None,
        });
        Held {
            worker: worker.to_string(),
            counted: true,
            by: CountedBy::Router { ctx, leg, timed },
        }
    }

    /// The worker, by name: what the response headers name, even if the worker list
    /// changed (and indices moved) while the request ran.
    pub fn worker(&self) -> &str {
        &self.worker
    }

    /// Gives the count back, at most once. This VM's last count is published at
    /// once, by the stream's `settle` when records wait (one write for both).
    pub fn release(&mut self, state: &State) {
        if !std::mem::take(&mut self.counted) {
            return;
        }
        match self.by {
            CountedBy::This => release_count(state, &self.worker),
            CountedBy::Router { ctx, leg, timed } => {
                let streamed_ms = timed
                    .and_then(|t| t.first_ms)
                    .map(|first| host::now_ms().saturating_sub(first));
                let end = Note {
                    ctx,
                    leg,
                    event: Event::End { streamed_ms },
                };
                // A booked request's notes go at once (`crate::relay::tell`).
                telling::note(state, end, (true, timed.is_some()));
            }
        }
    }

    /// The request's first response byte: the routing VM's booking of its
    /// prefill is given back (this VM's own is `first_byte`'s), with the time it
    /// took, at most once.
    pub fn first_byte(&mut self, state: &State) {
        let CountedBy::Router {
            ctx,
            leg,
            timed: Some(t),
        } = &mut self.by
        else {
            return;
        };
        if t.first_ms.is_some() {
            return;
        }
        let now = host::now_ms();
        t.first_ms = Some(now);
        let first = Note {
            ctx: *ctx,
            leg: *leg,
            event: Event::FirstByte {
                after_ms: now.saturating_sub(t.since_ms),
            },
        };
        telling::note(state, first, (true, true));
    }
}

/// The counts a routed request holds on `worker` for `d`: this VM's, with
/// `predicted_ttft`'s booking of its prefill (other policies: none) published with
/// them, at the clock the request read; or, for the stream and leg `told`, the
/// routing VM's, which learns the costs from what this VM times.
pub fn count(
    state: &State,
    worker: &str,
    d: &Decision,
    told: Option<(u32, Leg)>,
) -> (Held, Option<WorkHold>) {
    if let Some(p) = d.predicted {
        state.metrics.predicted_ttft_ms.set(p.ttft_us / 1000);
    }
    let now = state.shared.recent_ms.get();
    match told {
        None => {
            let work = d
                .predicted
                .map(|p| WorkHold::take(&state.shared.inflight, worker, &p, now));
            (Held::take(state, worker), work)
        }
        Some(stream) => {
            let booked = d.predicted.as_ref().map(Booked::of);
            (Held::told(state, worker, stream, booked, now), None)
        }
    }
}

/// Counts a request in flight on `worker` in this VM's row.
pub fn take_count(state: &State, worker: &str) {
    state.shared.inflight.take(worker);
}

/// Gives back a count `take_count` took; this VM's last is published at once.
pub fn release_count(state: &State, worker: &str) {
    let last = state.shared.inflight.release(worker);
    publish_last(state, last);
}

/// Gives back a prefill booking of `chars` on `worker` taken in this VM's row
/// directly (the routing VM's, for another VM's request).
pub fn release_booking(state: &State, worker: &str, chars: u64) {
    let last = state.shared.inflight.release_prefill(worker, chars);
    publish_last(state, last);
}

/// Publishes this VM's counts when a release gave back its last (`last`), unless
/// records wait: the stream's `settle` then writes both at once.
fn publish_last(state: &State, last: bool) {
    let s = &state.shared;
    if last && s.outbox.is_empty() {
        s.inflight.flush(&HostStore, &s.ring, s.recent_ms.get());
    }
}

/// The first response byte of a booked request (a streamed answer calls this for
/// every chunk; only the first counts, and only it reads the clock).
pub fn first_byte(state: &State, hold: &mut Option<WorkHold>) {
    if let Some(h) = hold.as_mut() {
        let s = &state.shared;
        let tables = (&s.inflight, &s.costs, state.router.names());
        let memory_ms = state.router.config().stale_after_ms;
        let last = h.first_byte(&HostStore, tables, (super::host::now_ms, memory_ms));
        publish_last(state, last);
    }
}

/// The end of a booked request's stream (or prefill call).
pub fn end_work(state: &State, hold: &mut Option<WorkHold>) {
    if let Some(h) = hold.as_mut() {
        let s = &state.shared;
        let tables = (&s.inflight, &s.costs, state.router.names());
        let memory_ms = state.router.config().stale_after_ms;
        let last = h.end(&HostStore, tables, (super::host::now_ms, memory_ms));
        publish_last(state, last);
    }
}

/// What undoes a routed request's tree records if no engine serves it: each
/// record's insert, moved here (not copied), with how many chars of its text its
/// worker held before it; or, for a request the routing VM decided
/// (`route_in: one_vm`), what it says of its records and the body their text is
/// read again from.
#[derive(Default)]
pub struct Undo {
    records: Vec<(Rc<Recorded>, Op, u64)>,
    remote: Option<Remote>,
}

/// The routing VM's records of one request, and its body and path.
struct Remote {
    records: Vec<RecordMeta>,
    body: Vec<u8>,
    path: Option<String>,
}

impl Undo {
    pub fn remote(records: Vec<RecordMeta>, body: Vec<u8>, path: Option<String>) -> Undo {
        Undo {
            records: Vec::new(),
            remote: (!records.is_empty()).then_some(Remote {
                records,
                body,
                path,
            }),
        }
    }

    /// The records as the routing VM reports them to the VM that asked.
    pub fn report(&self) -> Vec<RecordMeta> {
        self.records
            .iter()
            .filter_map(|(rec, op, keep_chars)| {
                let Op::Insert { pool, worker, .. } = op else {
                    return None;
                };
                let seq = match rec.stage() {
                    Stage::Waiting {
                        applied_at: Some(seq),
                    }
                    | Stage::Shared(seq) => seq,
                    _ => return None,
                };
                Some(RecordMeta {
                    pool: *pool,
                    worker: worker.clone(),
                    keep_chars: *keep_chars,
                    seq,
                })
            })
            .collect()
    }
}

// `book` turns a plan's records into their undoing in the records' own allocation,
// which std does only for items of the same size and alignment.
const _: () = {
    use std::mem::{align_of, size_of};
    type Undone = (Rc<Recorded>, Op, u64);
    assert!(size_of::<Record>() == size_of::<Undone>());
    assert!(align_of::<Record>() == align_of::<Undone>());
};

/// Counts the routed request (whose routing text had `text_chars` chars) and
/// records its tree operations: shared now if the request syncs (its in-flight
/// counts riding on the claim, or written alone when nothing was recorded), else
/// at a later sync (`crate::shared::Outbox`); returns the records' undoing.
pub fn book(state: &mut State, plan: Plan, text_chars: usize) -> Undo {
    state.metrics.book(&booking(&plan), text_chars);
    record(state, plan)
}

/// Records the plan's tree operations, as `book` does, without counting the
/// request (the routing VM deciding for another VM, which counts it).
pub fn record(state: &mut State, plan: Plan) -> Undo {
    // Mapped in place: a record and its undoing are the same size (asserted above),
    // so std reuses the plan's list for them instead of allocating another per request.
    let undo = Undo {
        records: plan
            .records
            .into_iter()
            .map(|Record { op, held_chars, .. }| (state.record(&op), op, held_chars))
            .collect(),
        remote: None,
    };
    if state.sync_due() || state.shared.outbox.full() {
        state.flush();
    }
    undo
}

/// A routed request no engine served: counts it (`llm_router_unserved`) and
/// forgets what it recorded under `worker` (its main upstream failed; a prefill
/// that served its part keeps it), or under every worker (`None`: the filter
/// answered it after routing). A record still waiting for its sync is taken back
/// and forgotten here only; a shared one is forgotten by every VM; one the ring
/// refused is left.
pub fn unserved(state: &mut State, undo: Undo, worker: Option<&str>) {
    state.metrics.unserved.inc();
    forget(state, undo, worker);
}

/// Forgets what `undo` undoes under `worker` (`None`: under every worker).
pub fn forget(state: &mut State, undo: Undo, worker: Option<&str>) {
    if let Some(remote) = undo.remote {
        forget_remote(state, remote, worker);
    }
    for (rec, op, held_chars) in undo.records {
        let ours = match (&op, worker) {
            (Op::Insert { worker: w, .. }, Some(only)) => w == only,
            _ => true,
        };
        if !ours {
            continue;
        }
        match rec.stage() {
            Stage::Waiting {
                applied_at: Some(seq),
            } => {
                state.shared.outbox.withdraw(&rec);
                if let Some(forget) = op.into_forget(held_chars, seq) {
                    state.router.apply(seq, &forget);
                }
            }
            Stage::Shared(seq) => {
                if let Some(forget) = op.into_forget(held_chars, seq) {
                    // Shared by the stream's `settle`, or a later sync.
                    state.record(&forget);
                }
            }
            // Not applied here, or kept here only (the ring refused it): left.
            Stage::Waiting { applied_at: None } | Stage::Kept | Stage::Withdrawn => {
                state.shared.outbox.withdraw(&rec);
            }
        }
    }
}

/// Undoes the routing VM's records of a request this VM asked about: the text read
/// again from its body, each `Forget` shared in the ring, which the routing VM
/// applies as it catches up.
fn forget_remote(state: &mut State, remote: Remote, worker: Option<&str>) {
    let Parsed::Routable(r) = parse::read(&remote.body).parsed(remote.path.as_deref()) else {
        return;
    };
    let text = truncate_text(&r.text, state.router.config().max_routing_text_bytes).to_string();
    for m in remote.records {
        if worker.is_some_and(|only| only != m.worker) {
            continue;
        }
        state.record(&Op::Forget {
            pool: m.pool,
            model: r.model.clone(),
            worker: m.worker,
            text: text.clone(),
            keep_chars: m.keep_chars,
            seq: m.seq,
        });
    }
}
