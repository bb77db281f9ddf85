//! Counter increments batched in the VM. In Envoy every `increment_metric` is a
//! hostcall of its own (about a thousand instructions, measured with
//! `benches/overhead --callgrind`), and a routed request moves seven counters. So the
//! glue sums increments here and hands them to the host together: as soon as the VM
//! holds no request (a quiet Envoy, or a test sending one request at a time, sees its
//! counters at once), and while it is busy, at the end of a request or a tick once
//! `FLUSH_MS` passed since the last hand-over if the hand-over costs no more
//! hostcalls than requests ended since (`HOSTCALLS_PER_REQUEST`) or than
//! `FREE_HOSTCALLS`, and in any case once `MAX_LAG_MS` passed.
//!
//! A hand-over costs a hostcall per counter that moved, and four of a request's
//! counters are its worker's: a busy VM in a fleet of hundreds moves four counters
//! per worker it routed to since the last one. Handed over every second, that was
//! about 0.4 hostcalls a request at 256 workers and 2,400 requests a second, but 4 a
//! request at 50 a second (a thread holding long streams, or Envoy under
//! callgrind), where most of what 256 workers cost over 4 was the counters. The
//! budget keeps a hand-over at about a hostcall a request whatever the pace, past a
//! few dozen a second that cost nothing worth counting: a busy thread's counters lag
//! by at most a second in a small fleet or at a pace that pays for it (a thread
//! holding a few long streams still shows each request routed within a second), and
//! by `MAX_LAG_MS` otherwise: well inside a Prometheus scrape interval.

use hashbrown::HashMap;

/// The least time between a busy VM's hand-overs.
pub const FLUSH_MS: u64 = 1000;
/// The most a busy VM's counters lag behind its requests.
pub const MAX_LAG_MS: u64 = 10_000;
/// Hostcalls a hand-over may cost per request ended since the last one, before
/// `MAX_LAG_MS`.
pub const HOSTCALLS_PER_REQUEST: usize = 1;
/// Hostcalls a hand-over may cost however few requests ended: a second's worth of
/// a small fleet's counters (seven a request, four of them its worker's).
pub const FREE_HOSTCALLS: usize = 32;

/// Increments not yet handed to the host. Each counter gets a slot when it is
/// defined (`slot`), so the seven increments of every request index a list rather
/// than hash the host's metric id.
#[derive(Debug, Default)]
pub struct CounterBatch {
    /// Each counter's slot, by the host's metric id.
    slots: HashMap<u32, u32>,
    /// Each slot's metric id and the sum not yet handed over.
    sums: Vec<(u32, u64)>,
    /// The slots with a sum to hand over, in the order they first moved.
    moved: Vec<u32>,
    flushed_at_ms: u64,
    /// Requests ended since the last hand-over.
    ended: usize,
}

impl CounterBatch {
    /// The slot of the counter the host knows as `id` (the same for every
    /// definition of it: a reconfigured VM defines its counters again).
    pub fn slot(&mut self, id: u32) -> u32 {
        let next = self.sums.len() as u32;
        let slot = *self.slots.entry(id).or_insert(next);
        if slot == next {
            self.sums.push((id, 0));
        }
        slot
    }

    /// Adds `n` to the counter in `slot` (a slot `slot` never gave is ignored).
    pub fn add(&mut self, slot: u32, n: u64) {
        let Some((_, sum)) = self.sums.get_mut(slot as usize) else {
            return;
        };
        if *sum == 0 && n > 0 {
            self.moved.push(slot);
        }
        *sum = sum.saturating_add(n);
    }

    /// A request ended (its increments are added).
    pub fn request_ended(&mut self) {
        self.ended = self.ended.saturating_add(1);
    }

    /// Whether to hand the increments over now (see the module's doc): the VM
    /// holds no request (`idle`), or it is busy and either `MAX_LAG_MS` passed since
    /// the last hand-over, or `FLUSH_MS` did and the requests ended since pay for it.
    pub fn due(&self, idle: bool, now_ms: u64) -> bool {
        let waited = now_ms.saturating_sub(self.flushed_at_ms);
        let budget = self.ended.saturating_mul(HOSTCALLS_PER_REQUEST);
        let paid = self.moved.len() <= budget.max(FREE_HOSTCALLS);
        !self.moved.is_empty() && (idle || waited >= MAX_LAG_MS || (waited >= FLUSH_MS && paid))
    }

    /// The summed increments by metric id, taken out at `now_ms`.
    pub fn take(&mut self, now_ms: u64) -> Vec<(u32, u64)> {
        self.flushed_at_ms = now_ms;
        self.ended = 0;
        let sums = &mut self.sums;
        self.moved
            .drain(..)
            .filter_map(|slot| {
                let (id, sum) = sums.get_mut(slot as usize)?;
                Some((*id, std::mem::take(sum)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn increments_are_summed_and_handed_over_when_idle_or_due() {
        let mut b = CounterBatch::default();
        let (seven, nine) = (b.slot(7), b.slot(9));
        assert_eq!(b.slot(7), seven, "a counter defined again keeps its slot");
        assert!(!b.due(true, 0), "nothing to hand over");
        b.add(seven, 1);
        b.add(seven, 2);
        b.add(nine, 5);
        b.add(99, 1);
        assert!(!b.due(false, FLUSH_MS - 1), "busy and recent: wait");
        assert!(b.due(true, 1), "idle: at once");
        assert!(
            b.due(false, FLUSH_MS),
            "busy, a second old and a few hostcalls: due though no request ended"
        );
        let mut got = b.take(FLUSH_MS);
        got.sort();
        assert_eq!(got, vec![(7, 3), (9, 5)]);
        assert!(!b.due(true, FLUSH_MS), "taken");
        b.add(seven, u64::MAX);
        b.add(seven, 1);
        b.request_ended();
        assert!(!b.due(false, 2 * FLUSH_MS - 1), "the clock restarted");
        assert_eq!(b.take(2 * FLUSH_MS), vec![(7, u64::MAX)], "saturates");
    }

    #[test]
    fn a_busy_vm_hands_over_no_more_hostcalls_than_requests_until_the_lag_cap() {
        let mut b = CounterBatch::default();
        // The host's ids need not be small or dense.
        let slots: Vec<u32> = (0..40).map(|id| b.slot(1000 + 16 * id)).collect();
        // A large fleet at a slow pace: four counters per request's worker.
        for worker in 0..10 {
            for field in 0..4 {
                b.add(slots[worker * 4 + field], 1);
            }
            b.request_ended();
        }
        assert!(
            !b.due(false, FLUSH_MS),
            "40 hostcalls for 10 requests: wait"
        );
        assert!(!b.due(false, MAX_LAG_MS - 1));
        assert!(b.due(false, MAX_LAG_MS), "never past the lag cap");
        assert!(b.due(true, FLUSH_MS), "idle: at once whatever the cost");
        for _ in 0..30 {
            b.add(slots[0], 1);
            b.request_ended();
        }
        assert!(b.due(false, FLUSH_MS), "40 requests pay for 40 hostcalls");
        assert_eq!(b.take(FLUSH_MS).len(), 40);
        slots.iter().for_each(|s| b.add(*s, 1));
        (0..39).for_each(|_| b.request_ended());
        assert!(
            !b.due(false, 2 * FLUSH_MS),
            "the requests were counted afresh: 39 do not pay for 40"
        );
    }
}
