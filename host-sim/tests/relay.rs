//! `route_in: one_vm`: the first VM configured (Envoy's main thread's) keeps the
//! trees and decides for every other VM, which asks it over shared queues. The real
//! filter in several VMs sharing one host.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{FailurePolicy, Fault, Host, MetricValue, RequestSpec, Status};
use llm_router::support::metric_names::{split_vm_metric, vm};

const WORKERS: usize = 4;
const ONE_VM: &str = r#","route_in":"one_vm""#;

/// The host, its VMs settled: the first VM's first tick takes the seat, the
/// others' find it.
fn host(vms: usize, extra: &str) -> Host {
    let config = support::fleet_config(WORKERS, extra);
    let mut h = support::host(&config, vms, 11, &support::fleet_clusters(WORKERS));
    h.advance_time(10).unwrap();
    h
}

use support::conversation as chat;

fn spec(body: Vec<u8>) -> RequestSpec<'static> {
    RequestSpec::post_json("/v1/chat/completions", body)
}

/// Routes, answers and ends a request on `vm`; (cluster, reason).
fn route(host: &mut Host, vm: usize, body: Vec<u8>) -> (String, String) {
    let (cluster, reason) = support::route(host, vm, spec(body));
    (cluster, reason.expect("decision reason on the response"))
}

/// Twelve conversations of four turns, first turns and later turns interleaved,
/// each request on the VM `vm_of` names, 10 ms apart, each finished before the
/// next: every decision sees an idle fleet.
fn workload(host: &mut Host, vm_of: impl Fn(usize) -> usize) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for i in 0..48 {
        let (conversation, turn) = (i % 12, i / 12);
        host.advance_time(10).unwrap();
        out.push(route(host, vm_of(i), chat(conversation, turn)));
    }
    out
}

/// Each VM's tree size, as its own gauge reports it on its tick.
fn trees_by_vm(host: &Host) -> Vec<u64> {
    host.metrics()
        .into_iter()
        .filter_map(|(name, value)| {
            let (_, field) = name.strip_prefix("wasmcustom.").and_then(split_vm_metric)?;
            match (field, value) {
                (vm::TREE_CHARS, MetricValue::Gauge(v)) => Some(v),
                _ => None,
            }
        })
        .collect()
}

#[test]
fn one_vm_decides_as_a_single_vm_does_whichever_thread_asks() {
    let mut alone = host(1, "");
    let expected = workload(&mut alone, |_| 0);
    // VM 0 is configured first: it routes. The others ask it.
    let mut relayed = host(4, ONE_VM);
    let got = workload(&mut relayed, |i| 1 + i % 3);
    assert_eq!(got, expected, "the same decisions, request for request");
    assert!(got.iter().filter(|(_, r)| r == "cache_hit").count() >= 36);
    // Counters are handed to the host on the tick of a VM without streams.
    relayed.advance_time(2_000).unwrap();
    assert_eq!(support::stat(&relayed, "llm_router_relay_answered"), 48);
    assert_eq!(support::stat(&relayed, "llm_router_relay_late"), 0);
    // One tree in the whole Envoy: the asking VMs keep none.
    let trees = trees_by_vm(&relayed);
    assert_eq!(trees.len(), 4, "every VM reports: {trees:?}");
    assert_eq!(trees.iter().filter(|t| **t > 0).count(), 1, "{trees:?}");
}

/// `predicted_ttft` with requests in flight together: every 4 ms a request opens
/// on the VM `vm_of` names, and the oldest open one is answered once four are
/// open; the cluster, reason and predicted TTFT of each, in the order they opened.
fn overlapping(host: &mut Host, vm_of: impl Fn(usize) -> usize) -> Vec<(String, String, String)> {
    let mut open = std::collections::VecDeque::new();
    let mut done = std::collections::BTreeMap::new();
    let mut answer = |host: &mut Host, (i, vm, cluster, handle): (usize, usize, String, _)| {
        let resp = host
            .vm(vm)
            .respond(handle, 200, &[("content-type", "application/json")], b"{}")
            .unwrap();
        let header = |name: &str| resp.header(name).unwrap_or_default().to_string();
        let decision = (
            cluster,
            header("x-llm-router-reason"),
            header("x-llm-router-predicted-ttft-ms"),
        );
        host.vm(vm).finish(handle).unwrap();
        done.insert(i, decision);
    };
    for i in 0..32 {
        host.advance_time(4).unwrap();
        let vm = vm_of(i);
        let (cluster, out) = support::open(host, vm, spec(chat(i % 8, i / 8)));
        open.push_back((i, vm, cluster, out.handle));
        if open.len() == 4 {
            let oldest = open.pop_front().unwrap();
            answer(host, oldest);
        }
    }
    while let Some(oldest) = open.pop_front() {
        host.advance_time(4).unwrap();
        answer(host, oldest);
    }
    done.into_values().collect()
}

/// The routing VM learns `predicted_ttft`'s costs and gives its bookings back from
/// what the asking VMs tell it at once, so its decisions are one VM's, prediction
/// for prediction, with requests in flight on every thread.
#[test]
fn predicted_ttft_decides_as_a_single_vm_does_with_requests_in_flight() {
    let config = r#","route_in":"one_vm","policy":"predicted_ttft""#;
    let mut alone = host(1, config);
    let expected = overlapping(&mut alone, |_| 0);
    let mut relayed = host(4, config);
    let got = overlapping(&mut relayed, |i| 1 + i % 3);
    assert_eq!(got, expected, "the same decisions, request for request");
    let predicted: std::collections::BTreeSet<&str> =
        got.iter().map(|(_, _, p)| p.as_str()).collect();
    // Learned costs and bookings move the predictions (a worker not learned yet is
    // priced at the fleet's mean, so they move together): equal predictions mean
    // the same learning, not merely the same priors.
    assert!(predicted.len() >= 3, "predictions that vary: {predicted:?}");
}

#[test]
fn the_routing_vm_routes_its_own_requests_too() {
    let mut h = host(2, ONE_VM);
    let (owner, reason) = route(&mut h, 0, chat(1, 0));
    assert_eq!(reason, "cache_miss");
    h.advance_time(10).unwrap();
    assert_eq!(
        route(&mut h, 1, chat(1, 1)),
        (owner.clone(), "cache_hit".into())
    );
    h.advance_time(10).unwrap();
    assert_eq!(route(&mut h, 0, chat(1, 2)), (owner, "cache_hit".into()));
    h.advance_time(2_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_relay_answered"), 1);
}

/// The routing VM counts each request it decided for another VM from its
/// decision to its end, whenever the asking VM shares its own counts.
#[test]
fn an_asked_request_counts_on_the_router_until_its_end() {
    // Three requests in flight on one worker make the fleet imbalanced.
    let mut h = host(
        3,
        r#","route_in":"one_vm","balance_abs_threshold":2,"balance_rel_threshold":1.5"#,
    );
    let (owner, _) = route(&mut h, 1, chat(1, 0));
    h.advance_time(10).unwrap();
    let held: Vec<_> = (0..3)
        .map(|turn| {
            let (cluster, out) = support::open(&mut h, 1 + turn % 2, spec(chat(1, turn + 1)));
            assert_eq!(cluster, owner, "hits while balanced");
            // Longer than a sync window and shorter than an asking VM's tick.
            h.advance_time(40).unwrap();
            out.handle
        })
        .collect();
    let (diverted, reason) = route(&mut h, 2, chat(1, 4));
    assert_eq!(reason, "imbalanced");
    assert_ne!(diverted, owner);
    for handle in held {
        h.vm(handle.vm).finish(handle).unwrap();
    }
    // Each asking VM's last end is told at once: the fleet is balanced again.
    h.advance_time(1).unwrap();
    assert_eq!(
        route(&mut h, 1, chat(1, 5)),
        (diverted, "cache_hit".into()),
        "the longest prefix is the diverted turn's"
    );
    h.advance_time(2_000).unwrap();
    assert_eq!(
        support::stat(&h, "llm_router_inflight"),
        0,
        "every count released"
    );
}

/// An asking VM that stops telling (it failed, or Envoy replaced it) has its
/// requests given back at the owner expiry; one alive keeps them by its beat.
#[test]
fn a_silent_asking_vm_has_its_counts_given_back_at_the_owner_expiry() {
    let mut h = host(2, r#","route_in":"one_vm""#);
    h.advance_time(10).unwrap();
    let (_, out) = support::open(&mut h, 1, spec(chat(1, 0)));
    h.advance_time(30_000).unwrap();
    assert_eq!(
        support::stat(&h, "llm_router_inflight"),
        1,
        "kept by the beat"
    );
    // Nothing this VM sends reaches the router any more.
    h.inject(Fault::new(
        "proxy_enqueue_shared_queue",
        Status::InternalFailure,
    ));
    h.advance_time(30_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_inflight"), 0, "given back");
    h.vm(1).finish(out.handle).unwrap();
}

/// The chars of the trees the worker behind `cluster` (`engine_i`: `wi`) holds, as
/// the routing VM's tick reports them.
fn worker_tree_chars(host: &Host, cluster: &str) -> u64 {
    let worker = cluster.replace("engine_", "w");
    support::stat(host, &format!("llm_router_worker.{worker}.tree_chars"))
}

#[test]
fn a_question_unanswered_by_the_deadline_is_routed_by_load() {
    let mut h = host(2, r#","route_in":"one_vm","relay_deadline_ms":100"#);
    // The routing VM stalls: it takes no question off its queue.
    h.inject(Fault::new(
        "proxy_dequeue_shared_queue",
        Status::InternalFailure,
    ));
    let out = h.vm(1).request(spec(chat(1, 0))).unwrap();
    assert!(
        !out.continued && out.local_response.is_none(),
        "waits: {out:?}"
    );
    h.advance_time(60).unwrap();
    let out = h.vm(1).outcome(out.handle).unwrap();
    assert!(!out.continued, "still within the deadline");
    h.advance_time(100).unwrap();
    let out = h.vm(1).outcome(out.handle).unwrap();
    assert!(out.continued, "routed at the deadline: {out:?}");
    let late = out.header("x-llm-router-cluster").unwrap().to_string();
    h.vm(1).finish(out.handle).unwrap();
    // The router comes back, answers the old question with the next one, and has
    // the late turn's record from the ring.
    h.clear_faults();
    h.advance_time(10).unwrap();
    assert_eq!(route(&mut h, 1, chat(1, 1)), (late, "cache_hit".into()));
    h.advance_time(2_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_relay_late"), 1);
    assert_eq!(support::stat(&h, "llm_router_relay_answered"), 2);
}

#[test]
fn an_answer_after_the_deadline_has_its_record_undone() {
    let mut h = host(2, r#","route_in":"one_vm","relay_deadline_ms":100"#);
    let (owner, _) = route(&mut h, 1, chat(1, 0));
    h.advance_time(2_000).unwrap();
    let owner_held = worker_tree_chars(&h, &owner);
    assert!(owner_held > 0);
    // The router answers the next turn (for the owner, recording it there), but the
    // asking VM cannot take the answer off its queue: each question is two takes on
    // each side (the message, then an empty queue), so its first take of this one
    // is the seventh.
    h.inject(Fault::new("proxy_dequeue_shared_queue", Status::InternalFailure).from_call(7));
    let out = h.vm(1).request(spec(chat(1, 1))).unwrap();
    assert!(!out.continued, "waits: {out:?}");
    h.advance_time(160).unwrap();
    let out = h.vm(1).outcome(out.handle).unwrap();
    assert!(out.continued, "routed at the deadline: {out:?}");
    let late = out.header("x-llm-router-cluster").unwrap().to_string();
    assert_ne!(
        late, owner,
        "by load, on an idle fleet: not the owner by this seed"
    );
    h.vm(1).finish(out.handle).unwrap();
    // The next answer (to a body with no routing text, which records nothing)
    // comes with the old one: the owner's record of the turn the client never sent
    // it is undone.
    h.clear_faults();
    let (_, reason) = route(&mut h, 1, br#"{"model":"m"}"#.to_vec());
    assert_eq!(reason, "unreadable_body");
    h.advance_time(2_000).unwrap();
    assert_eq!(
        worker_tree_chars(&h, &owner),
        owner_held,
        "the owner holds turn 0 only"
    );
}

#[test]
fn an_asked_request_no_engine_served_takes_its_record_back() {
    let mut h = host(3, ONE_VM);
    let (cluster, out) = support::open(&mut h, 1, spec(chat(5, 0)));
    h.vm(1)
        .respond(out.handle, 503, &[("content-type", "text/plain")], b"down")
        .unwrap();
    h.vm(1).finish(out.handle).unwrap();
    assert_eq!(support::stat(&h, "llm_router_unserved"), 1);
    // The record's undoing reaches the routing VM through the ring; the next turn
    // finds no prefix on the failed worker.
    h.advance_time(1_000).unwrap();
    let (_, reason) = route(&mut h, 2, chat(5, 1));
    assert_eq!(reason, "cache_miss", "no prefix left on {cluster}");
}

#[test]
fn a_routing_vm_that_stops_is_replaced_and_the_trees_come_back_from_the_ring() {
    let config = support::fleet_config(WORKERS, ONE_VM);
    let builder = support::builder(&config, 3, 11, &support::fleet_clusters(WORKERS))
        .failure_policy(FailurePolicy::FailOpen);
    let mut h = support::build(builder, &config);
    h.advance_time(10).unwrap();
    let (owner, _) = route(&mut h, 1, chat(1, 0));
    // The routing VM crashes on the next question it takes: it ticks no more.
    h.inject(Fault::trap("proxy_dequeue_shared_queue").on_call(7));
    h.advance_time(10).unwrap();
    let out = h.vm(1).request(spec(chat(2, 0))).unwrap();
    assert!(h.failure(0).is_some(), "the routing VM failed");
    // The deadline (200 ms), at the asking VM's next tick (every 100 ms).
    h.advance_time(300).unwrap();
    let out = h.vm(1).outcome(out.handle).unwrap();
    assert!(out.continued, "routed by load at the deadline: {out:?}");
    h.vm(1).finish(out.handle).unwrap();
    // Its seat goes stale (three whole ticks, at least 2 s); the first VM to notice
    // takes it and rebuilds the trees from the ring.
    h.advance_time(3_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_relay_takeovers"), 1);
    for vm in [1, 2] {
        h.advance_time(10).unwrap();
        let turn = vm;
        assert_eq!(
            route(&mut h, vm, chat(1, turn)),
            (owner.clone(), "cache_hit".into()),
            "turn {turn} on VM {vm}"
        );
    }
}

/// After a takeover the new routing VM is told what the old one counted for the
/// asking VMs, and counts it until it ends: the old one's counts expire with its
/// row, and nothing would count those requests any more.
#[test]
fn a_new_routing_vm_counts_the_requests_the_failed_one_counted() {
    let config = support::fleet_config(WORKERS, ONE_VM);
    let builder = support::builder(&config, 3, 11, &support::fleet_clusters(WORKERS))
        .failure_policy(FailurePolicy::FailOpen);
    let mut h = support::build(builder, &config);
    h.advance_time(10).unwrap();
    // VMs 1 and 2 each hold a request open that VM 0 decided and counts.
    let held: Vec<_> = [1, 2]
        .into_iter()
        .map(|vm| (vm, support::open(&mut h, vm, spec(chat(vm, 0))).1.handle))
        .collect();
    // The routing VM crashes on the next question it takes.
    h.inject(Fault::trap("proxy_dequeue_shared_queue").on_call(DEQUEUES_BEFORE_THE_CRASH));
    h.advance_time(10).unwrap();
    let late = h.vm(1).request(spec(chat(9, 0))).unwrap();
    assert!(h.failure(0).is_some(), "the routing VM failed");
    h.advance_time(300).unwrap();
    h.vm(1).finish(late.handle).unwrap();
    // A new routing VM, then the old one's row expires (10 ticks).
    h.advance_time(3_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_relay_takeovers"), 1);
    h.advance_time(12_000).unwrap();
    // The VM that took the seat routes its own request uncounted (it asked the old
    // router); the other VM's is counted by the new router.
    assert_eq!(
        support::stat(&h, "llm_router_inflight"),
        1,
        "the other VM's request"
    );
    for (vm, handle) in held {
        h.vm(vm).finish(handle).unwrap();
    }
    h.advance_time(2_000).unwrap();
    assert_eq!(
        support::stat(&h, "llm_router_inflight"),
        0,
        "every count given back"
    );
}

/// Shared-queue dequeues before the question that crashes the routing VM in
/// `a_new_routing_vm_counts_the_requests_the_failed_one_counted`.
const DEQUEUES_BEFORE_THE_CRASH: u64 = 9;

const PD: &str = r#"{"route_in":"one_vm","workers":[
    {"name":"p0","pool":"prefill","cluster":"prefill_0","address":"10.0.0.1:30000","bootstrap_port":8998},
    {"name":"p1","pool":"prefill","cluster":"prefill_1","address":"10.0.0.2:30000","bootstrap_port":8999},
    {"name":"d0","pool":"decode","cluster":"decode_0"},
    {"name":"d1","pool":"decode","cluster":"decode_1"}],
    "prefill_timeout_ms":2000}"#;

/// PD on an asking VM: the routing VM picks both legs; the asking VM sends the
/// prefill copy from its root context, and its answer (or failure) reaches the
/// stream.
#[test]
fn an_asked_pd_request_sends_its_prefill_copy_and_hears_its_answer() {
    let clusters = ["prefill_0", "prefill_1", "decode_0", "decode_1"];
    let mut h = support::host(PD, 2, 11, &clusters);
    h.advance_time(10).unwrap();
    let system = "You are a meticulous assistant. ".repeat(30);
    let mut prefills = Vec::new();
    for (i, vm) in [0, 1, 1, 1].into_iter().enumerate() {
        h.advance_time(10).unwrap();
        let body = support::chat("m", &[system.as_str(), &format!("question {i}")]);
        let length = body.len().to_string();
        let mut spec = spec(body);
        spec.headers.push(("content-length", &length));
        let out = h.vm(vm).request(spec).unwrap();
        assert!(out.continued, "{:?}", out.local_response);
        let calls = h.pending_http_calls();
        assert_eq!(calls.len(), 1, "one prefill copy: {calls:?}");
        let room = |b: &[u8]| {
            serde_json::from_slice::<serde_json::Value>(b).unwrap()["bootstrap_room"].clone()
        };
        assert_eq!(
            room(&calls[0].body),
            room(&out.request_body),
            "one body for both"
        );
        prefills.push(calls[0].cluster.clone());
        if i == 3 {
            // A failed prefill on an asked request: the client gets the 502 at once.
            h.answer_http_call(calls[0].token, 500, &[], b"{}").unwrap();
            let out = h.vm(vm).outcome(out.handle).unwrap();
            let reply = out.local_response.expect("the filter answers");
            assert!(reply.status >= 500, "{reply:?}");
        } else {
            h.answer_http_call(calls[0].token, 200, &[], b"{}").unwrap();
            h.vm(vm).respond(out.handle, 200, &[], b"{}").unwrap();
            h.vm(vm).finish(out.handle).unwrap();
        }
    }
    assert!(prefills.iter().all(|p| *p == prefills[0]), "{prefills:?}");
    h.advance_time(1_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_pd_pairs"), 4);
    assert_eq!(support::stat(&h, "llm_router_pd_prefill_failures"), 1);
    assert_eq!(support::stat(&h, "llm_router_relay_answered"), 3);
}

/// `predicted_ttft` on asking VMs: each decision's prediction is recorded once,
/// and what the routing VM held of the bookings is given back.
#[test]
fn predictions_are_recorded_once_and_every_booking_comes_back() {
    let mut h = host(3, r#","route_in":"one_vm","policy":"predicted_ttft""#);
    for i in 0..6 {
        h.advance_time(10).unwrap();
        route(&mut h, 1 + i % 2, chat(i % 2, i / 2));
    }
    h.advance_time(1_000).unwrap();
    let recorded = h
        .histogram("wasmcustom.llm_router_predicted_ttft_ms")
        .expect("the prediction histogram is defined");
    assert_eq!(
        recorded.len(),
        6,
        "one prediction per decision: {recorded:?}"
    );
    assert_eq!(
        support::outstanding_prefill(&h),
        (0, 0),
        "nothing left booked"
    );
    assert_eq!(support::stat(&h, "llm_router_inflight"), 0);
}

/// Discovery mode: the worker list arrives with a push on any thread; an asking VM,
/// which reads the list only on its tick, learns it from the first answer naming a
/// worker it did not know.
#[test]
fn an_asking_vm_follows_a_worker_list_it_learns_from_an_answer() {
    use llm_router_push::{Member, Push, WorkerStats};
    let config = r#"{"policy":"cache_aware","route_in":"one_vm","workers_from":"collector","stats_token":"tok"}"#;
    let mut h = support::host(config, 3, 9, &["engine_a", "engine_b"]);
    h.advance_time(10).unwrap();
    let names = ["a", "b"];
    let push = Push {
        membership: Some(
            names
                .iter()
                .map(|n| Member {
                    name: n.to_string(),
                    cluster: Some(format!("engine_{n}")),
                    ..Member::default()
                })
                .collect(),
        ),
        ..Push::new(
            names
                .iter()
                .map(|n| WorkerStats::reachable(Some(n.to_string()), None))
                .collect(),
        )
    };
    let (status, body) = support::push(&mut h, 2, "tok", &serde_json::to_string(&push).unwrap());
    assert_eq!(status, 200, "{body}");
    // Past the routing VM's sync window, before any asking VM's tick.
    h.advance_time(3).unwrap();
    let (cluster, reason) = support::route_completion(&mut h, 1, "hello");
    assert!(cluster.starts_with("engine_"), "{cluster}");
    assert_eq!(reason.as_deref(), Some("cache_miss"));
}

/// Envoy starts a failed VM afresh on the same thread (`FAIL_RELOAD`): when the
/// routing VM was that one, the questions sent to its queue reach its successor,
/// which takes the seat and answers them with the trees rebuilt from the ring.
#[test]
fn the_successor_of_a_failed_routing_vm_answers_its_queue() {
    let config = support::fleet_config(WORKERS, ONE_VM);
    let builder = support::builder(&config, 2, 11, &support::fleet_clusters(WORKERS))
        .failure_policy(FailurePolicy::FailReload);
    let mut h = support::build(builder, &config);
    h.advance_time(10).unwrap();
    let (owner, _) = route(&mut h, 1, chat(1, 0));
    // The routing VM (0) fails in the middle of one of its own requests.
    let next = h
        .hostcall_counts()
        .get("proxy_remove_header_map_value")
        .map_or(1, |n| n + 1);
    h.inject(Fault::trap("proxy_remove_header_map_value").from_call(next));
    let out = h.vm(0).request(spec(chat(2, 0))).unwrap();
    assert_eq!(out.local_response.map(|r| r.status), Some(503));
    assert!(h.failure(0).is_some());
    h.clear_faults();
    // Its next stream starts the successor, which asks the queue it inherited.
    h.advance_time(10).unwrap();
    let r = route(&mut h, 0, chat(1, 1));
    assert_eq!(r, (owner.clone(), "cache_hit".into()));
    assert_eq!(h.reloads(0), 1);
    h.advance_time(10).unwrap();
    assert_eq!(route(&mut h, 1, chat(1, 2)), (owner, "cache_hit".into()));
    h.advance_time(2_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_relay_takeovers"), 1);
    // The successor's own first question waited when it took the seat: decided
    // there and then, as late.
    assert_eq!(support::stat(&h, "llm_router_relay_late"), 1);
}

/// A routing VM that finds the seat taken by another (its heartbeat seemed lost)
/// asks the new one from then on, and hears its answers.
#[test]
fn a_routing_vm_that_lost_its_seat_asks_the_new_holder() {
    let config = support::fleet_config(WORKERS, ONE_VM);
    let mut h = support::host(&config, 3, 11, &support::fleet_clusters(WORKERS));
    // VM 1's request comes before any tick: VM 1 takes the seat.
    let (owner, _) = route(&mut h, 1, chat(1, 0));
    let seat = h
        .shared_data_keys()
        .into_iter()
        .find(|k| k.starts_with("llm_router.relay.seat."))
        .expect("the seat");
    // The seat as if its holder had stopped beating long ago: the next VM to tick
    // (VM 0, still looking for the router) takes it over.
    let mut stale = 999u64.to_le_bytes().to_vec();
    stale.extend_from_slice(&0u64.to_le_bytes());
    h.set_shared_data(&seat, stale);
    h.advance_time(5).unwrap();
    // VM 1 sees the new holder on its next beat and asks it from then on.
    h.advance_time(200).unwrap();
    let (cluster, reason) = route(&mut h, 1, chat(1, 1));
    assert_eq!(
        (cluster.as_str(), reason.as_str()),
        (owner.as_str(), "cache_hit")
    );
    h.advance_time(1_000).unwrap();
    assert_eq!(support::stat(&h, "llm_router_relay_takeovers"), 1);
    assert_eq!(
        support::stat(&h, "llm_router_relay_late"),
        0,
        "answered, not late"
    );
}
