//! The crate against outputs of the engines' own code (`vectors/make_vectors.py`).

mod common;

use common::{frames, hex, u32s, unhex, vectors};
use llm_kv_events::sglang::{self, EventNamespace};
use llm_kv_events::vllm::{self, KeyStyle, MmItem, RequestKeys};
use llm_kv_events::{decode_message, BlockHash, CborValue, Event, Message, TokenIds, Value};
use serde_json::{json, Value as Json};

fn cbor_value(v: &Json) -> CborValue {
    match v {
        Json::Null => CborValue::Null,
        Json::Bool(b) => CborValue::Bool(*b),
        Json::Object(o) => {
            let (kind, x) = o.iter().next().unwrap();
            match kind.as_str() {
                "int" => CborValue::Int(x.as_str().unwrap().parse().unwrap()),
                "text" => CborValue::Text(x.as_str().unwrap().to_owned()),
                "bytes" => CborValue::Bytes(unhex(x.as_str().unwrap())),
                "array" => CborValue::Array(x.as_array().unwrap().iter().map(cbor_value).collect()),
                other => panic!("unknown kind {other}"),
            }
        }
        other => panic!("unexpected {other}"),
    }
}

#[test]
fn cbor_matches_cbor2_canonical() {
    let file = vectors("cbor.json");
    let values = file["values"].as_array().unwrap();
    assert!(values.len() > 30);
    for case in values {
        let v = cbor_value(&case["value"]);
        assert_eq!(hex(&v.to_vec()), case["cbor"].as_str().unwrap(), "{v:?}");
    }
}

fn request_keys(case: &Json) -> RequestKeys {
    RequestKeys {
        lora: case["lora"].as_array().map(|l| {
            (
                l[0].as_str().unwrap().to_owned(),
                l[1].as_str().unwrap().to_owned(),
            )
        }),
        mm: case["mm"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| MmItem {
                identifier: m["identifier"].as_str().unwrap().to_owned(),
                offset: m["offset"].as_u64().unwrap() as usize,
                length: m["length"].as_u64().unwrap() as usize,
            })
            .collect(),
        cache_salt: case["cache_salt"].as_str().map(str::to_owned),
    }
}

fn check_vllm_section(section: &Json) -> usize {
    let seed = section["none_hash_seed"].as_str().unwrap();
    let none = vllm::none_hash(seed);
    assert_eq!(
        hex(&none),
        section["none_hash"].as_str().unwrap(),
        "NONE_HASH of {seed:?}"
    );
    let style = match section["key_style"].as_str().unwrap() {
        "tagged" => KeyStyle::Tagged,
        "untagged" => KeyStyle::Untagged,
        other => panic!("{other}"),
    };
    let cases = section["cases"].as_array().unwrap();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let tokens = u32s(&case["token_ids"]);
        let block_size = case["block_size"].as_u64().unwrap() as usize;
        let keys = request_keys(case);

        let want: Vec<&str> = case["block_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_str().unwrap())
            .collect();
        let got = keys.block_hashes(&tokens, block_size, &none, style);
        assert_eq!(
            got.iter().map(|h| hex(h)).collect::<Vec<_>>(),
            want,
            "{name}"
        );

        for (i, want_keys) in case["extra_keys_cbor"]
            .as_array()
            .unwrap()
            .iter()
            .enumerate()
        {
            let got_keys = keys
                .extra_keys(i * block_size..(i + 1) * block_size, style)
                .map(|k| hex(&CborValue::Array(k).to_vec()));
            assert_eq!(
                got_keys.as_deref(),
                want_keys.as_str(),
                "{name}: extra keys of block {i}"
            );
        }

        let ints: Vec<u64> = case["external_ints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        let got_ints: Vec<BlockHash> = got.iter().map(|d| vllm::external_hash(d, true)).collect();
        assert_eq!(
            got_ints,
            ints.into_iter().map(BlockHash::Int).collect::<Vec<_>>(),
            "{name}"
        );
        for d in &got {
            assert_eq!(vllm::external_hash(d, false), BlockHash::Bytes(d.to_vec()));
        }

        if keys == RequestKeys::default() {
            assert_eq!(
                vllm::block_hashes(&tokens, block_size, &none),
                got,
                "{name}"
            );
        }
    }
    cases.len()
}

#[test]
fn vllm_block_hashes_match_the_engine() {
    let file = vectors("vllm_hashes.json");
    assert_eq!(file["engines"]["current"]["version"], "0.34.0");
    assert_eq!(
        file["current"]["none_hash_seed"],
        vllm::DEFAULT_NONE_HASH_SEED
    );
    let mut n = 0;
    for section in [
        "current",
        "current_with_pythonhashseed",
        "legacy_with_pythonhashseed",
    ] {
        n += check_vllm_section(&file[section]);
    }
    assert!(n >= 27, "only {n} cases");
}

#[test]
fn sglang_page_hashes_match_the_engine() {
    let file = vectors("sglang_hashes.json");
    assert_eq!(file["engine"]["version"], "0.5.23");
    let cases = file["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let tokens = u32s(&case["token_ids"]);
        let page_size = case["page_size"].as_u64().unwrap() as usize;

        let digests = sglang::page_digests(&tokens, page_size, None);
        let want: Vec<&str> = case["unseeded_page_digests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d.as_str().unwrap())
            .collect();
        assert_eq!(
            digests.iter().map(|d| hex(d)).collect::<Vec<_>>(),
            want,
            "{name}"
        );

        let ns = EventNamespace {
            cache_salt: case["cache_salt"].as_str(),
            namespace_extra_key: case["namespace_extra_key"].as_str(),
            dynamo_format: case["dynamo_format"].as_bool().unwrap(),
        };
        let want: Vec<i64> = case["block_hashes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| h.as_i64().unwrap())
            .collect();
        assert_eq!(ns.page_hashes(&tokens, page_size), want, "{name}");
        if ns == EventNamespace::default() {
            assert_eq!(sglang::page_hashes(&tokens, page_size), want, "{name}");
        }
    }
}

fn hash_json(h: &BlockHash) -> Json {
    match h {
        BlockHash::Int(v) => json!({"int": v}),
        BlockHash::Bytes(b) => json!({"bytes": hex(b)}),
    }
}

/// The vectors write SGLang's hashes signed, as Python has them; [`BlockHash::Int`]
/// keeps the 64-bit pattern.
fn unsigned_hashes(v: &mut Json) {
    match v {
        Json::Object(o) => {
            if let (1, Some(i)) = (o.len(), o.get("int").and_then(Json::as_i64)) {
                o.insert("int".into(), json!(i as u64));
            }
            o.values_mut().for_each(unsigned_hashes);
        }
        Json::Array(items) => items.iter_mut().for_each(unsigned_hashes),
        _ => {}
    }
}

fn value_json(v: &Value) -> Json {
    match v {
        Value::Nil => Json::Null,
        Value::Bool(b) => json!(b),
        Value::Int(i) => json!(i64::try_from(*i).unwrap()),
        Value::Float(x) => json!(x),
        Value::Str(s) => json!(s),
        Value::Bin(b) => json!({"bytes": hex(b)}),
        Value::Array(items) => Json::Array(items.iter().map(value_json).collect()),
        other => panic!("{other:?} in a vector"),
    }
}

fn event_json(e: &Event) -> Json {
    match e {
        Event::AllBlocksCleared => json!({"type": "AllBlocksCleared"}),
        Event::BlockRemoved(r) => json!({
            "type": "BlockRemoved",
            "block_hashes": r.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
            "medium": r.medium,
            "group_idx": r.group_idx,
            "locality": r.locality,
            "ownership": r.ownership,
        }),
        Event::BlockStored(s) => json!({
            "type": "BlockStored",
            "block_hashes": s.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
            "parent_block_hash": s.parent_block_hash.as_ref().map(hash_json),
            "token_ids": match &s.token_ids {
                TokenIds::Ids(ids) => json!(ids),
                TokenIds::Bigrams(pairs) => json!(pairs),
            },
            "block_size": s.block_size,
            "lora_id": s.lora_id,
            "medium": s.medium,
            "lora_name": s.lora_name,
            "extra_keys": s.extra_keys.as_ref().map(|blocks| blocks
                .iter()
                .map(|b| b.as_ref().map(|keys| keys.iter().map(value_json).collect::<Vec<_>>()))
                .collect::<Vec<_>>()),
            "group_idx": s.group_idx,
            "kv_cache_spec_kind": s.kv_cache_spec_kind,
            "kv_cache_spec_sliding_window": s.kv_cache_spec_sliding_window,
            "locality": s.locality,
            "ownership": s.ownership,
            "session_id": s.session_id,
            "lookahead_token_ids": s.lookahead_token_ids,
            "cache_salt": s.cache_salt,
        }),
    }
}

fn message_json(m: &Message) -> Json {
    json!({
        "topic": String::from_utf8(m.topic.clone()).unwrap(),
        "seq": m.seq,
        "ts": m.batch.ts,
        "data_parallel_rank": m.batch.data_parallel_rank,
        "events": m.batch.events.iter().map(event_json).collect::<Vec<_>>(),
    })
}

fn decode_vector(message: &Json) -> Message {
    let owned = frames(message);
    let refs: Vec<&[u8]> = owned.iter().map(Vec::as_slice).collect();
    decode_message(&refs).unwrap_or_else(|e| panic!("{}: {e}", message["name"]))
}

#[test]
fn messages_decode_to_what_the_engine_encoded() {
    let file = vectors("messages.json");
    let messages = file["messages"].as_array().unwrap();
    let engines: Vec<&str> = messages
        .iter()
        .map(|m| m["engine"].as_str().unwrap())
        .collect();
    for e in [
        "vllm 0.34.0",
        "vllm 0.20.0",
        "sglang 0.5.23",
        "sglang 0.5.2",
    ] {
        assert!(engines.contains(&e), "no vector from {e}");
    }
    for message in messages {
        let decoded = decode_vector(message);
        let mut want = message["expected"].clone();
        unsigned_hashes(&mut want);
        assert_eq!(message_json(&decoded), want, "{}", message["name"]);
    }
}

fn find<'a>(messages: &'a Json, name: &str) -> &'a Json {
    messages["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap()
}

fn first_stored(m: &Message) -> &llm_kv_events::BlockStored {
    match m.batch.events.first() {
        Some(Event::BlockStored(s)) => s,
        other => panic!("{other:?}"),
    }
}

/// What a router does: hash the prompt itself and find the engine's blocks.
#[test]
fn a_prompt_finds_the_blocks_vllm_announced() {
    let file = vectors("messages.json");
    let m = decode_vector(find(&file, "vllm int hashes"));
    let stored = first_stored(&m);
    let prompt: Vec<u32> = (1..=12).collect();
    let digests = vllm::block_hashes(&prompt, 4, &vllm::none_hash(vllm::DEFAULT_NONE_HASH_SEED));
    let ours: Vec<BlockHash> = digests
        .iter()
        .map(|d| vllm::external_hash(d, true))
        .collect();
    assert_eq!(stored.parent_block_hash.as_ref(), ours.first());
    assert_eq!(stored.block_hashes, ours[1..]);

    let m = decode_vector(find(&file, "vllm byte hashes, lora, mm, salt"));
    let stored = first_stored(&m);
    let keys = RequestKeys {
        lora: Some(("sql-adapter".into(), "/adapters/sql".into())),
        mm: vec![MmItem {
            identifier: "img-0".into(),
            offset: 2,
            length: 3,
        }],
        cache_salt: Some("tenant-a".into()),
    };
    let none = vllm::none_hash(vllm::DEFAULT_NONE_HASH_SEED);
    let ours: Vec<BlockHash> = keys
        .block_hashes(&(1..=8).collect::<Vec<_>>(), 4, &none, KeyStyle::Tagged)
        .iter()
        .map(|d| vllm::external_hash(d, false))
        .collect();
    assert_eq!(stored.block_hashes, ours);
}

/// Up to vLLM 0.20 the published extra keys are the hash input, so an event alone
/// is enough to recompute its hashes.
#[test]
fn legacy_vllm_events_carry_their_own_hash_input() {
    let file = vectors("messages.json");
    let hashes = vectors("vllm_hashes.json");
    let m = decode_vector(find(&file, "vllm positional events, byte hashes"));
    let stored = first_stored(&m);
    let none = unhex(
        hashes["legacy_with_pythonhashseed"]["none_hash"]
            .as_str()
            .unwrap(),
    );
    let tokens = stored.token_ids.ids().unwrap();
    let extra = stored.extra_keys.as_ref().unwrap();
    let ours = vllm::block_hashes_with(tokens, stored.block_size as usize, &none, |i, _| {
        let keys = extra.get(i)?.as_ref()?;
        keys.iter().map(Value::to_cbor).collect()
    });
    let ours: Vec<BlockHash> = ours.iter().map(|d| vllm::external_hash(d, false)).collect();
    assert_eq!(stored.block_hashes, ours);
}

#[test]
fn a_prompt_finds_the_pages_sglang_announced() {
    let file = vectors("messages.json");
    let m = decode_vector(find(&file, "sglang store, remove, clear"));
    let stored = first_stored(&m);
    let prompt: Vec<u32> = (100..116).collect();
    let ours: Vec<BlockHash> = sglang::page_hashes(&prompt, 4)
        .into_iter()
        .map(BlockHash::from_i64)
        .collect();
    assert_eq!(stored.block_hashes, ours);
    assert_eq!(stored.parent_block_hash, None);

    let m = decode_vector(find(&file, "sglang salted and bigram pages, nil rank"));
    let stored = first_stored(&m);
    let ns = EventNamespace {
        cache_salt: Some("tenant-a"),
        ..Default::default()
    };
    let ours: Vec<BlockHash> = ns
        .page_hashes(&(1..=8).collect::<Vec<_>>(), 4)
        .into_iter()
        .map(BlockHash::from_i64)
        .collect();
    assert_eq!(stored.block_hashes, ours);
    assert_eq!(stored.cache_salt.as_deref(), Some("tenant-a"));
}
