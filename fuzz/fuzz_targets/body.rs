//! A request body under every path shape: parsing never panics, and what it returns
//! holds together (routing text only for a routable body, a known shape).
#![no_main]

use libfuzzer_sys::fuzz_target;
use llm_router::parse::{parse, Parsed};

const PATHS: [&str; 5] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/generate",
    "/v1/embeddings",
    "/",
];

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let path = PATHS[usize::from(selector) % PATHS.len()];
    match parse(path, body) {
        Parsed::Routable(r) => assert!(!body.is_empty() && r.text.len() <= body.len() * 4),
        Parsed::Unroutable { model, .. } => assert!(model.len() <= body.len()),
    }
});
