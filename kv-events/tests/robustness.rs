//! The decoder meets whatever arrives on a socket: it must answer every input with
//! a value or an error that says what was wrong, and never panic or hang.

mod common;

use common::{frames, vectors, Rng};
use llm_kv_events::{
    decode_batch, decode_message, decode_replay_reply, replay_request, DecodeError, ReplayReply,
};

fn payloads() -> Vec<Vec<u8>> {
    let file = vectors("messages.json");
    file["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| frames(m).swap_remove(2))
        .collect()
}

fn seq(n: u64) -> [u8; 8] {
    n.to_be_bytes()
}

#[test]
fn every_prefix_of_every_vector_is_an_error() {
    for payload in payloads() {
        for cut in 0..payload.len() {
            let got = decode_batch(&payload[..cut]);
            assert!(
                got.is_err(),
                "a {cut}-byte prefix of a {}-byte batch decoded",
                payload.len()
            );
        }
        assert!(decode_batch(&payload).is_ok());
    }
}

#[test]
fn mutated_vectors_never_panic() {
    let payloads = payloads();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut decoded = 0;
    for _ in 0..30_000 {
        let mut p = payloads[rng.below(payloads.len())].clone();
        for _ in 0..=rng.below(4) {
            let i = rng.below(p.len());
            match rng.below(3) {
                0 => p[i] = rng.next() as u8,
                1 => p[i] ^= 1 << rng.below(8),
                _ => p.insert(i, rng.next() as u8),
            }
        }
        decoded += usize::from(decode_message(&[b"", &seq(1), &p]).is_ok());
    }
    // Most single-byte changes land in a hash or token id and still decode: the
    // walk above went deep, not just through the first marker.
    assert!(decoded > 1_000, "only {decoded} mutants decoded");
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    for _ in 0..30_000 {
        let len = rng.below(300);
        let p: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let _ = decode_batch(&p);
        let frames: Vec<&[u8]> = (0..rng.below(6)).map(|i| &p[..(len * i / 6)]).collect();
        let _ = decode_message(&frames);
        let _ = decode_replay_reply(&frames);
    }
}

#[test]
fn hostile_lengths_and_nesting_fail_fast() {
    // An array claiming 2^32 - 1 elements with none present.
    let huge = [0xdd, 0xff, 0xff, 0xff, 0xff];
    assert!(matches!(decode_batch(&huge), Err(DecodeError::Msgpack(_))));
    // A bin claiming 4 GiB.
    let bin = [
        0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x91, 0xc6, 0xff, 0xff, 0xff, 0xff,
    ];
    assert!(matches!(decode_batch(&bin), Err(DecodeError::Msgpack(_))));
    // 100 000 nested arrays would overflow a recursive decoder's stack.
    let deep = vec![0x91; 100_000];
    assert!(matches!(decode_batch(&deep), Err(DecodeError::Msgpack(_))));
}

fn err(frames: &[&[u8]]) -> DecodeError {
    decode_message(frames).unwrap_err()
}

#[test]
fn errors_say_what_was_wrong() {
    let good = payloads().swap_remove(0);

    assert_eq!(
        err(&[b"", &seq(0)]),
        DecodeError::FrameCount {
            expected: "3",
            got: 2
        }
    );
    assert_eq!(err(&[b"", b"\0\0\0\x01", &good]), DecodeError::SeqLength(4));
    assert_eq!(
        err(&[b"", &llm_kv_events::END_SEQ, b""]),
        DecodeError::EndOfReplay
    );

    let mut trailing = good.clone();
    trailing.push(0xc0);
    assert_eq!(
        err(&[b"", &seq(0), &trailing]),
        DecodeError::TrailingBytes(1)
    );

    // [1.0, ["Nope"]]
    let unknown = [0x92, 0x01, 0x91, 0x91, 0xa4, b'N', b'o', b'p', b'e'];
    let e = err(&[b"", &seq(0), &unknown]);
    assert_eq!(
        e,
        DecodeError::UnknownTag {
            path: "events[0]".into(),
            tag: "Nope".into()
        }
    );

    // [1.0, [{"type": "BlockRemoved", "block_hashes": [1.5]}]]
    let mut bad_hash = vec![0x92, 0x01, 0x91, 0x82, 0xa4];
    bad_hash.extend_from_slice(b"type");
    bad_hash.push(0xac);
    bad_hash.extend_from_slice(b"BlockRemoved");
    bad_hash.push(0xac);
    bad_hash.extend_from_slice(b"block_hashes");
    bad_hash.extend_from_slice(&[0x91, 0xcb, 0x3f, 0xf8, 0, 0, 0, 0, 0, 0]);
    let e = err(&[b"", &seq(0), &bad_hash]);
    assert_eq!(
        e,
        DecodeError::Shape {
            path: "events[0].BlockRemoved.block_hashes[0]".into(),
            expected: "int or bin",
            found: "float",
        }
    );
    assert_eq!(
        e.to_string(),
        "events[0].BlockRemoved.block_hashes[0]: expected int or bin, found float"
    );

    // [1.0, [["BlockStored", [1]]]]: positional, cut short.
    let mut short = vec![0x92, 0x01, 0x91, 0x92, 0xab];
    short.extend_from_slice(b"BlockStored");
    short.extend_from_slice(&[0x91, 0x01]);
    let e = err(&[b"", &seq(0), &short]);
    assert_eq!(
        e,
        DecodeError::MissingField {
            path: "events[0].BlockStored".into(),
            field: "token_ids"
        }
    );

    // ["x", []]
    let e = err(&[b"", &seq(0), &[0x92, 0xa1, b'x', 0x90]]);
    assert_eq!(
        e,
        DecodeError::Shape {
            path: "ts".into(),
            expected: "float",
            found: "str"
        }
    );
}

#[test]
fn replay_replies_of_every_layout_decode() {
    let file = vectors("messages.json");
    let m = &file["messages"][1];
    let f = frames(m);
    let (topic, seq_frame, payload) = (&f[0], &f[1], &f[2]);
    let live = decode_message(&[topic, seq_frame, payload]).unwrap();

    for layout in [
        vec![&b""[..], topic, seq_frame, payload], // DEALER, vLLM 0.34 / SGLang 0.5.23
        vec![topic, seq_frame, payload],           // REQ, same releases
    ] {
        assert_eq!(
            decode_replay_reply(&layout).unwrap(),
            ReplayReply::Batch(live.clone())
        );
    }
    // Older releases send no topic.
    let ReplayReply::Batch(old) = decode_replay_reply(&[b"", seq_frame, payload]).unwrap() else {
        panic!("not a batch");
    };
    assert_eq!(
        (old.seq, &old.batch, old.topic.is_empty()),
        (live.seq, &live.batch, true)
    );

    let end = llm_kv_events::END_SEQ;
    assert_eq!(
        decode_replay_reply(&[b"", b"", &end, b""]).unwrap(),
        ReplayReply::End
    );
    assert_eq!(
        decode_replay_reply(&[b"", &end, b""]).unwrap(),
        ReplayReply::End
    );
    assert_eq!(replay_request(41), seq(41));
    assert!(matches!(
        decode_replay_reply(&[b"", b"", b"", b"", b""]),
        Err(DecodeError::FrameCount { got: 5, .. })
    ));
}

#[test]
fn hashers_take_any_sizes() {
    use llm_kv_events::{sglang, vllm};
    let tokens: Vec<u32> = (0..10).collect();
    let none = vllm::none_hash(vllm::DEFAULT_NONE_HASH_SEED);
    assert!(vllm::block_hashes(&tokens, 0, &none).is_empty());
    assert!(vllm::block_hashes(&tokens, usize::MAX, &none).is_empty());
    assert!(sglang::page_hashes(&tokens, 0).is_empty());
    assert_eq!(sglang::page_hashes(&tokens, usize::MAX).len(), 1);
    assert_eq!(
        sglang::page_hashes(&tokens, usize::MAX),
        sglang::page_hashes(&tokens, 10)
    );
}
