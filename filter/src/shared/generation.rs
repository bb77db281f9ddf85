//! The tables every request reads but few requests change: the collector's engine
//! samples, the overload flags, the health table, the peer replicas' counts and
//! (`predicted_ttft`) this Envoy's in-flight counts as of the last sample.
//! Reading and decoding all four on every request was four shared-data reads (each a
//! copy out of Envoy and an allocation in the VM) and, at 256 workers, kilobytes of
//! JSON to parse.
//!
//! So every write of one of them also moves a generation counter on
//! (`stamp_after_write`, called by the store after each write), and each VM
//! keeps what it last decoded of them (`TableCache`) and decodes them again only when
//! the generation it read differs from the one it decoded under. The counter lives
//! in the ring's head value (`super::ring`), which every request reads to catch up:
//! while nothing changes, the tables cost no read at all. A table is written before
//! its stamp, so a VM that sees the new stamp reads the new table; one that read the
//! old stamp a moment before the write uses its copy for that request only.
//!
//! A VM inside a sync window (`super::outbox`) does not read the head; it asks the
//! tables' bell instead (`Keys::tables_bell`, an empty key every stamp rewrites),
//! whose version Envoy returns without a copy into the VM, and drops its copy when
//! the bell moved (`BellWatch`): a stats push or a flag reaches every thread at its
//! next request, whatever the window.
//!
//! A stamp that is lost (its write failed after the table's succeeded) would leave
//! copies stale, so the tick drops every copy (`TableCache::clear`): a copy is never
//! older than one tick. A worker list that changed (a new configuration, discovery)
//! drops them too: the tables are decoded by worker index.

use std::cell::RefCell;
use std::rc::Rc;

use super::ring::{decode_head, encode_head};
use super::{
    FlagTable, HealthStates, HealthTable, Keys, OwnAtSample, PeerLoads, PeerReport, SamplesTable,
};
use super::{SetOutcome, SharedStore, CAS_ATTEMPTS};
use crate::config::{Config, WorkerNames};
use crate::load::LoadTable;

/// After `store` wrote `key`: moves the generation on when `key` is one of the
/// cached tables and the write was stored. An increment under CAS that keeps the
/// ring's head and the in-flight table riding on it as they are, so two writers never leave the same generation behind them
/// and no append is lost (and no randomness is drawn: the host's random stream
/// stays the routing's own). Without a ring (not initialised) no VM has a copy.
pub fn stamp_after_write(store: &dyn SharedStore, keys: &Keys, key: &str, outcome: SetOutcome) {
    if outcome != SetOutcome::Stored || !keys.is_cached_table(key) {
        return;
    }
    let key = keys.ring_head();
    for _ in 0..CAS_ATTEMPTS {
        let Some(next) = store.get(&key).and_then(|(v, cas)| {
            let (seq, generation, tail) = decode_head(&v)?;
            Some((encode_head(seq, generation.wrapping_add(1), tail), cas))
        }) else {
            return;
        };
        let (next, cas) = next;
        match store.set(&key, &next, cas) {
            SetOutcome::CasMismatch => continue,
            SetOutcome::Stored => {
                store.set(keys.tables_bell(), &[], 0);
                return;
            }
            SetOutcome::Failed => return,
        }
    }
}

/// The tables' bell as this VM last heard it.
#[derive(Debug, Default)]
pub struct BellWatch {
    heard: std::cell::Cell<Option<u32>>,
}

impl BellWatch {
    /// Whether the bell moved since the last call (the first call hears it, and
    /// says so). A missing bell (no tables yet) never moves.
    pub fn moved(&self, store: &dyn SharedStore, keys: &Keys) -> bool {
        let now = store.version(keys.tables_bell());
        now.is_some() && self.heard.replace(now) != now
    }
}

/// The cached tables, decoded for one worker list.
#[derive(Debug, Clone, Default)]
pub struct Tables {
    /// Overloaded by worker index (empty: overload detection off).
    pub overloaded: Rc<[bool]>,
    /// Down by worker index (empty: health off).
    pub down: Rc<[bool]>,
    /// Down with their last connect failed, by worker index (empty: health off).
    pub refused: Rc<[bool]>,
    /// With a health record (down, failing, recently ejected), by worker index: a
    /// served request on one of these is told to the health table.
    pub tracked: Rc<[bool]>,
    /// The engines' samples by worker index.
    pub engine: Rc<LoadTable>,
    /// Every peer's report: which are fresh depends on the time of the request.
    pub peers: Vec<PeerReport>,
    /// This Envoy's in-flight counts when the engines were last sampled, by worker
    /// index (empty: `predicted_ttft` unused).
    pub own_at_sample: Rc<[u64]>,
}

/// This VM's copy of the tables and the generation it was decoded under.
#[derive(Debug, Default)]
pub struct TableCache {
    copy: RefCell<Option<(u64, Rc<Tables>)>>,
}

impl TableCache {
    /// The tables for `cfg`'s workers (`names`: their index, the router's): this
    /// VM's copy when `generation` (as the ring's head last gave it) is the one it
    /// was decoded under, else read and decoded afresh (always, when no generation
    /// was read).
    pub fn tables(
        &self,
        store: &dyn SharedStore,
        keys: &Keys,
        (cfg, names): (&Config, &WorkerNames),
        generation: Option<u64>,
    ) -> Rc<Tables> {
        if let (Some((seen, tables)), Some(now)) = (self.copy.borrow().as_ref(), generation) {
            if *seen == now {
                return Rc::clone(tables);
            }
        }
        let tables = Rc::new(read(store, keys, cfg, names));
        if let Some(now) = generation {
            *self.copy.borrow_mut() = Some((now, Rc::clone(&tables)));
        }
        tables
    }

    /// Drops the copy: the next request reads every table.
    pub fn clear(&self) {
        self.copy.borrow_mut().take();
    }
}

fn read(store: &dyn SharedStore, keys: &Keys, cfg: &Config, names: &WorkerNames) -> Tables {
    let health = if cfg.health.enabled {
        HealthTable::new(keys).read(store, &cfg.workers)
    } else {
        HealthStates::default()
    };
    Tables {
        overloaded: if cfg.overload.enabled {
            FlagTable::new(keys)
                .read(store, &cfg.workers)
                .overloaded()
                .into()
        } else {
            Rc::default()
        },
        down: health.down().into(),
        refused: health.refused().into(),
        tracked: health.tracked().into(),
        engine: Rc::new(SamplesTable::new(keys).read(store, &cfg.workers)),
        peers: PeerLoads::new(keys).read(store),
        own_at_sample: if cfg.uses_predicted_ttft() {
            OwnAtSample::new(keys).by_worker(store, names).into()
        } else {
            Rc::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{Counting, MemStore};
    use super::super::OpRing;
    use super::*;
    use crate::worker::health::{DownReason, Health};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A store that stamps as the glue's store does, and counts its reads.
    #[derive(Default)]
    struct Stamping(Counting);

    impl SharedStore for Stamping {
        fn get(&self, key: &str) -> Option<(Vec<u8>, u32)> {
            self.0.get(key)
        }
        fn set(&self, key: &str, value: &[u8], cas: u32) -> SetOutcome {
            let outcome = self.0.store.set(key, value, cas);
            stamp_after_write(&self.0.store, &Keys::new("t"), key, outcome);
            outcome
        }
    }

    fn config() -> Config {
        Config::from_json(br#"{"workers":[{"name":"a"},{"name":"b"}]}"#).unwrap()
    }

    #[test]
    fn unchanged_tables_cost_no_read_and_a_write_anywhere_is_seen_next() {
        let (store, keys, cfg) = (Stamping::default(), Keys::new("t"), config());
        let ring = OpRing::new(&keys, 4);
        ring.init_if_missing(&store);
        let cache = TableCache::default();
        ring.head(&store);
        assert_eq!(ring.generation(), Some(0));
        let tables = |g| cache.tables(&store, &keys, (&cfg, &WorkerNames::new(&cfg.workers)), g);
        assert_eq!(tables(ring.generation()).down[..], [false, false]);
        store.0.gets.set(0);
        ring.head(&store);
        tables(ring.generation());
        assert_eq!(store.0.gets.get(), 1, "only the head was read");

        // Another VM takes worker b out, and appends in between.
        HealthTable::new(&keys).update(&store, &cfg.workers, |s| {
            if let Some(h) = s.0.get_mut(1) {
                *h = Health::Down {
                    since_ms: 5,
                    reason: DownReason::ConnectFailure,
                    probe_successes: 0,
                    collector_ok: true,
                    refused: true,
                    ejections: 1,
                };
            }
            Vec::<()>::new()
        });
        let other = OpRing::new(&keys, 4);
        let op = super::super::ops::insert_op("t", "w").encode();
        assert_eq!(other.append_one(&store, &op), Ok(0));
        assert_eq!(ring.head(&store), Some(1), "the append kept its place");
        assert_eq!(
            ring.generation(),
            Some(1),
            "the write moved the generation on"
        );
        assert_eq!(tables(ring.generation()).down[..], [false, true]);
        assert_eq!(tables(ring.generation()).refused[..], [false, true]);
    }

    #[test]
    fn the_in_flight_snapshot_of_a_push_is_cached_and_its_write_is_seen_next() {
        let (store, keys) = (Stamping::default(), Keys::new("t"));
        let cfg = Config::from_json(
            br#"{"policy":"predicted_ttft","workers":[{"name":"a"},{"name":"b"}]}"#,
        )
        .unwrap();
        let ring = OpRing::new(&keys, 4);
        ring.init_if_missing(&store);
        let cache = TableCache::default();
        ring.head(&store);
        let tables = |g| cache.tables(&store, &keys, (&cfg, &WorkerNames::new(&cfg.workers)), g);
        assert_eq!(tables(ring.generation()).own_at_sample[..], [0, 0]);
        store.0.gets.set(0);
        ring.head(&store);
        tables(ring.generation());
        assert_eq!(store.0.gets.get(), 1, "a request reads only the head");

        // A push stores the snapshot: two requests in flight on b.
        let inflight = super::super::InflightTable::new(7, 60_000);
        inflight.take("b");
        inflight.take("b");
        assert!(inflight.flush(&store, &ring, 0));
        assert!(OwnAtSample::new(&keys).snapshot(&store, (&inflight, &ring), 0));
        ring.head(&store);
        assert_eq!(tables(ring.generation()).own_at_sample[..], [0, 2]);
        let plain =
            Config::from_json(br#"{"policy":"cache_aware","workers":[{"name":"a"},{"name":"b"}]}"#)
                .unwrap();
        let other = TableCache::default();
        assert!(
            other
                .tables(
                    &store,
                    &keys,
                    (&plain, &WorkerNames::new(&plain.workers)),
                    None
                )
                .own_at_sample
                .is_empty(),
            "other policies do not read it"
        );
    }

    #[test]
    fn an_append_after_a_stamp_keeps_its_sequence_and_the_stamp() {
        let (store, keys) = (MemStore::default(), Keys::new("t"));
        let ring = OpRing::new(&keys, 4);
        ring.init_if_missing(&store);
        ring.head(&store);
        // A stamp after this VM's head read: its hint's CAS is stale, the claim fails
        // and is made again from a fresh read.
        stamp_after_write(&store, &keys, &keys.health(), SetOutcome::Stored);
        let op = super::super::ops::insert_op("t", "w").encode();
        assert_eq!(ring.append_one(&store, &op), Ok(0));
        assert_eq!(ring.head(&store), Some(1), "the head moved past it");
        assert_eq!(ring.generation(), Some(1), "and kept the stamp");
    }

    #[test]
    fn a_write_without_a_stamp_is_seen_after_the_copy_is_dropped() {
        let (store, keys, cfg) = (MemStore::default(), Keys::new("t"), config());
        let cache = TableCache::default();
        let tables = || {
            cache.tables(
                &store,
                &keys,
                (&cfg, &WorkerNames::new(&cfg.workers)),
                Some(0),
            )
        };
        assert_eq!(tables().overloaded[..], [false, false]);
        FlagTable::new(&keys).update(&store, &cfg.workers, |f| {
            if let Some(flag) = f.0.get_mut(0) {
                *flag = crate::worker::overload::Flag::Overloaded {
                    since_ms: 1,
                    reason: crate::worker::overload::EnterReason::Ttft,
                    probe_successes: 0,
                    latency_recovered: false,
                };
            }
            Vec::<()>::new()
        });
        assert_eq!(
            tables().overloaded[..],
            [false, false],
            "no stamp: the copy stands"
        );
        cache.clear();
        assert_eq!(tables().overloaded[..], [true, false]);
        assert_eq!(
            cache
                .tables(&store, &keys, (&cfg, &WorkerNames::new(&cfg.workers)), None)
                .overloaded[..],
            [true, false],
            "no generation read: decoded afresh"
        );
    }

    #[test]
    fn only_the_cached_tables_stamp() {
        let keys = Keys::new("t");
        let store = MemStore::default();
        let ring = OpRing::new(&keys, 4);
        let stamp = |key: &str, outcome| {
            store.map.borrow_mut().clear();
            ring.init_if_missing(&store);
            stamp_after_write(&store, &keys, key, outcome);
            ring.head(&store);
            ring.generation() == Some(1)
        };
        assert!(!stamp(&keys.costs(), SetOutcome::Stored));
        assert!(!stamp(&keys.ring_head(), SetOutcome::Stored));
        assert!(!stamp(&keys.health(), SetOutcome::CasMismatch));
        for key in [
            keys.samples(),
            keys.flags(),
            keys.health(),
            keys.peer_inflight(),
        ] {
            assert!(stamp(&key, SetOutcome::Stored), "{key}");
        }
        store.map.borrow_mut().clear();
        stamp_after_write(&store, &keys, &keys.health(), SetOutcome::Stored);
        assert!(store.map.borrow().is_empty(), "no ring: nothing to stamp");
    }

    #[test]
    fn a_stamp_moves_the_bell_and_nothing_else_does() {
        let store = MemStore::default();
        let keys = Keys::new("t");
        super::super::ring::OpRing::new(&keys, 4).init_if_missing(&store);
        let watch = BellWatch::default();
        assert!(!watch.moved(&store, &keys), "no bell yet: never moves");
        super::super::ensure_tables(&store, &keys, 0);
        assert!(watch.moved(&store, &keys), "first heard");
        assert!(!watch.moved(&store, &keys));
        // A write of a table that is not cached leaves it.
        stamp_after_write(&store, &keys, &keys.eviction(), SetOutcome::Stored);
        assert!(!watch.moved(&store, &keys));
        stamp_after_write(&store, &keys, &keys.samples(), SetOutcome::CasMismatch);
        assert!(
            !watch.moved(&store, &keys),
            "a refused write stamps nothing"
        );
        stamp_after_write(&store, &keys, &keys.samples(), SetOutcome::Stored);
        assert!(watch.moved(&store, &keys), "a stored table write rings it");
        assert!(!watch.moved(&store, &keys));
        assert_eq!(store.get(keys.tables_bell()).map(|(v, _)| v), Some(vec![]));
    }
}
