//! The routing VM's counts of the requests it decided for other VMs. The routing
//! VM is the only one that decides, so it counts every request in flight itself,
//! in memory and at once: the next decision sees the last one, whichever thread
//! asked. A count taken by the asking VM instead reached shared data only at that
//! VM's next write of its row, so the router decided by counts up to a tick old.
//!
//! The asking VM tells the end of each request (`super::wire::Note`), riding on
//! its next question or sent alone (`super::tell`), and the hold is given back.
//! A VM that stops telling (it failed, or Envoy replaced it) has its holds given
//! back once it has been silent past the owner expiry (`crate::shared::owned`):
//! a VM with requests in flight tells at least a heartbeat within a third of it.

use std::collections::HashMap;

use super::wire::{Booked, Event, Leg, Note};

/// One request's hold: its worker, and `predicted_ttft`'s booking while it
/// prefills.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hold {
    pub worker: String,
    pub booked: Option<Booked>,
}

/// What a note gives back, with what the asking VM measured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Given {
    /// The booking alone: the request's first byte came `after_ms` after its answer.
    FirstByte {
        worker: String,
        booked: Booked,
        after_ms: u64,
    },
    /// The whole hold: the request ended, `streamed_ms` after its first byte.
    End {
        hold: Hold,
        streamed_ms: Option<u64>,
    },
}

/// The holds by asking VM (its reply queue), stream and leg, and when each
/// asking VM was last heard from.
#[derive(Debug, Default)]
pub struct Holds {
    held: HashMap<(u32, u32, Leg), Hold>,
    heard: HashMap<u32, u64>,
}

impl Holds {
    /// Holds `hold` for the stream `ctx` of the VM answered on `reply`; a hold it
    /// replaces (a stream id asked twice) is returned, to be given back.
    pub fn hold(
        &mut self,
        reply: u32,
        ctx: u32,
        leg: Leg,
        hold: Hold,
        now_ms: u64,
    ) -> Option<Hold> {
        self.heard.insert(reply, now_ms);
        self.held.insert((reply, ctx, leg), hold)
    }

    /// The VM answered on `reply` told `notes`: what they give back. A note of a
    /// stream not held (routed by its own VM at the deadline, or held by a router
    /// before this one) gives nothing.
    pub fn told(&mut self, reply: u32, notes: &[Note], now_ms: u64) -> Vec<Given> {
        self.heard.insert(reply, now_ms);
        notes
            .iter()
            .filter_map(|n| {
                let key = (reply, n.ctx, n.leg);
                match n.event {
                    Event::End { streamed_ms } => {
                        let hold = self.held.remove(&key)?;
                        Some(Given::End { hold, streamed_ms })
                    }
                    Event::FirstByte { after_ms } => {
                        let hold = self.held.get_mut(&key)?;
                        let booked = hold.booked.take()?;
                        Some(Given::FirstByte {
                            worker: hold.worker.clone(),
                            booked,
                            after_ms,
                        })
                    }
                }
            })
            .collect()
    }

    /// The holds of every VM not heard from for `expiry_ms`, taken out.
    pub fn expired(&mut self, now_ms: u64, expiry_ms: u64) -> Vec<Hold> {
        let silent: Vec<u32> = self
            .heard
            .iter()
            .filter(|(_, at)| now_ms.saturating_sub(**at) >= expiry_ms)
            .map(|(reply, _)| *reply)
            .collect();
        if silent.is_empty() {
            return Vec::new();
        }
        for reply in &silent {
            self.heard.remove(reply);
        }
        self.held
            .extract_if(|(reply, _, _), _| silent.contains(reply))
            .map(|(_, hold)| hold)
            .collect()
    }

    /// Every hold, taken out (this VM no longer routes).
    pub fn drain(&mut self) -> Vec<Hold> {
        self.heard.clear();
        self.held.drain().map(|(_, hold)| hold).collect()
    }

    /// Requests held.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn hold(worker: &str, booked: Option<u64>) -> Hold {
        Hold {
            worker: worker.into(),
            booked: booked.map(|chars| Booked {
                chars,
                work_chars: chars * 2,
            }),
        }
    }

    fn ended(hold: Hold) -> Given {
        Given::End {
            hold,
            streamed_ms: None,
        }
    }

    fn note(ctx: u32, leg: Leg, event: Event) -> Note {
        Note { ctx, leg, event }
    }

    #[test]
    fn a_first_byte_gives_the_booking_back_once_and_the_end_the_rest() {
        let mut h = Holds::default();
        h.hold(1, 10, Leg::Main, hold("w0", Some(900)), 0);
        let first = note(10, Leg::Main, Event::FirstByte { after_ms: 40 });
        assert_eq!(
            h.told(1, &[first], 1),
            vec![Given::FirstByte {
                worker: "w0".into(),
                booked: Booked {
                    chars: 900,
                    work_chars: 1800
                },
                after_ms: 40,
            }]
        );
        assert!(h.told(1, &[first], 2).is_empty());
        assert_eq!(h.len(), 1);
        let end = note(
            10,
            Leg::Main,
            Event::End {
                streamed_ms: Some(7),
            },
        );
        assert_eq!(
            h.told(1, &[end], 3),
            vec![Given::End {
                hold: hold("w0", None),
                streamed_ms: Some(7)
            }]
        );
        assert!(h.told(1, &[end], 4).is_empty());
        assert!(h.is_empty());
    }

    #[test]
    fn an_end_before_the_first_byte_gives_the_booking_back_with_the_count() {
        let mut h = Holds::default();
        h.hold(1, 10, Leg::Main, hold("w0", Some(900)), 0);
        h.hold(1, 10, Leg::Prefill, hold("p0", None), 0);
        let given = h.told(1, &[note(10, Leg::Main, Event::ENDED)], 1);
        assert_eq!(given, vec![ended(hold("w0", Some(900)))]);
        assert_eq!(h.len(), 1, "the prefill leg is its own");
    }

    #[test]
    fn notes_name_their_vm_stream_and_leg() {
        let mut h = Holds::default();
        h.hold(1, 10, Leg::Main, hold("w0", None), 0);
        h.hold(2, 10, Leg::Main, hold("w1", None), 0);
        // Another VM's stream of the same id, another leg, an unknown stream.
        assert!(h
            .told(3, &[note(10, Leg::Main, Event::ENDED)], 1)
            .is_empty());
        assert!(h
            .told(1, &[note(10, Leg::Prefill, Event::ENDED)], 1)
            .is_empty());
        assert!(h
            .told(1, &[note(11, Leg::Main, Event::ENDED)], 1)
            .is_empty());
        assert_eq!(h.len(), 2);
        let given = h.told(2, &[note(10, Leg::Main, Event::ENDED)], 1);
        assert_eq!(given, vec![ended(hold("w1", None))]);
    }

    #[test]
    fn a_silent_vm_loses_its_holds_at_the_expiry_and_a_heard_one_keeps_them() {
        let mut h = Holds::default();
        h.hold(1, 10, Leg::Main, hold("w0", None), 0);
        h.hold(1, 11, Leg::Main, hold("w1", None), 100);
        h.hold(2, 10, Leg::Main, hold("w2", None), 0);
        // VM 2 beats (no notes) at 4000.
        assert!(h.told(2, &[], 4_000).is_empty());
        assert!(h.expired(5_099, 5_000).is_empty(), "heard at 100");
        let mut gone: Vec<String> = h
            .expired(5_100, 5_000)
            .into_iter()
            .map(|h| h.worker)
            .collect();
        gone.sort();
        assert_eq!(gone, ["w0", "w1"]);
        assert_eq!(h.len(), 1);
        assert_eq!(h.expired(9_000, 5_000).len(), 1);
        assert!(h.is_empty());
    }

    #[test]
    fn a_router_that_stops_routing_gives_every_hold_back() {
        let mut h = Holds::default();
        h.hold(1, 10, Leg::Main, hold("w0", None), 0);
        h.hold(2, 11, Leg::Prefill, hold("p0", Some(5)), 0);
        assert_eq!(h.drain().len(), 2);
        assert!(h.is_empty());
        assert!(h.expired(u64::MAX, 1).is_empty());
    }
}
