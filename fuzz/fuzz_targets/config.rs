//! Plugin configurations: validation never panics; an accepted config re-validates
//! (accepting is stable) and has workers, or takes them from the collector.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router::config::Config;

fuzz_target!(|data: &[u8]| {
    if let Ok(cfg) = Config::from_json(data) {
        assert!(
            !cfg.workers.is_empty() || cfg.discovers(),
            "an accepted config has workers or discovers them"
        );
        assert!(
            Config::from_json(data).is_ok(),
            "validation is a function of the bytes"
        );
    }
});
