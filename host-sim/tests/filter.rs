//! The real routing filter (`llm_router.wasm`) in host-sim, driven the way Envoy drives
//! it: `allow_on_headers_stop_iteration: true`, the body buffered until end of stream,
//! the routing header read by the route after `clear_route_cache`.
//!
//! The `.wasm` is not built by these tests (a nested cargo build would contend for the
//! shared target dir): build it first with
//! `cargo build -p llm-router --target wasm32-wasip1 --profile wasm`
//! (or point `LLM_ROUTER_WASM` at a build elsewhere).

mod support;

use host_sim::{Host, RequestSpec, StreamHandle, StreamOutcome};
use llm_router::rng::{Rng as _, SplitMix64};
use llm_router::support::header_names::EXPLAIN_HEADER;
use std::collections::{BTreeMap, BTreeSet};
use support::{chat, completion, filter, fleet_config as fleet, metric, CLUSTER_HEADER};

const HIT: &str = "wasmcustom.llm_router_decisions_cache_hit";
const MISS: &str = "wasmcustom.llm_router_decisions_cache_miss";
const NO_WORKER: &str = "wasmcustom.llm_router_no_worker";
const UNREADABLE: &str = "wasmcustom.llm_router_unreadable_body";

const ENDPOINT_HEADER: &str = "x-gateway-destination-endpoint";

fn host_with(config: &str, vms: usize, seed: u64) -> Host {
    let builder = support::builder::<&str>(config, vms, seed, &[]).plugin_name("llm_router");
    support::build(builder, config)
}

fn host(config: &str) -> Host {
    host_with(config, 1, 7)
}

/// A request that asks for the decision headers (`x-llm-router-explain`), which
/// these tests read the decision from.
fn spec(path: &str, body: Vec<u8>, chunks: usize) -> RequestSpec<'_> {
    let mut s = RequestSpec::post_json(path, body);
    s.body_chunks = chunks;
    s.headers.push((EXPLAIN_HEADER, "1"));
    s
}

/// What the filter decided for one request, read from the request it let upstream and
/// the response headers it added.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Routed {
    handle: StreamHandle,
    cluster: String,
    worker: String,
    decision: String,
    reason: String,
}

fn header_count(out: &StreamOutcome, name: &str) -> usize {
    out.request_headers
        .iter()
        .filter(|(k, _)| k == name)
        .count()
}

/// Sends `spec`, checks it went upstream with one routing header and a route-cache
/// clear, then lets the upstream answer 200 (the stream stays open).
fn send_open(host: &mut Host, vm: usize, spec: RequestSpec<'_>) -> Routed {
    let body = spec.body.clone();
    let out = host.vm(vm).request(spec).expect("request");
    assert!(
        out.continued,
        "the request must go upstream: {:?}\nlogs: {:?}",
        out.local_response,
        host.logs(vm)
    );
    assert_eq!(out.request_body, body, "the body goes upstream unchanged");
    assert_eq!(header_count(&out, CLUSTER_HEADER), 1, "{out:?}");
    assert_eq!(out.clear_route_cache, 1, "the route is looked up again");
    let cluster = out.header(CLUSTER_HEADER).unwrap().to_string();
    let resp = host
        .vm(vm)
        .respond(
            out.handle,
            200,
            &[("content-type", "application/json")],
            b"{}",
        )
        .expect("respond");
    let get = |h: &str| {
        resp.header(h)
            .unwrap_or_else(|| panic!("response lacks {h}: {:?}", resp.headers))
            .to_string()
    };
    Routed {
        handle: out.handle,
        cluster,
        worker: get("x-llm-router-worker"),
        decision: get("x-llm-router-decision"),
        reason: get("x-llm-router-reason"),
    }
}

/// [`send_open`], then the stream completes.
fn send(host: &mut Host, vm: usize, spec: RequestSpec<'_>) -> Routed {
    let r = send_open(host, vm, spec);
    host.vm(vm).finish(r.handle).expect("finish");
    r
}

fn chat_req(host: &mut Host, turns: &[&str]) -> Routed {
    send(host, 0, spec("/v1/chat/completions", chat("m", turns), 1))
}

fn assert_no_failure(host: &Host, vms: usize) {
    for vm in 0..vms {
        assert_eq!(host.failure(vm), None, "VM {vm} trapped");
    }
}

/// A long system prompt, so that one conversation's turns share most of their text.
fn system_prompt(tag: &str) -> String {
    format!("{tag}: ").repeat(8) + &"You are a helpful assistant. Answer briefly. ".repeat(20)
}

#[test]
fn multi_turn_conversation_sticks_to_its_first_worker() {
    let mut host = host(&fleet(4, r#","policy":"cache_aware""#));
    let sys = system_prompt("conv");
    let mut turns: Vec<String> = vec![sys.clone(), "first question".into()];
    let first = chat_req(
        &mut host,
        &turns.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    assert_eq!(
        (first.decision.as_str(), first.reason.as_str()),
        ("cache_miss", "cache_miss")
    );
    let idx: usize = first.worker[1..].parse().unwrap();
    assert_eq!(first.cluster, format!("engine_{idx}"));
    for turn in 1..6 {
        turns.push(format!("answer {turn}"));
        turns.push(format!("follow-up question {turn}"));
        let r = chat_req(
            &mut host,
            &turns.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        assert_eq!(r.worker, first.worker, "turn {turn} moved");
        assert_eq!(r.cluster, first.cluster);
        assert_eq!(
            (r.decision.as_str(), r.reason.as_str()),
            ("cache_hit", "cache_hit")
        );
    }
    assert_eq!(metric(&host, HIT), 5);
    assert_eq!(metric(&host, MISS), 1);
    assert_eq!(metric(&host, UNREADABLE), 0);
    assert_eq!(metric(&host, NO_WORKER), 0);
    assert_no_failure(&host, 1);
}

#[test]
fn different_prefixes_spread_over_an_idle_fleet() {
    let mut host = host(&fleet(4, ""));
    let mut per_worker: BTreeMap<String, usize> = BTreeMap::new();
    for i in 0..40 {
        let prompt = format!("{i:03} a distinct conversation opener, number {i}, nothing shared");
        let r = send(
            &mut host,
            0,
            spec("/v1/completions", completion("m", &prompt), 1),
        );
        assert_eq!(r.decision, "cache_miss", "prompt {i}: {r:?}");
        *per_worker.entry(r.worker).or_default() += 1;
    }
    assert_eq!(
        per_worker.len(),
        4,
        "misses on an idle fleet go least-load with random ties: {per_worker:?}"
    );
    assert!(
        per_worker.values().all(|&n| n >= 4),
        "roughly even: {per_worker:?}"
    );
    assert_eq!(metric(&host, MISS), 40);
    assert_eq!(metric(&host, HIT), 0);
}

#[test]
fn client_routing_headers_are_replaced() {
    let mut host = host(&fleet(2, ""));
    let body = chat("m", &["pick me a worker"]);
    let mut s = spec("/v1/chat/completions", body.clone(), 1);
    s.headers.push((CLUSTER_HEADER, "evil_cluster"));
    s.headers.push((ENDPOINT_HEADER, "6.6.6.6:6666"));
    s.headers.push(("x-llm-router-cluster", "evil_again"));
    let out = host.vm(0).request(s).unwrap();
    assert!(out.continued);
    assert_eq!(header_count(&out, CLUSTER_HEADER), 1, "{out:?}");
    let cluster = out.header(CLUSTER_HEADER).unwrap();
    assert!(
        cluster == "engine_0" || cluster == "engine_1",
        "client value kept: {cluster}"
    );
    assert_eq!(
        out.header(ENDPOINT_HEADER),
        None,
        "a client endpoint header must not reach the router"
    );
    assert_eq!(out.header(":path"), Some("/v1/chat/completions"));
    assert_eq!(out.header("content-type"), Some("application/json"));
}

/// A body that names its API alone (one of `messages`, `prompt` and `text`) is
/// routed without reading `:path`, a copy into the VM that costs Envoy about 8k
/// instructions; a body that leaves it open, or none, reads it.
#[test]
fn a_body_that_names_its_api_is_routed_without_reading_the_path() {
    let mut host = host(&fleet(2, ""));
    let mut reads = |path: &str, body: &[u8]| {
        let out = host
            .vm(0)
            .request(RequestSpec::post_json(path, body.to_vec()))
            .unwrap();
        assert!(out.continued, "{path} is routed: {:?}", out.local_response);
        out.request_header_reads
    };
    // Each asks for the explain header, which the request does not carry.
    let unread = vec![EXPLAIN_HEADER.to_string()];
    assert_eq!(reads("/v1/chat/completions", &chat("m", &["hi"])), unread);
    assert_eq!(reads("/v1/completions", &completion("m", "hi")), unread);
    assert_eq!(reads("/generate", br#"{"text":"hi"}"#), unread);
    for (path, body) in [
        ("/v1/embeddings", &br#"{"model":"m","input":"hi"}"#[..]),
        (
            "/v1/responses",
            br#"{"input":"hi","text":{"format":{"type":"text"}}}"#,
        ),
        ("/v1/completions", br#"{"prompt":"hi","messages":[]}"#),
        ("/v1/completions", b"not json"),
        ("/v1/completions", b""),
    ] {
        let read = reads(path, body);
        assert!(read.contains(&":path".to_string()), "{path}: {read:?}");
    }
}

/// `messages` sent to `/v1/completions` routes as the chat it is (reading the path
/// would have made it an unreadable completion, routed by load), and the engine's
/// refusal takes back its record: the prefix follows no worker.
#[test]
fn a_body_that_contradicts_its_path_routes_by_its_body_until_refused() {
    let mut host = host(&fleet(2, ""));
    let turns = ["a conversation sent to the wrong path"];
    let out = host
        .vm(0)
        .request(spec("/v1/completions", chat("m", &turns), 1))
        .unwrap();
    assert!(out.continued);
    let resp = host.vm(0).respond(out.handle, 400, &[], b"{}").unwrap();
    assert_eq!(
        resp.header("x-llm-router-reason"),
        Some("cache_miss"),
        "read as chat, not as a completion without a prompt: {:?}",
        resp.headers
    );
    host.vm(0).finish(out.handle).unwrap();
    assert_eq!(metric(&host, "wasmcustom.llm_router_unserved"), 1);
    let right = send(
        &mut host,
        0,
        spec("/v1/chat/completions", chat("m", &turns), 1),
    );
    assert_eq!(right.decision, "cache_miss", "{right:?}");
}

/// A request an engine refuses (a 4xx) was never prefilled: its record goes, and
/// the worker stays in rotation; the same text answered 200 is a hit next time.
#[test]
fn a_refused_request_leaves_nothing_recorded() {
    let mut host = host(&fleet(2, ""));
    let turns = ["a prompt longer than the engine's context"];
    let ask = || spec("/v1/chat/completions", chat("m", &turns), 1);
    let out = host.vm(0).request(ask()).unwrap();
    host.vm(0).respond(out.handle, 400, &[], b"{}").unwrap();
    host.vm(0).finish(out.handle).unwrap();
    assert_eq!(metric(&host, "wasmcustom.llm_router_unserved"), 1);
    let logs = host.logs(0);
    assert!(
        !logs.iter().any(|l| l.message.contains("out of rotation")),
        "no verdict on the worker: {logs:?}"
    );
    let first = send(&mut host, 0, ask());
    assert_eq!(first.decision, "cache_miss", "{first:?}");
    let again = send(&mut host, 0, ask());
    assert_eq!(
        (again.decision.as_str(), &again.worker),
        ("cache_hit", &first.worker)
    );
}

#[test]
fn endpoint_target_sets_the_endpoint_header() {
    let cfg = r#"{"target":"endpoint","workers":[
        {"name":"w0","address":"10.0.0.1:8000"},
        {"name":"w1","address":"10.0.0.2:8000"}]}"#;
    let mut host = host(cfg);
    let mut seen = BTreeSet::new();
    for i in 0..12 {
        let mut s = spec(
            "/v1/completions",
            completion("m", &format!("{i} endpoint mode prompt {i}")),
            1,
        );
        s.headers.push((ENDPOINT_HEADER, "6.6.6.6:6666"));
        s.headers.push((CLUSTER_HEADER, "evil_cluster"));
        let out = host.vm(0).request(s).unwrap();
        assert!(out.continued);
        assert_eq!(header_count(&out, ENDPOINT_HEADER), 1, "{out:?}");
        assert_eq!(out.header(CLUSTER_HEADER), None, "{out:?}");
        let ep = out.header(ENDPOINT_HEADER).unwrap().to_string();
        let resp = host.vm(0).respond(out.handle, 200, &[], b"{}").unwrap();
        let worker = resp.header("x-llm-router-worker").unwrap();
        let expect = if worker == "w0" {
            "10.0.0.1:8000"
        } else {
            "10.0.0.2:8000"
        };
        assert_eq!(ep, expect, "endpoint of {worker}");
        host.vm(0).finish(out.handle).unwrap();
        seen.insert(ep);
    }
    assert_eq!(seen.len(), 2, "both endpoints used: {seen:?}");
}

/// The same request sequence through two hosts with the same seed, one with each body
/// in one chunk and one with it in many: the decisions are identical.
#[test]
fn a_body_in_several_chunks_routes_like_one_chunk() {
    let cfg = fleet(4, "");
    let mut whole = host_with(&cfg, 1, 21);
    let mut chunked = host_with(&cfg, 1, 21);
    let sys = system_prompt("chunks");
    for conv in 0..6 {
        let mut turns = vec![format!("{conv} {sys}"), format!("question of {conv}")];
        for turn in 0..3 {
            let refs: Vec<&str> = turns.iter().map(String::as_str).collect();
            let body = chat("m", &refs);
            let a = send(&mut whole, 0, spec("/v1/chat/completions", body.clone(), 1));
            let chunks = 2 + (conv * 3 + turn) % 11;
            let b = send(&mut chunked, 0, spec("/v1/chat/completions", body, chunks));
            assert_eq!(
                (&a.worker, &a.decision, &a.reason),
                (&b.worker, &b.decision, &b.reason),
                "conversation {conv} turn {turn} in {chunks} chunks"
            );
            turns.push(format!("answer {turn}"));
            turns.push(format!("more {turn}"));
        }
    }
    for m in [HIT, MISS] {
        assert_eq!(metric(&whole, m), metric(&chunked, m), "{m}");
    }
    assert_eq!(metric(&whole, HIT), 12, "turns 2 and 3 of 6 conversations");
}

#[test]
fn unreadable_and_empty_bodies_are_still_routed() {
    let mut host = host(&fleet(2, ""));
    let not_json = send(
        &mut host,
        0,
        spec("/v1/chat/completions", b"this is not json".to_vec(), 1),
    );
    assert_eq!(
        (not_json.decision.as_str(), not_json.reason.as_str()),
        ("cache_miss", "unreadable_body")
    );
    // Headers only (end_of_stream on the headers), like a GET.
    let empty = RequestSpec {
        headers: vec![
            (":method", "GET"),
            (":path", "/v1/models"),
            (":authority", "host-sim"),
            (EXPLAIN_HEADER, "1"),
        ],
        body: Vec::new(),
        body_chunks: 0,
    };
    let empty = send(&mut host, 0, empty);
    assert_eq!(empty.reason, "unreadable_body");
    assert_eq!(empty.decision, "cache_miss");
    // JSON without routing text, and a JSON array.
    let no_text = send(
        &mut host,
        0,
        spec("/v1/chat/completions", br#"{"model":"m"}"#.to_vec(), 1),
    );
    assert_eq!(no_text.reason, "unreadable_body");
    let array = send(
        &mut host,
        0,
        spec("/v1/completions", b"[1,2,3]".to_vec(), 1),
    );
    assert_eq!(array.reason, "unreadable_body");
    assert_eq!(metric(&host, UNREADABLE), 4);
    assert_eq!(metric(&host, MISS), 4);
    assert_eq!(metric(&host, HIT), 0);
}

#[test]
fn a_model_no_worker_serves_gets_a_local_503() {
    let cfg = r#"{"workers":[
        {"name":"a","cluster":"engine_a","models":["m1"]},
        {"name":"b","cluster":"engine_b","models":["m1","m2"]}]}"#;
    let mut host = host(cfg);
    let out = host
        .vm(0)
        .request(spec(
            "/v1/chat/completions",
            chat("m3", &["nobody serves me"]),
            1,
        ))
        .unwrap();
    assert!(!out.continued);
    assert!(!out.headers_forwarded, "nothing goes upstream");
    let reply = out.local_response.as_ref().expect("a local reply");
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.header("x-llm-router-reason"),
        Some("no_worker_for_model")
    );
    assert!(
        String::from_utf8_lossy(&reply.body).contains("no_worker_for_model"),
        "{reply:?}"
    );
    assert_eq!(out.header(CLUSTER_HEADER), None);
    assert_eq!(out.clear_route_cache, 0);
    assert!(out.finished, "a local reply completes the stream");
    assert_eq!(metric(&host, NO_WORKER), 1);
    assert_eq!(metric(&host, HIT) + metric(&host, MISS), 0, "no decision");

    // m2 only on b; m1 on both.
    for i in 0..5 {
        let r = send(
            &mut host,
            0,
            spec(
                "/v1/completions",
                completion("m2", &format!("{i} m2 prompt")),
                1,
            ),
        );
        assert_eq!((r.worker.as_str(), r.cluster.as_str()), ("b", "engine_b"));
    }
    // An unreadable body with an unknown model is refused too; unreadable, no decision.
    let out = host
        .vm(0)
        .request(spec(
            "/v1/chat/completions",
            br#"{"model":"m9"}"#.to_vec(),
            1,
        ))
        .unwrap();
    assert_eq!(out.local_response.map(|r| r.status), Some(503));
    assert_eq!(metric(&host, NO_WORKER), 2);
    assert_eq!(metric(&host, HIT) + metric(&host, MISS), 5);
    assert_no_failure(&host, 1);
}

#[test]
fn decisions_sum_to_routed_requests() {
    let cfg = r#"{"workers":[
        {"name":"w0","cluster":"engine_0","models":["m"]},
        {"name":"w1","cluster":"engine_1","models":["m"]},
        {"name":"w2","cluster":"engine_2"}]}"#;
    let mut host = host_with(cfg, 2, 5);
    let sys = system_prompt("sum");
    let mut routed = 0u64;
    let mut refused = 0u64;
    let mut open = Vec::new();
    for i in 0..60u64 {
        let vm = (i % 2) as usize;
        let model = if i % 7 == 3 { "other" } else { "m" };
        let (path, body) = match i % 5 {
            0 => ("/v1/chat/completions", b"garbage".to_vec()),
            1 => ("/v1/completions", completion(model, &format!("{i} {sys}"))),
            _ => (
                "/v1/chat/completions",
                chat(model, &[&sys, &format!("question {}", i % 4)]),
            ),
        };
        let out = host
            .vm(vm)
            .request(spec(path, body, 1 + (i as usize % 3)))
            .unwrap();
        if out.continued {
            routed += 1;
            if i % 4 == 0 {
                open.push(out.handle);
            } else if i % 4 == 1 {
                host.vm(vm).reset(out.handle).unwrap();
            } else {
                host.vm(vm).respond(out.handle, 200, &[], b"{}").unwrap();
                host.vm(vm).finish(out.handle).unwrap();
            }
        } else {
            assert_eq!(out.local_response.map(|r| r.status), Some(503));
            refused += 1;
        }
    }
    // "other" is served by w2 alone, so nothing here is refused; refuse some now.
    for vm in 0..2 {
        let out = host
            .vm(vm)
            .request(spec("/v1/completions", completion("", "x"), 1))
            .unwrap();
        assert!(out.continued, "an empty model is served by w2 (any model)");
        routed += 1;
        host.vm(vm).finish(out.handle).unwrap();
    }
    let cfg_strict = r#"{"workers":[{"name":"w0","models":["m"]}]}"#;
    let mut strict = host_with(cfg_strict, 1, 7);
    for body in [
        completion("x", "p"),
        b"not json".to_vec(),
        completion("m", "p"),
    ] {
        let out = strict
            .vm(0)
            .request(spec("/v1/completions", body, 1))
            .unwrap();
        if out.continued {
            strict.vm(0).finish(out.handle).unwrap();
        }
    }
    assert_eq!(
        metric(&strict, HIT) + metric(&strict, MISS),
        2,
        "the m request, and the unreadable one (it names no model, so any worker takes it)"
    );
    assert_eq!(metric(&strict, NO_WORKER), 1, "only the x request");

    assert_eq!(refused, 0);
    assert_eq!(routed, 62);
    // A VM holding requests hands its counters over on its first tick a second
    // after its last hand-over.
    host.advance_time(2_000).unwrap();
    assert_eq!(metric(&host, HIT) + metric(&host, MISS), routed);
    assert_eq!(metric(&host, NO_WORKER), refused);
    assert_eq!(
        metric(&host, UNREADABLE),
        12,
        "every fifth of 60 is garbage"
    );
    assert!(metric(&host, HIT) > 0);
    for h in open {
        host.vm(h.vm).finish(h).unwrap();
    }
    assert_no_failure(&host, 2);
}

/// Holds `n` streams of `body` open on VM `vm` and returns them with their decisions.
fn hold(host: &mut Host, vm: usize, body: &[u8], n: usize) -> Vec<Routed> {
    (0..n)
        .map(|_| send_open(host, vm, spec("/v1/chat/completions", body.to_vec(), 1)))
        .collect()
}

/// With SMG 1.13's defaults (abs 64, rel 1.5) on two workers, an owner at `n` in
/// flight and the other idle hold a mean of `n / 2`, and the owner spills once it is
/// more than `max(4, 2 * sqrt(n / 2))` over it: it takes hits up to 8 in flight,
/// and the request that sees 9 goes least-load.
#[test]
fn an_imbalanced_fleet_goes_least_load_with_default_thresholds() {
    let mut host = host(&fleet(2, ""));
    let body = chat("m", &[&system_prompt("hot"), "the hot prefix"]);
    let first = send(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(first.decision, "cache_miss");
    let held = hold(&mut host, 0, &body, 9);
    assert!(
        held.iter()
            .all(|r| r.worker == first.worker && r.reason == "cache_hit"),
        "up to 8 in flight on the owner is within the swing"
    );
    let diverted = send_open(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(diverted.reason, "imbalanced", "{diverted:?}");
    assert_eq!(diverted.decision, "cache_miss");
    assert_ne!(diverted.worker, first.worker);
    // A VM holding requests hands its counters over on its first tick a second
    // after its last hand-over.
    host.advance_time(2_000).unwrap();
    assert_eq!(metric(&host, HIT), 9);
    assert_eq!(metric(&host, MISS), 2);
}

/// Lower thresholds in the config: abs 2 (under 4, so the margin), rel 1.5. Owner
/// at 5 and other at 0 spills (2.5 over the mean of 2.5, and 5 > 3.75); owner at 5
/// and other at 1 does not (2 over the mean of 3 is not over 2).
#[test]
fn an_imbalanced_fleet_honours_configured_thresholds() {
    let mut host = host(&fleet(
        2,
        r#","balance_abs_threshold":2,"balance_rel_threshold":1.5"#,
    ));
    let body = chat("m", &[&system_prompt("hot"), "the hot prefix"]);
    let held = hold(&mut host, 0, &body, 5);
    let owner = held[0].worker.clone();
    assert_eq!(held[0].decision, "cache_miss");
    assert!(held[1..]
        .iter()
        .all(|r| r.worker == owner && r.reason == "cache_hit"));
    // Owner 5, other 0: spills.
    let d = send_open(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!((d.reason.as_str(), d.worker != owner), ("imbalanced", true));
    // Owner 5, other 1: the diverted request made the other an owner too, and the
    // least-loaded owner (the other, 1 < 5) takes the hit.
    let h = send_open(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(h.reason, "cache_hit");
    assert_ne!(h.worker, owner, "least-loaded owner");
    assert_no_failure(&host, 1);
}

/// One router per Envoy: the prefix tree and the in-flight counts are shared by the
/// VMs (worker threads), so what VM 0 routed and holds open steers VM 1. Every
/// request syncs here (`sync_batch_ms` 0): `tests/sync.rs` covers the window.
#[test]
fn in_flight_and_prefixes_are_shared_across_vms() {
    let mut host = host_with(
        &fleet(2, r#","balance_abs_threshold":2,"sync_batch_ms":0"#),
        2,
        3,
    );
    let body = chat("m", &[&system_prompt("vm"), "shared"]);
    let first = send(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(first.reason, "cache_miss");
    let on_vm1 = send(&mut host, 1, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(
        (on_vm1.reason.as_str(), &on_vm1.worker),
        ("cache_hit", &first.worker),
        "VM 1 sees the prefix VM 0 routed"
    );
    // Owner at 5 in flight on VM 0, other at 0: 2.5 over the mean of 2.5 with a
    // margin of 2 (the threshold), seen from VM 1 too.
    let held = hold(&mut host, 0, &body, 5);
    assert!(held.iter().all(|r| r.worker == first.worker));
    let d = send_open(&mut host, 1, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(d.reason, "imbalanced", "VM 1 sees VM 0's load");
    assert_ne!(d.worker, first.worker);
    // Released on VM 0, balanced again everywhere.
    for r in &held {
        host.vm(0).finish(r.handle).unwrap();
    }
    host.vm(1).finish(d.handle).unwrap();
    let again = send(&mut host, 1, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(again.reason, "cache_hit");
    assert_no_failure(&host, 2);
}

/// Every stream gives its in-flight slot back however it ends (finish after a
/// response, reset before or after one): afterwards the fleet is idle again.
#[test]
fn in_flight_counts_return_after_finish_and_reset() {
    let mut host = host(&fleet(
        2,
        r#","balance_abs_threshold":8,"balance_rel_threshold":1.5"#,
    ));
    for round in 0..3 {
        // A prefix of its own per round (earlier rounds made both workers owners of
        // theirs). The owner reaches 9 in flight (the first is the miss that makes it
        // owner); the next one is diverted.
        let body = chat(
            "m",
            &[&system_prompt(&format!("inflight{round}")), "held prefix"],
        );
        let held = hold(&mut host, 0, &body, 9);
        let owner = held[0].worker.clone();
        assert!(held.iter().all(|r| r.worker == owner), "round {round}");
        // Also streams reset before any response.
        let mut unanswered = Vec::new();
        let d = send_open(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
        assert_eq!(d.reason, "imbalanced", "round {round}");
        for _ in 0..3 {
            let out = host
                .vm(0)
                .request(spec("/v1/chat/completions", body.clone(), 1))
                .unwrap();
            assert!(out.continued);
            unanswered.push(out.handle);
        }
        // End them all, in mixed ways.
        for (i, r) in held.iter().chain([&d]).enumerate() {
            if i % 2 == 0 {
                host.vm(0).finish(r.handle).unwrap();
            } else {
                host.vm(0).reset(r.handle).unwrap();
            }
        }
        for h in unanswered {
            host.vm(0).reset(h).unwrap();
        }
        // Idle again: a hit goes to the lowest-id least-loaded owner (both own it now),
        // not least-load by imbalance.
        let after = send(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
        assert_eq!(after.reason, "cache_hit", "round {round}: {after:?}");
        // And fresh prefixes spread over both workers as on an idle fleet.
        let mut seen = BTreeSet::new();
        for i in 0..16 {
            let r = send(
                &mut host,
                0,
                spec(
                    "/v1/completions",
                    completion("m", &format!("{round}-{i} fresh idle-fleet prompt {i}")),
                    1,
                ),
            );
            assert_eq!(r.reason, "cache_miss");
            seen.insert(r.worker);
        }
        assert_eq!(seen.len(), 2, "round {round}: {seen:?}");
    }
    assert_no_failure(&host, 1);
}

/// Streams reset right after routing (no response) give their slot back: with
/// `balance_abs_threshold: 1` (the margin), ten of them leave the fleet as idle as
/// before.
#[test]
fn reset_streams_release_their_slot() {
    let mut host = host(&fleet(2, r#","balance_abs_threshold":1"#));
    let body = chat("m", &[&system_prompt("early"), "early reset"]);
    let owner = send(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    for _ in 0..10 {
        let out = host
            .vm(0)
            .request(spec("/v1/chat/completions", body.clone(), 1))
            .unwrap();
        host.vm(0).reset(out.handle).unwrap();
    }
    // Owner 0 in flight: a hit.
    let a = send_open(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!((a.reason.as_str(), &a.worker), ("cache_hit", &owner.worker));
    for n in 1..=2 {
        let b = send_open(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
        assert_eq!(b.reason, "cache_hit", "owner {n} in flight, other 0");
    }
    let c = send_open(&mut host, 0, spec("/v1/chat/completions", body.clone(), 1));
    assert_eq!(c.reason, "imbalanced", "owner 3 in flight, other 0");
}

#[test]
fn invalid_plugin_config_fails_build_and_names_the_field() {
    let cases = [
        (r#"{"workers":[]}"#, "`workers`"),
        (
            r#"{"workers":[{"name":"a"}],"cache_threshold":2}"#,
            "`cache_threshold`",
        ),
        (
            r#"{"workers":[{"name":"a"}],"balance_rel_threshold":0.5}"#,
            "`balance_rel_threshold`",
        ),
        (
            r#"{"workers":[{"name":"a"}],"cache_treshold":0.5}"#,
            "cache_treshold",
        ),
        (
            r#"{"target":"endpoint","workers":[{"name":"a"}]}"#,
            "`workers[0].address`",
        ),
        (
            r#"{"workers":[{"name":"a"},{"name":"a"}]}"#,
            "`workers[1].name`",
        ),
        (
            r#"{"workers":[{"name":"a"}],"policy":"prefix_hash"}"#,
            "prefix_hash",
        ),
        (
            r#"{"workers":[{"name":"a"}],"cluster_header":"X Bad"}"#,
            "`cluster_header`",
        ),
        ("not json at all", "`configuration`"),
        ("", "`configuration`"),
    ];
    for (cfg, needle) in cases {
        let err = match Host::builder_for(&filter())
            .plugin_config(cfg.as_bytes().to_vec())
            .allow_on_headers_stop_iteration(true)
            .build()
        {
            Ok(_) => panic!("config {cfg:?} was accepted"),
            Err(e) => format!("{e:#}"),
        };
        assert!(
            err.contains("proxy_on_configure returned false"),
            "{cfg}: {err}"
        );
        assert!(
            err.contains("invalid plugin config") && err.contains(needle),
            "the log for {cfg:?} must name {needle}: {err}"
        );
    }
    // And a valid one with every field builds.
    let full = r#"{"policy":"cache_aware","target":"cluster","workers":[{"name":"a","cluster":"c","pool":"regular","models":[]}],
        "cache_threshold":0.5,"balance_abs_threshold":1,"balance_rel_threshold":1.0,"max_tree_size":10,
        "max_total_tree_chars":100,"eviction_interval_ms":5,"max_models":1,"cluster_header":"x-c",
        "endpoint_header":"x-e","decision_headers":false}"#;
    let mut host = host(full);
    let out = host
        .vm(0)
        .request(spec("/v1/completions", completion("m", "p"), 1))
        .unwrap();
    assert_eq!(out.header("x-c"), Some("c"));
    let resp = host.vm(0).respond(out.handle, 200, &[], b"").unwrap();
    assert_eq!(
        resp.header("x-llm-router-decision"),
        None,
        "decision_headers off, even for a request that asks"
    );
}

#[test]
fn decision_headers_go_to_requests_that_ask_unless_configured_otherwise() {
    let config = |extra: &str| format!(r#"{{"workers":[{{"name":"w0","cluster":"c0"}}]{extra}}}"#);
    for (extra, asks, expected) in [
        ("", false, None),
        ("", true, Some("w0")),
        (r#","decision_headers":"on_request""#, false, None),
        (r#","decision_headers":"on_request""#, true, Some("w0")),
        (r#","decision_headers":true"#, false, Some("w0")),
        (r#","decision_headers":false"#, true, None),
    ] {
        let mut host = host(&config(extra));
        let mut s = RequestSpec::post_json("/v1/completions", completion("m", "p"));
        if asks {
            s.headers.push((EXPLAIN_HEADER, ""));
        }
        let out = host.vm(0).request(s).unwrap();
        assert!(out.continued);
        let resp = host.vm(0).respond(out.handle, 200, &[], b"{}").unwrap();
        let case = format!("config {extra:?}, the request asks: {asks}");
        assert_eq!(resp.header("x-llm-router-worker"), expected, "{case}");
        assert_eq!(
            resp.header("x-llm-router-decision").is_some(),
            expected.is_some(),
            "{case}"
        );
        assert_eq!(
            resp.header("x-llm-router-reason").is_some(),
            expected.is_some(),
            "{case}"
        );
    }
    let err = Host::builder_for(&filter())
        .plugin_config(config(r#","decision_headers":"always""#).into_bytes())
        .build()
        .map(|_| ())
        .unwrap_err();
    assert!(
        format!("{err:#}").contains("decision_headers must be true, false or \"on_request\""),
        "{err:#}"
    );
}

/// `n` fixed-seed garbage bytes.
fn garbage(rng: &mut SplitMix64, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.next_u64() as u8).collect()
}

fn garbage_bodies() -> Vec<(String, Vec<u8>)> {
    let mut rng = SplitMix64(0xbad_5eed);
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    for i in 0..8 {
        let n = [1, 7, 100, 1000, 4096, 65_536, 3, 500][i];
        out.push((format!("random {n} bytes"), garbage(&mut rng, n)));
    }
    // Random bytes that start like JSON.
    let mut b = b"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"".to_vec();
    b.extend(garbage(&mut rng, 2000));
    out.push(("json prefix then random bytes".into(), b));
    out.push(("huge array nesting".into(), vec![b'['; 1 << 20]));
    out.push((
        "huge object nesting".into(),
        b"{\"a\":".repeat(200_000).to_vec(),
    ));
    let depth = 100_000;
    let nested = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":{}"x"{}}}]}}"#,
        "[".repeat(depth),
        "]".repeat(depth)
    );
    out.push((
        "deeply nested but balanced json".into(),
        nested.into_bytes(),
    ));
    let nested_obj = format!(
        r#"{{"model":"m","prompt":{}1{}}}"#,
        r#"{"k":"#.repeat(5000),
        "}".repeat(5000)
    );
    out.push(("deeply nested objects".into(), nested_obj.into_bytes()));
    // Invalid UTF-8 inside JSON strings, in the model and in the text.
    let mut bad = br#"{"model":"m","prompt":"caf"#.to_vec();
    bad.extend([0xc3, 0x28, 0xff, 0xfe, 0xed, 0xa0, 0x80]);
    bad.extend(br#" end"}"#);
    out.push(("invalid utf-8 in prompt".into(), bad));
    let mut bad_model = br#"{"model":""#.to_vec();
    bad_model.extend([0xf0, 0x9f, 0x80]);
    bad_model.extend(br#"","messages":[{"role":"user","content":"hi"}]}"#);
    out.push(("invalid utf-8 in model".into(), bad_model));
    out.push((
        "lone surrogate escape".into(),
        br#"{"model":"m","prompt":"\ud800 lone"}"#.to_vec(),
    ));
    out.push(("nul bytes".into(), b"{\"prompt\":\"a\0b\"}\0\0\0".to_vec()));
    out.push((
        "huge number".into(),
        format!(r#"{{"model":"m","prompt":[{}]}}"#, "9".repeat(100_000)).into_bytes(),
    ));
    out.push((
        "token ids".into(),
        format!(
            r#"{{"model":"m","prompt":[{}]}}"#,
            (0..50_000)
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",")
        )
        .into_bytes(),
    ));
    out.push(("whitespace only".into(), b" \n\t\r ".to_vec()));
    out.push((
        "wrong types".into(),
        // Wrong types inside message objects (messages that are not objects get the
        // filter's 400 on a chat path: `health.rs`).
        br#"{"model":{"x":1},"stream":"yes","messages":[{"role":5,"content":{"type":"image"}},{"role":null,"content":[1,"two",null]}]}"#.to_vec(),
    ));
    out
}

fn big_prompt(bytes: usize) -> String {
    let base = "The quick brown fox jumps over the lazy dog; ";
    base.repeat(bytes / base.len() + 1)[..bytes].to_string()
}

fn non_ascii_texts() -> Vec<String> {
    vec![
        "日本語のシステムプロンプト。".repeat(200),
        "Ünïcödé café naïve façade — “quotes” ‘single’ ".repeat(100),
        "🦀🚀👩‍👩‍👧‍👦🏳️‍🌈 emoji with ZWJ sequences ".repeat(100),
        "e\u{301}\u{302}\u{303} combining marks a\u{308}o\u{308} ".repeat(100),
        "עברית ومرحبا بالعالم RTL mixed ".repeat(100),
        "\u{feff}BOM and \u{200b}zero width\u{200d} ".repeat(100),
    ]
}

#[test]
fn garbage_bodies_never_trap_the_vm() {
    let mut host = host_with(&fleet(3, ""), 1, 99);
    for (what, body) in garbage_bodies() {
        for chunks in [1, 5] {
            for path in ["/v1/chat/completions", "/v1/completions", "/generate", "/x"] {
                let out = host
                    .vm(0)
                    .request(spec(path, body.clone(), chunks))
                    .unwrap_or_else(|e| panic!("{what} to {path}: {e:#}"));
                assert!(out.continued, "{what} to {path} was not routed: {out:?}");
                assert_eq!(out.request_body, body, "{what}: body altered");
                host.vm(0).respond(out.handle, 200, &[], b"{}").unwrap();
                host.vm(0).finish(out.handle).unwrap();
                assert_eq!(host.failure(0), None, "{what} to {path}");
            }
        }
    }
    let routed = metric(&host, HIT) + metric(&host, MISS);
    assert_eq!(routed as usize, garbage_bodies().len() * 2 * 4);
    assert!(metric(&host, UNREADABLE) > 0);
}

#[test]
fn a_2_mib_prompt_is_routed_without_trapping() {
    let mut host = host(&fleet(4, ""));
    let prompt = big_prompt(2 << 20);
    for (path, body, chunks) in [
        ("/v1/completions", completion("m", &prompt), 16),
        ("/v1/completions", completion("m", &prompt), 1),
        (
            "/v1/chat/completions",
            chat("big", &[&prompt, "question"]),
            3,
        ),
    ] {
        let r = send(&mut host, 0, spec(path, body, chunks));
        assert!(r.cluster.starts_with("engine_"), "{r:?}");
    }
    assert_eq!(metric(&host, HIT) + metric(&host, MISS), 3);
    assert_no_failure(&host, 1);
}

/// A conversation whose context is long keeps its worker like a short one does:
/// texts over `max_routing_text_bytes` are matched and recorded by the same prefix,
/// so the match rate does not fall below the threshold as the context grows.
#[test]
fn a_long_context_conversation_sticks_to_its_worker() {
    for size in [512 << 10, 1 << 20, 2 << 20] {
        let mut host = host(&fleet(4, ""));
        let prompt = big_prompt(size);
        let first = send(
            &mut host,
            0,
            spec("/v1/completions", completion("m", &prompt), 16),
        );
        assert_eq!(first.decision, "cache_miss");
        let longer = format!("{prompt} and then a question");
        let again = send(
            &mut host,
            0,
            spec("/v1/completions", completion("m", &longer), 3),
        );
        assert_eq!(
            (again.decision.as_str(), &again.worker),
            ("cache_hit", &first.worker),
            "prompt of {} KiB: the next turn must hit its worker",
            size >> 10
        );
        let chat_first = send(
            &mut host,
            0,
            spec(
                "/v1/chat/completions",
                chat("big", &[&prompt, "question"]),
                1,
            ),
        );
        let chat_next = send(
            &mut host,
            0,
            spec(
                "/v1/chat/completions",
                chat("big", &[&prompt, "question", "answer", "more"]),
                1,
            ),
        );
        assert_eq!(
            (chat_next.decision.as_str(), &chat_next.worker),
            ("cache_hit", &chat_first.worker),
            "chat of {} KiB",
            size >> 10
        );
        assert_no_failure(&host, 1);
    }
}

#[test]
fn non_ascii_text_routes_and_sticks() {
    let mut host = host(&fleet(4, ""));
    for (i, text) in non_ascii_texts().into_iter().enumerate() {
        let first = send(
            &mut host,
            0,
            spec("/v1/chat/completions", chat("m", &[&text, "q1"]), 1),
        );
        assert_eq!(first.decision, "cache_miss", "text {i}");
        // The follow-up diverges inside a multi-byte sequence's neighbourhood.
        let next = send(
            &mut host,
            0,
            spec(
                "/v1/chat/completions",
                chat("m", &[&text, "q1", "答え", "🦀 q2"]),
                7,
            ),
        );
        assert_eq!(
            (next.decision.as_str(), &next.worker),
            ("cache_hit", &first.worker),
            "text {i}"
        );
        // Chunks that split UTF-8 sequences are reassembled before parsing.
        let body = completion("m", &text);
        let odd = send(
            &mut host,
            0,
            spec("/v1/completions", body.clone(), body.len() / 3),
        );
        assert_eq!(odd.decision, "cache_miss", "text {i}: new tree path");
    }
    assert_no_failure(&host, 1);
}

/// The filter keeps working across a reconfigure-free long run: many requests, several
/// models, eviction ticks in between (virtual clock).
#[test]
fn eviction_ticks_do_not_break_routing() {
    let mut host = host_with(
        &fleet(
            3,
            r#","max_tree_size":2000,"max_total_tree_chars":5000,"eviction_interval_ms":1000"#,
        ),
        2,
        11,
    );
    for i in 0..200 {
        let vm = i % 2;
        let model = format!("m{}", i % 5);
        let r = send(
            &mut host,
            vm,
            spec(
                "/v1/completions",
                completion(&model, &format!("{} {}", i % 17, big_prompt(300 + i))),
                1,
            ),
        );
        assert!(r.cluster.starts_with("engine_"));
        if i % 10 == 0 {
            host.advance_time(1_000).unwrap();
        }
    }
    assert!(host.metric("wasmcustom.llm_router_tree_chars").unwrap() <= 5000);
    assert_eq!(metric(&host, HIT) + metric(&host, MISS), 200);
    assert_no_failure(&host, 2);
}

/// `host-sim check-config` judges a config with the filter's own validation.
#[test]
fn cli_check_config_reports_the_filters_own_error() {
    let wasm = host_sim::require_built_filter();
    let run = |config: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_host-sim"))
            .args(["check-config", config, "--wasm"])
            .arg(&wasm)
            .output()
            .expect("host-sim runs")
    };
    let bad = run(r#"{"policy":"cache_aware","workers":[{"name":"a"}],"worker_queue_limit":0}"#);
    assert_eq!(bad.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("`worker_queue_limit` must be at least 1"),
        "{stderr}"
    );
    let good = run(r#"{"policy":"cache_aware","workers":[{"name":"a"}],"worker_queue_limit":3}"#);
    assert!(good.status.success(), "{good:?}");
    // The queue gate is `cache_aware`'s: under the default policy the error says
    // what to add.
    let default = run(r#"{"workers":[{"name":"a"}],"worker_queue_limit":3}"#);
    assert_eq!(default.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&default.stderr);
    assert!(
        stderr.contains("`worker_queue_limit` requires `policy: cache_aware`"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&good.stdout).contains("\"valid\": true"));
}
