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
//! a request with a body gets the bootstrap fields (`crate::request::pd`) naming the prefill
//! worker, and the same body goes to both. A request without a body (`GET
//! /v1/models`) has no prompt to prefill and goes to the decode worker alone.

use crate::decision::Decision;
use crate::load::Loads;
use crate::parse::{ApiKind, Invalid, Parsed, Unreadable};
use crate::policy::EnginesUse;
use crate::request::pd::{self, Bootstrap, RewriteError};
use crate::request::router::{NoWorker, Record, Router};
use crate::request::target::route_target;
use crate::rng::{Rng, Rooms};

/// Where a routed request goes and what it leaves behind.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The worker that gets the request itself (regular, or decode in PD).
    pub main: Decision,
    /// PD with a body: the prefill leg.
    pub prefill: Option<PrefillLeg>,
    /// Tree operations to record (share with every VM, then apply).
    pub records: Vec<Record>,
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
    /// The engines' answer (`kv_match`): whether it came and what it decided.
    pub engines: EnginesUse,
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
    /// The body grew past `max_body_bytes`: refused before it is read whole.
    BodyTooLarge,
    /// The body breaks a rule of the API its path names that every engine
    /// enforces (`refused_body`): the client gets the rule, no engine is asked.
    InvalidBody(Invalid),
}

impl Refusal {
    /// The HTTP status of the local reply.
    pub fn status(self) -> u32 {
        match self {
            Refusal::Rewrite(_) | Refusal::InvalidBody(_) => 400,
            Refusal::BodyTooLarge => 413,
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
            Refusal::BodyTooLarge => "body_too_large",
            Refusal::InvalidBody(_) => "invalid_body",
        }
    }

    /// What the client is told, when it is more than the reason: the element and
    /// the rule of an invalid body (`messages[3] must be an object`).
    pub fn detail(self) -> Option<String> {
        match self {
            Refusal::InvalidBody(i) => Some(i.message()),
            _ => None,
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
/// from `entropy` (the host's; `None` when it refuses), falling back to `rng`. A
/// record takes the text and model out of `req` (`Router::route`).
pub fn plan(
    router: &mut Router,
    req: &mut Parsed,
    body: &[u8],
    loads: &Loads,
    rng: &mut dyn Rng,
    entropy: &mut dyn FnMut() -> Option<u64>,
) -> Planned {
    let mut notes = Notes::default();
    let outcome = decide(router, req, body, loads, rng, entropy, &mut notes);
    Planned { notes, outcome }
}

/// A body the filter refuses itself: `messages` that is not an array of objects,
/// sent to a chat path. Every chat engine refuses it (its 400, or a reset past its
/// body limit, which would look like the engine's failure), so the filter answers
/// with the same 400 at every size. On any other path `messages` is a field the
/// engine ignores, so the body is routed (by load: it was read only in part).
pub fn refused_body(req: &Parsed) -> Option<Refusal> {
    match req {
        Parsed::Unroutable {
            reason: Unreadable::Invalid(invalid),
            endpoint: Some(ApiKind::Chat),
            ..
        } => Some(Refusal::InvalidBody(*invalid)),
        _ => None,
    }
}

fn decide(
    router: &mut Router,
    req: &mut Parsed,
    body: &[u8],
    loads: &Loads,
    rng: &mut dyn Rng,
    entropy: &mut dyn FnMut() -> Option<u64>,
    notes: &mut Notes,
) -> Result<Plan, Refusal> {
    if let Some(refused) = refused_body(req) {
        return Err(refused);
    }
    if !router.config().is_pd() {
        let routed = router.route(req, loads, rng).map_err(Refusal::NoWorker)?;
        notes.gate_inert = routed.gate_inert;
        notes.owner_overloaded = routed.owner_overloaded;
        notes.engines = routed.engines;
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
    notes.engines = pair.prefill.engines.max(pair.decode.engines);
    let records: Vec<Record> = [pair.prefill.record, pair.decode.record]
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
    records: Vec<Record>,
) -> Result<Plan, Refusal> {
    // The glue reads the routing header and value for `main` from the configuration
    // (`crate::request::target`) when it sets them: only whether there are any is settled here.
    route_target(router.config(), main.worker).ok_or(Refusal::UnknownWorker)?;
    Ok(Plan {
        main,
        prefill,
        records,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::decision::Reason;
    use crate::parse::parse;
    use crate::parse::testing::chat_body;
    use crate::rng::SplitMix64;
    use crate::shared::Op;
    use serde_json::Value;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// `cache_aware`, whose queue gate some of these tests plan through.
    const REGULAR: &str =
        r#"{"policy":"cache_aware","workers":[{"name":"w0","cluster":"engine_0"},{"name":"w1"}]}"#;
    const PD: &str = r#"{"workers":[
        {"name":"p0","pool":"prefill","address":"10.0.0.1:30000","bootstrap_port":8998},
        {"name":"d0","pool":"decode","cluster":"decode_0"}]}"#;

    fn router(json: &str) -> Router {
        Router::new(Config::from_json(json.as_bytes()).unwrap())
    }

    /// Plans `body` sent to `path` on an idle fleet; rooms come from `entropy`.
    fn go(r: &mut Router, path: &str, body: &str, entropy: Option<u64>) -> Planned {
        let mut req = parse(path, body.as_bytes());
        let loads = Loads::inflight_only(&[0; 4]);
        plan(
            r,
            &mut req,
            body.as_bytes(),
            &loads,
            &mut SplitMix64(1),
            &mut || entropy,
        )
    }

    fn chat(text: &str) -> String {
        chat_body(&[text])
    }

    #[test]
    fn a_regular_request_gets_its_workers_cluster_header_and_an_insert() {
        let mut r = router(REGULAR);
        let planned = go(&mut r, "/v1/chat/completions", &chat("hi"), None);
        assert_eq!(planned.notes, Notes::default());
        let p = planned.outcome.unwrap();
        assert_eq!(p.main.reason, Reason::CacheMiss);
        let name = r.config().workers[p.main.worker as usize].name.clone();
        let target = route_target(r.config(), p.main.worker).unwrap();
        assert_eq!(target.worker, name);
        assert_eq!(target.header, "x-llm-router-cluster");
        let cluster = if name == "w0" { "engine_0" } else { "w1" };
        assert_eq!(target.value, cluster, "the worker's cluster, not its name");
        assert!(p.prefill.is_none());
        assert!(
            matches!(&p.records[..], [Record { op: Op::Insert { worker, .. }, .. }] if *worker == name),
            "the text is recorded under the chosen worker: {:?}",
            p.records
        );
    }

    #[test]
    fn an_endpoint_target_carries_the_address() {
        let mut r =
            router(r#"{"target":"endpoint","workers":[{"name":"a","address":"10.0.0.9:8000"}]}"#);
        let p = go(&mut r, "/v1/completions", r#"{"prompt":"x"}"#, None)
            .outcome
            .unwrap();
        let target = route_target(r.config(), p.main.worker).unwrap();
        assert_eq!(
            (target.header, target.value),
            ("x-gateway-destination-endpoint", "10.0.0.9:8000")
        );
    }

    #[test]
    fn an_unreadable_body_is_still_routed_and_records_nothing() {
        let mut r = router(REGULAR);
        let p = go(&mut r, "/v1/chat/completions", "{nope", None)
            .outcome
            .unwrap();
        assert_eq!(p.main.reason, Reason::Unreadable);
        assert!(p.records.is_empty());
    }

    #[test]
    fn messages_that_are_not_objects_sent_to_chat_are_a_400_naming_the_element() {
        for pd in [false, true] {
            let mut r = router(if pd { PD } else { REGULAR });
            for (body, invalid, detail) in [
                (
                    r#"{"model":"m","messages":[0,0,0]}"#,
                    Invalid::MessageNotObject(0),
                    "messages[0] must be an object",
                ),
                (
                    r#"{"messages":[{"role":"user","content":"a"},{},{"role":"u"},"x"]}"#,
                    Invalid::MessageNotObject(3),
                    "messages[3] must be an object",
                ),
                // Read no further than the element: what follows is not looked at.
                (
                    r#"{"messages":[{"role":"u","content":"c"},[],"#,
                    Invalid::MessageNotObject(1),
                    "messages[1] must be an object",
                ),
                (
                    r#"{"messages":"hi","model":"m"}"#,
                    Invalid::MessagesNotArray,
                    "messages must be an array",
                ),
                (
                    r#"{"messages":{"role":"user","content":"a"}}"#,
                    Invalid::MessagesNotArray,
                    "messages must be an array",
                ),
            ] {
                let refusal = go(&mut r, "/v1/chat/completions", body, Some(7))
                    .outcome
                    .unwrap_err();
                assert_eq!(refusal, Refusal::InvalidBody(invalid), "pd {pd}: {body}");
                assert_eq!(
                    (refusal.status(), refusal.as_str(), refusal.detail()),
                    (400, "invalid_body", Some(detail.to_string())),
                    "pd {pd}: the client is told the element and the rule: {body}"
                );
                assert!(!refusal.is_no_worker());
            }
        }
    }

    #[test]
    fn invalid_messages_on_other_paths_and_bodies_lacking_them_are_routed() {
        let mut r = router(REGULAR);
        for (path, body) in [
            // `messages` is not what these engines read: routed by load.
            ("/v1/completions", r#"{"prompt":"p","messages":[0]}"#),
            ("/generate", r#"{"messages":"x","text":"t"}"#),
            ("/v1/embeddings", r#"{"messages":[{}, 1],"input":"i"}"#),
            ("/x", r#"{"messages":[0]}"#),
            // Lacking fields routing needs, or not JSON: routed as before.
            ("/v1/chat/completions", r#"{"model":"m","messages":null}"#),
            ("/v1/chat/completions", r#"{"model":"m"}"#),
            ("/v1/chat/completions", r#"{"messages":[]}"#),
            ("/v1/chat/completions", "{nope"),
            ("/v1/chat/completions", "[0,0]"),
            ("/v1/completions", r#"{"prompt":[{}]}"#),
            ("/generate", r#"{"text":7}"#),
        ] {
            let planned = go(&mut r, path, body, None);
            let p = planned
                .outcome
                .unwrap_or_else(|e| panic!("{path} {body}: {e:?}"));
            assert_eq!(p.main.reason, Reason::Unreadable, "{path} {body}");
            assert!(p.records.is_empty(), "{path} {body}");
        }
    }

    #[test]
    fn no_worker_for_the_model_is_a_503_refusal() {
        let mut r = router(r#"{"workers":[{"name":"a","models":["x"]}]}"#);
        let planned = go(
            &mut r,
            "/v1/completions",
            r#"{"model":"y","prompt":"p"}"#,
            None,
        );
        let refusal = planned.outcome.unwrap_err();
        assert_eq!(refusal, Refusal::NoWorker(NoWorker::NoWorkerForModel));
        assert_eq!(
            (refusal.status(), refusal.as_str(), refusal.is_no_worker()),
            (503, "no_worker_for_model", true)
        );
    }

    #[test]
    fn pd_with_a_body_sends_the_rewritten_body_to_both_workers() {
        let mut r = router(PD);
        let p = go(&mut r, "/v1/chat/completions", &chat("hello"), Some(42))
            .outcome
            .unwrap();
        let target = route_target(r.config(), p.main.worker).unwrap();
        assert_eq!(target.worker, "d0", "the request itself goes to decode");
        assert_eq!(target.value, "decode_0");
        let leg = p.prefill.expect("a prefill leg");
        assert_eq!(r.config().workers[leg.decision.worker as usize].name, "p0");
        let body: Value = serde_json::from_slice(&leg.body).unwrap();
        assert_eq!(body["bootstrap_host"], "10.0.0.1");
        assert_eq!(body["bootstrap_port"], 8998);
        assert_eq!(
            body["bootstrap_room"], 21,
            "the host's entropy, shifted into range"
        );
        assert_eq!(body["messages"][0]["content"], "hello");
        assert_eq!(
            p.records.len(),
            1,
            "cache_aware prefill records, power_of_two decode does not"
        );
    }

    #[test]
    fn pd_rooms_fall_back_to_the_generator_when_the_host_refuses() {
        let room = |entropy| {
            let mut r = router(PD);
            let p = go(&mut r, "/v1/completions", r#"{"prompt":"x"}"#, entropy)
                .outcome
                .unwrap();
            let body: Value = serde_json::from_slice(&p.prefill.unwrap().body).unwrap();
            body["bootstrap_room"].as_u64().unwrap()
        };
        assert_eq!(
            room(None),
            room(None),
            "deterministic from the seeded generator"
        );
        assert_eq!(room(Some(8)), 4);
    }

    #[test]
    fn pd_without_a_body_goes_to_decode_alone() {
        let mut r = router(PD);
        let p = go(&mut r, "/v1/models", "", Some(1)).outcome.unwrap();
        assert_eq!(r.config().workers[p.main.worker as usize].name, "d0");
        assert!(p.prefill.is_none(), "no prompt to prefill");
    }

    #[test]
    fn pd_bodies_that_cannot_carry_a_room_are_400s() {
        let mut r = router(PD);
        let refusal = go(&mut r, "/v1/completions", "[1,2]", None)
            .outcome
            .unwrap_err();
        assert_eq!(refusal, Refusal::Rewrite(RewriteError::NotJsonObject));
        assert_eq!(
            (refusal.status(), refusal.as_str(), refusal.is_no_worker()),
            (400, "body_not_json_object", false)
        );
        let batch = format!(r#"{{"prompt":[{}"x"]}}"#, "\"x\",".repeat(pd::MAX_BATCH));
        assert_eq!(
            go(&mut r, "/v1/completions", &batch, None).outcome,
            Err(Refusal::Rewrite(RewriteError::BatchTooLarge))
        );
    }

    #[test]
    fn pd_reads_the_body_by_the_api_the_path_names() {
        // `n` makes a chat request a batch; a completions body has no such field.
        let mut r = router(PD);
        let body = r#"{"messages":[{"role":"user","content":"q"}],"n":2}"#;
        let rooms = |path| {
            let p = go(&mut router(PD), path, body, Some(2)).outcome.unwrap();
            let v: Value = serde_json::from_slice(&p.prefill.unwrap().body).unwrap();
            v["bootstrap_room"].clone()
        };
        assert_eq!(rooms("/v1/chat/completions"), serde_json::json!([1, 1]));
        assert_eq!(rooms("/custom"), serde_json::json!([1, 1]), "shape: chat");
        let p = go(&mut r, "/generate", body, Some(2)).outcome.unwrap();
        let v: Value = serde_json::from_slice(&p.prefill.unwrap().body).unwrap();
        assert_eq!(v["bootstrap_room"], 1, "a /generate body without a batch");
    }

    #[test]
    fn pd_pools_without_a_worker_for_the_model_are_named() {
        let mut r = router(
            r#"{"workers":[
            {"name":"p0","pool":"prefill","address":"10.0.0.1:1","bootstrap_port":2,"models":["a"]},
            {"name":"d0","pool":"decode","models":["b"]}]}"#,
        );
        let refused = |r: &mut Router, model: &str| {
            let body = format!(r#"{{"model":"{model}","prompt":"x"}}"#);
            go(r, "/v1/completions", &body, None).outcome.unwrap_err()
        };
        assert_eq!(
            refused(&mut r, "b"),
            Refusal::NoWorker(NoWorker::NoPrefillWorkerForModel)
        );
        assert_eq!(
            refused(&mut r, "a"),
            Refusal::NoWorker(NoWorker::NoDecodeWorkerForModel)
        );
    }

    #[test]
    fn a_prefill_worker_without_bootstrap_is_refused() {
        let mut cfg = Config::from_json(PD.as_bytes()).unwrap();
        cfg.workers[0].bootstrap_port = None;
        let mut r = Router::new(cfg);
        let refusal = go(&mut r, "/v1/completions", r#"{"prompt":"x"}"#, None)
            .outcome
            .unwrap_err();
        assert_eq!(refusal, Refusal::PrefillWithoutBootstrap);
        assert_eq!((refusal.status(), refusal.is_no_worker()), (503, true));
    }

    #[test]
    fn a_blind_gate_and_a_filtered_owner_are_noted() {
        let mut r = router(&REGULAR.replace("]}", r#"],"worker_queue_limit":4}"#));
        let planned = go(&mut r, "/v1/completions", r#"{"prompt":"x"}"#, None);
        assert!(planned.notes.gate_inert, "a limit without samples is inert");

        let mut r = router(REGULAR);
        let text = r#"{"prompt":"a long prompt that one worker owns"}"#;
        let first = go(&mut r, "/v1/completions", text, None).outcome.unwrap();
        for Record { op, .. } in &first.records {
            r.apply_local(op);
        }
        let mut loads = Loads::inflight_only(&[0, 0]);
        let mut flags = vec![false; 2];
        flags[first.main.worker as usize] = true;
        loads.overloaded = flags.into();
        let mut req = parse("/v1/completions", text.as_bytes());
        let again = plan(
            &mut r,
            &mut req,
            text.as_bytes(),
            &loads,
            &mut SplitMix64(1),
            &mut || None,
        );
        assert_eq!(
            again.notes,
            Notes {
                gate_inert: false,
                owner_overloaded: true,
                engines: EnginesUse::None,
            }
        );
        assert_ne!(again.outcome.unwrap().main.worker, first.main.worker);
    }

    #[test]
    fn every_refusal_has_its_status_and_reason() {
        let cases = [
            (Refusal::NotConfigured, 503, "not_configured"),
            (
                Refusal::PrefillWithoutBootstrap,
                503,
                "prefill_without_bootstrap",
            ),
            (Refusal::UnknownWorker, 503, "unknown_worker"),
            (Refusal::HeaderRejected, 503, "header_rejected"),
            (Refusal::BodyRewriteFailed, 503, "body_rewrite_failed"),
            (
                Refusal::PrefillDispatchFailed,
                503,
                "prefill_dispatch_failed",
            ),
            (
                Refusal::Rewrite(RewriteError::BatchTooLarge),
                400,
                "batch_too_large",
            ),
            (
                Refusal::NoWorker(NoWorker::NoDecodeWorkerForModel),
                503,
                "no_decode_worker_for_model",
            ),
            (
                Refusal::InvalidBody(Invalid::MessageNotObject(0)),
                400,
                "invalid_body",
            ),
            (Refusal::BodyTooLarge, 413, "body_too_large"),
        ];
        for (r, status, reason) in cases {
            assert_eq!((r.status(), r.as_str()), (status, reason), "{r:?}");
        }
    }
}
