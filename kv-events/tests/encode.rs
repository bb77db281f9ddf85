//! The encoder against the bytes vLLM 0.34 itself produced (`vectors/messages.json`),
//! and against the decoder on everything else.

mod common;

use common::{frames, vectors, Rng};
use llm_kv_events::{
    decode_batch, decode_message, decode_replay_reply, decode_replay_request, encode_batch,
    encode_message, encode_replay_end, replay_request, BlockHash, BlockRemoved, DecodeError, Event,
    EventBatch, Message, Publisher, ReplayReply, END_SEQ,
};

fn decode_frames(owned: &[Vec<u8>]) -> Message {
    let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
    decode_message(&refs).unwrap()
}

fn messages() -> Vec<serde_json::Value> {
    vectors("messages.json")["messages"]
        .as_array()
        .unwrap()
        .clone()
}

/// msgspec's output is deterministic (declaration order, shortest ints, the map
/// header sized for the whole struct), so every vLLM 0.34 message comes back
/// byte for byte.
#[test]
fn vllm_034_messages_encode_to_the_engines_bytes() {
    let mut n = 0;
    for m in messages() {
        if m["engine"] != "vllm 0.34.0" {
            continue;
        }
        let want = frames(&m);
        let decoded = decode_frames(&want);
        let got = encode_message(&decoded.topic, decoded.seq, &decoded.batch);
        assert_eq!(got.to_vec(), want, "{}", m["name"]);
        assert_eq!(encode_batch(&decoded.batch), want[2], "{}", m["name"]);
        n += 1;
    }
    assert!(n >= 4, "only {n} vLLM 0.34 vectors");
}

/// Other engines' messages are re-encoded in vLLM 0.34's shape (maps, the
/// map16 header, SGLang's extra field after vLLM's): not their bytes, but the
/// same message.
#[test]
fn every_vector_round_trips() {
    for m in messages() {
        let decoded = decode_frames(&frames(&m));
        let again = decode_frames(&encode_message(&decoded.topic, decoded.seq, &decoded.batch));
        assert_eq!(again, decoded, "{}", m["name"]);
    }
}

/// Whatever the decoder accepts, the encoder writes back to the same value:
/// mutated vectors reach field values and shapes no engine sent.
#[test]
fn mutated_batches_that_decode_round_trip() {
    let payloads: Vec<Vec<u8>> = messages()
        .iter()
        .map(|m| frames(m).swap_remove(2))
        .collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut checked = 0;
    for round in 0..20_000 {
        let mut p = payloads[round % payloads.len()].clone();
        for _ in 0..1 + rng.next() % 3 {
            let i = (rng.next() % p.len() as u64) as usize;
            p[i] = rng.next() as u8;
        }
        let Ok(batch) = decode_batch(&p) else {
            continue;
        };
        if batch.ts.is_nan() {
            continue; // NaN != NaN: the bytes still round-trip, equality does not.
        }
        let again = decode_batch(&encode_batch(&batch)).unwrap();
        assert_eq!(again, batch, "round {round}");
        checked += 1;
    }
    assert!(checked > 1000, "only {checked} mutants decoded");
}

fn batch(events: Vec<Event>) -> EventBatch {
    EventBatch {
        ts: 1.5,
        events,
        data_parallel_rank: Some(0),
    }
}

fn removed(h: u64) -> Event {
    Event::BlockRemoved(BlockRemoved {
        block_hashes: vec![BlockHash::Int(h)],
        medium: Some("GPU".into()),
        group_idx: Some(0),
        locality: None,
        ownership: None,
    })
}

fn replayed(p: &Publisher, from: u64) -> (Vec<Message>, bool) {
    let replies = p
        .replay(&[b"", &replay_request(from)])
        .expect("a well-formed request");
    let mut out = Vec::new();
    let mut ended = false;
    for (i, frames) in replies.iter().enumerate() {
        let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        match decode_replay_reply(&refs).unwrap() {
            ReplayReply::Batch(m) => out.push(m),
            ReplayReply::End => {
                assert_eq!(i + 1, replies.len(), "the end marker is last");
                ended = true;
            }
        }
    }
    (out, ended)
}

#[test]
fn a_publisher_numbers_from_zero_and_replays_what_it_kept() {
    let mut p = Publisher::new(b"kv".to_vec(), 3);
    let sent: Vec<Message> = (0..5)
        .map(|i| decode_frames(&p.publish(&batch(vec![removed(i)]))))
        .collect();
    assert_eq!(
        sent.iter().map(|m| m.seq).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    assert!(sent.iter().all(|m| m.topic == b"kv"));
    assert_eq!(p.next_seq(), 5);

    // Three kept: 2, 3, 4.
    let (got, ended) = replayed(&p, 0);
    assert!(ended);
    assert_eq!(got, sent[2..]);
    let (got, ended) = replayed(&p, 3);
    assert!(ended);
    assert_eq!(got, sent[3..]);
    let (got, ended) = replayed(&p, 5);
    assert!(
        ended && got.is_empty(),
        "nothing from 5 on: the end marker alone"
    );

    // vLLM drops a request that is not `[delimiter, start]` without answering.
    assert!(matches!(
        p.replay(&[&replay_request(0)]),
        Err(DecodeError::FrameCount { .. })
    ));
}

#[test]
fn replay_frames_are_vllms() {
    let mut p = Publisher::new(b"t".to_vec(), 10);
    let published = p.publish(&batch(vec![Event::AllBlocksCleared]));
    let replies = p.replay(&[b"", &0u64.to_be_bytes()]).unwrap();
    assert_eq!(replies.len(), 2);
    // ["", topic, seq, payload]: the payload first published, unchanged.
    assert_eq!(
        replies[0],
        [
            Vec::new(),
            b"t".to_vec(),
            0u64.to_be_bytes().to_vec(),
            published[2].clone()
        ]
    );
    // ["", "", -1, ""], the topic left empty as vLLM 0.34 leaves it.
    assert_eq!(replies[1], encode_replay_end());
    assert_eq!(
        encode_replay_end(),
        [Vec::new(), Vec::new(), END_SEQ.to_vec(), Vec::new()]
    );
    assert_eq!(decode_replay_request(&[b"", &replay_request(42)]), Ok(42));
}

#[test]
fn a_publisher_without_a_buffer_replays_nothing() {
    let mut p = Publisher::new(Vec::new(), 0);
    p.publish(&batch(vec![Event::AllBlocksCleared]));
    let (got, ended) = replayed(&p, 0);
    assert!(ended && got.is_empty());
    let d = Publisher::default();
    assert_eq!((d.topic(), d.next_seq()), (&b""[..], 0));
}
