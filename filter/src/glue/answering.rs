//! The routing VM answering questions (`route_in: one_vm`): each decided as a
//! request of its own (`super::decide`), its tree operations recorded, its counts
//! held until the asking VM's are shared (`crate::relay::handover`), and the answer
//! sent to the asking VM's queue.

use super::bookkeeping;
use super::decide::decide;
use super::host;
use super::hostcalls;
use super::state::State;
use crate::decision::Decision;
use crate::parse;
use crate::policy::predicted_ttft::WorkHold;
use crate::relay::{Answer, Ask, Handover, Part, Refused, Routed, Verdict};
use crate::request::plan::Refusal;
use proxy_wasm::types::LogLevel;

/// Decides every question waiting on the route queue and answers each.
pub fn answer_questions(state: &mut State, queue: u32) {
    while let Ok(Some(message)) = hostcalls::dequeue_shared_queue(queue) {
        let Some(ask) = Ask::decode(&message) else {
            continue;
        };
        answer(state, &ask, host::now_ms());
    }
}

/// Decides one question and answers it.
pub fn answer(state: &mut State, ask: &Ask<'_>, now: u64) {
    release_handed(state, now);
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
    hand_over(state, &main_worker, &decided.plan.main, now);
    if let Some((d, worker, _)) = &prefill {
        hand_over(state, worker, d, now);
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

/// Counts a decision made for another VM here until that VM's count is shared
/// (`crate::relay::handover`).
fn hand_over(state: &mut State, worker: &str, d: &Decision, now: u64) {
    bookkeeping::take_count(state, worker);
    // The prediction is recorded once, by the VM that asked.
    let work = d
        .predicted
        .map(|p| WorkHold::take(&state.shared.inflight, worker, &p, now));
    let due = now.saturating_add(Handover::<()>::hold_ms(state.router.config().sync_batch_ms));
    if let Part::Router { handover, .. } = &mut state.relay {
        handover.hold(due, (worker.to_string(), work));
    }
}

/// Gives back the handed-over counts that are due.
pub fn release_handed(state: &mut State, now: u64) {
    let due = match &mut state.relay {
        Part::Router { handover, .. } if !handover.is_empty() => handover.due(now),
        _ => return,
    };
    for (worker, mut work) in due {
        bookkeeping::release_count(state, &worker);
        bookkeeping::end_work(state, &mut work);
    }
}
