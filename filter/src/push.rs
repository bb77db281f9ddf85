//! The collector's push: what it may send to the stats endpoint and how a push is
//! checked before anything is stored.
//!
//! A push is all-or-nothing: the token, the size, the JSON shape, every worker name
//! and every number are checked before anything is stored, so a bad push changes no
//! state (the glue stores the reports with `crate::shared::SamplesTable`). The
//! format and its ceilings are `llm_router_push`'s, the types the collector writes.
//!
//! The token is compared through SHA-256 digests, so the comparison takes the same
//! time whatever prefix of the token a caller guessed.

use llm_router_push::{Push, WorkerStats};
use serde::de::IgnoredAny;
use sha2::{Digest, Sha256};

use crate::config::WorkerConfig;
use crate::load::{EngineSample, Report};

/// Why a push was refused; maps to the HTTP status the collector gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushError {
    Unauthorized,
    /// Too many failed token checks lately: every push is refused for a while.
    LockedOut {
        retry_after_s: u64,
    },
    TooLarge {
        limit: usize,
    },
    BadRequest(String),
}

impl PushError {
    pub fn status(&self) -> u32 {
        match self {
            PushError::Unauthorized => 401,
            PushError::LockedOut { .. } => 429,
            PushError::TooLarge { .. } => 413,
            PushError::BadRequest(_) => 400,
        }
    }

    pub fn reason(&self) -> String {
        match self {
            PushError::Unauthorized => "missing or wrong bearer token".to_string(),
            PushError::LockedOut { retry_after_s } => {
                format!("too many failed token checks: locked out for {retry_after_s} s")
            }
            PushError::TooLarge { limit } => format!("snapshot larger than {limit} bytes"),
            PushError::BadRequest(r) => r.clone(),
        }
    }
}

/// Constant-time check of an `authorization` header against the configured token.
pub fn token_matches(authorization: Option<&str>, token: &str) -> bool {
    let presented = authorization
        .and_then(|h| h.strip_prefix("Bearer "))
        .unwrap_or("");
    let a = Sha256::digest(presented.as_bytes());
    let b = Sha256::digest(token.as_bytes());
    let diff = a
        .iter()
        .zip(b.iter())
        .fold(0u8, |acc, (x, y)| acc | (x ^ y));
    diff == 0 && !token.is_empty()
}

/// Checks a push body against the configured workers and returns the new reports
/// by worker index (workers the push does not mention keep `None`). A worker is
/// named by `name`, or by `address` (as the collector sees endpoint-mode pools).
///
/// The size is checked before parsing, so a huge body costs no allocation; the
/// shape and every number are checked as the body is read (`llm_router_push`);
/// `membership` is skipped here (discovery mode reads it with the worker-config
/// rules, `crate::background::membership`).
pub fn parse_push(
    body: &[u8],
    max_bytes: usize,
    workers: &[WorkerConfig],
    now_ms: u64,
) -> Result<Vec<Option<Report>>, PushError> {
    if body.len() > max_bytes {
        return Err(PushError::TooLarge { limit: max_bytes });
    }
    let push: Push<IgnoredAny> = serde_json::from_slice(body)
        .map_err(|e| PushError::BadRequest(format!("snapshot refused: {e}")))?;
    let mut out: Vec<Option<Report>> = vec![None; workers.len()];
    for stats in &push.workers {
        let label = stats
            .name
            .as_deref()
            .or(stats.address.as_deref())
            .unwrap_or("?");
        let index = workers.iter().position(|w| match &stats.name {
            Some(name) => *name == w.name,
            None => stats.address.is_some() && w.address == stats.address,
        });
        let Some(slot) = index.and_then(|i| out.get_mut(i)) else {
            return Err(PushError::BadRequest(format!(
                "unknown worker `{label}`: not in the plugin config's workers"
            )));
        };
        if slot.is_some() {
            return Err(PushError::BadRequest(format!(
                "worker `{label}` appears twice"
            )));
        }
        *slot = Some(report(stats, now_ms));
    }
    Ok(out)
}

/// What a checked line says of its worker: numbers left out read as an idle queue
/// and unknown usage and latencies.
fn report(stats: &WorkerStats, now_ms: u64) -> Report {
    if !stats.reachable {
        return Report::Unreachable { at_ms: now_ms };
    }
    Report::Sample(EngineSample {
        num_waiting: stats.num_waiting.unwrap_or(0),
        num_running: stats.num_running.unwrap_or(0),
        kv_usage: stats.kv_usage,
        ttft_p90_s: stats.ttft_p90_s,
        tpot_p90_s: stats.tpot_p90_s,
        kv_capacity_tokens: stats.kv_capacity_tokens,
        prompt_tokens_total: stats.prompt_tokens_total,
        at_ms: now_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::workers;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn token_check() {
        assert!(token_matches(Some("Bearer s3cret"), "s3cret"));
        assert!(!token_matches(Some("Bearer s3cre"), "s3cret"));
        assert!(!token_matches(Some("bearer s3cret"), "s3cret"));
        assert!(!token_matches(Some("s3cret"), "s3cret"));
        assert!(!token_matches(None, "s3cret"));
        assert!(
            !token_matches(Some("Bearer "), ""),
            "an empty token never matches"
        );
    }

    #[test]
    fn a_good_push_yields_reports_by_index() {
        let body = br#"{"collector":"c","workers":[
            {"name":"w1","num_waiting":3,"num_running":5,"kv_usage":0.5,"ttft_p90_s":0.8,"tpot_p90_s":null},
            {"address":"10.0.0.1:8000","reachable":false,"error":"refused"}]}"#;
        let r = parse_push(body, 4096, &workers(), 77).unwrap();
        assert_eq!(
            r[0],
            Some(Report::Unreachable { at_ms: 77 }),
            "matched by address"
        );
        let Some(Report::Sample(s)) = r[1] else {
            panic!("{r:?}")
        };
        assert_eq!(
            (
                s.num_waiting,
                s.num_running,
                s.kv_usage,
                s.tpot_p90_s,
                s.at_ms
            ),
            (3, 5, Some(0.5), None, 77)
        );
    }

    /// What the collector writes with the shared types is what the filter reads.
    #[test]
    fn a_push_written_with_the_shared_types_is_read_back() {
        let push = Push {
            collector: Some("llm-collector".into()),
            seq: Some(1),
            interval_ms: Some(1000),
            workers: vec![
                WorkerStats {
                    engine: Some("sglang".into()),
                    num_waiting: Some(3),
                    num_running: Some(5),
                    kv_usage: Some(0.5),
                    ttft_p90_s: Some(0.8),
                    tpot_p90_s: Some(0.02),
                    kv_capacity_tokens: Some(65536),
                    prompt_tokens_total: Some(987_654),
                    ..WorkerStats::reachable(Some("w1".into()), None)
                },
                WorkerStats::unreachable(None, Some("10.0.0.1:8000".into()), "refused".into()),
            ],
            membership: Some(vec![llm_router_push::Member {
                name: "w9".into(),
                ..Default::default()
            }]),
        };
        let body = serde_json::to_vec(&push).unwrap();
        let sample = EngineSample {
            num_waiting: 3,
            num_running: 5,
            kv_usage: Some(0.5),
            ttft_p90_s: Some(0.8),
            tpot_p90_s: Some(0.02),
            kv_capacity_tokens: Some(65536),
            prompt_tokens_total: Some(987_654),
            at_ms: 9,
        };
        assert_eq!(
            parse_push(&body, 4096, &workers(), 9),
            Ok(vec![
                Some(Report::Unreachable { at_ms: 9 }),
                Some(Report::Sample(sample))
            ]),
            "every number arrives, the pool host by its address; membership is not read here"
        );
    }

    #[test]
    fn bad_pushes_are_refused_with_a_reason() {
        let w = workers();
        let bad = |body: &str| parse_push(body.as_bytes(), 4096, &w, 1).unwrap_err();
        assert_eq!(
            parse_push(&[b' '; 10], 5, &w, 1),
            Err(PushError::TooLarge { limit: 5 })
        );
        assert_eq!(bad("nope").status(), 400);
        assert_eq!(bad(r#"{"workers":{}}"#).status(), 400);
        assert!(bad(r#"{"workers":[{"name":"w9"}]}"#)
            .reason()
            .contains("unknown worker `w9`"));
        assert!(bad(r#"{"workers":[{"name":"w0","num_waiting":-1}]}"#)
            .reason()
            .contains("num_waiting"));
        assert!(bad(r#"{"workers":[{"name":"w0","num_waiting":1.5}]}"#)
            .reason()
            .contains("num_waiting"));
        assert!(bad(r#"{"workers":[{"name":"w0","kv_usage":1.5}]}"#)
            .reason()
            .contains("kv_usage"));
        assert!(bad(r#"{"workers":[{"name":"w0","ttft_p90_s":"x"}]}"#)
            .reason()
            .contains("ttft_p90_s"));
        assert!(bad(r#"{"workers":[{"name":"w0","reachable":"yes"}]}"#)
            .reason()
            .contains("reachable"));
        assert!(bad(r#"{"workers":[{"name":"w0"},{"name":"w0"}]}"#)
            .reason()
            .contains("twice"));
        assert!(bad(r#"{"workers":[7]}"#).reason().contains("object"));
    }

    #[test]
    fn pushed_numbers_are_bounded_at_sane_ceilings() {
        let w = workers();
        let push = |field: &str, v: &str| {
            let body = format!(r#"{{"workers":[{{"name":"w1","{field}":{v}}}]}}"#);
            parse_push(body.as_bytes(), 4096, &w, 1)
        };
        // (field, at the ceiling, just over, far over)
        let cases = [
            ("ttft_p90_s", "3600", "3600.001", "1e300"),
            ("tpot_p90_s", "60", "60.5", "1e300"),
            ("kv_usage", "1", "1.0001", "1e300"),
            ("num_waiting", "1000000", "1000001", "18446744073709551615"),
            ("num_running", "1000000", "1000001", "18446744073709551615"),
        ];
        for (field, ceiling, over, far) in cases {
            assert!(
                push(field, ceiling).is_ok(),
                "{field} = {ceiling} is allowed"
            );
            for v in [over, far] {
                let e = push(field, v).unwrap_err();
                assert_eq!(e.status(), 400, "{field} = {v}");
                assert!(
                    e.reason().contains(field),
                    "the refusal names {field}: {e:?}"
                );
            }
        }
    }
}
