//! `predicted_ttft`: the least predicted time to first token under a bounded-load
//! cap. The model is stated at the top of `predict.rs` (each candidate's predicted
//! time to first token, and the costs it learns), the rungs that choose by it at
//! the top of `ladder.rs`; around them:
//!
//! - `route`: one request's decision: its walk of the tree, the candidates it
//!   scores, the ladder's pick;
//! - `draw` and `sample`: which candidates a request scores in a fleet larger than
//!   `ttft_sample_size`;
//! - `work_hold`: a request's prefill booked in the in-flight table until its first
//!   byte, which teaches the worker's costs;
//! - `room`: each engine's cache room, which weighs a worker's conversations.
//!
//! Its settings are parsed and validated with the rest of the configuration
//! (`crate::config`, `ttft.rs`); its tables live with the other shared tables
//! (`crate::shared::CostTable`, the in-flight table's work), their values in
//! `crate::load`.

mod draw;
mod ladder;
mod predict;
mod room;
mod route;
mod sample;
pub mod work_hold;

pub use ladder::Ladder;
pub use predict::{learn_prefill, learn_service, Scored, TtftCandidate};
pub use work_hold::{learn_end, learn_first_byte, WorkHold};

use super::{unreadable, Ask, Chosen, Held, Select};
use crate::config::{
    Config, DEFAULT_LOAD_FACTOR, DEFAULT_PREFILL_US_PER_CHAR, DEFAULT_SERVICE_MS,
    DEFAULT_STAY_FACTOR, DEFAULT_TTFT_SAMPLE_SIZE,
};
use crate::load::WorkerCosts;
use crate::rng::Rng;

/// The policy's settings, defaults filled in (`Select::params`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TtftParams {
    pub load_factor: f64,
    /// Prefill cost per uncached char before a worker's is learned.
    pub prefill_us_per_char: f64,
    /// Service time per request ahead before a worker's is learned.
    pub service_ms: f64,
    /// A holder of the longest match stays while its prediction is at most this
    /// many times the best.
    pub stay_factor: f64,
    /// Fleets larger than this are sampled (0: never).
    pub sample_size: usize,
    /// Costs learned longer ago than this are forgotten (`stale_after_ms`).
    pub cost_memory_ms: u64,
}

/// The moment costs are read or learned at, and how long they are remembered
/// (`fresh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recall {
    pub now_ms: u64,
    pub memory_ms: u64,
}

impl Recall {
    /// `c` if learned within the memory, else nothing learned. An engine's speed
    /// is what it showed lately: one not measured for that long (shunned while it
    /// looked slow, as when it was flagged overloaded, or quiet) is priced as the
    /// fleet is again, takes work, and is measured anew. Kept, an engine that once
    /// looked slow took no new conversation on a quiet fleet for the rest of its
    /// life.
    pub fn fresh(self, c: WorkerCosts) -> WorkerCosts {
        if self.now_ms.saturating_sub(c.observed_ms) <= self.memory_ms {
            c
        } else {
            WorkerCosts::default()
        }
    }

    /// The mean of the costs among `costs` learned lately (`fleet_mean`).
    pub fn fleet_mean(self, costs: &[WorkerCosts]) -> WorkerCosts {
        fleet_mean(costs.iter().map(|c| self.fresh(*c)))
    }
}

impl TtftParams {
    /// These parameters with the priors of a worker whose costs are not learned yet
    /// taken from the workers whose costs are (`learned`: each candidate's), each the
    /// mean of those learned, the configured prior while none is. The configured
    /// prior is a guess and the fleet's engines are mostly alike: a new or quiet
    /// engine priced at the guess while the others are priced at what they cost
    /// looks several times faster or slower than it is, and a burst piles onto it
    /// (or shuns it) until its first answers come back.
    pub fn with_fleet_priors(&self, learned: impl IntoIterator<Item = WorkerCosts>) -> TtftParams {
        let fleet = fleet_mean(learned);
        TtftParams {
            prefill_us_per_char: fleet.prefill_us_per_char.unwrap_or(self.prefill_us_per_char),
            service_ms: fleet.service_ms.unwrap_or(self.service_ms),
            ..*self
        }
    }
}

/// The mean of the costs learned among `costs`, each cost on its own (`None`
/// where none has it).
pub fn fleet_mean(costs: impl IntoIterator<Item = WorkerCosts>) -> WorkerCosts {
    let (mut prefill, mut service) = ((0.0, 0u32), (0.0, 0u32));
    for c in costs {
        if let Some(v) = c.prefill_us_per_char {
            prefill = (prefill.0 + v, prefill.1 + 1);
        }
        if let Some(v) = c.service_ms {
            service = (service.0 + v, service.1 + 1);
        }
    }
    let mean = |(sum, n): (f64, u32)| (n > 0).then(|| sum / f64::from(n));
    WorkerCosts {
        prefill_us_per_char: mean(prefill),
        service_ms: mean(service),
        ..WorkerCosts::default()
    }
}

/// What a decision fills, kept for the next.
#[derive(Debug, Default)]
pub struct PredictedTtft {
    scratch: route::Scratch,
}

impl Select for PredictedTtft {
    type Params = TtftParams;

    /// `predicted_ttft`'s parameters, defaults filled in.
    fn params(cfg: &Config) -> TtftParams {
        TtftParams {
            load_factor: cfg.load_factor.unwrap_or(DEFAULT_LOAD_FACTOR),
            prefill_us_per_char: cfg
                .prefill_us_per_char
                .unwrap_or(DEFAULT_PREFILL_US_PER_CHAR),
            service_ms: cfg.service_ms.unwrap_or(DEFAULT_SERVICE_MS),
            stay_factor: cfg.stay_factor.unwrap_or(DEFAULT_STAY_FACTOR),
            sample_size: cfg.ttft_sample_size.unwrap_or(DEFAULT_TTFT_SAMPLE_SIZE),
            cost_memory_ms: cfg.stale_after_ms,
        }
    }

    fn select(&mut self, params: &TtftParams, ask: &Ask<'_>, rng: &mut dyn Rng) -> Chosen {
        let Some(text) = ask.text else {
            return Chosen::only(unreadable(ask.candidates, rng));
        };
        let engines = ask.engines_for_all();
        let r = route::route(
            (ask.tree, text),
            (ask.candidates, ask.flagged, ask.position, ask.inflight),
            (ask.loads, params, ask.kv, engines),
            &mut self.scratch,
            rng,
        );
        Chosen {
            decision: r.decision,
            record: Some(Held {
                held_chars: r.held_chars,
                text_chars: r.input_chars,
            }),
            walked: r.walked,
            owner_overloaded: r.owner_filtered,
            engines: match (ask.engines, engines) {
                (None, _) => super::EnginesUse::None,
                (Some(_), None) => super::EnginesUse::Partial,
                (Some(_), Some(_)) => super::EnginesUse::Ranked,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn params(extra: &str) -> TtftParams {
        let json = format!(r#"{{"workers":[{{"name":"w0"}}],"policy":"predicted_ttft"{extra}}}"#);
        PredictedTtft::params(&Config::from_json(json.as_bytes()).unwrap())
    }

    #[test]
    fn an_unlearned_worker_is_priced_at_the_fleets_learned_mean() {
        let p = params("");
        let learned = |prefill: Option<f64>, service: Option<f64>| WorkerCosts {
            prefill_us_per_char: prefill,
            service_ms: service,
            ..WorkerCosts::default()
        };
        let none = p.with_fleet_priors([learned(None, None), learned(None, None)]);
        assert_eq!(none, p, "nothing learned: the configured priors");
        let some = p.with_fleet_priors([
            learned(Some(10.0), None),
            learned(None, None),
            learned(Some(16.0), Some(3.0)),
        ]);
        assert_eq!(some.prefill_us_per_char, 13.0, "the mean of the two learned");
        assert_eq!(some.service_ms, 3.0, "only one learned its service time");
        assert_eq!(
            (some.load_factor, some.stay_factor, some.sample_size),
            (p.load_factor, p.stay_factor, p.sample_size),
            "the rest as configured"
        );
        assert_eq!(p.with_fleet_priors([]), p);
    }

    #[test]
    fn params_take_the_settings_and_default_the_rest() {
        let p = params("");
        assert_eq!(p.load_factor, DEFAULT_LOAD_FACTOR);
        assert_eq!(p.prefill_us_per_char, DEFAULT_PREFILL_US_PER_CHAR);
        assert_eq!(p.service_ms, DEFAULT_SERVICE_MS);
        assert_eq!(p.stay_factor, DEFAULT_STAY_FACTOR);
        assert_eq!(p.sample_size, DEFAULT_TTFT_SAMPLE_SIZE);
        let set = params(
            r#","load_factor":0,"prefill_us_per_char":2.5,"service_ms":0,"stay_factor":2,"ttft_sample_size":8"#,
        );
        assert_eq!(
            set,
            TtftParams {
                load_factor: 0.0,
                prefill_us_per_char: 2.5,
                service_ms: 0.0,
                stay_factor: 2.0,
                sample_size: 8,
                cost_memory_ms: 5000,
            }
        );
    }
}
