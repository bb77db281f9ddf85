//! A simulated engine fleet in virtual time: the upstreams behind the filter, each an
//! [`engine_model::engine::Engine`] (the engine mock's prefix cache, FIFO slots and
//! cost model), addressed as the filter addresses them (cluster name, or `ip:port` in
//! `target: endpoint` mode), answering as the engine mock answers (its `usage` with
//! `cached_tokens`, its `worker` field), and reporting the gauges the companion
//! collector would push.

use engine_model::engine::{Engine, EngineSpec, Served};
use engine_model::prompt::{self, Endpoint};
use serde_json::{json, Value};

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
            cluster: llm_bench::demo::cluster_name(&name),
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
#[derive(Debug, Clone)]
pub struct SimFleet {
    pub engines: Vec<SimEngine>,
}

impl SimFleet {
    /// `workers` engines named as `envoy/demo` names them (`w0` on cluster `engine_w0`,
    /// at `127.0.0.1:8000+i`), all of shape `spec`.
    pub fn demo(workers: usize, spec: EngineSpec) -> Self {
        let engines = (0..workers)
            .map(|i| {
                let name = llm_bench::demo::worker_name(i);
                SimEngine::new(name, "regular", i, spec)
            })
            .collect();
        Self { engines }
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
        Self { engines }
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

    /// Engine `index` serves a request for `path` arriving at `now_ms`.
    pub fn serve(&mut self, index: usize, now_ms: f64, path: &str, body: &[u8]) -> EngineAnswer {
        let e = &mut self.engines[index];
        if body.is_empty() {
            // A probe or health check: no prompt, nothing to cache.
            return EngineAnswer {
                status: 200,
                body: json!({"worker": e.name}).to_string().into_bytes(),
                served: None,
            };
        }
        let endpoint = match path.split('?').next().unwrap_or("") {
            "/v1/completions" => Endpoint::Completions,
            "/generate" => Endpoint::Generate,
            _ => Endpoint::Chat,
        };
        let text = serde_json::from_slice::<Value>(body)
            .map_err(|err| err.to_string())
            .and_then(|v| prompt::flatten(endpoint, &v).map_err(|err| err.0));
        let text = match text {
            Ok(text) => text,
            Err(message) => {
                let body = json!({"error": {"message": message, "type": "invalid_request_error",
                    "code": 400}, "worker": e.name});
                return EngineAnswer {
                    status: 400,
                    body: body.to_string().into_bytes(),
                    served: None,
                };
            }
        };
        let served = e.engine.serve(now_ms, &text);
        let completion = e.engine.spec().output_tokens;
        let body = json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "finish_reason": "length",
                "message": {"role": "assistant", "content": "ok"}}],
            "usage": {
                "prompt_tokens": served.lookup.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": served.lookup.prompt_tokens + completion as usize,
                "prompt_tokens_details": {"cached_tokens": served.lookup.cached_tokens},
            },
            "worker": e.name,
        });
        EngineAnswer {
            status: 200,
            body: body.to_string().into_bytes(),
            served: Some(served),
        }
    }

    /// The snapshot the companion collector would push at `now_ms`.
    pub fn stats_push(&self, now_ms: f64) -> String {
        let workers: Vec<Value> = self
            .engines
            .iter()
            .map(|e| {
                json!({
                    "name": e.name,
                    "num_waiting": e.engine.num_waiting(now_ms),
                    "num_running": e.engine.num_running(now_ms),
                    "kv_usage": e.engine.cache().usage(),
                })
            })
            .collect();
        json!({ "workers": workers }).to_string()
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
}
