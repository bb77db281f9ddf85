//! What the collector spends answering `POST /kv/match` (the `kv_match` setting):
//! a 4 KiB chat read into token ids as the engine mock makes them, its full blocks
//! hashed as vLLM chains them (`sha256_cbor`), and the leading blocks each of 4
//! engines' indexes hold (one holds them all). Envoy's own cost of the call is in
//! the overhead benchmark (`benches/overhead --variants
//! 'floor,cache_aware,cache_aware+kv_match=true'`).
//!
//! `cargo bench -p llm-bench --bench kv_match`

use std::collections::BTreeMap;

use criterion::{criterion_group, criterion_main, Criterion};
use llm_collector::kv_index::KvIndex;
use llm_collector::kv_match::{Hashing, Matcher, Tokenizer};
use llm_kv_events::{BlockStored, Event, EventBatch, TokenIds};

const BLOCK_TOKENS: usize = 16;

fn chat_4k() -> Vec<u8> {
    let system = "You answer questions about one long manual, citing its pages. ".repeat(70);
    serde_json::json!({"model": "m", "messages": [
        {"role": "system", "content": &system[..3900]},
        {"role": "user", "content": "Which page covers the gearbox?"},
    ]})
    .to_string()
    .into_bytes()
}

fn index_of(matcher: &Matcher, body: &[u8], holds: bool) -> KvIndex {
    let mut index = KvIndex::default();
    let hashes = if holds {
        let ids = matcher
            .tokenizer
            .token_ids("/v1/chat/completions", body)
            .expect("a chat");
        matcher.hashing.block_hashes(&ids)
    } else {
        Vec::new()
    };
    let batch = EventBatch {
        ts: 0.0,
        events: vec![Event::BlockStored(Box::new(BlockStored::new(
            hashes.clone(),
            None,
            TokenIds::Ids(vec![0; hashes.len() * BLOCK_TOKENS]),
            BLOCK_TOKENS as u64,
        )))],
        data_parallel_rank: None,
    };
    index.apply(0, &batch);
    index
}

fn kv_match(c: &mut Criterion) {
    let matcher = Matcher {
        tokenizer: Tokenizer::EngineMock,
        hashing: Hashing::vllm(BLOCK_TOKENS, "vllm-none-hash", true),
    };
    let body = chat_4k();
    let indexes: BTreeMap<String, KvIndex> = (0..4)
        .map(|i| (format!("w{i}"), index_of(&matcher, &body, i == 0)))
        .collect();
    let answer = matcher
        .answer("/v1/chat/completions", &body, &indexes)
        .expect("matched");
    assert_eq!(answer.engines["w0"].held_blocks, Some(answer.blocks));
    c.bench_function(
        "kv_match 4 KiB chat, 4 engines (engine-mock tokenizer)",
        |b| {
            b.iter(|| {
                matcher
                    .answer("/v1/chat/completions", &body, &indexes)
                    .map(|m| serde_json::to_string(&m).map(|s| s.len()))
            })
        },
    );
}

criterion_group!(benches, kv_match);
criterion_main!(benches);
