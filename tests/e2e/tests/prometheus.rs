//! Observability proven by a real Prometheus. The Grafana dashboard
//! (`observe/grafana-dashboard.json`): a Prometheus scrapes Envoy's
//! `/stats/prometheus` while engine mocks, the collector and Envoy with the filter
//! serve traffic, and every panel's every query, with Grafana's variables filled in
//! as Grafana would, must return a sample with a number (not NaN) from
//! `/api/v1/query`; drawn over the run as a graph panel draws it
//! (`/api/v1/query_range`), each must also show a non-zero point, unless it reads
//! only series this run cannot move ([`ZERO_IN_THIS_RUN`] says which and why; their
//! zero-valued series are there because the filter defines every stat at start).
//! The run makes the rarer panels move: engines that queue make the queue gate
//! divert, one worker is made slow until it is flagged overloaded and its probes
//! fail, then fast until it recovers, and one client now and then sends a body that
//! is not JSON and a push with a wrong token. The same Prometheus evaluates the
//! alert rules (`observe/alerts.yaml`) on that data: every rule must evaluate
//! without error. The alert rules' logic: `promtool check rules` and `promtool test
//! rules observe/alerts.test.yaml`, which must fire every alert at least once.
//!
//! Prometheus and promtool come from `PROMETHEUS` / `PROMTOOL`, else PATH; without
//! them the tests fail and say to run `envoy/get-prometheus`, as the other
//! end-to-end tests do without Envoy.

use e2e::prometheus::{promtool_bin, sample_value, series_values, unix_now, Prometheus, Scrape};
use e2e::support::{metric_names, overload_config, repo_file, repo_path, start};
use llm_demo::admin;
use llm_demo::fleet::FleetSpec;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the test's Prometheus scrapes Envoy and evaluates the rules.
const SCRAPE: Duration = Duration::from_secs(2);

/// How long the run may take for every panel to show data: generous for a loaded
/// 2-core machine; a passing run takes a few scrapes.
const PANELS_DEADLINE: Duration = Duration::from_secs(120);

/// Grafana's built-in variables as Grafana would fill them for a Prometheus that
/// scrapes every [`SCRAPE`]: `$__interval` is at least the scrape interval, and
/// `$__rate_interval` is `max($__interval + scrape interval, 4 * scrape interval)`.
fn builtin_vars() -> Vec<(String, String)> {
    let scrape = SCRAPE.as_secs();
    let interval = scrape;
    let rate_interval = (interval + scrape).max(4 * scrape);
    vec![
        ("__rate_interval".into(), format!("{rate_interval}s")),
        ("__interval".into(), format!("{interval}s")),
        ("__interval_ms".into(), format!("{}", interval * 1000)),
        ("__range".into(), "1h".into()),
        ("__range_s".into(), "3600".into()),
    ]
}

/// The dashboard's template variables with the value they start with
/// (`current.value`). A datasource variable names no series and is left out.
fn template_vars(dash: &Value) -> Vec<(String, String)> {
    let list = dash["templating"]["list"].as_array().cloned();
    list.unwrap_or_default()
        .iter()
        .filter(|v| v["type"] != "datasource")
        .map(|v| {
            let name = v["name"].as_str().expect("a variable has a name");
            let value = match &v["current"]["value"] {
                Value::String(s) => s.clone(),
                Value::Array(a) => a
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join("|"),
                _ => panic!("template variable {name} has no current value to query with"),
            };
            (name.to_string(), value)
        })
        .collect()
}

/// `expr` with every variable (`$name`, `${name}`, `[[name]]`) replaced; fails on a
/// `$` left over, so a new variable in the dashboard needs a value here.
fn substitute(expr: &str, vars: &[(String, String)]) -> Result<String, String> {
    let mut vars = vars.to_vec();
    // `$__interval_ms` before `$__interval`.
    vars.sort_by_key(|(name, _)| std::cmp::Reverse(name.len()));
    let mut out = expr.to_string();
    for (name, value) in &vars {
        for form in [
            format!("${{{name}}}"),
            format!("[[{name}]]"),
            format!("${name}"),
        ] {
            out = out.replace(&form, value);
        }
    }
    if out.contains('$') || out.contains("[[") {
        return Err(format!("a variable without a value in {out}"));
    }
    Ok(out)
}

/// One query of one panel.
#[derive(Debug, Clone)]
struct Target {
    panel: String,
    ref_id: String,
    expr: String,
}

/// Every panel with queries, rows' folded panels included.
fn panels(dash: &Value) -> Vec<Value> {
    let mut out = Vec::new();
    for p in dash["panels"].as_array().cloned().unwrap_or_default() {
        if p["type"] == "row" {
            out.extend(p["panels"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(p);
        }
    }
    out
}

fn dashboard_targets(dash: &Value, vars: &[(String, String)]) -> Vec<Target> {
    let mut out = Vec::new();
    for p in panels(dash) {
        let title = p["title"].as_str().unwrap_or_default().to_string();
        let targets = p["targets"].as_array().cloned().unwrap_or_default();
        assert!(
            !targets.is_empty() || p["type"] == "text",
            "panel {title:?} shows something, so it queries something"
        );
        for t in targets {
            let expr = t["expr"].as_str().expect("every target has an expr");
            out.push(Target {
                panel: title.clone(),
                ref_id: t["refId"].as_str().unwrap_or("?").to_string(),
                expr: substitute(expr, vars).unwrap_or_else(|e| panic!("panel {title:?}: {e}")),
            });
        }
    }
    out
}

#[test]
fn grafana_variables_are_filled_in_as_grafana_would() {
    let vars = builtin_vars();
    let get = |n: &str| vars.iter().find(|(k, _)| k == n).unwrap().1.clone();
    assert_eq!(get("__interval"), "2s");
    assert_eq!(get("__rate_interval"), "8s", "four scrapes");
    let with_job = [vars.clone(), vec![("job".into(), "envoy".into())]].concat();
    assert_eq!(
        substitute(
            "rate(x{job=\"$job\"}[$__rate_interval]) + rate(y[${__interval}]) + z[[[job]]]",
            &with_job
        )
        .unwrap(),
        "rate(x{job=\"envoy\"}[8s]) + rate(y[2s]) + z[envoy]"
    );
    assert_eq!(
        substitute("x[$__interval_ms]", &vars).unwrap(),
        "x[2000]",
        "the longer name is replaced first"
    );
    assert!(substitute("rate(x[$unknown])", &vars).is_err());
    let dash = json!({"templating": {"list": [
        {"name": "datasource", "type": "datasource", "current": {}},
        {"name": "worker", "type": "query", "current": {"value": ["w0", "w1"]}},
    ]}});
    assert_eq!(
        template_vars(&dash),
        vec![("worker".to_string(), "w0|w1".to_string())]
    );
}

/// Clients sending multi-turn chats over shared system prompts until dropped; the
/// threads stop and are joined on drop, on failure too. Client 0 also misbehaves
/// now and then: a body that is not JSON (routed by load) and a push with a wrong
/// token (refused), so the panels of those show them.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

/// Client 0's every this many requests is a bad one.
const BAD_EVERY: u64 = 25;

/// Pushes with a wrong token client 0 sends in all: fewer than the filter's lockout
/// (10 refused tokens a minute), which would refuse the collector's pushes too for
/// the rest of the minute and leave a slow run without fresh samples, so without
/// the overload episode the panels need.
const BAD_PUSHES: u64 = 5;

impl Traffic {
    fn start(listener: SocketAddr, stats: SocketAddr, clients: usize) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let threads = (0..clients)
            .map(|c| {
                let (stop, ok) = (stop.clone(), ok.clone());
                std::thread::spawn(move || {
                    let json = [("content-type", "application/json")];
                    let mut session = c;
                    let mut sent = 0u64;
                    let mut bad_pushes = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let system = format!("system prompt {}: ", session % 3)
                            + &"you answer questions about caches and queues. ".repeat(20);
                        let mut prompt = format!("{system} session {session}");
                        for turn in 0..4 {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            sent += 1;
                            if c == 0 && sent.is_multiple_of(BAD_EVERY) {
                                let _ = admin::request(
                                    listener,
                                    "POST",
                                    "/v1/completions",
                                    &json,
                                    b"not json at all",
                                );
                                if bad_pushes < BAD_PUSHES {
                                    bad_pushes += 1;
                                    let _ = admin::request(
                                        stats,
                                        "POST",
                                        "/llm-router/stats",
                                        &[json[0], ("authorization", "Bearer wrong")],
                                        br#"{"workers": []}"#,
                                    );
                                }
                            }
                            prompt.push_str(&format!(" user turn {turn}: tell me more."));
                            let body = json!({"model": "mock", "prompt": prompt, "max_tokens": 4});
                            let r = admin::request(
                                listener,
                                "POST",
                                "/v1/completions",
                                &json,
                                body.to_string().as_bytes(),
                            );
                            if r.is_ok_and(|r| r.status == 200) {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        session += clients;
                    }
                })
            })
            .collect();
        Traffic { stop, ok, threads }
    }

    fn answered(&self) -> u64 {
        self.ok.load(Ordering::Relaxed)
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// A query's samples in short, for failure messages.
fn show(samples: &[Value]) -> String {
    let shown: Vec<String> = samples
        .iter()
        .take(6)
        .map(|s| format!("{} = {}", s["metric"], s["value"][1]))
        .collect();
    format!("{} samples [{}]", samples.len(), shown.join(", "))
}

/// The series this run cannot move, by name, and why; a query reading only these
/// returns their zero-valued series (the filter defines every stat when it starts).
/// Every other dashboard query must draw a non-zero point during the run.
const ZERO_IN_THIS_RUN: &[(&str, &str)] = &[
    (
        "llm_router_pd_pairs",
        "needs a prefill/decode fleet (tests/e2e/tests/pd.rs)",
    ),
    (
        "llm_router_pd_prefill_failures",
        "needs a prefill/decode fleet whose prefill fails (tests/e2e/tests/pd.rs)",
    ),
    (
        "llm_router_no_worker",
        "every request here has a worker for its model",
    ),
    (
        "llm_router_worker_unreachable",
        "the collector reaches every engine",
    ),
    ("llm_router_sync_gaps", "a healthy sync ring has no gaps"),
    (
        "llm_router_sync_append_failures",
        "a healthy sync ring takes every append",
    ),
    (
        "llm_router_queue_gate_unsampled",
        "the collector samples every engine",
    ),
    (
        "llm_router_queue_gate_inert",
        "the collector samples every engine",
    ),
    (
        "llm_router_saturation_pins",
        "needs saturation_queue_floor (tests/e2e/tests/gate.rs)",
    ),
];

/// Whether `expr` reads only series of [`ZERO_IN_THIS_RUN`].
fn zero_in_this_run(expr: &str) -> bool {
    let names = metric_names(expr);
    !names.is_empty()
        && names
            .iter()
            .all(|n| ZERO_IN_THIS_RUN.iter().any(|(z, _)| z == n))
}

#[test]
fn queries_reading_only_series_this_run_cannot_move_are_named() {
    assert!(zero_in_this_run("sum(rate(llm_router_pd_pairs[8s]))"));
    assert!(!zero_in_this_run(
        "sum(rate(llm_router_pd_pairs[8s])) / sum(rate(llm_router_decisions[8s]))"
    ));
    assert!(!zero_in_this_run("vector(0)"));
    assert_eq!(
        metric_names("a(llm_router_x{w=\"1\"}) + llm_router_y_bucket"),
        ["llm_router_x", "llm_router_y_bucket"]
            .map(String::from)
            .into()
    );
}

/// One worker's overload episode, driven while the clients' traffic runs, each
/// step once Prometheus has scraped the last: the overload series at zero, then the
/// worker made slow until it is flagged and its probes fail, then made fast until it
/// recovers. So every change is in Prometheus' data, however the scrapes fall.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Episode {
    Baseline,
    Slow,
    Fast,
    Recovered,
}

/// The overload alert on the slow worker, pending (its `for:` is minutes).
const OVERLOADED_PENDING: &str =
    r#"ALERTS{alertname="LLMRouterWorkerOverloaded", worker="w0", alertstate="pending"}"#;

/// The refused-pushes alert, pending on the bad pushes.
const REJECTED_PENDING: &str =
    r#"ALERTS{alertname="LLMRouterStatsPushesRejected", alertstate="pending"}"#;

fn set_ttft(addr: SocketAddr, ms: u64) {
    let r = admin::post(addr, "/admin/latency", &json!({"ttft_ms": ms}).to_string())
        .unwrap_or_else(|e| panic!("engine {addr} /admin/latency: {e:#}"));
    assert_eq!(r.status, 200, "{r:?}");
}

/// Sends `prompt` through the router and returns the engine that answered it.
fn served_by(listener: SocketAddr, prompt: &str) -> String {
    let body = json!({"model": "mock", "prompt": prompt, "max_tokens": 2}).to_string();
    let r = admin::post(listener, "/v1/completions", &body)
        .unwrap_or_else(|e| panic!("POST through Envoy: {e:#}"));
    assert_eq!(r.status, 200, "{r:?}");
    let answer: Value = serde_json::from_str(&r.body).expect("the engine's JSON");
    answer["worker"].as_str().unwrap_or_default().to_string()
}

/// A prompt only `worker` holds: new ones, each placed by load, until one lands
/// there. The clients' prompts may all be held elsewhere when `worker` is flagged,
/// and then no request ever has only flagged owners to filter out.
fn prompt_held_by(listener: SocketAddr, worker: &str) -> String {
    for i in 0..200 {
        let prompt = format!("a question for one engine, number {i}: ")
            + &"why do prefix caches miss? ".repeat(20);
        if served_by(listener, &prompt) == worker {
            return prompt;
        }
    }
    panic!("200 new prompts, none placed on {worker}");
}

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let dash: Value = serde_json::from_str(&repo_file("observe/grafana-dashboard.json"))
        .expect("the dashboard is JSON");
    let vars = [builtin_vars(), template_vars(&dash)].concat();
    let targets = dashboard_targets(&dash, &vars);
    let panel_count = panels(&dash).len();
    assert!(panel_count >= 10, "a dashboard worth opening");

    // Engines that run one request at a time, 20 ms each (4 tokens), so queues form
    // under the clients' load without taking every cycle of the machine; the queue
    // gate (limit 1) then diverts from queued owners (the diverted-prefix panel) on
    // what the collector reports; two Envoy threads share their prefix trees (the
    // sync panel); overload thresholds scaled for the episode.
    let f = start(&FleetSpec {
        workers: 3,
        engine_args: vec!["--max-running=1".into(), "--decode-ms-per-token=5".into()],
        plugin_config: json!({
            "policy": "cache_aware",
            "worker_queue_limit": 1,
            "sync_interval_ms": 100,
            "overload": overload_config(),
        }),
        collector_interval_ms: Some(100),
        collector_args: vec!["--window-s".into(), "3".into()],
        envoy_concurrency: 2,
        ..FleetSpec::default()
    });
    let alerts = repo_path("observe/alerts.yaml");
    let run_start = unix_now();
    let prom = Prometheus::start(
        &[Scrape {
            job: "envoy".into(),
            target: f.envoy.admin,
            metrics_path: "/stats/prometheus".into(),
        }],
        SCRAPE,
        &[&alerts],
    )
    .unwrap_or_else(|e| panic!("cannot start prometheus: {e:#}"));
    let stats = f
        .envoy
        .stats_listener
        .expect("the collector's stats listener");
    // Dropped first: the clients stop before Prometheus and the fleet.
    let traffic = Traffic::start(f.envoy.listener, stats, 6);

    let slow = f.engine("w0").expect("engine w0").addr;
    let mut measured: Vec<JoinHandle<()>> = Vec::new();
    let scraped = |q: &str| prom.query(q).is_ok_and(|s| !s.is_empty());

    // Each query must show a number (not NaN) at some scrape of the run while the
    // episode plays out; a query Prometheus cannot parse fails at once.
    let run_clock = Instant::now();
    let deadline = run_clock + PANELS_DEADLINE;
    let mut episode = Episode::Baseline;
    let mut held_by_w0 = String::new();
    let mut pending: Vec<Target> = targets.clone();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let mut seen: Vec<(Target, String)> = Vec::new();
    let key = |t: &Target| format!("{} {}", t.panel, t.ref_id);
    while (!pending.is_empty() || episode != Episode::Recovered) && Instant::now() < deadline {
        match episode {
            Episode::Baseline if scraped("llm_router_overload_entered == 0") => {
                held_by_w0 = prompt_held_by(f.envoy.listener, "w0");
                // Two requests straight to its engine give the collector a TTFT over
                // the threshold however little the router sends it.
                set_ttft(slow, 1500);
                measured.extend((0..2).map(|i| {
                    std::thread::spawn(move || {
                        let prompt = format!("slow {i}");
                        let body = json!({"model": "mock", "prompt": prompt, "max_tokens": 2});
                        let _ = admin::post(slow, "/v1/completions", &body.to_string());
                    })
                }));
                episode = Episode::Slow;
                eprintln!("{:?}: w0 slow", run_clock.elapsed());
            }
            // The alert's expression matches Envoy's series: it is pending.
            Episode::Slow
                if scraped("max(llm_router_worker_overloaded) == 1")
                    && scraped("llm_router_overload_probes_failed > 0")
                    && scraped(OVERLOADED_PENDING) =>
            {
                // Its prefix's only owner is flagged: the request goes elsewhere,
                // counted as an owner filtered out.
                assert_ne!(served_by(f.envoy.listener, &held_by_w0), "w0");
                set_ttft(slow, 0);
                episode = Episode::Fast;
                eprintln!("{:?}: w0 flagged, made fast", run_clock.elapsed());
            }
            Episode::Fast if scraped("llm_router_overload_recovered > 0") => {
                episode = Episode::Recovered;
                eprintln!("{:?}: w0 recovered", run_clock.elapsed());
            }
            _ => {}
        }
        pending.retain(|t| match prom.query(&t.expr) {
            Ok(samples) if samples.iter().any(|s| sample_value(s).is_finite()) => {
                seen.push((t.clone(), show(&samples)));
                false
            }
            Ok(samples) => {
                last.insert(key(t), show(&samples));
                true
            }
            Err(e) => {
                let e = format!("{e:#}");
                assert!(
                    !e.contains("bad_data"),
                    "panel {:?} {}: Prometheus refuses `{}`: {e}",
                    t.panel,
                    t.ref_id,
                    t.expr
                );
                last.insert(key(t), e);
                true
            }
        });
        std::thread::sleep(SCRAPE / 4);
    }
    for m in measured {
        let _ = m.join();
    }
    let fail = |what: &str, missing: &[Target], last: &BTreeMap<String, String>| -> String {
        let lines: Vec<String> = missing
            .iter()
            .map(|t| {
                format!(
                    "panel {:?} {}: `{}` -> {}",
                    t.panel,
                    t.ref_id,
                    t.expr,
                    last.get(&key(t))
                        .map(String::as_str)
                        .unwrap_or("never asked")
                )
            })
            .collect();
        format!(
            "{} of {} dashboard queries {what} in {PANELS_DEADLINE:?} (episode {episode:?}, {} requests answered; targets {:?}); envoy log tail:\n{}\n{}\nprometheus log tail:\n{}",
            missing.len(),
            targets.len(),
            traffic.answered(),
            prom.targets()
                .unwrap_or_default()
                .iter()
                .map(|t| format!("{} {} {}", t["scrapeUrl"], t["health"], t["lastError"]))
                .collect::<Vec<_>>(),
            llm_demo::envoy::tail(&f.envoy.log),
            lines.join("\n"),
            llm_demo::envoy::tail(&prom.log)
        )
    };
    assert_eq!(
        episode,
        Episode::Recovered,
        "{}",
        fail("(the overload episode never ended)", &pending, &last)
    );
    assert!(
        pending.is_empty(),
        "{}",
        fail("showed no number", &pending, &last)
    );
    eprintln!("{:?}: every query showed a number", run_clock.elapsed());

    // Over the whole run, as a graph panel draws it (`query_range` every scrape),
    // every query but those of series this run cannot move shows a non-zero point;
    // polled, as the last scrapes may still be on their way.
    let mut flat: Vec<Target> = targets
        .iter()
        .filter(|t| !zero_in_this_run(&t.expr))
        .cloned()
        .collect();
    let mut shown: BTreeMap<String, f64> = BTreeMap::new();
    while !flat.is_empty() && Instant::now() < deadline {
        flat.retain(|t| {
            let series = prom
                .query_range(&t.expr, run_start, unix_now(), SCRAPE)
                .unwrap_or_default();
            let peak = series
                .iter()
                .flat_map(series_values)
                .filter(|v| v.is_finite())
                .fold(0.0f64, |a, v| a.max(v.abs()));
            last.insert(key(t), format!("peak {peak} over {} series", series.len()));
            if peak > 0.0 {
                shown.insert(key(t), peak);
            }
            peak == 0.0
        });
        if !flat.is_empty() {
            std::thread::sleep(SCRAPE / 4);
        }
    }
    assert!(
        flat.is_empty(),
        "{}",
        fail("drew only zeros over the run", &flat, &last)
    );
    for (t, samples) in &seen {
        let peak = shown
            .get(&key(t))
            .map_or("zero all run (defined from start)".to_string(), |p| {
                format!("peak {p}")
            });
        eprintln!("panel {:?} {}: {samples}; {peak}", t.panel, t.ref_id);
    }
    eprintln!(
        "{panel_count} panels, {} queries, each returned data; {} drew non-zero points ({} requests answered)",
        targets.len(),
        shown.len(),
        traffic.answered()
    );

    // The alert rules, loaded by the same Prometheus, evaluate on this data without
    // error (a rule is `unknown` until its first evaluation), and two of them match
    // what the run did: the overload alert went pending during the episode (above),
    // the refused-pushes alert goes pending on the bad pushes.
    let expected_alerts = repo_file("observe/alerts.yaml")
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    let rules_deadline = Instant::now() + Duration::from_secs(60);
    let rules = loop {
        let rules: Vec<Value> = prom
            .rule_groups()
            .expect("the rules API answers")
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.len() == expected_alerts
            && rules.iter().all(|r| r["health"] != "unknown")
            && scraped(REJECTED_PENDING);
        if evaluated || Instant::now() > rules_deadline {
            break rules;
        }
        std::thread::sleep(SCRAPE / 4);
    };
    assert_eq!(
        rules.len(),
        expected_alerts,
        "Prometheus loaded every alert rule: {rules:?}"
    );
    assert!(
        scraped(REJECTED_PENDING),
        "the refused-pushes alert goes pending on Envoy's series: {rules:?}"
    );
    for r in &rules {
        assert_eq!(r["type"], "alerting", "{r}");
        assert_eq!(
            r["health"], "ok",
            "alert {} evaluates on Envoy's series: {r}",
            r["name"]
        );
    }
    drop(traffic);
}

/// Every alert's name, from `- alert: Name` lines.
fn alert_names(rules: &str) -> Vec<String> {
    rules
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("- alert:"))
        .map(|n| n.trim().to_string())
        .collect()
}

/// For each `alertname:` of a promtool test file, whether that case expects the
/// alert to fire (`exp_alerts` not `[]`).
fn alert_cases(tests: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in tests.lines() {
        let l = line.trim();
        if let Some(name) = l.strip_prefix("alertname:") {
            current = Some(name.trim().to_string());
        } else if let Some(rest) = l.strip_prefix("exp_alerts:") {
            if let Some(name) = current.take() {
                let fires = !rest.trim_start().starts_with("[]");
                out.push((name, fires));
            }
        }
    }
    out
}

#[test]
fn alert_cases_are_read_from_the_test_file() {
    let text = "  - eval_time: 1m\n    alertname: A\n    exp_alerts: [] # pending\n  - eval_time: 2m\n    alertname: A\n    exp_alerts:\n      - exp_labels: {}\n";
    assert_eq!(
        alert_cases(text),
        vec![("A".to_string(), false), ("A".to_string(), true)]
    );
    assert_eq!(
        alert_names("  - alert: X\n    expr: y\n  - alert: Z\n"),
        vec!["X", "Z"]
    );
}

#[test]
fn promtool_checks_the_alert_rules_and_their_unit_tests_fire_every_alert() {
    let promtool = promtool_bin().unwrap_or_else(|e| panic!("{e:#}"));
    let run = |args: &[&str]| {
        let out = std::process::Command::new(&promtool)
            .args(args)
            .current_dir(repo_path(""))
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", promtool.display()));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
        text
    };
    let checked = run(&["check", "rules", "observe/alerts.yaml"]);
    let names = alert_names(&repo_file("observe/alerts.yaml"));
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", names.len())),
        "promtool found every rule: {checked}"
    );
    run(&["test", "rules", "observe/alerts.test.yaml"]);
    let cases = alert_cases(&repo_file("observe/alerts.test.yaml"));
    for name in &names {
        assert!(
            cases.iter().any(|(n, fires)| n == name && *fires),
            "observe/alerts.test.yaml has a case where {name} fires"
        );
    }
    for (name, _) in &cases {
        assert!(
            names.contains(name),
            "the test file tests an alert that exists: {name}"
        );
    }
    let quiet = names
        .iter()
        .filter(|n| cases.iter().any(|(c, fires)| c == *n && !fires))
        .count();
    eprintln!(
        "{} alerts, each fired by a unit test; {quiet} also shown quiet below their threshold",
        names.len()
    );
}
