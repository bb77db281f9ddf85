//! The routing VM answering questions (`route_in: one_vm`): each decided as a
//! request of its own (`super::decide`), its tree operations recorded, its counts
//! held until the asking VM tells its end (`crate::relay::holds`), and the answer
//! sent to the asking VM's queue.

use super::bookkeeping;
use super::decide::decide;
use super::host::{self, HostStore};
use super::hostcalls;
use super::state::State;
use crate::decision::Decision;
use crate::parse::{self, Parsed};
use crate::policy::predicted_ttft::{learn_end, learn_first_byte, Recall};
use crate::relay::{
    Answer, Ask, Booked, Given, Hold, Inbound, Leg, Note, Part, Refused, Routed, Verdict,
};
use crate::request::plan::Refusal;
use crate::shared::owner_expiry_ms;
use proxy_wasm::types::LogLevel;

/// Takes every message waiting on the route queue: answers each question, and
/// gives back what the notes tell.
pub fn answer_questions(state: &mut State, queue: u32) {
    while let Ok(Some(message)) = hostcalls::dequeue_shared_queue(queue) {
        take(state, &message);
    }
}

/// One message of the route queue.
pub fn take(state: &mut State, message: &[u8]) {
    match Inbound::decode(message) {
        Some(Inbound::Ask(ask)) => answer(state, &ask, host::now_ms()),
        Some(Inbound::Told(told)) => heard(state, told.reply, &told.notes, host::now_ms()),
        Some(Inbound::Retold(retold)) => {
            let now = host::now_ms();
            for c in retold.counted {
                let hold = Hold {
                    worker: c.worker,
                    booked: c.booked,
                };
                take_hold(state, (retold.reply, c.ctx, c.leg), hold, now);
            }
        }
        None => {}
    }
}

/// Decides one question and answers it; the notes it carries first.
fn answer(state: &mut State, ask: &Ask<'_>, now: u64) {
    heard(state, ask.reply, &ask.notes, now);
    let verdict = verdict(state, ask, now);
    state.metrics.relay_answered.inc();
    let answer = Answer {
        ctx: ask.ctx,
        verdict,
    };
    if let Err(e) = hostcalls::enqueue_shared_queue(ask.reply, &answer.encode()) {
        host::log(
            LogLevel::Debug,
            &format!("llm-router: an answer found no asker: {e:?}"),
        );
    }
    // Counted like a stream's end: what it counted is handed over by the same
    // budget, and at once on the tick that finds nothing held any more.
    host::request_ended(false, now);
}

/// The routing VM's answer to one question.
fn verdict(state: &mut State, ask: &Ask<'_>, now: u64) -> Verdict {
    let mut parsed = parse::read(ask.body).parsed(ask.path);
    if let Parsed::Routable(r) = &mut parsed {
        r.held = ask.held.clone();
    }
    let refused = |r: Refusal| {
        Verdict::Refused(Refused {
            status: r.status(),
            reason: r.as_str().to_string(),
            detail: r.detail(),
        })
    };
    let mut decided = match decide(state, &mut parsed, ask.body) {
        Ok(d) => d,
        Err(r) => return refused(r),
    };
    let cfg = state.router.config();
    let name = |d: &Decision| cfg.workers.get(d.worker as usize).map(|w| w.name.clone());
    let Some(main_worker) = name(&decided.plan.main) else {
        return refused(Refusal::UnknownWorker);
    };
    let prefill = match decided.plan.prefill.as_mut() {
        None => None,
        Some(leg) => match name(&leg.decision) {
            Some(worker) => Some((leg.decision, worker, std::mem::take(&mut leg.body))),
            None => return refused(Refusal::UnknownWorker),
        },
    };
    hold(
        state,
        (ask, Leg::Main),
        &main_worker,
        &decided.plan.main,
        now,
    );
    if let Some((d, worker, _)) = &prefill {
        hold(state, (ask, Leg::Prefill), worker, d, now);
    }
    let main = decided.plan.main;
    // Counted by the VM that asked, with its other counts of the request.
    let undo = bookkeeping::record(state, decided.plan);
    Verdict::Routed(Routed {
        main,
        main_worker,
        prefill,
        judged: decided.judged,
        text_chars: decided.text_chars as u64,
        records: undo.report(),
    })
}

/// Counts a request decided for another VM here, with `predicted_ttft`'s booking
/// of its prefill, until that VM tells its end (`crate::relay::holds`).
fn hold(state: &mut State, (ask, leg): (&Ask<'_>, Leg), worker: &str, d: &Decision, now: u64) {
    let hold = Hold {
        worker: worker.to_string(),
        booked: d.predicted.as_ref().map(Booked::of),
    };
    take_hold(state, (ask.reply, ask.ctx, leg), hold, now);
}

/// Takes `hold`'s counts here for the stream `ctx` of the VM answered on `reply`:
/// one this VM decided, or one a VM tells it of after a takeover.
fn take_hold(state: &mut State, (reply, ctx, leg): (u32, u32, Leg), hold: Hold, now: u64) {
    bookkeeping::take_count(state, &hold.worker);
    if let Some(b) = hold.booked {
        state.shared.inflight.book_prefill(&hold.worker, b.chars);
    }
    let replaced = match &mut state.relay {
        Part::Router { holds, .. } => holds.hold(reply, ctx, leg, hold, now),
        _ => Some(hold),
    };
    if let Some(old) = replaced {
        give_back(state, ended(old));
    }
}

/// What the VM answered on `reply` told: the holds its notes end given back.
fn heard(state: &mut State, reply: u32, notes: &[Note], now: u64) {
    let given = match &mut state.relay {
        Part::Router { holds, .. } => holds.told(reply, notes, now),
        _ => return,
    };
    let gave = !given.is_empty();
    for g in given {
        give_back(state, g);
    }
    if gave {
        // As at a stream's end: its last count is published with what waits.
        state.settle();
    }
}

/// Gives back the holds of VMs silent past the owner expiry (they failed, or
/// Envoy replaced them).
pub fn expire_holds(state: &mut State, now: u64) {
    let expiry = owner_expiry_ms(state.router.config().tick_ms());
    let expired = match &mut state.relay {
        Part::Router { holds, .. } if !holds.is_empty() => holds.expired(now, expiry),
        _ => return,
    };
    for hold in expired {
        give_back(state, ended(hold));
    }
}

/// Gives every hold back: this VM no longer routes.
pub fn give_back_all(state: &mut State) {
    let all = match &mut state.relay {
        Part::Router { holds, .. } => holds.drain(),
        _ => return,
    };
    for hold in all {
        give_back(state, ended(hold));
    }
}

/// A hold given back without an end told (its VM silent, or this one no longer
/// routing): nothing learnt from it.
fn ended(hold: Hold) -> Given {
    Given::End {
        hold,
        streamed_ms: None,
    }
}

/// Gives back what a note ends, and learns `predicted_ttft`'s costs from what the
/// asking VM measured, as the VM that counted the request would.
fn give_back(state: &State, given: Given) {
    let s = &state.shared;
    let tables = (&s.costs, state.router.names());
    let at = Recall {
        now_ms: super::host::now_ms(),
        memory_ms: state.router.config().stale_after_ms,
    };
    match given {
        Given::FirstByte {
            worker,
            booked,
            after_ms,
        } => {
            bookkeeping::release_booking(state, &worker, booked.chars);
            learn_first_byte(
                &HostStore,
                tables,
                &worker,
                (after_ms, booked.work_chars),
                at,
            );
        }
        Given::End { hold, streamed_ms } => {
            if let Some(booked) = hold.booked {
                bookkeeping::release_booking(state, &hold.worker, booked.chars);
            }
            if let Some(span) = streamed_ms {
                learn_end(&HostStore, tables, &hold.worker, span, at);
            }
            bookkeeping::release_count(state, &hold.worker);
        }
    }
}
