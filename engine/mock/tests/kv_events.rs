//! The mock's KV cache events, received as a router receives vLLM's: the real
//! binary with both endpoints on free ports, a ZMQ SUB socket on its publisher and
//! a DEALER on its replay socket (the `zeromq` crate), decoded with
//! `llm_kv_events`.

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use support::Running;

use bytes::Bytes;
use engine_mock::prompt::{self, Endpoint};
use engine_mock::tokenizer;
use llm_kv_events::{
    decode_message, decode_replay_reply, replay_request, vllm, BlockHash, BlockRemoved,
    BlockStored, Event, Message, ReplayReply, TokenIds,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::timeout;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

/// Long enough for a loaded CI machine, short enough to fail a test that hangs.
const WAIT: Duration = Duration::from_secs(20);

/// A running engine mock publishing KV events; killed and reaped on drop.
struct Mock {
    _proc: Running,
    port: u16,
    /// The PUB socket's endpoint, as the mock printed it.
    events: String,
    /// The ROUTER socket's.
    replay: String,
}

impl Mock {
    /// Both endpoints on port 0: the mock binds free ports and prints them.
    fn start(extra: &[&str]) -> Mock {
        let mut args = vec!["--port", "0", "--worker-id", "kv"];
        args.extend(["--kv-events-endpoint", "tcp://127.0.0.1:0"]);
        args.extend(["--kv-events-replay-endpoint", "tcp://127.0.0.1:0"]);
        args.extend(extra);
        let proc = Running::start(&args);
        let line = proc.line.clone();
        // engine-mock kv kv-events tcp://127.0.0.1:P kv-events-replay tcp://127.0.0.1:Q listening on 127.0.0.1:PORT
        let words: Vec<&str> = line.split_whitespace().collect();
        let after = |key: &str| {
            words
                .iter()
                .position(|w| *w == key)
                .and_then(|i| words.get(i + 1))
                .unwrap_or_else(|| panic!("no {key:?} in the startup line {line:?}"))
                .to_string()
        };
        let mock = Mock {
            events: after("kv-events"),
            replay: after("kv-events-replay"),
            port: after("on")
                .strip_prefix("127.0.0.1:")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("unexpected startup line {line:?}")),
            _proc: proc,
        };
        assert!(mock.events.starts_with("tcp://127.0.0.1:"), "{line}");
        assert_ne!(mock.events, "tcp://127.0.0.1:0", "port 0 is resolved");
        mock
    }

    async fn post(&self, path: &str, body: &Value) -> Value {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .expect("connect");
        let body = body.to_string();
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        s.write_all(request.as_bytes()).await.unwrap();
        let mut raw = Vec::new();
        timeout(WAIT, s.read_to_end(&mut raw))
            .await
            .expect("a reply in time")
            .expect("read the reply");
        let text = String::from_utf8(raw).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").expect("header end");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}\n{body}");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// A chat request; returns the prompt as the mock flattened it.
    async fn chat(&self, content: &str) -> String {
        let body = json!({
            "model": "mock",
            "max_tokens": 1,
            "messages": [{"role": "user", "content": content}],
        });
        self.post("/v1/chat/completions", &body).await;
        prompt::flatten(Endpoint::Chat, &body).unwrap()
    }

    async fn reset(&self) {
        let reply = self.post("/admin/reset_prefix_cache", &json!({})).await;
        assert_eq!(reply["success"], true);
    }
}

fn decode(m: ZmqMessage) -> Message {
    let frames = m.into_vec();
    let refs: Vec<&[u8]> = frames.iter().map(Bytes::as_ref).collect();
    decode_message(&refs).unwrap_or_else(|e| panic!("{e}"))
}

/// A SUB socket that has caught up with the publisher, checking that every
/// batch it receives has the next seq.
struct Events {
    sub: SubSocket,
    next_seq: u64,
}

impl Events {
    /// A PUB socket sends only to subscribers it knows, and a subscription takes
    /// a moment to reach it: until one probe's batch arrives, reset the cache (a
    /// batch of its own, `AllBlocksCleared`) and wait a little for it. Then read
    /// up to the last probe's batch, so the next one is the test's.
    async fn subscribe(mock: &Mock) -> Events {
        let mut sub = SubSocket::new();
        sub.connect(&mock.events)
            .await
            .expect("connect the SUB socket");
        sub.subscribe("").await.unwrap();
        let deadline = Instant::now() + WAIT;
        let mut probes = 0u64;
        let mut m = loop {
            mock.reset().await;
            probes += 1;
            if let Ok(m) = timeout(Duration::from_millis(200), sub.recv()).await {
                break decode(m.unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "no KV events message in {WAIT:?}"
            );
        };
        loop {
            assert_eq!(m.batch.events, [Event::AllBlocksCleared]);
            assert!(m.seq < probes, "{} from {probes} probes", m.seq);
            if m.seq + 1 == probes {
                break;
            }
            m = decode(timeout(WAIT, sub.recv()).await.unwrap().unwrap());
        }
        Events {
            sub,
            next_seq: probes,
        }
    }

    /// The next batch, which must have the next seq: seqs are dense.
    async fn next(&mut self) -> Message {
        let m = timeout(WAIT, self.sub.recv())
            .await
            .expect("a KV events message in time")
            .expect("receive");
        let m = decode(m);
        assert_eq!(m.seq, self.next_seq, "seqs are dense");
        self.next_seq += 1;
        assert_eq!(m.batch.data_parallel_rank, Some(0));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!((now - m.batch.ts).abs() < 600.0, "ts {}", m.batch.ts);
        m
    }
}

/// Asks the replay socket for everything from `from` on: the batches, up to the
/// end marker.
async fn replay(mock: &Mock, from: u64) -> Vec<Message> {
    let mut dealer = DealerSocket::new();
    dealer
        .connect(&mock.replay)
        .await
        .expect("connect the DEALER");
    let request = vec![Bytes::new(), Bytes::copy_from_slice(&replay_request(from))];
    dealer
        .send(ZmqMessage::try_from(request).unwrap())
        .await
        .unwrap();
    let mut out = Vec::new();
    loop {
        let frames = timeout(WAIT, dealer.recv())
            .await
            .expect("a replay reply in time")
            .unwrap()
            .into_vec();
        let refs: Vec<&[u8]> = frames.iter().map(Bytes::as_ref).collect();
        match decode_replay_reply(&refs).unwrap() {
            ReplayReply::Batch(m) => out.push(m),
            ReplayReply::End => return out,
        }
    }
}

/// What `llm_kv_events` computes for the mock tokenizer's ids of `text`: the hashes
/// of its full 64-character (16-token) blocks.
fn vllm_hashes(text: &str) -> Vec<BlockHash> {
    let none = vllm::none_hash(vllm::DEFAULT_NONE_HASH_SEED);
    let ids = tokenizer::token_ids(text);
    vllm::block_hashes(&ids, 16, &none)
        .iter()
        .take(text.chars().count() / 64)
        .map(|d| vllm::external_hash(d, true))
        .collect()
}

fn stored(text: &str, blocks: std::ops::Range<usize>, parent: Option<&BlockHash>) -> BlockStored {
    let hashes = vllm_hashes(text);
    let ids = tokenizer::token_ids(text);
    BlockStored {
        medium: Some("GPU".into()),
        extra_keys: Some(vec![None; blocks.len()]),
        group_idx: Some(0),
        ..BlockStored::new(
            hashes[blocks.clone()].to_vec(),
            parent.cloned(),
            TokenIds::Ids(ids[blocks.start * 16..blocks.end * 16].to_vec()),
            16,
        )
    }
}

fn removed(hash: &BlockHash) -> Event {
    Event::BlockRemoved(BlockRemoved {
        block_hashes: vec![hash.clone()],
        medium: Some("GPU".into()),
        group_idx: Some(0),
        locality: None,
        ownership: None,
    })
}

fn store(s: BlockStored) -> Event {
    Event::BlockStored(Box::new(s))
}

/// `content` made `len` characters long.
fn text(seed: &str, len: usize) -> String {
    seed.chars().cycle().take(len).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_evictions_resets_and_replays() {
    let mock = Mock::start(&["--cache-blocks", "4", "--kv-events-topic", "kv@mock"]);
    let mut events = Events::subscribe(&mock).await;
    let first_seq = events.next_seq;

    // "user: " + 200 + "\n": 3 full blocks and a tail of 15 characters.
    let a = mock
        .chat(&text("The first prompt, about caching. ", 200))
        .await;
    assert_eq!((a.chars().count(), vllm_hashes(&a).len()), (207, 3));
    let got = events.next().await;
    assert_eq!(got.topic, b"kv@mock");
    assert_eq!(got.batch.events, [store(stored(&a, 0..3, None))]);

    // All cached already: nothing to publish (the next batch has the next seq).
    mock.chat(&text("The first prompt, about caching. ", 200))
        .await;

    // Three new blocks into a cache of 4: the LRU goes, the first prompt's tail
    // first (its head is the newest), as BlockRemoved, before the store.
    let b = mock
        .chat(&text("Another prompt, nothing shared. ", 200))
        .await;
    let ha = vllm_hashes(&a);
    assert_eq!(
        events.next().await.batch.events,
        [
            removed(&ha[2]),
            removed(&ha[1]),
            store(stored(&b, 0..3, None))
        ]
    );

    // A prompt sharing b's first block stores only its new block, after its
    // parent, evicting the oldest left (the first prompt's head).
    let hb = vllm_hashes(&b);
    let c = mock
        .chat(&(text("Another prompt, nothing shared. ", 58) + &text("Diverging here. ", 80)))
        .await;
    assert_eq!(vllm_hashes(&c).len(), 2);
    assert_eq!(vllm_hashes(&c)[0], hb[0]);
    assert_eq!(
        events.next().await.batch.events,
        [removed(&ha[0]), store(stored(&c, 1..2, Some(&hb[0])))]
    );

    mock.reset().await;
    assert_eq!(events.next().await.batch.events, [Event::AllBlocksCleared]);
    // The cache is empty: the whole prompt again.
    let a2 = mock
        .chat(&text("The first prompt, about caching. ", 200))
        .await;
    assert_eq!(a2, a);
    assert_eq!(
        events.next().await.batch.events,
        [store(stored(&a, 0..3, None))]
    );
    let last = events.next_seq - 1;

    // Replay from the first of the test's batches: exactly them, as published.
    let replayed = replay(&mock, first_seq).await;
    assert_eq!(
        replayed.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (first_seq..=last).collect::<Vec<_>>()
    );
    assert!(replayed.iter().all(|m| m.topic == b"kv@mock"));
    assert_eq!(replayed[0].batch.events, [store(stored(&a, 0..3, None))]);
    assert_eq!(
        replayed.last().unwrap().batch.events,
        [store(stored(&a, 0..3, None))]
    );
    // From 0: every batch since the start, the probes' included, dense.
    let all = replay(&mock, 0).await;
    assert_eq!(
        all.iter().map(|m| m.seq).collect::<Vec<_>>(),
        (0..=last).collect::<Vec<_>>()
    );
    assert_eq!(&all[first_seq as usize..], replayed.as_slice());
    // Past the last: the end marker alone.
    assert!(replay(&mock, last + 1).await.is_empty());
}

fn vectors() -> Vec<Value> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kv-events/vectors/messages.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let file: Value = serde_json::from_str(&text).unwrap();
    file["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m.get("mock").is_some())
        .cloned()
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The vectors `kv-events/vectors/make_vectors.py` made by running vLLM 0.34's own
/// `cache_full_blocks` event code on the mock tokenizer's ids of two prompts: the
/// mock, sent the same prompts, publishes the same events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mock_publishes_what_vllm_034_publishes() {
    let vectors = vectors();
    assert_eq!(vectors.len(), 2);
    let cache_blocks = vectors[0]["mock"]["cache_blocks"].to_string();
    let mock = Mock::start(&["--cache-blocks", &cache_blocks, "--block-chars", "64"]);
    let mut events = Events::subscribe(&mock).await;
    for v in &vectors {
        let want_frames: Vec<Vec<u8>> = v["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| unhex(f.as_str().unwrap()))
            .collect();
        let refs: Vec<&[u8]> = want_frames.iter().map(Vec::as_slice).collect();
        let want = decode_message(&refs).unwrap();
        // The vector's prompt is the flattened chat: "user: " + content + "\n".
        let flat = v["mock"]["prompt"].as_str().unwrap();
        let content = flat
            .strip_prefix("user: ")
            .and_then(|c| c.strip_suffix('\n'))
            .unwrap();
        assert_eq!(mock.chat(content).await, flat);
        let got = events.next().await;
        assert_eq!(got.topic, want.topic);
        assert_eq!(got.batch.events, want.batch.events, "{}", v["name"]);
        assert_eq!(got.batch.data_parallel_rank, want.batch.data_parallel_rank);
    }
}

/// Events need blocks of whole tokens: the mock refuses to start otherwise.
#[test]
fn blocks_of_partial_tokens_are_refused() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_engine-mock"))
        .args(["--port", "0", "--block-chars", "66"])
        .args(["--kv-events-endpoint", "tcp://127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn engine-mock");
    let deadline = Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("engine-mock kept running with --block-chars 66");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(stderr.contains("multiple of 4"), "{stderr}");
}
