//! The membership table (discovery mode): the worker list the collector's pushes
//! built, with a version that grows by one per change, in one key. Writers change it
//! with CAS, so two pushes on two threads cannot both build on the same version; the
//! ring then carries the new list (`Op::Membership`) so every VM swaps at the same
//! point of the stream. The table is what a VM reads when it starts, when it fell
//! behind the ring, or on its tick, so a list is never lost with the ring's slots.
//!
//! Encoding (also the ring operation's body): the version, the count, then per
//! worker its fields length-prefixed, optional fields behind a 0/1 byte. Decoding
//! never panics and refuses anything malformed.

use super::{put_bytes, Keys, Reader, SetOutcome, SharedStore};
use crate::config::{Pool, WorkerConfig};

/// A worker list and its version (0: nothing pushed yet).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Membership {
    pub version: u64,
    pub workers: Vec<WorkerConfig>,
}

/// The shortest encoded worker: an empty name (4), the pool (1), no models (4) and
/// five absent optional fields (1 each).
const MIN_WORKER_BYTES: usize = 4 + 1 + 4 + 5;

pub(crate) fn pool_code(p: Pool) -> u8 {
    match p {
        Pool::Regular => 0,
        Pool::Prefill => 1,
        Pool::Decode => 2,
    }
}

pub(crate) fn pool_of(code: u8) -> Option<Pool> {
    match code {
        0 => Some(Pool::Regular),
        1 => Some(Pool::Prefill),
        2 => Some(Pool::Decode),
        _ => None,
    }
}

fn put_opt(out: &mut Vec<u8>, v: Option<&[u8]>) {
    match v {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_bytes(out, b);
        }
    }
}

fn opt<'a, T>(
    r: &mut Reader<'a>,
    read: impl FnOnce(&mut Reader<'a>) -> Option<T>,
) -> Option<Option<T>> {
    match r.u8()? {
        0 => Some(None),
        1 => read(r).map(Some),
        _ => None,
    }
}

impl Membership {
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.workers.len() as u32).to_le_bytes());
        for w in &self.workers {
            put_bytes(out, w.name.as_bytes());
            put_opt(out, w.cluster.as_deref().map(str::as_bytes));
            put_opt(out, w.address.as_deref().map(str::as_bytes));
            out.push(pool_code(w.pool));
            out.extend_from_slice(&(w.models.len() as u32).to_le_bytes());
            for m in &w.models {
                put_bytes(out, m.as_bytes());
            }
            put_opt(
                out,
                w.bootstrap_port
                    .map(u16::to_le_bytes)
                    .as_ref()
                    .map(|b| &b[..]),
            );
            put_opt(out, w.bootstrap_host.as_deref().map(str::as_bytes));
            put_opt(
                out,
                w.leaving_since_ms
                    .map(u64::to_le_bytes)
                    .as_ref()
                    .map(|b| &b[..]),
            );
        }
    }

    pub(crate) fn decode_from(r: &mut Reader<'_>) -> Option<Membership> {
        let version = r.u64()?;
        let n = r.u32()? as usize;
        // Every worker takes at least `MIN_WORKER_BYTES`: a count past what is left is
        // garbage, refused before anything is allocated for it.
        if n > r.0.len() / MIN_WORKER_BYTES {
            return None;
        }
        let mut workers = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.string()?;
            let cluster = opt(r, Reader::string)?;
            let address = opt(r, Reader::string)?;
            let pool = pool_of(r.u8()?)?;
            let m = r.u32()? as usize;
            if m > r.0.len() / 4 {
                return None;
            }
            let models = (0..m).map(|_| r.string()).collect::<Option<Vec<_>>>()?;
            let bootstrap_port = opt(r, |r| {
                r.u32()
                    .and_then(|n| (n == 2).then_some(()))
                    .and_then(|_| r.take(2))
                    .and_then(|b| b.try_into().ok())
                    .map(u16::from_le_bytes)
            })?;
            let bootstrap_host = opt(r, Reader::string)?;
            let leaving_since_ms = opt(r, |r| {
                r.u32()
                    .and_then(|n| (n == 8).then_some(()))
                    .and_then(|_| r.u64())
            })?;
            workers.push(WorkerConfig {
                name,
                cluster,
                address,
                pool,
                models,
                bootstrap_port,
                bootstrap_host,
                leaving_since_ms,
            });
        }
        Some(Membership { version, workers })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    /// The stored form back; `None` for anything malformed or with trailing bytes.
    pub fn decode(bytes: &[u8]) -> Option<Membership> {
        let mut r = Reader(bytes);
        let m = Membership::decode_from(&mut r)?;
        r.0.is_empty().then_some(m)
    }
}

/// The membership table in shared data.
#[derive(Debug, Clone)]
pub struct MembershipTable {
    key: String,
}

impl MembershipTable {
    pub fn new(keys: &Keys) -> MembershipTable {
        MembershipTable {
            key: keys.membership(),
        }
    }

    /// The stored list and the CAS to replace it with (none stored, or unreadable:
    /// version 0, no workers, CAS 0).
    pub fn read(&self, store: &dyn SharedStore) -> (Membership, u32) {
        store
            .get(&self.key)
            .and_then(|(v, cas)| Some((Membership::decode(&v)?, cas)))
            .unwrap_or_default()
    }

    /// Replaces the list if nobody did since `cas` was read.
    pub fn write(&self, store: &dyn SharedStore, m: &Membership, cas: u32) -> SetOutcome {
        store.set(&self.key, &m.encode(), cas)
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::MemStore;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn sample() -> Membership {
        let mut a: WorkerConfig =
            serde_json::from_str(r#"{"name":"a","cluster":"engine_a","models":["m1","m2"]}"#)
                .unwrap();
        a.leaving_since_ms = Some(77);
        let p: WorkerConfig = serde_json::from_str(
            r#"{"name":"p日","address":"10.0.0.1:8000","pool":"prefill","bootstrap_port":8998,"bootstrap_host":"h"}"#,
        )
        .unwrap();
        Membership {
            version: 3,
            workers: vec![a, p],
        }
    }

    #[test]
    fn lists_round_trip_and_garbage_is_refused() {
        let m = sample();
        let bytes = m.encode();
        assert_eq!(Membership::decode(&bytes), Some(m.clone()));
        let empty = Membership::default();
        assert_eq!(Membership::decode(&empty.encode()), Some(empty));
        let shortest = Membership {
            version: 1,
            workers: vec![serde_json::from_str(r#"{"name":""}"#).unwrap(); 50],
        };
        assert_eq!(
            Membership::decode(&shortest.encode()),
            Some(shortest.clone()),
            "the count guard lets the shortest workers through"
        );
        assert_eq!(shortest.encode().len(), 8 + 4 + 50 * MIN_WORKER_BYTES);
        for cut in 0..bytes.len() {
            assert_eq!(
                Membership::decode(&bytes[..cut]),
                None,
                "truncated at {cut}"
            );
        }
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert_eq!(Membership::decode(&trailing), None);
        let mut huge = 1u64.to_le_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            Membership::decode(&huge),
            None,
            "a count past the data allocates nothing"
        );
    }

    #[test]
    fn writes_are_conditional_on_the_version_read() {
        let store = MemStore::default();
        let t = MembershipTable::new(&Keys::new("t"));
        let (m0, cas0) = t.read(&store);
        assert_eq!((m0.version, m0.workers.len(), cas0), (0, 0, 0));
        let m = sample();
        assert_eq!(t.write(&store, &m, cas0), SetOutcome::Stored);
        let (got, cas1) = t.read(&store);
        assert_eq!(got, m);
        assert_eq!(t.write(&store, &m, cas1), SetOutcome::Stored);
        assert_eq!(
            t.write(&store, &m, cas1),
            SetOutcome::CasMismatch,
            "a writer that read an older version must read again"
        );
        assert!(store.map.borrow().contains_key("t.membership"));
    }
}
