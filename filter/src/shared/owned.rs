//! Counts that every VM of the Envoy adds to, each VM owning what it added: requests
//! in flight per worker and `predicted_ttft`'s outstanding prefill
//! (`super::InflightTable`). A count is released by the stream that took it, on the VM that took
//! it; when Envoy reloads a VM that trapped (`FAIL_RELOAD`), the streams in flight on
//! it are cut and their releases never run, so a count without an owner would shun
//! its worker forever.
//!
//! So one table holds one row per VM: the VM's id (random per VM instance: a
//! reloaded VM is a new owner), when the row was last written (`at_ms`, the host's
//! clock) and the VM's counts by worker name. The table rides in the ring's head
//! value (`super::inflight`). Each VM keeps its own counts in memory (the truth)
//! and publishes them whole: a change that takes a count replaces its row with CAS
//! retries, and its tick rewrites the row once it is a third of the expiry old while
//! it holds anything (`refresh`). Readers sum the rows written within `expiry_ms`,
//! with their own VM's counts from memory; every writer drops rows older than that.
//!
//! A change that only gives counts back while the VM still holds others is not
//! published by itself: it rides on the VM's next publication (its next taken count,
//! or its tick). Each publication is a `get` and a `set`, and in Envoy a `get` that
//! returns data costs about as much as the rest of a request's hostcalls together
//! (the host calls back into the VM to allocate), so publishing every release made
//! the table cost twice what routing needs. A busy VM books again soon, so the
//! others see its workers busier than they are only for a moment (they steer away a
//! little longer, never onto them); a VM whose last request ends publishes at once,
//! so an idle VM never shows load it does not hold. Taken counts are what must be
//! seen at once (they keep two threads from herding onto one worker), and they are.
//! A dead VM's counts therefore stop counting `expiry_ms` after its last write. A live
//! VM whose row expired (its thread blocked past the expiry) loses nothing: its next
//! write or tick publishes its whole count again.
//!
//! Encoding: the row count, then per row the id, `at_ms`, the entry count, the
//! entries' length in bytes (all fixed-width little-endian) and per entry the
//! worker name and `N` numbers, each a LEB128 varint (the name length-prefixed by
//! one): counts are small, and the whole table rides in the head every sync reads
//! and writes, so with dozens of busy workers fixed 8-byte numbers made it
//! kilobytes.
//! Decoding never panics; a garbled table reads as empty and the next write
//! replaces it.

use std::cell::{Cell, RefCell};

use super::mine::{entry, Change, Held, Mine};
use super::ring::Rider;
use super::Reader;
use crate::config::WorkerNames;

/// Ticks a VM's row lives without a write, and the least time that may be: a
/// thread busy with one large body must not lose its counts to others' readers.
pub const OWNER_EXPIRY_TICKS: u64 = 10;
pub const MIN_OWNER_EXPIRY_MS: u64 = 5_000;

/// How long a VM's counts outlive its last write, for a VM ticking every `tick_ms`.
pub fn owner_expiry_ms(tick_ms: u64) -> u64 {
    tick_ms
        .saturating_mul(OWNER_EXPIRY_TICKS)
        .max(MIN_OWNER_EXPIRY_MS)
}

/// Counts by worker name.
pub type Counts<const N: usize> = Vec<(String, [u64; N])>;

/// One VM's row as stored in an encoded table, borrowed: a rewrite copies the other
/// VMs' rows whole, and a sum reads their entries in place, so neither builds a
/// `String` per entry (with a few dozen busy workers that was most of what a
/// request spent on the in-flight table).
#[derive(Debug, Clone, Copy)]
struct RowRef<'a> {
    /// The row's entries: `n` of them.
    n: u32,
    entries: &'a [u8],
    /// The whole row, as encoded.
    bytes: &'a [u8],
}

impl<'a> RowRef<'a> {
    /// The row's counts by worker name (checked whole when the row was split off).
    fn counts<const N: usize>(&self) -> impl Iterator<Item = (&'a str, [u64; N])> {
        let mut r = Reader(self.entries);
        (0..self.n).map_while(move |_| entry::<N>(&mut r))
    }
}

/// A row of an encoded table with its entries unread: its id, `at_ms`, entry
/// count, entries and whole bytes.
type Span<'a> = (u64, u64, u32, &'a [u8], &'a [u8]);

/// The table's rows, their entries unread, up to the first cut short.
fn spans(bytes: &[u8]) -> impl Iterator<Item = Span<'_>> {
    let mut r = Reader(bytes);
    let mut left = r.u32().unwrap_or(0);
    std::iter::from_fn(move || {
        left = left.checked_sub(1)?;
        let start = r.0;
        let (vm, at_ms, n, len) = (r.u64()?, r.u64()?, r.u32()?, r.u32()?);
        let entries = r.take(usize::try_from(len).ok()?)?;
        let whole = start.get(..ROW_HEADER + entries.len())?;
        Some((vm, at_ms, n, entries, whole))
    })
}

/// The table's rows that `wanted` keeps, up to the first that does not read whole
/// (a garbled table reads as the rows before it). A row's entries are checked only
/// when it is kept: each row says its length, so this VM's own row and expired ones
/// are stepped over unread (a busy VM's own row has an entry per busy worker, and
/// every request and every sync read past it).
fn rows<const N: usize>(bytes: &[u8], wanted: impl Fn(u64, u64) -> bool) -> Vec<RowRef<'_>> {
    let mut rows = Vec::new();
    for (vm, at_ms, n, entries, bytes) in spans(bytes) {
        if !wanted(vm, at_ms) {
            continue;
        }
        let mut check = Reader(entries);
        let whole = (0..n).all(|_| entry::<N>(&mut check).is_some()) && check.0.is_empty();
        if !whole {
            break;
        }
        rows.push(RowRef { n, entries, bytes });
    }
    rows
}

/// A row's id, `at_ms`, entry count and entry bytes, before its entries.
const ROW_HEADER: usize = 8 + 8 + 4 + 4;

/// Changes kept past this many since the last read make the next read whole: a
/// VM that routes nothing for a while must not keep every release.
const JOURNAL_LIMIT: usize = 1024;

/// This VM's changes since its counts were last read by index (`read_changes`),
/// so a table kept from that read is brought up to date by them alone.
#[derive(Debug, Default)]
struct Journal<const N: usize> {
    /// The worker list the changes are indexed in: the last read's.
    names: Option<WorkerNames>,
    changes: Vec<Change<N>>,
    /// A change is missing (more than `JOURNAL_LIMIT`, or none read yet).
    lost: bool,
    /// The last read's number (0: none yet).
    read: u64,
}

/// Whose count a sum takes: another VM's entry, read by name, or one this VM
/// holds, which remembers its index.
enum Counted<'a, const N: usize> {
    Other(&'a str),
    Mine(&'a Held<N>),
}

impl<const N: usize> Counted<'_, N> {
    fn name(&self) -> &str {
        match self {
            Counted::Other(name) => name,
            Counted::Mine(held) => &held.name,
        }
    }

    fn index_in(&self, names: &WorkerNames) -> Option<usize> {
        match self {
            Counted::Other(name) => names.get(name),
            Counted::Mine(held) => held.index_in(names),
        }
    }
}

/// The table: `rows` as they were stored, then this VM's own row when given (its
/// id, `at_ms`, entry count and encoded entries, `Mine::row`).
fn encode(rows: &[RowRef], own: Option<(u64, u64, usize, &[u8])>) -> Vec<u8> {
    let n = rows.len() + usize::from(own.is_some());
    // Sized for the whole table: grown from empty, a busy VM's row of dozens of
    // workers was reallocated and copied about eight times at every publication.
    let others: usize = rows.iter().map(|r| r.bytes.len()).sum();
    let mine = own.map_or(0, |(_, _, _, entries)| ROW_HEADER + entries.len());
    let mut out = Vec::with_capacity(4 + others + mine);
    out.extend_from_slice(&(n as u32).to_le_bytes());
    for row in rows {
        out.extend_from_slice(row.bytes);
    }
    if let Some((vm, at_ms, count, entries)) = own {
        out.extend_from_slice(&vm.to_le_bytes());
        out.extend_from_slice(&at_ms.to_le_bytes());
        out.extend_from_slice(&(count as u32).to_le_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(entries);
    }
    out
}

/// Adds `values` to `slot`, saturating.
fn add_to<const N: usize>(slot: &mut [u64; N], values: &[u64; N]) {
    for (s, v) in slot.iter_mut().zip(values) {
        *s = s.saturating_add(*v);
    }
}

fn fresh(at_ms: u64, now_ms: u64, expiry_ms: u64) -> bool {
    now_ms.saturating_sub(at_ms) < expiry_ms
}

/// This VM's counts and their publication: what its row says, riding on the
/// ring's head (`super::inflight`).
#[derive(Debug)]
pub struct OwnedCounts<const N: usize> {
    /// This VM instance's id.
    vm: u64,
    expiry_ms: u64,
    /// What this VM holds: the truth its row publishes.
    mine: RefCell<Mine<N>>,
    /// Its changes since the last read by index.
    journal: RefCell<Journal<N>>,
    /// When this VM's row was last stored.
    written_at: Cell<u64>,
    /// `mine` differs from the published row (a change waits, or the last write
    /// failed).
    unpublished: Cell<bool>,
}

impl<const N: usize> OwnedCounts<N> {
    pub fn new(vm: u64, expiry_ms: u64) -> OwnedCounts<N> {
        OwnedCounts {
            vm,
            expiry_ms,
            mine: RefCell::new(Mine::default()),
            journal: RefCell::new(Journal {
                lost: true,
                ..Journal::default()
            }),
            written_at: Cell::new(0),
            unpublished: Cell::new(false),
        }
    }

    /// Takes a new expiry (a configuration with another tick).
    pub fn set_expiry(&mut self, expiry_ms: u64) {
        self.expiry_ms = expiry_ms;
    }

    /// The other VMs' fresh rows of the encoded `table`.
    fn others<'t>(&self, table: &'t [u8], now_ms: u64) -> impl Iterator<Item = RowRef<'t>> {
        let (vm, expiry_ms) = (self.vm, self.expiry_ms);
        rows::<N>(table, move |row_vm, at_ms| {
            row_vm != vm && fresh(at_ms, now_ms, expiry_ms)
        })
        .into_iter()
    }

    /// Calls `add` with every count a sum takes: the other VMs' fresh rows of the
    /// encoded `table`, read in place, then this VM's own from memory (its row may
    /// lag a release).
    fn each_count(
        &self,
        table: &[u8],
        now_ms: u64,
        mut add: impl FnMut(Counted<'_, N>, &[u64; N]),
    ) {
        for row in self.others(table, now_ms) {
            for (name, values) in row.counts::<N>() {
                add(Counted::Other(name), &values);
            }
        }
        for held in self.mine.borrow().held() {
            add(Counted::Mine(held), &held.values);
        }
    }

    /// Every fresh row's counts summed by worker name (`each_count`); workers never
    /// counted are absent.
    pub fn sum(&self, table: &[u8], now_ms: u64) -> Counts<N> {
        // Totals in the order names were first seen; each name is built once.
        let mut at: hashbrown::HashMap<String, usize> = hashbrown::HashMap::new();
        let mut totals: Vec<[u64; N]> = Vec::new();
        self.each_count(table, now_ms, |counted, values| {
            let i = *at.entry_ref(counted.name()).or_insert_with(|| {
                totals.push([0; N]);
                totals.len() - 1
            });
            if let Some(slot) = totals.get_mut(i) {
                add_to(slot, values);
            }
        });
        let mut names: Vec<(String, usize)> = at.into_iter().collect();
        names.sort_unstable_by_key(|(_, i)| *i);
        names
            .into_iter()
            .map(|(name, _)| name)
            .zip(totals)
            .collect()
    }

    /// Calls `add` with every count a sum takes (`each_count`) and its worker's
    /// index in `names` (counts of workers not in it are left out), so a caller
    /// sums them into whatever it keeps by index.
    pub fn each_by_worker(
        &self,
        table: &[u8],
        now_ms: u64,
        names: &WorkerNames,
        mut add: impl FnMut(usize, &[u64; N]),
    ) {
        self.each_count(table, now_ms, |counted, values| {
            if let Some(i) = counted.index_in(names) {
                add(i, values);
            }
        });
    }

    /// Starts a read of this VM's counts by index in `names`: calls `each` with
    /// every change since read `since` when they are all there (`since` was the
    /// last read, in the same list, and nothing was lost), and says whether they
    /// were. Either way the changes after this read are kept from here. The
    /// read's number (never 0), and whether the changes were complete.
    pub fn read_changes(
        &self,
        since: u64,
        names: &WorkerNames,
        mut each: impl FnMut(&Change<N>),
    ) -> (u64, bool) {
        let mut journal = self.journal.borrow_mut();
        let same_list = journal.names.as_ref().map(WorkerNames::id) == Some(names.id());
        let complete = same_list && !journal.lost && since != 0 && since == journal.read;
        if complete {
            journal.changes.iter().for_each(&mut each);
        }
        journal.changes.clear();
        journal.lost = false;
        journal.read = journal.read.wrapping_add(1).max(1);
        if !same_list {
            journal.names = Some(names.clone());
        }
        (journal.read, complete)
    }

    /// Whether the other VMs' fresh rows of `table` are `stored` (as
    /// `others_bytes` wrote them), compared whole without reading their entries.
    pub fn others_are(&self, table: &[u8], now_ms: u64, stored: &[u8]) -> bool {
        let mut rest = stored;
        for (vm, at_ms, _, _, whole) in spans(table) {
            if vm == self.vm || !fresh(at_ms, now_ms, self.expiry_ms) {
                continue;
            }
            match rest.strip_prefix(whole) {
                Some(after) => rest = after,
                None => return false,
            }
        }
        rest.is_empty()
    }

    /// The other VMs' fresh rows of `table` that a sum reads, back to back, into
    /// `out`.
    pub fn others_bytes(&self, table: &[u8], now_ms: u64, out: &mut Vec<u8>) {
        out.clear();
        for row in self.others(table, now_ms) {
            out.extend_from_slice(row.bytes);
        }
    }

    /// What this VM holds.
    pub fn mine(&self) -> Counts<N> {
        let mine = self.mine.borrow();
        mine.held().map(|h| (h.name.clone(), h.values)).collect()
    }

    /// Whether this VM holds nothing.
    pub fn holds_nothing(&self) -> bool {
        self.mine.borrow().holds_nothing()
    }

    /// Adds `delta` to this VM's counts for `worker` (saturating at zero; rows of
    /// zeros are dropped) and marks them unpublished. Whether they must be published
    /// now: not when the change only gives counts back while the VM holds others
    /// (see the module's doc).
    pub fn change(&self, worker: &str, delta: [i64; N]) -> bool {
        let mut mine = self.mine.borrow_mut();
        let mut journal = self.journal.borrow_mut();
        let change = mine.change(worker, delta, journal.names.as_ref());
        if let Some(change) = change.filter(|_| !journal.lost) {
            if journal.changes.len() < JOURNAL_LIMIT {
                journal.changes.push(change);
            } else {
                journal.lost = true;
                journal.changes.clear();
            }
        }
        self.unpublished.set(true);
        let releases_only = delta.iter().all(|d| *d <= 0);
        !releases_only || mine.holds_nothing()
    }

    /// Whether this VM's row differs from what it last stored.
    pub fn unpublished(&self) -> bool {
        self.unpublished.get()
    }

    /// Whether the tick must rewrite this VM's row: it is unpublished, or a third
    /// of the expiry old while it holds anything (so live counts never expire).
    pub fn due(&self, now_ms: u64) -> bool {
        let stale = now_ms.saturating_sub(self.written_at.get()) >= self.expiry_ms / 3;
        self.unpublished.get() || (stale && !self.mine.borrow().holds_nothing())
    }

    /// The encoded `table` with this VM's row replaced by its counts (none: the row
    /// goes) and expired rows dropped.
    pub fn rewrite(&self, table: &[u8], now_ms: u64) -> Vec<u8> {
        let rows: Vec<RowRef> = self.others(table, now_ms).collect();
        let mine = self.mine.borrow();
        let own = (!mine.holds_nothing()).then_some((
            self.vm,
            now_ms,
            mine.held_count(),
            mine.row.as_slice(),
        ));
        encode(&rows, own)
    }

    /// A `rewrite` at `now_ms` was stored.
    pub fn stored(&self, now_ms: u64) {
        self.written_at.set(now_ms);
        self.unpublished.set(false);
    }

    /// The counts as a rider on a write of the ring's head at `now_ms`: they ride
    /// when unpublished (`force`: always, as the tick's heartbeat).
    pub fn riding(&self, now_ms: u64, force: bool) -> Riding<'_, N> {
        Riding {
            counts: self,
            now_ms,
            force,
        }
    }
}

/// A VM's counts riding on a write of the ring's head.
pub struct Riding<'a, const N: usize> {
    counts: &'a OwnedCounts<N>,
    now_ms: u64,
    force: bool,
}

impl<const N: usize> Rider for Riding<'_, N> {
    fn rewrite(&self, tail: &[u8]) -> Option<Vec<u8>> {
        let c = self.counts;
        (self.force || c.unpublished()).then(|| c.rewrite(tail, self.now_ms))
    }

    fn stored(&self) {
        self.counts.stored(self.now_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::super::ring::{encode_head, OpRing};
    use super::super::testing::{ring, MemStore};
    use super::super::{SetOutcome, SharedStore};
    use super::*;
    use crate::config::testing::names;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const EXPIRY: u64 = 5000;

    /// `counts`' sums by worker index for `names` (never counted: zeros).
    fn sum_by_worker<const N: usize>(
        counts: &OwnedCounts<N>,
        table: &[u8],
        now_ms: u64,
        names: &WorkerNames,
    ) -> Vec<[u64; N]> {
        let mut out = vec![[0; N]; names.len()];
        counts.each_by_worker(table, now_ms, names, |i, values| {
            if let Some(slot) = out.get_mut(i) {
                add_to(slot, values);
            }
        });
        out
    }

    /// One VM's counts riding on its own view of a shared ring, as the in-flight
    /// table keeps them.
    struct Vm {
        counts: OwnedCounts<1>,
        ring: OpRing,
    }

    fn table(store: &dyn SharedStore, vm: u64) -> Vm {
        Vm {
            counts: OwnedCounts::new(vm, EXPIRY),
            ring: ring(store, 4),
        }
    }

    impl Vm {
        /// Changes the counts and publishes them unless the change waits.
        fn add(&self, store: &dyn SharedStore, worker: &str, delta: [i64; 1], now: u64) -> bool {
            self.counts.change(worker, delta) && self.publish(store, now, false)
        }

        fn publish(&self, store: &dyn SharedStore, now: u64, force: bool) -> bool {
            self.ring.ride(store, &self.counts.riding(now, force))
        }

        fn refresh(&self, store: &dyn SharedStore, now: u64) -> bool {
            self.counts.due(now) && self.publish(store, now, true)
        }

        fn tail(&self, store: &dyn SharedStore) -> Vec<u8> {
            self.ring.read_tail(store).to_vec()
        }

        fn read(&self, store: &dyn SharedStore, now: u64) -> Counts<1> {
            self.counts.sum(&self.tail(store), now)
        }

        fn by_worker(
            &self,
            store: &dyn SharedStore,
            names: &WorkerNames,
            now: u64,
        ) -> Vec<[u64; 1]> {
            sum_by_worker(&self.counts, &self.tail(store), now, names)
        }
    }

    #[test]
    fn a_worker_let_go_leaves_the_others_found_by_name() {
        let counts: OwnedCounts<2> = OwnedCounts::new(1, EXPIRY);
        for w in ["w0", "w1", "w2", "w3"] {
            counts.change(w, [1, 0]);
        }
        counts.change("w2", [0, 5]);
        assert!(!counts.change("w0", [-1, 0]), "w0 goes: w3 takes its place");
        assert!(counts.change("w3", [0, 2]), "a take publishes");
        assert!(
            !counts.change("w1", [-1, -1]),
            "w1 goes: w2 takes its place"
        );
        assert!(!counts.change("w2", [-1, 0]));
        assert_eq!(
            counts.mine(),
            vec![("w3".to_string(), [1, 2]), ("w2".to_string(), [0, 5])]
        );
        assert!(!counts.change("w3", [-1, -2]));
        assert!(counts.change("w2", [0, -9]), "the last release");
        assert!(counts.holds_nothing());
        counts.change("w1", [0, 0]);
        assert!(counts.holds_nothing(), "a change to nothing holds nothing");
    }

    #[test]
    fn every_vms_counts_add_up_and_each_releases_its_own() {
        let store = MemStore::default();
        let (a, b) = (table(&store, 1), table(&store, 2));
        assert!(a.add(&store, "w0", [1], 0));
        assert!(a.add(&store, "w0", [1], 1));
        assert!(b.add(&store, "w0", [1], 2));
        assert!(b.add(&store, "w1", [1], 3));
        assert_eq!(a.by_worker(&store, &names(), 4), vec![[3], [1]]);
        assert!(!b.add(&store, "w1", [-1], 5), "a release waits");
        assert!(!b.add(&store, "w1", [-1], 6), "never below zero");
        assert_eq!(b.counts.mine(), vec![("w0".to_string(), [1])]);
        assert_eq!(
            b.read(&store, 6),
            vec![("w0".to_string(), [3])],
            "its own VM sees it at once"
        );
        assert_eq!(
            a.by_worker(&store, &names(), 7),
            vec![[3], [1]],
            "the others once it is published"
        );
        assert!(b.refresh(&store, 7), "the tick publishes it");
        assert_eq!(a.read(&store, 7), vec![("w0".to_string(), [3])]);
        assert!(!a.add(&store, "w0", [-1], 8), "a still holds one");
        assert!(a.add(&store, "w0", [-1], 8), "its last release publishes");
        assert!(b.add(&store, "w0", [-1], 9));
        assert_eq!(
            a.tail(&store),
            vec![0, 0, 0, 0],
            "a VM holding nothing has no row"
        );
    }

    #[test]
    fn a_dead_vms_counts_expire_and_its_row_is_dropped() {
        let store = MemStore::default();
        let (dead, live) = (table(&store, 1), table(&store, 2));
        dead.add(&store, "w0", [5], 1000);
        live.add(&store, "w0", [1], 1000);
        assert_eq!(live.by_worker(&store, &names(), 1000 + EXPIRY - 1)[0], [6]);
        // The live VM's tick keeps its row fresh; the dead one never writes again.
        assert!(!live.refresh(&store, 1000 + EXPIRY / 3 - 1), "not due yet");
        assert!(live.refresh(&store, 1000 + EXPIRY / 3));
        assert_eq!(
            live.by_worker(&store, &names(), 1000 + EXPIRY)[0],
            [1],
            "the dead VM's counts no longer count"
        );
        live.add(&store, "w1", [1], 1000 + EXPIRY);
        assert_eq!(
            rows::<1>(&live.tail(&store), |_, _| true).len(),
            1,
            "the expired row was dropped"
        );
    }

    #[test]
    fn a_live_vm_whose_row_expired_publishes_it_whole_again() {
        let store = MemStore::default();
        let (slow, other) = (table(&store, 1), table(&store, 2));
        slow.add(&store, "w0", [2], 0);
        other.add(&store, "w1", [1], EXPIRY);
        assert_eq!(other.read(&store, EXPIRY), vec![("w1".to_string(), [1])]);
        assert!(slow.refresh(&store, EXPIRY + 1));
        assert_eq!(
            other.by_worker(&store, &names(), EXPIRY + 1),
            vec![[2], [1]]
        );
    }

    /// A store whose every write fails.
    struct Failing;

    impl SharedStore for Failing {
        fn get(&self, _: &str) -> Option<(Vec<u8>, u32)> {
            None
        }
        fn set(&self, _: &str, _: &[u8], _: u32) -> SetOutcome {
            SetOutcome::Failed
        }
    }

    #[test]
    fn a_failed_write_is_kept_and_retried_by_the_tick() {
        let store = MemStore::default();
        let t = table(&store, 1);
        assert!(!t.add(&Failing, "w0", [1], 0));
        assert_eq!(
            t.counts.mine(),
            vec![("w0".to_string(), [1])],
            "kept in memory"
        );
        assert!(t.refresh(&store, 1), "a failed write is due at once");
        assert_eq!(t.read(&store, 1), vec![("w0".to_string(), [1])]);
        assert!(
            !t.refresh(&store, 2),
            "then only when a third of the expiry old"
        );
        let head = super::super::Keys::new("t").ring_head();
        store
            .map
            .borrow_mut()
            .insert(head, (encode_head(0, 0, b"junk"), 99));
        assert_eq!(
            t.read(&store, 3),
            vec![("w0".to_string(), [1])],
            "garbled: only its own VM's counts, from memory"
        );
        assert!(
            t.add(&store, "w0", [1], 3),
            "and the next write replaces it"
        );
        assert_eq!(t.read(&store, 3), vec![("w0".to_string(), [2])]);
    }

    #[test]
    fn pairs_and_garbage_decode_safely() {
        let mut mine = Mine::<2>::default();
        mine.change("wé", [1, 4000], None);
        mine.change("w1", [0, 7], None);
        let bytes = encode(&[], Some((9, 3, mine.held_count(), &mine.row)));
        assert_eq!(
            bytes.len(),
            4 + ROW_HEADER + (1 + 3 + 1 + 2) + (1 + 2 + 1 + 1),
            "varints"
        );
        let seen = Cell::new(None);
        let read = rows::<2>(&bytes, |vm, at_ms| {
            seen.set(Some((vm, at_ms)));
            true
        });
        let [row] = read.as_slice() else {
            panic!("one row: {read:?}");
        };
        assert_eq!(seen.get(), Some((9, 3)));
        let back: Vec<(&str, [u64; 2])> = row.counts::<2>().collect();
        assert_eq!(back, vec![("wé", [1, 4000]), ("w1", [0, 7])]);
        assert_eq!(
            encode(&read, None)[4..],
            bytes[4..],
            "another VM's row is copied as it was stored"
        );
        for cut in 0..bytes.len() {
            assert!(
                rows::<2>(&bytes[..cut], |_, _| true).is_empty(),
                "cut at {cut}"
            );
        }
        assert!(rows::<2>(&[255, 255, 255, 255], |_, _| true).is_empty());
        let mut bad_name = bytes.clone();
        // The row count, the row's header, the first name's length and "w", then
        // the second byte of "é".
        let at = 4 + ROW_HEADER + 1 + 1 + 1;
        assert_eq!(bad_name[at], "é".as_bytes()[1]);
        bad_name[at] = 0xff;
        assert!(
            rows::<2>(&bad_name, |_, _| true).is_empty(),
            "a name that is not UTF-8"
        );
        // A garbled row ends the table for a reader that reads it; one that leaves
        // it out steps over it by its length to the rows after it.
        let other = encode(&[], Some((5, 3, mine.held_count(), &mine.row)));
        let mut two = 2u32.to_le_bytes().to_vec();
        two.extend_from_slice(&bad_name[4..]);
        two.extend_from_slice(&other[4..]);
        assert!(rows::<2>(&two, |_, _| true).is_empty());
        let after = rows::<2>(&two, |vm, _| vm != 9);
        let [row] = after.as_slice() else {
            panic!("one row: {after:?}");
        };
        assert_eq!(
            row.bytes,
            &other[4..],
            "the garbled row is stepped over unread"
        );
    }

    #[test]
    fn this_vms_counts_find_their_index_again_in_a_new_worker_list() {
        let t = OwnedCounts::<1>::new(1, EXPIRY);
        t.change("w1", [2]);
        let three = WorkerNames::new(&crate::config::testing::named_workers(3));
        assert_eq!(sum_by_worker(&t, &[], 0, &three), vec![[0], [2], [0]]);
        assert_eq!(
            sum_by_worker(&t, &[], 0, &three),
            vec![[0], [2], [0]],
            "again"
        );
        let shifted = WorkerNames::new(&crate::config::testing::named_workers(3)[1..]);
        assert_eq!(
            sum_by_worker(&t, &[], 0, &shifted),
            vec![[2], [0]],
            "w1 moved to index 0"
        );
        let without = WorkerNames::new(&crate::config::testing::named_workers(1));
        assert_eq!(sum_by_worker(&t, &[], 0, &without), vec![[0]], "w1 left");
        assert_eq!(sum_by_worker(&t, &[], 0, &three), vec![[0], [2], [0]]);
    }

    #[test]
    fn sums_by_worker_index_agree_with_sums_by_name() {
        let store = MemStore::default();
        let (a, b) = (table(&store, 1), table(&store, 2));
        a.add(&store, "w1", [2], 0);
        a.add(&store, "gone", [5], 0);
        b.add(&store, "w1", [1], 0);
        b.add(&store, "w0", [3], 0);
        let names = WorkerNames::new(&crate::config::testing::named_workers(3));
        let by_name = b.read(&store, 0);
        let spread = names.spread(&by_name, [0]);
        assert_eq!(b.by_worker(&store, &names, 0), spread);
        assert_eq!(spread, vec![[3], [3], [0]], "unknown names count nowhere");
    }
}
