//! Tree operations as they travel between VMs through the operation ring: insert a
//! routing text under a worker, or evict (issued by one VM per interval). Workers
//! are named, not indexed, so VMs momentarily on different config versions still
//! agree. The encoding is a tag byte plus length-prefixed fields; decoding never
//! panics and refuses unknown tags and trailing bytes. An insert imported from a peer
//! replica (`crate::replica`) has its own tag: every VM applies it like a local one,
//! but the replica export skips it, so no operation travels back to where it came
//! from.

use super::{put_bytes, Reader};
use crate::config::Pool;

const TAG_INSERT: u8 = 1;
const TAG_EVICT: u8 = 3;
const TAG_PEER_INSERT: u8 = 4;

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

impl Op {
    pub fn encode(&self) -> Vec<u8> {
        self.encode_tagged(TAG_INSERT)
    }

    /// The encoding of an operation imported from a peer replica: applied like any
    /// other, never exported again (only inserts travel between replicas; each
    /// replica evicts on its own clock).
    pub fn encode_imported(&self) -> Vec<u8> {
        self.encode_tagged(TAG_PEER_INSERT)
    }

    fn encode_tagged(&self, insert_tag: u8) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            Op::Insert {
                pool,
                model,
                worker,
                text,
            } => {
                out.push(insert_tag);
                out.push(pool_code(*pool));
                put_bytes(&mut out, model.as_bytes());
                put_bytes(&mut out, worker.as_bytes());
                put_bytes(&mut out, text.as_bytes());
            }
            Op::Evict => out.push(TAG_EVICT),
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<Op> {
        let mut r = Reader(bytes);
        let op = match r.u8()? {
            TAG_INSERT | TAG_PEER_INSERT => Op::Insert {
                pool: pool_of(r.u8()?)?,
                model: r.string()?,
                worker: r.string()?,
                text: r.string()?,
            },
            TAG_EVICT => Op::Evict,
            // Anything else (tag 2 was a worker removal that nothing ever recorded:
            // reconfiguration remaps tenants instead) is not an operation.
            _ => return None,
        };
        r.0.is_empty().then_some(op)
    }
}

/// Whether encoded `bytes` are an insert routed by this replica (not a peer's, not
/// an eviction): what the replica export carries.
pub fn is_local_insert(bytes: &[u8]) -> bool {
    bytes.first() == Some(&TAG_INSERT)
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
    text.get(..n).unwrap_or_default()
}

/// An insert of `text` under `worker` (regular pool, model `m`), for tests.
#[cfg(test)]
pub(crate) fn insert_op(text: &str, worker: &str) -> Op {
    Op::Insert {
        pool: Pool::Regular,
        model: "m".into(),
        worker: worker.into(),
        text: text.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_round_trip_and_garbage_is_rejected() {
        for op in [insert_op("héllo 日本", "w0"), Op::Evict] {
            assert_eq!(Op::decode(&op.encode()), Some(op));
        }
        let mut bytes = insert_op("x", "w").encode();
        bytes.push(0);
        assert_eq!(Op::decode(&bytes), None, "trailing bytes");
        assert_eq!(Op::decode(&[1, 7]), None, "bad pool");
        assert_eq!(Op::decode(&[]), None);
        assert_eq!(Op::decode(&[2, 0, 1, 0, 0, 0, b'w']), None, "retired tag");
        assert_eq!(Op::decode(&[9]), None, "unknown tag");
        assert_eq!(
            Op::decode(&[1, 0, 255, 255, 255, 255]),
            None,
            "length past the end"
        );
    }

    #[test]
    fn imported_inserts_apply_alike_but_are_not_local() {
        let op = insert_op("t", "w");
        assert_eq!(Op::decode(&op.encode_imported()), Some(op.clone()));
        assert!(is_local_insert(&op.encode()));
        assert!(!is_local_insert(&op.encode_imported()), "echo");
        assert!(!is_local_insert(&Op::Evict.encode()));
    }

    #[test]
    fn truncation_respects_char_boundaries() {
        assert_eq!(truncate_text("abc", 10), "abc");
        assert_eq!(truncate_text("abc", 2), "ab");
        assert_eq!(truncate_text("日本", 4), "日", "3-byte char kept whole");
        assert_eq!(truncate_text("日本", 2), "");
    }
}
