//! The KV cache events vLLM and SGLang publish (`--kv-events-config`), decoded, and
//! the block hashes in them, recomputed.
//!
//! A router that knows which blocks each engine really holds can route on the
//! engine's cache instead of on a guess of it. The engines say so on a ZMQ PUB
//! socket; this crate turns the frames of one message into [`Message`]
//! ([`decode_message`]) and computes, from a prompt's token ids, the hashes the
//! engine will publish for it ([`vllm`], [`sglang`]), so that a prompt can be
//! looked up in an index built from the events.
//!
//! It also encodes them, as vLLM 0.34 sends them ([`encode_message`]), and keeps
//! a publisher's sequence numbers and replay buffer ([`Publisher`]), for a mock
//! engine that publishes like vLLM.
//!
//! It does no I/O: the caller owns the sockets, the tokenizer and the index.
//! Nothing here panics on any input.

mod cbor;
mod encode;
mod publish;
pub mod sglang;
mod value;
pub mod vllm;
mod wire;

pub use cbor::CborValue;
pub use encode::{
    decode_replay_request, encode_batch, encode_message, encode_replay_end, encode_replay_reply,
};
pub use publish::Publisher;
pub use value::Value;
pub use wire::{
    decode_batch, decode_message, decode_replay_reply, replay_request, BlockHash, BlockRemoved,
    BlockStored, DecodeError, Event, EventBatch, Message, ReplayReply, TokenIds, END_SEQ,
};
