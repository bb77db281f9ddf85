//! A simulated engine fleet in virtual time: the upstreams behind the filter, each an
//! [`engine_model::engine::Engine`] (the engine mock's prefix cache, FIFO slots and
//! cost model), addressed as the filter addresses them (cluster name, or `ip:port` in
//! `target: endpoint` mode), answering as the engine mock answers (its `usage` with
//! `cached_tokens`, its `worker` field), and reporting the gauges the companion
//! collector would push.

use engine_model::cache::CacheLookup;
use engine_model::engine::{Engine, EngineSpec, Served};
use engine_model::prompt::{self, Endpoint};
use llm_router_push::{Push, WorkerStats};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};

/// One simulated engine and how the filter's config names it.
#[derive(Debug, Clone)]
pub struct SimEngine {
    /// The worker name (the engine's `--worker-id`).
    pub name: String,
    /// Its Envoy cluster (`target: cluster`).
    pub cluster: String,
    /// Its `ip:port` (`target: endpoint`).
    pub address: String,
    /// `regular`, `prefill` or `decode`.
    pub pool: &'static str,
    /// The model behind it.
    pub engine: Engine,
}

impl SimEngine {
    /// Engine number `i` of the fleet, named `name`, at `127.0.0.1:8000+i`.
    fn new(name: String, pool: &'static str, i: usize, spec: EngineSpec) -> Self {
        SimEngine {
            cluster: llm_load::fleet::cluster_name(&name),
            address: format!("127.0.0.1:{}", 8000 + i),
            name,
            pool,
            engine: Engine::new(spec),
        }
    }
}

/// What an engine answered.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineAnswer {
    /// HTTP status (400 for a body the engine cannot read, as the mock).
    pub status: u32,
    /// The response body (JSON, the mock's shape).
    pub body: Vec<u8>,
    /// The schedule and cache outcome; `None` for a rejected body.
    pub served: Option<Served>,
}

/// The fleet.
#[derive(Debug, Clone, Default)]
pub struct SimFleet {
    pub engines: Vec<SimEngine>,
    /// PD: rooms prefilled and not yet taken by a decode engine, with the prefill
    /// engine's name, its cache outcome and when the KV is ready (ms).
    rooms: HashMap<u64, (String, CacheLookup, f64)>,
    /// PD: rooms whose KV reached a decode engine, and those that never came
    /// (the mocks' `engine_mock:pd_pairs_total`, `engine_mock:pd_kv_failures_total`).
    pub pd_pairs: u64,
    pub pd_kv_failures: u64,
    /// Requests each engine answered 200 (the mocks' `request_success_total`).
    pub served: BTreeMap<String, u64>,
}

/// The `bootstrap_room`s of a PD body: a number, or one per prompt of a batch.
fn rooms_of(body: &Value) -> Vec<u64> {
    match body.get("bootstrap_room") {
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_u64).collect(),
        Some(v) => v.as_u64().into_iter().collect(),
        None => Vec::new(),
    }
}

impl SimFleet {
    /// `workers` engines named as `envoy/demo` names them (`w0` on cluster `engine_w0`,
    /// at `127.0.0.1:8000+i`), all of shape `spec`.
    pub fn demo(workers: usize, spec: EngineSpec) -> Self {
        let engines = (0..workers)
            .map(|i| {
                let name = llm_load::fleet::worker_name(i);
                SimEngine::new(name, "regular", i, spec)
            })
            .collect();
        Self {
            engines,
            ..Self::default()
        }
    }

    /// Prefill/decode disaggregation: `prefill` engines `p0..` and `decode` engines
    /// `d0..` (on clusters `engine_p0`..., as the e2e fleet names them), all of shape
    /// `spec`; prefill engines get a bootstrap address for the filter to hand out.
    pub fn pd(prefill: usize, decode: usize, spec: EngineSpec) -> Self {
        let roster = (0..prefill)
            .map(|i| (format!("p{i}"), "prefill"))
            .chain((0..decode).map(|i| (format!("d{i}"), "decode")));
        let engines = roster
            .enumerate()
            .map(|(i, (name, pool))| SimEngine::new(name, pool, i, spec))
            .collect();
        Self {
            engines,
            ..Self::default()
        }
    }

    /// The fleet a plugin config's `workers` list describes: one engine per worker,
    /// named, clustered, addressed and pooled as the config says (a worker without a
    /// `cluster` is on the cluster of its name, one without an `address` at
    /// `127.0.0.1:8000+i`), so a user's own config replays against its own workers.
    pub fn from_workers(workers: &Value, spec: EngineSpec) -> Result<Self, String> {
        let list = workers
            .as_array()
            .ok_or("`workers` must be an array of worker objects")?;
        let engines = list
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let name = w["name"]
                    .as_str()
                    .ok_or(format!("workers[{i}].name: a string is required"))?;
                let pool = match w["pool"].as_str().unwrap_or("regular") {
                    "prefill" => "prefill",
                    "decode" => "decode",
                    _ => "regular",
                };
                Ok(SimEngine {
                    cluster: w["cluster"].as_str().unwrap_or(name).to_string(),
                    address: w["address"]
                        .as_str()
                        .map_or_else(|| format!("127.0.0.1:{}", 8000 + i), str::to_string),
                    name: name.to_string(),
                    pool,
                    engine: Engine::new(spec),
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            engines,
            ..Self::default()
        })
    }

    /// The `workers` entries of a plugin config for this fleet.
    pub fn workers_config(&self) -> Value {
        self.engines
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let mut w = json!({"name": e.name, "cluster": e.cluster, "address": e.address});
                if e.pool != "regular" {
                    w["pool"] = json!(e.pool);
                }
                if e.pool == "prefill" {
                    w["bootstrap_host"] = json!("127.0.0.1");
                    w["bootstrap_port"] = json!(9000 + i);
                }
                w
            })
            .collect()
    }

    /// Every cluster name (for [`crate::HostBuilder::clusters`]).
    pub fn clusters(&self) -> Vec<String> {
        self.engines.iter().map(|e| e.cluster.clone()).collect()
    }

    /// The engine a request was sent to: by the cluster header, else the endpoint
    /// header (`x-gateway-destination-endpoint` by default), as Envoy routes it.
    pub fn find(&self, cluster: Option<&str>, endpoint: Option<&str>) -> Option<usize> {
        let by_cluster = cluster.and_then(|c| self.engines.iter().position(|e| e.cluster == c));
        by_cluster
            .or_else(|| endpoint.and_then(|a| self.engines.iter().position(|e| e.address == a)))
    }

    /// Engine `index` serves a request for `path` arriving at `now_ms`. PD engines
    /// play their role as the mock does: a prefill engine computes the prompt and
    /// publishes its rooms; a decode engine takes its rooms (the prefill copy must
    /// have been served first) and reports the prefill engine's cache outcome.
    pub fn serve(&mut self, index: usize, now_ms: f64, path: &str, body: &[u8]) -> EngineAnswer {
        let SimFleet {
            engines,
            rooms: published,
            ..
        } = self;
        let Some(e) = engines.get_mut(index) else {
            return error(500, "internal_error", "no such engine", "");
        };
        let (name, pool) = (e.name.clone(), e.pool);
        if body.is_empty() {
            // A probe or health check: no prompt, nothing to cache.
            return EngineAnswer {
                status: 200,
                body: json!({"worker": name}).to_string().into_bytes(),
                served: None,
            };
        }
        let endpoint = endpoint_of(path);
        let (parsed, text) = match read_prompt(endpoint, body) {
            Ok(read) => read,
            Err(message) => return error(400, "invalid_request_error", &message, &name),
        };
        let rooms = rooms_of(&parsed);
        if pool != "regular" && rooms.is_empty() {
            let why = "missing `bootstrap_room` (a PD engine needs it)";
            return error(400, "invalid_request_error", why, &name);
        }
        let mut prefill_worker = None;
        let served = match pool {
            "prefill" => {
                let served = e.engine.serve_prefill(now_ms, &text);
                for &room in &rooms {
                    published.insert(room, (name.clone(), served.lookup, served.finished_ms));
                }
                served
            }
            "decode" => {
                let taken: Vec<_> = rooms.iter().filter_map(|r| published.remove(r)).collect();
                if taken.len() != rooms.len() {
                    self.pd_kv_failures += 1;
                    let why = "KV for a room never arrived from its prefill engine";
                    return error(500, "kv_transfer_failed", why, &name);
                }
                self.pd_pairs += taken.len() as u64;
                // A batch's usage is the sum over its prompts.
                let mut lookup = taken.first().map(|t| t.1).unwrap_or(CacheLookup {
                    prompt_chars: 0,
                    total_blocks: 0,
                    matched_blocks: 0,
                    prompt_tokens: 0,
                    cached_tokens: 0,
                });
                for t in taken.iter().skip(1) {
                    lookup.prompt_tokens += t.1.prompt_tokens;
                    lookup.cached_tokens += t.1.cached_tokens;
                }
                let ready = taken.iter().map(|t| t.2).fold(now_ms, f64::max);
                prefill_worker = taken.first().map(|t| t.0.clone());
                e.engine.serve_decode(now_ms, ready, lookup)
            }
            _ => e.engine.serve(now_ms, &text),
        };
        let completion = match pool {
            "prefill" => 1,
            _ => e.engine.spec().output_tokens,
        };
        *self.served.entry(name.clone()).or_default() += 1;
        let mut body = json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "length",
                "message": {"role": "assistant", "content": "ok"}}],
            "usage": {
                "prompt_tokens": served.lookup.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": served.lookup.prompt_tokens + completion as usize,
                "prompt_tokens_details": {"cached_tokens": served.lookup.cached_tokens},
            },
            "worker": name,
        });
        if let Some(p) = prefill_worker {
            body["prefill_worker"] = json!(p);
        }
        EngineAnswer {
            status: 200,
            body: body.to_string().into_bytes(),
            served: Some(served),
        }
    }

    /// The companion collector's answer to `POST /kv/match?path=P` (`kv_match`): the
    /// prompt's tokens and, per engine, the leading blocks its cache holds. Every
    /// engine's index is whole here: the caches are read, not followed through
    /// their events, so this is the collector that never misses a batch.
    pub fn kv_match(&self, path: &str, body: &[u8]) -> EngineAnswer {
        let asked = path
            .split_once("path=")
            .map_or("", |(_, p)| p.split('&').next().unwrap_or(""));
        let text = match read_prompt(endpoint_of(asked), body) {
            Ok((_, text)) => text,
            Err(message) => return error(400, "invalid_request_error", &message, ""),
        };
        let Some(cache) = self.engines.first().map(|e| e.engine.cache()) else {
            return error(503, "unavailable", "no engines followed", "");
        };
        let blocks = engine_model::cache::block_hashes(&text, cache.block_chars());
        let engines: serde_json::Map<String, Value> = self
            .engines
            .iter()
            .map(|e| {
                let held = e.engine.cache().matched_prefix(&blocks);
                (e.name.clone(), json!({ "held_blocks": held }))
            })
            .collect();
        let answer = json!({
            "tokens": engine_model::cache::prompt_tokens_for_chars(text.len()),
            "block_tokens": cache.block_tokens(),
            "engines": engines,
        });
        EngineAnswer {
            status: 200,
            body: answer.to_string().into_bytes(),
            served: None,
        }
    }

    /// The snapshot the companion collector would push at `now_ms`, in the types
    /// the filter reads.
    pub fn stats_push(&self, now_ms: f64) -> String {
        let workers = self
            .engines
            .iter()
            .map(|e| WorkerStats {
                num_waiting: Some(e.engine.num_waiting(now_ms) as u64),
                num_running: Some(e.engine.num_running(now_ms) as u64),
                kv_usage: Some(e.engine.cache().usage()),
                kv_capacity_tokens: Some(e.engine.cache().capacity_tokens() as u64),
                prompt_tokens_total: Some(e.engine.cache().query_tokens()),
                ..WorkerStats::reachable(Some(e.name.clone()), None)
            })
            .collect();
        let push: Push = Push::new(workers);
        // Strings, integers and floats only: serde_json cannot fail on them.
        serde_json::to_string(&push).expect("a push serializes")
    }
}

/// A body's JSON and the prompt an engine at `endpoint` reads from it, or why
/// there is none.
fn read_prompt(endpoint: Endpoint, body: &[u8]) -> Result<(Value, String), String> {
    let parsed: Value = serde_json::from_slice(body).map_err(|err| err.to_string())?;
    let text = prompt::flatten(endpoint, &parsed).map_err(|err| err.0)?;
    Ok((parsed, text))
}

/// The prompt format of an engine path (chat unless it says otherwise).
fn endpoint_of(path: &str) -> Endpoint {
    match path.split('?').next().unwrap_or("") {
        "/v1/completions" => Endpoint::Completions,
        "/generate" => Endpoint::Generate,
        _ => Endpoint::Chat,
    }
}

/// An error answer in the mock's shape.
fn error(status: u32, kind: &str, message: &str, worker: &str) -> EngineAnswer {
    let body = json!({"error": {"message": message, "type": kind, "code": status},
        "worker": worker});
    EngineAnswer {
        status,
        body: body.to_string().into_bytes(),
        served: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_answer_like_the_mock_and_hit_their_own_cache() {
        let mut fleet = SimFleet::demo(2, EngineSpec::default());
        assert_eq!(fleet.find(Some("engine_w1"), None), Some(1));
        assert_eq!(fleet.find(None, Some("127.0.0.1:8000")), Some(0));
        assert_eq!(fleet.find(Some("nope"), None), None);
        let body = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(256));
        let first = fleet.serve(0, 0.0, "/v1/completions", body.as_bytes());
        let again = fleet.serve(0, 1.0, "/v1/completions", body.as_bytes());
        let elsewhere = fleet.serve(1, 1.0, "/v1/completions", body.as_bytes());
        let cached = |a: &EngineAnswer| a.served.unwrap().lookup.cached_tokens;
        assert_eq!(
            (cached(&first), cached(&again), cached(&elsewhere)),
            (0, 64, 0)
        );
        let v: Value = serde_json::from_slice(&again.body).unwrap();
        assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
        assert_eq!(v["worker"], "w0");
        let bad = fleet.serve(0, 2.0, "/v1/completions", b"{}");
        assert_eq!(bad.status, 400);
        // The simulated collector pushes each engine's cumulative prompt tokens,
        // cached ones included; a refused request counts none.
        let tokens = first.served.unwrap().lookup.prompt_tokens as u64;
        let push: Push = serde_json::from_str(&fleet.stats_push(3.0)).unwrap();
        let totals: Vec<_> = push.workers.iter().map(|w| w.prompt_tokens_total).collect();
        assert_eq!(totals, [Some(2 * tokens), Some(tokens)]);
    }

    #[test]
    fn a_pd_fleet_names_its_pools_and_gives_prefill_engines_a_bootstrap() {
        let fleet = SimFleet::pd(2, 1, EngineSpec::default());
        assert_eq!(fleet.clusters(), ["engine_p0", "engine_p1", "engine_d0"]);
        let workers = fleet.workers_config();
        assert_eq!(workers[1]["pool"], "prefill");
        assert_eq!(workers[1]["bootstrap_port"], 9001);
        assert_eq!(workers[2]["pool"], "decode");
        assert!(workers[2].get("bootstrap_port").is_none());
        let regular = SimFleet::demo(1, EngineSpec::default()).workers_config();
        assert!(regular[0].get("pool").is_none(), "{regular}");
    }

    #[test]
    fn pd_engines_meet_by_room_and_decode_reports_the_prefill_cache() {
        let mut fleet = SimFleet::pd(1, 1, EngineSpec::default());
        let body = |room: u64| {
            format!(
                r#"{{"prompt":"{}","bootstrap_room":{room}}}"#,
                "y".repeat(256)
            )
        };
        let cached = |a: &EngineAnswer| -> u64 {
            let v: Value = serde_json::from_slice(&a.body).unwrap();
            v["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap()
        };
        for (t, room) in [(0.0, 1u64), (10.0, 2)] {
            let p = fleet.serve(0, t, "/v1/completions", body(room).as_bytes());
            let d = fleet.serve(1, t, "/v1/completions", body(room).as_bytes());
            assert_eq!((p.status, d.status), (200, 200));
            assert_eq!(cached(&d), cached(&p), "decode reports the prefill's cache");
            let v: Value = serde_json::from_slice(&d.body).unwrap();
            assert_eq!(
                (v["worker"].as_str(), v["prefill_worker"].as_str()),
                (Some("d0"), Some("p0"))
            );
            assert!(d.served.unwrap().first_token_ms >= p.served.unwrap().finished_ms);
        }
        assert_eq!(fleet.pd_pairs, 2);
        // A room no prefill engine computed; a body without a room.
        let orphan = fleet.serve(1, 20.0, "/v1/completions", body(9).as_bytes());
        assert_eq!(orphan.status, 500);
        assert_eq!(fleet.pd_kv_failures, 1);
        let plain = fleet.serve(0, 20.0, "/v1/completions", br#"{"prompt":"x"}"#);
        assert_eq!(plain.status, 400);
        assert_eq!(fleet.served.get("p0"), Some(&2));
    }
}
