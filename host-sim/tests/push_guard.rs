//! The push endpoint only where it belongs, on the real filter (issue 14, failure
//! 3): a config without a token never takes a push whatever the token; the stats
//! listener's `stats_only` config takes pushes and nothing else (a local 404,
//! nothing routed or counted); failed token checks lock the endpoint for a minute
//! on every VM; the token can come from the VM's environment; absurd numbers are
//! refused naming the field, with no state change.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use std::collections::BTreeMap;

use host_sim::{Host, RequestSpec};

const WORKERS: &str =
    r#""workers":[{"name":"w0","cluster":"engine_0"},{"name":"w1","cluster":"engine_1"}]"#;
const SNAPSHOT: &str =
    r#"{"workers":[{"name":"w0","num_waiting":1},{"name":"w1","num_waiting":2}]}"#;

fn host(extra: &str, vms: usize) -> Host {
    support::host(
        &format!("{{{WORKERS}{extra}}}"),
        vms,
        1,
        &support::fleet_clusters(2),
    )
}

fn stat(h: &Host, name: &str) -> u64 {
    support::stat(h, &format!("llm_router_{name}"))
}

#[test]
fn a_config_without_a_token_never_takes_a_push() {
    let mut h = host("", 1);
    for token in ["", "tok", "change-me"] {
        let auth = format!("Bearer {token}");
        let mut spec = RequestSpec::post_json("/llm-router/stats", SNAPSHOT.as_bytes().to_vec());
        spec.headers.push(("authorization", &auth));
        let out = h.vm(0).request(spec).unwrap();
        assert!(
            out.local_response.is_none(),
            "no endpoint: the request is routed like any other ({token:?})"
        );
    }
    assert_eq!(stat(&h, "stats_pushes_accepted"), 0);
    assert!(h.shared_data("llm_router.samples").is_none());
}

/// The hostcalls one routed completion makes, by name, after one of warm-up.
fn hostcalls_of_a_routed_request(extra: &str) -> BTreeMap<String, u64> {
    let mut h = host(extra, 1);
    support::route_completion(&mut h, 0, "warm up");
    let before = h.hostcall_counts();
    support::route_completion(&mut h, 0, "hello");
    h.hostcall_counts()
        .into_iter()
        .map(|(name, n)| {
            let was = before.get(&name).copied().unwrap_or(0);
            (name, n - was)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[test]
fn a_token_costs_a_routed_request_no_hostcall() {
    // Every request passes the push and replicas checks; with a token they compare
    // the path and nothing more. Reading the method there (a hostcall that copies
    // into the VM, some 10k Envoy instructions) cost every routed request of every
    // shipped config, which all set a token.
    assert_eq!(
        hostcalls_of_a_routed_request(r#","stats_token":"tok""#),
        hostcalls_of_a_routed_request(""),
    );
}

#[test]
fn the_stats_only_config_takes_pushes_and_nothing_else() {
    let mut h = host(r#","stats_only":true,"stats_token":"tok""#, 1);
    assert_eq!(support::push(&mut h, 0, "tok", SNAPSHOT).0, 200);
    let spec = RequestSpec::post_json("/v1/completions", support::completion("m", "hello"));
    let out = h.vm(0).request(spec).unwrap();
    let reply = out.local_response.expect("answered locally");
    assert_eq!(reply.status, 404);
    assert!(!out.headers_forwarded, "nothing goes upstream");
    let decisions: u64 = [
        "cache_hit",
        "cache_miss",
        "cache_worker_queued",
        "all_queued",
    ]
    .iter()
    .map(|d| stat(&h, &format!("decisions_{d}")))
    .sum();
    assert_eq!(decisions, 0, "nothing counted");
    assert!(
        h.shared_data("llm_router.ring.head")
            .is_none_or(|v| v.get(..8) == Some(&0u64.to_le_bytes()[..])),
        "nothing recorded (the head's first 8 bytes are its sequence number)"
    );
}

#[test]
fn failed_token_checks_lock_the_endpoint_on_every_vm_for_a_minute() {
    let mut h = host(r#","stats_token":"the-right-token""#, 2);
    for i in 0..10 {
        assert_eq!(support::push(&mut h, i % 2, "guess", SNAPSHOT).0, 401);
    }
    for vm in 0..2 {
        let (status, body) = support::push(&mut h, vm, "the-right-token", SNAPSHOT);
        assert_eq!(status, 429, "locked out, the right token included: {body}");
        assert!(body.contains("locked out"), "{body}");
    }
    h.advance_time(60_000).unwrap();
    assert_eq!(support::push(&mut h, 1, "the-right-token", SNAPSHOT).0, 200);
}

#[test]
fn the_token_can_come_from_the_vms_environment() {
    let config =
        format!(r#"{{{WORKERS},"stats_only":true,"stats_token_env":"LLM_ROUTER_STATS_TOKEN"}}"#);
    let builder = support::builder(&config, 1, 1, &support::fleet_clusters(2))
        .env("LLM_ROUTER_STATS_TOKEN", "from-a-file\n");
    let mut h = support::build(builder, &config);
    assert_eq!(support::push(&mut h, 0, "from-a-file", SNAPSHOT).0, 200);
    let err = support::builder(&config, 1, 1, &support::fleet_clusters(2))
        .build()
        .err()
        .expect("no token in the environment: the config is refused");
    let logs = format!("{err:#}");
    assert!(logs.contains("stats_token_env"), "{logs}");
}

#[test]
fn absurd_numbers_are_refused_naming_the_field() {
    let mut h = host(r#","stats_token":"tok""#, 1);
    let (status, body) = support::push(
        &mut h,
        0,
        "tok",
        r#"{"workers":[{"name":"w0","ttft_p90_s":1e300}]}"#,
    );
    assert_eq!(status, 400);
    assert!(body.contains("ttft_p90_s"), "{body}");
    assert!(
        h.shared_data("llm_router.samples").is_none(),
        "no state change"
    );
}

/// The replica bridge's endpoint sits beside the push endpoint: the `stats_only`
/// config answers it (and still nothing else), and token guesses on it spend the
/// same lockout budget, so the replicas path is no side door for guessing.
#[test]
fn the_replicas_endpoint_answers_on_the_stats_listener_and_shares_the_lockout() {
    let mut h = host(r#","stats_only":true,"stats_token":"tok""#, 1);
    let export = |h: &mut Host, token: &str| {
        let auth = format!("Bearer {token}");
        let spec = RequestSpec {
            headers: vec![
                (":method", "GET"),
                (":path", "/llm-router/replicas?after=0"),
                (":authority", "x"),
                ("authorization", &auth),
            ],
            body: Vec::new(),
            body_chunks: 1,
        };
        let out = h.vm(0).request(spec).unwrap();
        out.local_response.expect("answered locally").status
    };
    assert_eq!(export(&mut h, "tok"), 200, "the export answers");
    for _ in 0..10 {
        assert_eq!(export(&mut h, "guess"), 401);
    }
    assert_eq!(
        export(&mut h, "tok"),
        429,
        "locked out, the right token included"
    );
    assert_eq!(
        support::push(&mut h, 0, "tok", SNAPSHOT).0,
        429,
        "the push endpoint shares the budget"
    );
    h.advance_time(60_000).unwrap();
    assert_eq!(export(&mut h, "tok"), 200);
}
