//! Operations read back from shared data (another VM's bytes, or garbage): decoding
//! never panics, and whatever decodes encodes back to bytes that decode the same.
//! Applied as a VM applies the ring (`Router::apply_encoded`: an insert's text
//! checked as UTF-8 only past what the tree holds of it) the bytes never panic,
//! what decodes whole is applied, and what does not decode at all is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router::config::{Config, Pool};
use llm_router::request::router::Router;
use llm_router::shared::{Incoming, Op};

/// A router whose tree already holds a text (accented and CJK, so edges split
/// inside multi-byte chars), for the fuzzed insert to walk.
fn router() -> Option<Router> {
    let cfg = Config::from_json(br#"{"workers":[{"name":"w0"},{"name":"w1"}]}"#).ok()?;
    let mut r = Router::new(cfg);
    let held: Op = Op::Insert {
        pool: Pool::Regular,
        model: String::new(),
        worker: "w0".into(),
        text: "système prompt 日本語".into(),
    };
    r.apply(0, &held);
    Some(r)
}

fuzz_target!(|data: &[u8]| {
    let op: Option<Op> = Op::decode_with(data, str::to_owned);
    if let Some(op) = &op {
        let again = Op::decode_with(&op.encode(), str::to_owned);
        assert_eq!(again.as_ref(), Some(op), "decode(encode(op)) == op");
    }
    let incoming = Incoming::decode(data);
    assert!(
        op.is_none() || incoming.is_some(),
        "what decodes whole decodes as a VM applies it"
    );
    let Some(mut r) = router() else { return };
    let applied = r.apply_encoded(1, data);
    assert!(op.is_none() || applied, "a whole operation is applied");
    assert!(incoming.is_some() || !applied, "garbage is refused");
});
