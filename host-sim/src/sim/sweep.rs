//! The policy sweep: every policy over members of `llm-load`'s seeded workload family
//! ([`llm_load::family`]), each replayed through the real filter against its own
//! simulated fleet in virtual time ([`Replay`]), and a verdict on whether the default
//! policy is the best router across the family.
//!
//! A member's fleet is the engine mocks its [`EngineShape`]s describe (running slots,
//! prefill cost, cache size per engine), the collector pushing every
//! [`COLLECTOR_INTERVAL_MS`], one Envoy worker thread unless asked for more. Each
//! policy is measured by what a user sees: the engines' cached share of prompt tokens
//! and the p50 and p99 time to first token.
//!
//! The default is judged against the best of the other policies on each measure
//! separately (the highest cached ratio of any other, the lowest p99 of any other):
//! the issue's bar ([`ISSUE_53_BAR`]) is the default within 0.005 of that cached ratio
//! and at most 1.05x that p99 on at least 90% of seeds, and never more than 0.02
//! behind or 1.3x over on any.

use super::replay::Replay;
use crate::Filter;
use anyhow::{bail, Result};
use engine_model::engine::EngineSpec;
use engine_model::latency::Latency;
use llm_load::family::{EngineShape, Member};
use llm_load::workload::WorkItem;

/// The policies a sweep runs unless told otherwise: every one the filter has.
pub const POLICIES: [&str; 5] = [
    "predicted_ttft",
    "cache_aware",
    "round_robin",
    "random",
    "power_of_two",
];

/// How often the simulated collector pushes the fleet's gauges (`host-sim replay`'s
/// and the demo's default).
pub const COLLECTOR_INTERVAL_MS: u64 = 200;

/// What a default must do against the best other policy, seed by seed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bar {
    /// On a near seed: cached ratio at most this far below the best other's...
    pub near_cached: f64,
    /// ...and TTFT p99 at most this many times the best other's.
    pub near_p99: f64,
    /// Near on at least this share of the seeds.
    pub near_share: f64,
    /// On every seed: cached ratio at most this far below the best other's...
    pub worst_cached: f64,
    /// ...and TTFT p99 at most this many times the best other's.
    pub worst_p99: f64,
}

/// Issue 53's "done when".
pub const ISSUE_53_BAR: Bar = Bar {
    near_cached: 0.005,
    near_p99: 1.05,
    near_share: 0.9,
    worst_cached: 0.02,
    worst_p99: 1.3,
};

/// How long the engines take past the first token: `output_tokens` each answer,
/// `ms_per_token` apart. The family's members decode instantly (an answer ends at
/// its first token), so a running slot is held for the prefill alone; engines that
/// decode hold it for most of a request's life, as real ones do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decode {
    pub ms_per_token: f64,
    pub output_tokens: u32,
}

impl Decode {
    /// The family's engines: an answer ends at its first token.
    pub const INSTANT: Decode = Decode {
        ms_per_token: 0.0,
        output_tokens: EngineSpec::DEFAULT_OUTPUT_TOKENS,
    };
}

/// The fleet a member runs on beyond its engines' shapes: Envoy worker threads
/// (`vms`), whether an engine holds back a request whose cached prefix another is
/// still prefilling (`prefix_wait`, as SGLang and vLLM do), and how they decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fleet {
    pub vms: usize,
    pub prefix_wait: bool,
    pub decode: Decode,
}

/// One policy's run on one member.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// The policy variant (`policy+key=value...`).
    pub policy: String,
    /// Engine-reported cached prompt tokens over all prompt tokens.
    pub cached: f64,
    /// Time to first token, virtual ms.
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Requests that failed (a sound run has none).
    pub errors: usize,
    /// Requests each engine served, engine `i` first: a policy that herds shows
    /// here before it shows in the tail.
    pub per_engine: Vec<u64>,
}

impl Outcome {
    /// One policy's runs on one member as one outcome: each measure's median (of
    /// an even count, the mean of the middle two), the most errors of any run and
    /// the first run's requests per engine. `None` without runs.
    pub fn median(runs: &[Outcome]) -> Option<Outcome> {
        let first = runs.first()?;
        // The middle two of an even count, the middle one twice of an odd one.
        let median = |measure: fn(&Outcome) -> f64| {
            let v = llm_load::stats::sorted(runs.iter().map(measure).collect());
            match (v.get((v.len() - 1) / 2), v.get(v.len() / 2)) {
                (Some(lo), Some(hi)) => (lo + hi) / 2.0,
                _ => f64::NAN,
            }
        };
        Some(Outcome {
            policy: first.policy.clone(),
            cached: median(|o| o.cached),
            ttft_p50_ms: median(|o| o.ttft_p50_ms),
            ttft_p99_ms: median(|o| o.ttft_p99_ms),
            errors: runs.iter().map(|o| o.errors).max().unwrap_or(0),
            per_engine: first.per_engine.clone(),
        })
    }
}

/// The engine mock's shape of one of the member's engines.
pub fn engine_spec(shape: &EngineShape) -> EngineSpec {
    let default = EngineSpec::default();
    EngineSpec {
        cache_blocks: shape.cache_chars.div_ceil(default.block_chars),
        max_running: shape.max_running,
        latency: Latency {
            prefill_us_per_token: shape.prefill_us_per_token,
            ..default.latency
        },
        ..default
    }
}

/// The replay of `member` on `vms` Envoy worker threads: its fleet, its load.
pub fn replay_of(member: &Member, vms: usize) -> Replay {
    let specs: Vec<EngineSpec> = member.engines.iter().map(engine_spec).collect();
    Replay {
        workers: specs.len(),
        pd: None,
        vms,
        concurrency: member.concurrency,
        engine: specs.first().copied().unwrap_or_default(),
        engine_specs: specs,
        collector_interval_ms: Some(COLLECTOR_INTERVAL_MS),
        arrival_seed: None,
    }
}

/// The filter's `rng_seed` for draw `draw` of the member seeded `seed`: the seed
/// itself for draw 0 (the sweep's own draw), another for each further draw. The
/// seed orders the requests that reach Envoy at the same instant and breaks the
/// policies' near-ties, so each draw replays the same workload on the same fleet in
/// another of the orders a real run could see.
pub fn draw_seed(seed: u64, draw: u64) -> u64 {
    seed ^ draw.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The filter's `rng_seed` in tie-break stream `stream` of a run whose requests
/// arrive in the order drawn from `arrival_seed`: that seed itself in stream 0 (a
/// run of one seed, as `draw_seed` gives), another in each further stream. The
/// arrivals stay; only the policy's own draws (its near-ties) change.
pub fn tie_break_seed(arrival_seed: u64, stream: u64) -> u64 {
    arrival_seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03)
}

/// Runs `items` (the member's workload) through `filter` routing by `variant` (a
/// policy, or `policy+key=value+...` with settings of its own), the filter's
/// `rng_seed` the member's for draw `draw` (`draw_seed`), on `fleet`.
pub fn run(
    filter: &Filter,
    (member, draw): (&Member, u64),
    fleet: Fleet,
    items: &[WorkItem],
    variant: &str,
) -> Result<Outcome> {
    run_in_stream(filter, (member, draw, 0), fleet, items, variant)
}

/// `run` in each of `streams` tie-break streams (`tie_break_seed`; at least one),
/// the arrivals of draw `draw` in all: each measure's median (`Outcome::median`).
/// One run's p99 is a handful of requests, and which engine wins a near-tie moves
/// it: `cache_aware` in other streams is over 1.05x its own p99, or more than
/// 0.005 under its own cached ratio, on 120 of the 480 seed-orders of seeds 1 to
/// 160 in three draws, and still on 83 as the medians of five streams each.
pub fn run_streams(
    filter: &Filter,
    (member, draw, streams): (&Member, u64, u64),
    fleet: Fleet,
    items: &[WorkItem],
    variant: &str,
) -> Result<Outcome> {
    let runs = (0..streams.max(1))
        .map(|stream| run_in_stream(filter, (member, draw, stream), fleet, items, variant))
        .collect::<Result<Vec<_>>>()?;
    Outcome::median(&runs).ok_or_else(|| anyhow::anyhow!("no run of {variant}"))
}

/// `run` with the filter's draws from tie-break stream `stream`.
///
/// A variant that sets `rng_seed` (`cache_aware+rng_seed=7`) is its policy with
/// its near-ties drawn otherwise: the seed salts each stream's rather than
/// replacing it, so over several streams a copy of a policy still
/// replays as many streams as the policy it copies, not one stream that many times.
pub fn run_in_stream(
    filter: &Filter,
    (member, draw, stream): (&Member, u64, u64),
    fleet: Fleet,
    items: &[WorkItem],
    variant: &str,
) -> Result<Outcome> {
    let (policy, mut settings) = llm_load::run::policy_variant(variant)?;
    let salt = match settings.remove("rng_seed") {
        None => 0,
        Some(seed) => seed.as_u64().ok_or_else(|| {
            anyhow::anyhow!("{variant}: rng_seed must be an unsigned integer, not {seed}")
        })?,
    };
    let settings = serde_json::Value::Object(settings);
    let arrival_seed = draw_seed(member.seed, draw);
    let config = llm_load::run::plugin_config(
        "policy",
        policy,
        policy,
        Some(&settings),
        false,
        tie_break_seed(arrival_seed, stream) ^ salt,
    )?;
    let mut replay = replay_of(member, fleet.vms)
        .prefix_wait(fleet.prefix_wait)
        .decode(fleet.decode);
    replay.arrival_seed = Some(arrival_seed);
    let done = replay.run(filter, &config, items)?;
    let s = &done.summary;
    let (Some(ttft_p50_ms), Some(ttft_p99_ms)) = (s.ttft_p50_ms, s.ttft_p99_ms) else {
        bail!("no request reported a first token ({} errors)", s.errors);
    };
    Ok(Outcome {
        policy: variant.to_string(),
        cached: s.cached_token_ratio,
        ttft_p50_ms,
        ttft_p99_ms,
        errors: s.errors,
        per_engine: (0..member.engines.len())
            .map(|i| {
                let name = llm_load::fleet::worker_name(i);
                s.per_worker.get(&name).copied().unwrap_or(0)
            })
            .collect(),
    })
}

/// Where the default stands on one seed against the best of the others.
#[derive(Debug, Clone, PartialEq)]
pub struct Standing {
    /// The best other cached ratio minus the default's (positive: the default loses).
    pub cached_gap: f64,
    /// The other policy with the best cached ratio.
    pub best_cached: String,
    /// The default's TTFT p99 over the lowest other's (above 1: the default loses).
    pub p99_ratio: f64,
    /// The other policy with the lowest TTFT p99.
    pub best_p99: String,
}

impl Standing {
    /// The default's standing among `outcomes` (which hold it and at least one
    /// other); `None` when they do not.
    pub fn of(default: &str, outcomes: &[Outcome]) -> Option<Standing> {
        let own = outcomes.iter().find(|o| o.policy == default)?;
        let others = || outcomes.iter().filter(|o| o.policy != default);
        let best_cached = others().max_by(|a, b| a.cached.total_cmp(&b.cached))?;
        let best_p99 = others().min_by(|a, b| a.ttft_p99_ms.total_cmp(&b.ttft_p99_ms))?;
        Some(Standing {
            cached_gap: best_cached.cached - own.cached,
            best_cached: best_cached.policy.clone(),
            p99_ratio: own.ttft_p99_ms / best_p99.ttft_p99_ms,
            best_p99: best_p99.policy.clone(),
        })
    }

    /// Whether the default is near the best others on this seed.
    pub fn near(&self, bar: &Bar) -> bool {
        self.cached_gap <= bar.near_cached && self.p99_ratio <= bar.near_p99
    }

    /// Whether the default falls past the bar's limit for any seed.
    pub fn broken(&self, bar: &Bar) -> bool {
        self.cached_gap > bar.worst_cached || self.p99_ratio > bar.worst_p99
    }
}

/// The policies among `outcomes` that are near the best of the others, each judged
/// as the default would be. None where the highest cached ratio and the lowest p99
/// belong to different policies and no policy comes within the bar of both: a seed
/// no policy that ran can meet the bar on.
pub fn near_policies<'a>(outcomes: &'a [Outcome], bar: &Bar) -> Vec<&'a str> {
    outcomes
        .iter()
        .filter(|o| Standing::of(&o.policy, outcomes).is_some_and(|s| s.near(bar)))
        .map(|o| o.policy.as_str())
        .collect()
}

/// The bar's verdict over a sweep.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// Seeds where the default is near the best others.
    pub near: usize,
    pub seeds: usize,
    /// Seeds where it is not near, and of those the ones past the limit.
    pub not_near: Vec<u64>,
    pub broken: Vec<u64>,
}

impl Verdict {
    /// Judges each seed's standing.
    pub fn of(standings: &[(u64, Standing)], bar: &Bar) -> Verdict {
        let not_near: Vec<u64> = standings
            .iter()
            .filter(|(_, s)| !s.near(bar))
            .map(|(seed, _)| *seed)
            .collect();
        let broken = standings
            .iter()
            .filter(|(_, s)| s.broken(bar))
            .map(|(seed, _)| *seed)
            .collect();
        Verdict {
            near: standings.len() - not_near.len(),
            seeds: standings.len(),
            not_near,
            broken,
        }
    }

    /// Whether the default clears the bar: near on enough seeds, broken on none.
    pub fn holds(&self, bar: &Bar) -> bool {
        self.seeds > 0
            && self.near as f64 >= bar.near_share * self.seeds as f64
            && self.broken.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(policy: &str, cached: f64, ttft_p99_ms: f64) -> Outcome {
        Outcome {
            policy: policy.to_string(),
            cached,
            ttft_p50_ms: ttft_p99_ms / 2.0,
            ttft_p99_ms,
            errors: 0,
            per_engine: Vec::new(),
        }
    }

    #[test]
    fn the_first_draw_is_the_members_own_seed_and_each_other_draw_another() {
        assert_eq!(
            draw_seed(12, 0),
            12,
            "the sweep's own order, as before draws"
        );
        let seeds: std::collections::BTreeSet<u64> = (0..8)
            .flat_map(|s| (0..4).map(move |d| draw_seed(s, d)))
            .collect();
        assert_eq!(seeds.len(), 32, "no two (seed, draw) share an order");
    }

    #[test]
    fn the_first_stream_is_the_draws_own_seed_and_each_other_stream_another() {
        assert_eq!(tie_break_seed(draw_seed(12, 1), 0), draw_seed(12, 1));
        let seeds: std::collections::BTreeSet<u64> = (0..8)
            .flat_map(|s| (0..4).flat_map(move |d| (0..4).map(move |t| (s, d, t))))
            .map(|(s, d, t)| tie_break_seed(draw_seed(s, d), t))
            .collect();
        assert_eq!(seeds.len(), 128, "no two (seed, draw, stream) share draws");
    }

    #[test]
    fn runs_are_summed_up_by_each_measures_median() {
        let mut runs = vec![
            outcome("p", 0.80, 30.0),
            outcome("p", 0.70, 10.0),
            outcome("p", 0.90, 20.0),
        ];
        runs[0].per_engine = vec![2, 1];
        runs[1].errors = 3;
        let m = Outcome::median(&runs).unwrap();
        assert_eq!((m.cached, m.ttft_p99_ms, m.ttft_p50_ms), (0.80, 20.0, 10.0));
        assert_eq!(m.errors, 3, "the most errors of any run");
        assert_eq!(m.per_engine, [2, 1], "the first run's engines");
        let even = Outcome::median(&runs[1..]).unwrap();
        assert!((even.cached - 0.80).abs() < 1e-12, "{even:?}");
        assert_eq!(even.ttft_p99_ms, 15.0, "the middle two's mean");
        assert_eq!(Outcome::median(&[]), None);
    }

    #[test]
    fn the_default_is_measured_against_the_best_other_on_each_measure() {
        let outcomes = [
            outcome("cache_aware", 0.90, 200.0),
            outcome("predicted_ttft", 0.92, 150.0),
            outcome("round_robin", 0.70, 100.0),
        ];
        let s = Standing::of("cache_aware", &outcomes).unwrap();
        assert!((s.cached_gap - 0.02).abs() < 1e-12, "{s:?}");
        assert_eq!(s.best_cached, "predicted_ttft");
        assert_eq!((s.p99_ratio, s.best_p99.as_str()), (2.0, "round_robin"));
        let own = Standing::of("predicted_ttft", &outcomes).unwrap();
        assert!(own.cached_gap < 0.0, "ahead on cache: a negative gap");
        assert_eq!(own.p99_ratio, 1.5);
        assert_eq!(Standing::of("random", &outcomes), None, "no such run");
        assert_eq!(
            Standing::of("round_robin", &outcomes[2..]),
            None,
            "no others"
        );
    }

    #[test]
    fn a_seed_where_one_policy_caches_best_and_another_has_the_lowest_tail_has_nobody_near() {
        let bar = ISSUE_53_BAR;
        let trade = [
            outcome("cache_aware", 0.90, 200.0),
            outcome("round_robin", 0.70, 100.0),
        ];
        assert!(near_policies(&trade, &bar).is_empty());
        let dominated = [
            outcome("cache_aware", 0.90, 200.0),
            outcome("predicted_ttft", 0.897, 104.0),
            outcome("round_robin", 0.70, 100.0),
        ];
        assert_eq!(near_policies(&dominated, &bar), ["predicted_ttft"]);
    }

    #[test]
    fn near_and_broken_take_their_boundaries_inclusively() {
        let bar = ISSUE_53_BAR;
        let standing = |cached_gap: f64, p99_ratio: f64| Standing {
            cached_gap,
            best_cached: "a".into(),
            p99_ratio,
            best_p99: "b".into(),
        };
        assert!(standing(0.005, 1.05).near(&bar));
        assert!(!standing(0.0051, 1.0).near(&bar));
        assert!(!standing(0.0, 1.051).near(&bar));
        assert!(!standing(0.02, 1.3).broken(&bar));
        assert!(standing(0.021, 1.0).broken(&bar));
        assert!(standing(-0.1, 1.31).broken(&bar));
    }

    #[test]
    fn the_bar_holds_on_ninety_percent_near_and_none_broken() {
        let bar = ISSUE_53_BAR;
        let at = |gap: f64, ratio: f64| Standing {
            cached_gap: gap,
            best_cached: "a".into(),
            p99_ratio: ratio,
            best_p99: "b".into(),
        };
        let mut standings: Vec<(u64, Standing)> = (0..9).map(|s| (s, at(0.0, 1.0))).collect();
        standings.push((9, at(0.01, 1.2)));
        let v = Verdict::of(&standings, &bar);
        assert_eq!((v.near, v.seeds, v.not_near.clone()), (9, 10, vec![9]));
        assert!(v.broken.is_empty());
        assert!(v.holds(&bar), "9 of 10 near, none broken");
        standings[0].1 = at(0.0, 1.06);
        let v = Verdict::of(&standings, &bar);
        assert!(!v.holds(&bar), "8 of 10 near is under 90%");
        standings[0].1 = at(0.0, 1.0);
        standings[9].1 = at(0.03, 1.0);
        let v = Verdict::of(&standings, &bar);
        assert_eq!(v.broken, vec![9]);
        assert!(!v.holds(&bar), "one seed past the limit fails it");
        assert!(
            !Verdict::of(&[], &bar).holds(&bar),
            "no seeds prove nothing"
        );
    }
}
