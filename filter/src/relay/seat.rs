//! The seat: which VM of an Envoy routes for the others. Its value in shared data
//! names the holder (a random nonce, which also names its queue) and when it last
//! showed it was alive. The first VM Envoy configures takes it (the main thread's:
//! Envoy configures a plugin there before its worker threads); the others follow
//! it. A holder that stops beating for `stale_after_ms` loses it to the first VM
//! that notices, so routing by the trees outlives a failed VM.

use crate::shared::Reader;

/// The seat's value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seat {
    /// The holder's nonce (never 0): its route queue is named after it.
    pub holder: u64,
    /// The holder's last heartbeat, on the host's clock.
    pub beat_ms: u64,
}

impl Seat {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        out.extend_from_slice(&self.holder.to_le_bytes());
        out.extend_from_slice(&self.beat_ms.to_le_bytes());
        out
    }

    /// `None` for anything but a whole seat (an empty value: nobody holds it).
    pub fn decode(bytes: &[u8]) -> Option<Seat> {
        let mut r = Reader(bytes);
        let seat = Seat {
            holder: r.u64()?,
            beat_ms: r.u64()?,
        };
        (r.0.is_empty() && seat.holder != 0).then_some(seat)
    }

    /// The route queue's name for the holder under the configuration `digest`.
    pub fn queue_name(&self, digest: &str) -> String {
        format!("llm_router.relay.{digest}.{:016x}", self.holder)
    }
}

/// What a VM does about the seat as it finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeatCall {
    /// Nobody holds it: take it.
    TakeEmpty,
    /// Its holder stopped beating: take it over.
    TakeStale,
    /// This VM holds it: beat.
    Beat,
    /// Another VM holds it and is alive: ask that one.
    Follow,
}

impl SeatCall {
    pub fn takes(self) -> bool {
        matches!(self, SeatCall::TakeEmpty | SeatCall::TakeStale)
    }
}

/// The call for the VM whose nonce is `me`, finding `seat` at `now_ms`. A beat
/// from the future (another VM read a later clock) is alive.
pub fn seat_call(seat: Option<Seat>, me: u64, now_ms: u64, stale_after_ms: u64) -> SeatCall {
    match seat {
        None => SeatCall::TakeEmpty,
        Some(s) if s.holder == me => SeatCall::Beat,
        Some(s) if now_ms.saturating_sub(s.beat_ms) > stale_after_ms => SeatCall::TakeStale,
        Some(_) => SeatCall::Follow,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_seat_round_trips_and_anything_else_is_empty() {
        let s = Seat {
            holder: 7,
            beat_ms: 1_000,
        };
        assert_eq!(Seat::decode(&s.encode()), Some(s));
        assert_eq!(Seat::decode(&[]), None);
        assert_eq!(Seat::decode(&s.encode()[..15]), None);
        let mut long = s.encode();
        long.push(0);
        assert_eq!(Seat::decode(&long), None);
        let nobody = Seat {
            holder: 0,
            beat_ms: 5,
        };
        assert_eq!(Seat::decode(&nobody.encode()), None);
    }

    #[test]
    fn each_boundary_of_the_call() {
        let held = |beat_ms| Some(Seat { holder: 9, beat_ms });
        assert_eq!(seat_call(None, 1, 100, 50), SeatCall::TakeEmpty);
        assert_eq!(seat_call(held(0), 9, 10_000, 50), SeatCall::Beat);
        assert_eq!(seat_call(held(50), 1, 100, 50), SeatCall::Follow);
        assert_eq!(seat_call(held(49), 1, 100, 50), SeatCall::TakeStale);
        assert_eq!(seat_call(held(200), 1, 100, 50), SeatCall::Follow);
        assert!(SeatCall::TakeEmpty.takes() && SeatCall::TakeStale.takes());
        assert!(!SeatCall::Beat.takes() && !SeatCall::Follow.takes());
    }

    #[test]
    fn the_queue_is_named_by_config_and_holder() {
        let s = Seat {
            holder: 0xab,
            beat_ms: 0,
        };
        assert_eq!(s.queue_name("d1"), "llm_router.relay.d1.00000000000000ab");
    }
}
