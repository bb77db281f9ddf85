//! The collector following an engine's KV events over real ZMQ sockets: a publisher
//! in the test speaks vLLM 0.34's wire format (a PUB socket, and a ROUTER for
//! replay), and the collector's follower keeps the engine's block index whole
//! through a gap it replays, goes stale through one it cannot, and starts empty
//! when the publisher restarts, all of it in its own metrics.

use bytes::Bytes;
use llm_collector::kv_events::{self, KvIndexes, REPLAY_DEADLINE};
use llm_collector::kv_index::Trust;
use llm_collector::telemetry::Telemetry;
use llm_kv_events::BlockHash;
use rmpv::Value;
use std::sync::Arc;
use std::time::{Duration, Instant};
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

/// A vLLM 0.34 batch (msgpack, events as maps) storing `stored` and removing
/// `removed`, as block hashes.
fn batch(stored: &[u64], removed: &[u64]) -> Vec<u8> {
    let s = |k: &str| Value::from(k);
    let hashes = |hs: &[u64]| Value::Array(hs.iter().map(|&h| Value::from(h)).collect());
    let mut events = Vec::new();
    if !stored.is_empty() {
        events.push(Value::Map(vec![
            (s("type"), s("BlockStored")),
            (s("block_hashes"), hashes(stored)),
            (s("parent_block_hash"), Value::Nil),
            (
                s("token_ids"),
                Value::Array(vec![Value::from(1u32); 16 * stored.len()]),
            ),
            (s("block_size"), Value::from(16u32)),
            (s("lora_id"), Value::Nil),
            (s("medium"), s("GPU")),
        ]));
    }
    if !removed.is_empty() {
        events.push(Value::Map(vec![
            (s("type"), s("BlockRemoved")),
            (s("block_hashes"), hashes(removed)),
            (s("medium"), s("GPU")),
        ]));
    }
    let batch = Value::Array(vec![Value::F64(1.7e9), Value::Array(events), Value::Nil]);
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &batch).unwrap();
    out
}

fn message(frames: Vec<Vec<u8>>) -> ZmqMessage {
    ZmqMessage::try_from(frames.into_iter().map(Bytes::from).collect::<Vec<_>>()).unwrap()
}

struct Publisher {
    pub_socket: PubSocket,
    replay: RouterSocket,
    endpoint: String,
    replay_endpoint: String,
}

impl Publisher {
    async fn bind() -> Publisher {
        let mut pub_socket = PubSocket::new();
        let endpoint = pub_socket
            .bind("tcp://127.0.0.1:0")
            .await
            .unwrap()
            .to_string();
        let mut replay = RouterSocket::new();
        let replay_endpoint = replay.bind("tcp://127.0.0.1:0").await.unwrap().to_string();
        Publisher {
            pub_socket,
            replay,
            endpoint,
            replay_endpoint,
        }
    }

    async fn publish(&mut self, seq: u64, payload: &[u8]) {
        let frames = vec![Vec::new(), seq.to_be_bytes().to_vec(), payload.to_vec()];
        self.pub_socket.send(message(frames)).await.unwrap();
    }

    async fn answer_replay(&mut self, batches: &[(u64, Vec<u8>)]) -> u64 {
        answer_replay(&mut self.replay, batches).await
    }
}

/// Answers one replay request with `batches` (seq, payload) and the end marker, as
/// vLLM 0.34's publisher does: identity, empty, topic, seq, payload; the seq asked
/// from.
async fn answer_replay(replay: &mut RouterSocket, batches: &[(u64, Vec<u8>)]) -> u64 {
    let request = replay.recv().await.unwrap().into_vec();
    let identity = request[0].to_vec();
    let from = u64::from_be_bytes(request.last().unwrap().as_ref().try_into().unwrap());
    for (seq, payload) in batches.iter().filter(|(s, _)| *s >= from) {
        let frames = vec![
            identity.clone(),
            Vec::new(),
            Vec::new(),
            seq.to_be_bytes().to_vec(),
            payload.clone(),
        ];
        replay.send(message(frames)).await.unwrap();
    }
    let end = vec![identity, Vec::new(), Vec::new(), vec![0xff; 8], Vec::new()];
    replay.send(message(end)).await.unwrap();
    from
}

/// A follower of `p`'s stream as engine `w0`, and the telemetry it reports to.
fn follow(p: &Publisher) -> (KvIndexes, Arc<Telemetry>) {
    let source = llm_collector::cli::parse_kv_source(&format!(
        "w0={},replay={}",
        p.endpoint, p.replay_endpoint
    ))
    .unwrap();
    let telemetry = Arc::new(Telemetry::new(
        &[],
        Duration::from_secs(60),
        Duration::from_secs(60),
    ));
    (kv_events::spawn(&[source], telemetry.clone()), telemetry)
}

fn blocks(ix: &KvIndexes) -> (usize, Trust) {
    let all = ix.lock().unwrap();
    all.get("w0")
        .map_or((0, Trust::Unheard), |i| (i.blocks(), i.trust()))
}

async fn wait_until(what: &str, ok: impl Fn() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < Duration::from_secs(30), "never: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_index_follows_the_stream_through_a_replayed_gap_a_lost_one_and_a_restart() {
    let mut p = Publisher::bind().await;
    let (ix, telemetry) = follow(&p);

    // A subscriber that has just connected misses what was published before: the
    // first batch goes out until it is heard (the repeats are duplicates).
    let first = batch(&[1, 2, 3], &[]);
    let start = Instant::now();
    while blocks(&ix).0 < 3 {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the first batch never arrived"
        );
        p.publish(0, &first).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    p.publish(1, &batch(&[4], &[2])).await;
    wait_until("seq 1 applied", || blocks(&ix) == (3, Trust::Whole)).await;

    // Seqs 2 and 3 are lost on the way: the follower asks the replay socket.
    let lost = vec![(2, batch(&[5], &[])), (3, batch(&[6], &[1]))];
    p.publish(4, &batch(&[7], &[])).await;
    assert_eq!(
        p.answer_replay(&lost).await,
        2,
        "asked from the first missing"
    );
    wait_until("the gap replayed", || blocks(&ix) == (5, Trust::Whole)).await;
    {
        let all = ix.lock().unwrap();
        let w0 = &all["w0"];
        for (h, held) in [
            (1, false),
            (2, false),
            (3, true),
            (4, true),
            (5, true),
            (6, true),
            (7, true),
        ] {
            assert_eq!(w0.holds(&BlockHash::Int(h)), held, "block {h}");
        }
        assert_eq!(w0.counts.gaps_repaired, 1);
    }

    // Seq 5 lost, and the replay socket does not answer: stale.
    p.publish(6, &batch(&[8], &[])).await;
    tokio::time::sleep(REPLAY_DEADLINE).await;
    wait_until("the gap lost", || blocks(&ix).1 == Trust::Stale).await;

    // The publisher restarts: its numbers start again, its cache is empty.
    p.publish(0, &batch(&[9], &[])).await;
    wait_until("the restart seen", || blocks(&ix) == (1, Trust::Whole)).await;

    let text = telemetry.render(Instant::now());
    for line in [
        "llm_collector_kv_blocks{engine=\"w0\"} 1",
        "llm_collector_kv_stale{engine=\"w0\"} 0",
        "llm_collector_kv_restarts_total{engine=\"w0\"} 1",
        "llm_collector_kv_gaps_total{engine=\"w0\",outcome=\"repaired\"} 1",
        "llm_collector_kv_gaps_total{engine=\"w0\",outcome=\"lost\"} 1",
    ] {
        assert!(text.contains(line), "{line} in\n{text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_subscriber_catches_up_from_the_replay_buffer() {
    let p = Publisher::bind().await;
    // Published before anyone subscribed: no subscriber hears these.
    let early = vec![(0, batch(&[1, 2], &[])), (1, batch(&[3], &[1]))];
    let (ix, _telemetry) = follow(&p);
    let Publisher {
        mut pub_socket,
        mut replay,
        ..
    } = p;
    let answered = tokio::spawn(async move { answer_replay(&mut replay, &early).await });
    let next = batch(&[4], &[]);
    let start = Instant::now();
    while !answered.is_finished() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the replay was never asked for"
        );
        pub_socket
            .send(message(vec![
                Vec::new(),
                2u64.to_be_bytes().to_vec(),
                next.clone(),
            ]))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(answered.await.unwrap(), 0, "asked from the start");
    wait_until("caught up", || blocks(&ix) == (3, Trust::Whole)).await;
    let all = ix.lock().unwrap();
    for (h, held) in [(1, false), (2, true), (3, true), (4, true)] {
        assert_eq!(all["w0"].holds(&BlockHash::Int(h)), held, "block {h}");
    }
}

/// An engine that stored blocks before this subscriber joined and then published
/// nothing more: once its scraped prompt-token counter says it took prompts, the
/// follower asks the replay socket from the start, and the same batches arriving
/// live afterwards are not taken for a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_engine_that_took_prompts_is_caught_up_from_the_replay_buffer() {
    let mut p = Publisher::bind().await;
    let early = vec![(0, batch(&[1, 2], &[])), (1, batch(&[3], &[1]))];
    let (ix, telemetry) = follow(&p);
    assert_eq!(blocks(&ix), (0, Trust::Unheard));
    // The scrape: the engine took prompts, and nothing was heard.
    kv_events::observe_counters(&ix, [("w0", 500)], &telemetry);
    let from = tokio::time::timeout(Duration::from_secs(30), p.answer_replay(&early))
        .await
        .expect("the follower asks the replay socket");
    assert_eq!(from, 0, "from the start");
    wait_until("caught up", || blocks(&ix) == (2, Trust::Whole)).await;
    // Batch 1 again, live (a subscription that took hold as the catch-up ran).
    p.publish(1, &early[1].1).await;
    p.publish(2, &batch(&[4], &[])).await;
    wait_until("the next batch applied", || {
        blocks(&ix) == (3, Trust::Whole)
    })
    .await;
    let all = ix.lock().unwrap();
    assert_eq!(
        all["w0"].counts.restarts, 0,
        "a batch caught up is no restart"
    );
    for (h, held) in [(1, false), (2, true), (3, true), (4, true)] {
        assert_eq!(all["w0"].holds(&BlockHash::Int(h)), held, "block {h}");
    }
}
