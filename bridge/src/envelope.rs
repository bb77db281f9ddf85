//! The authenticated envelope every bridge message travels in, so that only the
//! fleet's bridges can put anything into a replica's state.
//!
//! Anyone who can publish on the bus could otherwise claim every prefix for one
//! worker or inflate a peer's in-flight counts, and every replica would follow. So
//! each message (a batch of operations, a catch-up ask, a catch-up answer) is sealed
//! under the fleet key, a secret every bridge of the fleet reads from a file:
//!
//! ```text
//! "LLMB" | version 1 | kind | sender length | sender | boot u64 | seq u64 | sent_ms u64
//!        | reply boot u64 | reply seq u64 | payload | HMAC-SHA256 (32 bytes)
//! ```
//!
//! (integers big-endian). The MAC covers a domain tag, the subject prefix (so a
//! message of one fleet is not taken by another sharing the bus and the key) and
//! every byte before it. It is checked, in constant time, before any field is
//! believed: a message made without the key, or altered on the way, is refused
//! whole. The stamp (sender, boot nonce, sequence number, send time) is what the
//! replay guard (`crate::replay`) judges; an answer names the ask it answers (its
//! boot and sequence), so an answer captured from an earlier catch-up cannot be
//! played into a later one.

use bytes::{BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

const MAGIC: &[u8; 4] = b"LLMB";
const VERSION: u8 = 1;
const DOMAIN: &[u8] = b"llm-bridge envelope v1\0";
const MAC_LEN: usize = 32;
/// A replica id is at most this long (the flag's own rule).
pub const MAX_SENDER_LEN: usize = 128;
/// Everything but the sender and the payload: magic, version, kind, sender length,
/// five u64s and the MAC.
const FIXED_LEN: usize = 4 + 1 + 1 + 1 + 5 * 8 + MAC_LEN;

/// What a message is; the subject it arrives on says which kind it must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A batch of this replica's operations and its in-flight counts.
    Ops = 1,
    /// A catch-up request; the payload is the inbox to answer on.
    Ask = 2,
    /// One retained batch, sent to the inbox of the ask it names.
    Answer = 3,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Ops),
            2 => Some(Kind::Ask),
            3 => Some(Kind::Answer),
            _ => None,
        }
    }
}

/// A message's place in its sender's stream: the sender's run (a random boot
/// nonce) and its sequence number in that run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Stamp {
    pub boot: u64,
    pub seq: u64,
}

/// An envelope's fields, trusted once `open` returns them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub sender: String,
    pub stamp: Stamp,
    /// Wall-clock milliseconds since the Unix epoch when it was sealed.
    pub sent_ms: u64,
    /// The ask an answer answers; zero on other kinds.
    pub reply_to: Stamp,
}

/// Why a message changed nothing. `as_str` is the one spelling, used in the
/// `llm_bridge_messages_refused{reason}` metric and in logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not an envelope at all (short, another format or version, a bad sender).
    Malformed,
    /// The MAC does not verify: made without the fleet key, or altered on the way.
    Unauthenticated,
    /// Authentic, but on a subject meant for another kind (moved by someone).
    WrongKind,
    /// Sent outside the freshness window (an old capture, or a clock far off).
    Stale,
    /// Not newer than what this sender's run already delivered, or an answer to an
    /// ask that is not the current one.
    Replayed,
    /// Names this replica but was not sent by this run: an earlier run's message
    /// played back, or another bridge configured with the same `--replica`.
    OwnReplica,
    /// The replay guard already remembers as many runs as it may; a new one waits
    /// until old ones age out.
    Crowded,
}

impl Refusal {
    pub const ALL: [Refusal; 7] = [
        Refusal::Malformed,
        Refusal::Unauthenticated,
        Refusal::WrongKind,
        Refusal::Stale,
        Refusal::Replayed,
        Refusal::OwnReplica,
        Refusal::Crowded,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Malformed => "malformed",
            Refusal::Unauthenticated => "unauthenticated",
            Refusal::WrongKind => "wrong_kind",
            Refusal::Stale => "stale",
            Refusal::Replayed => "replayed",
            Refusal::OwnReplica => "own_replica",
            Refusal::Crowded => "crowded",
        }
    }

    /// Its index in `ALL`, for a counter array.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The fleet key plus the subject prefix it is bound to. Its bytes never appear in
/// `Debug` output.
#[derive(Clone)]
pub struct FleetKey {
    key: Vec<u8>,
    prefix: String,
}

impl std::fmt::Debug for FleetKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "FleetKey({} bytes, prefix {:?})",
            self.key.len(),
            self.prefix
        )
    }
}

impl FleetKey {
    /// `key` may be empty only where the operator said so (`--insecure-no-fleet-key`):
    /// then anyone can seal, and only the replay guard still holds.
    pub fn new(key: Vec<u8>, prefix: &str) -> FleetKey {
        FleetKey {
            key,
            prefix: prefix.to_string(),
        }
    }

    /// True when running without a key (`--insecure-no-fleet-key`).
    pub fn is_empty(&self) -> bool {
        self.key.is_empty()
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC takes a key of any length.
        let mut mac = HmacSha256::new_from_slice(&self.key).expect("HMAC accepts any key length");
        mac.update(DOMAIN);
        mac.update(&(self.prefix.len() as u64).to_be_bytes());
        mac.update(self.prefix.as_bytes());
        mac
    }

    /// The sealed message: header, payload and MAC.
    pub fn seal(&self, h: &Header, payload: &[u8]) -> Bytes {
        debug_assert!(!h.sender.is_empty() && h.sender.len() <= MAX_SENDER_LEN);
        let mut out = BytesMut::with_capacity(FIXED_LEN + h.sender.len() + payload.len());
        out.put_slice(MAGIC);
        out.put_u8(VERSION);
        out.put_u8(h.kind as u8);
        out.put_u8(h.sender.len() as u8);
        out.put_slice(h.sender.as_bytes());
        for v in [
            h.stamp.boot,
            h.stamp.seq,
            h.sent_ms,
            h.reply_to.boot,
            h.reply_to.seq,
        ] {
            out.put_u64(v);
        }
        out.put_slice(payload);
        let mut mac = self.mac();
        mac.update(&out);
        out.put_slice(&mac.finalize().into_bytes());
        out.freeze()
    }

    /// The header and payload of an authentic envelope. Nothing is read from a
    /// message before its MAC is checked, except the lengths needed to find it.
    pub fn open(&self, msg: &Bytes) -> Result<(Header, Bytes), Refusal> {
        if msg.len() < FIXED_LEN || &msg[..4] != MAGIC || msg[4] != VERSION {
            return Err(Refusal::Malformed);
        }
        let sender_len = msg[6] as usize;
        if sender_len == 0 || sender_len > MAX_SENDER_LEN || msg.len() < FIXED_LEN + sender_len {
            return Err(Refusal::Malformed);
        }
        let (signed, tag) = msg.split_at(msg.len() - MAC_LEN);
        let mut mac = self.mac();
        mac.update(signed);
        mac.verify_slice(tag)
            .map_err(|_| Refusal::Unauthenticated)?;
        // Authentic from here on: a bad field is the sender's bug, still refused.
        let kind = Kind::from_u8(msg[5]).ok_or(Refusal::Malformed)?;
        let sender = std::str::from_utf8(&msg[7..7 + sender_len])
            .map_err(|_| Refusal::Malformed)?
            .to_string();
        let at = 7 + sender_len;
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&msg[at + 8 * i..at + 8 * (i + 1)]);
            u64::from_be_bytes(b)
        };
        let header = Header {
            kind,
            sender,
            stamp: Stamp {
                boot: u64_at(0),
                seq: u64_at(1),
            },
            sent_ms: u64_at(2),
            reply_to: Stamp {
                boot: u64_at(3),
                seq: u64_at(4),
            },
        };
        let payload = msg.slice(at + 40..msg.len() - MAC_LEN);
        Ok((header, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> FleetKey {
        FleetKey::new(b"0123456789abcdef0123456789abcdef".to_vec(), "llm-router")
    }

    fn header() -> Header {
        Header {
            kind: Kind::Ops,
            sender: "envoy-0".into(),
            stamp: Stamp { boot: 7, seq: 3 },
            sent_ms: 1_700_000_000_000,
            reply_to: Stamp::default(),
        }
    }

    #[test]
    fn a_sealed_message_opens_to_what_was_sealed() {
        let sealed = key().seal(&header(), b"batch");
        let (h, payload) = key().open(&sealed).unwrap();
        assert_eq!((h, &payload[..]), (header(), &b"batch"[..]));
        let empty = key().seal(&header(), b"");
        assert_eq!(
            &key().open(&empty).unwrap().1[..],
            b"",
            "an empty payload is fine"
        );
    }

    #[test]
    fn every_altered_byte_is_refused() {
        let sealed = key().seal(&header(), b"batch");
        for i in 0..sealed.len() {
            let mut bad = sealed.to_vec();
            bad[i] ^= 0x01;
            let r = key().open(&Bytes::from(bad)).unwrap_err();
            assert!(
                matches!(r, Refusal::Unauthenticated | Refusal::Malformed),
                "byte {i} altered: {r:?}"
            );
        }
        let mut longer = sealed.to_vec();
        longer.insert(60, b'x');
        assert_eq!(
            key().open(&Bytes::from(longer)),
            Err(Refusal::Unauthenticated),
            "a byte slipped in is an alteration"
        );
    }

    #[test]
    fn another_key_or_another_prefix_cannot_seal_for_the_fleet() {
        let forged = FleetKey::new(b"not the fleet's key at all, no...".to_vec(), "llm-router")
            .seal(&header(), b"batch");
        assert_eq!(key().open(&forged), Err(Refusal::Unauthenticated));
        let other_fleet = FleetKey::new(b"0123456789abcdef0123456789abcdef".to_vec(), "other")
            .seal(&header(), b"batch");
        assert_eq!(
            key().open(&other_fleet),
            Err(Refusal::Unauthenticated),
            "the prefix is bound into the MAC"
        );
        let unkeyed = FleetKey::new(Vec::new(), "llm-router").seal(&header(), b"batch");
        assert_eq!(key().open(&unkeyed), Err(Refusal::Unauthenticated));
    }

    #[test]
    fn what_is_not_an_envelope_is_malformed() {
        for bad in [
            Bytes::new(),
            Bytes::from_static(b"a raw batch from an older bridge"),
            Bytes::from(vec![0u8; FIXED_LEN + 8]),
        ] {
            assert_eq!(key().open(&bad), Err(Refusal::Malformed));
        }
        let mut v2 = key().seal(&header(), b"x").to_vec();
        v2[4] = 2;
        assert_eq!(key().open(&Bytes::from(v2)), Err(Refusal::Malformed));
    }

    #[test]
    fn refusal_names_are_distinct_and_indexed() {
        for (i, r) in Refusal::ALL.iter().enumerate() {
            assert_eq!(r.index(), i);
        }
        let mut names: Vec<_> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
        names.dedup();
        assert_eq!(names.len(), Refusal::ALL.len());
    }

    #[test]
    fn the_key_is_not_printed() {
        assert!(!format!("{:?}", key()).contains("0123"));
    }
}
