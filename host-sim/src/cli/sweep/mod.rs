//! `host-sim sweep`: every policy over `--seeds` members of the workload family, in
//! virtual time, each seed's parameters and every policy's cached ratio and TTFT
//! printed, then where the `--default` loses to the best of the others and whether it
//! clears issue 53's bar.
//!
//! With `--others-from`, the other policies' outcomes come from an earlier run's
//! `--json-out` (`lines`) and only the default is replayed.
//!
//! Seeds run on `--jobs` threads, the largest workloads first so no thread is left with
//! a long one at the end; the report is in seed order whatever finished first.

mod lines;

use anyhow::{Context as _, Result};
use engine_model::engine::EngineSpec;
use engine_model::latency::non_negative;
use host_sim::sweep::{
    self, near_policies, Decode, Fleet, Outcome, Standing, Verdict, ISSUE_53_BAR, POLICIES,
};
use lines::Earlier;
use llm_load::family::{Member, KINDS};
use llm_load::generate::{generate, to_jsonl};
use llm_load::workload::parse_workload;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

#[derive(clap::Args)]
pub(crate) struct SweepArgs {
    /// Members of the family to run: seeds `--first-seed` onwards.
    #[arg(long, default_value_t = 40)]
    seeds: u64,
    #[arg(long, default_value_t = 1)]
    first_seed: u64,
    /// The policy judged against the best of the others (the filter's default).
    #[arg(long, default_value = "predicted_ttft")]
    default: String,
    /// The policies to run (comma-separated; the default is added when missing). A
    /// policy may carry plugin settings of its own, `policy+key=value+...` (a value
    /// read as JSON, else as a string), and so may `--default`. `rng_seed` salts
    /// the variant's tie-break streams: `cache_aware+rng_seed=7` is a copy of
    /// `cache_aware` that draws its near-ties otherwise.
    #[arg(long, value_delimiter = ',', default_values_t = POLICIES.map(String::from))]
    policies: Vec<String>,
    /// VMs (Envoy worker threads).
    #[arg(long, default_value_t = 1)]
    vms: usize,
    /// Seeds replayed at once (default: the machine's cores).
    #[arg(long)]
    jobs: Option<usize>,
    /// The filter's .wasm; defaults to the workspace's built filter.
    #[arg(long)]
    wasm: Option<PathBuf>,
    /// Also write one JSON line per seed and draw (its parameters and every
    /// policy's outcome).
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Replays of each member, each in another arrival order (`sweep::draw_seed`):
    /// the first is the sweep's own, judged by the bar; the others show how much
    /// of a seed's standing is the order its requests happened to arrive in.
    #[arg(long, default_value_t = 1)]
    draws: u64,
    /// Engines serve a request whose cached prefix another request is still
    /// prefilling as if it were computed (the engine mock's `--no-prefix-wait`).
    /// By default they hold it back until that prefill is done, as SGLang and
    /// vLLM serve it.
    #[arg(long = "no-prefix-wait", action = clap::ArgAction::SetFalse)]
    prefix_wait: bool,
    /// Engines decode: each answer's tokens after the first come this many
    /// milliseconds apart (the engine mock's `--decode-ms-per-token`). The family's
    /// engines answer at their first token (0), so a running slot is held for the
    /// prefill alone; real engines hold it for most of a request's life.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    decode_ms_per_token: f64,
    /// Tokens in each answer (the engine mock's `--output-tokens`).
    #[arg(long, default_value_t = EngineSpec::DEFAULT_OUTPUT_TOKENS)]
    output_tokens: u32,
    /// Replays of each policy on each member and draw, each with the filter's own
    /// draws (its near-ties) from another stream on the same arrivals
    /// (`sweep::tie_break_seed`): every measure is then their median. One run's
    /// p99 is a handful of requests, and which engine wins a near-tie moves it by
    /// more than the bar's tolerance.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    tie_breaks: u64,
    /// An earlier sweep's `--json-out` of the same seeds and draws on the same
    /// fleet (`--vms`, `--no-prefix-wait`, decode, `--tie-breaks`): every policy but `--default` that it
    /// recorded is taken from it instead of replayed, so a change to the default
    /// (`--wasm`, its settings) is judged against the others in under a third of
    /// the time. A line of another member or fleet is refused.
    #[arg(long)]
    others_from: Option<PathBuf>,
}

/// One seed's member and every policy's outcome in one draw, in `--policies` order.
struct SeedRun {
    member: Member,
    draw: u64,
    outcomes: Vec<Outcome>,
}

/// Runs the sweep and prints it.
pub(crate) fn sweep(args: SweepArgs) -> Result<()> {
    let mut policies = args.policies.clone();
    if !policies.contains(&args.default) {
        policies.insert(0, args.default.clone());
    }
    let wasm = args
        .wasm
        .clone()
        .unwrap_or_else(host_sim::built_filter_path);
    let filter = host_sim::Filter::load(&wasm)?;
    let draws = args.draws.max(1);
    let fleet = Fleet {
        vms: args.vms,
        prefix_wait: args.prefix_wait,
        decode: Decode {
            ms_per_token: args.decode_ms_per_token,
            output_tokens: args.output_tokens,
        },
    };
    let tie_breaks = args.tie_breaks;
    let earlier = args.others_from.as_deref().map(Earlier::read).transpose()?;
    let mut members: Vec<(Member, u64)> = (args.first_seed..args.first_seed + args.seeds)
        .flat_map(|seed| (0..draws).map(move |d| (Member::draw(seed), d)))
        .collect();
    // Largest first: characters sent is what a replay's time grows with.
    members.sort_by_key(|(m, _)| std::cmp::Reverse(sent_chars(m)));
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, members.len().max(1));
    eprintln!(
        "host-sim sweep: {} seeds x {draws} draw(s) x {} policies x {tie_breaks} tie-break stream(s) on {jobs} thread(s), {} VM(s)",
        args.seeds,
        policies.len(),
        args.vms
    );
    if let Some(path) = &args.others_from {
        eprintln!(
            "host-sim sweep: the policies other than {} that {} recorded are taken from it",
            args.default,
            path.display()
        );
    }
    let next = AtomicUsize::new(0);
    let runs: Mutex<BTreeMap<(u64, u64), SeedRun>> = Mutex::new(BTreeMap::new());
    let failure: Mutex<Option<anyhow::Error>> = Mutex::new(None);
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                let failed = || failure.lock().map_or(true, |f| f.is_some());
                while let Some((member, draw)) = members.get(next.fetch_add(1, Ordering::Relaxed)) {
                    if failed() {
                        return;
                    }
                    let recorded = earlier.as_ref().map_or(Ok(&[][..]), |e| {
                        e.outcomes(member, *draw, (fleet, tie_breaks))
                    });
                    let run = recorded.and_then(|recorded| {
                        run_seed(
                            &filter,
                            (member, *draw, tie_breaks),
                            fleet,
                            (&policies, &args.default, recorded),
                        )
                    });
                    match run {
                        Ok(run) => {
                            let mut runs = runs.lock().unwrap_or_else(|e| e.into_inner());
                            runs.insert((member.seed, *draw), run);
                            eprintln!(
                                "host-sim sweep: seed {} draw {draw} done ({} of {})",
                                member.seed,
                                runs.len(),
                                members.len()
                            );
                        }
                        Err(e) => {
                            *failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                            return;
                        }
                    }
                }
            });
        }
    });
    if let Some(e) = failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let runs = runs.into_inner().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = &args.json_out {
        let text: String = runs
            .values()
            .map(|r| lines::json_line(r, (fleet, tie_breaks)) + "\n")
            .collect();
        std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    let first: BTreeMap<u64, &SeedRun> = runs
        .iter()
        .filter(|((_, draw), _)| *draw == 0)
        .map(|((seed, _), run)| (*seed, run))
        .collect();
    if tie_breaks > 1 {
        println!(
            "each policy's cached ratio and TTFT are the medians of {tie_breaks} runs (tie-break streams) of each member and draw"
        );
    }
    print!("{}", report(&first, &args.default));
    if draws > 1 {
        print!("{}", draws_report(&runs, &args.default, draws));
    }
    Ok(())
}

/// Characters the member's workload sends (every turn resends its conversation).
fn sent_chars(m: &Member) -> usize {
    let w = &m.workload;
    let per_turn = |t: usize| w.system_prompt_chars + (2 * t + 1) * w.user_chars;
    w.sessions * (0..w.turns).map(per_turn).sum::<usize>()
}

/// Every policy on one member: replayed (`tie_breaks` times, its medians), or for a
/// policy other than `default`, taken from what an earlier run `recorded` of it.
fn run_seed(
    filter: &host_sim::Filter,
    (member, draw, tie_breaks): (&Member, u64, u64),
    fleet: Fleet,
    (policies, default, recorded): (&[String], &str, &[Outcome]),
) -> Result<SeedRun> {
    let items = parse_workload(&to_jsonl(&generate(&member.workload))?)?;
    let outcomes = policies
        .iter()
        .map(|p| {
            let earlier = recorded.iter().find(|o| o.policy == *p && p != default);
            match earlier {
                Some(o) => Ok(o.clone()),
                None => sweep::run_streams(filter, (member, draw, tie_breaks), fleet, &items, p)
                    .with_context(|| format!("seed {} draw {draw}, policy {p}", member.seed)),
            }
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(SeedRun {
        member: member.clone(),
        draw,
        outcomes,
    })
}

/// The per-seed tables, then the summary.
fn report(runs: &BTreeMap<u64, &SeedRun>, default: &str) -> String {
    let bar = ISSUE_53_BAR;
    let mut out = String::new();
    let mut standings = Vec::new();
    let mut best_cached: BTreeMap<&str, usize> = BTreeMap::new();
    let mut best_p99: BTreeMap<&str, usize> = BTreeMap::new();
    // Wide enough for `policy+key=value` variants.
    let width = runs
        .values()
        .flat_map(|r| r.outcomes.iter().map(|o| o.policy.len()))
        .fold(15, usize::max);
    for (seed, run) in runs {
        out += &format!("seed {seed}: {}\n", run.member.describe());
        out += &format!(
            "  {:<width$} {:>7}  {:>8} {:>8}  {:>7}  requests per engine\n",
            "policy", "cached", "TTFT p50", "TTFT p99", "errors"
        );
        let top_cached = run.outcomes.iter().map(|o| o.cached).fold(0.0, f64::max);
        let top_p99 = run
            .outcomes
            .iter()
            .map(|o| o.ttft_p99_ms)
            .fold(f64::INFINITY, f64::min);
        for o in &run.outcomes {
            // Best within the bar's own tolerance: a tie is a win for each.
            let cached_star = top_cached - o.cached <= bar.near_cached;
            let p99_star = o.ttft_p99_ms <= top_p99 * bar.near_p99;
            if cached_star {
                *best_cached.entry(&o.policy).or_default() += 1;
            }
            if p99_star {
                *best_p99.entry(&o.policy).or_default() += 1;
            }
            out += &format!(
                "  {:<width$} {:>7.3}{} {:>8.1} {:>8.1}{} {:>7}  {}\n",
                o.policy,
                o.cached,
                if cached_star { '*' } else { ' ' },
                o.ttft_p50_ms,
                o.ttft_p99_ms,
                if p99_star { '*' } else { ' ' },
                o.errors,
                o.per_engine
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join("/")
            );
        }
        if let Some(s) = Standing::of(default, &run.outcomes) {
            out += &format!("  {default}: {}\n", standing_text(&s));
            standings.push((*seed, s));
        }
    }
    let verdict = Verdict::of(&standings, &bar);
    out += &format!(
        "== summary: default {default} over {} seeds (* = best, or within {} cached / {}x p99 of it) ==\n",
        runs.len(),
        bar.near_cached,
        bar.near_p99
    );
    let counts = |m: &BTreeMap<&str, usize>| {
        m.iter()
            .map(|(p, n)| format!("{p} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    out += &format!("best cached ratio, seeds: {}\n", counts(&best_cached));
    out += &format!("best TTFT p99, seeds:     {}\n", counts(&best_p99));
    let mut near_as_default: BTreeMap<&str, usize> = BTreeMap::new();
    let mut nobody = Vec::new();
    for (seed, run) in runs {
        let near = near_policies(&run.outcomes, &bar);
        if near.is_empty() {
            nobody.push(*seed);
        }
        for p in near {
            *near_as_default.entry(p).or_default() += 1;
        }
    }
    out += &format!(
        "near the best of the others, seeds (each judged as the default): {}\n",
        counts(&near_as_default)
    );
    out += &format!(
        "  no policy near on {} seeds: {}\n",
        nobody.len(),
        seeds(&nobody)
    );
    out += &format!("{default} near the best other, by kind (a seed is of several):\n");
    for kind in KINDS {
        let of_kind: Vec<&(u64, Standing)> = standings
            .iter()
            .filter(|(seed, _)| runs.get(seed).is_some_and(|r| (kind.of)(&r.member)))
            .collect();
        let near = of_kind.iter().filter(|(_, s)| s.near(&bar)).count();
        out += &format!(
            "  {:<22} near on {near:>2} of {:>2} seeds\n",
            kind.name,
            of_kind.len()
        );
    }
    let losses = |pick: &dyn Fn(&Standing) -> bool| {
        standings
            .iter()
            .filter(|(_, s)| pick(s))
            .map(|(seed, s)| format!("  seed {seed}: {}\n", standing_text(s)))
            .collect::<String>()
    };
    let cached_losses = losses(&|s| s.cached_gap > bar.near_cached);
    out += &format!(
        "{default} more than {} cached behind the best other on {} seeds:\n{cached_losses}",
        bar.near_cached,
        cached_losses.lines().count()
    );
    let p99_losses = losses(&|s| s.p99_ratio > bar.near_p99);
    out += &format!(
        "{default} over {}x the best other's TTFT p99 on {} seeds:\n{p99_losses}",
        bar.near_p99,
        p99_losses.lines().count()
    );
    out += &format!(
        "bar (within {} cached and {}x p99 of the best other on >= {:.0}% of seeds, never over {} or {}x): {}\n",
        bar.near_cached,
        bar.near_p99,
        bar.near_share * 100.0,
        bar.worst_cached,
        bar.worst_p99,
        if verdict.holds(&bar) { "HOLDS" } else { "FAILS" }
    );
    out += &format!(
        "  near on {} of {} seeds ({:.0}%); not near: {}; past the limit: {}\n",
        verdict.near,
        verdict.seeds,
        100.0 * verdict.near as f64 / verdict.seeds.max(1) as f64,
        seeds(&verdict.not_near),
        seeds(&verdict.broken)
    );
    out
}

/// Each draw's verdict by the bar, and the seeds that are not near in every draw.
fn draws_report(runs: &BTreeMap<(u64, u64), SeedRun>, default: &str, draws: u64) -> String {
    let bar = ISSUE_53_BAR;
    let mut out = format!("== {default} over {draws} draws (arrival orders) of each seed ==\n");
    let (mut near, mut judged, mut broken) = (0, 0, 0);
    let mut not_near_in: BTreeMap<u64, u64> = BTreeMap::new();
    for draw in 0..draws {
        let standings: Vec<(u64, Standing)> = runs
            .iter()
            .filter(|((_, d), _)| *d == draw)
            .filter_map(|((seed, _), run)| Some((*seed, Standing::of(default, &run.outcomes)?)))
            .collect();
        let v = Verdict::of(&standings, &bar);
        for seed in &v.not_near {
            *not_near_in.entry(*seed).or_default() += 1;
        }
        out += &format!(
            "  draw {draw}: near on {} of {}; not near: {}; past the limit: {}\n",
            v.near,
            v.seeds,
            seeds(&v.not_near),
            seeds(&v.broken)
        );
        (near, judged, broken) = (near + v.near, judged + v.seeds, broken + v.broken.len());
    }
    let always: Vec<u64> = not_near_in
        .iter()
        .filter(|(_, n)| **n == draws)
        .map(|(seed, _)| *seed)
        .collect();
    out += &format!(
        "  all draws: near on {near} of {judged} ({:.0}%), past the limit on {broken}; not near in every draw: {}\n",
        100.0 * near as f64 / judged.max(1) as f64,
        seeds(&always)
    );
    out
}

/// Seeds as a list, `none` when empty.
fn seeds(v: &[u64]) -> String {
    if v.is_empty() {
        "none".to_string()
    } else {
        v.iter().map(u64::to_string).collect::<Vec<_>>().join(" ")
    }
}

/// The default's standing on one seed, in words.
fn standing_text(s: &Standing) -> String {
    format!(
        "cached {:+.3} vs {} (best other), TTFT p99 {:.2}x {} (best other)",
        -s.cached_gap, s.best_cached, s.p99_ratio, s.best_p99
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(seed: u64, draw: u64, default_cached: f64) -> ((u64, u64), SeedRun) {
        let outcome = |policy: &str, cached: f64| Outcome {
            policy: policy.to_string(),
            cached,
            ttft_p50_ms: 10.0,
            ttft_p99_ms: 20.0,
            errors: 0,
            per_engine: Vec::new(),
        };
        let outcomes = vec![
            outcome("predicted_ttft", default_cached),
            outcome("cache_aware", 0.80),
        ];
        let member = Member::draw(seed);
        (
            (seed, draw),
            SeedRun {
                member,
                draw,
                outcomes,
            },
        )
    }

    #[test]
    fn the_summary_counts_each_policy_near_as_the_default_and_the_seeds_nobody_is() {
        // Seed 1: alike, both near. Seed 2: the default 0.01 behind, cache_aware
        // near. Seed 3: the default caches more at twice the tail: nobody near.
        let (_, one) = run(1, 0, 0.80);
        let (_, two) = run(2, 0, 0.79);
        let (_, mut three) = run(3, 0, 0.90);
        three.outcomes[0].ttft_p99_ms = 40.0;
        let runs: BTreeMap<u64, &SeedRun> = [(1, &one), (2, &two), (3, &three)].into();
        let out = report(&runs, "predicted_ttft");
        assert!(
            out.contains(
                "near the best of the others, seeds (each judged as the default): cache_aware 2, predicted_ttft 1\n  no policy near on 1 seeds: 3\n"
            ),
            "{out}"
        );
    }

    #[test]
    fn every_draw_is_judged_and_the_seeds_lost_in_all_of_them_are_named() {
        // Seed 1 near in draw 0 only; seed 2 behind in both (by 0.01), seed 3
        // past the limit in draw 1 (0.05 behind).
        let runs: BTreeMap<(u64, u64), SeedRun> = [
            run(1, 0, 0.80),
            run(1, 1, 0.79),
            run(2, 0, 0.79),
            run(2, 1, 0.79),
            run(3, 0, 0.81),
            run(3, 1, 0.75),
        ]
        .into_iter()
        .collect();
        let out = draws_report(&runs, "predicted_ttft", 2);
        assert!(
            out.contains("draw 0: near on 2 of 3; not near: 2; past the limit: none"),
            "{out}"
        );
        assert!(
            out.contains("draw 1: near on 0 of 3; not near: 1 2 3; past the limit: 3"),
            "{out}"
        );
        assert!(
            out.contains(
                "all draws: near on 2 of 6 (33%), past the limit on 1; not near in every draw: 2"
            ),
            "{out}"
        );
    }
}
