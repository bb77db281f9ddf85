//! The OpenAI endpoints beyond chat and completions: `GET /v1/models` answered by the
//! router from its workers' declared models, embeddings routed by `input`, and
//! `/v1/responses` by `instructions` and `input` items, through the real `.wasm`.

mod support;

use host_sim::RequestSpec;
use serde_json::{json, Value};
use support::{fleet_clusters, host, route};

fn get(path: &str) -> RequestSpec<'_> {
    RequestSpec {
        headers: vec![(":method", "GET"), (":path", path), (":authority", "x")],
        body: Vec::new(),
        body_chunks: 0,
    }
}

#[test]
fn the_model_list_is_the_union_of_the_workers_models() {
    let config = r#"{"workers":[
        {"name":"w0","cluster":"engine_0","models":["llama","qwen"]},
        {"name":"w1","cluster":"engine_1","models":["qwen","mistral"]}]}"#;
    let mut h = host(config, 1, 1, &fleet_clusters(2));
    let out = h.vm(0).request(get("/v1/models")).unwrap();
    let reply = out.local_response.expect("the router answers itself");
    assert_eq!(reply.status, 200);
    let body: Value = serde_json::from_slice(&reply.body).unwrap();
    let ids: Vec<&str> = body["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["llama", "mistral", "qwen"]);

    // A worker that declares nothing serves anything: an engine lists the models.
    let open = r#"{"workers":[{"name":"w0","cluster":"engine_0"}]}"#;
    let mut h = host(open, 1, 1, &fleet_clusters(1));
    let out = h.vm(0).request(get("/v1/models")).unwrap();
    assert!(out.local_response.is_none() && out.continued, "{out:?}");
}

#[test]
fn embeddings_and_responses_keep_their_prefix_on_one_worker() {
    let config = support::fleet_config(4, "");
    let mut h = host(&config, 1, 1, &fleet_clusters(4));
    let doc = "a long shared document about prefix caches and routers. ".repeat(30);
    let embed = |i: usize| json!({"model": "e", "input": [format!("{doc} part {i}")]});
    let (first, _) = route(
        &mut h,
        0,
        RequestSpec::post_json("/v1/embeddings", embed(0).to_string()),
    );
    let (second, reason) = route(
        &mut h,
        0,
        RequestSpec::post_json("/v1/embeddings", embed(1).to_string()),
    );
    assert_eq!(second, first, "same document, same worker");
    assert_eq!(reason.as_deref(), Some("cache_hit"));

    let turn = |n: usize| {
        let mut input = vec![
            json!({"role": "user", "content": [{"type": "input_text", "text": "first question"}]}),
        ];
        for t in 1..=n {
            input.push(
                json!({"type": "message", "role": "assistant", "content": format!("answer {t}")}),
            );
            input.push(json!({"role": "user", "content": format!("question {t}")}));
        }
        json!({"model": "m", "instructions": doc, "input": input}).to_string()
    };
    let (owner, _) = route(&mut h, 0, RequestSpec::post_json("/v1/responses", turn(0)));
    for n in 1..4 {
        let (w, reason) = route(&mut h, 0, RequestSpec::post_json("/v1/responses", turn(n)));
        assert_eq!(w, owner, "turn {n} of the conversation stays");
        assert_eq!(reason.as_deref(), Some("cache_hit"));
    }
}
