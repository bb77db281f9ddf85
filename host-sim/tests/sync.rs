//! One router per Envoy: the real filter in 4 VMs (4 Envoy worker threads) sharing
//! one shared-data store, with requests interleaved across VMs in a chosen order.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{Host, RequestSpec, StreamHandle};

const WORKERS: usize = 4;
/// The sync window of `within_a_window_...` (`sync_batch_ms`); the other tests run
/// with the default, and space their requests by it all the same.
const WINDOW_MS: u64 = 2;

fn host(vms: usize, extra: &str) -> Host {
    // The replicas' sync: every VM keeps the trees (`tests/relay.rs` is `one_vm`'s).
    let config = support::fleet_config(WORKERS, &format!(r#","route_in":"every_vm"{extra}"#));
    support::host(&config, vms, 11, &support::fleet_clusters(WORKERS))
}

use support::conversation as chat;

/// Sends a request on `vm` a sync window after the last one (turns of a
/// conversation come a whole answer apart); returns the chosen cluster and the
/// stream (still open).
fn open(host: &mut Host, vm: usize, body: Vec<u8>) -> (String, StreamHandle) {
    host.advance_time(WINDOW_MS).unwrap();
    let spec = RequestSpec::post_json("/v1/chat/completions", body);
    let (cluster, out) = support::open(host, vm, spec);
    assert!(out.continued, "routed and continued: {out:?}");
    (cluster, out.handle)
}

/// Sends, answers and finishes a request on `vm`; returns (cluster, decision reason).
fn route(host: &mut Host, vm: usize, body: Vec<u8>) -> (String, String) {
    let (cluster, handle) = open(host, vm, body);
    let reason = support::answer(host, vm, handle).expect("decision reason on the response");
    (cluster, reason)
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
    assert_eq!(support::stat(&h, "llm_router_sync_gaps"), 0);
    assert_eq!(support::stat(&h, "llm_router_sync_append_failures"), 0);
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
    assert_eq!(support::stat(&h, "llm_router_sync_append_failures"), 0);
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
    assert_eq!(
        support::stat(&h, "llm_router_inflight"),
        0,
        "every count released"
    );
    // Balanced again: the next turn follows the longest prefix, now held by the
    // worker the diverted turn went to (every routed text is recorded).
    let (cluster, reason) = route(&mut h, 2, chat(1, 5));
    assert_eq!((cluster, reason.as_str()), (diverted, "cache_hit"));
}

#[test]
fn a_vm_that_fell_a_ring_behind_counts_the_gap_and_carries_on() {
    let mut h = host(2, r#","sync_ring_slots":8"#);
    route(&mut h, 1, chat(99, 0));
    for conv in 0..20 {
        route(&mut h, 0, chat(conv, 0));
    }
    assert_eq!(support::stat(&h, "llm_router_sync_gaps"), 0);
    // VM 1 then neither ticked nor routed: 20 operations, the ring holds the last 8.
    let (_, reason) = route(&mut h, 1, chat(19, 1));
    assert_eq!(reason, "cache_hit", "the recent operations are still there");
    assert_eq!(support::stat(&h, "llm_router_sync_gaps"), 12);
    let (_, reason) = route(&mut h, 1, chat(0, 1));
    assert_eq!(reason, "cache_miss", "the overwritten one is lost on VM 1");
}

#[test]
fn a_root_context_without_streams_keeps_no_tree_until_its_first_one() {
    let mut h = host(2, r#","sync_ring_slots":8"#);
    for conv in 0..20 {
        route(&mut h, 0, chat(conv, 0));
        h.advance_time(1_000).unwrap();
    }
    // VM 1 ticked all along but had no stream (as Envoy's main thread, or a
    // listener nobody calls): it copied nothing, and missed nothing either.
    assert_eq!(support::stat(&h, "llm_router_sync_applied"), 20);
    let (_, reason) = route(&mut h, 1, chat(19, 1));
    assert_eq!(
        reason, "cache_hit",
        "its first stream catches up with the ring"
    );
    let (_, reason) = route(&mut h, 1, chat(0, 1));
    assert_eq!(
        reason, "cache_miss",
        "what the ring no longer holds is not there"
    );
    assert_eq!(
        support::stat(&h, "llm_router_sync_gaps"),
        0,
        "a start, not a gap"
    );
}

/// Sends a request on `vm` at the host's current time (no window passes).
fn open_now(host: &mut Host, vm: usize, body: Vec<u8>) -> (String, StreamHandle) {
    let spec = RequestSpec::post_json("/v1/chat/completions", body);
    let (cluster, out) = support::open(host, vm, spec);
    assert!(out.continued, "routed and continued: {out:?}");
    (cluster, out.handle)
}

fn shared_data_reads(host: &Host) -> u64 {
    host.hostcall_counts()
        .get("proxy_get_shared_data")
        .copied()
        .unwrap_or(0)
}

#[test]
fn within_a_window_a_thread_sees_its_own_records_and_the_others_at_its_next_sync() {
    let mut h = host(3, &format!(r#","sync_batch_ms":{WINDOW_MS}"#));
    // VM 0 syncs with its first request, and keeps it open.
    let (_, held) = open(&mut h, 0, chat(1, 0));
    // In the same window, a new conversation on VM 0, then its next turn.
    let reads = shared_data_reads(&h);
    let (owner, first) = open_now(&mut h, 0, chat(2, 0));
    let (cluster, next) = open_now(&mut h, 0, chat(2, 1));
    assert_eq!(cluster, owner, "VM 0 sees its own record at once");
    assert_eq!(
        shared_data_reads(&h),
        reads + 2,
        "inside the window a request reads only the tables' bell (empty: nothing is copied)"
    );
    // VM 1 syncs now (its first request), before VM 0 has shared.
    let (_, other) = open_now(&mut h, 1, chat(7, 0));
    let (_, reason) = route(&mut h, 1, chat(2, 5));
    assert_eq!(reason, "cache_miss", "not shared before VM 0's next sync");
    // A window later, VM 0's stream ends: that is its next sync.
    h.advance_time(WINDOW_MS).unwrap();
    for handle in [first, next, held] {
        h.vm(0).finish(handle).unwrap();
    }
    h.vm(1).finish(other).unwrap();
    let (cluster, reason) = route(&mut h, 2, chat(2, 2));
    assert_eq!(
        (cluster, reason.as_str()),
        (owner, "cache_hit"),
        "VM 2 sees what VM 0 routed"
    );
    assert_eq!(support::stat(&h, "llm_router_sync_gaps"), 0);
}
