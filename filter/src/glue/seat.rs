//! The seat on the host (`route_in: one_vm`, `crate::relay::seat`): a root
//! context joins as asking, takes the seat on a tick (or at a request when nobody
//! holds it, or as the successor of a failed routing VM), beats it while it holds
//! it, and follows whoever does.

use std::collections::HashMap;

use proxy_wasm::types::LogLevel;
use sha2::{Digest, Sha256};

use super::answering;
use super::host::{self, HostStore};
use super::hostcalls;
use super::queues::{self, resume_with, take_stream, Queue};
use super::state::{Shared, State};
use super::telling;
use crate::config::RouteIn;
use crate::relay::{seat, Holds, Part, Seat, SeatCall, Seated, Tell};
use crate::shared::{SetOutcome, SharedStore};

/// How long a seat holder may go without a beat before another VM takes over: a
/// main thread applying a large configuration must not lose it, a failed VM must.
fn stale_after_ms(state: &State) -> u64 {
    state.router.config().tick_ms().saturating_mul(3).max(2_000)
}

/// Takes this root context's part under its (new) configuration `config`.
pub fn join(shared: &Shared, config: &[u8]) {
    let mut slot = shared.borrow_mut();
    let Some(state) = slot.as_mut() else {
        return;
    };
    let cfg = state.router.config();
    if cfg.route_in == RouteIn::EveryVm || cfg.stats_only {
        state.relay = Part::EveryVm;
        return;
    }
    let digest: String = Sha256::digest(config)
        .iter()
        .take(6)
        .map(|b| format!("{b:02x}"))
        .collect();
    let same = match &state.relay {
        Part::Router { seat, .. } | Part::Asker { seat, .. } => seat.digest == digest,
        Part::EveryVm => false,
    };
    if same {
        return;
    }
    let me = host::random_seed().max(1);
    let vm_id = hostcalls::get_property(&["plugin_vm_id"])
        .ok()
        .flatten()
        .and_then(|b| String::from_utf8(b).ok())
        .unwrap_or_default();
    state.relay = asking(shared, Seated { digest, me, vm_id });
    take_or_follow(shared, state, host::now_ms(), false);
}

/// The part of a root context that asks, with its reply queue registered (and
/// known here, for the answers' notifications); the routing VM not found yet.
fn asking(shared: &Shared, seat: Seated) -> Part {
    let reply =
        hostcalls::register_shared_queue(&format!("llm_router.reply.{:016x}", seat.me)).ok();
    if let Some(q) = reply {
        queues::register(q, Queue::Reply, shared);
    }
    Part::Asker {
        seat,
        route: None,
        reply,
        following: 0,
        waiting: HashMap::new(),
        late: HashMap::new(),
        tell: Tell::default(),
    }
}

/// The seat as this root context finds it: taken (then this context routes; only
/// on a tick, `may_take`), beaten, or followed to whoever holds it.
///
/// Envoy configures a plugin first in a VM of its main thread that never ticks and
/// is never told of its queues (they are told to the main thread's own copy, under
/// the registrant's context id): a root context takes the seat on its tick, so
/// that one never does. The main thread's copy is configured before the worker
/// threads', so its first tick usually comes first.
pub fn take_or_follow(shared: &Shared, state: &mut State, now: u64, may_take: bool) {
    let stale_after = stale_after_ms(state);
    let (Part::Router { seat: s, .. } | Part::Asker { seat: s, .. }) = &state.relay else {
        return;
    };
    let (digest, me) = (s.digest.clone(), s.me);
    let key = state.shared.keys.relay_seat(&digest);
    let (found, cas) = read_seat(&key);
    let call = seat::seat_call(found, me, now, stale_after);
    let mine = Seat {
        holder: me,
        beat_ms: now,
    };
    match call {
        SeatCall::Beat => {
            let _ = HostStore.set(&key, &mine.encode(), cas);
            match &mut state.relay {
                Part::Router { beat_ms, .. } => *beat_ms = now,
                // The seat names this root context, which does not route: the
                // same nonce in a VM started afresh (a host whose randomness
                // repeats). It routes, on the queue of that name.
                _ => seated(shared, state, &mine.queue_name(&digest), now),
            }
        }
        SeatCall::Follow => follow(shared, state, found),
        SeatCall::TakeEmpty | SeatCall::TakeStale if !may_take => {}
        SeatCall::TakeEmpty => {
            take_seat(shared, state, (&key, cas), &digest, None);
        }
        SeatCall::TakeStale => {
            let why = "the routing VM stopped; this one routes from now on";
            take_seat(shared, state, (&key, cas), &digest, Some(why));
        }
    }
}

/// Takes the seat (`key`, as read with `cas`) for this root context, which then
/// routes (`seated`); a takeover of a routing VM that failed is counted and said
/// (`takeover`). Whether it was taken.
pub fn take_seat(
    shared: &Shared,
    state: &mut State,
    (key, cas): (&str, u32),
    digest: &str,
    takeover: Option<&str>,
) -> bool {
    let (Part::Router { seat, .. } | Part::Asker { seat, .. }) = &state.relay else {
        return false;
    };
    let now = host::now_ms();
    let mine = Seat {
        holder: seat.me,
        beat_ms: now,
    };
    if HostStore.set(key, &mine.encode(), cas) != SetOutcome::Stored {
        return false;
    }
    if let Some(why) = takeover {
        state.metrics.relay_takeovers.inc();
        host::log(LogLevel::Warn, &format!("llm-router: {why}"));
    }
    seated(shared, state, &mine.queue_name(digest), now);
    true
}

/// This root context holds the seat: it registers its route queue, keeps the
/// trees from now on (what the ring holds), and decides the streams that waited
/// for the old router.
fn seated(shared: &Shared, state: &mut State, queue_name: &str, now: u64) {
    let Ok(queue) = hostcalls::register_shared_queue(queue_name) else {
        host::log(
            LogLevel::Warn,
            "llm-router: cannot register the route queue",
        );
        return;
    };
    queues::register(queue, Queue::Route, shared);
    let (seat, waiting) = match std::mem::take(&mut state.relay) {
        Part::Router { seat, .. } => (seat, HashMap::new()),
        Part::Asker { seat, waiting, .. } => (seat, waiting),
        Part::EveryVm => return,
    };
    state.relay = Part::Router {
        seat,
        beat_ms: now,
        holds: Holds::default(),
    };
    state.serve();
    for ctx in waiting.into_keys() {
        if let Some(stream) = take_stream(ctx) {
            state.metrics.relay_late.inc();
            resume_with(state, ctx, &stream, |s, state| s.route_late(state));
        }
    }
}

/// The seat's value and CAS token; a missing key is created empty first, so that
/// taking it is a CAS that one VM wins.
pub fn read_seat(key: &str) -> (Option<Seat>, u32) {
    let got = HostStore.get(key).or_else(|| {
        let _ = HostStore.set(key, &[], 0);
        HostStore.get(key)
    });
    match got {
        Some((value, cas)) => (Seat::decode(&value), cas),
        None => (None, 0),
    }
}

/// Asks the seat's holder from now on (a router that lost its seat asks too; the
/// trees it keeps answer whoever still asks it).
fn follow(shared: &Shared, state: &mut State, found: Option<Seat>) {
    let Some(holder) = found else {
        return;
    };
    if state.relay.routes_for_others() {
        // Their ends are told to the new router, which did not count them: the
        // requests in flight go uncounted for the rest of their life, as at a
        // takeover.
        answering::give_back_all(state);
        if let Part::Router { seat, .. } = std::mem::take(&mut state.relay) {
            state.relay = asking(shared, seat);
        }
    }
    if let Part::Asker {
        seat,
        route,
        following,
        ..
    } = &mut state.relay
    {
        if *following != holder.holder || route.is_none() {
            let name = holder.queue_name(&seat.digest);
            *route = hostcalls::resolve_shared_queue(&seat.vm_id, &name)
                .ok()
                .flatten();
            *following = holder.holder;
            telling::retell(state);
        }
    }
}
