//! KV cache events, published as vLLM 0.34 publishes them with
//! `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
//! "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558"}'`, so a router
//! subscribes to the mock as it would to vLLM.
//!
//! What the prefix cache does becomes events ([`Recorder`]), per request as vLLM
//! publishes them per scheduler step: one [`EventBatch`] for each request that
//! changed the cache, none for one that did not.
//!
//! * The blocks a request newly caches: one `BlockStored` per run of consecutive
//!   blocks, as vLLM's `cache_full_blocks` builds it for a request without LoRA,
//!   multimodal input or salt: `block_hashes` (vLLM's `sha256_cbor` chain over
//!   [`crate::tokenizer`]'s ids, from the none hash of `vllm-none-hash`, published
//!   as the digest's last 8 bytes, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`),
//!   `parent_block_hash` (the block before the run, nil for a run that starts the
//!   prompt), `token_ids` (the run's), `block_size` 16, `lora_id` nil, `medium`
//!   `"GPU"`, `lora_name` nil, `extra_keys` one nil per block and `group_idx` 0.
//! * Every block the LRU evicts: one `BlockRemoved` each (`block_hashes` that one
//!   hash, `medium` `"GPU"`, `group_idx` 0), before the request's `BlockStored`s,
//!   as vLLM evicts when it allocates, before it caches.
//! * `POST /admin/reset_prefix_cache`: an `AllBlocksCleared` batch of its own.
//!
//! A block of the prompt that is stored and evicted again by the same request
//! (a prompt longer than the cache) is in no event. The batch's `ts` is the time it
//! was made, its `data_parallel_rank` 0. Sequence numbers, the replay buffer and
//! the encoding are `llm_kv_events::Publisher`'s; the sockets are the `zeromq`
//! crate's, driven by one task ([`spawn`]).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use bytes::Bytes;
use llm_kv_events::{
    vllm, BlockHash, BlockRemoved, BlockStored, Event, EventBatch, Publisher, TokenIds,
};
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use crate::cache::{self, CacheChanges, CacheLookup, PrefixCache, CHARS_PER_TOKEN};
use crate::config::Config;
use crate::prompting::IdsOf;
use crate::tokenizer;

/// What vLLM 0.34 sends as `medium` for its GPU block pool.
pub const MEDIUM_GPU: &str = "GPU";

/// The hashes vLLM would publish for the full blocks of `text` in blocks of
/// `block_tokens` ids: what a router looks a prompt up with.
pub fn published_hashes(text: &str, block_tokens: usize) -> Vec<BlockHash> {
    let none = vllm::none_hash(vllm::DEFAULT_NONE_HASH_SEED);
    vllm::block_hashes(&tokenizer::token_ids(text), block_tokens, &none)
        .iter()
        .map(|d| vllm::external_hash(d, true))
        .collect()
}

/// A prompt's ids and published hashes, computed before the cache is locked.
#[derive(Clone, Debug)]
pub struct Prepared {
    token_ids: Vec<u32>,
    hashes: Vec<BlockHash>,
}

fn prepare(prompt: &str, block_tokens: usize, none_hash: &[u8; 32], ids: IdsOf) -> Prepared {
    let token_ids = ids(prompt);
    let hashes = vllm::block_hashes(&token_ids, block_tokens, none_hash)
        .iter()
        .map(|d| vllm::external_hash(d, true))
        .collect();
    Prepared { token_ids, hashes }
}

/// Turns the cache's changes into vLLM's events, and remembers the published hash
/// of every cached block (the cache keys its blocks its own way) for the
/// `BlockRemoved` of its eviction.
#[derive(Clone, Debug)]
pub struct Recorder {
    block_tokens: usize,
    none_hash: [u8; 32],
    published: HashMap<cache::BlockHash, BlockHash>,
}

impl Recorder {
    /// For a cache of `block_chars`-character blocks, which must be whole tokens.
    pub fn new(block_chars: usize) -> anyhow::Result<Self> {
        if block_chars == 0 || !block_chars.is_multiple_of(CHARS_PER_TOKEN) {
            bail!(
                "KV events need --block-chars to be a multiple of {CHARS_PER_TOKEN} \
                 (whole tokens), not {block_chars}"
            );
        }
        Ok(Self {
            block_tokens: block_chars / CHARS_PER_TOKEN,
            none_hash: vllm::none_hash(vllm::DEFAULT_NONE_HASH_SEED),
            published: HashMap::new(),
        })
    }

    /// Tokens per block: the events' `block_size`.
    pub fn block_tokens(&self) -> usize {
        self.block_tokens
    }

    /// The ids and hashes of `prompt`.
    pub fn prepare(&self, prompt: &str) -> Prepared {
        prepare(
            prompt,
            self.block_tokens,
            &self.none_hash,
            tokenizer::token_ids,
        )
    }

    /// The events of one request's cache changes; `prepared` is its prompt's.
    pub fn record(&mut self, changes: &CacheChanges, prepared: &Prepared) -> Vec<Event> {
        let mut events = Vec::new();
        for victim in &changes.evicted {
            if let Some(hash) = self.published.remove(victim) {
                events.push(Event::BlockRemoved(BlockRemoved {
                    block_hashes: vec![hash],
                    medium: Some(MEDIUM_GPU.into()),
                    group_idx: Some(0),
                    locality: None,
                    ownership: None,
                }));
            }
        }
        let mut rest = changes.stored.as_slice();
        while let Some(&start) = rest.first() {
            let len = rest
                .iter()
                .zip(start..)
                .take_while(|(&i, want)| i == *want)
                .count();
            rest = &rest[len..];
            let run = start..start + len;
            // Every cached block is a full block of the prompt, so it has a hash and
            // its tokens; `get` only keeps a broken invariant from panicking.
            let (Some(hashes), Some(token_ids)) = (
                prepared.hashes.get(run.clone()),
                prepared
                    .token_ids
                    .get(run.start * self.block_tokens..run.end * self.block_tokens),
            ) else {
                continue;
            };
            for (block, hash) in changes
                .blocks
                .get(run.clone())
                .unwrap_or(&[])
                .iter()
                .zip(hashes)
            {
                self.published.insert(*block, hash.clone());
            }
            let parent_block_hash = start
                .checked_sub(1)
                .and_then(|p| prepared.hashes.get(p))
                .cloned();
            // What vLLM 0.34 sends for a plain request's blocks.
            events.push(Event::BlockStored(Box::new(BlockStored {
                medium: Some(MEDIUM_GPU.into()),
                extra_keys: Some(vec![None; len]),
                group_idx: Some(0),
                ..BlockStored::new(
                    hashes.to_vec(),
                    parent_block_hash,
                    TokenIds::Ids(token_ids.to_vec()),
                    self.block_tokens as u64,
                )
            })));
        }
        events
    }

    /// The cache was emptied.
    pub fn clear(&mut self) -> Vec<Event> {
        self.published.clear();
        vec![Event::AllBlocksCleared]
    }
}

/// A batch made now, as the publisher of DP rank 0 sends it.
pub fn batch(events: Vec<Event>) -> EventBatch {
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    EventBatch {
        ts,
        events,
        data_parallel_rank: Some(0),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The running publisher: the recorder, and the queue to the socket task.
#[derive(Debug)]
pub struct KvEvents {
    /// The recorder's, copied to hash prompts without its lock.
    block_tokens: usize,
    none_hash: [u8; 32],
    /// The prompts' token ids (`--tokenizer`: a model's, as codes).
    ids: IdsOf,
    recorder: Mutex<Recorder>,
    batches: mpsc::UnboundedSender<EventBatch>,
}

impl KvEvents {
    /// [`PrefixCache::lookup_and_insert`] on `cache`, publishing what it changed;
    /// with the prompt's full blocks.
    /// The batch is queued while the cache is still locked, so batches go out in
    /// the order the cache changed.
    pub fn lookup_and_insert(
        &self,
        cache: &Mutex<PrefixCache>,
        prompt: &str,
    ) -> (CacheLookup, Vec<cache::BlockHash>) {
        let prepared = prepare(prompt, self.block_tokens, &self.none_hash, self.ids);
        let mut cache = lock(cache);
        let (lookup, changes) = cache.lookup_and_insert_tracked(prompt);
        let events = lock(&self.recorder).record(&changes, &prepared);
        if !events.is_empty() {
            // The task only stops when the process does.
            let _ = self.batches.send(batch(events));
        }
        (lookup, changes.blocks)
    }

    /// Empties `cache` and publishes `AllBlocksCleared`.
    pub fn clear(&self, cache: &Mutex<PrefixCache>) {
        let mut cache = lock(cache);
        cache.clear();
        let events = lock(&self.recorder).clear();
        let _ = self.batches.send(batch(events));
    }
}

/// `tcp://HOST:PORT`, `*` meaning every interface as in ZMQ: what the `zeromq`
/// crate binds (it takes only an address for the host).
fn bind_address(endpoint: &str) -> anyhow::Result<String> {
    let Some(rest) = endpoint.strip_prefix("tcp://") else {
        bail!("{endpoint:?}: only tcp://HOST:PORT endpoints are supported");
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        bail!("{endpoint:?}: expected tcp://HOST:PORT");
    };
    port.parse::<u16>()
        .with_context(|| format!("{endpoint:?}: bad port"))?;
    let host = match host {
        "*" => "0.0.0.0",
        h => h,
    };
    Ok(format!("tcp://{host}:{port}"))
}

/// The sockets, bound, with the endpoints they are bound at (port 0 resolved).
pub struct Bound {
    pub events: KvEvents,
    /// The PUB socket's endpoint.
    pub endpoint: String,
    /// The ROUTER socket's, when replay is on.
    pub replay_endpoint: Option<String>,
}

/// Binds the PUB (and ROUTER) sockets `cfg` asks for and starts the task that
/// publishes and answers replays, reading prompts' token ids with `ids`
/// (`crate::prompting::Prompting::ids_of`); `None` when `cfg` publishes nothing.
pub async fn spawn(cfg: &Config, ids: IdsOf) -> anyhow::Result<Option<Bound>> {
    let Some(endpoint) = &cfg.kv_events_endpoint else {
        return Ok(None);
    };
    let recorder = Recorder::new(cfg.block_chars as usize)?;
    let mut publisher_socket = PubSocket::new();
    let bound = publisher_socket
        .bind(&bind_address(endpoint)?)
        .await
        .with_context(|| format!("binding the KV events PUB socket on {endpoint}"))?;
    let endpoint = bound.to_string();
    let (router, replay_endpoint) = match &cfg.kv_events_replay_endpoint {
        None => (None, None),
        Some(replay) => {
            let mut router = RouterSocket::new();
            let bound = router
                .bind(&bind_address(replay)?)
                .await
                .with_context(|| format!("binding the KV events replay socket on {replay}"))?;
            (Some(router), Some(bound.to_string()))
        }
    };
    let publisher = Publisher::new(
        cfg.kv_events_topic.as_bytes().to_vec(),
        cfg.kv_events_buffer_steps,
    );
    let (batches, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(publisher, publisher_socket, router, rx));
    Ok(Some(Bound {
        events: KvEvents {
            block_tokens: recorder.block_tokens,
            none_hash: recorder.none_hash,
            ids,
            recorder: Mutex::new(recorder),
            batches,
        },
        endpoint,
        replay_endpoint,
    }))
}

fn message(frames: impl IntoIterator<Item = Vec<u8>>) -> Option<ZmqMessage> {
    let frames: Vec<Bytes> = frames.into_iter().map(Bytes::from).collect();
    ZmqMessage::try_from(frames).ok()
}

/// Publishes each batch under the next seq, and answers replay requests from the
/// same buffer, as vLLM's publisher thread does. A replay's replies are sent from
/// a task of their own, so a slow requester never holds up publishing.
async fn run(
    mut publisher: Publisher,
    mut socket: PubSocket,
    router: Option<RouterSocket>,
    mut batches: mpsc::UnboundedReceiver<EventBatch>,
) {
    let (requests_tx, mut requests) = mpsc::unbounded_channel::<Vec<Bytes>>();
    let replies = router.map(|router| {
        let (send, mut recv) = router.split();
        tokio::spawn(async move {
            loop {
                match recv.recv().await {
                    Ok(m) => {
                        if requests_tx.send(m.into_vec()).is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        eprintln!("engine-mock: the KV events replay socket failed: {e}");
                        return;
                    }
                }
            }
        });
        send
    });
    loop {
        tokio::select! {
            batch = batches.recv() => {
                let Some(batch) = batch else { return };
                if let Some(m) = message(publisher.publish(&batch)) {
                    // A PUB socket drops what no subscriber can take; so does vLLM's.
                    let _ = socket.send(m).await;
                }
            }
            Some(request) = requests.recv() => {
                let Some(mut send) = replies.clone() else { continue };
                // [identity, delimiter, start_seq]
                let Some((identity, rest)) = request.split_first() else { continue };
                let rest: Vec<&[u8]> = rest.iter().map(Bytes::as_ref).collect();
                let answer = match publisher.replay(&rest) {
                    Ok(answer) => answer,
                    Err(e) => {
                        eprintln!("engine-mock: a KV events replay request was ignored: {e}");
                        continue;
                    }
                };
                let identity = identity.to_vec();
                tokio::spawn(async move {
                    for reply in answer {
                        let frames = std::iter::once(identity.clone()).chain(reply);
                        let Some(m) = message(frames) else { return };
                        if send.send(m).await.is_err() {
                            return;
                        }
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(text: &str) -> Vec<BlockHash> {
        published_hashes(text, 16)
    }

    fn stored(e: &Event) -> &BlockStored {
        match e {
            Event::BlockStored(s) => s,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn endpoints_bind_like_zmq() {
        assert_eq!(bind_address("tcp://*:5557").unwrap(), "tcp://0.0.0.0:5557");
        assert_eq!(
            bind_address("tcp://127.0.0.1:0").unwrap(),
            "tcp://127.0.0.1:0"
        );
        assert!(bind_address("ipc:///tmp/x").is_err());
        assert!(bind_address("tcp://host").is_err());
        assert!(bind_address("tcp://host:99999").is_err());
    }

    #[test]
    fn blocks_must_be_whole_tokens() {
        assert!(Recorder::new(64).is_ok());
        assert_eq!(Recorder::new(32).unwrap().block_tokens(), 8);
        assert!(Recorder::new(65).is_err());
        assert!(Recorder::new(0).is_err());
    }

    /// A store, a divergent prompt over capacity, the gap in the middle of a prompt.
    #[test]
    fn runs_parents_and_evictions() {
        let mut cache = PrefixCache::new(4, 64);
        let mut rec = Recorder::new(64).unwrap();
        let a = "a".repeat(64 * 3);
        let (_, changes) = cache.lookup_and_insert_tracked(&a);
        let events = rec.record(&changes, &rec.prepare(&a));
        assert_eq!(events.len(), 1);
        let s = stored(&events[0]);
        assert_eq!(s.block_hashes, hashes(&a));
        assert_eq!(s.parent_block_hash, None);
        assert_eq!(s.token_ids.len(), 48);
        assert_eq!(s.extra_keys, Some(vec![None, None, None]));

        // Same first block, two new ones: one over capacity, the LRU ("a"'s last).
        let b = "a".repeat(64) + &"b".repeat(128);
        let (_, changes) = cache.lookup_and_insert_tracked(&b);
        let events = rec.record(&changes, &rec.prepare(&b));
        assert_eq!(events.len(), 2);
        assert_eq!(
            events[0],
            Event::BlockRemoved(BlockRemoved {
                block_hashes: vec![hashes(&a)[2].clone()],
                medium: Some("GPU".into()),
                group_idx: Some(0),
                locality: None,
                ownership: None,
            })
        );
        let s = stored(&events[1]);
        assert_eq!(s.block_hashes, hashes(&b)[1..]);
        assert_eq!(s.parent_block_hash.as_ref(), Some(&hashes(&a)[0]));
        assert_eq!(
            s.token_ids.ids().unwrap(),
            &tokenizer::token_ids(&b)[16..48]
        );

        // Nothing changes: no events.
        let (_, changes) = cache.lookup_and_insert_tracked(&b);
        assert!(rec.record(&changes, &rec.prepare(&b)).is_empty());

        assert_eq!(rec.clear(), vec![Event::AllBlocksCleared]);
        cache.clear();
        let (_, changes) = cache.lookup_and_insert_tracked(&b);
        let events = rec.record(&changes, &rec.prepare(&b));
        assert_eq!(stored(&events[0]).block_hashes, hashes(&b));
    }

    #[test]
    fn stored_blocks_split_into_runs() {
        let mut rec = Recorder::new(4).unwrap();
        let text = "abcdefghijklmnopqrst";
        let prepared = rec.prepare(text);
        let changes = CacheChanges {
            blocks: cache::block_hashes(text, 4),
            stored: vec![0, 2, 3],
            evicted: Vec::new(),
        };
        let events = rec.record(&changes, &prepared);
        let all = published_hashes(text, 1);
        assert_eq!(events.len(), 2);
        let (first, second) = (stored(&events[0]), stored(&events[1]));
        assert_eq!(
            (
                first.block_hashes.as_slice(),
                first.parent_block_hash.as_ref()
            ),
            (&all[0..1], None)
        );
        assert_eq!(
            (
                second.block_hashes.as_slice(),
                second.parent_block_hash.as_ref()
            ),
            (&all[2..4], Some(&all[1]))
        );
        assert_eq!(second.block_size, 1);
        // An evicted block the recorder never published (impossible) is skipped.
        let changes = CacheChanges {
            evicted: vec![[9; 32]],
            ..CacheChanges::default()
        };
        assert!(rec.record(&changes, &prepared).is_empty());
    }
}
