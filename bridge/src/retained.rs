//! The bridge's own recent batches, kept for peers that catch up: a queue bounded
//! by bytes (the oldest batches give way), so what a late joiner receives is the
//! replica's most recent routing, and memory is bounded whatever the traffic.

use bytes::Bytes;
use std::collections::VecDeque;

#[derive(Debug, Default)]
pub struct Retained {
    batches: VecDeque<Bytes>,
    bytes: usize,
    limit: usize,
}

impl Retained {
    pub fn new(limit: usize) -> Retained {
        Retained {
            limit,
            ..Retained::default()
        }
    }

    /// Keeps `batch`, dropping the oldest ones beyond the limit (a batch larger than
    /// the whole limit is not kept).
    pub fn push(&mut self, batch: Bytes) {
        if batch.len() > self.limit {
            return;
        }
        self.bytes += batch.len();
        self.batches.push_back(batch);
        while self.bytes > self.limit {
            match self.batches.pop_front() {
                Some(old) => self.bytes -= old.len(),
                None => break,
            }
        }
    }

    /// Oldest first, so a replay applies them in the order they happened.
    pub fn snapshot(&self) -> Vec<Bytes> {
        self.batches.iter().cloned().collect()
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_batches_are_kept_within_the_limit() {
        let mut r = Retained::new(10);
        for b in ["aaaa", "bbbb", "cccc"] {
            r.push(Bytes::from(b));
        }
        assert_eq!(r.snapshot(), vec![Bytes::from("bbbb"), Bytes::from("cccc")]);
        assert_eq!(r.bytes(), 8);
        r.push(Bytes::from("x".repeat(11)));
        assert_eq!(
            r.bytes(),
            8,
            "larger than the limit: not kept, nothing dropped"
        );
        r.push(Bytes::from("dddddddddd"));
        assert_eq!(r.snapshot(), vec![Bytes::from("dddddddddd")]);
    }
}
