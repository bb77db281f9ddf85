//! Operations read back from shared data (another VM's bytes, or garbage): decoding
//! never panics, and whatever decodes encodes back to bytes that decode the same.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router::shared::Op;

fuzz_target!(|data: &[u8]| {
    if let Some(op) = Op::decode(data) {
        let again = Op::decode(&op.encode());
        assert_eq!(again, Some(op), "decode(encode(op)) == op");
    }
});
