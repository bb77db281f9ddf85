//! The Grafana dashboard and the Prometheus alert rules in `observe/` query what
//! the filter really exports: every `llm_router_*` series and every label they name
//! appears in Envoy's `/stats/prometheus` after a short run through the example
//! tag rules (the demo's bootstrap carries the same `stats_tags`).

use e2e::support::{metric_names, post, repo_file, start, wait_until};
use llm_demo::fleet::FleetSpec;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// The dashboard's queries.
fn dashboard_queries() -> Vec<String> {
    let dash: Value = serde_json::from_str(&repo_file("observe/grafana-dashboard.json"))
        .expect("the dashboard is JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10, "a dashboard worth opening");
    panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .map(|t| {
            t["expr"]
                .as_str()
                .expect("every target has an expr")
                .to_string()
        })
        .collect()
}

#[test]
fn dashboard_and_alert_queries_name_series_envoy_exports() {
    let f = start(&FleetSpec {
        workers: 2,
        plugin_config: json!({"sync_interval_ms": 100}),
        collector_interval_ms: Some(100),
        ..FleetSpec::default()
    });
    for i in 0..4 {
        let r = post(
            f.envoy.listener,
            "/v1/completions",
            &json!({"model": "mock", "prompt": format!("doc {} about caches", i % 2)}),
        );
        assert_eq!(r.status, 200, "{r:?}");
    }
    // Per-worker gauges and pushes arrive on ticks.
    let ready = || {
        let t = f.envoy.prometheus().unwrap_or_default();
        t.contains("llm_router_worker_engine_running{worker=")
            && !t.contains("llm_router_stats_pushes_accepted 0")
    };
    assert!(wait_until(ready), "gauges and pushes never showed");
    // Each engine's KV capacity, read by the collector from the mock's
    // `vllm:cache_config_info` (4096 blocks of 16 tokens), reaches Envoy's stats.
    let capacity = |t: &str| {
        t.lines()
            .filter(|l| l.starts_with("llm_router_worker_engine_kv_capacity_tokens{worker="))
            .filter(|l| l.ends_with(" 65536"))
            .count()
    };
    assert!(
        wait_until(|| capacity(&f.envoy.prometheus().unwrap_or_default()) == 2),
        "both engines' KV capacity: {}",
        f.envoy.prometheus().unwrap_or_default()
    );
    let text = f.envoy.prometheus().unwrap();
    let mut exported = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            if let (Some(name), Some(kind)) = (it.next(), it.next()) {
                exported.insert(name.to_string());
                if kind == "histogram" {
                    for s in ["_bucket", "_sum", "_count"] {
                        exported.insert(format!("{name}{s}"));
                    }
                }
            }
        }
    }
    let queries = dashboard_queries();
    let alerts = repo_file("observe/alerts.yaml");
    for (what, text_of) in [
        ("dashboard", queries.join("\n")),
        ("alerts", alerts.clone()),
    ] {
        let used = metric_names(&text_of);
        assert!(!used.is_empty(), "{what} queries some series");
        let missing: Vec<&String> = used.iter().filter(|m| !exported.contains(*m)).collect();
        assert!(
            missing.is_empty(),
            "{what} queries series Envoy does not export: {missing:?}\nexported: {exported:?}"
        );
    }
    for q in &queries {
        assert!(
            !metric_names(q).is_empty(),
            "every dashboard query reads the filter: {q}"
        );
    }
    for label in ["decision", "reason", "worker"] {
        assert!(
            text.contains(&format!("{{{label}=\"")),
            "series labelled by {label}:\n{text}"
        );
        let used = queries.iter().any(|q| q.contains(label)) || alerts.contains(label);
        assert!(used, "the dashboard or alerts slice by {label}");
    }
}
