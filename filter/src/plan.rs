//! The decision for one request, before any of it is applied: a `Plan` (which
//! worker, which routing header and value, in PD the prefill worker and the body
//! both engines get, the tree operations to record) or a typed `Refusal` (the status
//! and reason the client gets).
//!
//! Sans-IO: the glue reads the request and the loads, calls `plan`, and applies the
//! answer (sets the header, rewrites the body, sends the prefill copy, records the
//! operations, counts). What is counted whatever the outcome (a blind queue gate, a
//! filtered prefix owner) comes back in `Notes`.
//!
//! PD: the prefill pool's ladder and the decode pool's ladder each pick a worker;
//! a request with a body gets the bootstrap fields (`crate::pd`) naming the prefill
//! worker, and the same body goes to both. A request without a body (`GET
//! /v1/models`) has no prompt to prefill and goes to the decode worker alone.

use crate::decision::Decision;
use crate::load::Loads;
use crate::parse::{Parsed, Unreadable};
use crate::pd::{self, Bootstrap, RewriteError};
use crate::rng::{Rng, Rooms};
use crate::router::{NoWorker, Router};
use crate::shared::Op;
use crate::target::{route_target, RouteTarget};

/// Where a routed request goes and what it leaves behind.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The worker that gets the request itself (regular, or decode in PD).
    pub main: Decision,
    /// The routing header and value for `main`.
    pub target: RouteTarget,
    /// PD with a body: the prefill leg.
    pub prefill: Option<PrefillLeg>,
    /// Tree operations to record (share with every VM, then apply).
    pub records: Vec<Op>,
}

/// PD: the prefill worker and the rewritten body both engines get.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefillLeg {
    pub decision: Decision,
    pub body: Vec<u8>,
}

/// What is counted once the pools decided, whether or not the request goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Notes {
    /// The queue gate is set but no candidate had a fresh sample.
    pub gate_inert: bool,
    /// The prefix's owners were all flagged overloaded and filtered out.
    pub owner_overloaded: bool,
}

/// Why a request gets a local reply instead of a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No configuration yet (or it was refused).
    NotConfigured,
    /// No worker of the pool (or pools) serves the model.
    NoWorker(NoWorker),
    /// PD: the prefill worker has no bootstrap host and port (validation prevents it).
    PrefillWithoutBootstrap,
    /// PD: the body cannot carry the bootstrap fields.
    Rewrite(RewriteError),
    /// The decision names a worker the configuration does not have.
    UnknownWorker,
    /// The host refused the routing header.
    HeaderRejected,
    /// PD: the host refused the rewritten body or its `content-length`.
    BodyRewriteFailed,
    /// PD: the prefill copy could not be dispatched.
    PrefillDispatchFailed,
}

impl Refusal {
    /// The HTTP status of the local reply.
    pub fn status(self) -> u32 {
        match self {
            Refusal::Rewrite(_) => 400,
            _ => 503,
        }
    }

    /// The reason, in the reply body and `x-llm-router-reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotConfigured => "not_configured",
            Refusal::NoWorker(e) => e.as_str(),
            Refusal::PrefillWithoutBootstrap => "prefill_without_bootstrap",
            Refusal::Rewrite(e) => e.as_str(),
            Refusal::UnknownWorker => "unknown_worker",
            Refusal::HeaderRejected => "header_rejected",
            Refusal::BodyRewriteFailed => "body_rewrite_failed",
            Refusal::PrefillDispatchFailed => "prefill_dispatch_failed",
        }
    }

    /// Counted as `llm_router_no_worker`: the decision found nobody to send to.
    pub fn is_no_worker(self) -> bool {
        matches!(
            self,
            Refusal::NoWorker(_) | Refusal::PrefillWithoutBootstrap
        )
    }
}

/// What `plan` decided, and what to count either way.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub notes: Notes,
    pub outcome: Result<Plan, Refusal>,
}

/// Decides where `req` (whose body is `body`) goes. `rng` breaks ties; PD rooms draw
/// from `entropy` (the host's; `None` when it refuses), falling back to `rng`.
pub fn plan(
    router: &mut Router,
    req: &Parsed,
    body: &[u8],
    loads: &Loads,
    rng: &mut dyn Rng,
    entropy: &mut dyn FnMut() -> Option<u64>,
) -> Planned {
    let mut notes = Notes::default();
    let outcome = decide(router, req, body, loads, rng, entropy, &mut notes);
    Planned { notes, outcome }
}

fn decide(
    router: &mut Router,
    req: &Parsed,
    body: &[u8],
    loads: &Loads,
    rng: &mut dyn Rng,
    entropy: &mut dyn FnMut() -> Option<u64>,
    notes: &mut Notes,
) -> Result<Plan, Refusal> {
    if !router.config().is_pd() {
        let routed = router.route(req, loads, rng).map_err(Refusal::NoWorker)?;
        notes.gate_inert = routed.gate_inert;
        notes.owner_overloaded = routed.owner_overloaded;
        return finish(
            router,
            routed.decision,
            None,
            routed.record.into_iter().collect(),
        );
    }
    let pair = router
        .route_pd(req, loads, rng)
        .map_err(Refusal::NoWorker)?;
    notes.gate_inert = pair.prefill.gate_inert || pair.decode.gate_inert;
    notes.owner_overloaded = pair.prefill.owner_overloaded || pair.decode.owner_overloaded;
    let records: Vec<Op> = [pair.prefill.record, pair.decode.record]
        .into_iter()
        .flatten()
        .collect();
    let main = pair.decode.decision;
    if matches!(
        req,
        Parsed::Unroutable {
            reason: Unreadable::EmptyBody,
            ..
        }
    ) {
        return finish(router, main, None, records);
    }
    let prefill = pair.prefill.decision;
    let bootstrap = router
        .config()
        .workers
        .get(prefill.worker as usize)
        .and_then(|w| {
            Some(Bootstrap {
                host: w.bootstrap_host()?,
                port: w.bootstrap_port?,
            })
        })
        .ok_or(Refusal::PrefillWithoutBootstrap)?;
    let mut rooms = Rooms {
        entropy,
        fallback: rng,
    };
    let rewritten = pd::inject_bootstrap(req.endpoint(), body, bootstrap, &mut rooms)
        .map_err(Refusal::Rewrite)?;
    let leg = PrefillLeg {
        decision: prefill,
        body: rewritten.body,
    };
    finish(router, main, Some(leg), records)
}

fn finish(
    router: &Router,
    main: Decision,
    prefill: Option<PrefillLeg>,
    records: Vec<Op>,
) -> Result<Plan, Refusal> {
    let target = route_target(router.config(), main.worker).ok_or(Refusal::UnknownWorker)?;
    Ok(Plan {
        main,
        target,
        prefill,
        records,
    })
}
