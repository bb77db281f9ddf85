//! The state of a publisher, sans-IO: what vLLM 0.34's `ZmqEventPublisher` keeps
//! between the messages it sends.

use std::collections::VecDeque;

use crate::encode::{
    decode_replay_request, encode_message, encode_replay_end, encode_replay_reply,
};
use crate::wire::{DecodeError, EventBatch};

/// Sequence numbers, the replay buffer and the topic of one publisher (one per
/// DP rank). The caller sends what it returns: [`Publisher::publish`]'s frames
/// on its PUB socket, [`Publisher::replay`]'s on its ROUTER socket after the
/// requester's identity frame.
#[derive(Clone, Debug)]
pub struct Publisher {
    topic: Vec<u8>,
    next_seq: u64,
    buffer_steps: usize,
    /// `(seq, payload)`, oldest first, at most `buffer_steps`.
    buffer: VecDeque<(u64, Vec<u8>)>,
}

impl Publisher {
    /// vLLM's `buffer_steps` default: the batches kept for replay.
    pub const DEFAULT_BUFFER_STEPS: usize = 10_000;

    /// A publisher whose first batch is seq 0. `topic` is vLLM's `topic` setting
    /// (empty by default); `buffer_steps` batches are kept for replay (none for 0,
    /// as a `deque(maxlen=0)` keeps none).
    pub fn new(topic: impl Into<Vec<u8>>, buffer_steps: usize) -> Self {
        Self {
            topic: topic.into(),
            next_seq: 0,
            buffer_steps,
            buffer: VecDeque::with_capacity(buffer_steps.min(1024)),
        }
    }

    /// The topic frame of every message.
    pub fn topic(&self) -> &[u8] {
        &self.topic
    }

    /// The seq the next batch gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// The frames of `batch` under the next seq, `[topic, seq, payload]`; the
    /// payload is kept for replays, the oldest one dropped past `buffer_steps`.
    pub fn publish(&mut self, batch: &EventBatch) -> [Vec<u8>; 3] {
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let frames = encode_message(&self.topic, seq, batch);
        if self.buffer_steps > 0 {
            if self.buffer.len() >= self.buffer_steps {
                self.buffer.pop_front();
            }
            self.buffer.push_back((seq, frames[2].clone()));
        }
        frames
    }

    /// The answer to one replay request, given the frames the ROUTER socket
    /// received after the requester's identity (`[delimiter, start_seq]`): every
    /// buffered batch from `start_seq` on, oldest first, each as
    /// `["", topic, seq, payload]`, then the end marker `["", "", END_SEQ, ""]`.
    /// A request of another shape gets no answer in vLLM: an error here.
    pub fn replay(&self, request: &[&[u8]]) -> Result<Vec<[Vec<u8>; 4]>, DecodeError> {
        let start = decode_replay_request(request)?;
        let mut replies: Vec<[Vec<u8>; 4]> = self
            .buffer
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .map(|(seq, payload)| encode_replay_reply(&self.topic, *seq, payload))
            .collect();
        replies.push(encode_replay_end());
        Ok(replies)
    }
}

impl Default for Publisher {
    /// vLLM's defaults: topic `""`, 10 000 batches kept.
    fn default() -> Self {
        Self::new(Vec::new(), Self::DEFAULT_BUFFER_STEPS)
    }
}
