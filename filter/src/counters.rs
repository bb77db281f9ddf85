//! Counter increments batched in the VM. In Envoy every `increment_metric` is a
//! hostcall of its own (about a thousand instructions, measured with
//! `benches/overhead --callgrind`), and a routed request moves seven counters. So the
//! glue sums increments here and hands them to the host together: as soon as the VM
//! holds no request (a quiet Envoy, or a test sending one request at a time, sees its
//! counters at once), at the end of a request once `FLUSH_MS` passed since the last
//! hand-over (a busy VM), and on every tick. A counter lags by at most `FLUSH_MS`
//! while requests keep coming, and by a tick once they stop.
//!
//! A hand-over costs a hostcall per counter that moved, and four of a request's
//! counters are its worker's: a busy VM in a fleet of hundreds moves four counters
//! per worker it routed to since the last one. At 100 ms that was about two
//! hostcalls a request at 256 workers (and 4 at callgrind's pace, where it was most
//! of what 256 workers cost over 4); a second, well inside any scrape interval,
//! spreads a fleet's worth of counters over ten times the requests.

use hashbrown::HashMap;

/// The most a busy VM's counters lag behind its requests.
pub const FLUSH_MS: u64 = 1000;

/// Increments not yet handed to the host, by the host's metric id.
#[derive(Debug, Default)]
pub struct CounterBatch {
    pending: HashMap<u32, u64>,
    flushed_at_ms: u64,
}

impl CounterBatch {
    pub fn add(&mut self, id: u32, n: u64) {
        let sum = self.pending.entry(id).or_insert(0);
        *sum = sum.saturating_add(n);
    }

    /// Whether to hand the increments over now: the VM holds no request (`idle`), or
    /// `FLUSH_MS` passed since the last hand-over.
    pub fn due(&self, idle: bool, now_ms: u64) -> bool {
        !self.pending.is_empty() && (idle || now_ms.saturating_sub(self.flushed_at_ms) >= FLUSH_MS)
    }

    /// The summed increments, taken out at `now_ms`.
    pub fn take(&mut self, now_ms: u64) -> Vec<(u32, u64)> {
        self.flushed_at_ms = now_ms;
        self.pending.drain().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increments_are_summed_and_handed_over_when_idle_or_due() {
        let mut b = CounterBatch::default();
        assert!(!b.due(true, 0), "nothing to hand over");
        b.add(7, 1);
        b.add(7, 2);
        b.add(9, 5);
        assert!(!b.due(false, FLUSH_MS - 1), "busy and recent: wait");
        assert!(b.due(true, 1), "idle: at once");
        assert!(b.due(false, FLUSH_MS), "busy but due");
        let mut got = b.take(FLUSH_MS);
        got.sort();
        assert_eq!(got, vec![(7, 3), (9, 5)]);
        assert!(!b.due(true, FLUSH_MS), "taken");
        b.add(7, u64::MAX);
        b.add(7, 1);
        assert!(!b.due(false, 2 * FLUSH_MS - 1), "the clock restarted");
        assert_eq!(b.take(2 * FLUSH_MS), vec![(7, u64::MAX)], "saturates");
    }
}
