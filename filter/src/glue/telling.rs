//! An asking VM telling the routing VM of the requests it counts for it
//! (`crate::relay::tell`): notes riding on questions, or sent alone when due.

use super::host;
use super::hostcalls;
use super::state::State;
use crate::relay::{Event, Leg, Note, Part, Retold, Told};
use crate::shared::owner_expiry_ms;

/// Writes `note` (`counted`: of a request the routing VM counts for this VM;
/// `urgent`: it goes at once) and sends what waits if it is due.
pub fn note(state: &State, note: Note, how: (bool, bool)) {
    notes(state, &[note], how);
}

fn notes(state: &State, notes: &[Note], how: (bool, bool)) {
    let Part::Asker { tell, .. } = &state.relay else {
        // This VM took the seat meanwhile: the router that counted it is gone.
        return;
    };
    let now = host::now_ms();
    for n in notes {
        tell.note(*n, how, now);
    }
    send_if_due(state, now);
}

/// The routing VM counted the stream `ctx`, which this VM did not send on (it
/// decided it here at the deadline, or the stream ended or failed first): both
/// legs' ends are told (a leg it did not count is ignored there).
pub fn never_sent(state: &State, ctx: u32) {
    let end = |leg| Note {
        ctx,
        leg,
        event: Event::ENDED,
    };
    notes(state, &[end(Leg::Main), end(Leg::Prefill)], (false, false));
}

/// Sends the waiting notes alone, or a heartbeat, if due (`crate::relay::Tell::due`).
pub fn send_if_due(state: &State, now: u64) {
    let Part::Asker {
        tell, route, reply, ..
    } = &state.relay
    else {
        return;
    };
    let cfg = state.router.config();
    let beat = owner_expiry_ms(cfg.tick_ms()) / 3;
    if !tell.due(now, cfg.sync_batch_ms, beat) {
        return;
    }
    let notes = tell.take(now);
    let (Some(route), Some(reply)) = (route, reply) else {
        // No router to tell: none counts for this VM.
        return;
    };
    let told = Told {
        reply: *reply,
        notes,
    };
    send(*route, &told.encode());
}

/// Writes `message` on the routing VM's queue; one lost goes with a router that is
/// gone (its successor is told again, `retell`).
fn send(route: u32, message: &[u8]) {
    if let Err(e) = hostcalls::enqueue_shared_queue(route, message) {
        host::log(
            proxy_wasm::types::LogLevel::Debug,
            &format!("llm-router: the routing VM could not be told: {e:?}"),
        );
    }
}

/// Tells a routing VM this VM follows from now on every request the one before it
/// counted for this VM: the new one did not count them (a takeover), and their
/// ends will be told to it.
pub fn retell(state: &State) {
    let Part::Asker {
        tell,
        route: Some(route),
        reply: Some(reply),
        ..
    } = &state.relay
    else {
        return;
    };
    let counted = tell.holding();
    if counted.is_empty() {
        return;
    }
    let retold = Retold {
        reply: *reply,
        counted,
    };
    send(*route, &retold.encode());
}

/// The notes a question carries.
pub fn riding(state: &State, now: u64) -> Vec<Note> {
    match &state.relay {
        Part::Asker { tell, .. } => tell.take(now),
        _ => Vec::new(),
    }
}
