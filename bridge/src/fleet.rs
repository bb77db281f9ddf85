//! The fleet boundary: what this bridge sends leaves sealed and stamped, and what
//! it receives is admitted only if it is authentic, of the kind its subject
//! carries, fresh and new. A refused message changes nothing, and the caller
//! counts it by its `Refusal`.
//!
//! Admission checks, in order: the envelope and its MAC (`crate::envelope`); the
//! kind; the sender (this replica's own messages come back from the bus: this
//! run's are dropped silently, another run's are refused); then the replay guard
//! (`crate::replay`). Only then is anything read from the payload.

use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::envelope::{FleetKey, Header, Kind, Refusal, Stamp};
use crate::replay::{ReplayGuard, DEFAULT_MAX_RUNS};

/// Milliseconds since the Unix epoch, the envelopes' clock.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A random boot nonce for this run, so its sequence numbers are not confused with
/// an earlier run's. Zero is kept for "no ask" in answers' `reply_to`.
pub fn boot_nonce() -> anyhow::Result<u64> {
    loop {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b)
            .map_err(|e| anyhow::anyhow!("no randomness for the boot nonce: {e}"))?;
        let n = u64::from_ne_bytes(b);
        if n != 0 {
            return Ok(n);
        }
    }
}

/// Seals this run's messages: one sequence for everything it sends.
#[derive(Debug)]
pub struct Sealer {
    key: FleetKey,
    me: String,
    boot: u64,
    seq: AtomicU64,
}

impl Sealer {
    pub fn new(key: FleetKey, me: &str, boot: u64) -> Sealer {
        Sealer {
            key,
            me: me.to_string(),
            boot,
            seq: AtomicU64::new(0),
        }
    }

    /// `payload` sealed as `kind` (an answer names the ask it answers), and its stamp.
    pub fn seal(&self, kind: Kind, reply_to: Stamp, payload: &[u8], now_ms: u64) -> (Stamp, Bytes) {
        let stamp = Stamp {
            boot: self.boot,
            seq: self.seq.fetch_add(1, Ordering::Relaxed) + 1,
        };
        let header = Header {
            kind,
            sender: self.me.clone(),
            stamp,
            sent_ms: now_ms,
            reply_to,
        };
        (stamp, self.key.seal(&header, payload))
    }
}

/// A message that passed.
#[derive(Debug, PartialEq, Eq)]
pub enum Admitted {
    /// From a peer: its header and payload.
    Peer(Header, Bytes),
    /// This run's own, back from the bus: nothing to do.
    Own,
}

/// Admits messages of one stream (ops, asks, or one catch-up's answers): each has
/// its own replay guard, since a sender's sequence numbers are shared by its
/// streams and arrive on each in order, not across them.
#[derive(Debug)]
pub struct Gate {
    key: FleetKey,
    me: String,
    boot: u64,
    guard: ReplayGuard,
}

impl Gate {
    pub fn new(key: FleetKey, me: &str, boot: u64, window_ms: u64) -> Gate {
        Gate {
            key,
            me: me.to_string(),
            boot,
            guard: ReplayGuard::new(window_ms, DEFAULT_MAX_RUNS),
        }
    }

    /// `msg`, arrived where `kind` is carried, judged at `now_ms`.
    pub fn admit(&mut self, msg: &Bytes, kind: Kind, now_ms: u64) -> Result<Admitted, Refusal> {
        let (h, payload) = self.key.open(msg)?;
        if h.kind != kind {
            return Err(Refusal::WrongKind);
        }
        if h.sender == self.me {
            return if h.stamp.boot == self.boot {
                Ok(Admitted::Own)
            } else {
                Err(Refusal::OwnReplica)
            };
        }
        self.guard.admit(&h.sender, h.stamp, h.sent_ms, now_ms)?;
        Ok(Admitted::Peer(h, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_700_000_000_000;
    const W: u64 = 30_000;

    fn key() -> FleetKey {
        FleetKey::new(vec![7; 32], "llm-router")
    }

    fn gate() -> Gate {
        Gate::new(key(), "me", 1, W)
    }

    fn peer(payload: &[u8]) -> Bytes {
        Sealer::new(key(), "peer", 9)
            .seal(Kind::Ops, Stamp::default(), payload, NOW)
            .1
    }

    #[test]
    fn a_peer_batch_passes_once() {
        let mut g = gate();
        let msg = peer(b"batch");
        match g.admit(&msg, Kind::Ops, NOW).unwrap() {
            Admitted::Peer(h, p) => {
                assert_eq!((h.sender.as_str(), &p[..]), ("peer", &b"batch"[..]))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(g.admit(&msg, Kind::Ops, NOW + 5), Err(Refusal::Replayed));
    }

    #[test]
    fn the_sealer_numbers_its_messages_in_order() {
        let s = Sealer::new(key(), "peer", 9);
        let stamps: Vec<u64> = (0..3)
            .map(|_| s.seal(Kind::Ops, Stamp::default(), b"", NOW).0.seq)
            .collect();
        assert_eq!(stamps, vec![1, 2, 3]);
        let mut g = gate();
        let msgs: Vec<Bytes> = (0..3)
            .map(|_| s.seal(Kind::Ops, Stamp::default(), b"", NOW).1)
            .collect();
        assert_eq!(g.admit(&msgs[0], Kind::Ops, NOW).map(|_| ()), Ok(()));
        assert_eq!(
            g.admit(&msgs[2], Kind::Ops, NOW).map(|_| ()),
            Ok(()),
            "a lost message is a gap"
        );
        assert_eq!(
            g.admit(&msgs[1], Kind::Ops, NOW).map(|_| ()),
            Err(Refusal::Replayed)
        );
    }

    #[test]
    fn forged_altered_moved_and_stale_messages_are_refused_and_change_nothing() {
        let mut g = gate();
        let forged = Sealer::new(FleetKey::new(vec![8; 32], "llm-router"), "peer", 9)
            .seal(Kind::Ops, Stamp::default(), b"claim every prefix", NOW)
            .1;
        assert_eq!(
            g.admit(&forged, Kind::Ops, NOW),
            Err(Refusal::Unauthenticated)
        );
        let mut altered = peer(b"batch").to_vec();
        let n = altered.len();
        altered[n - 40] ^= 0xff;
        assert_eq!(
            g.admit(&Bytes::from(altered), Kind::Ops, NOW),
            Err(Refusal::Unauthenticated)
        );
        assert_eq!(
            g.admit(&peer(b"batch"), Kind::Ask, NOW),
            Err(Refusal::WrongKind)
        );
        assert_eq!(
            g.admit(&peer(b"batch"), Kind::Ops, NOW + W + 1),
            Err(Refusal::Stale)
        );
        assert_eq!(
            g.admit(&peer(b"batch"), Kind::Ops, NOW).map(|_| ()),
            Ok(()),
            "none of the refusals above moved the guard"
        );
    }

    #[test]
    fn own_messages_are_dropped_and_an_earlier_runs_refused() {
        let mut g = gate();
        let mine = Sealer::new(key(), "me", 1)
            .seal(Kind::Ops, Stamp::default(), b"", NOW)
            .1;
        assert_eq!(g.admit(&mine, Kind::Ops, NOW), Ok(Admitted::Own));
        let earlier = Sealer::new(key(), "me", 2)
            .seal(Kind::Ops, Stamp::default(), b"", NOW)
            .1;
        assert_eq!(g.admit(&earlier, Kind::Ops, NOW), Err(Refusal::OwnReplica));
    }

    #[test]
    fn boot_nonces_differ_and_are_never_zero() {
        let (a, b) = (boot_nonce().unwrap(), boot_nonce().unwrap());
        assert!(a != 0 && b != 0 && a != b);
    }
}
