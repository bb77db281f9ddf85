//! End-to-end: health verdicts that are about the engine, through the real Envoy
//! 1.40 with the shipped defaults (issue 55). A chat body whose `messages` are not
//! objects gets the filter's own 400 naming the element at any size up to
//! `max_body_bytes` (32 MiB), and bodies past it the filter's own 413 at any size;
//! other requests engines refuse (not JSON), whatever the engine does with them,
//! take no engine out of rotation; a killed
//! engine still leaves rotation within a request or two; and Envoy and the
//! collector started before the engines, one of them never coming up, route a
//! concurrent burst without failing once the dead engine refused a connect.
//!
//! Prints the measured numbers: `cargo test -p e2e --test verdicts -- --nocapture`.

use e2e::support::{engine_on, header, post, send, signal, start, wait_for};
use llm_demo::admin;
use llm_demo::fleet::{Fleet, FleetSpec};
use llm_demo::process::Guard;
use serde_json::json;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A chat body of numbers, `{"model":"mock","messages":[0,0,...]}`, of about
/// `bytes` bytes: no chat engine accepts it (`messages[0] must be an object`).
fn numbers(bytes: usize) -> Vec<u8> {
    let head = br#"{"model":"mock","messages":["#;
    let mut body = Vec::with_capacity(bytes + 8);
    body.extend_from_slice(head);
    body.push(b'0');
    while body.len() + 4 < bytes {
        body.extend_from_slice(b",0");
    }
    body.extend_from_slice(b"]}");
    body
}

/// `bytes` bytes that are not JSON: the filter routes them by load, and the
/// engine refuses them its own way.
fn not_json(bytes: usize) -> Vec<u8> {
    vec![b'x'; bytes]
}

/// The filter's own 400 for a chat body of numbers: status, reason, message.
fn refused_as_invalid(r: &admin::Response) -> bool {
    r.status == 400
        && r.header("x-llm-router-reason") == Some("invalid_body")
        && r.body.contains("messages[0] must be an object")
        && r.header("x-llm-router-worker").is_none()
}

/// 47.7 MiB: the issue's request, past `max_body_bytes` (and the engine mock's own
/// 32 MiB body limit).
const HUGE: usize = 50_000_000;

fn fleet(workers: usize) -> Fleet {
    start(&FleetSpec {
        workers,
        plugin_config: json!({"overload": {"probe_interval_ms": 300, "probe_timeout_ms": 1000}}),
        envoy_concurrency: 2,
        ..FleetSpec::default()
    })
}

fn stat(f: &Fleet, name: &str) -> u64 {
    f.envoy.filter_stat(name).unwrap()
}

/// A conversation's two turns on `f`: the worker of each and the second's decision.
fn two_turns(f: &Fleet, tag: &str) -> (String, String, String) {
    let system = format!("{tag}: a system prompt long enough to be worth a cache hit. ");
    let first = json!({"model": "mock", "max_tokens": 2, "messages": [
        {"role": "system", "content": system.repeat(4)},
        {"role": "user", "content": "first question"}]});
    let r1 = post(f.envoy.listener, "/v1/chat/completions", &first);
    assert_eq!(r1.status, 200, "{tag}: first turn {r1:?}");
    let second = json!({"model": "mock", "max_tokens": 2, "messages": [
        {"role": "system", "content": system.repeat(4)},
        {"role": "user", "content": "first question"},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "second question"}]});
    let r2 = post(f.envoy.listener, "/v1/chat/completions", &second);
    assert_eq!(r2.status, 200, "{tag}: second turn {r2:?}");
    (
        header(&r1, "x-llm-router-worker"),
        header(&r2, "x-llm-router-worker"),
        header(&r2, "x-llm-router-decision"),
    )
}

#[test]
fn a_47_mib_request_of_numbers_takes_no_engine_out() {
    let f = fleet(4);
    let r = send(f.envoy.listener, "/v1/chat/completions", &[], numbers(HUGE));
    println!(
        "47.7 MiB of numbers: {} ({:?})",
        r.status,
        r.header("x-llm-router-reason")
    );
    assert_eq!(
        (r.status, r.header("x-llm-router-reason")),
        (413, Some("body_too_large")),
        "the filter's own answer"
    );
    assert_eq!(
        stat(&f, "llm_router_health_down"),
        0,
        "no engine left rotation"
    );
    let (a, b, decision) = two_turns(&f, "after");
    assert_eq!(
        (a, decision.as_str()),
        (b, "cache_hit"),
        "routing stays cache-aware"
    );
}

#[test]
fn with_the_bound_raised_an_engine_resetting_47_mib_bodies_is_the_clients_failure() {
    // The bound at Envoy's buffer limit: 47.7 MiB of numbers still gets the
    // filter's 400, as at 1 MiB; bodies that are not JSON reach the engines, whose
    // own 32 MiB limit answers them with a 400 or a reset.
    let f = start(&FleetSpec {
        workers: 4,
        plugin_config: json!({"max_body_bytes": 67108864,
            "overload": {"probe_interval_ms": 300, "probe_timeout_ms": 1000}}),
        envoy_concurrency: 2,
        ..FleetSpec::default()
    });
    let r = send(f.envoy.listener, "/v1/chat/completions", &[], numbers(HUGE));
    println!(
        "47.7 MiB of numbers, bound raised: {} {:?} {}",
        r.status,
        r.header("x-llm-router-reason"),
        r.body
    );
    assert!(refused_as_invalid(&r), "the filter's own 400: {r:?}");
    let mut statuses = Vec::new();
    for _ in 0..8 {
        let r = send(
            f.envoy.listener,
            "/v1/chat/completions",
            &[],
            not_json(HUGE),
        );
        statuses.push((
            r.status,
            r.header("x-llm-router-worker").map(str::to_string),
        ));
    }
    let failed = statuses.iter().filter(|(s, _)| *s >= 500).count() as u64;
    println!("8 of 47.7 MiB not JSON to the engines: (status, worker) {statuses:?}");
    assert!(
        statuses.iter().all(|(s, _)| *s >= 400),
        "the engines cannot serve them: {statuses:?}"
    );
    // Counters reach Envoy when the stream's thread is done with it.
    wait_for("each failed upstream counted as the client's", &f, || {
        stat(&f, "llm_router_upstream_failures_unjudged") == failed
    });
    assert_eq!(
        stat(&f, "llm_router_health_down"),
        0,
        "no engine left rotation"
    );
    let (a, b, decision) = two_turns(&f, "raised");
    assert_eq!(
        (a, decision.as_str()),
        (b, "cache_hit"),
        "routing stays cache-aware"
    );
}

#[test]
fn a_burst_of_malformed_and_oversized_requests_gets_the_filters_4xx_and_leaves_every_engine_in_rotation(
) {
    let f = fleet(4);
    let (owner, _, _) = two_turns(&f, "before");
    // 20 at once: 6 past `max_body_bytes` (the filter's 413), 14 of 1 MiB (the
    // filter's 400: no engine is asked).
    let seen = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = (0..20)
        .map(|i| {
            let (addr, seen) = (f.envoy.listener, seen.clone());
            std::thread::spawn(move || {
                let size = if i % 10 < 3 { HUGE } else { 1 << 20 };
                let r = send(addr, "/v1/chat/completions", &[], numbers(size));
                let worker = r.header("x-llm-router-worker").unwrap_or("").to_string();
                let reason = r.header("x-llm-router-reason").unwrap_or("").to_string();
                if size != HUGE {
                    assert!(refused_as_invalid(&r), "the filter's own 400: {r:?}");
                }
                seen.lock().unwrap().push((size, r.status, reason, worker));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let seen = seen.lock().unwrap().clone();
    println!("20 malformed requests at once: (size, status, reason, worker) {seen:?}");
    let refused = |size: usize| {
        if size == HUGE {
            (413, "body_too_large")
        } else {
            (400, "invalid_body")
        }
    };
    assert!(
        seen.iter()
            .all(
                |(size, status, reason, worker)| (*status, reason.as_str()) == refused(*size)
                    && worker.is_empty()
            ),
        "each is refused by the filter with its 4xx, no engine asked: {seen:?}"
    );
    assert_eq!(
        stat(&f, "llm_router_health_down"),
        0,
        "no engine left rotation"
    );
    let (a, b, decision) = two_turns(&f, "before");
    assert_eq!(
        (a.as_str(), b.as_str(), decision.as_str()),
        (owner.as_str(), owner.as_str(), "cache_hit"),
        "the conversation still goes to its engine"
    );
}

#[test]
fn killing_one_engine_of_four_fails_at_most_2_of_the_next_40_requests() {
    let f = fleet(4);
    for i in 0..8 {
        let body = json!({"model": "mock", "max_tokens": 2, "prompt": format!("{i} warm up")});
        assert_eq!(post(f.envoy.listener, "/v1/completions", &body).status, 200);
    }
    let victim = "w2";
    let pid = f.engine(victim).unwrap().guard.id();
    signal(pid, "-KILL");
    let mut failed = Vec::new();
    for i in 0..40 {
        let body = json!({"model": "mock", "max_tokens": 2,
            "prompt": format!("{:016x} after the kill", (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15))});
        let r = post(f.envoy.listener, "/v1/completions", &body);
        if r.status != 200 {
            failed.push((
                i,
                r.status,
                r.header("x-llm-router-worker").map(str::to_string),
            ));
        }
    }
    println!(
        "kill 1 of 4 engines: {} of the next 40 failed: {failed:?}",
        failed.len()
    );
    assert!(failed.len() <= 2, "failed: {failed:?}");
    assert!(
        stat(&f, "llm_router_health_down") >= 1,
        "the dead engine is out"
    );
}

#[test]
fn started_before_the_engines_a_burst_fails_nothing_after_the_first_refused_connect() {
    // Envoy and the collector up with five engines that are not there yet: the
    // fleet's engines are killed at once, and the collector reports them all
    // unreachable.
    // Slow probes and scrapes, so the burst meets the fleet still all down.
    let mut spec = FleetSpec {
        workers: 5,
        plugin_config: json!({"overload": {"probe_interval_ms": 5000, "probe_timeout_ms": 1000}}),
        envoy_concurrency: 2,
        ..FleetSpec::default()
    };
    spec.collector_interval_ms = Some(3000);
    let f = start(&spec);
    // The worst case of the issue: the hot prefix's owner in the tree is the engine
    // that will never come up.
    let hot = |k: usize| {
        json!({"model": "mock", "max_tokens": 2, "messages": [
        {"role": "system", "content": format!("{k} {}", "a hot system prompt that every conversation shares. ".repeat(8))},
        {"role": "user", "content": "warm up"}]})
    };
    let k = (0..100)
        .find(|k| {
            let r = post(f.envoy.listener, "/v1/chat/completions", &hot(*k));
            r.header("x-llm-router-worker") == Some("w4")
        })
        .expect("a hot prefix owned by w4");
    let ports: Vec<(String, u16)> = f
        .engines
        .iter()
        .map(|e| (e.name.clone(), e.addr.port()))
        .collect();
    for e in &f.engines {
        let _ = Command::new("kill")
            .args(["-KILL", &e.guard.id().to_string()])
            .status();
    }
    wait_for(
        "the collector to report every engine unreachable",
        &f,
        || stat(&f, "llm_router_health_down_now") == 5,
    );
    // Four come up; w4 never does.
    let _up: Vec<Guard> = ports
        .iter()
        .filter(|(name, _)| name != "w4")
        .map(|(name, port)| engine_on(&f, name, *port, &[]))
        .collect();
    let down_before = stat(&f, "llm_router_health_down_now");
    // 32 clients at once, each 8 turns of one conversation on a shared hot prefix.
    let records = Arc::new(Mutex::new(Vec::new()));
    let system = hot(k)["messages"][0]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let threads: Vec<_> = (0..32)
        .map(|c| {
            let (addr, records, system) = (f.envoy.listener, records.clone(), system.clone());
            std::thread::spawn(move || {
                for t in 0..8 {
                    let body = json!({"model": "mock", "max_tokens": 2, "messages": [
                        {"role": "system", "content": system},
                        {"role": "user", "content": format!("client {c} turn {t}")}]});
                    let start = Instant::now();
                    let r = post(addr, "/v1/chat/completions", &body);
                    let worker = r.header("x-llm-router-worker").unwrap_or("").to_string();
                    records
                        .lock()
                        .unwrap()
                        .push((start, Instant::now(), r.status, worker));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let records = records.lock().unwrap().clone();
    let failed: Vec<_> = records.iter().filter(|r| r.2 != 200).collect();
    let first_failure = failed.iter().map(|r| r.1).min();
    // A margin for the failed stream to end in Envoy after its answer left.
    let settled = first_failure.map(|t| t + Duration::from_millis(500));
    let late: Vec<_> = failed
        .iter()
        .filter(|r| settled.is_some_and(|s| r.0 > s))
        .collect();
    let to_dead = records.iter().filter(|r| r.3 == "w4").count();
    println!(
        "started before the engines, w4 never up, 32 clients x 8 turns: {} of {} failed \
         ({} after the first failed connect came back); {to_dead} went to w4; \
         {down_before} workers down when it began",
        failed.len(),
        records.len(),
        late.len()
    );
    assert!(
        failed.iter().all(|r| r.3 == "w4"),
        "only the dead engine's requests fail: {failed:?}"
    );
    assert!(
        late.is_empty(),
        "failed after the first refused connect: {late:?}"
    );
    assert_eq!(records.len(), 256);
}
