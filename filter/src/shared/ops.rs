//! Tree operations as they travel between VMs through the operation ring: insert a
//! routing text under a worker, forget such an insert (its request was never served),
//! evict (issued by one VM per interval), or swap the worker list (discovery mode:
//! joins, leaves and removals, whose tenants go with them). Workers are named, not indexed, so VMs momentarily on different config
//! versions still agree. The encoding is a tag byte plus length-prefixed fields;
//! decoding never panics and refuses unknown tags and trailing bytes. An insert
//! imported from a peer replica (`crate::background::replica`) has its own tag: every VM applies
//! it like a local one, but the replica export skips it, so no operation travels back
//! to where it came from.

use super::membership::{pool_code, pool_of, Membership};
use super::{put_bytes, Reader};
use crate::config::Pool;
use crate::request::kv_bounds::KvUpdate;

pub(super) const TAG_INSERT: u8 = 1;
const TAG_EVICT: u8 = 3;
const TAG_MEMBERSHIP: u8 = 4;
const TAG_PEER_INSERT: u8 = 5;
const TAG_FORGET: u8 = 6;
const TAG_KV_BOUND: u8 = 7;

/// One tree operation, as it travels between VMs. Workers are named, not indexed,
/// so VMs that are momentarily on different config versions still agree. Its texts
/// are owned (`Op`, as recorded) or borrowed from the ring slot they were read from
/// (`OpRef`, as another VM's are applied: a copy of every routed text, and three
/// allocations, spared on every thread that replays it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op<S = String> {
    Insert {
        pool: Pool,
        model: S,
        worker: S,
        text: S,
    },
    /// Undoes the insert of sequence `seq` (`text` under `worker`), whose request
    /// no engine served: the worker keeps the first `keep_chars` chars it held
    /// before (`crate::tree::Tree::forget`). Local to this replica: a peer applied
    /// the insert at another sequence of its own, so it is never exported.
    Forget {
        pool: Pool,
        model: S,
        worker: S,
        text: S,
        keep_chars: u64,
        seq: u64,
    },
    /// Periodic eviction, issued by one VM per interval so all evict at the same
    /// point of the stream.
    Evict,
    /// Discovery mode: the worker list from this point of the stream on (applied
    /// only if newer than the VM's). Workers it lacks lose their tenants, in every
    /// VM at the same point, so trees stay identical.
    Membership(Membership),
    /// What `worker`'s engine can hold from this point of the stream on
    /// (`crate::request::kv_bounds`), issued by one VM per interval. Local to this
    /// replica, as eviction is.
    KvBound {
        pool: Pool,
        worker: S,
        update: KvUpdate,
    },
}

/// An operation read in place from the bytes it was decoded from.
pub type OpRef<'a> = Op<&'a str>;

impl<S> Op<S> {
    /// The `Forget` that undoes this insert (applied at the clock of `seq`, its
    /// worker holding `keep_chars` of the text before); other operations have none.
    pub fn into_forget(self, keep_chars: u64, seq: u64) -> Option<Op<S>> {
        match self {
            Op::Insert {
                pool,
                model,
                worker,
                text,
            } => Some(Op::Forget {
                pool,
                model,
                worker,
                text,
                keep_chars,
                seq,
            }),
            _ => None,
        }
    }

    /// The operation `bytes` encode, each of its texts made by `text` from the
    /// bytes. Refuses unknown tags and trailing bytes.
    pub fn decode_with<'a>(bytes: &'a [u8], text: impl Fn(&'a str) -> S) -> Option<Self> {
        let mut r = Reader(bytes);
        let op = match r.u8()? {
            TAG_INSERT | TAG_PEER_INSERT => {
                let (pool, model, worker, t) = text_fields(&mut r)?;
                Op::Insert {
                    pool,
                    model: text(model),
                    worker: text(worker),
                    text: text(crate::scan::utf8(t)?),
                }
            }
            TAG_FORGET => {
                let (pool, model, worker, t) = text_fields(&mut r)?;
                Op::Forget {
                    pool,
                    model: text(model),
                    worker: text(worker),
                    text: text(crate::scan::utf8(t)?),
                    keep_chars: r.u64()?,
                    seq: r.u64()?,
                }
            }
            TAG_EVICT => Op::Evict,
            TAG_KV_BOUND => Op::KvBound {
                pool: pool_of(r.u8()?)?,
                worker: text(r.str()?),
                update: KvUpdate {
                    capacity_tokens: r.u64()?,
                    chars_per_token_milli: r.u64()?,
                    anchor_tokens: r.u64()?,
                    anchor_ms: r.u64()?,
                    cleared: match r.u8()? {
                        0 => false,
                        1 => true,
                        _ => return None,
                    },
                },
            },
            TAG_MEMBERSHIP => Op::Membership(Membership::decode_from(&mut r)?),
            // Anything else (tag 2 was a single worker's removal, which a whole list
            // replaced: it cannot express a join or a worker's leaving grace) is not
            // an operation.
            _ => return None,
        };
        r.0.is_empty().then_some(op)
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
        let mut out = Vec::with_capacity(self.encoded_len());
        self.encode_tagged_into(insert_tag, &mut out);
        out
    }

    /// An upper bound of the encoding's length: a routing text is kilobytes, and a
    /// buffer growing to it reallocates.
    pub(super) fn encoded_len(&self) -> usize {
        let fields = |m: &str, w: &str, t: &str| 2 + 12 + m.len() + w.len() + t.len();
        match self {
            Op::Insert {
                model,
                worker,
                text,
                ..
            } => fields(model, worker, text),
            Op::Forget {
                model,
                worker,
                text,
                ..
            } => fields(model, worker, text) + 16,
            Op::KvBound { worker, .. } => 2 + 4 + worker.len() + 33,
            _ => 16,
        }
    }

    /// Appends the encoding (`encode`'s) to `out`.
    pub(super) fn encode_into(&self, out: &mut Vec<u8>) {
        self.encode_tagged_into(TAG_INSERT, out)
    }
}

impl<S: AsRef<str>> Op<S> {
    pub(super) fn encode_tagged_into(&self, insert_tag: u8, out: &mut Vec<u8>) {
        match self {
            Op::Insert {
                pool,
                model,
                worker,
                text,
            } => {
                out.push(insert_tag);
                out.push(pool_code(*pool));
                put_bytes(out, model.as_ref().as_bytes());
                put_bytes(out, worker.as_ref().as_bytes());
                put_bytes(out, text.as_ref().as_bytes());
            }
            Op::Forget {
                pool,
                model,
                worker,
                text,
                keep_chars,
                seq,
            } => {
                out.push(TAG_FORGET);
                out.push(pool_code(*pool));
                put_bytes(out, model.as_ref().as_bytes());
                put_bytes(out, worker.as_ref().as_bytes());
                put_bytes(out, text.as_ref().as_bytes());
                out.extend_from_slice(&keep_chars.to_le_bytes());
                out.extend_from_slice(&seq.to_le_bytes());
            }
            Op::Evict => out.push(TAG_EVICT),
            Op::KvBound {
                pool,
                worker,
                update,
            } => {
                out.push(TAG_KV_BOUND);
                out.push(pool_code(*pool));
                put_bytes(out, worker.as_ref().as_bytes());
                out.extend_from_slice(&update.capacity_tokens.to_le_bytes());
                out.extend_from_slice(&update.chars_per_token_milli.to_le_bytes());
                out.extend_from_slice(&update.anchor_tokens.to_le_bytes());
                out.extend_from_slice(&update.anchor_ms.to_le_bytes());
                out.push(u8::from(update.cleared));
            }
            Op::Membership(m) => {
                out.push(TAG_MEMBERSHIP);
                m.encode_into(out);
            }
        }
    }
}

impl<'a> OpRef<'a> {
    /// The operation `bytes` encode (`Op::encode`), its texts borrowed from them.
    pub fn decode(bytes: &'a [u8]) -> Option<Self> {
        Op::decode_with(bytes, |s| s)
    }
}

/// An operation as a VM applies it from the ring: an insert's text as its bytes,
/// which the tree taking it checks as UTF-8 only past what it already holds of it
/// (`crate::tree::Tree::insert_bytes`), any other operation decoded whole.
#[derive(Debug, PartialEq)]
pub enum Incoming<'a> {
    Insert {
        pool: Pool,
        model: &'a str,
        worker: &'a str,
        text: &'a [u8],
    },
    Other(OpRef<'a>),
}

impl<'a> Incoming<'a> {
    /// The operation `bytes` encode, as `OpRef::decode` refuses them.
    pub fn decode(bytes: &'a [u8]) -> Option<Self> {
        let mut r = Reader(bytes);
        if !matches!(r.u8()?, TAG_INSERT | TAG_PEER_INSERT) {
            return OpRef::decode(bytes).map(Incoming::Other);
        }
        let (pool, model, worker, text) = text_fields(&mut r)?;
        let insert = Incoming::Insert {
            pool,
            model,
            worker,
            text,
        };
        r.0.is_empty().then_some(insert)
    }
}

/// The fields an insert and a forget begin with: the pool, the model, the worker
/// and the text, the text's bytes left for the caller to check as UTF-8.
fn text_fields<'a>(r: &mut Reader<'a>) -> Option<(Pool, &'a str, &'a str, &'a [u8])> {
    Some((pool_of(r.u8()?)?, r.str()?, r.str()?, r.bytes()?))
}

/// Whether encoded `bytes` are an insert routed by this replica (not a peer's, not
/// an eviction, not a forget): what the replica export carries.
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
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn decode(bytes: &[u8]) -> Option<Op> {
        Op::decode_with(bytes, str::to_owned)
    }

    #[test]
    fn an_insert_turns_into_its_forget_and_nothing_else_does() {
        assert_eq!(
            insert_op("hello", "w1").into_forget(2, 9),
            Some(Op::Forget {
                pool: Pool::Regular,
                model: "m".into(),
                worker: "w1".into(),
                text: "hello".into(),
                keep_chars: 2,
                seq: 9,
            })
        );
        assert_eq!(Op::<String>::Evict.into_forget(2, 9), None);
    }

    #[test]
    fn incoming_keeps_an_inserts_text_as_bytes_and_decodes_the_rest_whole() {
        let insert = insert_op("héllo", "w1");
        let expected = Incoming::Insert {
            pool: Pool::Regular,
            model: "m",
            worker: "w1",
            text: "héllo".as_bytes(),
        };
        assert_eq!(Incoming::decode(&insert.encode()), Some(expected));
        let imported = insert.encode_imported();
        assert!(matches!(
            Incoming::decode(&imported),
            Some(Incoming::Insert { worker: "w1", .. })
        ));
        // The text is left to the tree to check; the names are not.
        let mut stray = insert.encode();
        if let Some(last) = stray.last_mut() {
            *last = 0xff;
        }
        assert!(matches!(
            Incoming::decode(&stray),
            Some(Incoming::Insert {
                text: [.., 0xff],
                ..
            })
        ));
        let mut bad_name = insert_op("x", "w\u{e9}").encode();
        if let Some(at) = bad_name.iter().position(|&b| b == 0xc3) {
            bad_name[at] = 0xff;
        }
        assert_eq!(Incoming::decode(&bad_name), None);
        let mut trailing = insert.encode();
        trailing.push(0);
        assert_eq!(Incoming::decode(&trailing), None);
        assert_eq!(Incoming::decode(&[]), None);
        let forget = insert.into_forget(2, 9).unwrap().encode();
        assert_eq!(
            Incoming::decode(&forget),
            OpRef::decode(&forget).map(Incoming::Other)
        );
        let evict = Op::Evict.encode();
        assert_eq!(Incoming::decode(&evict), Some(Incoming::Other(Op::Evict)));
    }

    #[test]
    fn ops_round_trip_and_garbage_is_rejected() {
        let members: Vec<crate::config::WorkerConfig> =
            serde_json::from_str(r#"[{"name":"w0","address":"10.0.0.1:8000"},{"name":"w1"}]"#)
                .unwrap();
        let membership = Op::Membership(Membership {
            version: 9,
            workers: members,
        });
        let forget = Op::Forget {
            pool: Pool::Decode,
            model: "m".into(),
            worker: "w1".into(),
            text: "héllo 日本".into(),
            keep_chars: 3,
            seq: 41,
        };
        for op in [
            insert_op("héllo 日本", "w0"),
            Op::Evict,
            membership.clone(),
            forget.clone(),
        ] {
            assert_eq!(decode(&op.encode()), Some(op));
        }
        let mut bytes = membership.encode();
        bytes.push(0);
        assert_eq!(decode(&bytes), None, "trailing bytes after a list");
        let bytes = forget.encode();
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), None, "a forget cut at {cut}");
        }
        assert!(!is_local_insert(&bytes), "a forget is never exported");
        let bound = Op::KvBound {
            pool: Pool::Prefill,
            worker: "w\u{e9}".into(),
            update: KvUpdate {
                capacity_tokens: 65536,
                chars_per_token_milli: 3906,
                anchor_tokens: u64::MAX,
                anchor_ms: 1_700_000_000_000,
                cleared: true,
            },
        };
        let bytes = bound.encode();
        assert_eq!(decode(&bytes), Some(bound));
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), None, "a bound cut at {cut}");
        }
        assert!(!is_local_insert(&bytes), "a bound is never exported");
        let mut not_a_flag = bytes.clone();
        if let Some(last) = not_a_flag.last_mut() {
            *last = 2;
        }
        assert_eq!(decode(&not_a_flag), None, "cleared is 0 or 1");
        assert_eq!(decode(&[4, 1, 0]), None, "a cut list");
        let mut bytes = insert_op("x", "w").encode();
        bytes.push(0);
        assert_eq!(decode(&bytes), None, "trailing bytes");
        assert_eq!(decode(&[1, 7]), None, "bad pool");
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[2, 0, 1, 0, 0, 0, b'w']), None, "retired tag");
        assert_eq!(decode(&[9]), None, "unknown tag");
        assert_eq!(
            decode(&[1, 0, 255, 255, 255, 255]),
            None,
            "length past the end"
        );
    }

    #[test]
    fn imported_inserts_apply_alike_but_are_not_local() {
        let op = insert_op("t", "w");
        assert_eq!(decode(&op.encode_imported()), Some(op.clone()));
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
