//! This VM's relay queues (`route_in: one_vm`) and the streams they serve: which
//! root context each queue of this VM is for (Envoy tells a queue's notification
//! to the registrant's thread's VM under the registrant's context id, which in
//! that VM may be another root context, so queues are found by id here), the
//! streams waiting for an answer, and the prefill copies sent from a root context.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::{Rc, Weak};

use proxy_wasm::traits::Context;
use proxy_wasm::types::{Action, LogLevel};

use super::host;
use super::hostcalls;
use super::state::{Shared, State};
use super::stream::Stream;

/// Which side of the relay a queue of this VM is.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// Questions, to the routing VM.
    Route,
    /// Answers, to a root context that asked.
    Reply,
}

/// A root context's state, as its queues know it.
pub type StateRef = Weak<RefCell<Option<State>>>;
/// A stream, as the relay knows it.
pub type StreamRef = Weak<RefCell<Stream>>;

thread_local! {
    /// This VM's queues, each with the root context state it serves.
    static QUEUES: RefCell<HashMap<u32, (Queue, StateRef)>> = RefCell::new(HashMap::new());
    /// Prefill copies sent from a root context (an answer's), by token and with
    /// their stream's context id: their response comes back to a root context.
    static CALLOUTS: RefCell<HashMap<u32, (u32, StreamRef)>> = RefCell::new(HashMap::new());
    /// The streams waiting for an answer (`Part::Asker::waiting`), by context id
    /// (unique in a VM).
    static STREAMS: RefCell<HashMap<u32, StreamRef>> = RefCell::new(HashMap::new());
}

/// The waiting stream `ctx`, no longer waiting.
pub fn take_stream(ctx: u32) -> Option<StreamRef> {
    STREAMS.with(|m| m.borrow_mut().remove(&ctx))
}

/// Queue `id` of this VM serves `shared`'s root context as `kind`.
pub fn register(id: u32, kind: Queue, shared: &Shared) {
    QUEUES.with(|m| m.borrow_mut().insert(id, (kind, Rc::downgrade(shared))));
}

/// What queue `id` of this VM is for; `None`: a queue this VM did not register.
pub fn served(id: u32) -> Option<(Queue, StateRef)> {
    QUEUES.with(|m| m.borrow().get(&id).cloned())
}

/// A root context of this VM that asks (one with a reply queue).
pub fn an_asker() -> Option<StateRef> {
    QUEUES.with(|m| {
        m.borrow()
            .values()
            .find(|(q, _)| *q == Queue::Reply)
            .map(|(_, w)| w.clone())
    })
}

/// The stream `ctx` waits for an answer.
pub fn keep_stream(ctx: u32, stream: StreamRef) {
    STREAMS.with(|m| m.borrow_mut().insert(ctx, stream));
}

/// A stream ended: its prefill copy's answer has no taker.
pub fn forget_callout(token: u32) {
    CALLOUTS.with(|c| c.borrow_mut().remove(&token));
}

/// Runs `then` on the waiting stream `ctx` as its effective context, registers a
/// prefill copy it sent, and resumes the stream if it may go on.
pub fn resume_with(
    state: &mut State,
    ctx: u32,
    stream: &StreamRef,
    then: impl FnOnce(&mut Stream, &mut State) -> Action,
) {
    let Some(stream) = stream.upgrade() else {
        return;
    };
    if hostcalls::set_effective_context(ctx).is_err() {
        return;
    }
    let Ok(mut s) = stream.try_borrow_mut() else {
        return;
    };
    let action = then(&mut s, state);
    if let Some(token) = s.prefill_token() {
        let weak = Rc::downgrade(&stream);
        CALLOUTS.with(|c| c.borrow_mut().insert(token, (ctx, weak)));
    }
    drop(s);
    go_on(action);
}

/// Resumes the effective context's paused request if `action` lets it go on (a
/// stream routed from a callback other than its request's own).
pub fn go_on(action: Action) {
    if action == Action::Continue {
        if let Err(e) = hostcalls::resume_http_request() {
            host::log(
                LogLevel::Warn,
                &format!("llm-router: cannot resume a routed request: {e:?}"),
            );
        }
    }
}

/// A root context's HTTP call answered: a prefill copy an answer sent goes to its
/// stream (`true`), anything else is the root context's own.
pub fn callout_answered(token: u32, headers: usize, body: usize, trailers: usize) -> bool {
    let Some((ctx, stream)) = CALLOUTS.with(|c| c.borrow_mut().remove(&token)) else {
        return false;
    };
    if let Some(stream) = stream.upgrade() {
        if hostcalls::set_effective_context(ctx).is_ok() {
            if let Ok(mut s) = stream.try_borrow_mut() {
                s.on_http_call_response(token, headers, body, trailers);
            }
        }
    }
    true
}
