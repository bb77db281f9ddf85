//! Every router of a comparison in one table: the run's own router first, then each
//! baseline, on the same workload and each on a fresh fleet. The columns are what
//! decides between routers: the engine-reported cached share of prompt tokens,
//! request latency and time to first token (p50/p99), errors, and where the requests
//! went (one column per engine, so a router that piles onto one engine shows).

use llm_load::run::RunResult;
use std::collections::BTreeSet;

/// The table, a header line then one line per run.
pub fn table(runs: &[&RunResult]) -> String {
    let engines: BTreeSet<&str> = runs
        .iter()
        .flat_map(|r| r.summary.per_worker.keys().map(String::as_str))
        .collect();
    let width = runs
        .iter()
        .map(|r| r.policy.len())
        .chain(["router".len()])
        .max()
        .unwrap_or(0);
    let mut out = format!(
        "{:<width$}  cached  p50 ms  p99 ms  TTFT p50  TTFT p99  errors",
        "router"
    );
    for e in &engines {
        out += &format!("  {e:>5}");
    }
    out.push('\n');
    for r in runs {
        let s = &r.summary;
        out += &format!(
            "{:<width$}  {:>6.3}  {:>6}  {:>6}  {:>8}  {:>8}  {:>6}",
            r.policy,
            s.cached_token_ratio,
            ms(s.p50_ms),
            ms(s.p99_ms),
            ms(s.ttft_p50_ms),
            ms(s.ttft_p99_ms),
            s.errors
        );
        for e in &engines {
            let n = s.per_worker.get(*e).copied().unwrap_or(0);
            out += &format!("  {n:>5}");
        }
        out.push('\n');
    }
    out
}

fn ms(v: Option<f64>) -> String {
    v.map_or("n/a".into(), |v| format!("{v:.1}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use llm_load::stats::Summary;
    use std::collections::BTreeMap;

    fn run(policy: &str, cached: f64, p99: f64, per_worker: &[(&str, u64)]) -> RunResult {
        let summary = Summary {
            cached_token_ratio: cached,
            p50_ms: Some(10.0),
            p99_ms: Some(p99),
            ttft_p50_ms: Some(4.25),
            per_worker: per_worker
                .iter()
                .map(|(w, n)| (w.to_string(), *n))
                .collect::<BTreeMap<_, _>>(),
            ..Summary::default()
        };
        RunResult::new(policy.into(), summary, |_| None)
    }

    #[test]
    fn one_line_per_router_with_a_column_per_engine_any_run_used() {
        let ours = run("predicted_ttft", 0.8046, 110.44, &[("w0", 3), ("w1", 2)]);
        let smg = run("smg", 0.7, 98.0, &[("w1", 4), ("w2", 1)]);
        let t = table(&[&ours, &smg]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3, "a header and one line per run:\n{t}");
        let cells = |l: &str| l.split_whitespace().map(String::from).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[0]),
            [
                "router", "cached", "p50", "ms", "p99", "ms", "TTFT", "p50", "TTFT", "p99",
                "errors", "w0", "w1", "w2"
            ]
        );
        assert_eq!(
            cells(lines[1]),
            [
                "predicted_ttft",
                "0.805",
                "10.0",
                "110.4",
                "4.2",
                "n/a",
                "0",
                "3",
                "2",
                "0"
            ],
            "an engine the run did not use counts 0, a TTFT it did not measure n/a"
        );
        assert_eq!(cells(lines[2])[..2], ["smg", "0.700"]);
        assert_eq!(cells(lines[2])[7..], ["0", "4", "1"]);
        assert!(
            lines.iter().all(|l| l.len() == lines[0].len()),
            "columns line up under the header:\n{t}"
        );
    }
}
