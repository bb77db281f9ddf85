//! The ZMQ messages vLLM's and SGLang's `ZmqEventPublisher` send, decoded.
//!
//! Both engines define the same msgspec structs (`EventBatch`, `BlockStored`,
//! `BlockRemoved`, `AllBlocksCleared`) and encode them with
//! `msgspec.msgpack.Encoder()`, but the encoding moved under consumers' feet:
//!
//! * the batch is a positional array `[ts, events, dp_rank]` in every release
//!   looked at (`array_like=True`; msgspec never omits defaults from an array, so
//!   `dp_rank` is always there, nil when unset);
//! * each event was a positional array headed by its tag
//!   (`["BlockStored", hashes, parent, ...]`) up to vLLM 0.20 and SGLang 0.5.2, and
//!   is a map with a `"type"` key (`{"type": "BlockStored", "block_hashes": ...}`)
//!   in vLLM 0.25+ and SGLang 0.5.23, with fields at their default omitted
//!   (`omit_defaults=True`) and unknown keys ignored, as msgspec ignores them;
//! * block hashes are 64-bit ints (vLLM's default, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`;
//!   always in SGLang, where they are signed) or raw digest bytes (vLLM with that
//!   variable set to 0).
//!
//! So the decoder accepts a batch and each event in either form, and a hash as
//! either kind, rather than pinning one engine release.

use std::fmt;

use crate::value::Value;

/// One PUB message: `[topic, seq, payload]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Message {
    /// The publisher's `topic` setting, UTF-8 in practice but sent as raw bytes;
    /// empty by default.
    pub topic: Vec<u8>,
    /// Dense per publisher (one per DP rank), starting at 0; a gap means lost batches
    /// that the replay socket can resend, a step back means the publisher restarted.
    pub seq: u64,
    /// The decoded payload.
    pub batch: EventBatch,
}

/// `EventBatch` / `KVEventBatch`.
#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    /// Seconds since the epoch (`time.time()`) on the engine when the batch was made.
    pub ts: f64,
    /// In the order the engine's cache changed.
    pub events: Vec<Event>,
    /// vLLM's `data_parallel_rank`, SGLang's `attn_dp_rank`: both publishers fill it
    /// in, but older engines and other producers may leave it out.
    pub data_parallel_rank: Option<i64>,
}

/// One change to an engine's KV cache.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// Boxed: it is ten times the size of the others, which would set the size of
    /// every element of `EventBatch::events`.
    BlockStored(Box<BlockStored>),
    BlockRemoved(BlockRemoved),
    /// The engine dropped its whole cache (`reset_prefix_cache`, weight reload...).
    AllBlocksCleared,
}

/// A block hash as the engine published it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockHash {
    /// A msgpack integer, kept as its 64-bit pattern: vLLM sends unsigned values
    /// (the digest's last 8 bytes), SGLang signed ones (the digest's first 8 bytes),
    /// and a negative msgpack int is stored as its two's complement so that both
    /// read as the digest bytes big-endian. Use [`BlockHash::as_i64`] for SGLang's
    /// signed view.
    Int(u64),
    /// A msgpack bin: the whole digest (32 bytes for SHA-256), sent by vLLM with
    /// `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`.
    Bytes(Vec<u8>),
}

impl BlockHash {
    /// SGLang publishes its hashes as signed 64-bit ints.
    pub fn from_i64(v: i64) -> Self {
        BlockHash::Int(v as u64)
    }

    /// The signed view SGLang uses; `None` for byte hashes.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            BlockHash::Int(v) => Some(*v as i64),
            BlockHash::Bytes(_) => None,
        }
    }
}

/// The tokens of the stored blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenIds {
    /// One id per position: every engine but the case below.
    Ids(Vec<u32>),
    /// SGLang's bigram keys (EAGLE speculative decoding) publish each position as
    /// the pair `(token[i], token[i + 1])`.
    Bigrams(Vec<[u32; 2]>),
}

impl BlockStored {
    /// A store of `block_hashes` after `parent_block_hash`, with no field the caller
    /// did not name: every optional one unset, as an engine leaves out a default.
    pub fn new(
        block_hashes: Vec<BlockHash>,
        parent_block_hash: Option<BlockHash>,
        token_ids: TokenIds,
        block_size: u64,
    ) -> BlockStored {
        BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id: None,
            medium: None,
            lora_name: None,
            extra_keys: None,
            group_idx: None,
            kv_cache_spec_kind: None,
            kv_cache_spec_sliding_window: None,
            locality: None,
            ownership: None,
            session_id: None,
            lookahead_token_ids: None,
            cache_salt: None,
        }
    }
}

impl TokenIds {
    /// The plain ids, unless the pages are bigram pages.
    pub fn ids(&self) -> Option<&[u32]> {
        match self {
            TokenIds::Ids(v) => Some(v),
            TokenIds::Bigrams(_) => None,
        }
    }

    /// Positions covered.
    pub fn len(&self) -> usize {
        match self {
            TokenIds::Ids(v) => v.len(),
            TokenIds::Bigrams(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `BlockStored`: the union of both engines' fields; absent ones are `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockStored {
    /// One per block, in chain order; each block's parent is the one before it, the
    /// first one's is [`BlockStored::parent_block_hash`].
    pub block_hashes: Vec<BlockHash>,
    /// `None` when the first block starts a sequence.
    pub parent_block_hash: Option<BlockHash>,
    /// The tokens of all the blocks, concatenated.
    pub token_ids: TokenIds,
    /// Tokens per block. SGLang sets it per event, and its last page may be short.
    pub block_size: u64,
    /// vLLM's adapter id (deprecated there in favour of `lora_name`); SGLang sends nil.
    pub lora_id: Option<i64>,
    /// Where the blocks live: `"GPU"`, `"CPU"`, `"STORAGE"` (vLLM), `"GPU"`,
    /// `"CPU_PINNED"`, `"DISK"`, `"EXTERNAL"` (SGLang); `None` means GPU on old engines.
    pub medium: Option<String>,
    /// The adapter's public name.
    pub lora_name: Option<String>,
    /// vLLM: per block, the extra keys of its hash in the *published* (untagged)
    /// form: LoRA name, `[mm_identifier, offset]` pairs, cache salt, prompt-embeds
    /// digest. From vLLM 0.34 these are not the exact hash input (which tags each
    /// key and adds the LoRA path), see [`crate::vllm::KeyStyle`].
    pub extra_keys: Option<Vec<Option<Vec<Value>>>>,
    /// vLLM's KV cache group (hybrid models have several).
    pub group_idx: Option<i64>,
    pub kv_cache_spec_kind: Option<String>,
    pub kv_cache_spec_sliding_window: Option<i64>,
    /// vLLM: `"LOCAL"` or `"REMOTE"` relative to the publisher.
    pub locality: Option<String>,
    /// vLLM: the secondary offloading tier that produced the event.
    pub ownership: Option<String>,
    /// The session that triggered the store (attribution only).
    pub session_id: Option<String>,
    /// vLLM with lookahead hashing: per block, the tokens after it that its hash covers.
    pub lookahead_token_ids: Option<Vec<Vec<u32>>>,
    /// SGLang: the salt of the request that stored the blocks (already folded
    /// into the hashes).
    pub cache_salt: Option<String>,
}

/// `BlockRemoved`.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockRemoved {
    pub block_hashes: Vec<BlockHash>,
    pub medium: Option<String>,
    pub group_idx: Option<i64>,
    pub locality: Option<String>,
    pub ownership: Option<String>,
}

/// What went wrong, and where in the message.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// A PUB message has 3 frames; a replay reply 2 to 4.
    FrameCount { expected: &'static str, got: usize },
    /// The sequence frame is not 8 bytes.
    SeqLength(usize),
    /// The sequence number is -1 (`END_SEQ`): the end of a replay, not a batch.
    EndOfReplay,
    /// The payload is not one msgpack value (truncated, or nested deeper than any
    /// engine nests).
    Msgpack(String),
    /// Bytes left after the batch.
    TrailingBytes(usize),
    /// A value of the wrong kind; `path` is like `events[2].block_hashes[0]`.
    Shape {
        path: String,
        expected: &'static str,
        found: &'static str,
    },
    /// A field with no default is absent.
    MissingField { path: String, field: &'static str },
    /// An event tag this decoder does not know (a newer engine's event type).
    UnknownTag { path: String, tag: String },
    /// An integer that does not fit where it goes (a token id past `u32`...).
    OutOfRange { path: String },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::FrameCount { expected, got } => {
                write!(f, "expected {expected} frames, got {got}")
            }
            DecodeError::SeqLength(n) => write!(f, "sequence frame has {n} bytes, expected 8"),
            DecodeError::EndOfReplay => write!(f, "end-of-replay marker (seq -1), not a batch"),
            DecodeError::Msgpack(e) => write!(f, "payload is not valid msgpack: {e}"),
            DecodeError::TrailingBytes(n) => write!(f, "{n} bytes after the batch"),
            DecodeError::Shape {
                path,
                expected,
                found,
            } => {
                write!(f, "{path}: expected {expected}, found {found}")
            }
            DecodeError::MissingField { path, field } => {
                write!(f, "{path}: missing field {field}")
            }
            DecodeError::UnknownTag { path, tag } => {
                write!(f, "{path}: unknown event type {tag:?}")
            }
            DecodeError::OutOfRange { path } => write!(f, "{path}: integer out of range"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// The sequence number both publishers send as the end of a replay.
pub const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// Deep enough for every shape the engines send (the deepest is an mm extra key:
/// batch, events, event, extra_keys, block, key, string) with room for new fields,
/// and shallow enough that hostile nesting cannot exhaust a small thread stack.
const MAX_DEPTH: usize = 32;

/// Decodes one message from the PUB socket.
pub fn decode_message(frames: &[&[u8]]) -> Result<Message, DecodeError> {
    let [topic, seq, payload] = frames else {
        return Err(DecodeError::FrameCount {
            expected: "3",
            got: frames.len(),
        });
    };
    let seq = decode_seq(seq)?.ok_or(DecodeError::EndOfReplay)?;
    Ok(Message {
        topic: topic.to_vec(),
        seq,
        batch: decode_batch(payload)?,
    })
}

/// One reply to a replay request.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplayReply {
    /// A buffered batch, with the seq it was first published under.
    Batch(Message),
    /// Nothing more buffered: the replay is over.
    End,
}

/// Decodes one reply from the replay (ROUTER) socket.
///
/// The publisher sends `[identity, "", topic, seq, payload]` (vLLM 0.34, SGLang
/// 0.5.23) or `[identity, "", seq, payload]` (older releases), ending with seq -1
/// and an empty payload. A DEALER receives it without the identity, a REQ socket
/// also without the empty delimiter, so the last two frames are always seq and
/// payload and the topic is the frame before them when there are four.
pub fn decode_replay_reply(frames: &[&[u8]]) -> Result<ReplayReply, DecodeError> {
    let (topic, seq, payload) = match frames {
        [_delimiter, topic, seq, payload] => (*topic, *seq, *payload),
        [topic_or_delimiter, seq, payload] => (*topic_or_delimiter, *seq, *payload),
        [seq, payload] => (&[][..], *seq, *payload),
        _ => {
            return Err(DecodeError::FrameCount {
                expected: "2 to 4",
                got: frames.len(),
            })
        }
    };
    match decode_seq(seq)? {
        None => Ok(ReplayReply::End),
        Some(seq) => Ok(ReplayReply::Batch(Message {
            topic: topic.to_vec(),
            seq,
            batch: decode_batch(payload)?,
        })),
    }
}

/// The single frame a replay request carries after the empty delimiter: the first
/// seq wanted, 8 bytes big-endian.
pub fn replay_request(start_seq: u64) -> [u8; 8] {
    start_seq.to_be_bytes()
}

/// `None` for the end-of-replay marker.
fn decode_seq(frame: &[u8]) -> Result<Option<u64>, DecodeError> {
    let bytes: [u8; 8] = frame
        .try_into()
        .map_err(|_| DecodeError::SeqLength(frame.len()))?;
    if bytes == END_SEQ {
        return Ok(None);
    }
    Ok(Some(u64::from_be_bytes(bytes)))
}

/// Decodes a payload frame alone.
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut rd = payload;
    let value = rmpv::decode::read_value_with_max_depth(&mut rd, MAX_DEPTH)
        .map_err(|e| DecodeError::Msgpack(e.to_string()))?;
    if !rd.is_empty() {
        return Err(DecodeError::TrailingBytes(rd.len()));
    }
    batch(&value, &Path::Root)
}

/// Where a value sits in the message; turned into text only for an error, so a
/// good message costs no allocation for it.
enum Path<'a> {
    Root,
    Field(&'a Path<'a>, &'a str),
    Index(&'a Path<'a>, usize),
}

impl fmt::Display for Path<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Path::Root => write!(f, "batch"),
            Path::Field(Path::Root, name) => write!(f, "{name}"),
            Path::Field(parent, name) => write!(f, "{parent}.{name}"),
            Path::Index(parent, i) => write!(f, "{parent}[{i}]"),
        }
    }
}

fn kind(v: &rmpv::Value) -> &'static str {
    match v {
        rmpv::Value::Nil => "nil",
        rmpv::Value::Boolean(_) => "bool",
        rmpv::Value::Integer(_) => "int",
        rmpv::Value::F32(_) | rmpv::Value::F64(_) => "float",
        rmpv::Value::String(_) => "str",
        rmpv::Value::Binary(_) => "bin",
        rmpv::Value::Array(_) => "array",
        rmpv::Value::Map(_) => "map",
        rmpv::Value::Ext(..) => "ext",
    }
}

fn shape(path: &Path, expected: &'static str, v: &rmpv::Value) -> DecodeError {
    DecodeError::Shape {
        path: path.to_string(),
        expected,
        found: kind(v),
    }
}

fn batch(v: &rmpv::Value, path: &Path) -> Result<EventBatch, DecodeError> {
    let (ts, events, rank) = match v {
        // msgspec ignores trailing elements it has no field for; so do we.
        rmpv::Value::Array(items) => {
            let mut it = items.iter();
            let ts = it.next().ok_or_else(|| missing(path, "ts"))?;
            let events = it.next().ok_or_else(|| missing(path, "events"))?;
            (ts, events, it.next())
        }
        // No release sends a map, but a struct without `array_like` would.
        rmpv::Value::Map(pairs) => {
            let (mut ts, mut events, mut rank) = (None, None, None);
            for (k, v) in pairs {
                match k.as_str() {
                    Some("ts") => ts = Some(v),
                    Some("events") => events = Some(v),
                    Some("data_parallel_rank" | "attn_dp_rank") => rank = Some(v),
                    _ => {}
                }
            }
            (
                ts.ok_or_else(|| missing(path, "ts"))?,
                events.ok_or_else(|| missing(path, "events"))?,
                rank,
            )
        }
        other => return Err(shape(path, "array or map", other)),
    };
    let ts = float(ts, &Path::Field(path, "ts"))?;
    let events_path = Path::Field(path, "events");
    let rmpv::Value::Array(items) = events else {
        return Err(shape(&events_path, "array", events));
    };
    let events = items
        .iter()
        .enumerate()
        .map(|(i, e)| event(e, &Path::Index(&events_path, i)))
        .collect::<Result<_, _>>()?;
    let rank_path = Path::Field(path, "data_parallel_rank");
    let data_parallel_rank = rank.map(|r| opt(r, &rank_path, int)).transpose()?.flatten();
    Ok(EventBatch {
        ts,
        events,
        data_parallel_rank,
    })
}

fn missing(path: &Path, field: &'static str) -> DecodeError {
    DecodeError::MissingField {
        path: path.to_string(),
        field,
    }
}

/// The fields of an event, wherever the encoding put them.
enum Fields<'v> {
    /// After the tag, in declaration order.
    Positional(&'v [rmpv::Value]),
    Named(&'v [(rmpv::Value, rmpv::Value)]),
}

impl<'v> Fields<'v> {
    /// `position` counts from 0 after the tag, in vLLM's declaration order: the
    /// order every array-encoded release shares for the fields it has.
    fn get(&self, name: &str, position: usize) -> Option<&'v rmpv::Value> {
        match self {
            Fields::Positional(items) => items.get(position),
            Fields::Named(pairs) => pairs
                .iter()
                .rev()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v),
        }
    }
}

fn event(v: &rmpv::Value, path: &Path) -> Result<Event, DecodeError> {
    let tag_path = Path::Field(path, "type");
    let (tag, fields) = match v {
        rmpv::Value::Array(items) => match items.split_first() {
            Some((tag, rest)) => (tag, Fields::Positional(rest)),
            None => return Err(missing(path, "type")),
        },
        rmpv::Value::Map(pairs) => {
            let tag = pairs
                .iter()
                .find(|(k, _)| k.as_str() == Some("type"))
                .map(|(_, v)| v)
                .ok_or_else(|| missing(path, "type"))?;
            (tag, Fields::Named(pairs))
        }
        other => return Err(shape(path, "array or map", other)),
    };
    let tag = string(tag, &tag_path)?;
    match tag.as_str() {
        "BlockStored" => block_stored(&fields, &Path::Field(path, "BlockStored"))
            .map(|s| Event::BlockStored(Box::new(s))),
        "BlockRemoved" => {
            block_removed(&fields, &Path::Field(path, "BlockRemoved")).map(Event::BlockRemoved)
        }
        "AllBlocksCleared" => Ok(Event::AllBlocksCleared),
        _ => Err(DecodeError::UnknownTag {
            path: path.to_string(),
            tag,
        }),
    }
}

type Decode<T> = fn(&rmpv::Value, &Path) -> Result<T, DecodeError>;

fn required<'v, T>(
    fields: &Fields<'v>,
    path: &Path,
    name: &'static str,
    position: usize,
    decode: Decode<T>,
) -> Result<T, DecodeError> {
    let v = fields
        .get(name, position)
        .ok_or_else(|| missing(path, name))?;
    decode(v, &Path::Field(path, name))
}

/// Absent and nil both mean `None`: msgspec omits defaults and writes `None` as nil.
fn optional<'v, T>(
    fields: &Fields<'v>,
    path: &Path,
    name: &'static str,
    position: usize,
    decode: Decode<T>,
) -> Result<Option<T>, DecodeError> {
    match fields.get(name, position) {
        None => Ok(None),
        Some(v) => opt(v, &Path::Field(path, name), decode),
    }
}

fn opt<T>(v: &rmpv::Value, path: &Path, decode: Decode<T>) -> Result<Option<T>, DecodeError> {
    match v {
        rmpv::Value::Nil => Ok(None),
        v => decode(v, path).map(Some),
    }
}

fn block_stored(f: &Fields, p: &Path) -> Result<BlockStored, DecodeError> {
    Ok(BlockStored {
        block_hashes: required(f, p, "block_hashes", 0, hashes)?,
        // No default in any release, but nothing is lost by reading absence as None.
        parent_block_hash: optional(f, p, "parent_block_hash", 1, block_hash)?,
        token_ids: required(f, p, "token_ids", 2, token_ids)?,
        block_size: required(f, p, "block_size", 3, uint)?,
        lora_id: optional(f, p, "lora_id", 4, int)?,
        medium: optional(f, p, "medium", 5, string)?,
        lora_name: optional(f, p, "lora_name", 6, string)?,
        extra_keys: optional(f, p, "extra_keys", 7, extra_keys)?,
        group_idx: optional(f, p, "group_idx", 8, int)?,
        kv_cache_spec_kind: optional(f, p, "kv_cache_spec_kind", 9, string)?,
        kv_cache_spec_sliding_window: optional(f, p, "kv_cache_spec_sliding_window", 10, int)?,
        locality: optional(f, p, "locality", 11, string)?,
        ownership: optional(f, p, "ownership", 12, string)?,
        session_id: optional(f, p, "session_id", 13, string)?,
        lookahead_token_ids: optional(f, p, "lookahead_token_ids", 14, token_lists)?,
        // SGLang only, and SGLang has sent maps since it had this field.
        cache_salt: optional(f, p, "cache_salt", usize::MAX, string)?,
    })
}

fn block_removed(f: &Fields, p: &Path) -> Result<BlockRemoved, DecodeError> {
    Ok(BlockRemoved {
        block_hashes: required(f, p, "block_hashes", 0, hashes)?,
        medium: optional(f, p, "medium", 1, string)?,
        group_idx: optional(f, p, "group_idx", 2, int)?,
        locality: optional(f, p, "locality", 3, string)?,
        ownership: optional(f, p, "ownership", 4, string)?,
    })
}

fn array<'v>(v: &'v rmpv::Value, path: &Path) -> Result<&'v [rmpv::Value], DecodeError> {
    match v {
        rmpv::Value::Array(items) => Ok(items),
        other => Err(shape(path, "array", other)),
    }
}

fn list<T>(v: &rmpv::Value, path: &Path, decode: Decode<T>) -> Result<Vec<T>, DecodeError> {
    array(v, path)?
        .iter()
        .enumerate()
        .map(|(i, item)| decode(item, &Path::Index(path, i)))
        .collect()
}

fn hashes(v: &rmpv::Value, path: &Path) -> Result<Vec<BlockHash>, DecodeError> {
    list(v, path, block_hash)
}

fn block_hash(v: &rmpv::Value, path: &Path) -> Result<BlockHash, DecodeError> {
    match v {
        rmpv::Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Ok(BlockHash::Int(u)),
            (None, Some(s)) => Ok(BlockHash::from_i64(s)),
            (None, None) => Err(DecodeError::OutOfRange {
                path: path.to_string(),
            }),
        },
        rmpv::Value::Binary(b) => Ok(BlockHash::Bytes(b.clone())),
        other => Err(shape(path, "int or bin", other)),
    }
}

fn token_ids(v: &rmpv::Value, path: &Path) -> Result<TokenIds, DecodeError> {
    let items = array(v, path)?;
    if let Some(rmpv::Value::Array(_)) = items.first() {
        return list(v, path, bigram).map(TokenIds::Bigrams);
    }
    list(v, path, token).map(TokenIds::Ids)
}

fn bigram(v: &rmpv::Value, path: &Path) -> Result<[u32; 2], DecodeError> {
    match array(v, path)? {
        [a, b] => Ok([
            token(a, &Path::Index(path, 0))?,
            token(b, &Path::Index(path, 1))?,
        ]),
        _ => Err(DecodeError::Shape {
            path: path.to_string(),
            expected: "pair",
            found: "array",
        }),
    }
}

fn token(v: &rmpv::Value, path: &Path) -> Result<u32, DecodeError> {
    let u = uint(v, path)?;
    u32::try_from(u).map_err(|_| DecodeError::OutOfRange {
        path: path.to_string(),
    })
}

fn token_lists(v: &rmpv::Value, path: &Path) -> Result<Vec<Vec<u32>>, DecodeError> {
    list(v, path, |v, p| list(v, p, token))
}

fn extra_keys(v: &rmpv::Value, path: &Path) -> Result<Vec<Option<Vec<Value>>>, DecodeError> {
    list(v, path, |v, p| opt(v, p, |v, p| list(v, p, any)))
}

fn any(v: &rmpv::Value, path: &Path) -> Result<Value, DecodeError> {
    Ok(match v {
        rmpv::Value::Nil => Value::Nil,
        rmpv::Value::Boolean(b) => Value::Bool(*b),
        rmpv::Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => Value::Int(u.into()),
            (None, Some(s)) => Value::Int(s.into()),
            (None, None) => {
                return Err(DecodeError::OutOfRange {
                    path: path.to_string(),
                })
            }
        },
        rmpv::Value::F32(x) => Value::Float((*x).into()),
        rmpv::Value::F64(x) => Value::Float(*x),
        rmpv::Value::String(_) => Value::Str(string(v, path)?),
        rmpv::Value::Binary(b) => Value::Bin(b.clone()),
        rmpv::Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, x)| any(x, &Path::Index(path, i)))
                .collect::<Result<_, _>>()?,
        ),
        rmpv::Value::Map(pairs) => Value::Map(
            pairs
                .iter()
                .enumerate()
                .map(|(i, (k, x))| {
                    let p = Path::Index(path, i);
                    Ok((any(k, &p)?, any(x, &p)?))
                })
                .collect::<Result<_, DecodeError>>()?,
        ),
        rmpv::Value::Ext(ty, data) => Value::Ext(*ty, data.clone()),
    })
}

fn string(v: &rmpv::Value, path: &Path) -> Result<String, DecodeError> {
    match v {
        rmpv::Value::String(s) => match s.as_str() {
            Some(s) => Ok(s.to_owned()),
            None => Err(DecodeError::Shape {
                path: path.to_string(),
                expected: "str",
                found: "invalid UTF-8",
            }),
        },
        other => Err(shape(path, "str", other)),
    }
}

fn uint(v: &rmpv::Value, path: &Path) -> Result<u64, DecodeError> {
    match v {
        rmpv::Value::Integer(i) => i.as_u64().ok_or_else(|| DecodeError::OutOfRange {
            path: path.to_string(),
        }),
        other => Err(shape(path, "int", other)),
    }
}

fn int(v: &rmpv::Value, path: &Path) -> Result<i64, DecodeError> {
    match v {
        rmpv::Value::Integer(i) => i.as_i64().ok_or_else(|| DecodeError::OutOfRange {
            path: path.to_string(),
        }),
        other => Err(shape(path, "int", other)),
    }
}

/// msgspec writes a Python float as float64; an int is accepted because msgspec
/// accepts one for a float field too.
fn float(v: &rmpv::Value, path: &Path) -> Result<f64, DecodeError> {
    match v {
        rmpv::Value::F64(x) => Ok(*x),
        rmpv::Value::F32(x) => Ok((*x).into()),
        rmpv::Value::Integer(i) => match (i.as_i64(), i.as_u64()) {
            (Some(s), _) => Ok(s as f64),
            (None, Some(u)) => Ok(u as f64),
            (None, None) => Err(DecodeError::OutOfRange {
                path: path.to_string(),
            }),
        },
        other => Err(shape(path, "float", other)),
    }
}
