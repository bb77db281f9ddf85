//! The two outputs of a run: a human report, and one JSON object that scripts parse.
//!
//! The JSON is printed as the last line of stdout so a caller can take `tail -n1`
//! without caring about the human part above it; its first keys are a contract:
//! `requests, errors, per_worker, prompt_tokens, cached_tokens, cached_token_ratio,
//! p50_ms, p90_ms, p99_ms, decisions_seen, wall_s` (then extras: `req_per_s`,
//! `ttfb_p50_ms`, `streams`, `ttft_p50_ms`, `ttft_p99_ms`, `itl_p50_ms`,
//! `itl_p99_ms`). Percentiles are `null` when no request (or no stream) succeeded.

use crate::stats::Summary;
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The machine-readable summary. Field order here is the order in the output.
#[derive(Debug, Serialize, PartialEq)]
pub struct JsonSummary {
    pub requests: usize,
    pub errors: usize,
    /// Sorted by worker id (BTreeMap).
    pub per_worker: BTreeMap<String, u64>,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// 4 decimals.
    pub cached_token_ratio: f64,
    /// Milliseconds, 2 decimals.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub decisions_seen: BTreeMap<String, u64>,
    /// Seconds, 3 decimals.
    pub wall_s: f64,
    pub req_per_s: f64,
    pub ttfb_p50_ms: Option<f64>,
    pub streams: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
}

fn round(x: f64, decimals: i32) -> f64 {
    let f = 10f64.powi(decimals);
    (x * f).round() / f
}

impl From<&Summary> for JsonSummary {
    fn from(s: &Summary) -> Self {
        JsonSummary {
            requests: s.requests,
            errors: s.errors,
            per_worker: s.per_worker.clone(),
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            cached_token_ratio: round(s.cached_token_ratio, 4),
            p50_ms: s.p50_ms.map(|v| round(v, 2)),
            p90_ms: s.p90_ms.map(|v| round(v, 2)),
            p99_ms: s.p99_ms.map(|v| round(v, 2)),
            decisions_seen: s.decisions_seen.clone(),
            wall_s: round(s.wall_s, 3),
            req_per_s: round(s.req_per_s, 2),
            ttfb_p50_ms: s.ttfb_p50_ms.map(|v| round(v, 2)),
            streams: s.streams,
            ttft_p50_ms: s.ttft_p50_ms.map(|v| round(v, 2)),
            ttft_p99_ms: s.ttft_p99_ms.map(|v| round(v, 2)),
            itl_p50_ms: s.itl_p50_ms.map(|v| round(v, 2)),
            itl_p99_ms: s.itl_p99_ms.map(|v| round(v, 2)),
        }
    }
}

/// The summary as one line of JSON.
pub fn json_line(s: &Summary) -> String {
    // Serializing plain maps, integers and finite floats cannot fail; fall back to an
    // empty object rather than panicking if that ever changes.
    serde_json::to_string(&JsonSummary::from(s)).unwrap_or_else(|_| "{}".to_string())
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or_else(|| "n/a".to_string(), |v| format!("{v:.1} ms"))
}

/// The human-readable report (multi-line, ends with a newline).
pub fn human(s: &Summary) -> String {
    let mut out = String::new();
    let ok = s.requests - s.errors;
    let _ = writeln!(out, "== llm-load summary ==");
    let _ = writeln!(
        out,
        "requests:        {} ({} ok, {} errors)",
        s.requests, ok, s.errors
    );
    let mut listed = 0;
    for (line, reason, count) in &s.error_reasons {
        let _ = writeln!(out, "  {count} x {reason} (first at workload line {line})");
        listed += count;
    }
    if s.errors > listed {
        let _ = writeln!(
            out,
            "  ... {} more errors with other reasons",
            s.errors - listed
        );
    }
    let named: u64 = s.per_worker.values().sum();
    let _ = writeln!(out, "per worker:");
    for (worker, n) in &s.per_worker {
        let share = if named > 0 {
            100.0 * *n as f64 / named as f64
        } else {
            0.0
        };
        let _ = writeln!(out, "  {worker:<16} {n:>7}  {share:5.1}%");
    }
    if s.without_worker > 0 {
        let _ = writeln!(out, "  {:<16} {:>7}", "(no worker)", s.without_worker);
    }
    let _ = writeln!(
        out,
        "cached tokens:   {} / {} prompt tokens (ratio {:.4})",
        s.cached_tokens, s.prompt_tokens, s.cached_token_ratio
    );
    let _ = writeln!(
        out,
        "latency:         p50 {}  p90 {}  p99 {}",
        fmt_ms(s.p50_ms),
        fmt_ms(s.p90_ms),
        fmt_ms(s.p99_ms)
    );
    if s.streams > 0 {
        let _ = writeln!(
            out,
            "streams:         {} (first byte p50 {})",
            s.streams,
            fmt_ms(s.ttfb_p50_ms)
        );
        let _ = writeln!(
            out,
            "  TTFT:          p50 {}  p99 {}",
            fmt_ms(s.ttft_p50_ms),
            fmt_ms(s.ttft_p99_ms)
        );
        let _ = writeln!(
            out,
            "  inter-token:   p50 {}  p99 {}",
            fmt_ms(s.itl_p50_ms),
            fmt_ms(s.itl_p99_ms)
        );
    }
    if s.decisions_seen.is_empty() {
        let _ = writeln!(
            out,
            "decisions:       none (no x-llm-router-decision header)"
        );
    } else {
        let _ = writeln!(out, "decisions:");
        for (label, n) in &s.decisions_seen {
            let _ = writeln!(out, "  {label:<24} {n:>7}");
        }
    }
    let _ = writeln!(
        out,
        "wall time:       {:.3} s ({:.1} req/s)",
        s.wall_s, s.req_per_s
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_key_order_and_rounding() {
        let mut s = Summary {
            requests: 3,
            errors: 1,
            prompt_tokens: 3,
            cached_tokens: 1,
            cached_token_ratio: 1.0 / 3.0,
            p50_ms: Some(12.34567),
            wall_s: 1.23456,
            ..Summary::default()
        };
        s.per_worker.insert("w1".into(), 1);
        s.per_worker.insert("w0".into(), 2);
        let line = json_line(&s);
        assert!(!line.contains('\n'));
        assert!(line.starts_with(
            "{\"requests\":3,\"errors\":1,\"per_worker\":{\"w0\":2,\"w1\":1},\"prompt_tokens\":3,\
             \"cached_tokens\":1,\"cached_token_ratio\":0.3333,\"p50_ms\":12.35,\"p90_ms\":null,"
        ), "{line}");
        assert!(line.contains("\"wall_s\":1.235"), "{line}");
        let text = human(&s);
        assert!(text.contains("66.7%"), "{text}");
    }
}
