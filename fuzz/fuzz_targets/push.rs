//! Collector pushes: the parser never panics, refuses bodies over the limit, and an
//! accepted push has one report slot per configured worker.
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router::config::Config;
use llm_router::push::parse_push;

fuzz_target!(|data: &[u8]| {
    let cfg = Config::from_json(
        br#"{"workers":[{"name":"w0"},{"name":"w1","models":["m"]},{"name":"w2","address":"10.0.0.1:8000"}]}"#,
    )
    .expect("the fixed config is valid");
    let limit = 4096;
    match parse_push(data, limit, &cfg.workers, 1_000) {
        Ok(reports) => {
            assert!(data.len() <= limit);
            assert_eq!(reports.len(), cfg.workers.len());
        }
        Err(e) => assert!((400..500).contains(&e.status()), "a 4xx refusal"),
    }
});
