//! `kv_match`: before deciding, the filter asks the collector which engines' KV
//! caches hold the prompt, and `cache_aware` follows the engines where the answer
//! covers every candidate; without an answer in time the tree decides. The real
//! filter, the collector's call answered by the test.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{Host, HttpCall, RequestSpec, StreamOutcome};
use llm_router::support::header_names::EXPLAIN_HEADER;
use support::CLUSTER_HEADER;

const WORKERS: usize = 3;
const KV: &str = r#","kv_match":{"cluster":"collector","timeout_ms":20}"#;

fn host(vms: usize, extra: &str) -> Host {
    let config = support::fleet_config(WORKERS, extra);
    let mut clusters = support::fleet_clusters(WORKERS);
    clusters.push("collector".into());
    let mut h = support::host(&config, vms, 11, &clusters);
    h.advance_time(10).unwrap();
    h
}

/// Sends a chat on `vm`: the stream waits, and its one call is the collector's.
fn ask(host: &mut Host, vm: usize, body: Vec<u8>) -> (StreamOutcome, HttpCall) {
    let mut spec = RequestSpec::post_json("/v1/chat/completions", body.clone());
    spec.headers.push((EXPLAIN_HEADER, "1"));
    let out = host.vm(vm).request(spec).expect("request runs");
    assert!(!out.continued, "the stream waits for the collector");
    assert_eq!(out.http_calls.len(), 1, "{:?}", out.http_calls);
    let call = out.http_calls[0].clone();
    assert_eq!(call.cluster, "collector");
    let header = |name: &str| {
        call.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(header(":method"), Some("POST"));
    assert_eq!(header(":path"), Some("/kv/match?path=/v1/chat/completions"));
    assert_eq!(
        call.body, body,
        "the collector reads the request's own body"
    );
    assert_eq!(call.timeout_ms, 20);
    (out, call)
}

/// The cluster the stream went to and the decision's reason, once it went on.
fn routed(host: &mut Host, vm: usize, out: &StreamOutcome) -> (String, String) {
    let after = host.vm(vm).outcome(out.handle).expect("outcome");
    assert!(after.continued, "routed: {:?}", after.local_response);
    let cluster = after
        .header(CLUSTER_HEADER)
        .expect("routing header")
        .to_string();
    let reason = support::answer(host, vm, out.handle).expect("reason header");
    (cluster, reason)
}

/// The collector's answer: `holder` holds 12 of the prompt's 13 blocks, the
/// others none (`stale`: one engine's index is not whole; a `holder` past the
/// workers: nobody holds a block).
fn answer(holder: usize, stale: Option<usize>) -> String {
    let engines: Vec<String> = (0..WORKERS)
        .map(|w| match (w == holder, Some(w) == stale) {
            (_, true) => format!(r#""w{w}":{{"index":"stale","held_blocks":null}}"#),
            (true, _) => format!(r#""w{w}":{{"index":"whole","held_blocks":12}}"#),
            _ => format!(r#""w{w}":{{"index":"whole","held_blocks":0}}"#),
        })
        .collect();
    format!(
        r#"{{"tokens":210,"block_tokens":16,"blocks":13,"engines":{{{}}}}}"#,
        engines.join(",")
    )
}

fn prompt(i: usize) -> Vec<u8> {
    support::chat(
        "m",
        &[&format!("conversation {i} that no one routed before")],
    )
}

#[test]
fn cache_aware_follows_the_engine_that_holds_the_prompt() {
    for vms in [1, 3] {
        let mut h = host(vms, KV);
        // Prompts the tree never saw, each held by another engine: by the tree
        // alone each is a miss by load.
        for i in 0..6 {
            let (holder, vm) = (i % WORKERS, i % vms);
            let (out, call) = ask(&mut h, vm, prompt(i));
            h.answer_http_call(call.token, 200, &[], answer(holder, None).as_bytes())
                .unwrap();
            let (cluster, reason) = routed(&mut h, vm, &out);
            assert_eq!(
                (cluster.as_str(), reason.as_str()),
                (format!("engine_{holder}").as_str(), "cache_hit"),
                "{vms} VMs, prompt {i}"
            );
        }
        h.advance_time(2_000).unwrap();
        assert_eq!(
            support::stat(&h, "llm_router_kv_match_ranked"),
            6,
            "{vms} VMs"
        );
        assert_eq!(support::stat(&h, "llm_router_kv_match_unanswered"), 0);
    }
}

/// What the collector's call meets instead of an answer.
type Fail = dyn Fn(&mut Host, &HttpCall);

#[test]
fn the_tree_decides_when_the_collector_does_not_answer_or_cannot_vouch() {
    let mut h = host(1, KV);
    // The tree learns where the conversation went.
    let (out, call) = ask(&mut h, 0, prompt(0));
    h.answer_http_call(call.token, 200, &[], answer(2, None).as_bytes())
        .unwrap();
    let (home, _) = routed(&mut h, 0, &out);
    assert_eq!(home, "engine_2");
    let elsewhere = 1;
    // Each failure: the next turn goes where the tree recorded it, a hit.
    let failures: [(&str, Box<Fail>); 5] = [
        ("timeout", Box::new(|h, _| h.advance_time(21).unwrap())),
        ("reset", Box::new(|h, c| h.fail_http_call(c.token).unwrap())),
        (
            "refused",
            Box::new(|h, c| {
                let body = br#"{"error":"no prompt"}"#;
                h.answer_http_call(c.token, 400, &[], body).unwrap()
            }),
        ),
        (
            "not json",
            Box::new(|h, c| h.answer_http_call(c.token, 200, &[], b"<html>").unwrap()),
        ),
        (
            "stale index",
            Box::new(move |h, c| {
                let body = answer(elsewhere, Some(2));
                h.answer_http_call(c.token, 200, &[], body.as_bytes())
                    .unwrap()
            }),
        ),
    ];
    for (what, fail) in &failures {
        let (out, call) = ask(&mut h, 0, prompt(0));
        fail(&mut h, &call);
        let (cluster, reason) = routed(&mut h, 0, &out);
        assert_eq!(
            (cluster.as_str(), reason.as_str()),
            ("engine_2", "cache_hit"),
            "{what}"
        );
    }
    // Every index whole and none holding a block: the tree's record stands.
    let (out, call) = ask(&mut h, 0, prompt(0));
    let nothing = answer(WORKERS, None);
    h.answer_http_call(call.token, 200, &[], nothing.as_bytes())
        .unwrap();
    let (cluster, reason) = routed(&mut h, 0, &out);
    assert_eq!(
        (cluster.as_str(), reason.as_str()),
        ("engine_2", "cache_hit")
    );
    h.advance_time(2_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_kv_match_deferred"), 1);
    assert_eq!(support::stat(&h, "llm_router_kv_match_unanswered"), 2);
    assert_eq!(support::stat(&h, "llm_router_kv_match_refused"), 2);
    assert_eq!(support::stat(&h, "llm_router_kv_match_partial"), 1);
    assert_eq!(support::stat(&h, "llm_router_kv_match_ranked"), 1);
}

#[test]
fn a_body_without_a_prompt_shape_is_not_asked_about() {
    let mut h = host(1, KV);
    let spec = RequestSpec::post_json("/v1/embeddings", br#"{"model":"m","input":"x"}"#.to_vec());
    let out = h.vm(0).request(spec).expect("request runs");
    assert!(out.continued, "routed at once: {:?}", out.local_response);
    assert!(out.http_calls.is_empty(), "{:?}", out.http_calls);
}
