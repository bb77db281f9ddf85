//! Prefill/decode disaggregation through the real filter: the main request goes to the
//! decode worker with the bootstrap fields, the same body goes to the prefill worker
//! with `dispatch_http_call`, and a failed prefill answers the client at once.
//!
//! Build the filter first: `cargo build -p llm-router --target wasm32-wasip1 --profile wasm`.

mod support;

use host_sim::{Host, HttpCall, RequestSpec, StreamOutcome};
use llm_router::support::header_names::EXPLAIN_HEADER;
use serde_json::Value;
use support::CLUSTER_HEADER;
const PAIRS: &str = "wasmcustom.llm_router_pd_pairs";
const FAILURES: &str = "wasmcustom.llm_router_pd_prefill_failures";

const PD: &str = r#"{"workers":[
    {"name":"p0","pool":"prefill","cluster":"prefill_0","address":"10.0.0.1:30000","bootstrap_port":8998},
    {"name":"p1","pool":"prefill","cluster":"prefill_1","address":"10.0.0.2:30000","bootstrap_port":8999},
    {"name":"d0","pool":"decode","cluster":"decode_0"},
    {"name":"d1","pool":"decode","cluster":"decode_1"}],
    "prefill_timeout_ms":2000}"#;

fn host(config: &str) -> Host {
    let clusters = ["prefill_0", "prefill_1", "decode_0", "decode_1"];
    support::host(config, 1, 11, &clusters)
}

fn chat(turns: &[&str]) -> Vec<u8> {
    support::chat("m", turns)
}

/// The request as it went upstream, and its one prefill copy.
fn send(host: &mut Host, path: &str, body: Vec<u8>) -> (StreamOutcome, HttpCall) {
    let length = body.len().to_string();
    let mut spec = RequestSpec::post_json(path, body);
    spec.headers.push(("content-length", &length));
    // Asks for the decision headers, which the tests read.
    spec.headers.push((EXPLAIN_HEADER, "1"));
    let out = host.vm(0).request(spec).expect("request");
    assert!(
        out.continued,
        "{:?}\n{:?}",
        out.local_response,
        host.logs(0)
    );
    assert_eq!(
        out.http_calls.len(),
        1,
        "one prefill copy: {:?}",
        out.http_calls
    );
    let call = out.http_calls[0].clone();
    (out, call)
}

fn json(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).expect("json body")
}

fn prefill_name(call: &HttpCall) -> &'static str {
    match call.cluster.as_str() {
        "prefill_0" => "p0",
        "prefill_1" => "p1",
        other => panic!("prefill copy sent to {other}"),
    }
}

#[test]
fn the_pair_gets_one_body_with_the_prefill_workers_bootstrap() {
    let mut host = host(PD);
    let (out, call) = send(&mut host, "/v1/chat/completions", chat(&["hello there"]));
    let decode = out.header(CLUSTER_HEADER).unwrap().to_string();
    assert!(decode.starts_with("decode_"), "{decode}");
    assert_eq!(
        call.body, out.request_body,
        "both engines get the same body"
    );
    assert_eq!(
        out.header("content-length"),
        Some(out.request_body.len().to_string().as_str()),
        "content-length follows the rewritten body"
    );
    let body = json(&out.request_body);
    let (host_ip, port) = match prefill_name(&call) {
        "p0" => ("10.0.0.1", 8998),
        _ => ("10.0.0.2", 8999),
    };
    assert_eq!(body["bootstrap_host"], host_ip);
    assert_eq!(body["bootstrap_port"], port);
    assert!(body["bootstrap_room"].as_u64().unwrap() < 1 << 63);
    assert_eq!(body["messages"][0]["content"], "hello there");
    assert_eq!(call.header(":method"), Some("POST"));
    assert_eq!(call.header(":path"), Some("/v1/chat/completions"));
    assert_eq!(call.header("content-type"), Some("application/json"));
    assert_eq!(
        call.header(CLUSTER_HEADER),
        None,
        "routing headers stay home"
    );
    assert_eq!(call.timeout_ms, 2000);
    host.answer_http_call(call.token, 200, &[], b"{}").unwrap();
    let resp = host
        .vm(0)
        .respond(
            out.handle,
            200,
            &[("content-type", "application/json")],
            b"{}",
        )
        .unwrap();
    assert_eq!(
        resp.header("x-llm-router-prefill-worker"),
        Some(prefill_name(&call))
    );
    assert_eq!(
        resp.header("x-llm-router-worker"),
        Some(if decode == "decode_0" { "d0" } else { "d1" })
    );
    assert_eq!(resp.header("x-llm-router-decision"), Some("cache_miss"));
    assert_eq!(
        resp.header("x-llm-router-decode-reason"),
        Some("power_of_two")
    );
    host.vm(0).finish(out.handle).unwrap();
    assert_eq!(host.metric(PAIRS), Some(1));
    assert_eq!(host.metric(FAILURES), Some(0));
}

#[test]
fn a_conversation_keeps_its_prefill_worker() {
    let mut host = host(PD);
    let system = "You are a meticulous assistant. ".repeat(30);
    let mut turns = vec![system.clone()];
    let mut owners = Vec::new();
    let mut rooms = std::collections::HashSet::new();
    for i in 0..6 {
        turns.push(format!("question {i}"));
        let refs: Vec<&str> = turns.iter().map(String::as_str).collect();
        let (out, call) = send(&mut host, "/v1/chat/completions", chat(&refs));
        rooms.insert(json(&out.request_body)["bootstrap_room"].as_u64().unwrap());
        owners.push(prefill_name(&call));
        host.answer_http_call(call.token, 200, &[], b"{}").unwrap();
        host.vm(0).respond(out.handle, 200, &[], b"{}").unwrap();
        host.vm(0).finish(out.handle).unwrap();
        turns.push(format!("answer {i}"));
    }
    assert!(owners.iter().all(|o| *o == owners[0]), "{owners:?}");
    assert_eq!(rooms.len(), 6, "every request has its own room");
    assert_eq!(
        host.metric("wasmcustom.llm_router_decisions_cache_hit"),
        Some(5)
    );
}

#[test]
fn a_completions_batch_gets_a_room_per_prompt() {
    let mut host = host(PD);
    let body = br#"{"model":"m","prompt":["first","second","third"],"max_tokens":3}"#.to_vec();
    let (out, call) = send(&mut host, "/v1/completions", body);
    let body = json(&call.body);
    assert_eq!(body["bootstrap_room"].as_array().map(Vec::len), Some(3));
    assert_eq!(body["bootstrap_host"].as_array().map(Vec::len), Some(3));
    assert_eq!(body["prompt"][2], "third");
    host.answer_http_call(call.token, 200, &[], b"{}").unwrap();
    host.vm(0).finish(out.handle).unwrap();
}

fn failed(host: &mut Host, fail: impl FnOnce(&mut Host, &HttpCall)) -> host_sim::LocalResponse {
    let (out, call) = send(host, "/v1/chat/completions", chat(&["doomed"]));
    fail(host, &call);
    let after = host.vm(0).outcome(out.handle).unwrap();
    after
        .local_response
        .expect("the client is answered at once")
}

#[test]
fn a_failed_prefill_answers_the_client_at_once() {
    let mut host = host(PD);
    let reply = failed(&mut host, |h, c| {
        h.answer_http_call(c.token, 500, &[], b"engine exploded")
            .unwrap()
    });
    assert_eq!(reply.status, 502);
    assert_eq!(reply.header("x-llm-router-reason"), Some("prefill_error"));
    let body = json(&reply.body);
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("HTTP 500") && msg.contains("engine exploded"),
        "{msg}"
    );

    let reply = failed(&mut host, |h, c| h.fail_http_call(c.token).unwrap());
    assert_eq!(reply.status, 502);
    assert_eq!(
        reply.header("x-llm-router-reason"),
        Some("prefill_unreachable")
    );

    let reply = failed(&mut host, |h, _| h.advance_time(2_001).unwrap());
    assert_eq!(reply.status, 504);
    assert_eq!(reply.header("x-llm-router-reason"), Some("prefill_timeout"));
    assert_eq!(host.metric(FAILURES), Some(3));
    assert_eq!(host.failure(0), None);
}

#[test]
fn bodies_that_cannot_carry_a_room_get_a_400() {
    let mut host = host(PD);
    let out = host
        .vm(0)
        .request(RequestSpec::post_json(
            "/v1/completions",
            b"[1,2,3]".to_vec(),
        ))
        .unwrap();
    let reply = out.local_response.expect("refused");
    assert_eq!(reply.status, 400);
    assert_eq!(
        reply.header("x-llm-router-reason"),
        Some("body_not_json_object")
    );
    assert!(out.http_calls.is_empty());
    assert_eq!(host.metric(PAIRS), Some(0));
}

#[test]
fn a_request_without_a_body_goes_to_decode_alone() {
    let mut host = host(PD);
    let spec = RequestSpec {
        headers: vec![
            (":method", "GET"),
            (":path", "/v1/models"),
            (":authority", "x"),
        ],
        body: Vec::new(),
        body_chunks: 0,
    };
    let out = host.vm(0).request(spec).unwrap();
    assert!(out.continued, "{:?}", out.local_response);
    assert!(out.header(CLUSTER_HEADER).unwrap().starts_with("decode_"));
    assert!(out.http_calls.is_empty());
}

#[test]
fn an_unknown_prefill_cluster_is_a_503_not_a_hang() {
    let path = host_sim::require_built_filter();
    let mut host = Host::builder(path)
        .plugin_config(PD.as_bytes().to_vec())
        .clusters(&["decode_0", "decode_1"])
        .allow_on_headers_stop_iteration(true)
        .build()
        .unwrap();
    let out = host
        .vm(0)
        .request(RequestSpec::post_json("/v1/chat/completions", chat(&["x"])))
        .unwrap();
    let reply = out.local_response.expect("refused");
    assert_eq!(reply.status, 503);
    assert_eq!(
        reply.header("x-llm-router-reason"),
        Some("prefill_dispatch_failed")
    );
    assert_eq!(host.metric(FAILURES), Some(1));
}

#[test]
fn with_target_endpoint_decode_goes_by_address_and_prefill_by_its_cluster() {
    let config = r#"{"target":"endpoint","workers":[
        {"name":"p0","pool":"prefill","cluster":"prefill_0","address":"10.0.0.1:30000","bootstrap_port":8998},
        {"name":"d0","pool":"decode","address":"10.0.1.1:30000"}]}"#;
    let mut host = host(config);
    let (out, call) = send(&mut host, "/v1/completions", br#"{"prompt":"x"}"#.to_vec());
    assert_eq!(
        out.header("x-gateway-destination-endpoint"),
        Some("10.0.1.1:30000")
    );
    assert_eq!(out.header(CLUSTER_HEADER), None);
    assert_eq!(call.cluster, "prefill_0");
    assert_eq!(json(&call.body)["bootstrap_host"], "10.0.0.1");
}

#[test]
fn the_prefill_tree_is_shared_across_vms() {
    let path = host_sim::require_built_filter();
    let mut host = Host::builder(path)
        .plugin_config(PD.as_bytes().to_vec())
        .clusters(&["prefill_0", "prefill_1", "decode_0", "decode_1"])
        .allow_on_headers_stop_iteration(true)
        .vms(3)
        .build()
        .unwrap();
    let system = "A long shared system prompt for every turn. ".repeat(20);
    let mut owners = Vec::new();
    for turn in 0..6 {
        let question = format!("question {turn}");
        let body = chat(&[&system, &question]);
        let vm = turn % 3;
        let out = host
            .vm(vm)
            .request(RequestSpec::post_json("/v1/chat/completions", body))
            .unwrap();
        let call = out.http_calls[0].clone();
        owners.push(prefill_name(&call));
        host.answer_http_call(call.token, 200, &[], b"{}").unwrap();
        host.vm(vm).respond(out.handle, 200, &[], b"{}").unwrap();
        host.vm(vm).finish(out.handle).unwrap();
    }
    assert!(owners.iter().all(|o| *o == owners[0]), "{owners:?}");
}
