//! A request's decision on the host, before anything of it is applied: what a
//! routed request's body is judged by, the sync, the loads, `plan` and what it
//! counts whatever the outcome. The stream that routes here and the routing VM
//! answering another VM's question (`super::relay`) decide alike.

use proxy_wasm::types::LogLevel;

use super::host;
use super::state::State;
use crate::parse::Parsed;
use crate::policy::EnginesUse;
use crate::request::plan::{plan, refused_body, Plan, Refusal};
use crate::shared::truncate_text;

/// A request decided.
pub struct Decided {
    pub plan: Plan,
    /// A failure after this request is the engine's (`health.judged_body_bytes`):
    /// the body had a routing text and is no larger than the judged size.
    pub judged: bool,
    /// Chars of the routing text, for the booking's metrics.
    pub text_chars: usize,
}

/// Decides where `parsed` (whose body is `body`) goes, by what this VM sees now.
pub fn decide(state: &mut State, parsed: &mut Parsed, body: &[u8]) -> Result<Decided, Refusal> {
    // A failure after a body the filter found no text in (not JSON, no messages or
    // prompt), or one over the judged size, is the request's: the engine answered
    // the client. A body `plan` refuses is not counted as routed by load.
    let judged = matches!(&*parsed, Parsed::Routable(r) if !r.text.is_empty())
        && body.len() as u64 <= state.router.config().health.judged_body_bytes;
    if let (Parsed::Unroutable { reason, .. }, None) = (&*parsed, refused_body(parsed)) {
        state.metrics.unreadable.inc();
        host::log(
            LogLevel::Debug,
            &format!("llm-router: routing by load: {}", reason.as_str()),
        );
    }
    // See every prefix any thread routed, every thread's load, and the engines': as
    // of now if this request syncs, else as of this VM's last sync.
    state.shared.recent_ms.set(host::now_ms());
    state.sync_or_listen();
    let loads = state.loads();
    let planned = plan(
        &mut state.router,
        parsed,
        body,
        &loads,
        &mut state.rng,
        &mut host::entropy,
    );
    state.recycle(loads);
    if planned.notes.gate_inert {
        state.note_gate_inert();
    }
    if planned.notes.owner_overloaded {
        state.metrics.overload_owner_filtered.inc();
    }
    match planned.notes.engines {
        EnginesUse::None => {}
        EnginesUse::Partial => state.metrics.kv_match_partial.inc(),
        EnginesUse::Deferred => state.metrics.kv_match_deferred.inc(),
        EnginesUse::Ranked => state.metrics.kv_match_ranked.inc(),
    }
    let plan = planned.outcome.inspect_err(|refusal| {
        if refusal.is_no_worker() {
            state.metrics.no_worker.inc();
        }
    })?;
    // A tree policy counted the text's chars as it decided.
    let text_chars = match (plan.records.first(), &*parsed) {
        (Some(record), _) => usize::try_from(record.text_chars).unwrap_or(usize::MAX),
        (None, Parsed::Routable(r)) => crate::tree::char_len(truncate_text(
            &r.text,
            state.router.config().max_routing_text_bytes,
        )),
        (None, Parsed::Unroutable { .. }) => 0,
    };
    Ok(Decided {
        plan,
        judged,
        text_chars,
    })
}
