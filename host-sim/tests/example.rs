//! An example to copy: test your own plugin config against the real filter, without
//! Envoy. Replace `MY_CONFIG` with yours and keep the assertions that matter to you.
//!
//! Build the filter first: `cargo build -p llm-router --target wasm32-wasip1 --profile
//! wasm` (or set `LLM_ROUTER_WASM` to a `.wasm` elsewhere).

use host_sim::fleet::SimFleet;
use host_sim::{FailurePolicy, Fault, Host, RequestSpec, Status};

/// Your plugin config, as in Envoy's `configuration` (workers named as the fleet
/// below names them: `w0` on cluster `engine_w0`...).
const MY_CONFIG: &str = r#"{
    "policy": "cache_aware",
    "workers": [
        {"name": "w0", "cluster": "engine_w0"},
        {"name": "w1", "cluster": "engine_w1"}
    ],
    "cache_threshold": 0.5,
    "rng_seed": 7
}"#;

fn my_host() -> Host {
    Host::builder(host_sim::require_built_filter())
        .plugin_config(MY_CONFIG)
        // Two worker threads, as `--concurrency 2`.
        .vms(2)
        .clusters(&["engine_w0", "engine_w1"])
        // As in your Envoy filter config (the filter needs it).
        .allow_on_headers_stop_iteration(true)
        .failure_policy(FailurePolicy::FailReload)
        .build()
        .expect("Envoy would accept this config")
}

/// Sends a chat turn on `vm`, lets a simulated engine answer, and returns the
/// decision header and the worker that served it.
fn turn(host: &mut Host, fleet: &mut SimFleet, vm: usize, messages: &str) -> (String, String) {
    let body = format!(r#"{{"model":"m","messages":{messages}}}"#);
    let mut spec = RequestSpec::post_json("/v1/chat/completions", body.clone());
    // Ask for the decision headers on the response (by default only a request that
    // asks gets them; `"decision_headers": true` puts them on every response).
    spec.headers.push(("x-llm-router-explain", "1"));
    let out = host.vm(vm).request(spec).expect("no trap");
    assert!(out.continued, "the request went upstream");
    let engine = fleet
        .find(out.header("x-llm-router-cluster"), None)
        .expect("routed to a known cluster");
    let answer = fleet.serve(
        engine,
        host.now_ms() as f64,
        "/v1/chat/completions",
        body.as_bytes(),
    );
    let resp = host
        .vm(vm)
        .respond(out.handle, answer.status, &[], &answer.body)
        .expect("no trap");
    host.vm(vm).finish(out.handle).expect("no trap");
    let decision = resp
        .header("x-llm-router-decision")
        .unwrap_or("")
        .to_string();
    (decision, fleet.engines[engine].name.clone())
}

#[test]
fn my_config_keeps_a_conversation_on_one_worker_across_threads() {
    let mut host = my_host();
    let mut fleet = SimFleet::demo(2, Default::default());
    let system = "You answer questions about a long shared document. ".repeat(20);
    let first =
        format!(r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"hi"}}]"#);
    let second = format!(
        r#"[{{"role":"system","content":"{system}"}},{{"role":"user","content":"hi"}},
           {{"role":"assistant","content":"hello"}},{{"role":"user","content":"more"}}]"#
    );
    let (d1, w1) = turn(&mut host, &mut fleet, 0, &first);
    // The next turn arrives on the other worker thread.
    let (d2, w2) = turn(&mut host, &mut fleet, 1, &second);
    assert_eq!((d1.as_str(), d2.as_str()), ("cache_miss", "cache_hit"));
    assert_eq!(w1, w2, "the second turn follows the first across threads");
    // Stats as Envoy names them.
    assert_eq!(
        host.metric("wasmcustom.llm_router_decisions_cache_hit"),
        Some(1)
    );
    // The engine saw the shared prefix cached.
    let cached = fleet
        .engines
        .iter()
        .map(|e| e.engine.cache().hit_tokens())
        .sum::<u64>();
    assert!(
        cached > 0,
        "the engine served the second turn from its prefix cache"
    );
}

#[test]
fn my_config_survives_a_failing_shared_data_store() {
    let mut host = my_host();
    let mut fleet = SimFleet::demo(2, Default::default());
    // Envoy refusing every shared-data write (CAS races lost, say).
    host.inject(Fault::new("proxy_set_shared_data", Status::CasMismatch));
    let msgs = r#"[{"role":"user","content":"still routed"}]"#;
    let (decision, _) = turn(&mut host, &mut fleet, 0, msgs);
    assert_eq!(decision, "cache_miss");
    assert!(host.faults_fired() > 0);
    assert!(host.failure(0).is_none(), "no trap");
}
