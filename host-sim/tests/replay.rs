//! `host-sim replay` as a library: a generated multi-turn workload through the real
//! filter against the simulated fleet, in virtual time.
//!
//! Needs the filter built: `cargo build -p llm-router --target wasm32-wasip1
//! --profile wasm` (`tests/run` does it).

mod support;

use engine_model::engine::EngineSpec;
use host_sim::replay::Replay;
use host_sim::sweep::{Decode, Fleet, Outcome};
use llm_load::generate::{generate, to_jsonl, GenerateConfig};
use llm_load::workload::{parse_workload, WorkItem};
use serde_json::json;
use support::filter;

fn workload() -> Vec<WorkItem> {
    let cfg = GenerateConfig {
        sessions: 10,
        turns: 4,
        system_prompts: 3,
        system_prompt_chars: 1200,
        user_chars: 200,
        ..GenerateConfig::default()
    };
    parse_workload(&to_jsonl(&generate(&cfg)).unwrap()).unwrap()
}

fn replay(vms: usize, concurrency: usize) -> Replay {
    Replay {
        pd: None,
        workers: 3,
        vms,
        concurrency,
        engine: EngineSpec::default(),
        engine_specs: Vec::new(),
        collector_interval_ms: Some(200),
        arrival_seed: None,
    }
}

/// One VM, engines that count a prefix still being prefilled as computed.
const CREDITED: Fleet = Fleet {
    vms: 1,
    prefix_wait: false,
    decode: Decode::INSTANT,
};

/// One VM, engines that hold a request back until its prefix is prefilled.
const WAITED: Fleet = Fleet {
    prefix_wait: true,
    ..CREDITED
};

fn decisions(run: &host_sim::replay::ReplayRun, label: &str) -> u64 {
    run.host
        .metric(&format!("wasmcustom.llm_router_decisions_{label}"))
        .unwrap_or(0)
}

#[test]
fn cache_aware_beats_round_robin_on_engine_cache_hits() {
    let items = workload();
    let mut sim = replay(2, 4);
    // The whole run takes some 100 virtual ms.
    sim.collector_interval_ms = Some(5);
    let cfg = |policy: &str| json!({"policy": policy, "rng_seed": 3});
    let aware = sim.run(&filter(), &cfg("cache_aware"), &items).unwrap();
    let rr = sim.run(&filter(), &cfg("round_robin"), &items).unwrap();
    for run in [&aware, &rr] {
        assert_eq!(run.summary.requests, items.len());
        assert_eq!(run.summary.errors, 0, "{:?}", run.summary.error_reasons);
        assert_eq!(
            run.summary.per_worker.values().sum::<u64>(),
            items.len() as u64
        );
    }
    let labels: u64 = [
        "cache_hit",
        "cache_miss",
        "cache_worker_queued",
        "all_queued",
    ]
    .iter()
    .map(|l| decisions(&aware, l))
    .sum();
    assert_eq!(
        labels,
        items.len() as u64,
        "one decision label per routed request"
    );
    assert!(
        aware.summary.cached_token_ratio > rr.summary.cached_token_ratio + 0.05,
        "cache_aware {} vs round_robin {}",
        aware.summary.cached_token_ratio,
        rr.summary.cached_token_ratio
    );
    assert!(
        aware
            .host
            .metric("wasmcustom.llm_router_stats_pushes_accepted")
            > Some(0),
        "the simulated collector pushed"
    );
}

#[test]
fn a_replay_is_deterministic() {
    let items = workload();
    let cfg = json!({"policy": "cache_aware", "rng_seed": 9});
    let a = replay(3, 6).run(&filter(), &cfg, &items).unwrap();
    let b = replay(3, 6).run(&filter(), &cfg, &items).unwrap();
    assert_eq!(
        a.summary, b.summary,
        "same workload, config and seed: same run"
    );
}

#[test]
fn a_queueing_fleet_under_the_gate_diverts() {
    let items = workload();
    let mut sim = replay(1, 12);
    sim.engine.max_running = 1;
    sim.engine.latency.ttft_ms = 50.0;
    let cfg = json!({"policy": "cache_aware", "rng_seed": 1, "worker_queue_limit": 1});
    let run = sim.run(&filter(), &cfg, &items).unwrap();
    assert_eq!(run.summary.errors, 0);
    assert!(
        decisions(&run, "cache_worker_queued") > 0,
        "queued owners are diverted from"
    );
}

/// Engines shaped one by one (a heterogeneous fleet, as engine mocks started with
/// their own flags): an engine without a cache never hits, a slower one takes longer
/// to its first token, and every stream reports its time to first token.
#[test]
fn each_engine_keeps_its_own_shape_and_streams_report_ttft() {
    let cfg = GenerateConfig {
        stream_fraction: 1.0,
        sessions: 9,
        turns: 3,
        system_prompts: 1,
        ..GenerateConfig::default()
    };
    let items = parse_workload(&to_jsonl(&generate(&cfg)).unwrap()).unwrap();
    let mut sim = replay(1, 1);
    let slow = EngineSpec {
        latency: engine_model::latency::Latency {
            prefill_us_per_token: sim.engine.latency.prefill_us_per_token * 10.0,
            ..sim.engine.latency
        },
        ..sim.engine
    };
    let cacheless = EngineSpec {
        cache_blocks: 0,
        ..sim.engine
    };
    sim.engine_specs = vec![cacheless, slow];
    let run = sim
        .run(&filter(), &json!({"policy": "round_robin"}), &items)
        .unwrap();
    assert_eq!(run.summary.errors, 0, "{:?}", run.summary.error_reasons);
    let on = |w: &str| -> Vec<&llm_load::record::Record> {
        let on_w = |r: &&llm_load::record::Record| r.worker.as_deref() == Some(w);
        run.records.iter().filter(on_w).collect()
    };
    assert!(
        on("w0").iter().all(|r| r.cached_tokens == Some(0)),
        "w0 caches nothing"
    );
    assert!(
        on("w2").iter().any(|r| r.cached_tokens > Some(0)),
        "w2 has the default cache"
    );
    let slowest = |w: &str| on(w).iter().filter_map(|r| r.ttft_ms).fold(0.0, f64::max);
    assert!(
        slowest("w1") > 5.0 * slowest("w2"),
        "w1 prefills 10x slower: {} vs {} ms",
        slowest("w1"),
        slowest("w2")
    );
    assert!(run
        .records
        .iter()
        .all(|r| r.ttft_ms.is_some() && r.ttft_ms == r.ttfb_ms));
}

/// A member of the workload family runs under every policy on its own fleet, and the
/// same seed gives the same outcomes.
#[test]
fn a_family_member_runs_under_every_policy_and_repeats() {
    use host_sim::sweep::{self, POLICIES};
    use llm_load::family::Member;
    // A small member: the family's draws are the sweep's business, not this test's.
    let mut member = Member::draw(3);
    member.workload.sessions = 12;
    member.workload.turns = 2;
    let items = parse_workload(&to_jsonl(&generate(&member.workload)).unwrap()).unwrap();
    let outcomes: Vec<_> = POLICIES
        .iter()
        .map(|p| sweep::run(&filter(), (&member, 0), CREDITED, &items, p).unwrap())
        .collect();
    for o in &outcomes {
        assert_eq!(o.errors, 0, "{}", o.policy);
        assert!((0.0..=1.0).contains(&o.cached), "{o:?}");
        assert!(o.ttft_p50_ms <= o.ttft_p99_ms, "{o:?}");
        assert_eq!(o.per_engine.len(), member.engines.len(), "{o:?}");
        assert_eq!(
            o.per_engine.iter().sum::<u64>(),
            items.len() as u64,
            "every request is counted on its engine: {o:?}"
        );
    }
    let of = |name: &str| outcomes.iter().find(|o| o.policy == name).unwrap();
    assert!(
        of("round_robin").per_engine.iter().all(|&n| n > 0),
        "round robin uses every engine: {:?}",
        of("round_robin")
    );
    let again = sweep::run(&filter(), (&member, 0), CREDITED, &items, "predicted_ttft").unwrap();
    assert_eq!(
        &again,
        of("predicted_ttft"),
        "same member, same policy: same outcome"
    );
    // Another draw: the same workload and fleet, the requests of an instant in
    // another order and other near-ties; each draw repeats itself.
    let draw = |p: &str| sweep::run(&filter(), (&member, 1), CREDITED, &items, p).unwrap();
    assert_eq!(draw("random"), draw("random"), "a draw repeats");
    assert_ne!(&draw("random"), of("random"), "another draw, other picks");
    // Another tie-break stream: the same arrivals (round robin, which draws
    // nothing, routes as it did), the policy's own draws another.
    let stream = |p: &str, t: u64| {
        sweep::run_in_stream(&filter(), (&member, 0, t), CREDITED, &items, p).unwrap()
    };
    assert_eq!(
        &stream("round_robin", 1),
        of("round_robin"),
        "same arrivals"
    );
    let random: Vec<_> = (0..3).map(|t| stream("random", t)).collect();
    assert_eq!(&random[0], of("random"), "stream 0 is the run's own");
    assert_ne!(random[1], random[0], "another stream, other picks");
    // A copy with its own seed: its near-ties from other streams than the
    // policy's, and still one stream from the next.
    let copy: Vec<_> = (0..2)
        .map(|t| stream("random+rng_seed=987654321", t))
        .collect();
    let measures = |o: &Outcome| (o.cached, o.ttft_p99_ms, o.per_engine.clone());
    assert_ne!(
        measures(&copy[0]),
        measures(&random[0]),
        "the copy draws otherwise"
    );
    assert_ne!(copy[0], copy[1], "each stream of the copy its own");
    let medians = sweep::run_streams(&filter(), (&member, 0, 3), CREDITED, &items, "random");
    assert_eq!(medians.unwrap(), Outcome::median(&random).unwrap());
    let variant = "predicted_ttft+load_factor=1.5";
    let tuned = sweep::run(&filter(), (&member, 0), CREDITED, &items, variant).unwrap();
    assert_eq!(tuned.policy, variant, "a variant is reported by its name");
    let refused = sweep::run(
        &filter(),
        (&member, 0),
        CREDITED,
        &items,
        "cache_aware+load_factor=1.5",
    );
    assert!(
        refused.is_err(),
        "a variant's settings reach the filter, which refuses load_factor without predicted_ttft"
    );
}

/// A user's own config (its worker names, clusters, an address, `target: endpoint`
/// for one run) replays against those workers, not the demo's `w0..`.
#[test]
fn a_config_listing_its_workers_replays_against_them() {
    let items = workload();
    let sim = replay(1, 4);
    let workers = json!([
        {"name": "gpu-a", "cluster": "vllm_a", "address": "10.0.0.1:8000"},
        {"name": "gpu-b", "cluster": "vllm_b", "address": "10.0.0.2:8000"},
    ]);
    for target in ["cluster", "endpoint"] {
        let cfg = json!({"workers": workers, "target": target, "rng_seed": 1});
        assert_eq!(sim.fleet(&cfg).unwrap().clusters(), ["vllm_a", "vllm_b"]);
        let run = sim.run(&filter(), &cfg, &items).unwrap();
        assert_eq!(
            run.summary.errors, 0,
            "{target}: {:?}",
            run.summary.error_reasons
        );
        let names: Vec<&String> = run.summary.per_worker.keys().collect();
        assert_eq!(
            names,
            ["gpu-a", "gpu-b"],
            "{target}: the config's own workers"
        );
    }
    let bad = json!({"workers": [{"cluster": "x"}]});
    let err = sim.fleet(&bad).unwrap_err().to_string();
    assert!(err.contains("workers[0].name"), "{err}");
}

/// `host-sim replay` exits 0 when every request succeeded and 3 when some failed
/// (here: every worker serves a model the workload does not ask for), as
/// `envoy/demo` and `llm-load` do, so a script cannot mistake a failing config for a
/// good one.
#[test]
fn cli_replay_exits_non_zero_when_requests_fail() {
    let dir = std::env::temp_dir().join(format!("host-sim-replay-exit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let workload = dir.join("w.jsonl");
    let cfg = GenerateConfig {
        sessions: 3,
        turns: 2,
        model: "mock".into(),
        ..GenerateConfig::default()
    };
    std::fs::write(&workload, to_jsonl(&generate(&cfg)).unwrap()).unwrap();
    let run = |config: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_host-sim"))
            .args([
                "replay",
                "--baseline",
                "none",
                "--config",
                config,
                "--workload",
            ])
            .arg(&workload)
            .arg("--wasm")
            .arg(host_sim::require_built_filter())
            .output()
            .expect("host-sim runs")
    };
    let ok = run(r#"{"workers":[{"name":"a"},{"name":"b"}]}"#);
    assert_eq!(ok.status.code(), Some(0), "{ok:?}");
    let failing = run(r#"{"workers":[{"name":"a","models":["other"]}]}"#);
    assert_eq!(failing.status.code(), Some(3), "{failing:?}");
    assert!(String::from_utf8_lossy(&failing.stderr).contains("requests failed"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `replay --family SEED` is the sweep's run of that member (its fleet of unequal
/// engines, its concurrency and seed), with the per-engine split and records the
/// sweep does not print.
#[test]
fn cli_replay_of_a_family_member_is_the_sweeps_run_of_it() {
    use host_sim::sweep;
    use llm_load::family::Member;
    let seed = 6; // 24 one-turn conversations: small
    let member = Member::draw(seed);
    let items = parse_workload(&to_jsonl(&generate(&member.workload)).unwrap()).unwrap();
    let swept = sweep::run(&filter(), (&member, 0), CREDITED, &items, "cache_aware").unwrap();
    let dir = std::env::temp_dir().join(format!("host-sim-family-{}", std::process::id()));
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_host-sim"))
        .args(["replay", "--baseline", "none", "--policy", "cache_aware"])
        .args(["--family", &seed.to_string(), "--records-dir"])
        .arg(&dir)
        .arg("--wasm")
        .arg(host_sim::require_built_filter())
        .output()
        .expect("host-sim runs");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last: serde_json::Value =
        serde_json::from_str(stdout.lines().last().expect("a last line")).unwrap();
    assert_eq!(last["requests"], json!(items.len()));
    assert_eq!(last["workers"], json!(member.engines.len()));
    let cached = last["cached_token_ratio"].as_f64().unwrap();
    assert!(
        (cached - swept.cached).abs() < 1e-4,
        "{cached} vs {swept:?}"
    );
    let records = std::fs::read_to_string(dir.join("cache_aware.jsonl")).unwrap();
    assert_eq!(records.lines().count(), items.len());
    let _ = std::fs::remove_dir_all(&dir);

    let both = std::process::Command::new(env!("CARGO_BIN_EXE_host-sim"))
        .args(["replay", "--family", "6", "--workers", "3"])
        .output()
        .expect("host-sim runs");
    assert!(
        !both.status.success(),
        "the member's fleet is not overridden"
    );
    assert!(String::from_utf8_lossy(&both.stderr).contains("--workers"));
}

#[test]
fn kv_match_is_answered_from_the_engines_caches_within_the_concurrency() {
    let items = workload();
    let concurrency = 4;
    let sim = replay(1, concurrency);
    let cfg = json!({"policy": "cache_aware", "rng_seed": 3, "kv_match": true});
    let run = sim.run(&filter(), &cfg, &items).unwrap();
    assert_eq!(run.summary.errors, 0, "{:?}", run.summary.error_reasons);
    let stat = |name: &str| support::stat(&run.host, name);
    // Every question answered, and every answer covering the fleet.
    assert_eq!(stat("llm_router_kv_match_unanswered"), 0);
    assert_eq!(stat("llm_router_kv_match_refused"), 0);
    assert_eq!(stat("llm_router_kv_match_partial"), 0);
    assert_eq!(
        stat("llm_router_kv_match_ranked") + stat("llm_router_kv_match_deferred"),
        items.len() as u64
    );
    assert!(
        stat("llm_router_kv_match_ranked") > 0,
        "the engines decided some"
    );
    // A request waiting for the collector's answer is in flight too: never more
    // than `concurrency` at once.
    let spans: Vec<(f64, f64)> = run
        .records
        .iter()
        .map(|r| (r.start_ms, r.start_ms + r.latency_ms))
        .collect();
    let most = spans
        .iter()
        .map(|&(at, _)| spans.iter().filter(|&&(s, e)| s <= at && at < e).count())
        .max()
        .unwrap_or(0);
    assert_eq!(most, concurrency, "requests in flight at once");
}

/// With `prefix_wait` (the engines' default), requests piled onto the engine that is still prefilling
/// their prompt wait for it: member 124 (one 6,400-char prompt, 5 in flight, six
/// engines of 14 slots), whose first requests `cache_aware` sends to one engine,
/// has them share the prompt's first token time, not come back at once.
#[test]
fn piled_requests_wait_for_the_prefill_of_their_prompt_with_prefix_wait() {
    use host_sim::sweep;
    use llm_load::family::Member;
    let member = Member::draw(124);
    let items = parse_workload(&to_jsonl(&generate(&member.workload)).unwrap()).unwrap();
    let credited = sweep::run(&filter(), (&member, 0), CREDITED, &items, "cache_aware").unwrap();
    let waited = sweep::run(&filter(), (&member, 0), WAITED, &items, "cache_aware").unwrap();
    assert_eq!(waited.per_engine, credited.per_engine, "the same placement");
    assert!(
        waited.ttft_p99_ms > 4.0 * credited.ttft_p99_ms,
        "the burst's followers waited for the prompt: p99 {} against {}",
        waited.ttft_p99_ms,
        credited.ttft_p99_ms
    );
    assert_eq!(waited.cached, credited.cached, "and found it cached");
}

/// `sweep --others-from` takes every policy but the default from an earlier run's
/// `--json-out` and replays the default: a recorded outcome comes back as written
/// (here altered, so only the file could have given it), the default as its own
/// replay gives it whatever the file says of it, and a file of another fleet is
/// refused by the field that differs.
#[test]
fn cli_sweep_takes_the_others_from_an_earlier_run_and_replays_the_default() {
    let dir = std::env::temp_dir().join(format!("host-sim-others-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let sweep = |extra: &[&str], out: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_host-sim"))
            .args(["sweep", "--seeds", "1", "--first-seed", "6", "--jobs", "1"])
            .args(["--policies", "cache_aware,round_robin", "--json-out"])
            .arg(dir.join(out))
            .arg("--wasm")
            .arg(host_sim::require_built_filter())
            .args(extra)
            .output()
            .expect("host-sim runs")
    };
    let outcomes = |file: &str| -> serde_json::Value {
        let text = std::fs::read_to_string(dir.join(file)).unwrap();
        let line: serde_json::Value = serde_json::from_str(text.trim()).unwrap();
        line["outcomes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| (o["policy"].as_str().unwrap().to_string(), o.clone()))
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let first = sweep(&[], "first.jsonl");
    assert_eq!(first.status.code(), Some(0), "{first:?}");
    let before = outcomes("first.jsonl");
    let altered = std::fs::read_to_string(dir.join("first.jsonl"))
        .unwrap()
        .replace(
            &format!(r#""cached":{},"#, before["round_robin"]["cached"]),
            r#""cached":0.0123,"#,
        )
        .replace(
            &format!(r#""cached":{},"#, before["predicted_ttft"]["cached"]),
            r#""cached":0.0456,"#,
        );
    std::fs::write(dir.join("altered.jsonl"), altered).unwrap();
    let path = dir.join("altered.jsonl").display().to_string();
    let again = sweep(&["--others-from", &path], "again.jsonl");
    assert_eq!(again.status.code(), Some(0), "{again:?}");
    let after = outcomes("again.jsonl");
    assert_eq!(
        after["round_robin"]["cached"],
        json!(0.0123),
        "from the file"
    );
    assert_eq!(after["cache_aware"], before["cache_aware"]);
    assert_eq!(
        after["predicted_ttft"], before["predicted_ttft"],
        "the default replayed, not read"
    );
    let four = sweep(&["--others-from", &path, "--vms", "2"], "four.jsonl");
    assert!(!four.status.success(), "{four:?}");
    let stderr = String::from_utf8_lossy(&four.stderr);
    assert!(stderr.contains("`vms` is 1 there but 2"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Engines that decode stream their answers: the first bytes reach the filter at
/// the first token and the rest at the last, so `predicted_ttft` learns the prefill
/// from the first byte and the decode as the service after it. Were the whole
/// answer to come at its end, every decode would be learned as prefill and each
/// prediction would be near the whole request's time.
#[test]
fn a_streamed_answer_reaches_the_filter_at_its_first_token() {
    let cfg = GenerateConfig {
        stream_fraction: 1.0,
        ..GenerateConfig::default()
    };
    let items = parse_workload(&to_jsonl(&generate(&cfg)).unwrap()).unwrap();
    let sim = replay(1, 2).decode(Decode {
        ms_per_token: 50.0,
        output_tokens: 8,
    });
    let run = sim
        .run(&filter(), &json!({"policy": "predicted_ttft"}), &items)
        .unwrap();
    assert_eq!(run.summary.errors, 0, "{:?}", run.summary.error_reasons);
    // Past the first requests, once each engine has taught its costs.
    let later = &run.records[run.records.len() / 2..];
    for r in later {
        let (Some(predicted), Some(ttft)) = (r.predicted_ttft_ms, r.ttft_ms) else {
            panic!("a streamed decision reports both: {r:?}");
        };
        assert!(
            r.latency_ms > ttft + 300.0,
            "the answer decodes after its first token: {r:?}"
        );
        assert!(
            predicted < ttft + 100.0,
            "predicted {predicted} ms for a first token in {ttft} ms (the answer took {} ms)",
            r.latency_ms
        );
    }
}

/// Member 22 on engines that decode (1.26 s an answer): four engines of 13 running
/// slots, 10 requests in flight, never a queue. An engine seen running three is not
/// known to be full there, so the default keeps each conversation and each prompt
/// where they are cached, as `cache_aware` does, and its tail is no worse; taking
/// what an engine was seen running as its limit for decodes moved new
/// conversations to copies of their prompts, each a cold prefill (0.07 less
/// cached, a p99 5x `cache_aware`'s).
#[test]
fn on_engines_that_decode_with_slots_to_spare_the_default_keeps_the_cache() {
    use host_sim::sweep;
    use llm_load::family::Member;
    let member = Member::draw(22);
    let items = parse_workload(&to_jsonl(&generate(&member.workload)).unwrap()).unwrap();
    let decoding = Fleet {
        decode: Decode {
            ms_per_token: 20.0,
            output_tokens: 64,
        },
        ..WAITED
    };
    let run = |p: &str| sweep::run(&filter(), (&member, 0), decoding, &items, p).unwrap();
    let (default, aware) = (run("predicted_ttft"), run("cache_aware"));
    assert!(
        default.cached >= aware.cached - 0.005,
        "cached {} against cache_aware's {}",
        default.cached,
        aware.cached
    );
    assert!(
        default.ttft_p99_ms <= 1.05 * aware.ttft_p99_ms,
        "TTFT p99 {} ms against cache_aware's {} ms",
        default.ttft_p99_ms,
        aware.ttft_p99_ms
    );
}
