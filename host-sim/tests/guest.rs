//! host-sim against its own small test guest (host-sim/test-guest), built for
//! wasm32-wasip1 on first use into target/host-sim-test-guest.

mod support;

use host_sim::{Filter, Host, LogSource, RequestSpec};
use std::process::Command;
use support::guest_filter as filter;
use support::guest_wasm;

fn get(path: &str) -> RequestSpec<'_> {
    RequestSpec {
        headers: vec![
            (":method", "GET"),
            (":path", path),
            (":authority", "example"),
            ("x-remove-me", "1"),
        ],
        body: Vec::new(),
        body_chunks: 0,
    }
}

fn logged(host: &Host, vm: usize, needle: &str) -> bool {
    host.logs(vm).iter().any(|l| l.message.contains(needle))
}

#[test]
fn lifecycle_config_and_stdout() {
    let host = Host::builder_for(&filter())
        .vm_config("vmcfg")
        .build()
        .unwrap();
    assert!(host
        .logs(0)
        .iter()
        .any(|l| l.source == LogSource::Stdout && l.message == "stdout: vm_start 5"));
    assert!(logged(&host, 0, "vm_config=vmcfg"));

    let err = Host::builder_for(&filter())
        .plugin_config("fail")
        .build()
        .err()
        .expect("on_configure false must fail the build");
    assert!(
        format!("{err:#}").contains("proxy_on_configure returned false"),
        "{err:#}"
    );
}

#[test]
fn headers_only_request_sees_host_state() {
    let mut host = Host::builder_for(&filter())
        .plugin_name("router")
        .build()
        .unwrap();
    let out = host.vm(0).request(get("/x?a=1")).unwrap();
    assert!(out.continued && out.headers_forwarded);
    assert_eq!(out.header("x-seen-headers"), Some("4"));
    assert_eq!(out.header("x-eos"), Some("true"));
    assert_eq!(out.header("x-plugin-name"), Some("router"));
    assert_eq!(out.header("x-prop-path"), Some("/x?a=1"));
    assert_eq!(out.header("x-prop-missing"), Some("true"));
    assert_eq!(out.header("x-inc0"), Some("badarg"));
    assert_eq!(out.header("x-requests-metric"), Some("1"));
    assert_eq!(
        out.header("x-now-ms"),
        Some(host.now_ms().to_string().as_str())
    );
    assert_eq!(out.header("x-remove-me"), None);
    let multi: Vec<&str> = out
        .request_headers
        .iter()
        .filter(|(k, _)| k == "x-multi")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(multi, ["a", "b"]);
    assert_eq!(host.metric("wasmcustom.requests"), Some(1));
    assert_eq!(host.metric("wasmcustom.inflight"), Some(1));
    host.vm(0).finish(out.handle).unwrap();
    assert_eq!(host.metric("wasmcustom.inflight"), Some(0));
    assert!(logged(
        &host,
        0,
        "on_log ctx=2 path=Some(\"/x?a=1\") status=None"
    ));
}

#[test]
fn body_chunks_accumulate_while_paused() {
    let mut host = Host::builder_for(&filter()).build().unwrap();
    let mut spec = RequestSpec::post_json("/echo", "hello");
    spec.body_chunks = 3;
    let out = host.vm(0).request(spec).unwrap();
    assert!(out.continued);
    assert_eq!(out.request_body, b"hello!");
    for line in ["body 2 eos=false", "body 4 eos=false", "body 5 eos=true"] {
        assert!(logged(&host, 0, line), "missing {line}");
    }
    assert_eq!(host.histogram("wasmcustom.body_size"), Some(vec![5]));

    let resp = host
        .vm(0)
        .respond(out.handle, 200, &[("content-type", "text/plain")], b"abc")
        .unwrap();
    assert!(resp.continued);
    assert_eq!(resp.body, b"[abc]");
    assert_eq!(resp.header("x-resp-status-seen"), Some("200"));
    assert_eq!(resp.header("x-context"), Some("2"));
    host.vm(0).finish(out.handle).unwrap();
    assert!(logged(&host, 0, "status=Some(\"200\")"));
    assert!(host.vm(0).outcome(out.handle).unwrap().finished);
}

#[test]
fn body_routing_needs_allow_on_headers_stop_iteration() {
    // Like Envoy 1.40 with allow_on_headers_stop_iteration: true.
    let mut host = Host::builder_for(&filter())
        .allow_on_headers_stop_iteration(true)
        .build()
        .unwrap();
    let mut spec = RequestSpec::post_json("/body", "hello");
    spec.body_chunks = 2;
    let out = host.vm(0).request(spec).unwrap();
    assert!(out.continued);
    assert_eq!(out.header("x-body-len"), Some("5"));
    assert_eq!(out.request_body, b"HELLO");
    assert_eq!(out.clear_route_cache, 1);
    assert_eq!(out.header("x-ff-unknown"), Some("true"));
    assert_eq!(out.foreign_calls, ["clear_route_cache", "no_such_function"]);
    assert_eq!(host.clear_route_cache_total(), 1);

    // Default Envoy: Pause on headers is StopAllIterationAndWatermark, the body is held.
    let mut host = Host::builder_for(&filter()).build().unwrap();
    let out = host
        .vm(0)
        .request(RequestSpec::post_json("/body", "hello"))
        .unwrap();
    assert!(!out.continued && !out.headers_forwarded);
    assert_eq!(out.request_body, b"hello");
    assert!(!logged(&host, 0, "body "));
}

#[test]
fn touching_request_headers_after_continue_traps_like_envoy() {
    let mut host = Host::builder_for(&filter()).vms(2).build().unwrap();
    let err = host
        .vm(0)
        .request(RequestSpec::post_json("/late-header", "x"))
        .unwrap_err();
    let text = format!("{err:#}");
    assert!(text.contains("unexpected status: 2"), "{text}");
    assert!(host.failure(0).is_some());
    assert!(host.vm(0).request(get("/x")).is_err());
    assert!(host.vm(1).request(get("/x")).unwrap().continued);
}

#[test]
fn local_response_runs_the_encoder_path() {
    let mut host = Host::builder_for(&filter()).build().unwrap();
    let out = host.vm(0).request(get("/local")).unwrap();
    assert!(!out.continued && !out.headers_forwarded);
    assert!(out.finished);
    let local = out.local_response.expect("local response");
    assert_eq!(local.status, 403);
    assert_eq!(local.body, b"[nope]");
    assert_eq!(local.header("x-reason"), Some("denied"));
    assert_eq!(local.header("x-resp-status-seen"), Some("403"));
    assert_eq!(local.header("content-type"), Some("text/plain"));
    assert!(logged(
        &host,
        0,
        "path=Some(\"/local\") status=Some(\"403\")"
    ));
    host.vm(0).finish(out.handle).unwrap();
    assert!(host.vm(0).respond(out.handle, 200, &[], b"").is_err());
}

#[test]
fn http_calls_answer_fail_timeout_and_cancel() {
    let mut host = Host::builder_for(&filter())
        .clusters(&["engine_0"])
        .build()
        .unwrap();
    let out = host.vm(0).request(get("/callout")).unwrap();
    assert!(!out.continued);
    assert_eq!(out.header("x-bad-calls"), Some("true"));
    assert_eq!(out.http_calls.len(), 1);
    let call = &out.http_calls[0];
    assert_eq!(call.cluster, "engine_0");
    assert_eq!(call.header(":path"), Some("/state"));
    assert_eq!(call.header("content-length"), Some("4"));
    assert_eq!(call.body, b"ping");
    host.answer_http_call(call.token, 200, &[], b"warm")
        .unwrap();
    let out = host.vm(0).outcome(out.handle).unwrap();
    assert!(out.continued);
    assert_eq!(out.header("x-callout-status"), Some("200"));
    assert_eq!(out.header("x-callout-body"), Some("warm"));
    assert!(out.http_calls.is_empty());

    // A 500 makes the filter answer locally from the callback.
    let out = host.vm(0).request(get("/callout")).unwrap();
    host.answer_http_call(out.http_calls[0].token, 500, &[], b"")
        .unwrap();
    let out = host.vm(0).outcome(out.handle).unwrap();
    assert_eq!(out.local_response.map(|l| l.status), Some(502));

    // A broken connection: no headers, proxy_get_status says BrokenConnection / reset.
    let out = host.vm(0).request(get("/callout")).unwrap();
    host.fail_http_call(out.http_calls[0].token).unwrap();
    let local = host
        .vm(0)
        .outcome(out.handle)
        .unwrap()
        .local_response
        .unwrap();
    assert_eq!(local.header("x-status"), Some("11 reset"));

    // Timeout (500 ms): Envoy answers 504.
    let out = host.vm(0).request(get("/callout")).unwrap();
    host.advance_time(499).unwrap();
    assert_eq!(host.pending_http_calls().len(), 1);
    host.advance_time(1).unwrap();
    let out = host.vm(0).outcome(out.handle).unwrap();
    assert_eq!(out.header("x-callout-status"), Some("504"));

    // A client reset cancels the pending call.
    let out = host.vm(0).request(get("/callout")).unwrap();
    let token = out.http_calls[0].token;
    host.vm(0).reset(out.handle).unwrap();
    assert!(host.pending_http_calls().is_empty());
    assert!(host.answer_http_call(token, 200, &[], b"").is_err());
    assert!(host.vm(0).outcome(out.handle).unwrap().reset);
}

#[test]
fn shared_data_is_shared_across_vms_with_cas() {
    let mut host = Host::builder_for(&filter()).vms(3).build().unwrap();
    for vm in 0..3 {
        let out = host.vm(vm).request(get("/x")).unwrap();
        assert_eq!(out.header("x-total"), Some((vm + 1).to_string().as_str()));
    }
    assert_eq!(
        host.shared_data("requests_total").as_deref(),
        Some(&b"3"[..])
    );
    let (_, cas) = host.shared_data_with_cas("requests_total").unwrap();
    let out = host.vm(1).request(get("/cas")).unwrap();
    assert_eq!(out.header("x-cas"), Some("mismatch"));
    assert_eq!(out.header("x-missing"), Some("(None, None)"));
    // The request itself bumped the counter once; the stale write did not apply.
    let (value, new_cas) = host.shared_data_with_cas("requests_total").unwrap();
    assert_eq!(value, b"4");
    assert!(new_cas > cas);
    assert_eq!(host.metric("wasmcustom.requests"), Some(4));
}

#[test]
fn ticks_fire_on_every_vm() {
    let start = 1_000_000;
    let mut host = Host::builder_for(&filter())
        .plugin_config("tick")
        .vms(3)
        .start_time_ms(start)
        .build()
        .unwrap();
    assert_eq!(host.vm(2).tick_period_ms(), 100);
    host.advance_time(250).unwrap();
    assert_eq!(host.now_ms(), start + 250);
    assert_eq!(host.shared_data("ticks").as_deref(), Some(&b"6"[..]));
    for vm in 0..3 {
        let ticks: Vec<_> = host
            .logs(vm)
            .iter()
            .filter(|l| l.message.starts_with("tick "))
            .map(|l| l.time_ms)
            .collect();
        assert_eq!(ticks, [start + 100, start + 200], "vm {vm}");
    }
    assert!(logged(&host, 0, &format!("at {}", start + 100)));
}

#[test]
fn queues_deliver_to_the_last_registrant() {
    let mut host = Host::builder_for(&filter()).vms(2).build().unwrap();
    let out = host.vm(0).request(get("/enqueue")).unwrap();
    assert_eq!(out.header("x-unknown-queue"), Some("true"));
    assert!(logged(&host, 1, "queue item hello"));
    assert!(!logged(&host, 0, "queue item"));
    host.enqueue("q", b"from-test").unwrap();
    assert!(logged(&host, 1, "queue item from-test"));
    assert!(host.enqueue("nope", b"").is_err());
}

#[test]
fn randomness_is_deterministic_per_seed() {
    let random = |seed: u64| -> String {
        let host = Host::builder_for(&filter()).seed(seed).build().unwrap();
        let line = host
            .logs(0)
            .iter()
            .find(|l| l.message.starts_with("random "));
        line.expect("random log").message.clone()
    };
    assert_eq!(random(7), random(7));
    assert_ne!(random(7), random(8));
}

#[test]
fn unknown_imports_and_non_proxy_modules_are_rejected() {
    // (module (import "env" "proxy_nope" (func)))
    let module = [
        0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // header
        0x01, 0x04, 0x01, 0x60, 0x00, 0x00, // type section: () -> ()
        0x02, 0x12, 0x01, 0x03, b'e', b'n', b'v', 0x0a, b'p', b'r', b'o', b'x', b'y', b'_', b'n',
        b'o', b'p', b'e', 0x00, 0x00, // import section
    ];
    let err = Filter::from_bytes(&module).err().expect("must fail");
    assert!(format!("{err:#}").contains("env.proxy_nope"), "{err:#}");
    let err = Filter::from_bytes(&module[..8]).err().expect("must fail");
    assert!(
        format!("{err:#}").contains("proxy_abi_version_0_2_1"),
        "{err:#}"
    );
}

/// The routing filter: every import it has must be implemented (loading fails
/// otherwise, naming the import).
#[test]
fn real_filter_imports_are_all_implemented() {
    let filter = support::filter();
    assert!(filter.imports().iter().any(|(m, _)| m == "env"));
}

#[test]
fn cli_run_prints_the_outcome_as_json() {
    let dir = std::env::temp_dir().join(format!("host-sim-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let body = dir.join("body.txt");
    std::fs::write(&body, "hello").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_host-sim"))
        .args(["run", "--wasm"])
        .arg(guest_wasm())
        .args([
            "--config",
            "{}",
            "--path",
            "/body",
            "--allow-on-headers-stop-iteration",
        ])
        .arg("--body")
        .arg(&body)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["continued"], true);
    assert_eq!(json["decision_headers"]["x-body-len"], "5");
    assert_eq!(json["clear_route_cache"], 1);
    assert_eq!(json["request_body_changed"], true);
    assert!(json["logs"].as_array().is_some_and(|l| !l.is_empty()));
}

#[test]
fn host_can_move_to_another_thread() {
    fn is_send<T: Send>() {}
    is_send::<Host>();
    let mut host = Host::builder_for(&filter()).build().unwrap();
    let handle = std::thread::spawn(move || host.vm(0).request(get("/x")).unwrap().continued);
    assert!(handle.join().unwrap());
}

#[test]
fn a_metered_filter_counts_the_instructions_its_vms_run_and_the_same_work_counts_the_same() {
    assert_eq!(
        Host::builder_for(&filter())
            .build()
            .unwrap()
            .guest_instructions(),
        None,
        "not metered"
    );
    let metered = Filter::metered(guest_wasm()).unwrap();
    let run = |requests: usize| {
        let mut host = Host::builder_for(&metered).vms(2).build().unwrap();
        let start = host.guest_instructions().expect("metered");
        assert!(start > 0, "starting the VMs ran code");
        for i in 0..requests {
            host.vm(i % 2).request(get("/metered")).unwrap();
        }
        host.guest_instructions().expect("metered") - start
    };
    let (one, three) = (run(1), run(3));
    assert!(one > 0);
    assert_eq!(run(1), one, "deterministic");
    assert!(
        three > one,
        "more requests, more instructions: {three} vs {one}"
    );
}
