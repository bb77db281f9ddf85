//! The PD body rewrite: any body either gets the bootstrap fields (and stays JSON) or
//! is refused with a reason; never a panic.
#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use llm_router::parse::ApiKind;
use llm_router::request::pd::{inject_bootstrap, Bootstrap};
use llm_router::rng::SplitMix64;
use serde_json::value::RawValue;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let endpoint = [
        Some(ApiKind::Chat),
        Some(ApiKind::Completions),
        Some(ApiKind::Generate),
        None,
    ][usize::from(selector) % 4];
    let target = Bootstrap {
        host: "10.0.0.1",
        port: 9000,
    };
    if let Ok(out) = inject_bootstrap(endpoint, body, target, &mut SplitMix64(7)) {
        // Values are copied through as sent, so a number past f64's range (valid JSON,
        // which serde_json's `Value` refuses) reaches the engine as the client wrote it.
        let members: HashMap<String, &RawValue> =
            serde_json::from_slice(&out.body).expect("the rewritten body is a JSON object");
        assert!(members.contains_key("bootstrap_room"));
        if serde_json::from_slice::<serde_json::Value>(body).is_ok() {
            let v: serde_json::Value =
                serde_json::from_slice(&out.body).expect("JSON values in, JSON values out");
            assert!(v.get("bootstrap_room").is_some());
        }
    }
});
