//! Routing state shared by every VM of one Envoy (one VM per worker thread), over
//! proxy-wasm shared data: the only thing that crosses VMs.
//!
//! Tree operations travel through an **operation ring**: a fixed set of slot keys
//! plus a head key holding the next sequence number. A writer claims sequence `h` by
//! writing slot `h % slots` with that slot's CAS, then advances the head (any writer
//! that finds slot `h` already written advances the head for it, so a stalled writer
//! never blocks the others). Readers only read sequences below the head, which are
//! complete. Every VM, the writer included, applies operations in sequence order to
//! its local tree before it matches, and uses the sequence number as the tree clock,
//! so all VMs that applied the same prefix of the stream hold identical trees and
//! evict identically. When nothing changed, catching up costs one `get` of the head.
//! A VM that falls more than `slots` behind skips what was overwritten and counts
//! the gap.
//!
//! Keys are a fixed set (ABI 0.2.1 cannot delete keys): the head, `slots` slot keys,
//! the in-flight table and the eviction clock.
//!
//! In-flight counts live in one key (worker name -> count), changed with CAS retries
//! and saturating at zero, so the imbalance rule sees the whole Envoy's load.
//!
//! The module is sans-IO: `SharedStore` is implemented by the glue over hostcalls
//! and by an in-memory map in tests.

use crate::config::Pool;

/// The part of proxy-wasm shared data this module needs.
pub trait SharedStore {
    /// The value and its CAS token; `None` when missing (or unreadable).
    fn get(&self, key: &str) -> Option<(Vec<u8>, u32)>;
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

const EMPTY_SEQ: u64 = u64::MAX;

/// One tree operation, as it travels between VMs. Workers are named, not indexed,
/// so VMs that are momentarily on different config versions still agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Insert {
        pool: Pool,
        model: String,
        worker: String,
        text: String,
    },
    RemoveWorker {
        pool: Pool,
        worker: String,
    },
    /// Periodic eviction, issued by one VM per interval so all evict at the same
    /// point of the stream.
    Evict,
}

fn pool_code(p: Pool) -> u8 {
    match p {
        Pool::Regular => 0,
        Pool::Prefill => 1,
        Pool::Decode => 2,
    }
}

fn pool_of(code: u8) -> Option<Pool> {
    match code {
        0 => Some(Pool::Regular),
        1 => Some(Pool::Prefill),
        2 => Some(Pool::Decode),
        _ => None,
    }
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A cursor over a byte slice that never panics.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn string(&mut self) -> Option<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
}

impl Op {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Op::Insert {
                pool,
                model,
                worker,
                text,
            } => {
                out.push(1);
                out.push(pool_code(*pool));
                put_bytes(&mut out, model.as_bytes());
                put_bytes(&mut out, worker.as_bytes());
                put_bytes(&mut out, text.as_bytes());
            }
            Op::RemoveWorker { pool, worker } => {
                out.push(2);
                out.push(pool_code(*pool));
                put_bytes(&mut out, worker.as_bytes());
            }
            Op::Evict => out.push(3),
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Op> {
        let mut r = Reader(bytes);
        let op = match r.u8()? {
            1 => Op::Insert {
                pool: pool_of(r.u8()?)?,
                model: r.string()?,
                worker: r.string()?,
                text: r.string()?,
            },
            2 => Op::RemoveWorker {
                pool: pool_of(r.u8()?)?,
                worker: r.string()?,
            },
            3 => Op::Evict,
            _ => return None,
        };
        r.0.is_empty().then_some(op)
    }
}

/// The longest prefix of `text` of at most `max_bytes` bytes that ends on a char
/// boundary. Ops carry at most this much text, which bounds the ring's memory.
pub fn truncate_text(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut n = max_bytes;
    while n > 0 && !text.is_char_boundary(n) {
        n -= 1;
    }
    &text[..n]
}

/// The result of catching up with the ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CatchUp {
    /// Operations applied.
    pub applied: u64,
    /// Operations lost because this VM fell more than a ring behind, or unreadable.
    pub gaps: u64,
}

/// Why an append did not happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendError {
    /// The ring's keys do not exist (not initialised) or cannot be read.
    Unavailable,
    /// CAS contention outlasted `CAS_ATTEMPTS`.
    Contended,
}

/// The operation ring's layout.
#[derive(Debug, Clone)]
pub struct OpRing {
    head_key: String,
    slot_keys: Vec<String>,
}

fn seq_of(slot: &[u8]) -> Option<u64> {
    Reader(slot).u64()
}

impl OpRing {
    pub fn new(prefix: &str, slots: usize) -> OpRing {
        OpRing {
            head_key: format!("{prefix}.ring.head"),
            slot_keys: (0..slots.max(1))
                .map(|i| format!("{prefix}.ring.slot.{i}"))
                .collect(),
        }
    }

    pub fn slots(&self) -> usize {
        self.slot_keys.len()
    }

    fn slot_key(&self, seq: u64) -> &str {
        let i = (seq % self.slot_keys.len() as u64) as usize;
        self.slot_keys
            .get(i)
            .map(String::as_str)
            .unwrap_or_default()
    }

    /// Creates whatever keys are missing: the head at 0 and empty slots. Envoy
    /// configures the main thread's VM before worker threads serve traffic, so the
    /// first initialisation happens before any append; a later config with more
    /// slots adds the new ones without touching the live ones.
    pub fn init_if_missing(&self, store: &dyn SharedStore) {
        let empty = EMPTY_SEQ.to_le_bytes();
        for key in &self.slot_keys {
            if store.get(key).is_none() {
                store.set(key, &empty, 0);
            }
        }
        if store.get(&self.head_key).is_none() {
            store.set(&self.head_key, &0u64.to_le_bytes(), 0);
        }
    }

    /// The next sequence number (operations ever appended).
    pub fn head(&self, store: &dyn SharedStore) -> Option<u64> {
        let (v, _) = store.get(&self.head_key)?;
        Reader(&v).u64()
    }

    /// Appends `op`, returning its sequence number.
    pub fn append(&self, store: &dyn SharedStore, op: &[u8]) -> Result<u64, AppendError> {
        for _ in 0..CAS_ATTEMPTS {
            let (head_bytes, head_cas) =
                store.get(&self.head_key).ok_or(AppendError::Unavailable)?;
            let head = Reader(&head_bytes).u64().ok_or(AppendError::Unavailable)?;
            let key = self.slot_key(head);
            let (slot, slot_cas) = store.get(key).ok_or(AppendError::Unavailable)?;
            match seq_of(&slot) {
                // Someone wrote `head` but has not advanced the head yet: help.
                Some(s) if s == head => {
                    store.set(&self.head_key, &(head + 1).to_le_bytes(), head_cas);
                    continue;
                }
                // Our view of the head is stale.
                Some(s) if s != EMPTY_SEQ && s > head => continue,
                _ => {}
            }
            let mut value = Vec::with_capacity(8 + op.len());
            value.extend_from_slice(&head.to_le_bytes());
            value.extend_from_slice(op);
            match store.set(key, &value, slot_cas) {
                SetOutcome::Stored => {
                    // A failure means another writer already advanced it for us.
                    store.set(&self.head_key, &(head + 1).to_le_bytes(), head_cas);
                    return Ok(head);
                }
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return Err(AppendError::Unavailable),
            }
        }
        Err(AppendError::Contended)
    }

    /// Applies every operation from `*cursor` up to the head, in order, and moves the
    /// cursor. `apply(seq, op)` gets each decodable operation.
    pub fn catch_up(
        &self,
        store: &dyn SharedStore,
        cursor: &mut u64,
        mut apply: impl FnMut(u64, Op),
    ) -> CatchUp {
        let mut out = CatchUp::default();
        let Some(head) = self.head(store) else {
            return out;
        };
        if head <= *cursor {
            return out;
        }
        let oldest = head.saturating_sub(self.slots() as u64);
        if *cursor < oldest {
            out.gaps += oldest - *cursor;
            *cursor = oldest;
        }
        while *cursor < head {
            let seq = *cursor;
            let op = store
                .get(self.slot_key(seq))
                .filter(|(v, _)| seq_of(v) == Some(seq))
                .and_then(|(v, _)| Op::decode(v.get(8..)?));
            match op {
                Some(op) => {
                    apply(seq, op);
                    out.applied += 1;
                }
                // Overwritten by a writer a whole ring ahead, or garbage.
                None => out.gaps += 1,
            }
            *cursor += 1;
        }
        out
    }
}

/// In-flight requests per worker for the whole Envoy, in one key.
#[derive(Debug, Clone)]
pub struct InflightTable {
    key: String,
}

fn encode_counts(counts: &[(String, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(counts.len() as u32).to_le_bytes());
    for (name, n) in counts {
        put_bytes(&mut out, name.as_bytes());
        out.extend_from_slice(&n.to_le_bytes());
    }
    out
}

fn decode_counts(bytes: &[u8]) -> Vec<(String, u64)> {
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

impl InflightTable {
    pub fn new(prefix: &str) -> InflightTable {
        InflightTable {
            key: format!("{prefix}.inflight"),
        }
    }

    /// Every worker's count (workers never counted are absent).
    pub fn read(&self, store: &dyn SharedStore) -> Vec<(String, u64)> {
        store
            .get(&self.key)
            .map(|(v, _)| decode_counts(&v))
            .unwrap_or_default()
    }

    /// Adds `delta` to `worker`'s count, saturating at zero. Returns whether it was
    /// stored.
    pub fn add(&self, store: &dyn SharedStore, worker: &str, delta: i64) -> bool {
        for _ in 0..CAS_ATTEMPTS {
            let (mut counts, cas) = match store.get(&self.key) {
                Some((v, cas)) => (decode_counts(&v), cas),
                None => (Vec::new(), 0),
            };
            match counts.iter_mut().find(|(n, _)| n == worker) {
                Some((_, c)) => *c = c.saturating_add_signed(delta),
                None => counts.push((worker.to_string(), 0u64.saturating_add_signed(delta))),
            }
            // Zero entries are dropped so names of removed workers do not pile up.
            counts.retain(|(_, c)| *c > 0);
            match store.set(&self.key, &encode_counts(&counts), cas) {
                SetOutcome::Stored => return true,
                SetOutcome::CasMismatch => continue,
                SetOutcome::Failed => return false,
            }
        }
        false
    }
}

/// One eviction per interval for the whole Envoy: a VM whose tick finds the interval
/// elapsed claims it by CAS and appends `Op::Evict`.
#[derive(Debug, Clone)]
pub struct EvictionClock {
    key: String,
}

impl EvictionClock {
    pub fn new(prefix: &str) -> EvictionClock {
        EvictionClock {
            key: format!("{prefix}.evict.last_ms"),
        }
    }

    /// Whether this caller won the eviction due at `now_ms`.
    pub fn claim(&self, store: &dyn SharedStore, now_ms: u64, interval_ms: u64) -> bool {
        let (last, cas) = match store.get(&self.key) {
            Some((v, cas)) => (Reader(&v).u64().unwrap_or(0), cas),
            None => {
                // First tick anywhere: start the clock, evict one interval later.
                store.set(&self.key, &now_ms.to_le_bytes(), 0);
                return false;
            }
        };
        now_ms.saturating_sub(last) >= interval_ms
            && store.set(&self.key, &now_ms.to_le_bytes(), cas) == SetOutcome::Stored
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
}

#[cfg(test)]
mod tests {
    use super::testing::MemStore;
    use super::*;

    fn insert(text: &str, worker: &str) -> Op {
        Op::Insert {
            pool: Pool::Regular,
            model: "m".into(),
            worker: worker.into(),
            text: text.into(),
        }
    }

    #[test]
    fn ops_round_trip_and_garbage_is_rejected() {
        for op in [
            insert("héllo 日本", "w0"),
            Op::RemoveWorker {
                pool: Pool::Decode,
                worker: "w9".into(),
            },
            Op::Evict,
        ] {
            assert_eq!(Op::decode(&op.encode()), Some(op));
        }
        let mut bytes = insert("x", "w").encode();
        bytes.push(0);
        assert_eq!(Op::decode(&bytes), None, "trailing bytes");
        assert_eq!(Op::decode(&[1, 7]), None, "bad pool");
        assert_eq!(Op::decode(&[]), None);
        assert_eq!(
            Op::decode(&[1, 0, 255, 255, 255, 255]),
            None,
            "length past the end"
        );
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_text("abc", 10), "abc");
        assert_eq!(truncate_text("abc", 2), "ab");
        assert_eq!(truncate_text("日本", 4), "日", "3-byte char kept whole");
        assert_eq!(truncate_text("日本", 2), "");
    }

    #[test]
    fn appended_ops_are_read_in_order_by_every_reader() {
        let store = MemStore::default();
        let ring = OpRing::new("t", 8);
        ring.init_if_missing(&store);
        for i in 0..5 {
            assert_eq!(
                ring.append(&store, &insert(&format!("t{i}"), "w").encode()),
                Ok(i)
            );
        }
        let mut cursor = 0;
        let mut seen = Vec::new();
        let c = ring.catch_up(&store, &mut cursor, |seq, op| seen.push((seq, op)));
        assert_eq!(
            c,
            CatchUp {
                applied: 5,
                gaps: 0
            }
        );
        assert_eq!(cursor, 5);
        assert_eq!(seen[3], (3, insert("t3", "w")));
        let again = ring.catch_up(&store, &mut cursor, |_, _| panic!("nothing new"));
        assert_eq!(again, CatchUp::default());
    }

    #[test]
    fn a_reader_a_ring_behind_counts_the_gap() {
        let store = MemStore::default();
        let ring = OpRing::new("t", 4);
        ring.init_if_missing(&store);
        for i in 0..10 {
            ring.append(&store, &insert(&format!("t{i}"), "w").encode())
                .unwrap();
        }
        let mut cursor = 0;
        let mut seqs = Vec::new();
        let c = ring.catch_up(&store, &mut cursor, |seq, _| seqs.push(seq));
        assert_eq!(
            c,
            CatchUp {
                applied: 4,
                gaps: 6
            }
        );
        assert_eq!(seqs, vec![6, 7, 8, 9], "only what the ring still holds");
    }

    #[test]
    fn a_writer_that_stalled_after_its_slot_write_is_helped() {
        let store = MemStore::default();
        let ring = OpRing::new("t", 4);
        ring.init_if_missing(&store);
        // Simulate a writer that wrote slot 0 with seq 0 and died before the head.
        let mut v = 0u64.to_le_bytes().to_vec();
        v.extend(insert("stalled", "w").encode());
        store.set("t.ring.slot.0", &v, 0);
        assert_eq!(ring.append(&store, &insert("next", "w").encode()), Ok(1));
        let mut cursor = 0;
        let mut texts = Vec::new();
        ring.catch_up(&store, &mut cursor, |_, op| {
            if let Op::Insert { text, .. } = op {
                texts.push(text)
            }
        });
        assert_eq!(texts, vec!["stalled", "next"]);
    }

    #[test]
    fn init_does_not_wipe_a_live_ring() {
        let store = MemStore::default();
        let ring = OpRing::new("t", 4);
        ring.init_if_missing(&store);
        ring.append(&store, &Op::Evict.encode()).unwrap();
        ring.init_if_missing(&store);
        assert_eq!(ring.head(&store), Some(1));
    }

    #[test]
    fn a_larger_ring_adds_slots_and_keeps_the_stream() {
        let store = MemStore::default();
        OpRing::new("t", 2).init_if_missing(&store);
        let small = OpRing::new("t", 2);
        small.append(&store, &Op::Evict.encode()).unwrap();
        let big = OpRing::new("t", 8);
        big.init_if_missing(&store);
        assert_eq!(big.head(&store), Some(1), "the head survives");
        for _ in 0..6 {
            big.append(&store, &Op::Evict.encode()).unwrap();
        }
        assert_eq!(big.head(&store), Some(7));
    }

    #[test]
    fn append_without_init_is_unavailable() {
        let store = MemStore::default();
        let ring = OpRing::new("t", 4);
        assert_eq!(
            ring.append(&store, &Op::Evict.encode()),
            Err(AppendError::Unavailable)
        );
    }

    #[test]
    fn inflight_counts_add_and_saturate() {
        let store = MemStore::default();
        let t = InflightTable::new("t");
        assert!(t.read(&store).is_empty());
        assert!(t.add(&store, "w0", 1));
        assert!(t.add(&store, "w0", 1));
        assert!(t.add(&store, "w1", 1));
        assert_eq!(
            t.read(&store),
            vec![("w0".to_string(), 2), ("w1".to_string(), 1)]
        );
        assert!(t.add(&store, "w1", -1));
        assert!(t.add(&store, "w1", -1), "never below zero");
        assert_eq!(t.read(&store), vec![("w0".to_string(), 2)]);
    }

    #[test]
    fn eviction_is_claimed_once_per_interval() {
        let store = MemStore::default();
        let c = EvictionClock::new("t");
        assert!(!c.claim(&store, 1000, 500), "first tick starts the clock");
        assert!(!c.claim(&store, 1499, 500));
        assert!(c.claim(&store, 1500, 500));
        assert!(
            !c.claim(&store, 1500, 500),
            "the same interval is claimed once"
        );
        assert!(c.claim(&store, 2000, 500));
    }
}
