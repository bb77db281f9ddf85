//! `predicted_ttft` on the real filter in 4 VMs (4 Envoy worker threads) sharing one
//! shared-data store: a hot shared prefix spreads over the fleet while every
//! conversation keeps its worker, the outstanding prefill one thread books is seen
//! by the next decision on another, and every booking is released however the
//! stream ends.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use std::collections::{BTreeMap, BTreeSet};

use host_sim::{Host, RequestSpec, StreamHandle};

const WORKERS: usize = 4;
const VMS: usize = 4;

fn host(extra: &str) -> Host {
    let config = support::fleet_config(WORKERS, &format!(r#","policy":"predicted_ttft"{extra}"#));
    support::host(&config, VMS, 5, &support::fleet_clusters(WORKERS))
}

/// One system prompt every conversation shares (the hot prefix).
fn system() -> String {
    "You are the support assistant of a large shop; answer briefly. ".repeat(64)
}

/// Conversation `conv` at `turn`: the shared system prompt, then its own turns.
fn chat(conv: usize, turn: usize) -> Vec<u8> {
    let turns = support::conversation_turns(
        turn,
        |t| {
            format!(
                "conversation {conv} question {t}: {}",
                "details ".repeat(40)
            )
        },
        |t| format!("answer {t} to {conv}: {}", "words ".repeat(40)),
    );
    support::chat_with_system("m", Some(&system()), &turns)
}

fn open(h: &mut Host, vm: usize, body: Vec<u8>) -> (String, StreamHandle) {
    let spec = RequestSpec::post_json("/v1/chat/completions", body);
    let (cluster, out) = support::open(h, vm, spec);
    assert!(out.continued, "routed and continued: {out:?}");
    (cluster, out.handle)
}

/// The upstream answers (first byte) and the stream ends; returns the reason and
/// the predicted-TTFT header.
fn answer(h: &mut Host, vm: usize, handle: StreamHandle) -> (String, Option<String>) {
    let resp = h
        .vm(vm)
        .respond(handle, 200, &[("content-type", "application/json")], b"{}")
        .expect("response runs");
    let reason = resp
        .header("x-llm-router-reason")
        .expect("a reason")
        .to_string();
    let predicted = resp
        .header("x-llm-router-predicted-ttft-ms")
        .map(str::to_string);
    h.vm(vm).finish(handle).expect("stream ends");
    (reason, predicted)
}

/// No VM's row of the shared in-flight table declares prefill: nothing booked is
/// left behind.
fn assert_no_work_left(h: &Host, when: &str) {
    assert_eq!(
        support::outstanding_prefill(h),
        (0, 0),
        "{when}: outstanding prefill left in the in-flight table"
    );
}

#[test]
fn a_hot_prefix_spreads_while_conversations_keep_their_worker() {
    let mut h = host("");
    // Round 1: 16 conversations start at once on 4 threads, all sharing one long
    // system prompt; none answered yet, so every booking is outstanding.
    let mut home = BTreeMap::new();
    let mut open_streams = Vec::new();
    for conv in 0..16 {
        let vm = conv % VMS;
        let (cluster, handle) = open(&mut h, vm, chat(conv, 0));
        home.insert(conv, cluster);
        open_streams.push((vm, handle));
    }
    let used: BTreeSet<&String> = home.values().collect();
    assert_eq!(
        used.len(),
        WORKERS,
        "the hot prefix is replicated on every worker, not herded: {home:?}"
    );
    let mut per_worker: BTreeMap<&String, usize> = BTreeMap::new();
    for c in home.values() {
        *per_worker.entry(c).or_default() += 1;
    }
    // Bounded load: 16 over 4 workers, none far above the mean of 4.
    assert!(
        per_worker.values().all(|&n| n <= 6),
        "bounded load keeps every worker near the mean: {per_worker:?}"
    );
    // The engines take a while on the long prompts.
    h.advance_time(25).unwrap();
    for (vm, handle) in open_streams {
        answer(&mut h, vm, handle);
    }
    assert_no_work_left(&h, "after round 1");
    // Later turns, one at a time on a different thread each: every conversation
    // stays where its history is.
    for turn in 1..4 {
        for conv in 0..16 {
            let vm = (conv + turn) % VMS;
            let (cluster, handle) = open(&mut h, vm, chat(conv, turn));
            h.advance_time(3).unwrap();
            let (reason, predicted) = answer(&mut h, vm, handle);
            assert_eq!(
                &cluster, &home[&conv],
                "conversation {conv} turn {turn} keeps its worker"
            );
            assert_eq!(reason, "ttft_cache", "conversation {conv} turn {turn}");
            assert!(predicted.is_some(), "the prediction is on the response");
        }
    }
    assert_no_work_left(&h, "after every turn");
    assert!(
        support::stat(&h, "llm_router_decisions_cache_hit") >= 48,
        "every later turn is a cache hit"
    );
}

#[test]
fn a_booking_on_one_thread_is_seen_by_the_next_decision_on_another() {
    let mut h = host("");
    // Warm one worker with the hot prefix, so costs are learned from a real delay.
    let (_, w) = open(&mut h, 3, chat(99, 0));
    h.advance_time(20).unwrap();
    answer(&mut h, 3, w);
    // A conversation opens on VM 0 and stays unanswered: its prefill is booked.
    let (first, a) = open(&mut h, 0, chat(100, 0));
    let (prefilling, chars) = support::outstanding_prefill(&h);
    assert_eq!(
        prefilling, 1,
        "booked at the decision, published with the request"
    );
    assert!(chars > 0, "its uncached chars (the system prompt is held)");
    // The same text again on VM 1 (a retry): the tree says `first` holds all of it,
    // and the prediction there counts the first one's prefill ahead of it.
    let (second, b) = open(&mut h, 1, chat(100, 0));
    assert_eq!(second, first, "stays with the holder of the whole text");
    h.advance_time(20).unwrap();
    let (_, behind) = answer(&mut h, 1, b);
    h.vm(0).reset(a).expect("reset runs");
    assert_no_work_left(&h, "a reset releases its booking");
    // The same request with nothing outstanding is predicted faster.
    let (third, c) = open(&mut h, 2, chat(100, 0));
    assert_eq!(third, first);
    h.advance_time(20).unwrap();
    let (_, alone) = answer(&mut h, 2, c);
    let ms = |v: Option<String>| -> f64 { v.expect("predicted").parse().expect("a number") };
    let (behind, alone) = (ms(behind), ms(alone));
    assert!(
        behind > alone,
        "the booking on another thread is work ahead: {behind} ms vs {alone} ms"
    );
    assert_no_work_left(&h, "after every stream");
}

#[test]
fn a_reset_before_the_first_byte_releases_and_teaches_nothing() {
    let mut h = host("");
    let (_, a) = open(&mut h, 0, chat(300, 0));
    let (_, b) = open(&mut h, 1, chat(301, 0));
    h.advance_time(50).unwrap();
    h.vm(0).reset(a).expect("reset runs");
    h.vm(1).reset(b).expect("reset runs");
    assert_no_work_left(&h, "resets release their bookings");
    let costs = h
        .shared_data("llm_router.ttft.worker_costs")
        .unwrap_or_default();
    assert!(
        costs.is_empty() || costs == [0, 0, 0, 0],
        "no cost learned from a reset: {costs:?}"
    );
}

#[test]
fn answered_requests_teach_costs_and_record_the_prediction() {
    let mut h = host("");
    for conv in 0..4 {
        let (_, handle) = open(&mut h, conv % VMS, chat(200 + conv, 0));
        h.advance_time(40).unwrap();
        answer(&mut h, conv % VMS, handle);
    }
    // Each VM shares what it learned on its tick.
    h.advance_time(1_000).unwrap();
    let costs = h
        .shared_data("llm_router.ttft.worker_costs")
        .unwrap_or_default();
    assert!(
        costs.len() > 4,
        "first bytes and ends taught costs: {costs:?}"
    );
    let observed = h
        .histogram("wasmcustom.llm_router_predicted_ttft_ms")
        .expect("the prediction histogram is defined");
    assert_eq!(
        observed.len(),
        4,
        "one prediction per decision: {observed:?}"
    );
}

#[test]
fn a_streamed_answer_reads_the_clock_for_its_first_byte_and_its_end_only() {
    let mut h = host("");
    let clock = |h: &Host| {
        h.hostcall_counts()
            .get("proxy_get_current_time_nanoseconds")
            .copied()
            .unwrap_or(0)
    };
    let (_, handle) = open(&mut h, 0, chat(400, 0));
    h.advance_time(30).unwrap();
    let before = clock(&h);
    h.vm(0)
        .respond_headers(handle, 200, &[("content-type", "text/event-stream")])
        .expect("headers run");
    for token in 0..20 {
        h.vm(0)
            .respond_body(handle, format!("data: token {token}\n\n").as_bytes(), false)
            .expect("a chunk runs");
    }
    h.vm(0)
        .respond_body(handle, b"data: [DONE]\n\n", true)
        .expect("the last chunk runs");
    h.vm(0).finish(handle).expect("stream ends");
    assert_eq!(
        clock(&h) - before,
        2,
        "one read at the first byte (teaching the prefill cost), one at the end"
    );
    assert_no_work_left(&h, "a streamed answer releases its booking");
    h.advance_time(1_000).unwrap();
    let costs = h
        .shared_data("llm_router.ttft.worker_costs")
        .unwrap_or_default();
    assert!(costs.len() > 4, "the stream taught its costs");
}
