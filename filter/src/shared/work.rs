//! `predicted_ttft`'s shared tables, each one key changed with CAS retries (its
//! work ahead rides with the in-flight counts: `super::inflight`):
//!
//! - `CostTable`: (worker name -> three numbers): per worker, the learned prefill
//!   cost per char (us) and service time (ms), moving averages each VM learns in
//!   its own copy and shares on its tick, and when they were last learned;
//! - the in-flight counts as they were when the collector's last sample arrived
//!   (`own_at_sample`), so engine load beyond them reads as other routers' load.

use std::cell::RefCell;
use std::rc::Rc;

use super::inflight::{decode_counts, encode_counts};
use super::{
    put_bytes, InflightTable, Keys, OpRing, Reader, SetOutcome, SharedStore, CAS_ATTEMPTS,
};
use crate::config::WorkerNames;
use crate::load::WorkerCosts;

/// Stored form of "unknown" for a learned cost.
const UNKNOWN: u64 = u64::MAX;

fn encode(rows: &[(String, [u64; 3])]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for (name, values) in rows {
        put_bytes(&mut out, name.as_bytes());
        for v in values {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

fn decode(bytes: &[u8]) -> Vec<(String, [u64; 3])> {
    let mut r = Reader(bytes);
    let Some(n) = r.u32() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for _ in 0..n {
        let (Some(name), Some(a), Some(b), Some(c)) = (r.string(), r.u64(), r.u64(), r.u64())
        else {
            break;
        };
        out.push((name, [a, b, c]));
    }
    out
}

/// One key of (worker name -> three numbers).
#[derive(Debug, Clone)]
struct PairTable {
    key: String,
}

impl PairTable {
    fn read(&self, store: &dyn SharedStore) -> Vec<(String, [u64; 3])> {
        store
            .get(&self.key)
            .map(|(v, _)| decode(&v))
            .unwrap_or_default()
    }

    /// Replaces the rows of `mine` (rows equal to `empty` are dropped), keeping the
    /// others, with CAS retries. Each of `mine` comes with where its row was when
    /// this VM last read the table, where it mostly still is. The rows as stored,
    /// or `None` if they could not be.
    fn merge(
        &self,
        store: &dyn SharedStore,
        mine: &[(usize, (String, [u64; 3]))],
        empty: [u64; 3],
    ) -> Option<CostRows> {
        for _ in 0..CAS_ATTEMPTS {
            let (mut rows, cas) = match store.get(&self.key) {
                Some((v, cas)) => (decode(&v), cas),
                None => (Vec::new(), 0),
            };
            // A row not where it was is found by name through an index, built
            // the first time one is missed: a search of the rows for each learned
            // row was quadratic in the fleet (at 256 workers, tens of thousands of
            // name comparisons a tick), and indexing every row on every tick was
            // a hash of each of the fleet's names.
            let mut at: Option<hashbrown::HashMap<&str, usize>> = None;
            let mut added: Vec<(String, [u64; 3])> = Vec::new();
            let mut changed: Vec<(usize, [u64; 3])> = Vec::with_capacity(mine.len());
            for (was, (worker, value)) in mine {
                if rows.get(*was).is_some_and(|(name, _)| name == worker) {
                    changed.push((*was, *value));
                    continue;
                }
                let at = at.get_or_insert_with(|| {
                    rows.iter()
                        .enumerate()
                        .map(|(i, (n, _))| (n.as_str(), i))
                        .collect()
                });
                match at.get(worker.as_str()) {
                    Some(&i) => changed.push((i, *value)),
                    None => {
                        at.insert(worker.as_str(), rows.len() + added.len());
                        added.push((worker.clone(), *value));
                    }
                }
            }
            drop(at);
            rows.extend(added);
            for (i, value) in changed {
                if let Some((_, v)) = rows.get_mut(i) {
                    *v = value;
                }
            }
            rows.retain(|(_, v)| *v != empty);
            match store.set(&self.key, &encode(&rows), cas) {
                SetOutcome::Stored => return Some(rows),
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return None,
            }
        }
        None
    }
}

/// Learned costs by worker name: prefill us per char and service ms, as bits, and
/// when they were last learned (ms).
type CostRows = Vec<(String, [u64; 3])>;

/// Learned costs per worker for the whole Envoy. Each VM learns in its own copy of
/// the table and shares what it learned on its tick (`publish`), which also takes in
/// what the other VMs shared: learning through shared data rewrote the whole table
/// (every worker's row, decoded and encoded under CAS) at every first byte and stream
/// end, and every decision decoded it again; at 256 workers that was most of
/// `predicted_ttft`'s cost per request. Another VM's learning arrives within a tick;
/// the costs are moving averages, which a tick's delay does not change much.
#[derive(Debug, Clone)]
pub struct CostTable {
    table: PairTable,
    /// This VM's copy (`None`: not read yet).
    local: RefCell<Option<Local>>,
    /// No costs, for the policies that read none: an `Rc` made per request would be
    /// an allocation per request.
    none: Rc<Vec<WorkerCosts>>,
}

/// The shared table as of this VM's last tick, with what it learned since.
#[derive(Debug, Clone, Default)]
struct Local {
    rows: CostRows,
    /// Rows this VM changed since its last publication, by row.
    learned: Vec<bool>,
    /// The rows spread over the router's worker list, kept while the list is the
    /// same: spreading them for each request looked up every learned worker's name,
    /// 256 of them in a large fleet.
    spread: Option<Spread>,
}

/// `Local::rows` by worker index, for one worker list.
#[derive(Debug, Clone)]
struct Spread {
    names: u64,
    /// Each worker's row.
    row_of: Vec<Option<usize>>,
    /// Each worker's costs, shared with the requests that read them.
    costs: Rc<Vec<WorkerCosts>>,
}

impl Spread {
    /// Takes the costs of `rows`, whose names are those this spread was made from,
    /// row for row (a tick's new table mostly is: only values change).
    fn refresh(&mut self, rows: &CostRows) {
        for (i, row) in self.row_of.iter().enumerate() {
            let Some(&(_, values)) = row.and_then(|r| rows.get(r)) else {
                continue;
            };
            let learned = costs_of(values);
            if self.costs.get(i).is_some_and(|c| *c != learned) {
                if let Some(slot) = Rc::make_mut(&mut self.costs).get_mut(i) {
                    *slot = learned;
                }
            }
        }
    }

    /// `rows` by worker index for `names` (the last row of a name wins).
    fn of(rows: &CostRows, names: &WorkerNames) -> Spread {
        let mut row_of = vec![None; names.len()];
        let mut costs = vec![WorkerCosts::default(); names.len()];
        for (row, (name, values)) in rows.iter().enumerate() {
            if let Some(i) = names.get(name) {
                if let (Some(r), Some(c)) = (row_of.get_mut(i), costs.get_mut(i)) {
                    (*r, *c) = (Some(row), costs_of(*values));
                }
            }
        }
        Spread {
            names: names.id(),
            row_of,
            costs: Rc::new(costs),
        }
    }
}

fn to_bits(v: Option<f64>) -> u64 {
    v.filter(|x| x.is_finite()).map_or(UNKNOWN, f64::to_bits)
}

fn from_bits(b: u64) -> Option<f64> {
    (b != UNKNOWN)
        .then(|| f64::from_bits(b))
        .filter(|x| x.is_finite())
}

fn costs_of([p, s, observed_ms]: [u64; 3]) -> WorkerCosts {
    WorkerCosts {
        prefill_us_per_char: from_bits(p),
        service_ms: from_bits(s),
        observed_ms,
    }
}

const NOTHING_LEARNED: [u64; 3] = [UNKNOWN, UNKNOWN, 0];

impl Local {
    fn of(rows: CostRows) -> Local {
        Local {
            learned: vec![false; rows.len()],
            rows,
            spread: None,
        }
    }

    /// The rows by worker index for `names`.
    fn spread(&mut self, names: &WorkerNames) -> &mut Spread {
        if self.spread.as_ref().is_some_and(|s| s.names != names.id()) {
            self.spread = None;
        }
        self.spread
            .get_or_insert_with(|| Spread::of(&self.rows, names))
    }

    /// The row of `worker` (at `index` in `names`, if it is in the list), added if
    /// it has none.
    fn row(&mut self, names: &WorkerNames, (worker, index): (&str, Option<usize>)) -> usize {
        let known = index.and_then(|i| self.spread(names).row_of.get(i).copied().flatten());
        if let Some(row) = known.or_else(|| self.rows.iter().position(|(n, _)| n == worker)) {
            return row;
        }
        self.rows.push((worker.to_string(), NOTHING_LEARNED));
        self.learned.push(false);
        let row = self.rows.len() - 1;
        if let Some(slot) = index.and_then(|i| self.spread(names).row_of.get_mut(i)) {
            *slot = Some(row);
        }
        row
    }
}

impl CostTable {
    pub fn new(keys: &Keys) -> CostTable {
        CostTable {
            table: PairTable { key: keys.costs() },
            local: RefCell::new(None),
            none: Rc::default(),
        }
    }

    /// No costs, shared (`none`).
    pub fn none(&self) -> Rc<Vec<WorkerCosts>> {
        Rc::clone(&self.none)
    }

    /// This VM's copy, read from shared data the first time.
    fn local<T>(&self, store: &dyn SharedStore, f: impl FnOnce(&mut Local) -> T) -> T {
        let mut local = self.local.borrow_mut();
        f(local.get_or_insert_with(|| Local::of(self.table.read(store))))
    }

    /// The learned costs by worker index, for `names`.
    pub fn by_worker(&self, store: &dyn SharedStore, names: &WorkerNames) -> Rc<Vec<WorkerCosts>> {
        self.local(store, |c| Rc::clone(&c.spread(names).costs))
    }

    /// Applies a learning step to `worker`'s costs in this VM's copy; the tick shares
    /// it (`publish`).
    pub fn learn(
        &self,
        store: &dyn SharedStore,
        names: &WorkerNames,
        worker: &str,
        step: impl Fn(WorkerCosts) -> WorkerCosts,
    ) {
        let index = names.get(worker);
        self.local(store, |c| {
            let row = c.row(names, (worker, index));
            let Some((_, values)) = c.rows.get_mut(row) else {
                return;
            };
            let next = step(costs_of(*values));
            *values = [
                to_bits(next.prefill_us_per_char),
                to_bits(next.service_ms),
                next.observed_ms,
            ];
            let learned = costs_of(*values);
            if let Some(flag) = c.learned.get_mut(row) {
                *flag = true;
            }
            let costs = &mut c.spread(names).costs;
            if let Some(slot) = index.and_then(|i| Rc::make_mut(costs).get_mut(i)) {
                *slot = learned;
            }
        });
    }

    /// The tick: writes the rows this VM learned into the shared table (under CAS,
    /// keeping every other row as the other VMs left it) and takes the shared table
    /// as its copy. Whether the shared table was read (and, with something learned,
    /// written); what could not be written is kept for the next tick.
    pub fn publish(&self, store: &dyn SharedStore) -> bool {
        let mine: Vec<(usize, (String, [u64; 3]))> = self.local(store, |c| {
            c.rows
                .iter()
                .zip(&c.learned)
                .enumerate()
                .filter(|(_, (_, learned))| **learned)
                .map(|(at, (row, _))| (at, row.clone()))
                .collect()
        });
        let rows = if mine.is_empty() {
            self.table.read(store)
        } else {
            let Some(rows) = self.table.merge(store, &mine, NOTHING_LEARNED) else {
                return false;
            };
            rows
        };
        // The rows by worker index are kept while the table names the same
        // workers in the same order: spread again, every tick looked up each of
        // the fleet's names.
        let mut local = self.local.borrow_mut();
        let kept = local.take().and_then(|old| {
            let same = old.rows.len() == rows.len()
                && old.rows.iter().zip(&rows).all(|((a, _), (b, _))| a == b);
            old.spread.filter(|_| same)
        });
        let mut next = Local::of(rows);
        if let Some(mut spread) = kept {
            spread.refresh(&next.rows);
            next.spread = Some(spread);
        }
        *local = Some(next);
        true
    }
}

/// The in-flight counts as of the collector's last sample.
#[derive(Debug, Clone)]
pub struct OwnAtSample {
    key: String,
}

impl OwnAtSample {
    pub fn new(keys: &Keys) -> OwnAtSample {
        OwnAtSample {
            key: keys.own_at_sample(),
        }
    }

    /// Copies the in-flight counts as they are now (called when a push is stored).
    pub fn snapshot(
        &self,
        store: &dyn SharedStore,
        (inflight, ring): (&InflightTable, &OpRing),
        now_ms: u64,
    ) -> bool {
        let counts = encode_counts(&inflight.read(store, ring, now_ms));
        store.set(&self.key, &counts, 0) == SetOutcome::Stored
    }

    pub fn by_worker(&self, store: &dyn SharedStore, names: &WorkerNames) -> Vec<u64> {
        let counts = store
            .get(&self.key)
            .map(|(v, _)| decode_counts(&v))
            .unwrap_or_default();
        names.spread(&counts, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    use crate::config::testing::names;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A learning step that sets the service time.
    fn service(ms: Option<f64>) -> impl Fn(WorkerCosts) -> WorkerCosts {
        move |c| WorkerCosts {
            service_ms: ms,
            ..c
        }
    }

    #[test]
    fn no_costs_are_one_empty_table_shared_by_every_request() {
        let t = CostTable::new(&Keys::new("t"));
        let (a, b) = (t.none(), t.none());
        assert!(a.is_empty());
        assert!(
            Rc::ptr_eq(&a, &b),
            "the same table, not one made per request"
        );
    }

    #[test]
    fn costs_are_learned_in_the_vms_copy_and_unknown_until_then() {
        let store = MemStore::default();
        let t = CostTable::new(&Keys::new("t"));
        let ws = names();
        assert_eq!(*t.by_worker(&store, &ws), vec![WorkerCosts::default(); 2]);
        t.learn(&store, &ws, "w1", |c| WorkerCosts {
            prefill_us_per_char: crate::policy::predicted_ttft::learn_prefill(
                c.prefill_us_per_char,
                8000.0,
                1000,
            ),
            ..c
        });
        assert_eq!(
            t.by_worker(&store, &ws)[1],
            WorkerCosts {
                prefill_us_per_char: Some(8.0),
                ..WorkerCosts::default()
            }
        );
        t.learn(&store, &ws, "w1", |c| WorkerCosts {
            service_ms: Some(f64::NAN),
            ..c
        });
        assert_eq!(
            t.by_worker(&store, &ws)[1].service_ms,
            None,
            "a non-number is stored as unknown"
        );
        assert_eq!(
            store.get(&Keys::new("t").costs()),
            None,
            "nothing shared before the tick"
        );
    }

    #[test]
    fn each_vm_shares_what_it_learned_on_its_tick_and_takes_in_the_others() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        let (a, b) = (CostTable::new(&keys), CostTable::new(&keys));
        let ws = names();
        a.learn(&store, &ws, "w0", service(Some(10.0)));
        b.learn(&store, &ws, "w1", service(Some(20.0)));
        assert_eq!(
            b.by_worker(&store, &ws)[0].service_ms,
            None,
            "not shared yet"
        );
        assert!(a.publish(&store));
        assert!(b.publish(&store), "b's write keeps a's row (CAS merge)");
        assert!(a.publish(&store), "nothing learned: a takes in the table");
        for t in [&a, &b] {
            let costs = t.by_worker(&store, &ws);
            assert_eq!(
                (costs[0].service_ms, costs[1].service_ms),
                (Some(10.0), Some(20.0))
            );
        }
        // A new VM starts from what is shared.
        let c = CostTable::new(&keys);
        assert_eq!(c.by_worker(&store, &ws)[1].service_ms, Some(20.0));
        // Learning again replaces a shared row in place, the others kept.
        b.learn(&store, &ws, "w1", service(Some(30.0)));
        a.learn(&store, &ws, "w0", service(Some(15.0)));
        assert!(b.publish(&store));
        assert!(a.publish(&store));
        let d = CostTable::new(&keys);
        let costs = d.by_worker(&store, &ws);
        assert_eq!(
            (costs[0].service_ms, costs[1].service_ms),
            (Some(15.0), Some(30.0))
        );
    }

    #[test]
    fn the_copy_by_worker_index_is_kept_per_worker_list_and_learning_updates_it() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        let t = CostTable::new(&keys);
        let ws = names();
        let first = t.by_worker(&store, &ws);
        t.learn(&store, &ws, "w1", service(Some(7.0)));
        let after = t.by_worker(&store, &ws);
        assert_eq!(after[1].service_ms, Some(7.0), "learned in place");
        assert_eq!(first[1].service_ms, None, "a request's copy is its own");
        assert!(
            Rc::ptr_eq(&after, &t.by_worker(&store, &ws)),
            "the same list reads the same copy"
        );
        t.learn(&store, &ws, "gone", service(Some(1.0)));
        let reordered = WorkerNames::new(&crate::config::testing::named_workers(3)[1..]);
        let moved = t.by_worker(&store, &reordered);
        assert_eq!(
            (moved[0].service_ms, moved[1].service_ms),
            (Some(7.0), None),
            "another list: spread again, w1 now first"
        );
        assert!(t.publish(&store));
        let other = CostTable::new(&keys);
        let shared = other.by_worker(&store, &ws);
        assert_eq!(shared[1].service_ms, Some(7.0));
        assert_eq!(
            store.get(&keys.costs()).map(|(v, _)| decode(&v).len()),
            Some(2),
            "a worker outside the list is kept by name"
        );
    }

    #[test]
    fn a_tick_keeps_the_copy_by_worker_index_with_the_new_values_until_rows_move() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        let (a, b) = (CostTable::new(&keys), CostTable::new(&keys));
        let ws = names();
        a.learn(&store, &ws, "w0", service(Some(10.0)));
        a.learn(&store, &ws, "w1", service(Some(20.0)));
        assert!(a.publish(&store));
        b.learn(&store, &ws, "w1", service(Some(30.0)));
        assert!(b.publish(&store));
        let held = a.by_worker(&store, &ws);
        assert!(a.publish(&store), "a takes in b's row");
        let costs = a.by_worker(&store, &ws);
        assert_eq!(
            (costs[0].service_ms, costs[1].service_ms),
            (Some(10.0), Some(30.0)),
            "same rows: the copy kept, with b's value"
        );
        assert_eq!(
            held[1].service_ms,
            Some(20.0),
            "a request's copy is its own"
        );
        // w0's row emptied and dropped: w1's row moves up, and a spreads again.
        b.learn(&store, &ws, "w0", service(None));
        assert!(b.publish(&store));
        a.learn(&store, &ws, "w1", service(Some(40.0)));
        assert!(a.publish(&store), "a's row found where it moved to");
        let costs = a.by_worker(&store, &ws);
        assert_eq!(
            (costs[0].service_ms, costs[1].service_ms),
            (None, Some(40.0))
        );
        assert_eq!(
            store.get(&keys.costs()).map(|(v, _)| decode(&v)),
            Some(vec![("w1".to_string(), [UNKNOWN, 40f64.to_bits(), 0])])
        );
    }

    #[test]
    fn own_load_at_sample_time_is_a_copy_of_the_inflight_table() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        let ring = OpRing::new(&keys, 4);
        ring.init_if_missing(&store);
        let inflight = InflightTable::new(1, 5000);
        let take = |n| {
            for _ in 0..n {
                inflight.take("w1");
            }
            assert!(inflight.flush(&store, &ring, 0));
        };
        take(3);
        let own = OwnAtSample::new(&keys);
        assert!(own.snapshot(&store, (&inflight, &ring), 0));
        take(5);
        assert_eq!(own.by_worker(&store, &names()), vec![0, 3]);
    }
}
