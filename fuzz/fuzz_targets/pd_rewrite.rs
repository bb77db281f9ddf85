//! The PD body rewrite: any body either gets the bootstrap fields (and stays JSON) or
//! is refused with a reason; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router::parse::ApiKind;
use llm_router::pd::{inject_bootstrap, Bootstrap};
use llm_router::rng::SplitMix64;

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
        let v: serde_json::Value =
            serde_json::from_slice(&out.body).expect("the rewritten body is JSON");
        assert!(v.get("bootstrap_room").is_some());
    }
});
