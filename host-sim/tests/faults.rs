//! Fault injection on the real filter: every proxy-wasm hostcall the filter uses
//! answers every failure status Envoy can give it (and `InternalFailure`, which Envoy
//! never gives most of them), on each of its calls in turn and on all of them, and the
//! filter never traps; a trap under FAIL_RELOAD gets a fresh VM on the same
//! shared data.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{envoy_failures, FailurePolicy, Fault, Host, RequestSpec, Status};
use llm_router::support::header_names::EXPLAIN_HEADER;

const CONFIG: &str = r#"{"policy":"cache_aware","workers":[{"name":"w0","cluster":"c0"},{"name":"w1","cluster":"c1"},
    {"name":"w2","cluster":"c2"}],"stats_token":"tok","worker_queue_limit":2,
    "saturation_queue_floor":1,"eviction_interval_ms":1000}"#;

/// Prefill/decode with overload flags at a small scale: the prefill copies
/// (`dispatch_http_call` from a stream, the body rewrite) and the prober's calls from
/// the root context.
const PD_CONFIG: &str = r#"{"workers":[
    {"name":"p0","cluster":"c0","pool":"prefill","bootstrap_host":"10.0.0.1","bootstrap_port":8998},
    {"name":"p1","cluster":"c1","pool":"prefill","bootstrap_host":"10.0.0.2","bootstrap_port":8998},
    {"name":"d0","cluster":"c2","pool":"decode"}],"stats_token":"tok",
    "prefill_timeout_ms":1000,"sync_interval_ms":100,
    "overload":{"ttft_enter_s":1.0,"ttft_recover_s":0.5,"probe_interval_ms":100,
        "probe_timeout_ms":200,"probe_successes_to_recover":1}}"#;

fn builder() -> host_sim::HostBuilder {
    builder_with(CONFIG)
}

fn builder_with(config: &str) -> host_sim::HostBuilder {
    support::builder(config, 2, 3, &["c0", "c1", "c2"])
}

fn chat(i: usize) -> Vec<u8> {
    let system = "a long shared system prompt ".repeat(8);
    support::chat_with_system("m", Some(&system), &[&format!("turn {i}")])
}

/// Sends one request and completes it whatever the filter did with it.
fn exchange(host: &mut Host, vm: usize, spec: RequestSpec<'_>) -> anyhow::Result<()> {
    let out = host.vm(vm).request(spec)?;
    if out.headers_forwarded && out.local_response.is_none() && !out.finished {
        host.vm(vm).respond(out.handle, 200, &[], b"{}")?;
    }
    host.vm(vm).finish(out.handle)
}

/// What the filter does in production: stats pushes, routed requests on two threads,
/// unreadable bodies, an unknown model, eviction ticks.
fn exercise(host: &mut Host) -> anyhow::Result<()> {
    for vm in 0..2 {
        let push = r#"{"workers":[{"name":"w0","num_waiting":3,"num_running":1},
            {"name":"w1","num_waiting":0,"num_running":1}]}"#;
        let mut spec = RequestSpec::post_json("/llm-router/stats", push);
        spec.headers.push(("authorization", "Bearer tok"));
        exchange(host, vm, spec)?;
    }
    for i in 0..6 {
        exchange(
            host,
            i % 2,
            RequestSpec::post_json("/v1/chat/completions", chat(i)),
        )?;
    }
    exchange(
        host,
        0,
        RequestSpec::post_json("/v1/chat/completions", "not json"),
    )?;
    let unknown = r#"{"model":"nobody-serves-this","prompt":"x"}"#;
    exchange(host, 1, RequestSpec::post_json("/v1/completions", unknown))?;
    host.advance_time(2_500)?;
    exchange(
        host,
        0,
        RequestSpec::post_json("/v1/chat/completions", chat(9)),
    )
}

/// Answers every pending HTTP call: the first with `status`, the others with 200.
fn answer_calls(host: &mut Host, status: u32) -> anyhow::Result<()> {
    for (i, call) in host.pending_http_calls().into_iter().enumerate() {
        let s = if i == 0 { status } else { 200 };
        host.answer_http_call(call.token, s, &[], b"{}")?;
    }
    Ok(())
}

/// PD traffic (prefill copies answered, failed and timed out) and an overloaded
/// prefill worker probed until it recovers.
fn exercise_pd(host: &mut Host) -> anyhow::Result<()> {
    let push = |ttft: f64| {
        format!(
            r#"{{"workers":[{{"name":"p0","num_waiting":0,"num_running":1,"ttft_p90_s":{ttft}}}]}}"#
        )
    };
    for (i, prefill_status) in [200, 500, 200, 0].into_iter().enumerate() {
        let out = host
            .vm(i % 2)
            .request(RequestSpec::post_json("/v1/chat/completions", chat(i)))?;
        match prefill_status {
            // Left unanswered: the call times out.
            0 => host.advance_time(1_100)?,
            s => answer_calls(host, s)?,
        }
        if out.headers_forwarded && out.local_response.is_none() {
            let now = host.vm(i % 2).outcome(out.handle)?;
            if now.local_response.is_none() && !now.finished {
                host.vm(i % 2).respond(out.handle, 200, &[], b"{}")?;
            }
        }
        host.vm(i % 2).finish(out.handle)?;
    }
    for (ttft, status) in [(5.0, 503), (0.1, 200), (0.1, 200)] {
        let mut spec = RequestSpec::post_json("/llm-router/stats", push(ttft));
        spec.headers.push(("authorization", "Bearer tok"));
        exchange(host, 0, spec)?;
        for _ in 0..3 {
            host.advance_time(150)?;
            answer_calls(host, status)?;
        }
    }
    exchange(host, 1, RequestSpec::post_json("/v1/completions", "[1]"))
}

/// The hostcalls one fault-free run makes, with their call counts.
fn baseline(config: &str, exercise: fn(&mut Host) -> anyhow::Result<()>) -> Vec<(String, u64)> {
    let mut host = builder_with(config).build().expect("fault-free build");
    exercise(&mut host).expect("fault-free run");
    host.hostcall_counts().into_iter().collect()
}

#[test]
fn no_failure_of_any_hostcall_makes_the_filter_trap() {
    sweep(
        CONFIG,
        exercise,
        &[
            "proxy_set_shared_data",
            "proxy_remove_header_map_value",
            "proxy_get_header_map_value",
        ],
    );
}

#[test]
fn no_failure_of_any_hostcall_makes_the_filter_trap_in_pd_and_overload_mode() {
    sweep(
        PD_CONFIG,
        exercise_pd,
        &[
            "proxy_http_call",
            "proxy_set_buffer_bytes",
            "proxy_get_header_map_pairs",
        ],
    );
}

/// Hostcalls the filter never makes itself: the SDK's dispatcher calls
/// `proxy_set_effective_context` (and unwraps the answer) with the id of the context
/// Envoy is calling back, before an `on_http_call_response`. Envoy fails it only for
/// a context id it does not know (`set_effective_context` in proxy-wasm-cpp-host's
/// exports), which that id never is.
const SDK_ONLY: [&str; 1] = ["proxy_set_effective_context"];

/// Every failure Envoy can answer for every hostcall `exercise` makes, at sampled
/// calls and at all of them: no trap.
fn sweep(config: &str, exercise: fn(&mut Host) -> anyhow::Result<()>, must_use: &[&str]) {
    let used: Vec<(String, u64)> = baseline(config, exercise)
        .into_iter()
        .filter(|(h, _)| !SDK_ONLY.contains(&h.as_str()))
        .collect();
    let mut injected = 0;
    let mut traps = Vec::new();
    for (hostcall, calls) in &used {
        // What Envoy answers, plus a status it never does (the filter must not rely on
        // the host keeping to its contract). WASI calls never fail in Envoy.
        let mut statuses = envoy_failures(hostcall).to_vec();
        if hostcall.starts_with("proxy_") {
            statuses.push(Status::InternalFailure);
        }
        for status in statuses {
            let mut faults = vec![Fault::new(hostcall, status)];
            let step = (*calls / 8).max(1);
            faults.extend(
                (1..=*calls)
                    .step_by(step as usize)
                    .map(|n| Fault::new(hostcall, status).on_call(n)),
            );
            for fault in faults {
                let mut host = builder_with(config).build().expect("fault-free build");
                host.inject(fault.clone());
                let run = exercise(&mut host);
                injected += host.faults_fired();
                if let Err(e) = run {
                    traps.push(format!("{fault:?}: {e:#}"));
                }
            }
        }
    }
    for name in must_use {
        assert!(
            used.iter().any(|(h, _)| h == name),
            "the exercise reaches {name}: {used:?}"
        );
    }
    assert!(injected > 50, "faults actually fired ({injected})");
    assert!(
        traps.is_empty(),
        "the filter trapped:\n{}",
        traps.join("\n\n")
    );
}

/// A fault while the VMs start (reading the plugin configuration) fails the start
/// cleanly: `on_configure` says no, nothing traps.
#[test]
fn a_configuration_read_failure_rejects_the_config_without_trapping() {
    let err = builder()
        .fault(Fault::new("proxy_get_buffer_bytes", Status::NotFound))
        .build()
        .map(|_| ())
        .expect_err("a config that cannot be read is rejected");
    let text = format!("{err:#}");
    assert!(text.contains("plugin configuration rejected"), "{text}");
    assert!(!text.contains("trapped"), "{text}");
}

/// A trap under FAIL_RELOAD: the stream that trapped gets Envoy's 503
/// `wasm_fail_stream`, the next one on that VM runs in a fresh VM that still sees the
/// shared data the old one wrote.
#[test]
fn fail_reload_gives_a_fresh_vm_that_keeps_shared_data() {
    let mut host = builder()
        .vms(1)
        .failure_policy(FailurePolicy::FailReload)
        .build()
        .expect("build");
    exchange(
        &mut host,
        0,
        RequestSpec::post_json("/v1/chat/completions", chat(1)),
    )
    .unwrap();
    let shared_before = host.shared_data_keys();
    assert!(!shared_before.is_empty(), "routing wrote shared data");
    // The VM crashes in the middle of the next request.
    let next = host
        .hostcall_counts()
        .get("proxy_remove_header_map_value")
        .map_or(1, |n| n + 1);
    host.inject(Fault::trap("proxy_remove_header_map_value").from_call(next));
    let out = host
        .vm(0)
        .request(RequestSpec::post_json("/v1/chat/completions", chat(2)))
        .expect("a trap is not an API error under FAIL_RELOAD");
    let reply = out.local_response.expect("the trapped stream is answered");
    assert_eq!(
        (reply.status, reply.details.as_str()),
        (503, "wasm_fail_stream")
    );
    assert!(host.failure(0).is_some(), "the VM failed");
    host.clear_faults();
    let mut spec = RequestSpec::post_json("/v1/chat/completions", chat(1));
    spec.headers.push((EXPLAIN_HEADER, "1"));
    let out = host.vm(0).request(spec).expect("next request");
    assert_eq!(host.reloads(0), 1, "the next stream started a fresh VM");
    assert!(host.failure(0).is_none());
    assert!(out.continued, "the fresh VM routes");
    let resp = host.vm(0).respond(out.handle, 200, &[], b"{}").unwrap();
    assert_eq!(
        resp.header("x-llm-router-decision"),
        Some("cache_hit"),
        "the fresh VM matched the prefix its predecessor recorded in shared data"
    );
    assert!(host.shared_data_keys().len() >= shared_before.len());
}

/// FAIL_CLOSED: the stream that trapped and every later one on that VM get the 503;
/// FAIL_OPEN: they pass through untouched. Either way the other VMs keep routing.
#[test]
fn fail_closed_and_fail_open_handle_a_dead_vm_as_envoy_does() {
    for policy in [FailurePolicy::FailClosed, FailurePolicy::FailOpen] {
        let mut host = builder().failure_policy(policy).build().expect("build");
        host.inject(Fault::trap("proxy_remove_header_map_value"));
        let first = host
            .vm(0)
            .request(RequestSpec::post_json("/v1/chat/completions", chat(1)))
            .expect("a trap is not an API error");
        host.clear_faults();
        let later = host
            .vm(0)
            .request(RequestSpec::post_json("/v1/chat/completions", chat(2)))
            .expect("a dead VM is not an API error");
        for out in [&first, &later] {
            match policy {
                FailurePolicy::FailClosed => {
                    let reply = out.local_response.as_ref().expect("503");
                    assert_eq!(
                        (reply.status, reply.details.as_str()),
                        (503, "wasm_fail_stream")
                    );
                }
                _ => {
                    assert!(out.continued, "{policy:?}: the request passes through");
                    assert_eq!(out.header("x-llm-router-cluster"), None, "not routed");
                }
            }
        }
        assert!(host.failure(0).is_some() && host.reloads(0) == 0);
        let other = host
            .vm(1)
            .request(RequestSpec::post_json("/v1/chat/completions", chat(3)))
            .expect("VM 1 lives");
        assert!(
            other.header("x-llm-router-cluster").is_some(),
            "{policy:?}: VM 1 routes"
        );
    }
}
