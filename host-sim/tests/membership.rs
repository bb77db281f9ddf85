//! Membership from service discovery (`workers_from: collector`) on the real filter,
//! in 3 VMs (Envoy worker threads) over one shared-data store, in virtual time: the
//! worker list arrives with the collector's pushes on any thread, and every thread
//! routes by it; joins take traffic, leavers take none but keep their tenants for the
//! grace period, removed workers lose them; a bad list is refused whole.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use host_sim::{Host, RequestSpec};
use llm_router_push::{Member, Push, WorkerStats};
use support::{push, stat};

const VMS: usize = 3;
const GRACE_MS: u64 = 5_000;

/// Both places the trees can live: every thread routes by the list, whether it
/// decides or asks the thread that does.
const ROUTE_IN: [&str; 2] = ["every_vm", "one_vm"];

fn host(route_in: &str) -> Host {
    let config = format!(
        r#"{{"policy":"cache_aware","workers_from":"collector","stats_token":"tok","leave_grace_ms":{GRACE_MS},"max_workers":4,"route_in":"{route_in}"}}"#
    );
    support::host(&config, VMS, 9, &["engine_w0"])
}

/// A push listing `members` (as the collector names them from Envoy's clusters),
/// each with an idle sample.
fn members(names: &[&str]) -> String {
    let idle = names.iter().map(|n| WorkerStats {
        num_waiting: Some(0),
        num_running: Some(0),
        ..WorkerStats::reachable(Some(n.to_string()), None)
    });
    let membership = names.iter().map(|n| Member {
        name: n.to_string(),
        cluster: Some(format!("engine_{n}")),
        ..Member::default()
    });
    let push = Push {
        membership: Some(membership.collect()),
        ..Push::new(idle.collect())
    };
    serde_json::to_string(&push).unwrap()
}

fn accepted(h: &mut Host, vm: usize, names: &[&str]) {
    let (status, body) = push(h, vm, "tok", &members(names));
    assert_eq!(status, 200, "membership {names:?} accepted: {body}");
}

/// The cluster a completion of `prompt` goes to on `vm`, and the reason.
fn route(h: &mut Host, vm: usize, prompt: &str) -> (String, String) {
    let (cluster, reason) = support::route_completion(h, vm, prompt);
    (cluster, reason.unwrap_or_default())
}

const DOC: &str = "a long document that one conversation keeps coming back to, turn after turn";

#[test]
fn before_the_first_push_requests_get_a_503_that_says_why() {
    for route_in in ROUTE_IN {
        let mut h = host(route_in);
        let spec = RequestSpec::post_json("/v1/completions", support::completion("m", "hi"));
        let out = h.vm(0).request(spec).unwrap();
        let reply = out.local_response.expect("answered by the filter");
        assert_eq!(reply.status, 503);
        assert_eq!(
            reply.header("x-llm-router-reason"),
            Some("no_discovered_worker")
        );
        accepted(&mut h, 1, &["w0"]);
        assert_eq!(
            route(&mut h, 2, "hi").0,
            "engine_w0",
            "routable on every thread"
        );
    }
}

#[test]
fn a_joining_worker_takes_traffic_on_every_thread() {
    for route_in in ROUTE_IN {
        let mut h = host(route_in);
        accepted(&mut h, 0, &["w0", "w1"]);
        let (home, _) = route(&mut h, 1, DOC);
        accepted(&mut h, 2, &["w0", "w1", "w2"]);
        assert_eq!(stat(&h, "llm_router_workers"), 3);
        let mut to_new = 0;
        for i in 0..30 {
            // Openers that share no prefix: each a miss, one tree or one per thread.
            let (cluster, _) = route(&mut h, i % VMS, &format!("{i} opener: {i} {i} {i}"));
            to_new += usize::from(cluster == "engine_w2");
        }
        assert!(to_new > 0, "the new worker takes misses on every thread");
        let (cluster, reason) = route(&mut h, 0, &format!("{DOC} and a question"));
        assert_eq!(
            (cluster, reason.as_str()),
            (home, "cache_hit"),
            "known workers keep their tenants through a join"
        );
        assert_eq!(stat(&h, "llm_router_membership_updates"), 2);
    }
}

#[test]
fn a_leaver_takes_nothing_new_keeps_its_tenants_for_the_grace_then_loses_them() {
    for route_in in ROUTE_IN {
        let mut h = host(route_in);
        accepted(&mut h, 0, &["w0", "w1"]);
        let (home, _) = route(&mut h, 0, DOC);
        let (gone, stays) = if home == "engine_w0" {
            ("w0", "w1")
        } else {
            ("w1", "w0")
        };
        // A request in flight on the worker when it leaves.
        let spec = RequestSpec::post_json(
            "/v1/completions",
            support::completion("m", &format!("{DOC} in flight")),
        );
        let (cluster, in_flight) = support::open(&mut h, 1, spec);
        assert_eq!(cluster, home);
        assert_eq!(stat(&h, "llm_router_inflight"), 0, "gauges move on ticks");

        accepted(&mut h, 1, &[stays]);
        assert_eq!(stat(&h, "llm_router_workers_leaving"), 1);
        // Every thread takes the new list at its next sync.
        h.advance_time(support::SYNC_WINDOW_MS).unwrap();
        for vm in 0..VMS {
            let (cluster, _) = route(&mut h, vm, &format!("{DOC} on {vm}"));
            assert_eq!(
                cluster,
                format!("engine_{stays}"),
                "VM {vm}: a leaving worker takes no new request"
            );
        }
        // It flaps back within the grace: its tenants were kept, so the conversation
        // only it holds (the request in flight) returns to it.
        h.advance_time(GRACE_MS - 1).unwrap();
        accepted(&mut h, 2, &["w0", "w1"]);
        let (cluster, reason) = route(&mut h, 0, &format!("{DOC} in flight, continued"));
        assert_eq!(
            (cluster.as_str(), reason.as_str()),
            (home.as_str(), "cache_hit")
        );

        // It leaves for longer than the grace: removed, and its tenants with it.
        accepted(&mut h, 0, &[stays]);
        h.advance_time(GRACE_MS).unwrap();
        accepted(&mut h, 0, &[stays]);
        assert_eq!(
            (
                stat(&h, "llm_router_workers"),
                stat(&h, "llm_router_workers_leaving")
            ),
            (1, 0)
        );
        let reason = support::answer(&mut h, 1, in_flight.handle);
        assert!(
            reason.is_some(),
            "the request in flight on the removed worker ends normally"
        );
        h.advance_time(1_000).unwrap();
        assert_eq!(
            stat(&h, "llm_router_inflight"),
            0,
            "its count was released by name"
        );
        accepted(&mut h, 1, &[stays, gone]);
        let (cluster, reason) = route(&mut h, 2, &format!("{DOC} in flight, once more"));
        assert_eq!(
            (cluster, reason.as_str()),
            (format!("engine_{stays}"), "cache_hit"),
            "the returning worker starts without the tenants it lost: the document's other holder hits"
        );
    }
}

#[test]
fn a_bad_membership_push_is_refused_whole_and_changes_nothing() {
    for route_in in ROUTE_IN {
        let mut h = host(route_in);
        accepted(&mut h, 0, &["w0", "w1"]);
        let before = h.shared_data("llm_router.membership");
        let refusals = [
            (members(&["w0", "w0"]), "must be unique"),
            (members(&["a", "b", "c", "d", "e"]), "max_workers"),
            (
                r#"{"membership":[{"name":"w9","address":"nope"}],"workers":[]}"#.to_string(),
                "membership[0].address",
            ),
            (
                r#"{"membership":[{"name":"w9"}],"workers":[{"name":"w7"}]}"#.to_string(),
                "unknown worker `w7`",
            ),
            (
                r#"{"membership":[{"name":"w9","port":1}],"workers":[]}"#.to_string(),
                "membership[0]",
            ),
        ];
        for (body, why) in refusals {
            let (status, reply) = push(&mut h, 1, "tok", &body);
            assert_eq!(status, 400, "{body}: {reply}");
            assert!(reply.contains(why), "{body}: `{reply}` names `{why}`");
        }
        assert_eq!(h.shared_data("llm_router.membership"), before);
        assert_eq!(stat(&h, "llm_router_workers"), 2);
        assert_eq!(stat(&h, "llm_router_stats_pushes_rejected"), 5);
        let (status, _) = push(&mut h, 2, "tok", r#"{"workers":[{"name":"w1"}]}"#);
        assert_eq!(status, 200, "a push without membership keeps the list");
        assert_eq!(stat(&h, "llm_router_workers"), 2);
    }
}

#[test]
fn static_workers_ignore_pushed_membership() {
    let config = support::fleet_config(2, r#","stats_token":"tok""#);
    let mut h = support::host(&config, 1, 3, &support::fleet_clusters(2));
    let body =
        r#"{"membership":[{"name":"w0"},{"name":"w1"},{"name":"w9"}],"workers":[{"name":"w0"}]}"#;
    assert_eq!(push(&mut h, 0, "tok", body).0, 200);
    assert_eq!(
        h.shared_data("llm_router.membership"),
        Some(vec![0; 12]),
        "only the empty list every VM creates (version 0, no workers): nothing pushed"
    );
    let (status, reply) = push(&mut h, 0, "tok", r#"{"workers":[{"name":"w9"}]}"#);
    assert_eq!(status, 400, "the config's list decides: {reply}");
}
