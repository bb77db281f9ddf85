//! `predicted_ttft`'s decision for one routing text: its walk of the model's tree
//! (each worker's share of the text and conversations), the candidates a sampled
//! fleet scores (`super::draw`), each one's predicted time to first token and the
//! ladder's pick.

use super::draw;
use super::ladder::{match_margin, Ladder};
use super::predict::{others_load, Scored, SlotLimit, Slots, TtftCandidate};
use super::room::{avoidable_eviction, mean_capacity, weighed_conversations};
use super::{Recall, TtftParams};
use crate::decision::{Decision, Label};
use crate::load::{Candidate, Loads};
use crate::policy::{Engines, KvRoom};
use crate::rng::Rng;
use crate::tree::{Leaves, TenantId, TenantMatches, Tree, Walked, NO_LEAVES};

/// What a decision fills and the next one refills, kept by the router so that
/// no request allocates them: at 256 workers each is a kilobyte.
#[derive(Debug, Default)]
pub struct Scratch {
    matches: TenantMatches,
    scored: Vec<Scored>,
    /// The sample's tally of a short holder list (`super::sample`).
    holders: Vec<u64>,
    /// Each engine's running slots as learned from its samples, by worker index.
    slots: Vec<Slots>,
    /// The chars of the text each engine's cache holds, by worker index, where
    /// the engines' answer (`kv_match`) covers every candidate.
    engine_chars: Vec<u64>,
}

/// What the engines' caches hold of the text where their answer covers every
/// candidate (`kv_match`), as each candidate is priced.
#[derive(Clone, Copy)]
struct Stored<'a> {
    /// Chars of the text by worker index.
    chars: &'a [u64],
    /// The most any candidate holds.
    longest: u64,
}

/// A decision, and what its record needs.
pub struct TtftRouted {
    pub decision: Option<Decision>,
    /// Chars of the text the chosen worker held.
    pub held_chars: usize,
    /// The text's chars.
    pub input_chars: usize,
    /// Where the walk ended, for the insert the decision records (none without a
    /// tree).
    pub walked: Option<Walked>,
    /// A miss whose text a worker the overload screen took out held more of than
    /// the chosen one: a hit the flag turned into a miss.
    pub owner_filtered: bool,
}

/// Decides for `text` among `candidates` (the pool's, holding `inflight` requests
/// in all, at `position` by worker index) by `tree`, the model's if it has one
/// yet, the engines' caches where the trees are bounded by them (`kv`), and what
/// the engines hold of the text where their answer covers every candidate
/// (`engines`, `kv_match`), filling `scratch`.
///
/// The engines' answer replaces the tree's match in each candidate's prediction:
/// the tree records where text was sent, the engines what they still hold. A tree
/// that forgot a conversation its engine kept sent it to an engine that prefilled
/// it again, and taught the engine that kept it a prefill cost per char too low
/// (its first byte came at the cached speed, over chars the tree called uncached:
/// about half the true cost on the sweep's member 7).
/// The tree still says which worker a conversation continues on, and a sampled
/// fleet is drawn by it.
pub fn route(
    (tree, text): (Option<&Tree>, &str),
    (candidates, flagged, position, inflight): (&[Candidate], &[TenantId], &[Option<u32>], u64),
    (loads, params, kv, engines): (&Loads, &TtftParams, Option<KvRoom>, Option<Engines>),
    scratch: &mut Scratch,
    rng: &mut dyn Rng,
) -> TtftRouted {
    let held = &mut scratch.matches;
    match tree {
        Some(t) => t.tenant_matches_into(text, held),
        None => held.clear(),
    }
    let held = &*held;
    let input_chars = match tree {
        Some(_) => held.text_chars,
        None => crate::tree::char_len(text),
    };
    let input = input_chars as u64;
    let leaves = tree.map_or(&NO_LEAVES, |t| t.leaves());
    // A fleet larger than the sample size scores a sample (`super::sample`);
    // otherwise every candidate, in one loop.
    let sample = draw::sample(
        (tree, held, leaves),
        (candidates, position),
        (params.sample_size, input),
        (&mut scratch.holders, rng),
    );
    let at = Recall {
        now_ms: loads.now_ms,
        memory_ms: params.cost_memory_ms,
    };
    let fleet = params.with_fleet_priors(
        candidates
            .iter()
            .filter_map(|c| loads.costs.get(c.worker as usize).map(|k| at.fresh(*k))),
    );
    let params = &fleet;
    // The pool's engines are alike: the least any was seen full at.
    let mut pool_full = None::<u64>;
    for c in candidates {
        let i = c.worker as usize;
        if scratch.slots.len() <= i {
            scratch.slots.resize(i + 1, Default::default());
        }
        if let Some(s) = scratch.slots.get_mut(i) {
            if let Some(q) = c.engine {
                s.observe(q.waiting, q.running);
            }
            if let Some(full) = s.full() {
                pool_full = Some(pool_full.map_or(full, |p| p.min(full)));
            }
        }
    }
    let stored = engines.map(|e| {
        let longest = stored_chars(
            e,
            (candidates, loads),
            (held, leaves, input_chars),
            &mut scratch.engine_chars,
        );
        Stored {
            chars: scratch.engine_chars.as_slice(),
            longest,
        }
    });
    let slots = PoolSlots {
        by_worker: &scratch.slots,
        pool_full,
    };
    let list = std::mem::take(&mut scratch.scored);
    let mut ladder = Ladder::new(params, input, (inflight, candidates.len()), list);
    let seen = (loads, held, leaves, stored);
    let room = kv.map(|kv| {
        let mean = mean_capacity(candidates.iter().map(|c| c.worker), kv.capacities);
        (kv, mean)
    });
    match &sample {
        None => {
            for c in candidates {
                ladder.push(scored_candidate(c, seen, (slots, room), ((params, at), input)));
            }
        }
        Some(drawn) => drawn.for_each(|i| {
            if let Some(c) = candidates.get(i) {
                ladder.push(scored_candidate(c, seen, (slots, room), ((params, at), input)));
            }
        }),
    }
    let decision = ladder.decide(rng);
    scratch.scored = ladder.into_list();
    // What the winner was priced as holding: the engines' word or the tree's.
    let held_chars = decision.as_ref().map_or(0, |d| d.matched_chars);
    let missed = decision
        .as_ref()
        .is_some_and(|d| d.label() == Label::CacheMiss);
    TtftRouted {
        decision,
        held_chars,
        input_chars,
        walked: tree.map(|_| held.walked),
        owner_filtered: missed && held_more(held, leaves, flagged, (held_chars, input)),
    }
}

/// The running slots each engine's samples showed, by worker index, and the least
/// any engine of the pool was seen full at.
#[derive(Clone, Copy)]
struct PoolSlots<'a> {
    by_worker: &'a [Slots],
    pool_full: Option<u64>,
}

impl PoolSlots<'_> {
    /// What a request's wait knows of worker `i`'s slots (`Slots::limit`).
    fn limit(&self, i: usize) -> SlotLimit {
        self.by_worker
            .get(i)
            .map_or(SlotLimit::UNSAMPLED, |s| s.limit(self.pool_full))
    }
}

/// What each candidate's engine holds of the text (`input_chars`), by the engines'
/// answer, into `out` by worker index; the most any holds. An engine stores what
/// it computed: while a worker has a prefill in flight and its tree (`held`,
/// `leaves`) holds more of the text than its engine has stored, the tree's count
/// stands, as the next request finds that prefill done there.
fn stored_chars(
    engines: Engines,
    (candidates, loads): (&[Candidate], &Loads),
    (held, leaves, input_chars): (&TenantMatches, &Leaves, usize),
    out: &mut Vec<u64>,
) -> u64 {
    out.clear();
    let mut longest = 0;
    for c in candidates {
        let i = c.worker as usize;
        if out.len() <= i {
            out.resize(i + 1, 0);
        }
        let stored = engines
            .answer
            .chars_of(engines.held_by(c.worker).unwrap_or(0), input_chars) as u64;
        let sent = held.depth(c.worker, leaves.get(c.worker)) as u64;
        let chars = if sent > stored && loads.work.get(i).prefilling > 0 {
            sent
        } else {
            stored
        };
        if let Some(slot) = out.get_mut(i) {
            *slot = chars;
        }
        longest = longest.max(chars);
    }
    longest
}

/// Whether one of `flagged` holds more of a text of `input` chars than the
/// `chosen_chars` the chosen worker holds, by more than the margin within which
/// matches count as equal.
fn held_more(
    held: &TenantMatches,
    leaves: &Leaves,
    flagged: &[TenantId],
    (chosen_chars, input): (usize, u64),
) -> bool {
    let margin = match_margin(input) as usize;
    flagged.iter().any(|&f| {
        let depth = held.depth(f, leaves.get(f));
        depth > margin && depth > chosen_chars.saturating_add(margin)
    })
}

/// Candidate `c` as the ladder compares it, from the loads, its share of the text
/// (the engines' word where they gave it, `stored`), its conversations (leaves by
/// worker), its costs as recalled `at` now and, where
/// the trees are bounded by the engines' caches, its engine's room (`kv` and the
/// candidates' mean capacity): its conversations weighed by it
/// (`weighed_conversations`), and what its placement would evict
/// (`avoidable_eviction`). Inlined into each loop that scores: as a closure
/// shared by two loops it was compiled to a call per worker, about 10k Envoy
/// instructions a request at 256 workers.
#[inline(always)]
fn scored_candidate(
    c: &Candidate,
    (loads, held, leaves, stored): (&Loads, &TenantMatches, &Leaves, Option<Stored>),
    (slots, room): (PoolSlots, Option<(KvRoom, Option<f64>)>),
    ((params, at), input): ((&TtftParams, Recall), u64),
) -> Scored {
    let i = c.worker as usize;
    let conversations = leaves.get(c.worker) as u64;
    let mut t = ttft_candidate(loads, c, (held, conversations), at);
    if let Some(stored) = stored {
        t.cached_chars = stored.chars.get(i).copied().unwrap_or(0);
    }
    t.slots = slots.limit(i);
    if let Some((kv, mean)) = room {
        let capacity = kv.capacities.get(i).copied().unwrap_or(0);
        t.conversations = weighed_conversations(conversations, capacity, mean);
        let bound = kv.bound_chars.get(i).copied().unwrap_or(0);
        if bound > 0 {
            let longest = stored.map_or(held.longest() as u64, |stored| stored.longest);
            t.evicts_chars = avoidable_eviction(
                (kv.held_chars)(c.worker),
                bound,
                input.saturating_sub(t.cached_chars),
                longest.saturating_sub(t.cached_chars),
            );
        }
    }
    t.scored(params, input)
}

/// What `predicted_ttft` knows of one candidate: the router's own work there,
/// the engine's load beyond this Envoy's (the screen's fresh sample, if any),
/// its share of the request's prefix (`held`), its conversations and its costs
/// as recalled `at` now (`Recall::fresh`).
#[inline]
fn ttft_candidate(
    loads: &Loads,
    c: &Candidate,
    (held, conversations): (&TenantMatches, u64),
    at: Recall,
) -> TtftCandidate {
    let i = c.worker as usize;
    let others = c.engine.map_or(0, |q| {
        // Peer replicas' requests are already in the candidate's (fleet)
        // in-flight count, so they are not "others" too: without this, a fleet
        // of replicas counted each other's load twice until the next sample.
        let own = loads.own_at_sample.get(i).copied().unwrap_or(0);
        let peers = loads.peer_inflight.get(i);
        others_load(
            q.waiting.saturating_add(q.running),
            own.saturating_add(peers),
        )
    });
    TtftCandidate {
        worker: c.worker,
        inflight: c.inflight,
        work: loads.work.get(i),
        others,
        cached_chars: held.depth(c.worker, conversations as usize) as u64,
        continues: held.continues(c.worker),
        conversations,
        costs: loads.costs.get(i).map(|k| at.fresh(*k)).unwrap_or_default(),
        slots: SlotLimit::UNSAMPLED,
        evicts_chars: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::super::predict::testing::P;
    use super::*;
    use crate::load::{EngineQueue, EngineSample, LoadTable, Report, WorkerCosts, WorkerWork};
    use crate::decision::Reason;
    use crate::rng::SplitMix64;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A tree that sent a 2000-char document with a first question to w0, and a
    /// second question about it (100 chars).
    fn document_on_w0() -> (Tree, String) {
        let doc = "d".repeat(2000);
        let mut tree = Tree::new();
        tree.insert(&format!("{doc}first question"), 0, 1);
        (tree, format!("{doc}{}", "q".repeat(100)))
    }

    #[test]
    fn ttft_others_exclude_what_this_envoy_and_its_peers_have_in_flight() {
        let sample = |waiting_running: u64| {
            Some(Report::Sample(EngineSample::queue(
                waiting_running,
                0,
                1000,
            )))
        };
        let loads = Loads {
            peer_inflight: vec![3, 0].into(),
            own_at_sample: vec![2, 2].into(),
            engine: LoadTable {
                reports: vec![sample(10), sample(1)],
            }
            .into(),
            now_ms: 1000,
            ..Loads::inflight_only(&[2, 2])
        };
        // As the screen gives them: with the fresh sample's queue.
        let c = |worker: crate::tree::TenantId| Candidate {
            worker,
            inflight: loads.fleet_inflight(worker as usize),
            engine: loads.engine.fresh(worker as usize, 1000, 5000).map(|s| {
                crate::load::EngineQueue {
                    waiting: s.num_waiting,
                    running: s.num_running,
                }
            }),
        };
        let held = TenantMatches::default();
        let at = Recall {
            now_ms: 1000,
            memory_ms: 5000,
        };
        let w0 = ttft_candidate(&loads, &c(0), (&held, 3), at);
        assert_eq!(
            (w0.worker, w0.inflight, w0.others, w0.conversations),
            (0, 5, 5, 3),
            "10 on the engine: 2 ours, 3 peers'"
        );
        let w1 = ttft_candidate(&loads, &c(1), (&held, 0), at);
        assert_eq!(w1.others, 0, "never negative");
        let unsampled = Candidate {
            engine: None,
            ..c(0)
        };
        assert_eq!(
            ttft_candidate(&loads, &unsampled, (&held, 0), at).others,
            0,
            "no fresh sample: the router's own count stands"
        );
    }

    #[test]
    fn a_copy_into_a_full_cache_is_charged_where_the_trees_are_bounded() {
        // w0 holds a 2000-char document, behind 3000 chars of prefill; w1 holds
        // 2000 chars of other texts and is idle. A question about the document
        // is sooner on w1 (5 * 2100 us against 5 * 3100), unless w1's cache,
        // bounded at 2500 chars, must evict 1600 of them to copy the document.
        let (mut tree, question) = document_on_w0();
        tree.insert(&"o".repeat(2000), 1, 2);
        let loads = Loads {
            work: vec![
                WorkerWork {
                    prefilling: 1,
                    ahead_chars: 3000,
                },
                WorkerWork::default(),
            ]
            .into(),
            ..Loads::inflight_only(&[1, 0])
        };
        let candidates = [0, 1].map(|worker| Candidate {
            worker,
            inflight: loads.fleet_inflight(worker as usize),
            engine: None,
        });
        let held_chars = |w: TenantId| tree.tenant_chars(w) as u64;
        let decide = |bound_chars: &[u64]| {
            let kv = KvRoom {
                capacities: &[1000, 1000],
                bound_chars,
                held_chars: &held_chars,
            };
            let r = route(
                (Some(&tree), &question),
                (&candidates, &[], &[Some(0), Some(1)], 1),
                (&loads, &P, Some(kv), None),
                &mut Scratch::default(),
                &mut SplitMix64(1),
            );
            r.decision.map(|d| d.worker)
        };
        assert_eq!(decide(&[100_000, 100_000]), Some(1), "room: the sooner");
        assert_eq!(decide(&[100_000, 2500]), Some(0), "w1 full: the holder");
        assert_eq!(decide(&[100_000, 0]), Some(1), "w1's bound not known");
    }

    #[test]
    fn the_engines_word_prices_each_candidate_but_what_is_still_being_prefilled() {
        // The tree sent a 2000-char document to w0; the engines' answer says
        // neither engine holds a block of the question about it (100 chars a block).
        let (tree, question) = document_on_w0();
        let answer = crate::kv_match::EngineHeld {
            tokens: 21,
            block_tokens: 1,
            engines: vec![("w0".into(), Some(0)), ("w1".into(), Some(0))],
        };
        let decide = |work: WorkerWork, held: [Option<u32>; 2]| {
            let loads = Loads {
                work: vec![work, WorkerWork::default()].into(),
                ..Loads::inflight_only(&[work.prefilling, 0])
            };
            let candidates = [0, 1].map(|worker| Candidate {
                worker,
                inflight: loads.fleet_inflight(worker as usize),
                engine: None,
            });
            let engines = Engines {
                answer: &answer,
                held: &held,
            };
            let r = route(
                (Some(&tree), &question),
                (&candidates, &[], &[Some(0), Some(1)], work.prefilling),
                (&loads, &P, None, Some(engines)),
                &mut Scratch::default(),
                &mut SplitMix64(1),
            );
            r.decision.map(|d| (d.worker, d.reason, d.matched_chars))
        };
        // Nothing in flight on w0: the engine evicted what the tree recorded.
        let idle = WorkerWork::default();
        assert_eq!(
            decide(idle, [Some(0), Some(0)]).map(|(_, reason, held)| (reason, held)),
            Some((Reason::TtftCold, 0))
        );
        // w0 is still prefilling what it was sent (500 chars to go): the engine
        // has not stored it yet, and the request would find it there.
        let prefilling = WorkerWork {
            prefilling: 1,
            ahead_chars: 500,
        };
        assert_eq!(
            decide(prefilling, [Some(0), Some(0)]),
            Some((0, Reason::TtftCache, 2000))
        );
        // The engines hold more than the tree knows of: their word.
        assert_eq!(
            decide(idle, [Some(0), Some(21)]),
            Some((1, Reason::TtftCache, 2100))
        );
    }

    #[test]
    fn a_decode_is_waited_for_only_on_an_engine_the_pool_was_seen_full_at() {
        // w0 holds a 2000-char document and runs the two requests it was sent,
        // both still prefilling (200 chars to go); its samples never showed a
        // request waiting. w1 and w2 are idle. The next question about the
        // document finds w0's slots all taken as far as it was seen running.
        let (tree, question) = document_on_w0();
        let loads = Loads {
            work: vec![
                WorkerWork {
                    prefilling: 2,
                    ahead_chars: 200,
                },
                WorkerWork::default(),
                WorkerWork::default(),
            ]
            .into(),
            own_at_sample: vec![2, 0, 0].into(),
            ..Loads::inflight_only(&[2, 0, 0])
        };
        let decide = |w2_waiting: u64| {
            let queues = [(0, 2), (0, 0), (w2_waiting, 2)];
            let candidates = [0, 1, 2].map(|worker| Candidate {
                worker,
                inflight: loads.fleet_inflight(worker as usize),
                engine: queues
                    .get(worker as usize)
                    .map(|&(waiting, running)| EngineQueue { waiting, running }),
            });
            let r = route(
                (Some(&tree), &question),
                (&candidates, &[], &[Some(0), Some(1), Some(2)], 2),
                (&loads, &P, None, None),
                &mut Scratch::default(),
                &mut SplitMix64(1),
            );
            r.decision.map(|d| (d.worker, d.reason))
        };
        // Nobody was seen full: w0 is not known to hold the request back for the
        // decodes of the two ahead, only for their prefill. It keeps the document.
        assert_eq!(decide(0), Some((0, Reason::TtftCache)));
        // w2, an engine of the same pool, showed a request waiting behind the two
        // it ran: w0 is taken to be full at two too, and each request ahead will
        // hold its slot for a service after its first byte. An idle engine is
        // sooner.
        assert_eq!(decide(1), Some((1, Reason::TtftSpread)));
    }

    #[test]
    fn ttft_costs_are_the_ones_learned_within_the_memory() {
        let learned = |observed_ms| WorkerCosts {
            prefill_us_per_char: Some(50.0),
            service_ms: Some(30.0),
            observed_ms,
        };
        let loads = Loads {
            costs: vec![learned(4000), learned(3999)].into(),
            now_ms: 9000,
            ..Loads::inflight_only(&[0, 0])
        };
        let c = |worker| Candidate {
            worker,
            inflight: 0,
            engine: None,
        };
        let held = TenantMatches::default();
        let at = Recall {
            now_ms: loads.now_ms,
            memory_ms: 5000,
        };
        let costs = |w| ttft_candidate(&loads, &c(w), (&held, 0), at).costs;
        assert_eq!(costs(0), learned(4000), "5 s ago: remembered");
        assert_eq!(costs(1), WorkerCosts::default(), "longer ago: forgotten");
    }
}
