//! `GET /v1/models` answered by the router itself from the models its workers
//! declare (the union, each once), as peer routers do: forwarded, it would list one
//! engine's models, and a client would never see the models only other engines
//! serve. When no worker declares its models (any worker serves anything), the
//! router knows nothing better than an engine, and the request goes to one.

use crate::config::Config;
use serde_json::json;
use std::collections::BTreeSet;

/// Whether this is a model listing request (`GET` on a path ending in `/v1/models`,
/// query ignored). The method is asked for only on that path: reading it is a
/// hostcall, which every other request is spared.
pub fn is_list_request(path: &str, method: impl FnOnce() -> String) -> bool {
    let path = path.split('?').next().unwrap_or(path);
    path.ends_with("/v1/models") && method() == "GET"
}

/// The OpenAI-style list of every declared model, or `None` when some worker
/// declares none (it serves whatever it is asked) or none is known yet (discovery
/// mode before the first push: routing answers why).
pub fn list_body(cfg: &Config) -> Option<String> {
    if cfg.workers.is_empty() || cfg.workers.iter().any(|w| w.models.is_empty()) {
        return None;
    }
    let models: BTreeSet<&str> = cfg
        .workers
        .iter()
        .flat_map(|w| w.models.iter().map(String::as_str))
        .collect();
    let data: Vec<_> = models
        .iter()
        .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "llm-router"}))
        .collect();
    Some(json!({"object": "list", "data": data}).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_list_is_the_union_of_declared_models() {
        let cfg = Config::from_json(
            br#"{"workers":[{"name":"a","models":["m2","m1"]},{"name":"b","models":["m1","m3"]}]}"#,
        )
        .unwrap();
        let body: serde_json::Value = serde_json::from_str(&list_body(&cfg).unwrap()).unwrap();
        let ids: Vec<&str> = body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["m1", "m2", "m3"], "each model once, sorted");
        assert_eq!(body["object"], "list");
        assert_eq!(body["data"][0]["object"], "model");
    }

    #[test]
    fn a_worker_that_declares_nothing_sends_the_listing_to_an_engine() {
        let cfg = Config::from_json(br#"{"workers":[{"name":"a","models":["m"]},{"name":"b"}]}"#)
            .unwrap();
        assert_eq!(list_body(&cfg), None);
    }

    #[test]
    fn only_a_get_on_the_models_path_is_a_listing() {
        assert!(is_list_request("/v1/models", || "GET".into()));
        assert!(is_list_request("/openai/v1/models?x=1", || "GET".into()));
        assert!(!is_list_request("/v1/models", || "POST".into()));
        assert!(!is_list_request("/v1/models/m1", || "GET".into()));
        assert!(!is_list_request("/v1/chat/completions", || "GET".into()));
        let asked = std::cell::Cell::new(false);
        let method = || {
            asked.set(true);
            "POST".to_string()
        };
        assert!(!is_list_request("/v1/chat/completions", method));
        assert!(
            !asked.get(),
            "the method (a hostcall) is read only on the listing path"
        );
    }
}
