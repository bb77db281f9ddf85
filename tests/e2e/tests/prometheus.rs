//! Observability proven by a real Prometheus. The Grafana dashboard
//! (`observe/grafana-dashboard.json`): a Prometheus scrapes Envoy's
//! `/stats/prometheus` while engine mocks, the collector and Envoy with the filter
//! serve traffic, and every panel's every query, with Grafana's variables filled in,
//! must return a sample with a number (not NaN) from `/api/v1/query` during the run.
//! The same Prometheus evaluates the alert rules (`observe/alerts.yaml`) against
//! that data, and every rule must evaluate without error. The alert rules' logic:
//! `promtool check rules` and `promtool test rules observe/alerts.test.yaml`, which
//! must fire every alert at least once.
//!
//! Prometheus and promtool come from `PROMETHEUS` / `PROMTOOL`, else PATH; without
//! them the tests fail and say to run `envoy/get-prometheus`, as the other
//! end-to-end tests do without Envoy.

use e2e::prometheus::{promtool_bin, sample_value, Prometheus, Scrape};
use e2e::support::start;
use llm_demo::admin;
use llm_demo::fleet::FleetSpec;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn repo_path(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

fn repo_file(path: &str) -> String {
    let p = repo_path(path);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

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
/// threads stop and are joined on drop, on failure too.
struct Traffic {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
}

impl Traffic {
    fn start(listener: SocketAddr, clients: usize) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let threads = (0..clients)
            .map(|c| {
                let (stop, ok) = (stop.clone(), ok.clone());
                std::thread::spawn(move || {
                    let mut session = c;
                    while !stop.load(Ordering::Relaxed) {
                        let system = format!("system prompt {}: ", session % 3)
                            + &"you answer questions about caches and queues. ".repeat(20);
                        let mut prompt = format!("{system} session {session}");
                        for turn in 0..4 {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            prompt.push_str(&format!(" user turn {turn}: tell me more."));
                            let body = json!({"model": "mock", "prompt": prompt, "max_tokens": 4});
                            let r = admin::request(
                                listener,
                                "POST",
                                "/v1/completions",
                                &[("content-type", "application/json")],
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

#[test]
fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let dash: Value = serde_json::from_str(&repo_file("observe/grafana-dashboard.json"))
        .expect("the dashboard is JSON");
    let vars = [builtin_vars(), template_vars(&dash)].concat();
    let targets = dashboard_targets(&dash, &vars);
    let panel_count = panels(&dash).len();
    assert!(panel_count >= 10, "a dashboard worth opening");

    // Engines that run one request at a time, so queues form under the clients'
    // load; the queue gate (limit 1) then diverts from queued owners (the
    // diverted-prefix panel) on what the collector reports; two Envoy threads share
    // their prefix trees (the sync panel).
    let f = start(&FleetSpec {
        workers: 3,
        engine_args: vec!["--max-running=1".into()],
        plugin_config: json!({"worker_queue_limit": 1, "sync_interval_ms": 100}),
        collector_interval_ms: Some(100),
        envoy_concurrency: 2,
        ..FleetSpec::default()
    });
    let alerts = repo_path("observe/alerts.yaml");
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
    // Dropped first: the clients stop before Prometheus and the fleet.
    let traffic = Traffic::start(f.envoy.listener, 6);

    // Each query must show a number at some scrape of the run; a query Prometheus
    // cannot parse fails at once.
    let deadline = Instant::now() + PANELS_DEADLINE;
    let mut pending: Vec<Target> = targets.clone();
    let mut last: BTreeMap<String, String> = BTreeMap::new();
    let mut seen: Vec<(Target, String)> = Vec::new();
    while !pending.is_empty() && Instant::now() < deadline {
        pending.retain(|t| {
            let key = format!("{} {}", t.panel, t.ref_id);
            match prom.query(&t.expr) {
                Ok(samples) if samples.iter().any(|s| sample_value(s).is_finite()) => {
                    seen.push((t.clone(), show(&samples)));
                    false
                }
                Ok(samples) => {
                    last.insert(key, show(&samples));
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
                    last.insert(key, e);
                    true
                }
            }
        });
        if !pending.is_empty() {
            std::thread::sleep(SCRAPE / 4);
        }
    }
    let missing: Vec<String> = pending
        .iter()
        .map(|t| {
            let key = format!("{} {}", t.panel, t.ref_id);
            format!(
                "panel {:?} {}: `{}` -> {}",
                t.panel,
                t.ref_id,
                t.expr,
                last.get(&key).map(String::as_str).unwrap_or("never asked")
            )
        })
        .collect();
    assert!(
        missing.is_empty(),
        "{} of {} dashboard queries showed no number in {PANELS_DEADLINE:?} ({} requests answered; targets {:?}); envoy log tail:\n{}\n{}",
        missing.len(),
        targets.len(),
        traffic.answered(),
        prom.targets()
            .unwrap_or_default()
            .iter()
            .map(|t| format!("{} {} {}", t["scrapeUrl"], t["health"], t["lastError"]))
            .collect::<Vec<_>>(),
        llm_demo::envoy::tail(&f.envoy.log),
        missing.join("\n")
    );
    for (t, samples) in &seen {
        eprintln!("panel {:?} {}: {samples}", t.panel, t.ref_id);
    }
    eprintln!(
        "{panel_count} panels, {} queries, each returned data ({} requests answered)",
        targets.len(),
        traffic.answered()
    );

    // The alert rules, loaded by the same Prometheus, evaluate on this data without
    // error (a rule is `unknown` until its first evaluation).
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
        let evaluated =
            rules.len() == expected_alerts && rules.iter().all(|r| r["health"] != "unknown");
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
