//! The replicas endpoint on the host (`crate::background::replica` decides): the bridge's
//! `GET` is answered from the ring at once; its `POST` is checked on the headers,
//! buffered, checked whole, and only then recorded: the imported inserts go into the
//! ring (every VM applies them as it applies its own threads'), the peer's in-flight
//! report into `PeerLoads`.

use proxy_wasm::types::{Action, LogLevel};

use super::host::{self, request_header, HostStore};
use super::hostcalls;
use super::reply;
use super::state::{Shared, State};
use crate::background::replica::{export, import, request_of, Batch, ReplicaError, Request};
use crate::push::token_matches;
use crate::shared::{Batch as RingBatch, Gate, PeerLoads, PeerReport, PushLockout};
use crate::support::header_names::REASON_HEADER;

/// The endpoint's stats.
/// A peer batch being received.
pub struct Import {
    replica: String,
    replay: bool,
}

/// What the request headers say about a replicas request.
pub enum Start {
    /// Not the replicas endpoint (or the token is unset): route as usual.
    NotReplica,
    /// Answered (an export) or refused on its headers.
    Answered(Action),
    /// An import to buffer and check at the end of the body.
    Accepting(Import),
}

pub fn start(state: &Shared, path: &str, end_of_stream: bool) -> Start {
    let slot = state.borrow();
    let Some(s) = slot.as_ref() else {
        return Start::NotReplica;
    };
    let cfg = s.router.config();
    let Some(token) = cfg.stats_token.as_deref() else {
        return Start::NotReplica;
    };
    let method = || request_header(":method");
    let Some(request) = request_of(method, path, &cfg.replicas.path) else {
        return Start::NotReplica;
    };
    // Token guesses here count against the push endpoint's lockout: one budget of
    // failed attempts for everything the token opens.
    let lockout = PushLockout::new(&s.shared.keys);
    let now = host::now_ms();
    if let Gate::LockedOut { retry_after_ms } = lockout.gate(&HostStore, now) {
        let retry_after_s = retry_after_ms.div_ceil(1000);
        return Start::Answered(refuse(s, &ReplicaError::LockedOut { retry_after_s }));
    }
    if !token_matches(Some(&request_header("authorization")), token) {
        lockout.fail(&HostStore, now);
        return Start::Answered(refuse(s, &ReplicaError::Unauthorized));
    }
    let limit = cfg.stats_max_bytes;
    match request {
        Err(e) => Start::Answered(refuse(s, &e)),
        Ok(Request::Export { after }) => Start::Answered(answer_export(s, after)),
        Ok(Request::Import { .. }) if end_of_stream => {
            Start::Answered(refuse(s, &ReplicaError::BadRequest("empty batch".into())))
        }
        Ok(Request::Import { .. })
            if request_header("content-length")
                .parse::<usize>()
                .is_ok_and(|n| n > limit) =>
        {
            Start::Answered(refuse(s, &ReplicaError::TooLarge { limit }))
        }
        Ok(Request::Import { replica, replay }) => Start::Accepting(Import { replica, replay }),
    }
}

/// A batch already over the limit while it is still arriving: refused at once.
pub fn check_size(state: &Shared, body_size: usize) -> Option<Action> {
    let slot = state.borrow();
    let s = slot.as_ref()?;
    let limit = s.router.config().stats_max_bytes;
    (body_size > limit).then(|| refuse(s, &ReplicaError::TooLarge { limit }))
}

/// This replica's own inserts since `after`, and its in-flight counts. A batch
/// takes at most half the stats limit, so it fits a peer's import limit and the
/// bus's message size (NATS's default is 1 MiB) with room to spare.
fn answer_export(s: &State, after: u64) -> Action {
    let cfg = s.router.config();
    let now = super::host::now_ms();
    let inflight = s.shared.inflight.read(&HostStore, &s.shared.ring, now);
    let batch = export(
        &s.shared.ring,
        &HostStore,
        after,
        now,
        cfg.replicas.batch_limit(cfg.sync_ring_slots),
        cfg.stats_max_bytes / 2,
        inflight,
    );
    s.replica_metrics.exported.add(batch.ops.len() as u64);
    s.replica_metrics.export_gaps.add(batch.gaps);
    let next = batch.next.to_string();
    let ops = batch.ops.len().to_string();
    let sent = hostcalls::send_http_response(
        200,
        vec![
            (REASON_HEADER, "replica_export"),
            ("content-type", "application/octet-stream"),
            ("x-llm-router-next", &next),
            ("x-llm-router-ops", &ops),
        ],
        Some(&batch.encode()),
    );
    if let Err(e) = sent {
        host::log(
            LogLevel::Error,
            &format!("llm-router: cannot send export: {e:?}"),
        );
    }
    Action::Pause
}

/// Checks a whole peer batch, then records it.
pub fn accept(state: &Shared, import_req: Import, body: &[u8]) -> Action {
    let mut slot = state.borrow_mut();
    let Some(s) = slot.as_mut() else {
        return reply::json(503, "not_configured", "{\"error\":\"not configured\"}");
    };
    let cfg = s.router.config();
    let max_ops = cfg.replicas.batch_limit(cfg.sync_ring_slots);
    let batch = match Batch::decode(body, max_ops) {
        Ok(b) => b,
        Err(e) => return refuse(s, &e),
    };
    let (entries, skipped) = import(&batch, &cfg.workers, cfg.max_routing_text_bytes);
    // One sequence for the whole batch: every thread reads it with one `get`.
    let mut shared = RingBatch::default();
    for entry in &entries {
        shared.push_encoded(entry);
    }
    let appended = shared.is_empty() || s.shared.ring.append(&HostStore, &shared).is_ok();
    // The ring is contended or gone: the batch is dropped (the peers' state is
    // advisory), and counted as skipped.
    let imported = if appended { entries.len() as u64 } else { 0 };
    let dropped = entries.len() as u64 - imported;
    if !import_req.replay {
        PeerLoads::new(&s.shared.keys).store(
            &HostStore,
            PeerReport {
                replica: import_req.replica,
                at_ms: host::now_ms(),
                counts: batch.inflight,
            },
        );
    }
    s.replica_metrics.imported.add(imported);
    s.replica_metrics.skipped.add(skipped as u64 + dropped);
    s.catch_up();
    reply::json(
        200,
        "replica_imported",
        &format!(
            "{{\"imported\":{imported},\"skipped\":{}}}",
            skipped as u64 + dropped
        ),
    )
}

/// The tick's gauge of fresh peers.
pub fn tick(s: &State) {
    let cfg = s.router.config();
    let (_, fresh) = PeerLoads::new(&s.shared.keys).by_worker(
        &HostStore,
        s.router.names(),
        host::now_ms(),
        cfg.replicas.peer_stale_after_ms,
    );
    s.replica_metrics.peers.set(fresh as u64);
}

fn refuse(s: &State, e: &ReplicaError) -> Action {
    s.replica_metrics.refused.inc();
    let body = serde_json::json!({"error": e.reason()}).to_string();
    reply::json(e.status(), "replica_refused", &body)
}
