//! Several Envoy replicas, one router: the bridge endpoint's core.
//!
//! Each replica's bridge (`llm-bridge`, a native process beside Envoy: the filter
//! cannot open sockets) polls `GET <replicas.path>?after=SEQ` for the operations
//! this replica's threads recorded in the ring since `SEQ`, publishes the batch on
//! the bus, and posts the batches of its peers to `POST <replicas.path>?replica=ID`.
//! Both take the stats token.
//!
//! - Export carries local inserts only: imported inserts have their own ring tag
//!   (`Op::encode_imported`) and are skipped, so an operation never travels back to
//!   where it came from (no echo loops); evictions stay home (each replica evicts on
//!   its own clock). A batch holds at most `batch_limit` operations and about
//!   `max_bytes` bytes, each text cut to a quarter of that; texts are front-coded
//!   (each stores only what differs from the previous one's prefix: a conversation's
//!   turns and a shared system prompt travel once per batch). `next` is the cursor
//!   to ask from next time and `gaps` the operations the ring overwrote before the
//!   bridge read them.
//! - A batch also carries this replica's in-flight counts by worker; an import
//!   stores them as that peer's report (`crate::shared::PeerLoads`), which the load
//!   view adds to its own until it expires. A replayed batch (a late joiner's
//!   catch-up) brings operations only: its counts are history.
//! - Import checks the whole batch before anything is stored; inserts naming a
//!   worker this replica does not configure are skipped and counted (replicas in a
//!   rollout may differ), everything else malformed is a 400 and changes nothing.

use crate::config::WorkerConfig;
use crate::shared::{
    is_local_insert, pool_code, pool_of, put_bytes, truncate_text, Op, OpRef, OpRing, Reader,
    SharedStore,
};

/// The batch encoding's version byte.
pub const BATCH_VERSION: u8 = 1;
/// In-flight entries a batch may carry (more is not a real fleet).
pub const MAX_BATCH_WORKERS: usize = 4096;
/// Ring entries read per step of an export, so a full batch stops reading soon.
const EXPORT_STEP: u64 = 32;
/// The longest replica id (bridges use host names or pod names).
pub const MAX_REPLICA_ID: usize = 128;

/// One exported or imported batch.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Batch {
    /// The cursor to export from next time.
    pub next: u64,
    /// Operations the ring overwrote before they were exported.
    pub gaps: u64,
    /// The exporting replica's in-flight requests by worker name.
    pub inflight: Vec<(String, u64)>,
    /// Inserts only.
    pub ops: Vec<Op>,
}

/// What a request to the replicas endpoint asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Export { after: u64 },
    Import { replica: String, replay: bool },
}

/// Why a replicas request was refused; maps to its HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReplicaError {
    Unauthorized,
    /// Too many failed token checks lately (the push endpoint's lockout, shared).
    LockedOut {
        retry_after_s: u64,
    },
    MethodNotAllowed,
    TooLarge {
        limit: usize,
    },
    BadRequest(String),
}

impl ReplicaError {
    pub fn status(&self) -> u32 {
        match self {
            ReplicaError::Unauthorized => 401,
            ReplicaError::LockedOut { .. } => 429,
            ReplicaError::MethodNotAllowed => 405,
            ReplicaError::TooLarge { .. } => 413,
            ReplicaError::BadRequest(_) => 400,
        }
    }

    pub fn reason(&self) -> String {
        match self {
            ReplicaError::Unauthorized => "missing or wrong bearer token".into(),
            ReplicaError::LockedOut { retry_after_s } => {
                format!("too many failed token checks: locked out for {retry_after_s} s")
            }
            ReplicaError::MethodNotAllowed => "the replicas endpoint takes GET or POST".into(),
            ReplicaError::TooLarge { limit } => format!("batch larger than {limit} bytes"),
            ReplicaError::BadRequest(r) => r.clone(),
        }
    }
}

fn bad(reason: impl Into<String>) -> ReplicaError {
    ReplicaError::BadRequest(reason.into())
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn valid_replica_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REPLICA_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
}

/// `None` when `path` is not the replicas endpoint (`endpoint`, query ignored). The
/// method is asked for only on that path: every request passes here, and reading it
/// is a hostcall that copies into the VM.
pub fn request_of(
    method: impl FnOnce() -> String,
    path: &str,
    endpoint: &str,
) -> Option<Result<Request, ReplicaError>> {
    let (route, query) = path.split_once('?').unwrap_or((path, ""));
    if route != endpoint {
        return None;
    }
    Some(match method().as_str() {
        "GET" => query_param(query, "after")
            .and_then(|v| v.parse::<u64>().ok())
            .map(|after| Request::Export { after })
            .ok_or_else(|| bad("GET needs `after=<sequence number>`")),
        "POST" => match query_param(query, "replica") {
            Some(id) if valid_replica_id(id) => Ok(Request::Import {
                replica: id.to_string(),
                replay: query_param(query, "replay") == Some("1"),
            }),
            _ => Err(bad(format!(
                "POST needs `replica=<id>` (1 to {MAX_REPLICA_ID} of A-Z a-z 0-9 - _ .)"
            ))),
        },
        _ => Err(ReplicaError::MethodNotAllowed),
    })
}

fn common_prefix(a: &str, b: &str) -> usize {
    let mut n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    while n > 0 && !b.is_char_boundary(n) {
        n -= 1;
    }
    n
}

/// The size an insert adds to a batch after `prev_text`.
fn encoded_op_len(op: &Op, prev_text: &str) -> usize {
    match op {
        Op::Insert {
            model,
            worker,
            text,
            ..
        } => {
            1 + 4 + model.len() + 4 + worker.len() + 4 + 4 + text.len()
                - common_prefix(prev_text, text)
        }
        Op::Forget { .. } | Op::Evict | Op::Membership(_) | Op::KvBound { .. } => 0,
    }
}

impl Batch {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![BATCH_VERSION];
        out.extend_from_slice(&self.next.to_le_bytes());
        out.extend_from_slice(&self.gaps.to_le_bytes());
        out.extend_from_slice(&(self.inflight.len() as u32).to_le_bytes());
        for (name, n) in &self.inflight {
            put_bytes(&mut out, name.as_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
        let inserts: Vec<_> = self
            .ops
            .iter()
            .filter_map(|op| match op {
                Op::Insert {
                    pool,
                    model,
                    worker,
                    text,
                } => Some((pool, model, worker, text)),
                Op::Forget { .. } | Op::Evict | Op::Membership(_) | Op::KvBound { .. } => None,
            })
            .collect();
        out.extend_from_slice(&(inserts.len() as u32).to_le_bytes());
        let mut prev = "";
        for (pool, model, worker, text) in inserts {
            out.push(pool_code(*pool));
            put_bytes(&mut out, model.as_bytes());
            put_bytes(&mut out, worker.as_bytes());
            let shared = common_prefix(prev, text);
            out.extend_from_slice(&(shared as u32).to_le_bytes());
            put_bytes(&mut out, text.get(shared..).unwrap_or_default().as_bytes());
            prev = text;
        }
        out
    }

    /// Decodes a whole batch of at most `max_ops` inserts, or says what is wrong.
    pub fn decode(bytes: &[u8], max_ops: usize) -> Result<Batch, ReplicaError> {
        let mut r = Reader(bytes);
        let truncated = || bad("batch truncated");
        match r.u8() {
            Some(BATCH_VERSION) => {}
            Some(v) => {
                return Err(bad(format!(
                    "batch version {v} (this filter reads {BATCH_VERSION})"
                )))
            }
            None => return Err(bad("empty batch")),
        }
        let next = r.u64().ok_or_else(truncated)?;
        let gaps = r.u64().ok_or_else(truncated)?;
        let n = r.u32().ok_or_else(truncated)? as usize;
        if n > MAX_BATCH_WORKERS {
            return Err(bad(format!(
                "more than {MAX_BATCH_WORKERS} in-flight entries"
            )));
        }
        let mut inflight = Vec::new();
        for _ in 0..n {
            let name = r.string().ok_or_else(|| bad("bad in-flight entry"))?;
            let count = r.u64().ok_or_else(truncated)?;
            inflight.push((name, count));
        }
        let n = r.u32().ok_or_else(truncated)? as usize;
        if n > max_ops {
            return Err(bad(format!("more than {max_ops} operations in one batch")));
        }
        let mut ops: Vec<Op> = Vec::new();
        for i in 0..n {
            let pool = r
                .u8()
                .and_then(pool_of)
                .ok_or_else(|| bad(format!("operation {i}: bad pool")))?;
            let (Some(model), Some(worker)) = (r.string(), r.string()) else {
                return Err(bad(format!("operation {i}: bad model or worker")));
            };
            let shared = r.u32().ok_or_else(truncated)? as usize;
            let suffix = r
                .string()
                .ok_or_else(|| bad(format!("operation {i}: bad text")))?;
            let prev = match ops.last() {
                Some(Op::Insert { text, .. }) => text.as_str(),
                _ => "",
            };
            let Some(head) = prev.get(..shared) else {
                return Err(bad(format!(
                    "operation {i}: shares {shared} bytes with a text of {}",
                    prev.len()
                )));
            };
            ops.push(Op::Insert {
                pool,
                model,
                worker,
                text: format!("{head}{suffix}"),
            });
        }
        if !r.0.is_empty() {
            return Err(bad("trailing bytes after the batch"));
        }
        Ok(Batch {
            next,
            gaps,
            inflight,
            ops,
        })
    }
}

/// Reads this replica's own inserts from the ring from `after` on: at most
/// `max_ops`, about `max_bytes` encoded (texts cut to a quarter of it), and the
/// cursor to ask from next (`now_ms` times a slot not yet written: `OpRing::walk`).
pub fn export(
    ring: &OpRing,
    store: &dyn SharedStore,
    after: u64,
    now_ms: u64,
    max_ops: usize,
    max_bytes: usize,
    inflight: Vec<(String, u64)>,
) -> Batch {
    let max_text = max_bytes / 4;
    // A cursor past the head is from before this Envoy restarted (its ring began
    // again at 0): read the new ring from its oldest operation.
    let restarted = ring.head(store).is_some_and(|head| after > head);
    let mut cursor = if restarted { 0 } else { after };
    let mut ops: Vec<Op> = Vec::new();
    let mut bytes = 1 + 8 + 8 + 4 + 4;
    let mut full_at: Option<u64> = None;
    // The sequence being read, and where its operations begin in `ops`.
    let mut current = (u64::MAX, 0);
    let mut gaps = 0;
    while full_at.is_none() && ops.len() < max_ops {
        let step = EXPORT_STEP.min((max_ops - ops.len()) as u64);
        let got = ring.walk(store, &mut cursor, step, now_ms, |seq, raw| {
            let Some(op) = OpRef::decode(raw) else {
                return false;
            };
            if full_at.is_some() {
                return true;
            }
            if seq != current.0 {
                current = (seq, ops.len());
            }
            if !is_local_insert(raw) {
                return true;
            }
            // A sequence holds a batch of operations: a step of sequences can
            // bring more than the operations left.
            if ops.len() >= max_ops {
                full_at = Some(seq);
                return true;
            }
            let Op::Insert {
                pool,
                model,
                worker,
                text,
            } = op
            else {
                return true;
            };
            let op = Op::Insert {
                pool,
                model: model.to_string(),
                worker: worker.to_string(),
                text: truncate_text(text, max_text).to_string(),
            };
            let prev = match ops.last() {
                Some(Op::Insert { text, .. }) => text.as_str(),
                _ => "",
            };
            let len = encoded_op_len(&op, prev);
            if !ops.is_empty() && bytes + len > max_bytes {
                full_at = Some(seq);
            } else {
                bytes += len;
                ops.push(op);
            }
            true
        });
        gaps += got.gaps;
        if got.applied + got.gaps == 0 {
            break;
        }
    }
    let next = match full_at {
        // The batch that did not fit is sent whole next time, so what was taken
        // of it goes back; when it is all there is, the rest of it is skipped.
        Some(seq) if current == (seq, 0) => seq.saturating_add(1),
        Some(seq) => {
            if current.0 == seq {
                ops.truncate(current.1);
            }
            seq
        }
        None => cursor,
    };
    Batch {
        next,
        gaps,
        inflight,
        ops,
    }
}

/// What an import records: the imported-tagged ring entries for the inserts whose
/// worker this replica knows (texts cut to `max_text` bytes), and how many were
/// skipped.
pub fn import(batch: &Batch, workers: &[WorkerConfig], max_text: usize) -> (Vec<Vec<u8>>, usize) {
    let mut entries = Vec::new();
    let mut skipped = 0;
    for op in &batch.ops {
        match op {
            Op::Insert {
                pool,
                model,
                worker,
                text,
            } if workers.iter().any(|w| w.name == *worker && w.pool == *pool) => {
                let op = Op::Insert {
                    pool: *pool,
                    model: model.clone(),
                    worker: worker.clone(),
                    text: truncate_text(text, max_text).to_string(),
                };
                entries.push(op.encode_imported());
            }
            _ => skipped += 1,
        }
    }
    (entries, skipped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::workers;
    use crate::config::Pool;
    use crate::shared::testing::{owned, ring, MemStore};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn insert(text: &str, worker: &str) -> Op {
        Op::Insert {
            pool: Pool::Regular,
            model: "m".into(),
            worker: worker.into(),
            text: text.into(),
        }
    }

    #[test]
    fn requests_are_recognised_by_path_method_and_query() {
        let ep = "/r";
        let request_of = |m: &str, p: &str, ep: &str| request_of(|| m.to_string(), p, ep);
        assert_eq!(request_of("GET", "/other?after=1", ep), None);
        assert_eq!(
            request_of("GET", "/r?after=12", ep),
            Some(Ok(Request::Export { after: 12 }))
        );
        assert_eq!(
            request_of("POST", "/r?replica=envoy-1.a&replay=1", ep),
            Some(Ok(Request::Import {
                replica: "envoy-1.a".into(),
                replay: true
            }))
        );
        let status = |m: &str, p: &str| request_of(m, p, ep).unwrap().unwrap_err().status();
        assert_eq!(status("GET", "/r"), 400, "no cursor");
        assert_eq!(status("GET", "/r?after=-1"), 400);
        assert_eq!(status("POST", "/r"), 400, "no replica id");
        assert_eq!(status("POST", "/r?replica=a%20b"), 400);
        assert_eq!(status("PUT", "/r?after=1"), 405);
    }

    #[test]
    fn the_method_is_read_only_on_the_replicas_path() {
        let asked = std::cell::Cell::new(false);
        let method = || {
            asked.set(true);
            "GET".to_string()
        };
        assert_eq!(request_of(method, "/v1/chat/completions", "/r"), None);
        assert!(!asked.get(), "the method (a hostcall) is read off the path");
        assert!(request_of(|| "GET".into(), "/r?after=1", "/r").is_some());
    }

    #[test]
    fn batches_round_trip_with_front_coded_texts() {
        let system = "You are a helpful assistant. ".repeat(20);
        let batch = Batch {
            next: 9,
            gaps: 2,
            inflight: vec![("w0".into(), 3)],
            ops: vec![
                insert(&format!("{system}hello"), "w0"),
                insert(&format!("{system}hello, again"), "w1"),
                insert("日本語", "w0"),
                insert("日本", "w1"),
            ],
        };
        let bytes = batch.encode();
        assert_eq!(Batch::decode(&bytes, 16), Ok(batch.clone()));
        let texts: usize = batch
            .ops
            .iter()
            .map(|op| match op {
                Op::Insert { text, .. } => text.len(),
                Op::Forget { .. } | Op::Evict | Op::Membership(_) | Op::KvBound { .. } => 0,
            })
            .sum();
        assert!(
            bytes.len() < texts / 2 + 200,
            "the shared system prompt travels once: {} bytes for {texts} of text",
            bytes.len()
        );
    }

    #[test]
    fn malformed_batches_are_refused_with_a_reason() {
        let good = Batch {
            ops: vec![insert("abc", "w0"), insert("abd", "w0")],
            ..Batch::default()
        }
        .encode();
        assert!(Batch::decode(&good, 2).is_ok());
        let reason = |b: &[u8], max: usize| Batch::decode(b, max).unwrap_err().reason();
        assert!(reason(&good, 1).contains("more than 1 operations"));
        assert!(reason(&[], 8).contains("empty"));
        assert!(reason(&[7], 8).contains("version 7"));
        assert!(reason(&good[..good.len() - 1], 8).contains("operation 1"));
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(reason(&trailing, 8).contains("trailing"));
        // The second op claims to share more than the first text holds.
        let mut over = good.clone();
        let at = over.len() - 4 - 1 - 4;
        over[at] = 9;
        assert!(reason(&over, 8).contains("shares 9 bytes"));
        // Sharing into the middle of a multi-byte char is refused, not a panic.
        let mut split = Batch {
            ops: vec![insert("日", "w0"), insert("日x", "w0")],
            ..Batch::default()
        }
        .encode();
        let at = split.len() - 4 - 1 - 4;
        split[at] = 1;
        assert!(Batch::decode(&split, 8).is_err());
    }

    #[test]
    fn export_carries_local_inserts_only_from_the_cursor() {
        let store = MemStore::default();
        let ring = ring(&store, 64);
        ring.append_one(&store, &insert("a", "w0").encode())
            .unwrap();
        ring.append_one(&store, &Op::Evict.encode()).unwrap();
        ring.append_one(&store, &insert("peer", "w1").encode_imported())
            .unwrap();
        ring.append_one(&store, &insert("b", "w1").encode())
            .unwrap();
        let all = export(&ring, &store, 0, 0, 16, 1 << 20, vec![("w0".into(), 1)]);
        assert_eq!(all.ops, vec![insert("a", "w0"), insert("b", "w1")]);
        assert_eq!((all.next, all.gaps), (4, 0));
        assert_eq!(all.inflight, vec![("w0".to_string(), 1)]);
        let later = export(&ring, &store, all.next, 0, 16, 1 << 20, Vec::new());
        assert!(later.ops.is_empty());
        assert_eq!(later.next, 4, "nothing new: the cursor stays");
        let from_two = export(&ring, &store, 2, 0, 16, 1 << 20, Vec::new());
        assert_eq!(from_two.ops, vec![insert("b", "w1")]);
    }

    #[test]
    fn a_batch_is_exported_whole_or_not_at_all_and_exactly_once() {
        let store = MemStore::default();
        let ring = ring(&store, 64);
        for b in 0..4 {
            let mut batch = crate::shared::Batch::default();
            for i in 0..3 {
                batch.push(&insert(&format!("batch {b} op {i}"), "w0"));
            }
            ring.append(&store, &batch).unwrap();
        }
        let first = export(&ring, &store, 0, 0, 4, 1 << 20, Vec::new());
        assert_eq!((first.ops.len(), first.next), (3, 1), "batch 1 did not fit");
        let mut cursor = 0;
        let mut texts = Vec::new();
        while cursor < 4 {
            let b = export(&ring, &store, cursor, 0, 4, 1 << 20, Vec::new());
            assert!(b.next > cursor, "every export makes progress");
            texts.extend(b.ops.into_iter().map(|op| match op {
                Op::Insert { text, .. } => text,
                other => panic!("{other:?}"),
            }));
            cursor = b.next;
        }
        let want: Vec<String> = (0..4)
            .flat_map(|b| (0..3).map(move |i| format!("batch {b} op {i}")))
            .collect();
        assert_eq!(texts, want, "every operation exported exactly once");
        // A batch larger than an export: what fits, and the rest skipped.
        let big = export(&ring, &store, 0, 0, 2, 1 << 20, Vec::new());
        assert_eq!((big.ops.len(), big.next), (2, 1));
    }

    #[test]
    fn export_is_bounded_and_resumes_where_it_stopped() {
        let store = MemStore::default();
        let ring = ring(&store, 64);
        for i in 0..10 {
            ring.append_one(
                &store,
                &insert(&format!("{i}{}", "x".repeat(100)), "w0").encode(),
            )
            .unwrap();
        }
        let first = export(&ring, &store, 0, 0, 4, 1 << 20, Vec::new());
        assert_eq!(
            (first.ops.len(), first.next),
            (4, 4),
            "at most 4 operations"
        );
        let small = export(&ring, &store, 0, 0, 16, 300, Vec::new());
        assert!(small.encode().len() <= 300 + 101, "about the byte budget");
        assert_eq!(
            small.next as usize,
            small.ops.len(),
            "resume after the last sent"
        );
        let mut cursor = 0;
        let mut seen = 0;
        while cursor < 10 {
            let b = export(&ring, &store, cursor, 0, 3, 300, Vec::new());
            assert!(b.next > cursor, "every export makes progress");
            seen += b.ops.len();
            cursor = b.next;
        }
        assert_eq!(seen, 10, "every operation exported exactly once");
        // A text larger than the budget is cut, never stuck.
        ring.append_one(&store, &insert(&"y".repeat(5000), "w0").encode())
            .unwrap();
        let big = export(&ring, &store, 10, 0, 16, 400, Vec::new());
        assert_eq!(big.next, 11);
        assert!(matches!(&big.ops[0], Op::Insert { text, .. } if text.len() == 100));
    }

    #[test]
    fn a_cursor_from_before_a_restart_reads_the_new_ring() {
        let store = MemStore::default();
        let ring = ring(&store, 64);
        ring.append_one(&store, &insert("after restart", "w0").encode())
            .unwrap();
        let b = export(&ring, &store, 5000, 0, 16, 1 << 20, Vec::new());
        assert_eq!(b.ops, vec![insert("after restart", "w0")]);
        assert_eq!(b.next, 1);
    }

    #[test]
    fn a_bridge_a_ring_behind_learns_the_gap() {
        let store = MemStore::default();
        let ring = ring(&store, 4);
        for i in 0..10 {
            ring.append_one(&store, &insert(&i.to_string(), "w0").encode())
                .unwrap();
        }
        let b = export(&ring, &store, 0, 0, 16, 1 << 20, Vec::new());
        assert_eq!((b.gaps, b.ops.len(), b.next), (6, 4, 10));
    }

    #[test]
    fn imports_apply_everywhere_and_never_echo() {
        let store = MemStore::default();
        let ring = ring(&store, 64);
        let batch = Batch {
            ops: vec![
                insert("from a peer", "w0"),
                insert("unknown worker", "w9"),
                Op::Insert {
                    pool: Pool::Prefill,
                    model: "m".into(),
                    worker: "w1".into(),
                    text: "wrong pool".into(),
                },
            ],
            ..Batch::default()
        };
        let (entries, skipped) = import(&batch, &workers(), 4);
        assert_eq!((entries.len(), skipped), (1, 2));
        for e in &entries {
            ring.append_one(&store, e).unwrap();
        }
        let mut cursor = 0;
        let mut applied = Vec::new();
        ring.catch_up(&store, &mut cursor, 0, |_, op| applied.push(owned(op)));
        assert_eq!(
            applied,
            vec![insert("from", "w0")],
            "every VM applies it (text cut to this replica's limit)"
        );
        let out = export(&ring, &store, 0, 0, 16, 1 << 20, Vec::new());
        assert!(out.ops.is_empty(), "an imported insert is never exported");
        assert_eq!(out.next, 1);
    }
}
