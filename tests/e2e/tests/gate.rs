//! End-to-end: engine load signals. The companion collector scrapes queueing engine
//! mocks and pushes to the filter in the real Envoy; the queue gate and the
//! saturation pin act on what the engines themselves report.

use e2e::support::{header, send, start, wait_for};
use llm_demo::admin;
use llm_demo::fleet::{Fleet, FleetSpec};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::time::Duration;

fn completion(prompt: &str) -> String {
    json!({"model": "mock", "prompt": prompt, "max_tokens": 4}).to_string()
}

fn prompt(tag: &str) -> String {
    format!("{tag}: ") + &"a long shared document about caches and queues. ".repeat(30)
}

/// The engine's own `num_requests_waiting`, from its /metrics.
fn engine_waiting(addr: SocketAddr) -> u64 {
    let text = admin::get(addr, "/metrics")
        .map(|r| r.body)
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("vllm:num_requests_waiting"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Sends `n` requests straight to an engine (bypassing Envoy) in the background,
/// to fill its queue; they finish on their own.
fn load_engine(addr: SocketAddr, n: usize) -> Vec<std::thread::JoinHandle<()>> {
    (0..n)
        .map(|i| {
            std::thread::spawn(move || {
                let body = completion(&format!("background load {i}"));
                let _ = admin::request(
                    addr,
                    "POST",
                    "/v1/completions",
                    &[("content-type", "application/json")],
                    body.as_bytes(),
                );
            })
        })
        .collect()
}

/// Gives the collector time to scrape and push what the engines now report.
fn let_collector_push() {
    std::thread::sleep(Duration::from_millis(400));
}

fn decisions(f: &Fleet) -> Value {
    let stat = |l: &str| {
        f.envoy
            .filter_stat(&format!("llm_router_decisions_{l}"))
            .unwrap()
    };
    json!({
        "cache_hit": stat("cache_hit"),
        "cache_miss": stat("cache_miss"),
        "cache_worker_queued": stat("cache_worker_queued"),
        "all_queued": stat("all_queued"),
    })
}

#[test]
fn an_owner_over_the_queue_limit_is_diverted_from() {
    let f = start(&FleetSpec {
        workers: 3,
        engine_args: vec!["--max-running=1".into(), "--ttft-ms=2500".into()],
        plugin_config: json!({"policy": "cache_aware", "worker_queue_limit": 2}),
        collector_interval_ms: Some(100),
        ..FleetSpec::default()
    });
    let doc = prompt("diverted");
    let first = send(f.envoy.listener, "/v1/completions", &[], completion(&doc));
    assert_eq!(first.status, 200, "{first:?}");
    let owner = header(&first, "x-engine-worker");
    let owner_addr = f.engine(&owner).unwrap().addr;
    // One running and two waiting on the owner: at the limit, it already queues.
    let background = load_engine(owner_addr, 3);
    wait_for("the owner to queue 2", &f, || {
        engine_waiting(owner_addr) >= 2
    });
    let_collector_push();
    let r = send(
        f.envoy.listener,
        "/v1/completions",
        &[],
        completion(&format!("{doc} next turn")),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(header(&r, "x-llm-router-reason"), "cache_worker_queued");
    assert_ne!(
        header(&r, "x-engine-worker"),
        owner,
        "diverted away from the queue"
    );
    let d = decisions(&f);
    assert_eq!(d["cache_worker_queued"], 1, "{d}");
    assert_eq!(d["cache_miss"], 1, "{d}");
    assert!(
        f.envoy
            .filter_stat("llm_router_queue_gate_rejections")
            .unwrap()
            >= 1
    );
    let prom = f.envoy.prometheus().unwrap();
    assert!(
        prom.contains("llm_router_diverted_overlap_chars_bucket"),
        "the abandoned prefix is observed in the histogram"
    );
    for b in background {
        let _ = b.join();
    }
}

#[test]
fn a_saturated_fleet_with_a_floor_pins_to_the_owner() {
    let f = start(&FleetSpec {
        workers: 2,
        engine_args: vec!["--max-running=1".into(), "--ttft-ms=2500".into()],
        plugin_config: json!({"policy": "cache_aware", "worker_queue_limit": 1, "saturation_queue_floor": 1}),
        collector_interval_ms: Some(100),
        ..FleetSpec::default()
    });
    let doc = prompt("pinned");
    let first = send(f.envoy.listener, "/v1/completions", &[], completion(&doc));
    let owner = header(&first, "x-engine-worker");
    // Every engine runs one and queues one: nobody is provably below the floor.
    let mut background = Vec::new();
    for e in &f.engines {
        background.extend(load_engine(e.addr, 2));
    }
    for e in &f.engines {
        wait_for("every engine to queue", &f, || engine_waiting(e.addr) >= 1);
    }
    let_collector_push();
    let r = send(
        f.envoy.listener,
        "/v1/completions",
        &[],
        completion(&format!("{doc} next turn")),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(header(&r, "x-llm-router-reason"), "saturation_pin");
    assert_eq!(header(&r, "x-llm-router-decision"), "all_queued");
    assert_eq!(
        header(&r, "x-engine-worker"),
        owner,
        "waiting is waiting everywhere"
    );
    assert_eq!(
        f.envoy.filter_stat("llm_router_saturation_pins").unwrap(),
        1
    );
    for b in background {
        let _ = b.join();
    }
}

#[test]
fn a_bad_push_is_refused_and_changes_nothing() {
    let f = start(&FleetSpec {
        workers: 2,
        plugin_config: json!({"policy": "cache_aware", "worker_queue_limit": 2, "stats_token": "s3cret", "stats_max_bytes": 2048}),
        ..FleetSpec::default()
    });
    let stats = f.envoy.stats_listener.expect("the stats listener");
    let auth = [("authorization", "Bearer s3cret")];
    let path = "/llm-router/stats";
    let idle = json!({"workers": [{"name": "w0", "num_waiting": 0, "num_running": 0},
                                  {"name": "w1", "num_waiting": 0, "num_running": 0}]});
    let ok = send(stats, path, &auth, idle.to_string());
    assert_eq!(ok.status, 200, "{ok:?}");
    let doc = prompt("push");
    let first = send(f.envoy.listener, "/v1/completions", &[], completion(&doc));
    let owner = header(&first, "x-engine-worker");
    // Every refused push claims the owner is badly queued; none may be stored.
    let queued = |extra: Value| {
        let mut w = json!({"name": owner, "num_waiting": 50, "num_running": 1});
        if let (Value::Object(m), Value::Object(e)) = (&mut w, extra) {
            m.extend(e);
        }
        json!({"workers": [w]}).to_string()
    };
    // (headers, body, expected status, what the refusal must say)
    type Case<'a> = (Vec<(&'a str, &'a str)>, String, u16, &'a str);
    let cases: Vec<Case> = vec![
        (vec![], queued(json!({})), 401, "token"),
        (
            vec![("authorization", "Bearer wrong")],
            queued(json!({})),
            401,
            "token",
        ),
        (auth.to_vec(), "{not json".into(), 400, "snapshot"),
        (
            auth.to_vec(),
            json!({"workers": [{"name": "w7"}]}).to_string(),
            400,
            "unknown worker `w7`",
        ),
        (
            auth.to_vec(),
            queued(json!({"kv_usage": 3.0})),
            400,
            "kv_usage",
        ),
        (
            auth.to_vec(),
            queued(json!({"pad": "x".repeat(4096)})),
            413,
            "larger than 2048",
        ),
    ];
    for (headers, body, status, reason) in cases {
        let r = send(stats, path, &headers, &body);
        assert_eq!(r.status, status, "{reason}: {r:?}");
        assert!(
            r.body.contains(reason),
            "the refusal says why ({reason}): {}",
            r.body
        );
    }
    assert_eq!(
        f.envoy
            .filter_stat("llm_router_stats_pushes_rejected")
            .unwrap(),
        6
    );
    let r = send(
        f.envoy.listener,
        "/v1/completions",
        &[],
        completion(&format!("{doc} again")),
    );
    assert_eq!(
        header(&r, "x-llm-router-reason"),
        "cache_hit",
        "no refused push was stored"
    );
    assert_eq!(header(&r, "x-engine-worker"), owner);
    // The same claim, pushed properly, does divert.
    let good = send(stats, path, &auth, queued(json!({})));
    assert_eq!(good.status, 200, "{good:?}");
    let r = send(
        f.envoy.listener,
        "/v1/completions",
        &[],
        completion(&format!("{doc} once more")),
    );
    assert_eq!(header(&r, "x-llm-router-reason"), "cache_worker_queued");
}
