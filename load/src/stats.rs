//! Percentiles and the aggregate summary of a run.

use crate::record::Record;
use std::collections::BTreeMap;
use std::time::Duration;

/// How many distinct error reasons the summary keeps (the count of errors is always
/// exact; reasons past this are only counted).
pub const MAX_ERROR_REASONS: usize = 5;

/// Nearest-rank percentile of an ascending-sorted slice: the smallest sample such that
/// at least `p`% of samples are <= it. Chosen over interpolation because it always
/// returns a latency that was actually observed and is exact at small sample counts
/// (one sample: every percentile is that sample). `None` for no samples.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = ((p / 100.0) * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Sorts samples ascending (NaN-safe, though timings are never NaN).
pub fn sorted(mut samples: Vec<f64>) -> Vec<f64> {
    samples.sort_by(f64::total_cmp);
    samples
}

/// Everything the report shows about a run.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Summary {
    pub requests: usize,
    pub errors: usize,
    /// First few distinct error reasons, in workload order: `(first workload line,
    /// reason, how many errors had exactly this reason)`. Grouped because a dead
    /// backend otherwise fills the report with the same line.
    pub error_reasons: Vec<(usize, String, usize)>,
    /// Responses per worker, over every response that named one (errors included, as
    /// they show where the router sent traffic too).
    pub per_worker: BTreeMap<String, u64>,
    /// Requests whose response named no worker (failed connections, foreign answers).
    pub without_worker: usize,
    /// Sums over successful requests.
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    /// cached_tokens / prompt_tokens, 0 when no prompt tokens.
    pub cached_token_ratio: f64,
    /// Latency percentiles over successful requests (errors, timeouts in particular,
    /// would otherwise distort them); `None` when nothing succeeded.
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// Successful streaming requests and their median time to first byte.
    pub streams: usize,
    pub ttfb_p50_ms: Option<f64>,
    /// Streams: time to first token and inter-token latency percentiles.
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    /// Count per router decision label (`x-llm-router-decision`), over all responses.
    pub decisions_seen: BTreeMap<String, u64>,
    pub wall_s: f64,
    /// Completed requests (success or not) per second of wall time.
    pub req_per_s: f64,
}

/// Aggregates records of one run that took `wall` end to end.
pub fn summarize(records: &[Record], wall: Duration) -> Summary {
    let mut s = Summary {
        requests: records.len(),
        ..Summary::default()
    };
    let mut latencies = Vec::new();
    let mut ttfbs = Vec::new();
    let mut ttfts = Vec::new();
    let mut itls = Vec::new();
    for r in records {
        match &r.worker {
            Some(w) => *s.per_worker.entry(w.clone()).or_default() += 1,
            None => s.without_worker += 1,
        }
        if let Some(d) = &r.decision {
            *s.decisions_seen.entry(d.clone()).or_default() += 1;
        }
        if let Some(err) = &r.error {
            s.errors += 1;
            if let Some(seen) = s.error_reasons.iter_mut().find(|e| &e.1 == err) {
                seen.2 += 1;
            } else if s.error_reasons.len() < MAX_ERROR_REASONS {
                s.error_reasons.push((r.line, err.clone(), 1));
            }
            continue;
        }
        s.prompt_tokens += r.prompt_tokens.unwrap_or(0);
        s.cached_tokens += r.cached_tokens.unwrap_or(0);
        latencies.push(r.latency_ms);
        if let Some(t) = r.ttfb_ms {
            ttfbs.push(t);
        }
        ttfts.extend(r.ttft_ms);
        itls.extend_from_slice(&r.itl_ms);
    }
    if s.prompt_tokens > 0 {
        s.cached_token_ratio = s.cached_tokens as f64 / s.prompt_tokens as f64;
    }
    let latencies = sorted(latencies);
    s.p50_ms = percentile(&latencies, 50.0);
    s.p90_ms = percentile(&latencies, 90.0);
    s.p99_ms = percentile(&latencies, 99.0);
    s.streams = ttfbs.len();
    s.ttfb_p50_ms = percentile(&sorted(ttfbs), 50.0);
    let ttfts = sorted(ttfts);
    s.ttft_p50_ms = percentile(&ttfts, 50.0);
    s.ttft_p99_ms = percentile(&ttfts, 99.0);
    let itls = sorted(itls);
    s.itl_p50_ms = percentile(&itls, 50.0);
    s.itl_p99_ms = percentile(&itls, 99.0);
    s.wall_s = wall.as_secs_f64();
    if s.wall_s > 0.0 {
        s.req_per_s = s.requests as f64 / s.wall_s;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_boundaries() {
        assert_eq!(percentile(&[], 50.0), None);
        // One sample: every percentile is that sample.
        for p in [0.0, 1.0, 50.0, 90.0, 99.0, 100.0] {
            assert_eq!(percentile(&[7.0], p), Some(7.0));
        }
        // Two samples: p50 is the lower, anything above is the upper.
        let two = [1.0, 2.0];
        assert_eq!(percentile(&two, 0.0), Some(1.0));
        assert_eq!(percentile(&two, 50.0), Some(1.0));
        assert_eq!(percentile(&two, 50.1), Some(2.0));
        assert_eq!(percentile(&two, 90.0), Some(2.0));
        assert_eq!(percentile(&two, 100.0), Some(2.0));
        // 1..=100: pN is N.
        let hundred: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&hundred, 99.0), Some(99.0));
        assert_eq!(percentile(&hundred, 50.0), Some(50.0));
        assert_eq!(percentile(&hundred, 90.0), Some(90.0));
        assert_eq!(percentile(&hundred, 100.0), Some(100.0));
        assert_eq!(percentile(&hundred, 99.5), Some(100.0));
    }

    fn ok(line: usize, worker: &str, ms: f64, prompt: u64, cached: u64) -> Record {
        Record {
            line,
            status: Some(200),
            latency_ms: ms,
            worker: Some(worker.into()),
            decision: Some("prefix".into()),
            prompt_tokens: Some(prompt),
            cached_tokens: Some(cached),
            ..Record::default()
        }
    }

    #[test]
    fn summary_counts_and_ratio() {
        let mut recs = vec![
            ok(1, "w1", 10.0, 100, 0),
            ok(2, "w0", 20.0, 100, 50),
            ok(3, "w1", 30.0, 200, 150),
        ];
        for line in [4, 5] {
            recs.push(Record {
                line,
                error: Some("request failed: refused".into()),
                latency_ms: 1.0,
                ..Record::default()
            });
        }
        recs[2].ttfb_ms = Some(3.0);
        recs[1].decision = Some("least_loaded".into());
        let s = summarize(&recs, Duration::from_secs(2));
        assert_eq!(s.requests, 5);
        assert_eq!(s.errors, 2);
        assert_eq!(
            s.error_reasons,
            vec![(4, "request failed: refused".to_string(), 2)]
        );
        assert_eq!(s.per_worker.get("w1"), Some(&2));
        assert_eq!(s.per_worker.get("w0"), Some(&1));
        assert_eq!(s.without_worker, 2);
        assert_eq!((s.prompt_tokens, s.cached_tokens), (400, 200));
        assert_eq!(s.cached_token_ratio, 0.5);
        assert_eq!((s.p50_ms, s.p99_ms), (Some(20.0), Some(30.0)));
        assert_eq!((s.streams, s.ttfb_p50_ms), (1, Some(3.0)));
        assert_eq!(s.decisions_seen.get("prefix"), Some(&2));
        assert_eq!(s.decisions_seen.get("least_loaded"), Some(&1));
        assert_eq!(s.req_per_s, 2.5);
    }

    #[test]
    fn summary_of_nothing() {
        let s = summarize(&[], Duration::ZERO);
        assert_eq!(s.requests, 0);
        assert_eq!(s.p50_ms, None);
        assert_eq!(s.cached_token_ratio, 0.0);
        assert_eq!(s.req_per_s, 0.0);
    }
}
