//! The publishing side: a batch encoded as vLLM 0.34's `ZmqEventPublisher` sends
//! it, the inverse of [`crate::decode_message`], and the replies of its replay
//! socket.
//!
//! vLLM encodes with `msgspec.msgpack.Encoder()`, and what msgspec writes is fixed
//! enough to match byte for byte:
//!
//! * the batch is `array_like`: `[ts, events, data_parallel_rank]`, every field
//!   written (an array never omits one), `ts` as float64, the rank nil when unset;
//! * an event is a map whose first key is the tag, `"type"`, followed by its
//!   fields in declaration order; a field that has a default (`= None` in the
//!   struct) is left out when it is `None` (`omit_defaults=True`), one without a
//!   default is written as nil;
//! * the map header is sized for every field the struct *could* write, then
//!   patched with the count written: `BlockStored` has 15 fields and the tag, so
//!   its header is always a map16 (`de 00 nn`) however few are written, while
//!   `BlockRemoved` (5 and the tag) and `AllBlocksCleared` get a fixmap;
//! * integers, strings, byte strings and arrays take their shortest form, and a
//!   non-negative integer an unsigned one (`cc`..`cf`), a negative one a signed
//!   one (`d0`..`d3`).
//!
//! Fields vLLM 0.34 does not have are written only when set, after its own:
//! SGLang's `cache_salt` (vLLM's decoder ignores unknown keys, as msgspec does).
//! Bigram token ids (SGLang's) are written as `[a, b]` pairs.
//!
//! Nothing here fails: every [`crate::Event`] has an encoding. The one value
//! msgpack cannot hold, a [`Value::Int`] outside `-2^63 ..= 2^64 - 1` (which no
//! decoder produces), is written as nil; msgspec would raise instead.

use crate::value::Value;
use crate::wire::{
    BlockHash, BlockRemoved, BlockStored, DecodeError, Event, EventBatch, TokenIds, END_SEQ,
};

/// Fields of vLLM 0.34's `BlockStored`, its tag included: past 15, msgspec's map
/// header is a map16 whatever is written.
const BLOCK_STORED_FIELDS: usize = 16;
/// `BlockRemoved`: `block_hashes`, `medium`, `group_idx`, `locality`, `ownership`
/// and the tag.
const BLOCK_REMOVED_FIELDS: usize = 6;

/// The three frames of one PUB message: `[topic, seq, payload]`, `seq` as 8 bytes
/// big-endian, as `ZmqEventPublisher` sends them.
pub fn encode_message(topic: &[u8], seq: u64, batch: &EventBatch) -> [Vec<u8>; 3] {
    [
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        encode_batch(batch),
    ]
}

/// The payload frame alone: the msgpack `KVEventBatch`.
pub fn encode_batch(batch: &EventBatch) -> Vec<u8> {
    let mut w = Writer(Vec::with_capacity(64 + batch.events.len() * 64));
    w.array_header(3);
    w.f64(batch.ts);
    w.array_header(batch.events.len());
    for event in &batch.events {
        w.event(event);
    }
    match batch.data_parallel_rank {
        Some(rank) => w.int(rank.into()),
        None => w.nil(),
    }
    w.0
}

/// The first seq a replay request asks for, from the frames a ROUTER socket
/// received after the sender's identity: `[delimiter, start_seq]`.
///
/// A DEALER sends those two frames, a REQ socket only the last and the empty
/// delimiter is added for it. vLLM reads `start_seq` with
/// `int.from_bytes(frame, "big")`, which takes any length: so does this, a value
/// past `u64` saturating (it is past every seq, and the reply is the end marker
/// alone). vLLM drops a request of any other frame count without a reply.
pub fn decode_replay_request(frames: &[&[u8]]) -> Result<u64, DecodeError> {
    let [_delimiter, start] = frames else {
        return Err(DecodeError::FrameCount {
            expected: "2",
            got: frames.len(),
        });
    };
    let significant = start
        .iter()
        .position(|&b| b != 0)
        .map_or(&[][..], |i| &start[i..]);
    if significant.len() > 8 {
        return Ok(u64::MAX);
    }
    Ok(significant
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b)))
}

/// One reply of the replay socket for a buffered batch, without the requester's
/// identity frame (prepend it to send on a ROUTER socket):
/// `["", topic, seq, payload]`, `payload` being the bytes first published.
pub fn encode_replay_reply(topic: &[u8], seq: u64, payload: &[u8]) -> [Vec<u8>; 4] {
    [
        Vec::new(),
        topic.to_vec(),
        seq.to_be_bytes().to_vec(),
        payload.to_vec(),
    ]
}

/// The reply that ends every replay, without the identity frame:
/// `["", "", END_SEQ, ""]` (vLLM 0.34 sends an empty topic there, whatever its
/// topic).
pub fn encode_replay_end() -> [Vec<u8>; 4] {
    [Vec::new(), Vec::new(), END_SEQ.to_vec(), Vec::new()]
}

/// A msgpack writer producing msgspec's shortest forms.
struct Writer(Vec<u8>);

impl Writer {
    fn nil(&mut self) {
        self.0.push(0xc0);
    }

    fn bool(&mut self, b: bool) {
        self.0.push(if b { 0xc3 } else { 0xc2 });
    }

    fn uint(&mut self, v: u64) {
        if v < 0x80 {
            self.0.push(v as u8);
        } else if v <= 0xff {
            self.0.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            self.0.push(0xcd);
            self.0.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            self.0.push(0xce);
            self.0.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.0.push(0xcf);
            self.0.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// Any integer msgpack can hold; nil for one it cannot (see the module docs).
    fn int(&mut self, v: i128) {
        if let Ok(u) = u64::try_from(v) {
            return self.uint(u);
        }
        let Ok(s) = i64::try_from(v) else {
            return self.nil();
        };
        // Negative from here on.
        if s >= -32 {
            self.0.push(s as i8 as u8);
        } else if s >= i64::from(i8::MIN) {
            self.0.extend_from_slice(&[0xd0, s as i8 as u8]);
        } else if s >= i64::from(i16::MIN) {
            self.0.push(0xd1);
            self.0.extend_from_slice(&(s as i16).to_be_bytes());
        } else if s >= i64::from(i32::MIN) {
            self.0.push(0xd2);
            self.0.extend_from_slice(&(s as i32).to_be_bytes());
        } else {
            self.0.push(0xd3);
            self.0.extend_from_slice(&s.to_be_bytes());
        }
    }

    fn f64(&mut self, x: f64) {
        self.0.push(0xcb);
        self.0.extend_from_slice(&x.to_be_bytes());
    }

    /// A length past `u32` cannot be written; such a value cannot be in memory
    /// on the machines this runs on, and is clamped rather than panicking.
    fn len32(n: usize) -> u32 {
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.0.push(0xa0 | n as u8);
        } else if n <= 0xff {
            self.0.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= 0xffff {
            self.0.push(0xda);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(0xdb);
            self.0.extend_from_slice(&Self::len32(n).to_be_bytes());
        }
        self.0.extend_from_slice(s.as_bytes());
    }

    fn bin(&mut self, b: &[u8]) {
        let n = b.len();
        if n <= 0xff {
            self.0.extend_from_slice(&[0xc4, n as u8]);
        } else if n <= 0xffff {
            self.0.push(0xc5);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(0xc6);
            self.0.extend_from_slice(&Self::len32(n).to_be_bytes());
        }
        self.0.extend_from_slice(b);
    }

    fn array_header(&mut self, n: usize) {
        if n < 16 {
            self.0.push(0x90 | n as u8);
        } else if n <= 0xffff {
            self.0.push(0xdc);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(0xdd);
            self.0.extend_from_slice(&Self::len32(n).to_be_bytes());
        }
    }

    fn map_header(&mut self, n: usize) {
        if n < 16 {
            self.0.push(0x80 | n as u8);
        } else if n <= 0xffff {
            self.0.push(0xde);
            self.0.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.0.push(0xdf);
            self.0.extend_from_slice(&Self::len32(n).to_be_bytes());
        }
    }

    fn ext(&mut self, ty: i8, data: &[u8]) {
        let n = data.len();
        match n {
            1 => self.0.push(0xd4),
            2 => self.0.push(0xd5),
            4 => self.0.push(0xd6),
            8 => self.0.push(0xd7),
            16 => self.0.push(0xd8),
            _ if n <= 0xff => self.0.extend_from_slice(&[0xc7, n as u8]),
            _ if n <= 0xffff => {
                self.0.push(0xc8);
                self.0.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.0.push(0xc9);
                self.0.extend_from_slice(&Self::len32(n).to_be_bytes());
            }
        }
        self.0.push(ty as u8);
        self.0.extend_from_slice(data);
    }

    fn value(&mut self, v: &Value) {
        match v {
            Value::Nil => self.nil(),
            Value::Bool(b) => self.bool(*b),
            Value::Int(i) => self.int(*i),
            Value::Float(x) => self.f64(*x),
            Value::Str(s) => self.str(s),
            Value::Bin(b) => self.bin(b),
            Value::Array(items) => {
                self.array_header(items.len());
                for item in items {
                    self.value(item);
                }
            }
            Value::Map(pairs) => {
                self.map_header(pairs.len());
                for (k, x) in pairs {
                    self.value(k);
                    self.value(x);
                }
            }
            Value::Ext(ty, data) => self.ext(*ty, data),
        }
    }

    fn hash(&mut self, h: &BlockHash) {
        match h {
            BlockHash::Int(v) => self.uint(*v),
            BlockHash::Bytes(b) => self.bin(b),
        }
    }

    fn hashes(&mut self, hashes: &[BlockHash]) {
        self.array_header(hashes.len());
        for h in hashes {
            self.hash(h);
        }
    }

    fn tokens(&mut self, ids: &[u32]) {
        self.array_header(ids.len());
        for &t in ids {
            self.uint(t.into());
        }
    }

    fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => self.str(s),
            None => self.nil(),
        }
    }

    fn opt_int(&mut self, v: Option<i64>) {
        match v {
            Some(v) => self.int(v.into()),
            None => self.nil(),
        }
    }

    fn event(&mut self, e: &Event) {
        match e {
            Event::BlockStored(s) => self.block_stored(s),
            Event::BlockRemoved(r) => self.block_removed(r),
            Event::AllBlocksCleared => {
                self.map_header(1);
                self.str("type");
                self.str("AllBlocksCleared");
            }
        }
    }

    /// Writes the map of a tagged struct: the header msgspec reserves for
    /// `all_fields`, then the tag and `write` (which returns how many of the
    /// optional fields it wrote), then the count patched into the header.
    fn tagged(
        &mut self,
        tag: &str,
        all_fields: usize,
        write: impl FnOnce(&mut Self) -> usize,
    ) -> usize {
        let at = self.0.len();
        self.map_header(all_fields);
        let header_len = self.0.len() - at;
        self.str("type");
        self.str(tag);
        let written = 1 + write(self);
        // Same header width, the real count: a fixmap when all_fields < 16, a map16
        // (or map32) otherwise.
        let mut header = Vec::with_capacity(5);
        match header_len {
            1 => header.push(0x80 | (written.min(15)) as u8),
            3 => {
                header.push(0xde);
                header.extend_from_slice(&(written.min(0xffff) as u16).to_be_bytes());
            }
            _ => {
                header.push(0xdf);
                header.extend_from_slice(&Self::len32(written).to_be_bytes());
            }
        }
        self.0[at..at + header_len].copy_from_slice(&header);
        written
    }

    fn block_stored(&mut self, s: &BlockStored) {
        // cache_salt is not a vLLM field: one more than vLLM's struct when set.
        let all = BLOCK_STORED_FIELDS + usize::from(s.cache_salt.is_some());
        self.tagged("BlockStored", all, |w| {
            // Fields without a default: always written.
            w.str("block_hashes");
            w.hashes(&s.block_hashes);
            w.str("parent_block_hash");
            match &s.parent_block_hash {
                Some(h) => w.hash(h),
                None => w.nil(),
            }
            w.str("token_ids");
            match &s.token_ids {
                TokenIds::Ids(ids) => w.tokens(ids),
                TokenIds::Bigrams(pairs) => {
                    w.array_header(pairs.len());
                    for pair in pairs {
                        w.tokens(pair);
                    }
                }
            }
            w.str("block_size");
            w.uint(s.block_size);
            w.str("lora_id");
            w.opt_int(s.lora_id);
            w.str("medium");
            w.opt_str(s.medium.as_deref());
            w.str("lora_name");
            w.opt_str(s.lora_name.as_deref());
            let mut n = 7;
            // Fields defaulting to None: written only when set.
            if let Some(blocks) = &s.extra_keys {
                w.str("extra_keys");
                w.array_header(blocks.len());
                for block in blocks {
                    match block {
                        Some(keys) => {
                            w.array_header(keys.len());
                            for k in keys {
                                w.value(k);
                            }
                        }
                        None => w.nil(),
                    }
                }
                n += 1;
            }
            n += w.opt_field_int("group_idx", s.group_idx);
            n += w.opt_field_str("kv_cache_spec_kind", s.kv_cache_spec_kind.as_deref());
            n += w.opt_field_int(
                "kv_cache_spec_sliding_window",
                s.kv_cache_spec_sliding_window,
            );
            n += w.opt_field_str("locality", s.locality.as_deref());
            n += w.opt_field_str("ownership", s.ownership.as_deref());
            n += w.opt_field_str("session_id", s.session_id.as_deref());
            if let Some(lists) = &s.lookahead_token_ids {
                w.str("lookahead_token_ids");
                w.array_header(lists.len());
                for ids in lists {
                    w.tokens(ids);
                }
                n += 1;
            }
            n += w.opt_field_str("cache_salt", s.cache_salt.as_deref());
            n
        });
    }

    fn block_removed(&mut self, r: &BlockRemoved) {
        self.tagged("BlockRemoved", BLOCK_REMOVED_FIELDS, |w| {
            w.str("block_hashes");
            w.hashes(&r.block_hashes);
            w.str("medium");
            w.opt_str(r.medium.as_deref());
            let mut n = 2;
            n += w.opt_field_int("group_idx", r.group_idx);
            n += w.opt_field_str("locality", r.locality.as_deref());
            n += w.opt_field_str("ownership", r.ownership.as_deref());
            n
        });
    }

    /// An `= None` field: 1 if written.
    fn opt_field_str(&mut self, name: &str, v: Option<&str>) -> usize {
        match v {
            Some(v) => {
                self.str(name);
                self.str(v);
                1
            }
            None => 0,
        }
    }

    fn opt_field_int(&mut self, name: &str, v: Option<i64>) -> usize {
        match v {
            Some(v) => {
                self.str(name);
                self.int(v.into());
                1
            }
            None => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer(Vec::new());
        f(&mut w);
        w.0
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    /// `msgspec.msgpack.Encoder().encode(["x"*31, "y"*32, "z"*300, b"a", 200, -33,
    /// 2**63, -2**63, 1.5, list(range(16))])` with msgspec 0.23.0, as a Value.
    #[test]
    fn scalars_take_msgspecs_forms() {
        let v = Value::Array(vec![
            Value::Str("x".repeat(31)),
            Value::Str("y".repeat(32)),
            Value::Str("z".repeat(300)),
            Value::Bin(b"a".to_vec()),
            Value::Int(200),
            Value::Int(-33),
            Value::Int(1 << 63),
            Value::Int(i64::MIN.into()),
            Value::Float(1.5),
            Value::Array((0..16).map(Value::Int).collect()),
        ]);
        let want = format!(
            "9abf{}d920{}da012c{}c40161ccc8d0dfcf8000000000000000d38000000000000000\
             cb3ff8000000000000dc0010000102030405060708090a0b0c0d0e0f",
            "78".repeat(31),
            "79".repeat(32),
            "7a".repeat(300)
        );
        assert_eq!(hex(&bytes(|w| w.value(&v))), want);
    }

    #[test]
    fn integers_at_every_boundary() {
        let cases: &[(i128, &str)] = &[
            (0, "00"),
            (127, "7f"),
            (128, "cc80"),
            (255, "ccff"),
            (256, "cd0100"),
            (65535, "cdffff"),
            (65536, "ce00010000"),
            (u32::MAX.into(), "ceffffffff"),
            (1 << 32, "cf0000000100000000"),
            (u64::MAX.into(), "cfffffffffffffffff"),
            (-1, "ff"),
            (-32, "e0"),
            (-33, "d0df"),
            (-128, "d080"),
            (-129, "d1ff7f"),
            (-32768, "d18000"),
            (-32769, "d2ffff7fff"),
            (i32::MIN.into(), "d280000000"),
            (i128::from(i32::MIN) - 1, "d3ffffffff7fffffff"),
            (i64::MIN.into(), "d38000000000000000"),
            // Past msgpack's range: nil rather than a panic.
            (i128::from(u64::MAX) + 1, "c0"),
            (i128::from(i64::MIN) - 1, "c0"),
        ];
        for &(v, want) in cases {
            assert_eq!(hex(&bytes(|w| w.int(v))), want, "{v}");
        }
    }

    #[test]
    fn long_containers_and_ext() {
        let b = bytes(|w| w.bin(&[7; 256]));
        assert_eq!(hex(&b[..3]), "c50100");
        let b = bytes(|w| w.array_header(70_000));
        assert_eq!(hex(&b), "dd00011170");
        let b = bytes(|w| w.map_header(16));
        assert_eq!(hex(&b), "de0010");
        assert_eq!(hex(&bytes(|w| w.ext(5, &[1, 2]))), "d5050102");
        assert_eq!(hex(&bytes(|w| w.ext(-1, &[1, 2, 3]))), "c703ff010203");
    }

    #[test]
    fn replay_requests_read_like_int_from_bytes() {
        let ask = |start: &[u8]| decode_replay_request(&[b"", start]);
        assert_eq!(ask(&7u64.to_be_bytes()), Ok(7));
        assert_eq!(ask(&[]), Ok(0));
        assert_eq!(ask(&[1, 0]), Ok(256));
        assert_eq!(ask(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 5]), Ok(5));
        assert_eq!(ask(&[1, 0, 0, 0, 0, 0, 0, 0, 0]), Ok(u64::MAX));
        assert_eq!(ask(&END_SEQ), Ok(u64::MAX));
        assert!(matches!(
            decode_replay_request(&[b"x"]),
            Err(DecodeError::FrameCount { got: 1, .. })
        ));
    }
}
