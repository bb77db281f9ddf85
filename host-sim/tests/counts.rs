//! Counts shared by the VMs of one Envoy, on the real filter: two VMs racing their
//! first writes to a table both land (every read-modify-written table exists before
//! any VM writes it), and a VM that dies with requests in flight (a trap, reloaded
//! under `FAIL_RELOAD`: its streams never end) stops counting once its counts
//! expire, so its workers take traffic again.
//!
//! Issue 14, failure 1: after 5 crashed requests one worker carried 80 phantom
//! requests and received 0 of the next 40, until Envoy restarted.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{FailurePolicy, Fault, Host, RequestSpec, StreamHandle};

const WORKERS: usize = 4;
/// The tick (`sync_interval_ms`) and the owner expiry it implies: 10 ticks, at
/// least 5 s (`llm_router::shared::owner_expiry_ms`).
const TICK_MS: u64 = 1000;
const EXPIRY_MS: u64 = 10 * TICK_MS;

const UF: u64 = 0x20;
const CONNECT_FAILURE: &str = "upstream_reset_before_response_started{connection_failure}";

fn host(vms: usize, extra: &str) -> Host {
    let config = support::fleet_config(
        WORKERS,
        &format!(
            r#","sync_interval_ms":{TICK_MS},"route_in":"every_vm",
                "overload":{{"probe_interval_ms":{TICK_MS},"probe_timeout_ms":500}}{extra}"#
        ),
    );
    let clusters = support::fleet_clusters(WORKERS);
    let builder = support::builder(&config, vms, 11, &clusters);
    support::build(builder.failure_policy(FailurePolicy::FailReload), &config)
}

fn stat(h: &Host, name: &str) -> u64 {
    support::stat(h, &format!("llm_router_{name}"))
}

/// Opens a completion of `prompt` on `vm` (left in flight); the cluster and stream.
fn open(h: &mut Host, vm: usize, prompt: &str) -> (String, StreamHandle) {
    let spec = RequestSpec::post_json("/v1/completions", support::completion("m", prompt));
    let (cluster, out) = support::open(h, vm, spec);
    (cluster, out.handle)
}

/// `vm` routes `n` fresh prompts (answered 200) that share no prefix worth a cache
/// hit, so each goes least-load with random ties; how many went to `cluster`.
fn routed_to(h: &mut Host, vm: usize, tag: &str, n: usize, cluster: &str) -> usize {
    let seed = tag
        .bytes()
        .fold(7u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(b)));
    (0..n as u64)
        .filter(|i| {
            let key = seed.wrapping_mul(1_000_003).wrapping_add(*i);
            let prompt = format!("{:016x} {tag}", key.wrapping_mul(0x9E37_79B9_7F4A_7C15));
            support::route_completion(h, vm, &prompt).0 == cluster
        })
        .count()
}

/// Makes `vm` trap in its next request, as a VM running out of memory does; Envoy
/// (host-sim under `FAIL_RELOAD`) replaces it, and its streams in flight are cut
/// without their callbacks.
fn crash(h: &mut Host, vm: usize) {
    let next = h
        .hostcall_counts()
        .get("proxy_remove_header_map_value")
        .map_or(1, |n| n + 1);
    h.inject(Fault::trap("proxy_remove_header_map_value").from_call(next));
    let out = h
        .vm(vm)
        .request(RequestSpec::post_json(
            "/v1/completions",
            support::completion("m", "the request that crashes the VM"),
        ))
        .expect("a trap is not an API error");
    assert_eq!(out.local_response.map(|r| r.status), Some(503));
    assert!(h.failure(vm).is_some(), "VM {vm} died");
    h.clear_faults();
}

#[test]
fn first_writes_racing_on_two_vms_both_count() {
    let mut h = host(2, "");
    // VM 1 reads the in-flight table now and writes it only after VM 0's first
    // count landed: its write must not replace VM 0's.
    h.pin_reads(1, "llm_router.ring.head");
    let (a, _) = open(&mut h, 0, "first request");
    let (b, _) = open(&mut h, 1, "second request");
    h.advance_time(TICK_MS).unwrap();
    assert_eq!(
        stat(&h, "inflight"),
        2,
        "both first counts are in the table"
    );
    // The same race on the health table: two workers fail on two VMs, VM 1's
    // read of the table taken before VM 0's write.
    assert_ne!(a, b, "least-load spread the two requests");
    let mut h = host(2, "");
    let (a, sa) = open(&mut h, 0, "first request");
    let (b, sb) = open(&mut h, 1, "second request");
    assert_ne!(a, b);
    h.pin_reads(1, "llm_router.health");
    h.vm(0).fail_upstream(sa, 503, UF, CONNECT_FAILURE).unwrap();
    h.vm(1).fail_upstream(sb, 503, UF, CONNECT_FAILURE).unwrap();
    h.advance_time(TICK_MS).unwrap();
    assert_eq!(
        stat(&h, "health_down_now"),
        2,
        "both workers are out: neither VM's write replaced the other's"
    );
    for dead in [&a, &b] {
        assert_eq!(routed_to(&mut h, 0, "after", 12, dead), 0, "{dead} is out");
    }
}

#[test]
fn a_dead_vms_requests_stop_counting_after_the_expiry() {
    let mut h = host(2, "");
    // VM 0 sends six requests with one text: the first goes least-load, the rest
    // follow it to the same worker, and all stay in flight.
    // They come a sync window apart, so each one's booking is published.
    let text = "one conversation everyone continues ".repeat(8);
    let (hot, _) = open(&mut h, 0, &text);
    for _ in 0..5 {
        h.advance_time(support::SYNC_WINDOW_MS).unwrap();
        assert_eq!(open(&mut h, 0, &text).0, hot, "cache hits on the owner");
    }
    // VM 1 holds one request of its own elsewhere.
    let (live, _) = open(&mut h, 1, "a long generation on the live VM");
    assert_ne!(live, hot);
    crash(&mut h, 0);
    h.advance_time(TICK_MS).unwrap();
    assert_eq!(
        stat(&h, "inflight"),
        7,
        "right after the crash its six requests still count"
    );
    assert_eq!(
        routed_to(&mut h, 1, "shunned", 12, &hot),
        0,
        "the worker with phantom requests is avoided meanwhile"
    );
    h.advance_time(EXPIRY_MS).unwrap();
    assert_eq!(
        stat(&h, "inflight"),
        1,
        "after the expiry only the live VM's request counts (its tick kept it)"
    );
    assert!(
        routed_to(&mut h, 1, "healed", 12, &hot) > 0,
        "the worker takes traffic again"
    );
    // The reloaded VM routes and counts afresh.
    let (_, s) = open(&mut h, 0, "the reloaded VM's first request");
    assert_eq!(h.reloads(0), 1);
    h.advance_time(TICK_MS).unwrap();
    assert_eq!(stat(&h, "inflight"), 2);
    support::answer(&mut h, 0, s);
    h.advance_time(TICK_MS).unwrap();
    assert_eq!(stat(&h, "inflight"), 1);
}

#[test]
fn a_dead_vms_prefill_bookings_expire() {
    let mut h = host(2, r#","policy":"predicted_ttft""#);
    for i in 0..3 {
        open(&mut h, 0, &format!("prompt {i} {}", "words ".repeat(200)));
    }
    h.advance_time(TICK_MS).unwrap();
    assert_eq!(
        support::outstanding_prefill(&h).0,
        3,
        "VM 0's bookings are in the table"
    );
    crash(&mut h, 0);
    h.advance_time(EXPIRY_MS).unwrap();
    // The next booking on a live VM drops the expired row; once answered, nothing
    // is left.
    support::route_completion(&mut h, 1, "a request on the live VM");
    assert_eq!(
        support::outstanding_prefill(&h),
        (0, 0),
        "no outstanding prefill is left behind by the dead VM"
    );
}

/// A VM that has served no stream (as Envoy's main-thread VM) keeps no tree and
/// does not catch up, yet its tick writes the same Envoy-wide in-flight gauges as
/// the serving VMs: it must write what is in flight, not zero.
#[test]
fn a_vm_that_serves_nothing_still_reports_what_is_in_flight() {
    let mut h = host(2, "");
    let (_, a) = open(&mut h, 0, "held on the serving VM");
    let (_, b) = open(&mut h, 0, "and another one");
    for _ in 0..3 {
        h.advance_time(TICK_MS).unwrap();
        assert_eq!(stat(&h, "inflight"), 2, "after every tick of both VMs");
    }
    support::answer(&mut h, 0, a);
    support::answer(&mut h, 0, b);
    h.advance_time(TICK_MS).unwrap();
    assert_eq!(stat(&h, "inflight"), 0);
}
