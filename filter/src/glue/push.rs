//! The collector's push endpoint, answered by the filter itself: the stats path
//! (with a token configured) takes a `POST` of one snapshot. The token, method and
//! declared size are checked on the headers, before anything is buffered; the body
//! is checked whole (`crate::push`) and stored all or nothing.
//!
//! Where it answers: only a config with a token has the endpoint. The shipped
//! configs give the stats listener its own plugin config (`stats_only`, same
//! `vm_config`, so the same shared data) and the client-facing listener none, so no
//! token opens a push there. A `stats_only` config answers nothing else (a local
//! 404: nothing routed, nothing recorded). Failed token checks are limited per
//! Envoy (`crate::shared::PushLockout`).

use proxy_wasm::types::Action;

use super::host::{self, request_header, HostStore};
use super::membership::with_membership;
use super::reply;
use super::state::{Shared, State};
use crate::push::{parse_push, token_matches, PushError};
use crate::shared::{Gate, PushLockout};

/// What the request headers say about a push.
pub enum Start {
    /// Not the stats endpoint (or pushes are off): route as usual.
    NotPush,
    /// Refused on its headers; the reply is sent.
    Refused(Action),
    /// A push to buffer and check at the end of the body.
    Accepting,
}

/// What a request's path names, as the push endpoint sees it.
enum Endpoint {
    /// Not the stats endpoint, or pushes are off: routed as usual.
    Other,
    /// A `stats_only` listener, and not its stats or replicas path.
    Closed,
    /// The stats path, with what checking the push takes.
    Stats {
        token: String,
        limit: usize,
        lockout: PushLockout,
    },
}

/// Recognises a collector push and refuses it early when the token, method or
/// declared size is wrong. Every request passes here, so anything but the stats
/// path costs a comparison of the path: no copy of the settings, no hostcall.
pub fn start(state: &Shared, path: &str, end_of_stream: bool) -> Start {
    let endpoint = path.split('?').next();
    // Decided under the borrow, answered after it: Envoy runs the response
    // callbacks of a local reply, which read the state too.
    let found = state.borrow().as_ref().map_or(Endpoint::Other, |s| {
        let cfg = s.router.config();
        match &cfg.stats_token {
            None => Endpoint::Other,
            Some(token) if endpoint == Some(cfg.stats_path.as_str()) => Endpoint::Stats {
                token: token.clone(),
                limit: cfg.stats_max_bytes,
                lockout: PushLockout::new(&s.shared.keys),
            },
            // The replica bridge's endpoint lives on the stats listener too.
            Some(_) if cfg.stats_only && endpoint != Some(cfg.replicas.path.as_str()) => {
                Endpoint::Closed
            }
            Some(_) => Endpoint::Other,
        }
    });
    let (token, limit, lockout) = match found {
        Endpoint::Other => return Start::NotPush,
        Endpoint::Closed => {
            return Start::Refused(reply::json(
                404,
                "not_found",
                r#"{"error":"this listener only takes stats pushes"}"#,
            ))
        }
        Endpoint::Stats {
            token,
            limit,
            lockout,
        } => (token, limit, lockout),
    };
    let refused = |e: PushError| Start::Refused(refuse(state, &e));
    let now = host::now_ms();
    if let Gate::LockedOut { retry_after_ms } = lockout.gate(&HostStore, now) {
        return refused(PushError::LockedOut {
            retry_after_s: retry_after_ms.div_ceil(1000),
        });
    }
    let authorization = request_header("authorization");
    if !token_matches(Some(&authorization), &token) {
        lockout.fail(&HostStore, now);
        return refused(PushError::Unauthorized);
    }
    if request_header(":method") != "POST" {
        return refused(PushError::BadRequest(
            "the stats endpoint takes POST".into(),
        ));
    }
    if request_header("content-length")
        .parse::<usize>()
        .is_ok_and(|n| n > limit)
    {
        return refused(PushError::TooLarge { limit });
    }
    if end_of_stream {
        return refused(PushError::BadRequest("empty snapshot".into()));
    }
    Start::Accepting
}

/// A body already over the limit while it is still arriving: refused at once.
pub fn check_size(state: &Shared, body_size: usize) -> Option<Action> {
    let limit = state
        .borrow()
        .as_ref()
        .map_or(0, |s| s.router.config().stats_max_bytes);
    (body_size > limit).then(|| refuse(state, &PushError::TooLarge { limit }))
}

/// Stores a whole snapshot, all or nothing, and answers the collector.
pub fn accept(state: &Shared, body: &[u8]) -> Action {
    // The reply goes out after the borrow ends: Envoy runs the response callbacks of a
    // local reply, which read the state too.
    let outcome = match state.borrow_mut().as_mut() {
        Some(state) => store(state, body),
        None => return reply::json(503, "not_configured", "{\"error\":\"not configured\"}"),
    };
    match outcome {
        Ok(n) => reply::json(200, "stats_accepted", &format!("{{\"accepted\":{n}}}")),
        Err(e) => reply_refused(&e),
    }
}

/// Checks and stores a snapshot, counting it either way; the workers it reported.
fn store(state: &mut State, body: &[u8]) -> Result<usize, PushError> {
    // A VM without the trees applies no ring operations: its worker list is the
    // shared table's, read now (one read a push).
    if !state.serving() {
        state.refresh_membership();
    }
    let limit = state.router.config().stats_max_bytes;
    let now = host::now_ms();
    // Discovery mode: the samples are checked against the list the push's
    // membership leaves, which is stored only if they pass.
    let parsed = with_membership(state, body, now, |workers| {
        let reports = parse_push(body, limit, workers, now)?;
        Ok((workers.to_vec(), reports))
    });
    let outcome = parsed.and_then(|(workers, reports)| {
        let n = reports.iter().filter(|r| r.is_some()).count();
        if state.shared.samples.write(&HostStore, &workers, &reports) {
            // What this Envoy had in flight when the engines were sampled: engine
            // load beyond it is other routers'.
            if state.router.config().uses_predicted_ttft() {
                let s = &state.shared;
                s.own_at_sample
                    .snapshot(&HostStore, (&s.inflight, &s.ring), now);
            }
            Ok(n)
        } else {
            Err(PushError::BadRequest(
                "shared data refused the snapshot".into(),
            ))
        }
    });
    match &outcome {
        Ok(_) => state.metrics.pushes_accepted.inc(),
        Err(_) => state.metrics.pushes_rejected.inc(),
    }
    outcome
}

/// Refuses a push with its status and reason, and counts it.
fn refuse(state: &Shared, e: &PushError) -> Action {
    if let Some(s) = state.borrow().as_ref() {
        s.metrics.pushes_rejected.inc();
    }
    reply_refused(e)
}

fn reply_refused(e: &PushError) -> Action {
    let body = serde_json::json!({"error": e.reason()}).to_string();
    reply::json(e.status(), "stats_refused", &body)
}
