//! The router's own hold on a decision it made for another VM. The asking VM
//! counts the request in flight when it applies the answer, but its count reaches
//! shared data only at its next sync (`sync_batch_ms`); until then the router's
//! next decisions would not see it, and a burst of new conversations would all go
//! to the same least-loaded worker. So the router counts each decision itself, as
//! it does its own requests', and gives the count back once the asking VM's has
//! been shared. For that short overlap the request counts twice, which errs
//! toward spreading.

use std::collections::VecDeque;

/// Holds released in the order they fall due.
#[derive(Debug)]
pub struct Handover<T> {
    held: VecDeque<(u64, T)>,
}

impl<T> Default for Handover<T> {
    fn default() -> Self {
        Handover {
            held: VecDeque::new(),
        }
    }
}

impl<T> Handover<T> {
    /// How long the router holds a decision: two of the asking VM's sync windows
    /// (it shares at its first request or stream end after a window, or at once
    /// when it held nothing), and a millisecond for the answer's trip.
    pub fn hold_ms(sync_batch_ms: u64) -> u64 {
        sync_batch_ms.saturating_mul(2).saturating_add(1)
    }

    /// Holds `hold` until `due_ms`. Due times come from one clock and one delay,
    /// so they arrive in order; a late one is released with the ones before it.
    pub fn hold(&mut self, due_ms: u64, hold: T) {
        self.held.push_back((due_ms, hold));
    }

    /// The holds due at `now_ms`, oldest first.
    pub fn due(&mut self, now_ms: u64) -> Vec<T> {
        let n = self
            .held
            .iter()
            .take_while(|(due, _)| *due <= now_ms)
            .count();
        self.held.drain(..n).map(|(_, h)| h).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn holds_fall_due_in_order_and_only_once() {
        let mut h = Handover::default();
        h.hold(10, "a");
        h.hold(12, "b");
        h.hold(12, "c");
        assert!(h.due(9).is_empty());
        assert_eq!(h.due(10), vec!["a"]);
        assert_eq!(h.due(20), vec!["b", "c"]);
        assert!(h.due(30).is_empty());
        assert!(h.is_empty());
        h.hold(40, "d");
        assert_eq!(h.len(), 1);
    }

    #[test]
    fn a_hold_outlasts_two_windows() {
        assert_eq!(Handover::<()>::hold_ms(2), 5);
        assert_eq!(Handover::<()>::hold_ms(0), 1);
        assert_eq!(Handover::<()>::hold_ms(u64::MAX), u64::MAX);
    }
}
