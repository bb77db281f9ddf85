//! `host-sim run`: one request through the filter, printed as JSON: whether it went
//! upstream, the decision headers, any local response, HTTP calls, logs and metrics.

use super::read_config;
use anyhow::{Context as _, Result};
use host_sim::{Host, LocalResponse, RequestSpec, StreamOutcome};
use serde_json::{json, Map, Value};
use std::path::PathBuf;

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// The filter's .wasm (e.g. target/wasm32-wasip1/wasm/llm_router.wasm).
    #[arg(long)]
    wasm: PathBuf,
    /// Plugin configuration: a file, or inline JSON if it starts with '{'.
    #[arg(long)]
    config: String,
    /// File holding the request body (e.g. an OpenAI chat-completions JSON).
    #[arg(long)]
    body: PathBuf,
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Request method.
    #[arg(long, default_value = "POST")]
    method: String,
    /// Extra request header, `name:value` (repeatable).
    #[arg(long = "header", value_name = "NAME:VALUE")]
    headers: Vec<String>,
    /// Cluster known to Envoy (repeatable), for proxy_http_call.
    #[arg(long = "cluster", value_name = "NAME")]
    clusters: Vec<String>,
    /// Body chunks the request arrives in.
    #[arg(long, default_value_t = 1)]
    chunks: usize,
    /// Number of VMs (worker threads); the request goes to VM 0.
    #[arg(long, default_value_t = 1)]
    vms: usize,
    /// Seed of the random generators.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Plugin name.
    #[arg(long, default_value = "llm_router")]
    plugin_name: String,
    /// Envoy's allow_on_headers_stop_iteration plugin option (needed by filters that pause
    /// headers to read the body).
    #[arg(long)]
    allow_on_headers_stop_iteration: bool,
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn pairs(headers: &[(String, String)]) -> Value {
    Value::Array(
        headers
            .iter()
            .map(|(k, v)| json!(format!("{k}: {v}")))
            .collect(),
    )
}

fn local_json(local: &LocalResponse) -> Value {
    json!({
        "status": local.status,
        "headers": pairs(&local.headers),
        "body": text(&local.body),
        "details": local.details,
    })
}

fn decision(input: &[(String, String)], out: &StreamOutcome) -> (Value, Vec<String>) {
    let mut changed = Map::new();
    for (k, v) in &out.request_headers {
        if !input.iter().any(|(ik, iv)| ik == k && iv == v) {
            changed.insert(k.clone(), json!(v));
        }
    }
    let removed = input
        .iter()
        .filter(|(k, _)| out.header(k).is_none())
        .map(|(k, _)| k.clone())
        .collect();
    (Value::Object(changed), removed)
}

pub(crate) fn run(args: RunArgs) -> Result<Value> {
    let config = read_config(&args.config)?;
    let body =
        std::fs::read(&args.body).with_context(|| format!("reading {}", args.body.display()))?;
    let mut host = Host::builder(&args.wasm)
        .plugin_config(config)
        .plugin_name(&args.plugin_name)
        .vms(args.vms)
        .seed(args.seed)
        .clusters(&args.clusters)
        .allow_on_headers_stop_iteration(args.allow_on_headers_stop_iteration)
        .build()?;
    let mut headers: Vec<(String, String)> = vec![
        (":method".into(), args.method.clone()),
        (":path".into(), args.path.clone()),
        (":authority".into(), "host-sim".into()),
        (":scheme".into(), "http".into()),
        ("content-type".into(), "application/json".into()),
        ("content-length".into(), body.len().to_string()),
    ];
    for h in &args.headers {
        let (k, v) = h
            .split_once(':')
            .with_context(|| format!("--header {h:?} is not NAME:VALUE"))?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
    }
    let spec = RequestSpec {
        headers: headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect(),
        body: body.clone(),
        body_chunks: args.chunks,
    };
    let out = host.vm(0).request(spec)?;
    let (decision_headers, removed) = decision(&headers, &out);
    let calls: Vec<Value> = out
        .http_calls
        .iter()
        .map(|c| {
            json!({
                "token": c.token,
                "cluster": c.cluster,
                "headers": pairs(&c.headers),
                "body": text(&c.body),
            })
        })
        .collect();
    let logs: Vec<Value> = host
        .all_logs()
        .iter()
        .map(|l| json!({"vm": l.vm, "level": l.level, "source": l.source, "message": l.message}))
        .collect();
    let stalled = !out.continued && out.local_response.is_none();
    let note = match (stalled, args.allow_on_headers_stop_iteration) {
        (false, _) => "",
        (true, false) if !out.headers_forwarded && out.http_calls.is_empty() => {
            "the filter holds the request: Pause from on_request_headers is \
             StopAllIterationAndWatermark in Envoy (no body callback until the filter \
             continues); try --allow-on-headers-stop-iteration"
        }
        (true, _) => "the filter holds the request (waiting for an HTTP call or a continue)",
    };
    Ok(json!({
        "continued": out.continued,
        "stalled": stalled,
        "note": note,
        "headers_forwarded": out.headers_forwarded,
        "decision_headers": decision_headers,
        "removed_headers": removed,
        "request_headers": pairs(&out.request_headers),
        "request_body_changed": out.request_body != body,
        "local_response": out.local_response.as_ref().map(local_json),
        "clear_route_cache": out.clear_route_cache,
        "foreign_calls": out.foreign_calls,
        "http_calls": calls,
        "logs": logs,
        "metrics": host.metrics(),
    }))
}
