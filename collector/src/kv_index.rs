//! What one engine's KV cache holds, from the events it publishes (vLLM and SGLang
//! `--kv-events-config`, decoded by `llm_kv_events`): the block hashes it stored and
//! has not removed, on the GPU.
//!
//! The events are a stream with a dense sequence number, and the index is only as
//! true as the stream is whole: a number skipped means events were lost (ZMQ PUB
//! drops under pressure), so the caller asks the publisher's replay socket for them;
//! one that goes back means the publisher restarted, with an empty cache. What
//! cannot be repaired leaves the index stale, and a stale index must not be routed
//! by (the tree is the fallback) until the engine starts over. Sans-IO: the sockets
//! are `crate::kv_events`'.

use std::collections::HashSet;

use llm_kv_events::{BlockHash, Event, EventBatch};

/// Where a batch's sequence number stands against the last one applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// The first batch heard from this publisher.
    First,
    /// The one after the last applied.
    Next,
    /// Batches `missing_from..seq` were lost: replay them before this one.
    Gap { missing_from: u64 },
    /// At or before the last applied, but not a replay: the publisher restarted
    /// (its numbers start again at 0) and its cache with it.
    Restart,
}

/// Whether the index can be routed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// Nothing heard yet.
    Unheard,
    /// Every batch since the publisher started (or since the first one heard, which
    /// a new subscriber cannot do better than) was applied in order.
    Whole,
    /// Batches were lost and could not be replayed: what the engine holds is no
    /// longer known, until it clears its cache or restarts.
    Stale,
    /// The engine counted `QUIET_TOKENS` prompt tokens since its last batch arrived:
    /// it changed its cache and nothing was heard (a subscription that died without
    /// a word, a publisher that stopped). The next batch says: in sequence, nothing
    /// was lost; past a gap, the gap is replayed or lost as any other.
    Quiet,
}

/// Prompt tokens an engine may count with no batch heard before its index is not
/// trusted: dozens of requests, each of which stores blocks unless its prompt was
/// cached whole.
pub const QUIET_TOKENS: u64 = 65_536;

/// Counts for the collector's own metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCounts {
    pub batches: u64,
    pub events: u64,
    /// Gaps the replay filled, and gaps it could not.
    pub gaps_repaired: u64,
    pub gaps_unrepaired: u64,
    pub restarts: u64,
}

/// One engine's block index.
#[derive(Debug, Clone)]
pub struct KvIndex {
    held: HashSet<BlockHash>,
    last_seq: Option<u64>,
    trust: Trust,
    /// The engine's prompt-token counter as last scraped, and as it was when the
    /// last batch arrived.
    counter: Option<u64>,
    counter_at_batch: Option<u64>,
    /// The batches (sequence number, timestamp bits) the last catch-up applied:
    /// the same batches arriving live after it are not a restart.
    replayed: HashSet<(u64, u64)>,
    pub counts: KvCounts,
}

impl Default for KvIndex {
    fn default() -> Self {
        KvIndex {
            held: HashSet::new(),
            last_seq: None,
            trust: Trust::Unheard,
            counter: None,
            counter_at_batch: None,
            replayed: HashSet::new(),
            counts: KvCounts::default(),
        }
    }
}

/// Blocks on the GPU (older engines send no medium): what a prefix hit reads.
fn on_gpu(medium: Option<&str>) -> bool {
    medium.is_none_or(|m| m.eq_ignore_ascii_case("gpu"))
}

impl KvIndex {
    pub fn arrival(&self, seq: u64) -> Arrival {
        match self.last_seq {
            None => Arrival::First,
            Some(last) if seq == last.wrapping_add(1) => Arrival::Next,
            Some(last) if seq > last => Arrival::Gap {
                missing_from: last + 1,
            },
            Some(_) => Arrival::Restart,
        }
    }

    /// Applies batch `seq`, in order (the caller replayed any gap first). A batch at
    /// or before the last applied is a duplicate and changes nothing.
    pub fn apply(&mut self, seq: u64, batch: &EventBatch) {
        if self.last_seq.is_some_and(|last| seq <= last) {
            return;
        }
        self.last_seq = Some(seq);
        // In order (the caller replayed or gave up on any gap): nothing was lost.
        if matches!(self.trust, Trust::Unheard | Trust::Quiet) {
            self.trust = Trust::Whole;
        }
        self.counter_at_batch = self.counter;
        self.counts.batches += 1;
        for event in &batch.events {
            self.counts.events += 1;
            match event {
                Event::BlockStored(s) if on_gpu(s.medium.as_deref()) => {
                    self.held.extend(s.block_hashes.iter().cloned());
                }
                Event::BlockRemoved(r) if on_gpu(r.medium.as_deref()) => {
                    for h in &r.block_hashes {
                        self.held.remove(h);
                    }
                }
                Event::AllBlocksCleared => {
                    self.held.clear();
                    // An empty cache is known exactly, whatever was lost before.
                    self.trust = Trust::Whole;
                }
                _ => {}
            }
        }
    }

    /// The engine's prompt-token counter, as the collector scraped it: an engine that
    /// counted `QUIET_TOKENS` since its last batch without a word goes `Quiet`.
    pub fn observe_counter(&mut self, total: u64) {
        self.counter = Some(total);
        // Before its first batch, an engine that has taken no prompt holds nothing
        // and has nothing to publish: its index is whole (else one never sent a
        // request stays unheard, and a router that waits for every engine's index
        // waits for ever). Once it counts prompts with no batch heard, its first
        // batch may have gone before this subscription took hold: unheard again.
        if self.last_seq.is_none() && matches!(self.trust, Trust::Unheard | Trust::Whole) {
            self.trust = if total == 0 {
                Trust::Whole
            } else {
                Trust::Unheard
            };
        }
        let since = match self.counter_at_batch {
            // A counter that went back is a restarted engine: count from there.
            Some(at) if total >= at => total - at,
            _ => {
                self.counter_at_batch = Some(total);
                return;
            }
        };
        if self.trust == Trust::Whole && since >= QUIET_TOKENS {
            self.trust = Trust::Quiet;
        }
    }

    /// Where to ask the replay socket from when the engine counts prompts and
    /// nothing is heard (`None`: nothing to ask): from the start for an engine never
    /// heard (its batches went before this subscription took hold), after the last
    /// batch for a quiet one (a subscription that died without a word).
    pub fn catch_up_from(&self) -> Option<u64> {
        match (self.trust, self.last_seq) {
            (Trust::Unheard, None) if self.counter.is_some_and(|c| c > 0) => Some(0),
            (Trust::Quiet, Some(last)) => Some(last.saturating_add(1)),
            _ => None,
        }
    }

    /// The batches a catch-up applied (their sequence numbers and timestamps).
    pub fn caught_up(&mut self, batches: impl IntoIterator<Item = (u64, f64)>) {
        self.replayed.clear();
        self.replayed
            .extend(batches.into_iter().map(|(seq, ts)| (seq, ts.to_bits())));
    }

    /// Whether batch `seq` sent at `ts` is one a catch-up applied already.
    pub fn is_replayed(&self, seq: u64, ts: f64) -> bool {
        self.replayed.contains(&(seq, ts.to_bits()))
    }

    /// The publisher restarted: its cache is empty, and its numbers start again.
    pub fn restart(&mut self) {
        self.held.clear();
        self.last_seq = None;
        self.trust = Trust::Unheard;
        self.counts.restarts += 1;
    }

    /// The replay filled the gap before a batch.
    pub fn repaired(&mut self) {
        self.counts.gaps_repaired += 1;
    }

    /// Batches up to `seq` are lost for good: the index goes stale, and takes up
    /// the stream again at `seq`.
    pub fn unrepaired(&mut self, seq: u64) {
        self.counts.gaps_unrepaired += 1;
        self.trust = Trust::Stale;
        self.last_seq = Some(seq.saturating_sub(1));
    }

    pub fn trust(&self) -> Trust {
        self.trust
    }

    pub fn holds(&self, hash: &BlockHash) -> bool {
        self.held.contains(hash)
    }

    /// Blocks held on the GPU.
    pub fn blocks(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_kv_events::{BlockRemoved, BlockStored, TokenIds};

    fn h(v: u64) -> BlockHash {
        BlockHash::Int(v)
    }

    fn stored(hashes: &[u64], medium: Option<&str>) -> Event {
        Event::BlockStored(Box::new(BlockStored {
            medium: medium.map(str::to_string),
            ..BlockStored::new(
                hashes.iter().map(|&v| h(v)).collect(),
                None,
                TokenIds::Ids(vec![7; 16 * hashes.len()]),
                16,
            )
        }))
    }

    fn removed(hashes: &[u64]) -> Event {
        Event::BlockRemoved(BlockRemoved {
            block_hashes: hashes.iter().map(|&v| h(v)).collect(),
            medium: Some("GPU".into()),
            group_idx: None,
            locality: None,
            ownership: None,
        })
    }

    fn batch(events: Vec<Event>) -> EventBatch {
        EventBatch {
            ts: 0.0,
            events,
            data_parallel_rank: None,
        }
    }

    #[test]
    fn stored_minus_removed_on_the_gpu_is_what_it_holds() {
        let mut ix = KvIndex::default();
        assert_eq!(
            (ix.trust(), ix.arrival(7)),
            (Trust::Unheard, Arrival::First)
        );
        ix.apply(
            7,
            &batch(vec![
                stored(&[1, 2, 3], Some("GPU")),
                stored(&[9], Some("CPU")),
            ]),
        );
        ix.apply(8, &batch(vec![removed(&[2]), stored(&[4], None)]));
        assert_eq!(ix.trust(), Trust::Whole);
        assert!(ix.holds(&h(1)) && ix.holds(&h(3)) && ix.holds(&h(4)));
        assert!(!ix.holds(&h(2)), "removed");
        assert!(!ix.holds(&h(9)), "offloaded to the CPU: not a GPU hit");
        assert_eq!(
            (ix.blocks(), ix.counts.batches, ix.counts.events),
            (3, 2, 4)
        );
        ix.apply(9, &batch(vec![Event::AllBlocksCleared]));
        assert_eq!(ix.blocks(), 0);
    }

    #[test]
    fn sequence_numbers_say_next_gap_or_restart_and_duplicates_change_nothing() {
        let mut ix = KvIndex::default();
        ix.apply(0, &batch(vec![stored(&[1], None)]));
        assert_eq!(ix.arrival(1), Arrival::Next);
        assert_eq!(ix.arrival(5), Arrival::Gap { missing_from: 1 });
        assert_eq!(ix.arrival(0), Arrival::Restart);
        ix.apply(0, &batch(vec![stored(&[2], None)]));
        assert!(!ix.holds(&h(2)), "a duplicate is not applied again");
    }

    #[test]
    fn a_silent_engine_is_caught_up_from_the_replay_and_its_batches_are_not_a_restart() {
        let mut ix = KvIndex::default();
        assert_eq!(ix.catch_up_from(), None, "no counter: nothing to say");
        ix.observe_counter(0);
        assert_eq!(ix.catch_up_from(), None, "no prompt, nothing to hear");
        ix.observe_counter(500);
        assert_eq!(ix.catch_up_from(), Some(0), "prompts, nothing heard");
        ix.apply(0, &batch(vec![stored(&[1], None)]));
        ix.apply(1, &batch(vec![stored(&[2], None)]));
        ix.caught_up([(0, 0.0), (1, 0.0)]);
        assert_eq!(ix.catch_up_from(), None, "whole");
        // Batch 1 arriving live after the catch-up: applied already.
        assert!(ix.is_replayed(1, 0.0));
        assert!(!ix.is_replayed(1, 7.0), "another batch 1: a restart's");
        assert!(!ix.is_replayed(2, 0.0));
        ix.observe_counter(500 + QUIET_TOKENS);
        assert_eq!(ix.trust(), Trust::Quiet);
        assert_eq!(ix.catch_up_from(), Some(2), "after the last batch");
    }

    #[test]
    fn an_engine_that_took_no_prompt_is_known_to_hold_nothing() {
        let mut ix = KvIndex::default();
        ix.observe_counter(0);
        assert_eq!(ix.trust(), Trust::Whole, "no prompt, no block");
        assert!(!ix.holds(&h(1)));
        // One that took prompts before anything was heard stays unknown, and so does
        // one that took its first once its index was known empty, until its batch.
        let mut busy = KvIndex::default();
        busy.observe_counter(1);
        assert_eq!(busy.trust(), Trust::Unheard);
        let mut woke = KvIndex::default();
        woke.observe_counter(0);
        woke.observe_counter(40);
        assert_eq!(woke.trust(), Trust::Unheard, "its first batch may be lost");
        woke.apply(0, &batch(vec![stored(&[1], None)]));
        woke.observe_counter(40);
        assert_eq!(woke.trust(), Trust::Whole);
        // A restarted publisher is unheard again until its counter says otherwise.
        ix.apply(0, &batch(vec![stored(&[1], None)]));
        ix.observe_counter(100);
        ix.restart();
        ix.observe_counter(100);
        assert_eq!(ix.trust(), Trust::Unheard);
        ix.observe_counter(0);
        assert_eq!(ix.trust(), Trust::Whole, "the counter restarted with it");
    }

    #[test]
    fn an_engine_that_counts_tokens_without_a_word_goes_quiet_until_its_next_batch() {
        let mut ix = KvIndex::default();
        ix.observe_counter(1_000_000);
        assert_eq!(ix.trust(), Trust::Unheard, "nothing heard yet");
        ix.apply(0, &batch(vec![stored(&[1], None)]));
        ix.observe_counter(1_000_000 + QUIET_TOKENS - 1);
        assert_eq!(ix.trust(), Trust::Whole);
        ix.observe_counter(1_000_000 + QUIET_TOKENS);
        assert_eq!(ix.trust(), Trust::Quiet);
        // The next batch in sequence: nothing was lost.
        ix.apply(1, &batch(vec![stored(&[2], None)]));
        assert_eq!(ix.trust(), Trust::Whole);
        ix.observe_counter(1_000_000 + QUIET_TOKENS + 10);
        assert_eq!(ix.trust(), Trust::Whole, "counted from the last batch");
        // A counter that goes back (a restart) counts from there; a stale index
        // stays stale however quiet.
        ix.observe_counter(5);
        ix.unrepaired(9);
        ix.observe_counter(5 + QUIET_TOKENS);
        assert_eq!(ix.trust(), Trust::Stale);
    }

    #[test]
    fn a_lost_gap_leaves_it_stale_until_the_engine_clears_or_restarts() {
        let mut ix = KvIndex::default();
        ix.apply(0, &batch(vec![stored(&[1], None)]));
        ix.unrepaired(4);
        assert_eq!((ix.trust(), ix.arrival(4)), (Trust::Stale, Arrival::Next));
        ix.apply(4, &batch(vec![stored(&[2], None)]));
        assert_eq!(ix.trust(), Trust::Stale, "still unknown what was lost");
        ix.apply(5, &batch(vec![Event::AllBlocksCleared]));
        assert_eq!(ix.trust(), Trust::Whole);
        ix.unrepaired(9);
        ix.restart();
        assert_eq!(
            (ix.trust(), ix.blocks(), ix.arrival(0)),
            (Trust::Unheard, 0, Arrival::First)
        );
        assert_eq!((ix.counts.gaps_unrepaired, ix.counts.restarts), (2, 1));
    }
}
