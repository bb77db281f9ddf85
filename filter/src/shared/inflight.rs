//! The in-flight table: requests in flight per worker for the whole Envoy, so the
//! imbalance rule sees every thread's load, and of them those still prefilling with
//! their uncached chars (`predicted_ttft`'s work ahead: booked at the decision, the
//! prefill part released at the first response byte). Each VM owns the counts it
//! took (`super::owned`: a VM Envoy reloaded stops counting after the expiry);
//! counts are keyed by name, so a count taken before a config update is released on
//! the same worker after it. Also the plain (worker name -> count) encoding that
//! peer reports and the counts at sample time use.
//!
//! The table rides in the operation ring's head value (`super::ring::Rider`): a
//! sync (`super::outbox`: once per window) reads the head to catch up and writes it
//! to claim its batch, so decisions read the table from the catch-up's read and the
//! bookings since the last sync are published by the claim, one read and one write
//! fewer than a key of its own. A sync that records nothing (`round_robin`, bodies
//! without text) publishes by a head write of its own (`flush`); so do a VM's last
//! release and its tick. Between syncs a VM sees its own counts as they are and the
//! others' as of its last read.
//!
//! The prefill work rides with the requests rather than in a key of its own: a
//! key of its own was read and rewritten at every decision, two shared-data calls
//! (one copying the table into the VM) that cost `predicted_ttft` more than its
//! whole policy at 4 workers. Another thread now sees a booking up to one sync
//! window late, as it sees the request's in-flight count.

use std::cell::Ref;

use super::owned::{Counts, OwnedCounts};
use super::ring::OpRing;
use super::{put_bytes, Reader, SharedStore};
use crate::config::WorkerNames;
use crate::load::{Loads, Revision, Tally, WorkerCounts, WorkerWork};

/// Columns of a row's entry: requests in flight, of them those prefilling, and
/// their uncached prefill chars.
const COLUMNS: usize = 3;

/// In-flight requests (and their prefill) per worker for the whole Envoy, and this
/// VM's own.
#[derive(Debug)]
pub struct InflightTable(OwnedCounts<COLUMNS>);

/// The table by worker index, as one request reads it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByWorker {
    pub inflight: WorkerCounts,
    /// Empty unless asked for (`predicted_ttft`).
    pub work: Tally<WorkerWork>,
    pub revision: Revision,
}

impl ByWorker {
    /// A request's tables back from its loads, for the next request's to be
    /// written into (`InflightTable::by_worker`).
    pub fn reclaim(loads: Loads) -> ByWorker {
        ByWorker {
            inflight: loads.inflight,
            work: loads.work,
            revision: loads.revision,
        }
    }
}

pub(super) fn encode_counts(counts: &[(String, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(counts.len() as u32).to_le_bytes());
    for (name, n) in counts {
        put_bytes(&mut out, name.as_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

pub(super) fn decode_counts(bytes: &[u8]) -> Vec<(String, u64)> {
    let mut r = Reader(bytes);
    let Some(n) = r.u32() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let (Some(name), Some(count)) = (r.string(), r.u64()) else {
            break;
        };
        out.push((name, count));
    }
    out
}

/// The requests in flight of `counts` (workers with none are left out).
fn requests(counts: Counts<COLUMNS>) -> Vec<(String, u64)> {
    counts
        .into_iter()
        .filter(|(_, [n, ..])| *n > 0)
        .map(|(name, [n, ..])| (name, n))
        .collect()
}

fn to_delta(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl InflightTable {
    /// The table as VM `vm` writes it, its rows living `expiry_ms` past their last
    /// write (`super::owner_expiry_ms`).
    pub fn new(vm: u64, expiry_ms: u64) -> InflightTable {
        InflightTable(OwnedCounts::new(vm, expiry_ms))
    }

    pub fn set_expiry(&mut self, expiry_ms: u64) {
        self.0.set_expiry(expiry_ms);
    }

    fn sum(&self, tail: Ref<'_, [u8]>, now_ms: u64) -> Counts<COLUMNS> {
        self.0.sum(&tail, now_ms)
    }

    /// Every VM's requests in flight summed (workers without any are absent), read
    /// now.
    pub fn read(&self, store: &dyn SharedStore, ring: &OpRing, now_ms: u64) -> Vec<(String, u64)> {
        requests(self.sum(ring.read_tail(store), now_ms))
    }

    /// The table by worker index, for `names` (never counted: 0), as `ring`'s last
    /// read of its head found it: no hostcall. The prefill work only if `work`.
    /// Written into `spare`'s memory (an earlier request's tables, or empty ones):
    /// when `spare` is this VM's last table, for the same list and columns, and
    /// the other VMs' rows are as they were then, only the workers whose counts
    /// this VM changed since are touched (`Revision`); else it is made whole.
    pub fn by_worker(
        &self,
        ring: &OpRing,
        names: &WorkerNames,
        (now_ms, work): (u64, bool),
        spare: ByWorker,
    ) -> ByWorker {
        let table = ring.tail();
        let ByWorker {
            mut inflight,
            work: mut ahead,
            revision: mut rev,
        } = spare;
        let mut changed = std::mem::take(&mut rev.changed);
        changed.clear();
        let kept = rev.names == names.id()
            && rev.work == work
            && self.0.others_are(&table, now_ms, &rev.others);
        let (number, complete) = self.0.read_changes(rev.number, names, |c| {
            if !kept {
                return;
            }
            let [n0, p0, c0] = c.before;
            let [n1, p1, c1] = c.after;
            inflight.update(c.index, |n| *n = n.saturating_sub(n0).saturating_add(n1));
            ahead.update(c.index, |w| {
                w.prefilling = w.prefilling.saturating_sub(p0).saturating_add(p1);
                w.ahead_chars = w.ahead_chars.saturating_sub(c0).saturating_add(c1);
            });
            changed.push(c.index);
        });
        let since = (kept && complete).then_some(rev.number);
        if since.is_none() {
            changed.clear();
            inflight = inflight.cleared(names.len());
            ahead = ahead.cleared(if work { names.len() } else { 0 });
            self.0
                .each_by_worker(&table, now_ms, names, |i, &[n, prefilling, chars]| {
                    inflight.add(i, n);
                    ahead.update(i, |w| {
                        w.prefilling = w.prefilling.saturating_add(prefilling);
                        w.ahead_chars = w.ahead_chars.saturating_add(chars);
                    });
                });
            self.0.others_bytes(&table, now_ms, &mut rev.others);
        }
        ByWorker {
            inflight,
            work: ahead,
            revision: Revision {
                number,
                since,
                changed,
                names: names.id(),
                work,
                others: rev.others,
            },
        }
    }

    /// The requests this VM holds.
    pub fn mine(&self) -> Vec<(String, u64)> {
        requests(self.0.mine())
    }

    /// Whether this VM holds no request.
    pub fn holds_nothing(&self) -> bool {
        self.0.holds_nothing()
    }

    /// Takes a count on `worker`, to be published by this VM's next write of the
    /// ring's head: its claim (`rider`), else `flush`.
    pub fn take(&self, worker: &str) {
        self.0.change(worker, [1, 0, 0]);
    }

    /// Gives a count on `worker` back (never below zero). Whether it must be
    /// published at once (`flush`): it was this VM's last (see `super::owned`);
    /// else it rides on this VM's next write of the head.
    pub fn release(&self, worker: &str) -> bool {
        self.0.change(worker, [-1, 0, 0])
    }

    /// Books one request's prefill of `chars` uncached chars on `worker`, published
    /// like `take`.
    pub fn book_prefill(&self, worker: &str, chars: u64) {
        self.0.change(worker, [0, 1, to_delta(chars)]);
    }

    /// Gives a booked prefill back (never below zero), published like `release`.
    pub fn release_prefill(&self, worker: &str, chars: u64) -> bool {
        self.0.change(worker, [0, -1, -to_delta(chars)])
    }

    /// This VM's unpublished counts, to ride on a claim at `now_ms`.
    pub fn rider(&self, now_ms: u64) -> impl super::ring::Rider + '_ {
        self.0.riding(now_ms, false)
    }

    /// Publishes this VM's counts if a change still waits. Whether they are
    /// published now.
    pub fn flush(&self, store: &dyn SharedStore, ring: &OpRing, now_ms: u64) -> bool {
        !self.0.unpublished() || ring.ride(store, &self.0.riding(now_ms, false))
    }

    /// The tick's heartbeat (`OwnedCounts::due`). Whether it wrote.
    pub fn refresh(&self, store: &dyn SharedStore, ring: &OpRing, now_ms: u64) -> bool {
        self.0.due(now_ms) && ring.ride(store, &self.0.riding(now_ms, true))
    }
}

#[cfg(test)]
mod tests {
    use super::super::batch::Batch;
    use super::super::ops::insert_op;
    use super::super::testing::{owned, ring, Counting, MemStore};
    use super::super::{stamp_after_write, Keys, SetOutcome};
    use super::*;
    use crate::config::testing::{named_workers, names};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn inflight_counts_add_and_saturate() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        let t = InflightTable::new(1, 5000);
        assert!(t.read(&store, &ring, 0).is_empty());
        t.take("w0");
        t.take("w0");
        t.take("w1");
        assert!(t.flush(&store, &ring, 0));
        let other = InflightTable::new(2, 5000);
        let all = vec![("w0".to_string(), 2), ("w1".to_string(), 1)];
        assert_eq!(other.read(&store, &ring, 0), all);
        assert!(!t.release("w1"), "a release rides on the next write");
        assert!(!t.release("w1"), "never below zero");
        assert_eq!(t.read(&store, &ring, 0), vec![("w0".to_string(), 2)]);
        assert_eq!(t.mine(), t.read(&store, &ring, 0));
        assert_eq!(other.read(&store, &ring, 0), all, "not yet published");
        assert!(!t.release("w0"));
        assert!(t.release("w0"), "the last release is published at once");
        assert!(t.flush(&store, &ring, 0));
        assert!(other.read(&store, &ring, 0).is_empty());
    }

    #[test]
    fn a_booking_rides_on_the_claim_after_the_catch_up_and_reads_nothing() {
        let store = Counting::default();
        let ring = ring(&store, 4);
        let (t, other) = (InflightTable::new(1, 5000), InflightTable::new(2, 5000));
        other.take("w1");
        assert!(other.flush(&store, &ring, 0));
        let mut cursor = 0;
        ring.catch_up(&store, &mut cursor, 0, |_, _| {});
        store.gets.set(0);
        assert_eq!(
            t.by_worker(&ring, &names(), (0, false), Default::default())
                .inflight,
            vec![0, 1].into(),
            "the decision reads the catch-up's copy"
        );
        t.take("w0");
        let mut op = Batch::default();
        op.push(&insert_op("text", "w0"));
        assert_eq!(ring.append_riding(&store, &op, &t.rider(0)), Ok(0));
        assert!(t.flush(&store, &ring, 0), "nothing left to publish");
        assert_eq!(store.gets.get(), 0, "no read between catch-up and claim");
        assert_eq!(
            other.read(&store, &ring, 0),
            vec![("w0".to_string(), 1), ("w1".to_string(), 1)]
        );
        assert_eq!(ring.head(&store), Some(1), "and the claim was made");
    }

    #[test]
    fn every_write_of_the_head_keeps_what_it_does_not_own() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        let ring = ring(&store, 4);
        let t = InflightTable::new(1, 5000);
        t.take("w0");
        assert!(t.flush(&store, &ring, 0));
        let counted = vec![("w0".to_string(), 1)];
        // A claim that carries nothing and a generation stamp.
        let op = insert_op("text", "w1").encode();
        assert_eq!(OpRing::new(&keys, 4).append_one(&store, &op), Ok(0));
        stamp_after_write(&store, &keys, &keys.samples(), SetOutcome::Stored);
        let other = InflightTable::new(2, 5000);
        assert_eq!(other.read(&store, &ring, 0), counted);
        assert_eq!((ring.head(&store), ring.generation()), (Some(1), Some(1)));
        // A publication keeps the sequence and the generation.
        other.take("w1");
        assert!(other.flush(&store, &ring, 0));
        assert_eq!((ring.head(&store), ring.generation()), (Some(1), Some(1)));
        let mut cursor = 0;
        let mut seen = Vec::new();
        ring.catch_up(&store, &mut cursor, 0, |_, op| seen.push(owned(op)));
        assert_eq!(seen, vec![insert_op("text", "w1")]);
    }

    #[test]
    fn first_writes_racing_on_two_vms_both_count() {
        let store = MemStore::default();
        let ring_a = ring(&store, 4);
        let ring_b = OpRing::new(&Keys::new("t"), 4);
        let (a, b) = (InflightTable::new(1, 5000), InflightTable::new(2, 5000));
        // Both read the head, then B's booking lands before A's claim.
        let mut cursor = 0;
        ring_a.catch_up(&store, &mut cursor, 0, |_, _| {});
        b.take("w0");
        assert!(b.flush(&store, &ring_b, 0));
        a.take("w0");
        let mut op = Batch::default();
        op.push(&insert_op("text", "w0"));
        assert_eq!(ring_a.append_riding(&store, &op, &a.rider(0)), Ok(0));
        let reader = InflightTable::new(3, 5000);
        assert_eq!(
            reader.read(&store, &ring_a, 0),
            vec![("w0".to_string(), 2)],
            "the stale claim failed its CAS and retried over B's row"
        );
    }

    #[test]
    fn a_failed_publication_waits_for_the_tick() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        let t = InflightTable::new(1, 5000);
        t.take("w0");
        let detached = OpRing::new(&Keys::new("elsewhere"), 4);
        assert!(!t.flush(&store, &detached, 0), "no head to ride on");
        assert!(t.refresh(&store, &ring, 1), "the tick publishes it");
        assert!(!t.refresh(&store, &ring, 2), "then only when due");
        assert!(t.refresh(&store, &ring, 5000 / 3 + 1), "a heartbeat");
        assert_eq!(
            InflightTable::new(2, 5000).read(&store, &ring, 5000 + 2),
            vec![("w0".to_string(), 1)],
            "still fresh past the first write's expiry"
        );
    }

    #[test]
    fn tables_written_into_an_earlier_requests_read_as_new_ones() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        let t = InflightTable::new(1, 5000);
        let three = WorkerNames::new(&named_workers(3));
        let read = |spare: ByWorker| t.by_worker(&ring, &three, (0, true), spare);
        t.take("w0");
        t.book_prefill("w0", 300);
        t.take("w1");
        let earlier = read(ByWorker::default());
        assert_eq!(
            (earlier.inflight.get(0), earlier.work.get(0).ahead_chars),
            (1, 300)
        );
        t.release_prefill("w0", 300);
        t.release("w0");
        t.take("w2");
        let mut other = earlier.clone();
        other.revision = Revision::default();
        let reused = read(other);
        assert_eq!(
            reused.revision.since, None,
            "not this VM's last table: whole"
        );
        assert_eq!(
            (&reused.inflight, &reused.work),
            (&vec![0, 1, 1].into(), &Tally::zeroed(3)),
            "nothing of the earlier request's left"
        );
        assert_eq!(reused.inflight.busy(), &[1, 2]);
        assert!(reused.work.busy().is_empty());
        let two = WorkerNames::new(&named_workers(2));
        let fewer = t.by_worker(&ring, &two, (0, false), reused);
        assert_eq!(
            fewer.inflight,
            vec![0, 1].into(),
            "a shorter list, no prefill asked"
        );
        assert_eq!(fewer.work, Tally::default());
    }

    #[test]
    fn a_table_kept_from_the_last_read_follows_every_change() {
        use crate::rng::{Rng, SplitMix64};
        // This VM and another take and give back counts at random, each publishing
        // now and then; this VM reads the head now and then; time passes the rows'
        // expiry; the worker list and the columns asked for change. Each read into
        // the last read's tables must equal a sum made whole, and name every worker
        // whose counts moved since that read.
        let store = MemStore::default();
        let (ring_t, ring_o) = (ring(&store, 4), ring(&store, 4));
        let (t, other) = (InflightTable::new(1, 5000), InflightTable::new(2, 5000));
        let lists = [
            WorkerNames::new(&named_workers(6)),
            WorkerNames::new(&named_workers(4)),
        ];
        let mut rng = SplitMix64(11);
        let (mut now, mut list, mut work) = (0u64, 0usize, true);
        let mut last = ByWorker::default();
        let mut updated = 0;
        for step in 0..6000 {
            // w6 is in neither list.
            let worker = format!("w{}", rng.below(7));
            let chars = rng.below(500) as u64;
            match rng.below(20) {
                0..=5 => t.take(&worker),
                6..=9 => {
                    t.release(&worker);
                }
                10 => t.book_prefill(&worker, chars),
                11 => {
                    t.release_prefill(&worker, chars);
                }
                12 => {
                    t.flush(&store, &ring_t, now);
                }
                13 => {
                    if rng.below(2) == 0 {
                        other.take(&worker);
                    } else {
                        other.release(&worker);
                    }
                    other.flush(&store, &ring_o, now);
                }
                14 => {
                    ring_t.head(&store);
                }
                15 => now += rng.below(2000) as u64,
                16 if rng.below(10) == 0 => list = 1 - list,
                17 if rng.below(10) == 0 => work = !work,
                _ => {}
            }
            let names = &lists[list];
            let before = std::mem::take(&mut last);
            let (was_n, was_w) = (before.inflight.clone(), before.work.clone());
            let read = t.by_worker(&ring_t, names, (now, work), before);
            let mut want_n = vec![0u64; names.len()];
            let mut want_w = vec![WorkerWork::default(); if work { names.len() } else { 0 }];
            t.0.each_by_worker(&ring_t.tail(), now, names, |i, &[n, p, c]| {
                want_n[i] += n;
                if let Some(w) = want_w.get_mut(i) {
                    w.prefilling += p;
                    w.ahead_chars += c;
                }
            });
            assert_eq!(read.inflight, want_n.clone().into(), "step {step}");
            assert_eq!(read.work, want_w.clone().into(), "step {step}");
            for (i, n) in want_n.iter().enumerate() {
                assert!(*n == 0 || read.inflight.busy().contains(&i), "step {step}");
            }
            let mut busy = read.inflight.busy().to_vec();
            busy.sort_unstable();
            busy.dedup();
            assert_eq!(busy.len(), read.inflight.busy().len(), "each once");
            if read.revision.since.is_some() {
                updated += 1;
                for (i, n) in want_n.iter().enumerate() {
                    let moved =
                        was_n.get(i) != *n || want_w.get(i).is_some_and(|w| was_w.get(i) != *w);
                    assert!(
                        !moved || read.revision.changed.contains(&i),
                        "step {step}: worker {i} moved unnamed"
                    );
                }
            }
            last = read;
        }
        assert!(updated > 3000, "most reads update the last: {updated}");
    }

    #[test]
    fn prefill_is_booked_released_and_never_negative() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        let t = InflightTable::new(1, 5000);
        let work = |t: &InflightTable| {
            t.by_worker(&ring, &names(), (0, true), Default::default())
                .work
                .get(0)
        };
        t.take("w0");
        t.book_prefill("w0", 4000);
        t.take("w0");
        t.book_prefill("w0", 100);
        assert_eq!(
            work(&t),
            WorkerWork {
                prefilling: 2,
                ahead_chars: 4100
            },
            "this VM sees its bookings at once"
        );
        assert!(t.flush(&store, &ring, 0));
        let other = InflightTable::new(2, 5000);
        ring.head(&store);
        assert_eq!(work(&other).ahead_chars, 4100, "published with the counts");
        assert!(!t.release_prefill("w0", 4000), "a first byte rides");
        assert_eq!(
            work(&t),
            WorkerWork {
                prefilling: 1,
                ahead_chars: 100
            }
        );
        assert!(!t.release_prefill("w0", 100));
        assert!(!t.release_prefill("w0", 100), "a double release saturates");
        assert_eq!(work(&t), WorkerWork::default());
        assert_eq!(t.mine(), vec![("w0".to_string(), 2)], "still in flight");
        assert_eq!(
            t.by_worker(&ring, &names(), (0, false), Default::default())
                .work,
            Tally::default(),
            "the work only when asked"
        );
        assert!(!t.release("w0"));
        assert!(t.release("w0"), "the last release is published at once");
        assert!(t.holds_nothing());
    }

    #[test]
    fn a_booking_that_outlives_its_request_keeps_the_vm_counted_until_released() {
        let t = InflightTable::new(1, 5000);
        t.take("w0");
        t.book_prefill("w0", 10);
        assert!(!t.release("w0"), "the prefill is still held");
        assert!(t.mine().is_empty(), "no request in flight");
        assert!(!t.holds_nothing());
        assert!(t.release_prefill("w0", 10), "the last release is published");
        assert!(t.holds_nothing());
    }

    #[test]
    fn plain_counts_round_trip() {
        let counts = vec![("a".to_string(), 3), ("日".to_string(), 0)];
        assert_eq!(decode_counts(&encode_counts(&counts)), counts);
        assert!(decode_counts(&[1, 0]).is_empty());
    }
}
