//! `predicted_ttft` over a large fleet without scoring all of it: the workers a
//! request finds quiet are kept in order between requests, and only the others are
//! scored one by one.
//!
//! A candidate is quiet for a request when nothing about it depends on the request
//! or on the moment: no request of this Envoy or a peer in flight there, no prefill
//! booked, no engine load beyond what this Envoy had there at the sample, none of
//! the request's text held and no conversation continued. Its prediction is then its
//! prefill cost per char times the request's chars (the ladder's formula with every
//! other term 0: the same float), it is under any cap, it is in neither the
//! conversation's rung nor the prefix's, and it matters to the ladder only twice:
//! - as the best prediction, which among the quiet is the least cost per char;
//! - in the fleet rung, where the least loaded are the fewest conversations first,
//!   then the least prediction, which among the quiet is the least cost per char.
//!
//! So the quiet need two orders, by cost and by (conversations, cost), and a request
//! walks each from its start past the workers it found busy. Costs and conversations
//! change a worker or two a request (a first byte learns, a new conversation adds a
//! leaf); a request compares each candidate's with the index's and moves only the
//! changed ones, which is a pass of a few loads a worker where scoring one was a
//! hundred instructions and more. At 256 workers with 64 requests in flight about
//! a third of the fleet is busy or holds a request's prompt; the rest is skipped.

use super::predicted_ttft::{least, near_tie, Scored, WorkerCosts};
use super::Candidate;

/// Candidates the index is worth keeping for: a smaller fleet is scored whole.
pub const QUIET_INDEX_MIN: usize = 32;

/// The quiet order of one screen's candidates (positions in its candidate list).
#[derive(Debug, Clone, Default)]
pub struct QuietIndex {
    /// By position: the prefill cost per char (learned, else the prior; never
    /// negative zero, so its bits order as the numbers do).
    per_char: Vec<f64>,
    /// By position: the worker's conversations (its leaves in the tree).
    conversations: Vec<u64>,
    /// Positions by cost, then position.
    by_cost: Vec<u32>,
    /// Positions by conversations, then cost, then position.
    by_load: Vec<u32>,
    /// By position: the learned costs and leaves the two above were taken from,
    /// as the router's tables hold them (compared whole, a request finds the few
    /// that changed without working out anyone's cost).
    seen_costs: Vec<WorkerCosts>,
    seen_leaves: Vec<usize>,
    /// Every candidate sits at its worker's index (the common case: nothing
    /// screened out), so the tables compare slice to slice.
    in_place: bool,
    /// By position: the request that found the worker not quiet (`stamp`).
    marks: Vec<u32>,
    stamp: u32,
    /// The positions a refresh found changed (kept for its capacity).
    changed: Vec<u32>,
}

fn cost_key(per_char: &[f64], pos: u32) -> (u64, u32) {
    let c = per_char.get(pos as usize).copied().unwrap_or(0.0);
    (c.to_bits(), pos)
}

fn load_key(per_char: &[f64], conversations: &[u64], pos: u32) -> (u64, u64, u32) {
    let n = conversations.get(pos as usize).copied().unwrap_or(0);
    let (c, pos) = cost_key(per_char, pos);
    (n, c, pos)
}

/// Moves `pos` in `order` (sorted by `key`, unique) from where its `old` key sorted
/// it to where its key sorts it now.
fn reorder<K: Ord>(order: &mut Vec<u32>, pos: u32, old: &K, key: impl Fn(u32) -> K) {
    let found = order.binary_search_by(|&p| {
        if p == pos {
            std::cmp::Ordering::Equal
        } else {
            key(p).cmp(old)
        }
    });
    let Some(at) = found.ok().or_else(|| order.iter().position(|&p| p == pos)) else {
        return;
    };
    order.remove(at);
    let new = key(pos);
    let to = order.partition_point(|&p| key(p) < new);
    order.insert(to, pos);
}

impl QuietIndex {
    /// The index for `candidates`, with each one's cost and conversations (see
    /// `refresh`); `None` when some worker's costs are not plain numbers (negative
    /// or not finite), which the quiet formula does not cover.
    pub fn build(
        candidates: &[Candidate],
        costs: &[WorkerCosts],
        leaves: &[usize],
        priors: (f64, f64),
    ) -> Option<QuietIndex> {
        let n = candidates.len();
        let mut index = QuietIndex {
            per_char: Vec::with_capacity(n),
            conversations: Vec::with_capacity(n),
            by_cost: (0..n as u32).collect(),
            by_load: (0..n as u32).collect(),
            seen_costs: Vec::with_capacity(n),
            seen_leaves: Vec::with_capacity(n),
            in_place: (0..).zip(candidates).all(|(i, c)| c.worker == i),
            marks: vec![0; n],
            // A request under way, which marked nothing yet.
            stamp: 1,
            changed: Vec::new(),
        };
        for c in candidates {
            let seen = seen(c, costs, leaves);
            let (per_char, conversations) = inputs(seen, priors)?;
            index.per_char.push(per_char);
            index.conversations.push(conversations);
            index.seen_costs.push(seen.0);
            index.seen_leaves.push(seen.1);
        }
        let (pc, conv) = (&index.per_char, &index.conversations);
        index.by_cost.sort_unstable_by_key(|&p| cost_key(pc, p));
        index
            .by_load
            .sort_unstable_by_key(|&p| load_key(pc, conv, p));
        Some(index)
    }

    /// Takes each candidate's current cost and conversations, moving the changed
    /// ones in the orders, and starts a request: no worker is marked. `false` when
    /// some worker's costs are not plain numbers (the index is then unusable, as
    /// `build` says) or the candidates are not the ones it was built for.
    pub fn refresh(
        &mut self,
        candidates: &[Candidate],
        costs: &[WorkerCosts],
        leaves: &[usize],
        priors: (f64, f64),
    ) -> bool {
        let n = self.per_char.len();
        if candidates.len() != n {
            return false;
        }
        let mut changed = std::mem::take(&mut self.changed);
        changed.clear();
        // Each table slice to slice where the candidates sit at their workers'
        // indices and the table covers them all, else worker by worker.
        let workers = candidates.iter().map(|c| c.worker as usize);
        changes(
            &mut changed,
            (&self.seen_costs, costs),
            self.in_place,
            workers.clone(),
        );
        changes(
            &mut changed,
            (&self.seen_leaves, leaves),
            self.in_place,
            workers,
        );
        let ok = changed.iter().all(|&pos| {
            candidates
                .get(pos as usize)
                .is_some_and(|c| self.take(pos, self::seen(c, costs, leaves), priors))
        });
        self.changed = changed;
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            self.marks.fill(0);
            self.stamp = 1;
        }
        ok
    }

    /// Takes what the tables now say of the candidate at `pos`, moving it in the
    /// orders; `false` if its costs are not plain numbers.
    fn take(&mut self, pos: u32, seen: (WorkerCosts, usize), priors: (f64, f64)) -> bool {
        let Some((per_char, conversations)) = inputs(seen, priors) else {
            return false;
        };
        let at = pos as usize;
        let old_cost = cost_key(&self.per_char, pos);
        let old_load = load_key(&self.per_char, &self.conversations, pos);
        let slots = (
            self.per_char.get_mut(at),
            self.conversations.get_mut(at),
            self.seen_costs.get_mut(at),
            self.seen_leaves.get_mut(at),
        );
        let (Some(p), Some(n), Some(c), Some(l)) = slots else {
            return false;
        };
        (*p, *n, *c, *l) = (per_char, conversations, seen.0, seen.1);
        let (pc, conv) = (&self.per_char, &self.conversations);
        reorder(&mut self.by_cost, pos, &old_cost, |p| cost_key(pc, p));
        reorder(&mut self.by_load, pos, &old_load, |p| load_key(pc, conv, p));
        true
    }

    /// Marks the candidate at `pos` not quiet for this request; whether it was not
    /// marked yet (each is scored once).
    pub fn mark(&mut self, pos: usize) -> bool {
        match self.marks.get_mut(pos) {
            Some(m) if *m != self.stamp => {
                *m = self.stamp;
                true
            }
            _ => false,
        }
    }

    /// Whether the candidate at `pos` was marked for this request.
    pub fn marked(&self, pos: usize) -> bool {
        self.marks.get(pos) == Some(&self.stamp)
    }

    fn quiet(&self, pos: u32) -> bool {
        self.marks.get(pos as usize) != Some(&self.stamp)
    }

    /// The quiet candidate at `pos` scored for `request`: the ladder's formula
    /// with the rest 0.
    fn scored(&self, candidates: &[Candidate], pos: u32, request: &Request) -> Option<Scored> {
        let at = pos as usize;
        let (c, per_char) = (candidates.get(at)?, self.per_char.get(at)?);
        let cached = (request.held)(c.worker);
        Some(Scored {
            worker: c.worker,
            continues: false,
            inflight: 0,
            cached_chars: cached,
            conversations: *self.conversations.get(at)?,
            ahead_chars: 0,
            ttft_us: per_char * request.input.saturating_sub(cached) as f64,
        })
    }

    /// The least the quiet candidate at `pos` can be predicted for `request`.
    fn bound(&self, pos: u32, request: &Request) -> f64 {
        let per_char = self.per_char.get(pos as usize).copied().unwrap_or(0.0);
        per_char * request.input.saturating_sub(request.most) as f64
    }

    /// The least prediction among the quiet for `request`.
    pub fn best(&self, candidates: &[Candidate], request: &Request) -> Option<f64> {
        let mut low: Option<f64> = None;
        for &pos in &self.by_cost {
            // Later ones cost at least as much a char: none can be lower.
            if low.is_some_and(|low| self.bound(pos, request) >= low) {
                break;
            }
            if !self.quiet(pos) {
                continue;
            }
            if let Some(c) = self.scored(candidates, pos, request) {
                low = Some(low.map_or(c.ttft_us, |low| least(low, c.ttft_us)));
            }
        }
        low
    }

    /// The least loaded among the quiet predicted within `bound_us` for `request`,
    /// scored: those of the fewest conversations, near-tied with the least
    /// prediction of them.
    pub fn least_loaded(
        &self,
        candidates: &[Candidate],
        request: &Request,
        bound_us: f64,
    ) -> Vec<Scored> {
        let mut near: Vec<Scored> = Vec::new();
        let mut at = 0;
        while let Some(&first) = self.by_load.get(at) {
            let group = self.conversations.get(first as usize).copied().unwrap_or(0);
            // Where the next group starts (the order is by conversations first).
            let end = at
                + self.by_load.get(at..).map_or(0, |rest| {
                    rest.partition_point(|&p| {
                        self.conversations.get(p as usize).copied().unwrap_or(0) == group
                    })
                });
            // By cost within the group: the predictions' bound only grows.
            for &pos in self.by_load.get(at..end).unwrap_or(&[]) {
                if self.bound(pos, request) > bound_us {
                    break;
                }
                if !self.quiet(pos) {
                    continue;
                }
                near.extend(
                    self.scored(candidates, pos, request)
                        .filter(|c| c.ttft_us <= bound_us),
                );
            }
            if let Some(low) = near.iter().map(|c| c.ttft_us).reduce(least) {
                near.retain(|c| near_tie(c.ttft_us, low));
                return near;
            }
            at = end.max(at + 1);
        }
        near
    }
}

/// A request as the quiet are scored for it.
pub struct Request<'a> {
    /// Its routing text's chars.
    pub input: u64,
    /// The chars of it a quiet worker holds.
    pub held: &'a dyn Fn(crate::tree::TenantId) -> u64,
    /// The most any quiet worker holds (the walks' bound).
    pub most: u64,
}

/// Adds to `changed` the positions where `table` (by worker index; past its end:
/// the default) no longer holds what `seen` (by position) took from it.
fn changes<T: PartialEq + Default + Copy>(
    changed: &mut Vec<u32>,
    (seen, table): (&[T], &[T]),
    in_place: bool,
    workers: impl Iterator<Item = usize>,
) {
    if !in_place {
        for (pos, (w, was)) in (0u32..).zip(workers.zip(seen)) {
            if table.get(w).copied().unwrap_or_default() != *was {
                changed.push(pos);
            }
        }
        return;
    }
    // Slice to slice where the table reaches, then against the default.
    let (covered, past) = seen.split_at(table.len().min(seen.len()));
    for (pos, (now, was)) in (0u32..).zip(table.iter().zip(covered)) {
        if now != was {
            changed.push(pos);
        }
    }
    let default = T::default();
    for (pos, was) in (covered.len() as u32..).zip(past) {
        if *was != default {
            changed.push(pos);
        }
    }
}

/// What the router's tables hold for a candidate: its learned costs and leaves.
fn seen(c: &Candidate, costs: &[WorkerCosts], leaves: &[usize]) -> (WorkerCosts, usize) {
    let i = c.worker as usize;
    let learned = costs.get(i).copied().unwrap_or_default();
    (learned, leaves.get(i).copied().unwrap_or(0))
}

/// A candidate's cost per char and conversations from what the tables hold, if
/// its costs are plain numbers.
fn inputs(
    (learned, leaves): (WorkerCosts, usize),
    (prior_per_char, prior_service_ms): (f64, f64),
) -> Option<(f64, u64)> {
    let per_char = learned.prefill_us_per_char.unwrap_or(prior_per_char);
    let service = learned.service_ms.unwrap_or(prior_service_ms);
    if !(per_char >= 0.0 && per_char.is_finite() && (service * 1000.0).is_finite()) {
        return None;
    }
    // +0.0 for -0.0: the same product's sign aside, and bits that order.
    Some((per_char + 0.0, leaves as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fleet(n: u32) -> Vec<Candidate> {
        (0..n)
            .map(|worker| Candidate {
                worker,
                inflight: 0,
                engine: None,
            })
            .collect()
    }

    fn learned(per_char: f64) -> WorkerCosts {
        WorkerCosts {
            prefill_us_per_char: Some(per_char),
            service_ms: None,
        }
    }

    const PRIORS: (f64, f64) = (5.0, 20.0);

    fn none(_: crate::tree::TenantId) -> u64 {
        0
    }

    /// A request of 100 chars nobody holds any of.
    const COLD: Request = Request {
        input: 100,
        held: &none,
        most: 0,
    };

    #[test]
    fn a_refresh_moves_what_was_learned_and_skips_the_marked() {
        let c = fleet(4);
        let mut costs = vec![
            learned(3.0),
            learned(2.0),
            learned(4.0),
            WorkerCosts::default(),
        ];
        let mut leaves = vec![1, 0, 0, 0];
        let mut q = QuietIndex::build(&c, &costs, &leaves, PRIORS).unwrap();
        assert_eq!(q.best(&c, &COLD), Some(200.0), "w1 at 2 us a char");
        assert!(q.mark(1) && !q.mark(1), "marked once");
        assert_eq!(q.best(&c, &COLD), Some(300.0), "w1 is not quiet: w0 next");
        // w2 learns it is the cheapest; w0's conversation ended.
        costs[2] = learned(1.0);
        leaves[0] = 0;
        assert!(q.refresh(&c, &costs, &leaves, PRIORS));
        assert!(!q.marked(1), "a new request marks nothing");
        assert_eq!(q.best(&c, &COLD), Some(100.0));
        let workers = |rows: Vec<Scored>| rows.iter().map(|s| s.worker).collect::<Vec<_>>();
        assert_eq!(
            workers(q.least_loaded(&c, &COLD, 250.0)),
            [2],
            "the fewest conversations, the least predicted"
        );
        // All within 2% of the least are ties; the rest of the group is not.
        leaves = vec![0, 0, 0, 0];
        let costs = vec![learned(1.0), learned(1.01), learned(1.03), learned(1.0)];
        assert!(q.refresh(&c, &costs, &leaves, PRIORS));
        let mut tied = workers(q.least_loaded(&c, &COLD, 1000.0));
        tied.sort_unstable();
        assert_eq!(tied, [0, 1, 3]);
        assert!(
            q.least_loaded(&c, &COLD, 99.0).is_empty(),
            "none near enough"
        );
        // The fewest conversations first, even when slower.
        leaves = vec![2, 2, 1, 2];
        assert!(q.refresh(&c, &costs, &leaves, PRIORS));
        assert_eq!(workers(q.least_loaded(&c, &COLD, 1000.0)), [2]);
        assert_eq!(
            workers(q.least_loaded(&c, &COLD, 102.0)),
            [0, 3, 1],
            "w2 is past the bound: the next group"
        );
        // A warm fleet: each holds 4000 of 4100 chars.
        let warm = Request {
            input: 4100,
            held: &|_| 4000,
            most: 4000,
        };
        let rows = q.least_loaded(&c, &warm, 1000.0);
        assert_eq!((rows[0].cached_chars, rows[0].ttft_us), (4000, 103.0));
    }

    #[test]
    fn costs_that_are_not_plain_numbers_are_not_indexed() {
        let c = fleet(2);
        let leaves = vec![0, 0];
        for bad in [f64::INFINITY, f64::NAN, -1.0] {
            let costs = vec![learned(1.0), learned(bad)];
            assert!(QuietIndex::build(&c, &costs, &leaves, PRIORS).is_none());
            let mut q = QuietIndex::build(&c, &[], &leaves, PRIORS).unwrap();
            assert!(!q.refresh(&c, &costs, &leaves, PRIORS), "{bad}");
        }
        let service = vec![WorkerCosts {
            prefill_us_per_char: None,
            service_ms: Some(f64::MAX),
        }];
        assert!(QuietIndex::build(&c, &service, &leaves, PRIORS).is_none());
        assert!(
            !QuietIndex::default().refresh(&c, &[], &leaves, PRIORS),
            "another fleet than it was built for"
        );
    }

    #[test]
    fn a_shallow_holder_is_scored_by_what_it_holds() {
        let c = fleet(3);
        let q = QuietIndex::build(&c, &[], &[0, 0, 0], PRIORS).unwrap();
        let held = |t: crate::tree::TenantId| if t == 2 { 4 } else { 0 };
        let request = Request {
            input: 100,
            held: &held,
            most: 4,
        };
        // 5 us a char: 500 for the others, 480 for w2, which holds 4 chars.
        assert_eq!(q.best(&c, &request), Some(480.0));
        let near = q.least_loaded(&c, &request, 1000.0);
        assert_eq!(near.len(), 1, "the others are not near-ties: {near:?}");
        assert_eq!(
            (near[0].worker, near[0].cached_chars, near[0].ttft_us),
            (2, 4, 480.0)
        );
        assert_eq!(q.least_loaded(&c, &request, 490.0).len(), 1);
        assert!(q.least_loaded(&c, &request, 470.0).is_empty());
    }
}
