//! Membership from service discovery (`workers_from: collector`): the worker list
//! comes from the collector's pushes, which follow Envoy's own clusters, instead of
//! the plugin config.
//!
//! A push may carry `membership`, the workers the collector discovered, each with the
//! fields a configured worker has (`name`, `cluster`, `address`, `pool`, `models`,
//! `bootstrap_port`, `bootstrap_host`). The new list is the pushed one, checked by
//! every rule a configured list must pass (`Config::with_workers`: names, addresses,
//! pools, `max_workers`), merged with the current one by [`merge`]:
//!
//! - a pushed worker is routable (a new one joins, a leaving one comes back with its
//!   tenants intact, a known one takes the pushed fields);
//! - a known worker the push leaves out starts leaving: it takes no new request
//!   (Envoy may already have dropped its endpoint) but keeps its tenants for
//!   `leave_grace_ms`, so an endpoint that flaps keeps its cache affinity;
//! - a worker leaving for longer than the grace period is removed, and with it its
//!   tenants in every tree;
//! - if the leaving workers would make the list break a rule (a fleet switched
//!   between regular and PD, `max_workers` exceeded), they are removed at once: the
//!   pushed list alone is valid.
//!
//! A push whose membership breaks a rule is refused whole (400, nothing changes); a
//! push without `membership` keeps the current list. The merged list is stored in
//! shared data (`shared::MembershipTable`, versioned) and shared through the
//! operation ring (`Op::Membership`), so every VM swaps lists at the same point of
//! the tree operation stream and trees stay identical across threads. Requests in
//! flight keep their counts: in-flight, samples and flags are keyed by worker name,
//! so a worker that left is released by name and simply no longer read.

use serde::Deserialize;
use serde_json::Value;

use crate::config::{Config, WorkerConfig, DEFAULT_LEAVE_GRACE_MS};
use crate::push::PushError;

/// The push's `membership`, if it has one (a push without it keeps the current
/// list: samples-only pushers and older collectors still work).
pub fn parse_membership(body: &[u8]) -> Result<Option<Vec<WorkerConfig>>, PushError> {
    #[derive(Deserialize)]
    struct WithMembership {
        #[serde(default)]
        membership: Option<Vec<Value>>,
    }
    let push: WithMembership = serde_json::from_slice(body)
        .map_err(|e| PushError::BadRequest(format!("not a snapshot object: {e}")))?;
    let Some(entries) = push.membership else {
        return Ok(None);
    };
    entries
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value::<WorkerConfig>(v)
                .map_err(|e| PushError::BadRequest(format!("membership[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// Checks a pushed list by the rules of a configured one; errors name the entry as
/// `membership[i]`.
pub fn check(cfg: &Config, pushed: &[WorkerConfig]) -> Result<(), PushError> {
    cfg.with_workers(pushed.to_vec()).map(|_| ()).map_err(|e| {
        let field = e.field.replacen("workers", "membership", 1);
        PushError::BadRequest(format!("membership refused: `{field}` {}", e.rule))
    })
}

/// The list after a push of `pushed` (checked first): the merge with `current`,
/// or `pushed` alone when the leaving workers cannot stay beside it.
pub fn update(
    cfg: &Config,
    current: &[WorkerConfig],
    pushed: &[WorkerConfig],
    now_ms: u64,
) -> Result<Vec<WorkerConfig>, PushError> {
    check(cfg, pushed)?;
    let grace_ms = cfg.leave_grace_ms.unwrap_or(DEFAULT_LEAVE_GRACE_MS);
    let merged = merge(current, pushed, now_ms, grace_ms);
    if cfg.with_workers(merged.clone()).is_ok() {
        Ok(merged)
    } else {
        Ok(pushed.to_vec())
    }
}

/// The new list: `current` in its order (leaving workers marked, expired ones
/// gone), then the workers new in `pushed`, in its order. Keeping the order keeps
/// worker indices stable, so most updates remap no tenant.
pub fn merge(
    current: &[WorkerConfig],
    pushed: &[WorkerConfig],
    now_ms: u64,
    grace_ms: u64,
) -> Vec<WorkerConfig> {
    let mut out: Vec<WorkerConfig> = Vec::with_capacity(current.len().max(pushed.len()));
    for old in current {
        if let Some(new) = pushed.iter().find(|w| w.name == old.name) {
            out.push(WorkerConfig {
                leaving_since_ms: None,
                ..new.clone()
            });
            continue;
        }
        let since = old.leaving_since_ms.unwrap_or(now_ms);
        if now_ms.saturating_sub(since) < grace_ms {
            out.push(WorkerConfig {
                leaving_since_ms: Some(since),
                ..old.clone()
            });
        }
    }
    for new in pushed {
        if !current.iter().any(|w| w.name == new.name) {
            out.push(new.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Pool;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn discovery() -> Config {
        Config::from_json(
            br#"{"policy":"cache_aware","workers_from":"collector","stats_token":"t","max_workers":3}"#,
        )
        .unwrap()
    }

    fn w(name: &str) -> WorkerConfig {
        serde_json::from_value(serde_json::json!({"name": name})).unwrap()
    }

    fn names(ws: &[WorkerConfig]) -> Vec<(&str, Option<u64>)> {
        ws.iter()
            .map(|w| (w.name.as_str(), w.leaving_since_ms))
            .collect()
    }

    #[test]
    fn membership_is_optional_and_parsed_with_worker_fields() {
        assert_eq!(parse_membership(br#"{"workers":[]}"#), Ok(None));
        let got = parse_membership(
            br#"{"workers":[],"membership":[{"name":"a","cluster":"engine_a","address":"10.0.0.1:8000","models":["m"]}]}"#,
        )
        .unwrap()
        .unwrap();
        assert_eq!(got[0].cluster(), "engine_a");
        assert_eq!(got[0].address.as_deref(), Some("10.0.0.1:8000"));
        assert!(got[0].routable(), "a pushed worker is never leaving");
        let e =
            parse_membership(br#"{"membership":[{"name":"a","leaving_since_ms":1}]}"#).unwrap_err();
        assert!(
            e.reason().contains("membership[0]"),
            "state is not pushable: {e:?}"
        );
        assert_eq!(parse_membership(b"nope").unwrap_err().status(), 400);
        assert_eq!(
            parse_membership(br#"{"membership":{}}"#)
                .unwrap_err()
                .status(),
            400
        );
    }

    #[test]
    fn pushed_lists_pass_the_configured_lists_rules() {
        let cfg = discovery();
        assert!(check(&cfg, &[w("a"), w("b")]).is_ok());
        assert!(check(&cfg, &[]).is_ok(), "an empty fleet is a fleet");
        let reason = |ws: &[WorkerConfig]| check(&cfg, ws).unwrap_err().reason();
        assert!(reason(&[w("a"), w("a")]).contains("`membership[1].name` must be unique"));
        assert!(reason(&[w("a"), w("b"), w("c"), w("d")]).contains("max_workers"));
        let mut bad = w("a");
        bad.address = Some("nohost".into());
        assert!(reason(&[bad]).contains("membership[0].address"));
        let mut prefill = w("p");
        prefill.pool = Pool::Prefill;
        let mut decode = w("d");
        decode.pool = Pool::Decode;
        assert!(
            reason(&[prefill.clone()]).contains("pool: decode"),
            "PD rules hold for pushed workers too"
        );
        assert!(reason(&[prefill, decode]).contains("membership[0].bootstrap_port"));
        let endpoint = Config::from_json(
            br#"{"workers_from":"collector","stats_token":"t","target":"endpoint"}"#,
        )
        .unwrap();
        assert!(check(&endpoint, &[w("a")])
            .unwrap_err()
            .reason()
            .contains("target: endpoint"));
    }

    #[test]
    fn joins_append_and_keep_indices() {
        let got = merge(&[w("a"), w("b")], &[w("c"), w("b"), w("a")], 5, 10);
        assert_eq!(
            names(&got),
            [("a", None), ("b", None), ("c", None)],
            "known workers keep their place, new ones come after"
        );
        assert_eq!(merge(&[], &[w("x")], 0, 10)[0].name, "x");
    }

    #[test]
    fn leavers_wait_out_the_grace_then_go() {
        let step1 = merge(&[w("a"), w("b")], &[w("a")], 100, 10);
        assert_eq!(names(&step1), [("a", None), ("b", Some(100))]);
        let step2 = merge(&step1, &[w("a")], 109, 10);
        assert_eq!(
            names(&step2),
            [("a", None), ("b", Some(100))],
            "still within the grace period: the first miss is the start"
        );
        let step3 = merge(&step2, &[w("a")], 110, 10);
        assert_eq!(names(&step3), [("a", None)], "grace over: removed");
        assert!(
            merge(&[w("a")], &[], 0, 0).is_empty(),
            "no grace: removed at once"
        );
    }

    #[test]
    fn a_flapping_worker_comes_back_in_place() {
        let left = merge(&[w("a"), w("b")], &[w("a")], 100, 10);
        let back = merge(&left, &[w("b"), w("a")], 105, 10);
        assert_eq!(names(&back), [("a", None), ("b", None)]);
    }

    #[test]
    fn pushed_fields_replace_known_ones() {
        let mut moved = w("a");
        moved.address = Some("10.0.0.9:8000".into());
        let got = merge(&[w("a")], &[moved.clone()], 1, 10);
        assert_eq!(got, vec![moved]);
    }

    #[test]
    fn leavers_that_would_break_a_rule_go_at_once() {
        let cfg = discovery();
        let pd = |name: &str, pool: Pool| {
            let mut w = w(name);
            w.pool = pool;
            if pool == Pool::Prefill {
                w.address = Some("10.0.0.1:8000".into());
                w.bootstrap_port = Some(8998);
            }
            w
        };
        let (p, d) = (pd("p", Pool::Prefill), pd("d", Pool::Decode));
        let got = update(&cfg, &[w("r")], &[p.clone(), d.clone()], 1).unwrap();
        assert_eq!(names(&got), [("p", None), ("d", None)], "regular beside PD");
        let got = update(&cfg, &[w("a"), w("b")], &[w("c"), w("d"), w("e")], 1).unwrap();
        assert_eq!(got.len(), 3, "max_workers holds with leavers: {got:?}");
        let kept = update(&cfg, &[w("a"), w("b")], &[w("a"), w("c")], 1).unwrap();
        assert_eq!(names(&kept), [("a", None), ("b", Some(1)), ("c", None)]);
        assert!(update(&cfg, &[], &[w("x"), w("x")], 1).is_err());
    }

    /// The router's side: lists swap in by version, in ring order, and tenants
    /// follow worker names.
    mod at_the_router {
        use super::*;
        use crate::decision::Reason;
        use crate::load::Loads;
        use crate::parse::testing::chat;
        use crate::request::router::{NoWorker, Router};
        use crate::rng::SplitMix64;
        use crate::shared::{Membership, Op};
        #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
        use wasm_bindgen_test::wasm_bindgen_test as test;

        fn list(version: u64, workers: &[WorkerConfig]) -> Op {
            Op::Membership(Membership {
                version,
                workers: workers.to_vec(),
            })
        }

        /// Routes and records, as one VM does; the worker's name and the reason.
        fn go(r: &mut Router, text: &str, rng: &mut SplitMix64) -> (String, Reason) {
            let n = r.config().workers.len();
            let routed = r
                .route(&mut chat(&[text]), &Loads::inflight_only(&vec![0; n]), rng)
                .unwrap();
            if let Some(crate::request::router::Record { op, .. }) = &routed.record {
                r.apply_local(op);
            }
            let d = routed.decision;
            let name = r.config().workers[d.worker as usize].name.clone();
            (name, d.reason)
        }

        fn owners(r: &Router, text: &str) -> Vec<String> {
            let Some(tree) = r.tree(Pool::Regular, "m") else {
                return Vec::new();
            };
            let ws = &r.config().workers;
            tree.prefix_match(text)
                .owners
                .iter()
                .map(|t| ws[*t as usize].name.clone())
                .collect()
        }

        const PROMPT: &str = "a long system prompt that the whole conversation shares";

        #[test]
        fn no_list_yet_is_a_clear_refusal() {
            let mut r = Router::new(discovery());
            let got = r.route(&mut chat(&["hi"]), &Loads::default(), &mut SplitMix64(1));
            assert_eq!(got.unwrap_err(), NoWorker::NoDiscoveredWorker);
            assert_eq!(
                NoWorker::NoDiscoveredWorker.as_str(),
                "no_discovered_worker"
            );
        }

        #[test]
        fn joins_take_traffic_and_leavers_keep_their_tenants_until_removed() {
            let mut r = Router::new(discovery());
            let mut rng = SplitMix64(7);
            r.apply(0, &list(1, &[w("a")]));
            let (home, _) = go(&mut r, PROMPT, &mut rng);
            assert_eq!(home, "a");
            r.apply(1, &list(2, &[w("a"), w("b")]));
            let mut seen = std::collections::BTreeSet::new();
            for i in 0..20 {
                seen.insert(go(&mut r, &format!("{i} fresh opener {i}"), &mut rng).0);
            }
            assert!(seen.contains("b"), "the new worker takes misses: {seen:?}");
            assert_eq!(go(&mut r, PROMPT, &mut rng), ("a".into(), Reason::CacheHit));
            let before = owners(&r, PROMPT);
            assert!(before.contains(&"a".to_string()));

            let mut leaving = w("a");
            leaving.leaving_since_ms = Some(5);
            r.apply(40, &list(3, &[leaving, w("b")]));
            assert_eq!(
                owners(&r, PROMPT),
                before,
                "a leaving worker keeps its tenants"
            );
            let (to, _) = go(&mut r, PROMPT, &mut rng);
            assert_eq!(to, "b", "but takes no new request");

            r.apply(50, &list(4, &[w("b")]));
            assert_eq!(
                owners(&r, PROMPT),
                ["b"],
                "removed: its tenants are dropped"
            );
            assert_eq!(r.config().workers.len(), 1);
            assert_eq!(go(&mut r, PROMPT, &mut rng), ("b".into(), Reason::CacheHit));
        }

        #[test]
        fn a_flapping_worker_keeps_its_affinity() {
            let mut r = Router::new(discovery());
            let mut rng = SplitMix64(3);
            r.apply(0, &list(1, &[w("a"), w("b")]));
            let (home, _) = go(&mut r, PROMPT, &mut rng);
            let other = if home == "a" { "b" } else { "a" };
            let mut gone = w(&home);
            gone.leaving_since_ms = Some(1);
            r.apply(5, &list(2, &[w(other), gone]));
            r.apply(6, &list(3, &[w("a"), w("b")]));
            assert_eq!(go(&mut r, PROMPT, &mut rng), (home, Reason::CacheHit));
        }

        #[test]
        fn old_or_invalid_lists_are_ignored() {
            let mut r = Router::new(discovery());
            r.apply(0, &list(2, &[w("a")]));
            assert!(!r.set_membership(&Membership {
                version: 1,
                workers: vec![w("x")],
            }));
            assert!(!r.set_membership(&Membership {
                version: 2,
                workers: vec![w("x")],
            }));
            assert!(
                !r.set_membership(&Membership {
                    version: 3,
                    workers: vec![w("x"), w("x")],
                }),
                "a list the config's rules refuse"
            );
            assert_eq!(r.config().workers, vec![w("a")]);
            let mut static_router =
                Router::new(Config::from_json(br#"{"workers":[{"name":"s"}]}"#).unwrap());
            assert!(
                !static_router.set_membership(&Membership {
                    version: 1,
                    workers: vec![w("x")],
                }),
                "static workers never change by push"
            );
        }

        #[test]
        fn a_new_plugin_config_keeps_the_discovered_list() {
            let mut r = Router::new(discovery());
            r.apply(0, &list(1, &[w("a"), w("b")]));
            let next = Config::from_json(
                br#"{"policy":"cache_aware","workers_from":"collector","stats_token":"t2","cache_threshold":0.5}"#,
            )
            .unwrap();
            r.reconfigure(next);
            assert_eq!(r.config().workers.len(), 2);
            assert_eq!(
                (r.config().cache_threshold, r.membership_version()),
                (Some(0.5), 1)
            );
            let tight = Config::from_json(
                br#"{"workers_from":"collector","stats_token":"t","max_workers":1}"#,
            )
            .unwrap();
            r.reconfigure(tight);
            assert!(
                r.config().workers.is_empty() && r.membership_version() == 0,
                "a list the new rules refuse waits for the next push"
            );
        }
    }
}
