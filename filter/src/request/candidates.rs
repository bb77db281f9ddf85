//! The candidates of one pool for one request: the routable workers of the pool
//! that serve the model (a discovered worker that is leaving is not), each with its in-flight count and (when fresh) its engine's queue,
//! screened by the overload flags before any policy sees them.
//!
//! The screen drops flagged workers the same way for every pool and policy, unless
//! every serving worker is flagged: then all of them stay candidates and the caller
//! says `all_overloaded`, because refusing would turn slow answers into no answers.
//! Down workers (`crate::worker::health`) go first, the same way (`all_down` when every
//! serving worker is down: a wrong verdict must not refuse a whole fleet); then the
//! down workers whose last connect failed are passed over while another down worker
//! may answer (a refused connect is a fact, the other verdicts may be wrong).
//!
//! A screen depends on the request only through its in-flight counts: the rest
//! (serving set, flags, which samples are fresh) changes with the configuration, the
//! tables and time. `Screens` keeps each (pool, model)'s screen and only refills the
//! counts while nothing else changed: at 256 workers, building the candidates was a
//! quarter of a request's guest instructions.

use std::rc::Rc;

use crate::config::{Config, Pool};
use crate::load::{Candidate, EngineQueue, LoadTable, Loads};
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
    /// The candidates' in-flight requests between them (`predicted_ttft`'s cap is
    /// on their mean: a kept screen sums only the busy workers').
    pub inflight: u64,
    /// Each worker's position among the candidates, by worker index: a sampled
    /// fleet looks up the workers it draws here (while some were screened out,
    /// each was a search of the candidates).
    pub position: Vec<Option<u32>>,
}

impl Screened {
    fn of(
        candidates: Vec<Candidate>,
        flagged: Vec<TenantId>,
        all_flagged: bool,
        all_down: bool,
    ) -> Self {
        let inflight = candidates
            .iter()
            .map(|c| c.inflight)
            .fold(0, u64::saturating_add);
        // Candidates are in worker order: the last has the largest index.
        let mut position = vec![None; candidates.last().map_or(0, |c| c.worker as usize + 1)];
        for (at, c) in (0u32..).zip(&candidates) {
            if let Some(slot) = position.get_mut(c.worker as usize) {
                *slot = Some(at);
            }
        }
        Screened {
            candidates,
            flagged,
            all_flagged,
            all_down,
            inflight,
            position,
        }
    }
}

/// Candidates of `pool` serving `model`, with their in-flight counts and fresh
/// engine samples, screened by the overload flags.
pub fn screen(cfg: &Config, pool: Pool, model: &str, loads: &Loads) -> Screened {
    screen_until(cfg, pool, model, loads).0
}

/// `screen`, and the time its samples' freshness holds until: the first moment a
/// fresh sample goes stale (a stale one stays stale).
fn screen_until(cfg: &Config, pool: Pool, model: &str, loads: &Loads) -> (Screened, u64) {
    let (serving, until_ms) = serving(cfg, pool, model, loads);
    (screen_serving(serving, loads), until_ms)
}

fn screen_serving(serving: Vec<Candidate>, loads: &Loads) -> Screened {
    let marked =
        |marks: &[bool], c: &Candidate| marks.get(c.worker as usize).copied() == Some(true);
    // Nothing down and nothing flagged (the common case): the serving workers are
    // the candidates, without the partitions' copies (a request at 256 workers
    // spent a third of its guest time here).
    let any = |marks: &[bool]| marks.iter().any(|m| *m);
    if !any(&loads.down) && !any(&loads.overloaded) {
        return Screened::of(serving, Vec::new(), false, false);
    }
    let (down, live): (Vec<Candidate>, Vec<Candidate>) =
        serving.into_iter().partition(|c| marked(&loads.down, c));
    let all_down = live.is_empty() && !down.is_empty();
    let live = if all_down {
        let (refused, answering): (Vec<Candidate>, Vec<Candidate>) =
            down.into_iter().partition(|c| marked(&loads.refused, c));
        if answering.is_empty() {
            refused
        } else {
            answering
        }
    } else {
        live
    };
    let (flagged, open): (Vec<Candidate>, Vec<Candidate>) =
        live.into_iter().partition(|c| marked(&loads.overloaded, c));
    let flagged_ids = flagged.iter().map(|c| c.worker).collect();
    if open.is_empty() && !flagged.is_empty() {
        // Refusing would turn slow answers into no answers.
        return Screened::of(flagged, flagged_ids, true, all_down);
    }
    Screened::of(open, flagged_ids, false, all_down)
}

fn serving(cfg: &Config, pool: Pool, model: &str, loads: &Loads) -> (Vec<Candidate>, u64) {
    let mut out = Vec::with_capacity(cfg.workers.len());
    let mut until_ms = u64::MAX;
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
        let fresh = loads.engine.fresh(i, loads.now_ms, cfg.stale_after_ms);
        if let Some(s) = fresh {
            until_ms = until_ms.min(s.at_ms.saturating_add(cfg.stale_after_ms));
        }
        out.push(Candidate {
            worker: i as TenantId,
            inflight: loads.fleet_inflight(i),
            engine: fresh.map(|s| EngineQueue {
                waiting: s.num_waiting,
                running: s.num_running,
            }),
        });
    }
    (out, until_ms)
}

/// How many (pool, model) screens are kept; past it, the oldest kept is replaced.
const KEPT_SCREENS: usize = 16;

/// One (pool, model)'s screen and what it was built from: the tables are held, so
/// their identity (`Rc::ptr_eq`) says whether they changed.
struct Kept {
    pool: Pool,
    model: String,
    /// The router's configuration version (`Router::reconfigure`, membership).
    config: u64,
    engine: Rc<LoadTable>,
    overloaded: Rc<[bool]>,
    down: Rc<[bool]>,
    refused: Rc<[bool]>,
    /// The screen holds from `since_ms` until `until_ms` (exclusive).
    since_ms: u64,
    until_ms: u64,
    screened: Screened,
    /// The positions whose in-flight count may not be 0: every other candidate's
    /// is. A request refills only these and the busy workers' (at 256 workers,
    /// refilling every candidate was 9k Wasm instructions a request).
    counted: Vec<u32>,
    /// The in-flight table the counts are from (`Revision::number`), and whether
    /// peer replicas' counts were among them: a request whose table was updated
    /// from that one touches only the workers it changed (`Revision`).
    revision: u64,
    peers: bool,
}

impl Kept {
    fn holds_for(&self, config: u64, pool: Pool, model: &str, loads: &Loads) -> bool {
        self.config == config
            && self.pool == pool
            && self.model == model
            && Rc::ptr_eq(&self.engine, &loads.engine)
            && Rc::ptr_eq(&self.overloaded, &loads.overloaded)
            && Rc::ptr_eq(&self.down, &loads.down)
            && Rc::ptr_eq(&self.refused, &loads.refused)
            && (self.since_ms..self.until_ms).contains(&loads.now_ms)
    }

    /// Puts this request's in-flight counts on the candidates: only the workers
    /// that changed when the table was updated from the one they are from (and no
    /// peer counts then or now), else all of them (`refill_all`).
    fn refill(&mut self, loads: &Loads) {
        let revision = &loads.revision;
        let peers = !loads.peer_inflight.busy().is_empty();
        // Positions stay listed in `counted` when their count goes back to 0; past
        // one per candidate, a whole refill starts the list again.
        let listed = self.counted.len() <= self.screened.candidates.len();
        if revision.since == Some(self.revision) && !peers && !self.peers && listed {
            self.refill_changed(loads);
        } else {
            self.refill_all(loads);
        }
        self.revision = revision.number;
        self.peers = peers;
    }

    /// `refill` for the workers `loads.revision` changed.
    fn refill_changed(&mut self, loads: &Loads) {
        let candidates = &mut self.screened.candidates;
        let mut total = self.screened.inflight;
        for &worker in &loads.revision.changed {
            let at = self.screened.position.get(worker).copied().flatten();
            let Some(c) = at.and_then(|at| candidates.get_mut(at as usize)) else {
                continue;
            };
            let count = loads.fleet_inflight(worker);
            if c.inflight == 0 && count > 0 {
                self.counted.extend(at);
            }
            total = total.saturating_sub(c.inflight).saturating_add(count);
            c.inflight = count;
        }
        self.screened.inflight = total;
    }

    /// `refill` for every worker: the ones counted before go back to 0, then every
    /// worker with requests in flight here or at a peer gets its count, if it is a
    /// candidate. Only those with a count are listed: a table updated in place
    /// keeps every worker it ever counted in its busy list (`Tally`), and listing
    /// them all filled the list past the candidates at once, so at 256 workers
    /// most requests refilled every worker (about 2k V8 instructions a request).
    fn refill_all(&mut self, loads: &Loads) {
        let candidates = &mut self.screened.candidates;
        for at in self.counted.drain(..) {
            if let Some(c) = candidates.get_mut(at as usize) {
                c.inflight = 0;
            }
        }
        let mut total: u64 = 0;
        for counts in [&loads.inflight, &loads.peer_inflight] {
            for &worker in counts.busy() {
                let at = self.screened.position.get(worker).copied().flatten();
                // A worker busy here and at a peer is counted once.
                let Some(c) = at
                    .and_then(|at| candidates.get_mut(at as usize))
                    .filter(|c| c.inflight == 0)
                else {
                    continue;
                };
                c.inflight = loads.fleet_inflight(worker);
                if c.inflight > 0 {
                    total = total.saturating_add(c.inflight);
                    self.counted.extend(at);
                }
            }
        }
        self.screened.inflight = total;
    }
}

/// This VM's screens, one per (pool, model) recently routed.
#[derive(Default)]
pub struct Screens {
    kept: Vec<Kept>,
    /// The slot the next new screen replaces once `KEPT_SCREENS` are kept.
    next: usize,
}

impl Screens {
    /// `screen(cfg, pool, model, loads)` for configuration version `config`: the
    /// kept screen with this request's in-flight counts when nothing else changed.
    pub fn screen(
        &mut self,
        (cfg, config): (&Config, u64),
        pool: Pool,
        model: &str,
        loads: &Loads,
    ) -> &Screened {
        let found = self
            .kept
            .iter()
            .position(|k| k.holds_for(config, pool, model, loads));
        let at = match found {
            Some(at) => {
                if let Some(k) = self.kept.get_mut(at) {
                    k.refill(loads);
                }
                at
            }
            None => self.keep(cfg, config, pool, model, loads),
        };
        match self.kept.get(at) {
            Some(k) => &k.screened,
            None => &EMPTY,
        }
    }

    /// Builds and keeps a screen: in place of the same (pool, model)'s, else in a
    /// free slot, else in the oldest. Its index.
    fn keep(&mut self, cfg: &Config, config: u64, pool: Pool, model: &str, loads: &Loads) -> usize {
        let (screened, until_ms) = screen_until(cfg, pool, model, loads);
        let counted = (0u32..)
            .zip(&screened.candidates)
            .filter(|(_, c)| c.inflight > 0)
            .map(|(at, _)| at)
            .collect();
        let kept = Kept {
            pool,
            model: model.to_string(),
            config,
            engine: Rc::clone(&loads.engine),
            overloaded: Rc::clone(&loads.overloaded),
            down: Rc::clone(&loads.down),
            refused: Rc::clone(&loads.refused),
            since_ms: loads.now_ms,
            until_ms,
            screened,
            counted,
            revision: loads.revision.number,
            peers: !loads.peer_inflight.busy().is_empty(),
        };
        let same = self
            .kept
            .iter()
            .position(|k| k.pool == pool && k.model == model);
        let at = match same {
            Some(at) => at,
            None if self.kept.len() < KEPT_SCREENS => {
                self.kept.push(kept);
                return self.kept.len() - 1;
            }
            None => {
                let at = self.next % KEPT_SCREENS;
                self.next = at + 1;
                at
            }
        };
        if let Some(slot) = self.kept.get_mut(at) {
            *slot = kept;
        }
        at
    }
}

/// What `Screens::screen` answers if its own slot were missing (it never is).
static EMPTY: Screened = Screened {
    candidates: Vec::new(),
    flagged: Vec::new(),
    all_flagged: false,
    all_down: false,
    inflight: 0,
    position: Vec::new(),
};

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
    use crate::load::{EngineSample, LoadTable, Report, Revision};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn cfg() -> Config {
        Config::from_json(
            br#"{"workers":[{"name":"a","models":["m"]},{"name":"b"},{"name":"c","models":["x"]}],
                "stale_after_ms":100}"#,
        )
        .unwrap()
    }

    fn sample(waiting: u64, at_ms: u64) -> Option<Report> {
        Some(Report::Sample(EngineSample::queue(waiting, 1, at_ms)))
    }

    #[test]
    fn serving_workers_carry_their_loads_and_fresh_samples_only() {
        let loads = Loads {
            inflight: vec![3, 4].into(),
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
                overloaded: flags.into(),
                ..Loads::inflight_only(&[0; 3])
            };
            screen(&cfg(), Pool::Regular, "m", &loads)
        };
        let s = flagged(&[true, false, false]);
        assert_eq!(
            s.candidates.iter().map(|c| c.worker).collect::<Vec<_>>(),
            [1]
        );
        assert_eq!(
            s.position,
            [None, Some(0)],
            "the screened-out worker has no position, the next is first"
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
                down: down.into(),
                overloaded: overloaded.into(),
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
    fn all_down_passes_over_a_refused_connect_while_another_may_answer() {
        let screened = |refused: &[bool]| {
            let loads = Loads {
                down: [true, true, true].as_slice().into(),
                refused: refused.into(),
                ..Loads::inflight_only(&[0; 3])
            };
            let s = screen(&cfg(), Pool::Regular, "m", &loads);
            let ids: Vec<_> = s.candidates.iter().map(|c| c.worker).collect();
            (ids, s.all_down)
        };
        assert_eq!(
            screened(&[true, false]),
            (vec![1], true),
            "a's last connect failed, b's verdict may be wrong"
        );
        assert_eq!(screened(&[false, false]), (vec![0, 1], true));
        assert_eq!(
            screened(&[true, true]),
            (vec![0, 1], true),
            "every one refused: all stay, a wrong verdict must not refuse the fleet"
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

    #[test]
    fn a_kept_screen_is_the_screen_whatever_changes_between_requests() {
        use crate::rng::{Rng, SplitMix64};
        // Each step changes one input at random (the in-flight counts, a table, the
        // time, the configuration, the model asked for); the kept screen must
        // always equal a fresh one.
        let cfgs = [
            cfg(),
            Config::from_json(br#"{"workers":[{"name":"a"},{"name":"b","models":["m"]}]}"#)
                .unwrap(),
        ];
        let mut rng = SplitMix64(7);
        let mut screens = Screens::default();
        let mut version = 0u64;
        let mut loads = Loads {
            engine: LoadTable {
                reports: vec![sample(2, 50), sample(9, 0), sample(1, 120)],
            }
            .into(),
            now_ms: 100,
            ..Loads::inflight_only(&[0; 3])
        };
        let mut kept_for = std::collections::HashSet::new();
        for step in 0..4000 {
            // Each request's in-flight table is the last one updated (naming the
            // workers it changed), unless it is made whole.
            let number = loads.revision.number + 1;
            loads.revision = Revision {
                number,
                since: Some(number - 1),
                ..Revision::default()
            };
            match rng.below(10) {
                0 => {
                    let counts: Vec<u64> = (0..3).map(|_| rng.below(5) as u64).collect();
                    loads.inflight = counts.into();
                    loads.revision.since = None;
                }
                7..=9 => {
                    for _ in 0..rng.below(3) {
                        let (w, n) = (rng.below(3), rng.below(4) as u64);
                        loads.inflight.update(w, |v| *v = n);
                        loads.revision.changed.push(w);
                    }
                }
                6 => {
                    let counts: Vec<u64> = (0..rng.below(4)).map(|_| rng.below(3) as u64).collect();
                    loads.peer_inflight = counts.into();
                }
                1 => loads.now_ms += rng.below(60) as u64,
                2 => {
                    let at = loads.now_ms.saturating_sub(rng.below(150) as u64);
                    let reports = (0..3).map(|_| sample(rng.below(3) as u64, at)).collect();
                    loads.engine = LoadTable { reports }.into();
                }
                3 => loads.overloaded = (0..3).map(|_| rng.below(3) == 0).collect(),
                4 => loads.down = (0..3).map(|_| rng.below(4) == 0).collect(),
                5 => version += 1,
                _ => {}
            }
            let cfg = &cfgs[(version % 2) as usize];
            let pool = [Pool::Regular, Pool::Prefill][rng.below(2)];
            let model = ["m", "x", ""][rng.below(3)];
            let fresh = screen(cfg, pool, model, &loads);
            assert!(
                fresh.candidates.is_sorted_by_key(|c| c.worker),
                "in worker order, as the policies look owners up"
            );
            let kept = screens.screen((cfg, version), pool, model, &loads).clone();
            assert_eq!(kept, fresh, "step {step}: {pool:?} {model:?}");
            kept_for.insert((pool, model));
        }
        assert_eq!(kept_for.len(), 6);
    }

    #[test]
    fn a_whole_refill_lists_only_the_workers_with_requests() {
        // 64 workers, all counted once by a table updated in place (so all stay on
        // its busy list) and all but two back at 0: a whole refill lists the two,
        // and the requests after it, each moving one worker, refill only what they
        // changed until the list outgrows the candidates.
        let workers: Vec<String> = (0..64).map(|i| format!(r#"{{"name":"w{i}"}}"#)).collect();
        let cfg = Config::from_json(format!(r#"{{"workers":[{}]}}"#, workers.join(",")).as_bytes())
            .unwrap();
        let mut loads = Loads::inflight_only(&[0; 64]);
        for w in 0..64 {
            loads.inflight.update(w, |n| *n = 1);
            loads
                .inflight
                .update(w, |n| *n = u64::from(w == 5 || w == 9));
        }
        assert_eq!(loads.inflight.busy().len(), 64);
        let mut screens = Screens::default();
        screens.screen((&cfg, 0), Pool::Regular, "", &loads);
        for number in 1..40u64 {
            // Made whole on the first; then each updated from the one before, in
            // the worker it moves.
            let w = (number % 64) as usize;
            loads.revision = Revision {
                number,
                since: (number > 1).then(|| number - 1),
                changed: vec![w],
                ..Revision::default()
            };
            loads.inflight.update(w, |n| *n = (*n + 1) % 2);
            let kept = screens.screen((&cfg, 0), Pool::Regular, "", &loads).clone();
            assert_eq!(kept, screen(&cfg, Pool::Regular, "", &loads), "{number}");
            let listed = screens.kept.first().map_or(0, |k| k.counted.len());
            assert!(listed <= 2 + number as usize, "{number}: {listed} listed");
        }
    }

    #[test]
    fn screens_are_kept_for_a_bounded_number_of_models() {
        let loads = Loads::inflight_only(&[1, 2, 3]);
        let mut screens = Screens::default();
        let cfg = cfg();
        for round in 0..3 {
            for m in 0..KEPT_SCREENS + 5 {
                let model = format!("model-{m}");
                let kept = screens
                    .screen((&cfg, 0), Pool::Regular, &model, &loads)
                    .clone();
                assert_eq!(
                    kept,
                    screen(&cfg, Pool::Regular, &model, &loads),
                    "{round} {m}"
                );
                assert!(screens.kept.len() <= KEPT_SCREENS);
            }
        }
        // A model asked for again replaces its own screen, it is not kept twice.
        screens.screen((&cfg, 1), Pool::Regular, "model-0", &loads);
        let copies = screens.kept.iter().filter(|k| k.model == "model-0").count();
        assert_eq!(copies, 1);
    }
}
