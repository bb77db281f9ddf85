//! Routing state shared by every VM of one Envoy (one VM per worker thread), over
//! proxy-wasm shared data: the only thing that crosses VMs. One file per table, each
//! with its encoding:
//!
//! - `ring`: the operation ring, tree operations (`ops`) in one order for every VM,
//!   shared in batches (`batch`) once per sync window (`outbox`);
//! - `inflight`: requests in flight per worker, each VM owning its own
//!   (`owned`: a VM Envoy reloaded stops counting after an expiry), riding in the
//!   ring's head value;
//! - `interval_claim`: work done once per interval by one VM: eviction (`Op::Evict`)
//!   and the engines' KV bounds (`Op::KvBound`);
//! - `samples`: the collector's last engine samples;
//! - `flags`: the overload flags (written by the prober lease holder only);
//! - `lease`: which VM runs the overload prober;
//! - `membership`: discovery mode's worker list and its version;
//! - `health`: the workers down after a failure (written by any VM);
//! - `lockout`: the push endpoint's failed token checks;
//! - `peers`: peer replicas' in-flight counts (`crate::background::replica`);
//! - `work`: `predicted_ttft`'s outstanding prefill, learned costs and the
//!   in-flight counts at the last sample.
//!
//! Keys are a small fixed set (ABI 0.2.1 cannot delete keys), all built by `Keys`
//! here and nowhere else. `read_loads` gathers what one request routes by.
//!
//! Every table that is read, changed and written back with CAS exists before any VM
//! writes it (`ensure_tables`, when each VM is configured): Envoy's `set` on a
//! missing key succeeds whatever the CAS, so two threads whose first writes both
//! found the key missing would both create it, and one change would be lost.
//!
//! The module is sans-IO: `SharedStore` is implemented by the glue over hostcalls
//! and by an in-memory map in tests.

mod batch;
mod flags;
mod generation;
mod health;
mod inflight;
mod interval_claim;
mod lease;
mod lockout;
mod membership;
mod mine;
mod ops;
mod outbox;
mod owned;
mod peers;
mod ring;
mod samples;
mod work;
mod worker_states;

pub use batch::Batch;
pub use flags::{FlagTable, Flags};
pub use generation::{stamp_after_write, BellWatch, TableCache, Tables};
pub use health::{HealthStates, HealthTable};
pub use inflight::{ByWorker, InflightTable};
pub use interval_claim::IntervalClaim;
pub use lease::{claim, Lease, ProbeLease};
pub use lockout::{Gate, PushLockout};
pub(crate) use membership::{pool_code, pool_of};
pub use membership::{Membership, MembershipTable};
pub use ops::{is_local_insert, truncate_text, Incoming, Op, OpRef};
pub use outbox::{Flushed, Outbox, Recorded, Stage};
pub use owned::{owner_expiry_ms, MIN_OWNER_EXPIRY_MS, OWNER_EXPIRY_TICKS};
pub use peers::{PeerLoads, PeerReport};
pub use ring::{AppendError, CatchUp, OpRing};
pub use samples::SamplesTable;
pub use work::{CostTable, OwnAtSample};

use std::borrow::Cow;
use std::rc::Rc;

use crate::config::{Config, WorkerNames};
use crate::load::Loads;

/// The part of proxy-wasm shared data this module needs.
pub trait SharedStore {
    /// The value and its CAS token; `None` when missing (or unreadable).
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
    /// The CAS token alone (`None`: missing). Of a key whose value is empty, Envoy
    /// returns it without calling into the VM to copy a value out, which makes it
    /// the cheapest read there is.
    fn version(&self, key: &str) -> Option<u32> {
        self.get(key).map(|(_, cas)| cas)
    }
    /// Sets `value` if the key's CAS is still `cas` (`0`: unconditionally).
    fn set(&self, key: &str, value: &[u8], cas: u32) -> SetOutcome;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetOutcome {
    Stored,
    CasMismatch,
    Failed,
}

/// How often a CAS loop retries before giving up (contention is between a handful
/// of threads; this is a bound, not an expected count).
pub const CAS_ATTEMPTS: usize = 64;

/// The shared-data key space: every key the filter uses is built here. Shared data
/// is already scoped by `vm_id`; the prefix keeps the filter's keys apart from any
/// other plugin's in the same VM id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    prefix: Cow<'static, str>,
    /// The tables' bell, read on every request: built once (a `format!` was an
    /// allocation on the request path; the default's is static).
    bell: Cow<'static, str>,
}

/// The cached tables' keys after the prefix (`generation`).
const SAMPLES: &str = ".samples";
const FLAGS: &str = ".overload.flags";
const HEALTH: &str = ".health";
const PEER_INFLIGHT: &str = ".replicas.inflight";
const OWN_AT_SAMPLE: &str = ".ttft.own_at_sample";

/// The filter's key prefix.
pub const KEY_PREFIX: &str = "llm_router";

impl Default for Keys {
    fn default() -> Self {
        Keys {
            prefix: Cow::Borrowed(KEY_PREFIX),
            bell: Cow::Borrowed("llm_router.tables.bell"),
        }
    }
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: Cow::Owned(prefix.to_string()),
            bell: Cow::Owned(format!("{prefix}.tables.bell")),
        }
    }

    /// Whether `key` is one of the tables `generation` caches (without building
    /// any key: the store asks on every write).
    pub fn is_cached_table(&self, key: &str) -> bool {
        key.strip_prefix(self.prefix.as_ref()).is_some_and(|rest| {
            [SAMPLES, FLAGS, HEALTH, PEER_INFLIGHT, OWN_AT_SAMPLE].contains(&rest)
        })
    }

    /// Empty, rewritten after every stamp of the cached tables: its CAS token
    /// tells a VM inside a sync window that a table changed (`generation`).
    pub fn tables_bell(&self) -> &str {
        &self.bell
    }

    /// The ring's next sequence number.
    pub fn ring_head(&self) -> String {
        format!("{}.ring.head", self.prefix)
    }

    /// Ring slot `i`.
    pub fn ring_slot(&self, i: usize) -> String {
        format!("{}.ring.slot.{i}", self.prefix)
    }

    /// `route_in: one_vm`: which VM routes under the configuration `digest`
    /// (`crate::relay::seat`). One key per configuration an Envoy has run.
    pub fn relay_seat(&self, digest: &str) -> String {
        format!("{}.relay.seat.{digest}", self.prefix)
    }

    pub fn eviction(&self) -> String {
        format!("{}.evict.last_ms", self.prefix)
    }

    pub fn kv_bounds(&self) -> String {
        format!("{}.kv_bounds.last_ms", self.prefix)
    }

    pub fn samples(&self) -> String {
        format!("{}{}", self.prefix, SAMPLES)
    }

    pub fn flags(&self) -> String {
        format!("{}{}", self.prefix, FLAGS)
    }

    pub fn lease(&self) -> String {
        format!("{}.overload.lease", self.prefix)
    }

    pub fn push_failures(&self) -> String {
        format!("{}.push.failures", self.prefix)
    }

    pub fn health(&self) -> String {
        format!("{}{}", self.prefix, HEALTH)
    }

    pub fn peer_inflight(&self) -> String {
        format!("{}{}", self.prefix, PEER_INFLIGHT)
    }

    pub fn costs(&self) -> String {
        // Its rows hold three numbers: a table of two an older filter left in this
        // Envoy's shared data has another name, so it is never read as this one.
        format!("{}.ttft.worker_costs", self.prefix)
    }

    pub fn own_at_sample(&self) -> String {
        format!("{}{OWN_AT_SAMPLE}", self.prefix)
    }

    pub fn membership(&self) -> String {
        format!("{}.membership", self.prefix)
    }
}

/// Creates `key` holding `empty` if no VM has yet. Envoy's shared data has no
/// "create if absent": a `set` on a missing key succeeds whatever the CAS. Every VM
/// calls this when it is configured, before it takes requests, so every later
/// read-modify-write is a CAS update of an existing key; VMs creating a key together
/// both write the same empty value.
pub(crate) fn create_if_missing(store: &dyn SharedStore, key: &str, empty: &[u8]) {
    if store.get(key).is_none() {
        store.set(key, empty, 0);
    }
}

/// Creates every table that is read, changed and written back with CAS (see the
/// module comment), each in its empty state: the learned costs, the overload flags, the health table, the push lockout, the probe
/// lease, the peers' counts, the discovered worker list, and the interval claims
/// (started at `now_ms`: the first eviction is one interval after the first VM was
/// configured). The operation ring's keys depend on its size: `OpRing::init_if_missing`.
pub fn ensure_tables(store: &dyn SharedStore, keys: &Keys, now_ms: u64) {
    let no_rows = 0u32.to_le_bytes();
    for key in [keys.costs(), keys.peer_inflight()] {
        create_if_missing(store, &key, &no_rows);
    }
    for key in [keys.flags(), keys.health()] {
        create_if_missing(store, &key, b"{}");
    }
    // No failures and no lease read as absent ones; the bell is always empty.
    for key in [
        keys.push_failures(),
        keys.lease(),
        keys.tables_bell().to_string(),
    ] {
        create_if_missing(store, &key, b"");
    }
    create_if_missing(store, &keys.membership(), &Membership::default().encode());
    for key in [keys.eviction(), keys.kv_bounds()] {
        create_if_missing(store, &key, &now_ms.to_le_bytes());
    }
}

/// Everything a request routes by, read once: every thread's in-flight counts, the
/// collector's samples, the overload flags and the down workers (none when their
/// detection is off), the last four through this VM's copy (`generation`).
/// `inflight` (with `predicted_ttft`'s work ahead) is read from `ring`'s last read
/// of its head (the catch-up's), where the table rides; `costs` is this VM's copy
/// of the learned costs (`work::CostTable`).
pub fn read_loads(
    store: &dyn SharedStore,
    keys: &Keys,
    (cfg, names): (&Config, &WorkerNames),
    now_ms: u64,
    (inflight, ring, costs): (&InflightTable, &OpRing, &CostTable),
    (cache, generation): (&TableCache, Option<u64>),
    spare: ByWorker,
) -> Loads {
    let tables = cache.tables(store, keys, (cfg, names), generation);
    // Only `predicted_ttft` reads its tables: the other policies pay nothing.
    let ttft = cfg.uses_predicted_ttft();
    let stale = cfg.replicas.peer_stale_after_ms;
    let (peer_inflight, _) = PeerLoads::sum_by_worker(&tables.peers, names, now_ms, stale);
    let counts = inflight.by_worker(ring, names, (now_ms, ttft), spare);
    // Only what `Loads` keeps is copied out of this VM's copy (not the peers'
    // reports, already summed above).
    Loads {
        inflight: counts.inflight,
        revision: counts.revision,
        peer_inflight,
        engine: Rc::clone(&tables.engine),
        now_ms,
        overloaded: Rc::clone(&tables.overloaded),
        down: Rc::clone(&tables.down),
        refused: Rc::clone(&tables.refused),
        work: counts.work,
        costs: if ttft {
            costs.by_worker(store, names)
        } else {
            costs.none()
        },
        own_at_sample: Rc::clone(&tables.own_at_sample),
    }
}

/// `v` as an unsigned LEB128 varint: seven bits a byte, low first, the high bit
/// set on every byte but the last.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A cursor over a byte slice that never panics.
pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

impl<'a> Reader<'a> {
    pub(crate) fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    pub(crate) fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }
    pub(crate) fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    /// An unsigned LEB128 varint (`put_varint`); `None` if cut short or longer
    /// than a `u64` holds.
    pub(crate) fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.u8()?;
            let bits = u64::from(byte & 0x7f);
            if shift == 63 && bits > 1 {
                return None;
            }
            v |= bits << shift;
            if byte & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }

    pub(crate) fn string(&mut self) -> Option<String> {
        self.str().map(str::to_owned)
    }

    /// Length-prefixed bytes, borrowed.
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    /// A length-prefixed UTF-8 string, borrowed.
    pub(crate) fn str(&mut self) -> Option<&'a str> {
        crate::scan::utf8(self.bytes()?)
    }
}

#[cfg(test)]
pub mod testing {
    //! An in-memory store with Envoy's CAS semantics, for tests.
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    #[derive(Default)]
    pub struct MemStore {
        pub map: RefCell<HashMap<String, (Vec<u8>, u32)>>,
        next_cas: RefCell<u32>,
    }

    impl SharedStore for MemStore {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.map.borrow().get(key).cloned()
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> SetOutcome {
            let mut map = self.map.borrow_mut();
            if let Some((_, current)) = map.get(key) {
                if cas != 0 && cas != *current {
                    return SetOutcome::CasMismatch;
                }
            }
            let mut next = self.next_cas.borrow_mut();
            *next += 1;
            map.insert(key.to_string(), (value.to_vec(), *next));
            SetOutcome::Stored
        }
    }

    /// `op` with its texts copied out (encoded as a local insert, decoded owned).
    pub fn owned(op: OpRef<'_>) -> Op {
        let mut bytes = Vec::new();
        op.encode_tagged_into(ops::TAG_INSERT, &mut bytes);
        Op::decode_with(&bytes, str::to_owned).expect("an operation decodes as encoded")
    }

    /// A ring of `slots` under the tests' keys, its head written.
    pub fn ring(store: &dyn SharedStore, slots: usize) -> OpRing {
        let ring = OpRing::new(&Keys::new("t"), slots);
        ring.init_if_missing(store);
        ring
    }

    /// A `MemStore` that counts its reads.
    #[derive(Default)]
    pub struct Counting {
        pub store: MemStore,
        pub gets: std::cell::Cell<usize>,
    }

    impl SharedStore for Counting {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.gets.set(self.gets.get() + 1);
            self.store.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> SetOutcome {
            self.store.set(key, value, cas)
        }
    }

    /// Another thread's whole write, landing between one writer's read and its write.
    type Racer<'a> = Box<dyn FnOnce(&MemStore) + 'a>;

    /// A store where `racer` runs just before the first `set`: the interleaving of
    /// two threads whose writes both read the key before either wrote it.
    pub struct Racing<'a> {
        pub inner: MemStore,
        racer: RefCell<Option<Racer<'a>>>,
    }

    impl<'a> Racing<'a> {
        pub fn new(inner: MemStore, racer: impl FnOnce(&MemStore) + 'a) -> Racing<'a> {
            Racing {
                inner,
                racer: RefCell::new(Some(Box::new(racer))),
            }
        }
    }

    impl SharedStore for Racing<'_> {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.inner.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> SetOutcome {
            let racer = self.racer.borrow_mut().take();
            if let Some(racer) = racer {
                racer(&self.inner);
            }
            self.inner.set(key, value, cas)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::MemStore;
    use super::*;
    use crate::load::Revision;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn varints_round_trip_and_refuse_what_no_u64_holds() {
        let values = [0, 1, 127, 128, 300, 1 << 35, u64::MAX - 1, u64::MAX];
        let mut bytes = Vec::new();
        for v in values {
            put_varint(&mut bytes, v);
        }
        assert_eq!(&bytes[..4], &[0, 1, 127, 0x80], "one byte below 128");
        let mut r = Reader(&bytes);
        for v in values {
            assert_eq!(r.varint(), Some(v));
        }
        assert_eq!(r.varint(), None, "nothing left");
        assert_eq!(Reader(&[0x80, 0x80]).varint(), None, "cut short");
        let too_long = [0xff; 9].into_iter().chain([0x02]).collect::<Vec<u8>>();
        assert_eq!(Reader(&too_long).varint(), None, "past 64 bits");
        assert_eq!(Reader(&[0xff; 11]).varint(), None, "past ten bytes");
    }

    #[test]
    fn keys_are_the_ones_envoy_operators_and_tests_see() {
        let k = Keys::default();
        assert_eq!(k.tables_bell(), "llm_router.tables.bell");
        assert_eq!(k.ring_head(), "llm_router.ring.head");
        assert_eq!(k.ring_slot(3), "llm_router.ring.slot.3");
        assert_eq!(k.eviction(), "llm_router.evict.last_ms");
        assert_eq!(k.kv_bounds(), "llm_router.kv_bounds.last_ms");
        assert_eq!(k.samples(), "llm_router.samples");
        assert_eq!(k.flags(), "llm_router.overload.flags");
        assert_eq!(k.lease(), "llm_router.overload.lease");
        assert_eq!(k.health(), "llm_router.health");
        assert_eq!(k.push_failures(), "llm_router.push.failures");
        assert_eq!(k.peer_inflight(), "llm_router.replicas.inflight");
        assert_eq!(k.costs(), "llm_router.ttft.worker_costs");
        assert_eq!(k.own_at_sample(), "llm_router.ttft.own_at_sample");
        assert_eq!(k.membership(), "llm_router.membership");
        assert_eq!(
            Keys::new(KEY_PREFIX),
            k,
            "the default is the filter's prefix"
        );
        let other = Keys::new("t");
        assert_eq!(other.tables_bell(), "t.tables.bell");
    }

    /// Runs `write(store, 1)` with `write(store, 2)` landing between its read and
    /// its write, on a fresh store (tables ensured first if `ensure`), and returns
    /// the store.
    fn race(ensure: bool, write: impl Fn(&dyn SharedStore, u64)) -> MemStore {
        let store = MemStore::default();
        if ensure {
            ensure_tables(&store, &Keys::new("t"), 0);
        }
        let racing = testing::Racing::new(store, |s| write(s, 2));
        write(&racing, 1);
        racing.inner
    }

    #[test]
    fn first_writes_racing_on_every_table_both_count_once_the_tables_exist() {
        use crate::config::testing::named_workers;
        use crate::worker::health::{DownReason, Event, Rules};
        let keys = Keys::new("t");
        let w = named_workers(3);
        // Each table's first write from two threads, and whether both landed.
        type Check<'a> = Box<dyn Fn(bool) -> bool + 'a>;
        let checks: Vec<(&str, Check)> = vec![
            (
                "costs",
                Box::new(|e| {
                    let s = race(e, |s, vm| {
                        let name = format!("w{vm}");
                        let costs = CostTable::new(&keys);
                        costs.learn(s, &WorkerNames::new(&w), &name, |c| {
                            crate::load::WorkerCosts {
                                service_ms: Some(1.0),
                                ..c
                            }
                        });
                        costs.publish(s);
                    });
                    let c = CostTable::new(&keys).by_worker(&s, &WorkerNames::new(&w));
                    c[1].service_ms.is_some() && c[2].service_ms.is_some()
                }),
            ),
            (
                "health",
                Box::new(|e| {
                    let r = Rules {
                        consecutive_failures: 1,
                        room: true,
                        probes_needed: 1,
                        hold_ms: 0,
                        backoff_ms: 0,
                        max_backoff_ms: 0,
                    };
                    let s = race(e, |s, vm| {
                        HealthTable::new(&keys).update(s, &w, |st| {
                            st.0.get_mut(vm as usize)
                                .and_then(|h| h.step(Event::Failed(DownReason::Reset), 1, r))
                                .map(|t| vec![t])
                                .unwrap_or_default()
                        });
                    });
                    HealthTable::new(&keys).read(&s, &w).down() == vec![false, true, true]
                }),
            ),
            (
                "peers",
                Box::new(|e| {
                    let s = race(e, |s, vm| {
                        let report = PeerReport {
                            replica: format!("r{vm}"),
                            at_ms: 1,
                            counts: vec![("w0".into(), 1)],
                        };
                        PeerLoads::new(&keys).store(s, report);
                    });
                    PeerLoads::new(&keys).read(&s).len() == 2
                }),
            ),
            (
                "lockout",
                Box::new(|e| {
                    let s = race(e, |s, _| PushLockout::new(&keys).fail(s, 1));
                    s.get("t.push.failures").map(|(v, _)| v) == Some(b"1:2".to_vec())
                }),
            ),
            (
                "lease",
                Box::new(|e| {
                    let held = std::cell::Cell::new(0);
                    race(e, |s, vm| {
                        if ProbeLease::new(&keys).acquire(s, vm, 1, 1000) {
                            held.set(held.get() + 1);
                        }
                    });
                    held.get() == 1
                }),
            ),
        ];
        for (table, both_landed) in &checks {
            assert!(
                both_landed(true),
                "{table}: with the table created first, both first writes count"
            );
            assert!(
                !both_landed(false),
                "{table}: without it, Envoy's set on a missing key loses one (the race \
                 this guards against)"
            );
        }
    }

    #[test]
    fn ensuring_tables_never_resets_one() {
        let keys = Keys::new("t");
        let store = MemStore::default();
        ensure_tables(&store, &keys, 10);
        let costs = CostTable::new(&keys);
        costs.learn(&store, &WorkerNames::default(), "w0", |c| {
            crate::load::WorkerCosts {
                service_ms: Some(3.0),
                ..c
            }
        });
        assert!(costs.publish(&store));
        assert!(!IntervalClaim::eviction(&keys).claim(&store, 10, 100));
        ensure_tables(&store, &keys, 500);
        assert_eq!(
            CostTable::new(&keys).by_worker(
                &store,
                &WorkerNames::new(&crate::config::testing::named_workers(1))
            )[0]
            .service_ms,
            Some(3.0)
        );
        assert!(
            IntervalClaim::eviction(&keys).claim(&store, 110, 100),
            "the clock started with the first VM, not the last"
        );
        assert_eq!(MembershipTable::new(&keys).read(&store).0.version, 0);
    }

    #[test]
    fn loads_are_read_by_worker_index() {
        let cfg = Config::from_json(br#"{"workers":[{"name":"a"},{"name":"b"}]}"#).unwrap();
        let keys = Keys::new("t");
        let store = MemStore::default();
        let ring = OpRing::new(&keys, 4);
        ring.init_if_missing(&store);
        let other = InflightTable::new(1, 5000);
        other.take("b");
        other.take("b");
        assert!(other.flush(&store, &ring, 7));
        ring.head(&store);
        let own = (&InflightTable::new(2, 5000), &ring, &CostTable::new(&keys));
        let names = WorkerNames::new(&cfg.workers);
        let read = |spare| {
            read_loads(
                &store,
                &keys,
                (&cfg, &names),
                7,
                own,
                (&TableCache::default(), None),
                spare,
            )
        };
        let loads = read(ByWorker::default());
        assert_eq!(loads.inflight, vec![0, 2].into());
        // Tables of some other reading, written over: the same counts.
        let mut spare = ByWorker::reclaim(loads.clone());
        spare.inflight.add(0, 9);
        spare.revision = Revision::default();
        let again = read(spare);
        assert_eq!(
            again.inflight, loads.inflight,
            "a spare's old counts are gone"
        );
        assert_eq!(again.inflight.busy(), &[1]);
        assert_eq!(again.revision.since, None, "made whole");
        assert_eq!(loads.engine.reports, vec![None, None]);
        assert_eq!(loads.now_ms, 7);
        assert_eq!(loads.overloaded[..], [false, false]);
        assert_eq!(loads.down[..], [false, false]);
        let off = Config::from_json(br#"{"workers":[{"name":"a"}],"overload":{"enabled":false}}"#)
            .unwrap();
        assert!(read_loads(
            &store,
            &keys,
            (&off, &WorkerNames::new(&off.workers)),
            7,
            own,
            (&TableCache::default(), None),
            ByWorker::default(),
        )
        .overloaded
        .is_empty());
    }
}
