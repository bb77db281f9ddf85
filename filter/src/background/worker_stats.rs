//! What the filter reports per worker at each tick, so operators see load per engine
//! the way the router sees it: its own in-flight count, the overload flag, whether
//! the collector reaches the engine, and the engine's last fresh sample.
//!
//! Gauges, not counters: every VM writes the same values (they come from shared
//! data, or from the trees every serving VM keeps alike), so the last writer is as
//! good as any.

use crate::config::Config;
use crate::load::{Loads, Report};

/// One worker's gauge values, in `metric_names::worker::GAUGES` order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerGauges {
    pub inflight: u64,
    pub overloaded: bool,
    pub unreachable: bool,
    pub engine_waiting: u64,
    pub engine_running: u64,
    /// KV cache usage, percent rounded (0 without a fresh sample).
    pub engine_kv_usage_pct: u64,
    /// KV cache capacity in tokens (0 without a fresh sample stating it).
    pub engine_kv_capacity_tokens: u64,
    /// From the trees (`crate::request::router::Router::tree_gauges`); unset on a
    /// VM that keeps none, which then
    /// leaves them to the VMs that do.
    pub tree: Option<TreeGauges>,
}

/// What a worker holds of the trees and what its engine can hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TreeGauges {
    pub tree_chars: u64,
    /// 0: unbounded (capacity or chars per token unknown).
    pub kv_bound_chars: u64,
    pub chars_per_token_milli: u64,
}

impl WorkerGauges {
    /// The values in `metric_names::worker::GAUGES` order; `None`: not this VM's
    /// to write.
    pub fn values(&self) -> [Option<u64>; 10] {
        let tree = self.tree;
        [
            Some(self.inflight),
            Some(u64::from(self.overloaded)),
            Some(u64::from(self.unreachable)),
            Some(self.engine_waiting),
            Some(self.engine_running),
            Some(self.engine_kv_usage_pct),
            Some(self.engine_kv_capacity_tokens),
            tree.map(|t| t.tree_chars),
            tree.map(|t| t.kv_bound_chars),
            tree.map(|t| t.chars_per_token_milli),
        ]
    }
}

/// Every configured worker's gauges from one `Loads` snapshot. A stale sample reads
/// as no sample (zeros), as it does for routing; an unreachable report stays visible
/// until the next push replaces it, stale or not: the last word about an engine
/// the collector cannot reach is that it cannot.
pub fn worker_gauges(cfg: &Config, loads: &Loads) -> Vec<WorkerGauges> {
    (0..cfg.workers.len())
        .map(|i| {
            let mut g = WorkerGauges {
                inflight: loads.inflight.get(i),
                overloaded: loads.overloaded.get(i).copied().unwrap_or(false),
                unreachable: matches!(
                    loads.engine.reports.get(i),
                    Some(Some(Report::Unreachable { .. }))
                ),
                ..WorkerGauges::default()
            };
            if let Some(s) = loads.engine.fresh(i, loads.now_ms, cfg.stale_after_ms) {
                g.engine_waiting = s.num_waiting;
                g.engine_running = s.num_running;
                g.engine_kv_usage_pct = s
                    .kv_usage
                    .filter(|u| u.is_finite())
                    .map_or(0, |u| (u.clamp(0.0, 1.0) * 100.0).round() as u64);
                g.engine_kv_capacity_tokens = s.kv_capacity_tokens.unwrap_or(0);
            }
            g
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::{EngineSample, LoadTable};
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn sample(waiting: u64, kv: Option<f64>, at_ms: u64) -> Option<Report> {
        Some(Report::Sample(EngineSample {
            kv_usage: kv,
            kv_capacity_tokens: kv.map(|_| 65536),
            ..EngineSample::queue(waiting, 2, at_ms)
        }))
    }

    #[test]
    fn gauges_follow_the_snapshot_and_stale_samples_read_as_none() {
        let cfg = Config::from_json(
            br#"{"workers":[{"name":"a"},{"name":"b"},{"name":"c"},{"name":"d"}],"stale_after_ms":1000}"#,
        )
        .unwrap();
        let loads = Loads {
            inflight: vec![3, 0, 1].into(),
            engine: LoadTable {
                reports: vec![
                    sample(4, Some(0.456), 9_500),
                    sample(9, Some(0.9), 1_000),
                    Some(Report::Unreachable { at_ms: 0 }),
                ],
            }
            .into(),
            now_ms: 10_000,
            overloaded: vec![false, true].into(),
            ..Loads::default()
        };
        let g = worker_gauges(&cfg, &loads);
        assert_eq!(g.len(), 4, "one per configured worker");
        let shared = |v: [u64; 7]| {
            let mut all = [None; 10];
            for (slot, v) in all.iter_mut().zip(v) {
                *slot = Some(v);
            }
            all
        };
        assert_eq!(g[0].values(), shared([3, 0, 0, 4, 2, 46, 65536]));
        assert_eq!(
            g[1].values(),
            shared([0, 1, 0, 0, 0, 0, 0]),
            "stale sample: no engine load"
        );
        assert_eq!(
            g[2].values(),
            shared([1, 0, 1, 0, 0, 0, 0]),
            "unreachable, even when old"
        );
        assert_eq!(g[3], WorkerGauges::default(), "never reported");
    }
}
