//! Counter increments batched in the VM. In Envoy every `increment_metric` is a
//! hostcall of its own (about a thousand instructions, measured with
//! `benches/overhead --callgrind`), and a routed request moves seven counters. So the
//! glue sums increments here and hands them to the host together: as soon as the VM
//! holds no request (a quiet Envoy, or a test sending one request at a time, sees its
//! counters at once), at the end of a request once `FLUSH_MS` passed since the last
//! hand-over (a busy VM), and on every tick. A counter lags by at most `FLUSH_MS`
//! while requests keep coming, and by a tick once they stop.

use hashbrown::HashMap;

/// The most a busy VM's counters lag behind its requests.
pub const FLUSH_MS: u64 = 100;

/// Increments not yet handed to the host. Each counter gets a slot when it is
/// defined, so an increment on the request path is an index, not a hash lookup.
#[derive(Debug, Default)]
pub struct CounterBatch {
    /// The host's metric id of each slot's counter.
    ids: Vec<u32>,
    /// A counter's slot by metric id (asked when a counter is defined).
    slots: HashMap<u32, u32>,
    /// Each slot's sum since the last hand-over.
    pending: Vec<u64>,
    /// The slots with a sum, in the order they got one.
    touched: Vec<u32>,
    flushed_at_ms: u64,
}

impl CounterBatch {
    /// The slot of the counter the host calls `id` (the same one each time it is
    /// defined again, as a reconfiguration does).
    pub fn slot(&mut self, id: u32) -> u32 {
        let next = self.ids.len() as u32;
        let slot = *self.slots.entry(id).or_insert(next);
        if slot == next {
            self.ids.push(id);
            self.pending.push(0);
        }
        slot
    }

    pub fn add(&mut self, slot: u32, n: u64) {
        let Some(sum) = self.pending.get_mut(slot as usize) else {
            return;
        };
        if *sum == 0 && n > 0 {
            self.touched.push(slot);
        }
        *sum = sum.saturating_add(n);
    }

    /// Whether to hand the increments over now: the VM holds no request (`idle`), or
    /// `FLUSH_MS` passed since the last hand-over.
    pub fn due(&self, idle: bool, now_ms: u64) -> bool {
        !self.touched.is_empty() && (idle || now_ms.saturating_sub(self.flushed_at_ms) >= FLUSH_MS)
    }

    /// The summed increments by metric id, taken out at `now_ms`.
    pub fn take(&mut self, now_ms: u64) -> Vec<(u32, u64)> {
        self.flushed_at_ms = now_ms;
        let (ids, pending) = (&self.ids, &mut self.pending);
        self.touched
            .drain(..)
            .filter_map(|slot| {
                let sum = std::mem::take(pending.get_mut(slot as usize)?);
                Some((*ids.get(slot as usize)?, sum))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increments_are_summed_and_handed_over_when_idle_or_due() {
        let mut b = CounterBatch::default();
        let (seven, nine) = (b.slot(7), b.slot(9));
        assert_eq!(b.slot(7), seven, "defined again: the same slot");
        assert!(!b.due(true, 0), "nothing to hand over");
        b.add(nine, 0);
        assert!(!b.due(true, 0), "a zero is nothing");
        b.add(seven, 1);
        b.add(seven, 2);
        b.add(nine, 5);
        assert!(!b.due(false, FLUSH_MS - 1), "busy and recent: wait");
        assert!(b.due(true, 1), "idle: at once");
        assert!(b.due(false, FLUSH_MS), "busy but due");
        let mut got = b.take(FLUSH_MS);
        got.sort();
        assert_eq!(got, vec![(7, 3), (9, 5)]);
        assert!(!b.due(true, FLUSH_MS), "taken");
        b.add(seven, u64::MAX);
        b.add(seven, 1);
        assert!(!b.due(false, 2 * FLUSH_MS - 1), "the clock restarted");
        assert_eq!(b.take(2 * FLUSH_MS), vec![(7, u64::MAX)], "saturates");
        b.add(99, 1);
        assert!(!b.due(true, 0), "a slot never given out changes nothing");
    }
}
