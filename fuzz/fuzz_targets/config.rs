//! Plugin configurations: validation never panics; an accepted config re-validates
//! (accepting is stable) and has workers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router::config::Config;

fuzz_target!(|data: &[u8]| {
    if let Ok(cfg) = Config::from_json(data) {
        assert!(!cfg.workers.is_empty(), "an accepted config has workers");
        assert!(
            Config::from_json(data).is_ok(),
            "validation is a function of the bytes"
        );
    }
});
