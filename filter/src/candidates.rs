//! The candidates of one pool for one request: the routable workers of the pool
//! that serve the model (a discovered worker that is leaving is not), each with its in-flight count and (when fresh) its engine's queue,
//! screened by the overload flags before any policy sees them.
//!
//! The screen drops flagged workers the same way for every pool and policy, unless
//! every serving worker is flagged: then all of them stay candidates and the caller
//! says `all_overloaded`, because refusing would turn slow answers into no answers.
//! Down workers (`crate::health`) go first, the same way (`all_down` when every
//! serving worker is down: a wrong verdict must not refuse a whole fleet).

use crate::config::{Config, Pool};
use crate::load::Loads;
use crate::policy::{Candidate, EngineQueue};
use crate::tree::TenantId;

/// The candidates left after the overload screen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screened {
    pub candidates: Vec<Candidate>,
    /// Serving workers the flags removed (or, when all are flagged, all of them).
    pub flagged: Vec<TenantId>,
    pub all_flagged: bool,
    /// Every serving worker was down: they all stayed.
    pub all_down: bool,
}

/// Candidates of `pool` serving `model`, with their in-flight counts and fresh
/// engine samples, screened by the overload flags.
pub fn screen(cfg: &Config, pool: Pool, model: &str, loads: &Loads) -> Screened {
    let marked =
        |marks: &[bool], c: &Candidate| marks.get(c.worker as usize).copied() == Some(true);
    let serving = serving(cfg, pool, model, loads);
    // Nothing down and nothing flagged (the common case): the serving workers are
    // the candidates, without the partitions' copies (a request at 256 workers
    // spent a third of its guest time here).
    let any = |marks: &[bool]| marks.iter().any(|m| *m);
    if !any(&loads.down) && !any(&loads.overloaded) {
        return Screened {
            candidates: serving,
            flagged: Vec::new(),
            all_flagged: false,
            all_down: false,
        };
    }
    let (down, live): (Vec<Candidate>, Vec<Candidate>) =
        serving.into_iter().partition(|c| marked(&loads.down, c));
    let all_down = live.is_empty() && !down.is_empty();
    let live = if all_down { down } else { live };
    let (flagged, open): (Vec<Candidate>, Vec<Candidate>) =
        live.into_iter().partition(|c| marked(&loads.overloaded, c));
    let flagged_ids = flagged.iter().map(|c| c.worker).collect();
    if open.is_empty() && !flagged.is_empty() {
        // Refusing would turn slow answers into no answers.
        return Screened {
            candidates: flagged,
            flagged: flagged_ids,
            all_flagged: true,
            all_down,
        };
    }
    Screened {
        candidates: open,
        flagged: flagged_ids,
        all_flagged: false,
        all_down,
    }
}

fn serving(cfg: &Config, pool: Pool, model: &str, loads: &Loads) -> Vec<Candidate> {
    let mut out = Vec::with_capacity(cfg.workers.len());
    // A body that names no model (or cannot be read) is never dropped: any worker
    // of the pool takes it, as the engine's default model. A leaving worker keeps
    // its tenants but takes nothing new.
    let serves = |w: &crate::config::WorkerConfig| {
        w.pool == pool && (model.is_empty() || w.serves(model)) && w.routable()
    };
    for (i, w) in cfg.workers.iter().enumerate() {
        if !serves(w) {
            continue;
        }
        out.push(Candidate {
            worker: i as TenantId,
            inflight: loads.fleet_inflight(i),
            engine: loads
                .engine
                .fresh(i, loads.now_ms, cfg.stale_after_ms)
                .map(|s| EngineQueue {
                    waiting: s.num_waiting,
                    running: s.num_running,
                }),
        });
    }
    out
}

/// The queue gate is configured but no candidate has a fresh engine sample, so it
/// cannot act: the collector is not feeding the filter.
pub fn gate_inert(candidates: &[Candidate], worker_queue_limit: Option<u64>) -> bool {
    worker_queue_limit.is_some()
        && !candidates.is_empty()
        && candidates.iter().all(|c| c.engine.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{EngineSample, LoadTable, Report};

    fn cfg() -> Config {
        Config::from_json(
            br#"{"workers":[{"name":"a","models":["m"]},{"name":"b"},{"name":"c","models":["x"]}],
                "stale_after_ms":100}"#,
        )
        .unwrap()
    }

    fn sample(waiting: u64, at_ms: u64) -> Option<Report> {
        Some(Report::Sample(EngineSample {
            num_waiting: waiting,
            num_running: 1,
            kv_usage: None,
            ttft_p90_s: None,
            tpot_p90_s: None,
            at_ms,
        }))
    }

    #[test]
    fn serving_workers_carry_their_loads_and_fresh_samples_only() {
        let loads = Loads {
            inflight: vec![3, 4],
            engine: LoadTable {
                reports: vec![sample(2, 50), sample(9, 0)],
            }
            .into(),
            now_ms: 100,
            ..Loads::default()
        };
        let s = screen(&cfg(), Pool::Regular, "m", &loads);
        assert_eq!(
            s.candidates,
            vec![
                Candidate {
                    worker: 0,
                    inflight: 3,
                    engine: Some(EngineQueue {
                        waiting: 2,
                        running: 1
                    })
                },
                Candidate {
                    worker: 1,
                    inflight: 4,
                    engine: None
                },
            ],
            "c does not serve m; b's sample is stale"
        );
        let any = screen(&cfg(), Pool::Regular, "", &loads);
        assert_eq!(
            any.candidates.len(),
            3,
            "no model: every worker of the pool"
        );
        assert!(screen(&cfg(), Pool::Prefill, "m", &loads)
            .candidates
            .is_empty());
    }

    #[test]
    fn flagged_workers_are_screened_unless_all_are() {
        let flagged = |flags: &[bool]| {
            let loads = Loads {
                overloaded: flags.to_vec(),
                ..Loads::inflight_only(&[0; 3])
            };
            screen(&cfg(), Pool::Regular, "m", &loads)
        };
        let s = flagged(&[true, false, false]);
        assert_eq!(
            s.candidates.iter().map(|c| c.worker).collect::<Vec<_>>(),
            [1]
        );
        assert_eq!((s.flagged, s.all_flagged), (vec![0], false));
        let s = flagged(&[true, true, false]);
        assert_eq!(
            s.candidates.len(),
            2,
            "all serving workers flagged: all stay"
        );
        assert_eq!((s.flagged, s.all_flagged), (vec![0, 1], true));
    }

    #[test]
    fn down_workers_are_screened_first_unless_all_are() {
        let screened = |down: &[bool], overloaded: &[bool]| {
            let loads = Loads {
                down: down.to_vec(),
                overloaded: overloaded.to_vec(),
                ..Loads::inflight_only(&[0; 3])
            };
            screen(&cfg(), Pool::Regular, "m", &loads)
        };
        let ids = |s: &Screened| s.candidates.iter().map(|c| c.worker).collect::<Vec<_>>();
        let s = screened(&[true, false, false], &[]);
        assert_eq!(
            (ids(&s), s.all_down, s.all_flagged),
            (vec![1], false, false)
        );
        let s = screened(&[true, false, false], &[false, true]);
        assert_eq!(
            (ids(&s), s.all_down, s.all_flagged),
            (vec![1], false, true),
            "the one live worker is flagged: it stays, and a down one does not come back"
        );
        let s = screened(&[true, true, false], &[]);
        assert_eq!(
            (ids(&s), s.all_down),
            (vec![0, 1], true),
            "every serving worker down: all stay (c does not serve m)"
        );
        let s = screened(&[true, true], &[true, false]);
        assert_eq!(
            (ids(&s), s.all_down, s.all_flagged),
            (vec![1], true, false),
            "all down, then the flags screen as usual"
        );
    }

    #[test]
    fn the_gate_is_inert_only_when_set_and_blind() {
        let blind = [Candidate {
            worker: 0,
            inflight: 0,
            engine: None,
        }];
        assert!(gate_inert(&blind, Some(4)));
        assert!(!gate_inert(&blind, None));
        assert!(!gate_inert(&[], Some(4)));
        let seen = [Candidate {
            engine: Some(EngineQueue {
                waiting: 0,
                running: 0,
            }),
            ..blind[0]
        }];
        assert!(!gate_inert(&seen, Some(4)));
    }
}
