//! One full request through the real filter in host-sim: request headers, a ~4 KiB
//! chat body, the decision, the upstream's response headers and body, and the stream's
//! end (`request` + `respond` + `finish`), with 4 workers. `cache_aware` on one
//! conversation (a hit every time), on 64 conversations in turn (hits spread over the
//! fleet), `cache_aware` on 4 VMs (Envoy worker threads) taking requests in turn, so
//! each request first applies the 3 tree operations the other threads recorded since
//! its last one (the cross-thread sync under churn), `predicted_ttft` beside
//! `cache_aware` (a per-tenant match, the work and cost tables read at the decision
//! and written at the decision, the first byte and the end), and `round_robin` for
//! comparison (no tree, no operations to share), `cache_aware` with `kv_capacity_bound`
//! on engines a push states hold 65536 tokens (each insert checks the worker's share)
//! or 4096 (the 64 conversations keep the trims going), `predicted_ttft` on the
//! engines of 4096 tokens (a copy into a full cache charged for what it evicts,
//! counted only), and the floor (`benches/floor`: a
//! guest that only buffers and reads the body and sets the routing header), so the
//! guest CPU the router adds per request is attributable without Envoy.
//!
//! Before the timings, each build's hostcalls per request are printed by name, with
//! the Wasm instructions its guest runs per request (host-sim's counts over 64
//! requests after 64 of warm-up, the filter loaded with `Filter::metered`): exact
//! figures, where the timings move with whatever else the machine runs. `cache_aware`
//! is counted also with 8 requests in flight at once, as on a loaded thread (a
//! release while others are held is published with the next booking), and
//! `predicted_ttft` with 64, as `benches/overhead --callgrind --connections 64`
//! loads Envoy (on 256 workers, 64 of them busy at once). `LLM_BENCH_BEFORE=<path to
//! another llm_router.wasm>` measures that build too, as `before/...`, side by side in
//! the same run; `LLM_ROUTER_WASM` picks the build under test; `LLM_BENCH_WORKERS=256`
//! runs every case on a fleet of that many workers instead of 4.
//!
//! Needs the filter's and the floor's wasm:
//! `cargo build -p llm-router -p llm-floor --target wasm32-wasip1 --profile wasm`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use host_sim::{Filter, Host, RequestSpec, StreamHandle};
use std::path::Path;
use std::time::Duration;

/// `cache_aware` with each worker's share of the trees bounded by its engine's KV
/// cache (`kv_capacity_bound`): a push states 65536 tokens an engine, room for all
/// its conversations, so each insert checks the bound and none trims...
const KV_BOUNDED: &str = "cache_aware+kv_capacity_bound";
/// ...and 4096 tokens (16 KiB of text, four of the bench's conversations of the 16
/// each worker gets), so the tree keeps trimming and the conversations miss, as on
/// engines that evict them before they come back.
const KV_TIGHT: &str = "cache_aware+kv_capacity_bound+tight";
/// `predicted_ttft` on those engines of 4096 tokens: it weighs each candidate's
/// conversations by its engine's capacity and charges a copy into a full cache for
/// what it evicts.
const TTFT_TIGHT: &str = "predicted_ttft+kv_capacity_bound+tight";

/// The KV capacity a policy's engines state (`None`: no push).
fn kv_tokens(policy: &str) -> Option<u64> {
    match policy {
        KV_BOUNDED => Some(65536),
        KV_TIGHT | TTFT_TIGHT => Some(4096),
        _ => None,
    }
}

fn workers() -> usize {
    std::env::var("LLM_BENCH_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
}

fn config(policy: &str) -> String {
    let workers: Vec<String> = (0..workers())
        .map(|i| format!(r#"{{"name":"w{i}","cluster":"engine_{i}"}}"#))
        .collect();
    let (policy, extra) = match kv_tokens(policy) {
        Some(_) => (
            policy.split('+').next().unwrap_or(policy),
            r#","kv_capacity_bound":true,"stats_token":"bench""#,
        ),
        None => (policy, ""),
    };
    format!(
        r#"{{"policy":"{policy}","workers":[{}]{extra}}}"#,
        workers.join(",")
    )
}

/// The collector's push stating every engine's KV capacity, and a tick past the
/// interval at which one VM turns it into the workers' bounds.
fn push_capacity(host: &mut Host, kv_tokens: u64) {
    let workers: Vec<serde_json::Value> = (0..workers())
        .map(|i| {
            serde_json::json!({"name": format!("w{i}"), "reachable": true, "num_waiting": 0,
                "num_running": 0, "kv_capacity_tokens": kv_tokens, "prompt_tokens_total": 1})
        })
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({ "workers": workers })).expect("json");
    let mut spec = RequestSpec::post_json("/llm-router/stats", body);
    spec.headers.push(("authorization", "Bearer bench"));
    let out = host.vm(0).request(spec).expect("push");
    host.vm(0).finish(out.handle).expect("push ends");
    host.advance_time(1_000).expect("tick");
    assert_eq!(
        host.metric("wasmcustom.llm_router_worker.w0.kv_bound_chars"),
        Some(kv_tokens * 4),
        "the bound is in place"
    );
}

/// A chat body of about 4 KiB: a long system prompt, a few turns, a question.
fn chat_body(conv: usize) -> Vec<u8> {
    let system = "You are a helpful assistant for a cache-aware router benchmark. ".repeat(40);
    let mut messages = vec![
        serde_json::json!({"role": "system", "content": format!("conversation {conv}: {system}")}),
    ];
    for turn in 0..4 {
        let q = format!("Question {turn} of conversation {conv}: how does prefix caching help? ");
        let a = format!("Answer {turn}: it reuses the KV cache of a shared prefix. ").repeat(3);
        messages.push(serde_json::json!({"role": "user", "content": q.repeat(2)}));
        messages.push(serde_json::json!({"role": "assistant", "content": a}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "And the last question?"}));
    serde_json::to_vec(&serde_json::json!({
        "model": "bench-model",
        "stream": false,
        "max_tokens": 64,
        "messages": messages,
    }))
    .expect("json")
}

const RESPONSE: &[u8] = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}"#;

fn one_request(host: &mut Host, body: &[u8]) {
    request_on(host, 0, body)
}

fn request_on(host: &mut Host, vm: usize, body: &[u8]) {
    let handle = open_on(host, vm, body);
    close_on(host, vm, handle);
}

/// Sends a request and leaves it in flight; its stream handle.
fn open_on(host: &mut Host, vm: usize, body: &[u8]) -> StreamHandle {
    let out = host
        .vm(vm)
        .request(RequestSpec::post_json(
            "/v1/chat/completions",
            body.to_vec(),
        ))
        .expect("request");
    assert!(out.continued, "not routed: {:?}", out.local_response);
    out.handle
}

/// Answers a request in flight and ends its stream.
fn close_on(host: &mut Host, vm: usize, handle: StreamHandle) {
    let mut vm = host.vm(vm);
    vm.respond(
        handle,
        200,
        &[("content-type", "application/json")],
        RESPONSE,
    )
    .expect("respond");
    vm.finish(handle).expect("finish");
}

/// Requests `n` to `n + count` with `depth` of them in flight at once on VM 0, as
/// a loaded thread runs them: each new request is sent before the oldest ends.
fn overlapped(
    host: &mut Host,
    bodies: &[Vec<u8>],
    range: std::ops::Range<usize>,
    depth: usize,
    open: &mut std::collections::VecDeque<StreamHandle>,
) {
    for i in range {
        open.push_back(open_on(host, 0, &bodies[i % bodies.len()]));
        if open.len() > depth {
            if let Some(h) = open.pop_front() {
                close_on(host, 0, h);
            }
        }
    }
}

fn host(filter: &Filter, policy: &str) -> Host {
    host_with_vms(filter, policy, 1)
}

fn host_with_vms(filter: &Filter, policy: &str, vms: usize) -> Host {
    let mut host = Host::builder_for(filter)
        .plugin_config(config(policy).into_bytes())
        .vms(vms)
        .seed(1)
        .allow_on_headers_stop_iteration(true)
        .build()
        .expect("host");
    if let Some(tokens) = kv_tokens(policy) {
        push_capacity(&mut host, tokens);
    }
    host
}

/// Hostcalls per request by name and the Wasm instructions the guest runs per
/// request (exact, unlike any timing here), over `n` requests after a warm-up of as
/// many (so a VM's one-off work, such as defining its metrics, is not counted).
fn hostcalls_per_request(
    metered: &Filter,
    policy: &str,
    (vms, depth): (usize, usize),
    bodies: &[Vec<u8>],
) {
    let n = 64;
    let mut h = host_with_vms(metered, policy, vms);
    let mut open = std::collections::VecDeque::new();
    let mut run = |h: &mut Host, range: std::ops::Range<usize>| {
        if depth > 1 {
            overlapped(h, bodies, range, depth, &mut open);
        } else {
            for i in range {
                request_on(h, i % vms, &bodies[i % bodies.len()]);
            }
        }
    };
    run(&mut h, 0..n);
    let before = h.hostcall_counts();
    let fuel = h.guest_instructions().expect("metered");
    run(&mut h, n..2 * n);
    let after = h.hostcall_counts();
    let instructions = (h.guest_instructions().expect("metered") - fuel) / n as u64;
    // A VM holding requests hands its counters over only once the requests ended
    // since pay for it (`crate::support::counters`: at 256 workers, not within the
    // bench's few); one holding none hands them over at once.
    for handle in open.drain(..) {
        close_on(&mut h, 0, handle);
    }
    h.advance_time(1_000).expect("tick");
    if policy.starts_with("cache_aware") && policy != KV_TIGHT {
        assert!(h.metric("wasmcustom.llm_router_decisions_cache_hit") > Some(0));
    }
    if let Some(tokens) = kv_tokens(policy) {
        assert!(
            h.metric("wasmcustom.llm_router_worker.w0.tree_chars") <= Some(tokens * 4),
            "w0 holds no more than its engine"
        );
    }
    if vms > 1 {
        assert!(
            h.metric("wasmcustom.llm_router_sync_applied") > Some(0),
            "the VMs applied each other's operations"
        );
    }
    let per: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (
                k.trim_start_matches("proxy_").to_string(),
                d as f64 / n as f64,
            )
        })
        .filter(|(_, d)| *d > 0.0)
        .collect();
    let total: f64 = per.iter().map(|(_, d)| d).sum();
    let list: Vec<String> = per.iter().map(|(k, d)| format!("{k} {d}")).collect();
    let load = if depth > 1 {
        format!(", {depth} in flight")
    } else {
        String::new()
    };
    eprintln!(
        "hostcalls per request, {policy} on {vms} VM(s){load}: {total} ({}); guest Wasm instructions per request: {instructions}",
        list.join(", ")
    );
}

/// The cases every build is measured on; `tag` names the build (`""`: this one).
fn bench_build(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    tag: &str,
    (filter, path): (&Filter, &Path),
    bodies: &[Vec<u8>],
) {
    let name = |case: &str| format!("{tag}{case}");
    let metered = Filter::metered(path).expect("load the filter metered");
    for (policy, vms, depth) in [
        ("cache_aware", 1, 1),
        ("cache_aware", 1, 8),
        ("cache_aware", 4, 1),
        (KV_BOUNDED, 1, 1),
        (KV_BOUNDED, 4, 1),
        (KV_TIGHT, 1, 1),
        ("round_robin", 1, 1),
        ("predicted_ttft", 1, 1),
        ("predicted_ttft", 1, 64),
        (TTFT_TIGHT, 1, 1),
    ] {
        hostcalls_per_request(&metered, policy, (vms, depth), bodies);
    }
    let mut h = host(filter, "cache_aware");
    group.bench_function(name("cache_aware/one_conversation"), |b| {
        b.iter(|| one_request(&mut h, &bodies[0]))
    });

    let mut h = host(filter, "cache_aware");
    let mut i = 0;
    group.bench_function(name("cache_aware/64_conversations"), |b| {
        b.iter(|| {
            i += 1;
            one_request(&mut h, &bodies[i % bodies.len()])
        })
    });

    let mut h = host(filter, KV_BOUNDED);
    let mut i = 0;
    group.bench_function(name("cache_aware/64_conversations_kv_bounded"), |b| {
        b.iter(|| {
            i += 1;
            one_request(&mut h, &bodies[i % bodies.len()])
        })
    });

    let mut h = host_with_vms(filter, "cache_aware", 4);
    let mut i = 0;
    group.bench_function(name("cache_aware/64_conversations_4_vms_in_turn"), |b| {
        b.iter(|| {
            i += 1;
            request_on(&mut h, i % 4, &bodies[i % bodies.len()])
        })
    });

    let mut h = host(filter, "round_robin");
    group.bench_function(name("round_robin/one_conversation"), |b| {
        b.iter(|| one_request(&mut h, &bodies[0]))
    });
}

fn bench_request(c: &mut Criterion) {
    let path = host_sim::built_filter_path();
    assert!(
        path.exists(),
        "{} is missing; build it first with:\n    cargo build -p llm-router --target wasm32-wasip1 --profile wasm",
        path.display()
    );
    let filter = Filter::load(&path).expect("load the filter");
    let bodies: Vec<Vec<u8>> = (0..64).map(chat_body).collect();
    let mut group = c.benchmark_group("request");
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .throughput(Throughput::Elements(1));

    bench_build(&mut group, "", (&filter, &path), &bodies);
    // Another build of the filter beside this one, in the same run (a shared machine's
    // timings compare only side by side): LLM_BENCH_BEFORE=/tmp/before.wasm.
    if let Some(before) = std::env::var_os("LLM_BENCH_BEFORE") {
        let before = Path::new(&before);
        let old = Filter::load(before).expect("load LLM_BENCH_BEFORE");
        bench_build(&mut group, "before/", (&old, before), &bodies);
    }

    let mut h = host(&filter, "predicted_ttft");
    // Its conversation already in the tree, so even a single iteration (`--test`)
    // is a hit.
    one_request(&mut h, &bodies[0]);
    let mut ran = false;
    group.bench_function("predicted_ttft/one_conversation", |b| {
        ran = true;
        b.iter(|| one_request(&mut h, &bodies[0]))
    });
    // (a filtered run skips the case)
    assert!(!ran || h.metric("wasmcustom.llm_router_decisions_cache_hit") > Some(0));

    let mut h = host(&filter, "predicted_ttft");
    let mut i = 0;
    group.bench_function("predicted_ttft/64_conversations", |b| {
        b.iter(|| {
            i += 1;
            one_request(&mut h, &bodies[i % bodies.len()])
        })
    });

    let mut h = host_with_vms(&filter, "predicted_ttft", 4);
    let mut i = 0;
    group.bench_function("predicted_ttft/64_conversations_4_vms_in_turn", |b| {
        b.iter(|| {
            i += 1;
            request_on(&mut h, i % 4, &bodies[i % bodies.len()])
        })
    });

    let floor_path = path.with_file_name("llm_floor.wasm");
    assert!(
        floor_path.exists(),
        "{} is missing; build it first with:\n    cargo build -p llm-floor --target wasm32-wasip1 --profile wasm",
        floor_path.display()
    );
    let floor = Filter::load(&floor_path).expect("load the floor");
    let metered = Filter::metered(&floor_path).expect("load the floor metered");
    hostcalls_per_request(&metered, "round_robin", (1, 1), &bodies);
    let mut h = host(&floor, "round_robin");
    group.bench_function("floor/one_conversation", |b| {
        b.iter(|| one_request(&mut h, &bodies[0]))
    });
    group.finish();
}

criterion_group!(benches, bench_request);
criterion_main!(benches);
