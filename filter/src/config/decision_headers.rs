//! Which routed responses carry the decision headers (`crate::support::header_names`).
//!
//! They cost Envoy a header write each (the three of a plain request about 13.8k
//! instructions, against a request's 100k or so for all the rest the router does),
//! and they name the fleet's workers to whoever sent the request. So by default
//! only a request that asks for them gets them: one carrying
//! `x-llm-router-explain` (`crate::support::header_names::EXPLAIN_HEADER`), as `llm-load`
//! and the tests send it. Asking costs a header lookup that finds nothing, which
//! Envoy answers without copying anything into the VM.

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// `decision_headers`: `true`, `false` or `"on_request"` (the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DecisionHeaders {
    /// On every routed response (`true`).
    Always,
    /// On the responses to requests that carry `x-llm-router-explain`.
    #[default]
    OnRequest,
    /// Never (`false`).
    Never,
}

impl<'de> Deserialize<'de> for DecisionHeaders {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d)? {
            Value::Bool(true) => Ok(Self::Always),
            Value::Bool(false) => Ok(Self::Never),
            Value::String(s) if s == "on_request" => Ok(Self::OnRequest),
            other => Err(serde::de::Error::custom(format!(
                "decision_headers must be true, false or \"on_request\", not {other}"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn read(json: &str) -> Result<DecisionHeaders, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn the_three_values_read_and_anything_else_is_named() {
        assert_eq!(read("true"), Ok(DecisionHeaders::Always));
        assert_eq!(read("false"), Ok(DecisionHeaders::Never));
        assert_eq!(read(r#""on_request""#), Ok(DecisionHeaders::OnRequest));
        for bad in [r#""always""#, "1", "null", "[]"] {
            let e = read(bad).unwrap_err();
            assert!(
                e.contains("decision_headers must be true, false or \"on_request\""),
                "{bad}: {e}"
            );
        }
    }
}
