//! One router per Envoy: the real filter in 4 VMs (4 Envoy worker threads) sharing
//! one shared-data store, with requests interleaved across VMs in a chosen order.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

use host_sim::{Host, RequestSpec, StreamHandle};
use std::path::PathBuf;

fn wasm() -> PathBuf {
    host_sim::require_built_filter()
}

const WORKERS: usize = 4;

fn host(vms: usize, extra: &str) -> Host {
    let workers: Vec<String> = (0..WORKERS)
        .map(|i| format!(r#"{{"name":"w{i}","cluster":"engine_{i}"}}"#))
        .collect();
    let config = format!(r#"{{"workers":[{}]{extra}}}"#, workers.join(","));
    let clusters: Vec<String> = (0..WORKERS).map(|i| format!("engine_{i}")).collect();
    Host::builder(wasm())
        .plugin_config(config.into_bytes())
        .vms(vms)
        .seed(11)
        .clusters(&clusters)
        .allow_on_headers_stop_iteration(true)
        .build()
        .expect("the filter loads with a valid config")
}

/// A conversation at `turn`: a system prompt shared by nobody else, then turns.
fn chat(conversation: usize, turn: usize) -> Vec<u8> {
    let mut messages = vec![format!(
        r#"{{"role":"system","content":"conversation {conversation}: {}"}}"#,
        "you are a careful assistant. ".repeat(10)
    )];
    for t in 0..=turn {
        messages.push(format!(
            r#"{{"role":"user","content":"question {t} of {conversation}"}}"#
        ));
        if t < turn {
            messages.push(format!(r#"{{"role":"assistant","content":"answer {t}"}}"#));
        }
    }
    format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(",")).into_bytes()
}

/// Sends a request on `vm`; returns the chosen cluster and the stream (still open).
fn open(host: &mut Host, vm: usize, body: Vec<u8>) -> (String, StreamHandle) {
    let out = host
        .vm(vm)
        .request(RequestSpec::post_json("/v1/chat/completions", body))
        .expect("request runs");
    assert!(out.continued, "routed and continued: {out:?}");
    let cluster = out
        .header("x-llm-router-cluster")
        .expect("routing header set")
        .to_string();
    (cluster, out.handle)
}

/// Sends, answers and finishes a request on `vm`; returns (cluster, decision reason).
fn route(host: &mut Host, vm: usize, body: Vec<u8>) -> (String, String) {
    let (cluster, handle) = open(host, vm, body);
    let resp = host
        .vm(vm)
        .respond(handle, 200, &[("content-type", "application/json")], b"{}")
        .expect("response runs");
    let reason = resp
        .header("x-llm-router-reason")
        .expect("decision reason on the response")
        .to_string();
    host.vm(vm).finish(handle).expect("stream ends");
    (cluster, reason)
}

fn metric(host: &Host, name: &str) -> u64 {
    host.metric(&format!("wasmcustom.{name}")).unwrap_or(0)
}

#[test]
fn a_conversation_alternating_threads_keeps_its_worker() {
    let mut h = host(4, "");
    for conv in 0..6 {
        let (owner, reason) = route(&mut h, conv % 4, chat(conv, 0));
        assert_eq!(reason, "cache_miss");
        for turn in 1..6 {
            let vm = (conv + turn) % 4;
            let (cluster, reason) = route(&mut h, vm, chat(conv, turn));
            assert_eq!(cluster, owner, "conversation {conv} turn {turn} on VM {vm}");
            assert_eq!(reason, "cache_hit");
        }
    }
    assert_eq!(metric(&h, "llm_router_sync_gaps"), 0);
    assert_eq!(metric(&h, "llm_router_sync_append_failures"), 0);
}

#[test]
fn the_vms_converge_on_one_view() {
    let mut h = host(4, "");
    let mut owners = Vec::new();
    // Interleave 24 conversations' first turns over the VMs in a scrambled order.
    for conv in 0..24 {
        let vm = (conv * 7 + 3) % 4;
        owners.push(route(&mut h, vm, chat(conv, 0)).0);
    }
    // Let idle VMs catch up on their tick too.
    h.advance_time(2_000).unwrap();
    for (conv, owner) in owners.iter().enumerate() {
        for vm in 0..4 {
            let (cluster, reason) = route(&mut h, vm, chat(conv, 1));
            assert_eq!(
                (&cluster, reason.as_str()),
                (owner, "cache_hit"),
                "VM {vm} sees conversation {conv} where VM {} put it",
                (conv * 7 + 3) % 4
            );
        }
    }
}

#[test]
fn interleaved_inserts_from_every_vm_lose_nothing() {
    let mut h = host(4, "");
    // Open a stream on every VM before any finishes, several rounds deep.
    let mut open_streams = Vec::new();
    let mut owners = Vec::new();
    for conv in 0..16 {
        let vm = conv % 4;
        let (cluster, handle) = open(&mut h, vm, chat(conv, 0));
        owners.push(cluster);
        open_streams.push(handle);
    }
    for handle in open_streams {
        h.vm(handle.vm).reset(handle).unwrap();
    }
    for (conv, owner) in owners.iter().enumerate() {
        let vm = (conv + 1) % 4;
        assert_eq!(
            &route(&mut h, vm, chat(conv, 1)).0,
            owner,
            "conversation {conv}"
        );
    }
    assert_eq!(metric(&h, "llm_router_sync_append_failures"), 0);
}

#[test]
fn in_flight_counts_are_shared_and_return_to_zero() {
    // Low thresholds: 3 requests in flight on one worker make the fleet imbalanced.
    let mut h = host(
        4,
        r#","balance_abs_threshold":2,"balance_rel_threshold":1.5"#,
    );
    let (owner, _) = route(&mut h, 0, chat(1, 0));
    // Three turns in flight on the owner, opened on three different VMs.
    let held: Vec<StreamHandle> = (0..3)
        .map(|vm| {
            let (cluster, handle) = open(&mut h, vm, chat(1, vm + 1));
            assert_eq!(cluster, owner, "hits while balanced");
            handle
        })
        .collect();
    // The fourth VM sees the other VMs' load on the owner: 3 vs 0 is imbalanced.
    let (diverted, reason) = route(&mut h, 3, chat(1, 4));
    assert_eq!(reason, "imbalanced");
    assert_ne!(diverted, owner, "least-load avoids the owner");
    // End the held streams in both ways: finished, and reset (client gone).
    h.vm(held[0].vm).finish(held[0]).unwrap();
    h.vm(held[1].vm).reset(held[1]).unwrap();
    h.vm(held[2].vm).reset(held[2]).unwrap();
    h.advance_time(1_000).unwrap();
    assert_eq!(metric(&h, "llm_router_inflight"), 0, "every count released");
    // Balanced again: the next turn follows the longest prefix, now held by the
    // worker the diverted turn went to (every routed text is recorded).
    let (cluster, reason) = route(&mut h, 2, chat(1, 5));
    assert_eq!((cluster, reason.as_str()), (diverted, "cache_hit"));
}

#[test]
fn a_vm_that_fell_a_ring_behind_counts_the_gap_and_carries_on() {
    let mut h = host(2, r#","sync_ring_slots":8"#);
    for conv in 0..20 {
        route(&mut h, 0, chat(conv, 0));
    }
    assert_eq!(metric(&h, "llm_router_sync_gaps"), 0);
    // VM 1 never ticked nor routed: 20 operations, the ring holds the last 8.
    let (_, reason) = route(&mut h, 1, chat(19, 1));
    assert_eq!(reason, "cache_hit", "the recent operations are still there");
    assert_eq!(metric(&h, "llm_router_sync_gaps"), 12);
    let (_, reason) = route(&mut h, 1, chat(0, 1));
    assert_eq!(reason, "cache_miss", "the overwritten one is lost on VM 1");
}
