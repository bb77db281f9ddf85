//! The floor of the overhead benchmark (`benches/overhead`): the least a Wasm filter
//! that routes by the request body must do in Envoy, so that what the router costs
//! above it is the router's own.
//!
//! Per request it pauses the headers, lets Envoy buffer the body until the end of the
//! stream, copies the whole body into the VM (as the router does before parsing),
//! sets the routing header to the next worker's cluster in turn and continues. It
//! reads the router's own plugin configuration (only `workers[].cluster`, defaulting
//! to the name, and `cluster_header`), so one Envoy config serves both.
//!
//! With `"floor_hostcalls": true` in the same config it also makes, on every
//! request, the hostcalls the router makes whatever it decides (`floor_hostcalls`),
//! so what those cost and what the router's own code costs are told apart. With
//! `"floor_queue_hop": true` every request makes the round trip to one VM per Envoy
//! and back over shared queues (`Routes::queue_hop`).
//!
//! Everything but the configuration reader is wasm32 only; natively the crate is
//! just `routes`, so `cargo test --workspace` covers it.

use serde::Deserialize;

/// The router's default routing header (`target: cluster`).
pub const DEFAULT_CLUSTER_HEADER: &str = "x-llm-router-cluster";

/// The header the router removes on every request: the routing header it does not
/// route by (`target: endpoint`'s default), so a client cannot pick its upstream.
pub const UNUSED_ROUTING_HEADER: &str = "x-gateway-destination-endpoint";

/// The request header that asks the router for its decision headers.
pub const EXPLAIN_HEADER: &str = "x-llm-router-explain";

/// A shared-data key holding an empty value, read on every request as the router
/// reads its tables' bell.
pub const BELL_KEY: &str = "llm_floor.tables.bell";

#[derive(Deserialize)]
struct Worker {
    name: String,
    cluster: Option<String>,
}

#[derive(Deserialize)]
struct PluginConfig {
    #[serde(default)]
    workers: Vec<Worker>,
    cluster_header: Option<String>,
    #[serde(default)]
    floor_hostcalls: bool,
    #[serde(default)]
    floor_queue_hop: bool,
}

/// What the floor routes by, from the router's plugin configuration.
#[derive(Debug, PartialEq)]
pub struct Routes {
    /// The routing header.
    pub header: String,
    /// The workers' clusters, in order.
    pub clusters: Vec<String>,
    /// Make the router's own hostcalls too: the unused routing header removed and
    /// the explain header looked up (request headers), the clock and the tables'
    /// bell read (the body's end), `:status` read (response headers). The router
    /// makes each on every request with its default configuration, whatever policy
    /// decides.
    pub floor_hostcalls: bool,
    /// Route through one VM per Envoy: the first VM configured (the main thread's)
    /// registers a shared queue; every other VM sends each request's body there,
    /// pauses the request, and resumes it when the answer comes back on a queue of
    /// its own. What a router whose state lives in one VM pays for the round trip.
    pub queue_hop: bool,
}

/// The routes from the router's plugin configuration; `None` when it is not JSON or
/// lists no worker.
pub fn routes(config: &[u8]) -> Option<Routes> {
    let cfg: PluginConfig = serde_json::from_slice(config).ok()?;
    let clusters: Vec<String> = cfg
        .workers
        .into_iter()
        .map(|w| w.cluster.unwrap_or(w.name))
        .collect();
    if clusters.is_empty() {
        return None;
    }
    let header = cfg
        .cluster_header
        .unwrap_or_else(|| DEFAULT_CLUSTER_HEADER.to_string());
    Some(Routes {
        header,
        clusters,
        floor_hostcalls: cfg.floor_hostcalls,
        queue_hop: cfg.floor_queue_hop,
    })
}

#[cfg(target_arch = "wasm32")]
mod glue {
    //! The proxy-wasm side, on the SDK's `hostcalls` (which return `Result`).
    use std::cell::Cell;
    use std::rc::Rc;

    use proxy_wasm::hostcalls;
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

    use super::{Routes, BELL_KEY, EXPLAIN_HEADER, UNUSED_ROUTING_HEADER};

    /// The routes, plus the round-robin position, per VM.
    struct Turns {
        routes: Routes,
        next: Cell<usize>,
        hop: Hop,
    }

    impl Turns {
        fn next_cluster(&self) -> Option<&String> {
            let i = self.next.get();
            self.next.set(i.wrapping_add(1));
            let clusters = &self.routes.clusters;
            clusters.get(i % clusters.len().max(1))
        }
    }

    /// This VM's part in the queue hop.
    #[derive(Clone, Copy, Default)]
    enum Hop {
        #[default]
        Off,
        /// Answers every request's question on `route`.
        Router { route: u32 },
        /// Asks on `route`, hears on `reply`.
        Asker { route: u32, reply: u32 },
    }

    const ROUTE_QUEUE: &str = "llm_floor.route";

    fn join_hop() -> Hop {
        let vm_id = hostcalls::get_property(vec!["plugin_vm_id"])
            .ok()
            .flatten()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
        match hostcalls::resolve_shared_queue(&vm_id, ROUTE_QUEUE) {
            Ok(Some(route)) => {
                let nanos = hostcalls::get_current_time()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                let name = format!("llm_floor.reply.{nanos}");
                match hostcalls::register_shared_queue(&name) {
                    Ok(reply) => Hop::Asker { route, reply },
                    Err(_) => Hop::Off,
                }
            }
            _ => match hostcalls::register_shared_queue(ROUTE_QUEUE) {
                Ok(route) => Hop::Router { route },
                Err(_) => Hop::Off,
            },
        }
    }

    fn word(bytes: &[u8], at: usize) -> Option<u32> {
        let b: [u8; 4] = bytes.get(at..at + 4)?.try_into().ok()?;
        Some(u32::from_le_bytes(b))
    }

    #[derive(Default)]
    struct Root {
        turns: Option<Rc<Turns>>,
    }

    impl Context for Root {}

    impl RootContext for Root {
        fn on_configure(&mut self, size: usize) -> bool {
            let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size)
                .ok()
                .flatten()
                .unwrap_or_default();
            let Some(routes) = super::routes(&bytes) else {
                let _ = hostcalls::log(LogLevel::Error, "llm-floor: no workers configured");
                return false;
            };
            if routes.floor_hostcalls {
                // The router's bell holds an empty value: one that is there.
                let _ = hostcalls::set_shared_data(BELL_KEY, Some(&[]), None);
            }
            let hop = if routes.queue_hop {
                join_hop()
            } else {
                Hop::Off
            };
            self.turns = Some(Rc::new(Turns {
                routes,
                next: Cell::new(0),
                hop,
            }));
            true
        }

        /// Envoy tells whichever root context of a VM it picks, so the role comes
        /// from the queue named, not from this root's own part in the hop.
        fn on_queue_ready(&mut self, queue_id: u32) {
            let Some(t) = self.turns.clone() else { return };
            let route = match t.hop {
                Hop::Off => return,
                Hop::Router { route } | Hop::Asker { route, .. } => route,
            };
            if queue_id == route {
                while let Ok(Some(ask)) = hostcalls::dequeue_shared_queue(route) {
                    let (Some(reply), Some(ctx)) = (word(&ask, 0), word(&ask, 4)) else {
                        continue;
                    };
                    std::hint::black_box(ask.get(8..));
                    let i = t.next.get();
                    t.next.set(i.wrapping_add(1));
                    let mut answer = ctx.to_le_bytes().to_vec();
                    answer.extend_from_slice(&(i as u32).to_le_bytes());
                    let _ = hostcalls::enqueue_shared_queue(reply, Some(&answer));
                }
                return;
            }
            while let Ok(Some(answer)) = hostcalls::dequeue_shared_queue(queue_id) {
                let (Some(ctx), Some(i)) = (word(&answer, 0), word(&answer, 4)) else {
                    continue;
                };
                if hostcalls::set_effective_context(ctx).is_err() {
                    continue;
                }
                let clusters = &t.routes.clusters;
                if let Some(cluster) = clusters.get(i as usize % clusters.len().max(1)) {
                    let _ = hostcalls::set_map_value(
                        MapType::HttpRequestHeaders,
                        &t.routes.header,
                        Some(cluster),
                    );
                }
                let _ = hostcalls::call_foreign_function("clear_route_cache", None);
                let _ = hostcalls::resume_http_request();
            }
        }

        fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Stream {
                turns: self.turns.clone()?,
                id: context_id,
            }))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    struct Stream {
        turns: Rc<Turns>,
        id: u32,
    }

    impl Context for Stream {}

    impl HttpContext for Stream {
        fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
            if self.turns.routes.floor_hostcalls {
                let _ =
                    hostcalls::remove_map_value(MapType::HttpRequestHeaders, UNUSED_ROUTING_HEADER);
                let explain = hostcalls::get_map_value(MapType::HttpRequestHeaders, EXPLAIN_HEADER);
                std::hint::black_box(&explain);
            }
            if end_of_stream {
                self.route(0)
            } else {
                Action::Pause
            }
        }

        fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
            if end_of_stream {
                self.route(body_size)
            } else {
                Action::Pause
            }
        }

        fn on_http_response_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
            if self.turns.routes.floor_hostcalls {
                let status = hostcalls::get_map_value(MapType::HttpResponseHeaders, ":status");
                std::hint::black_box(&status);
            }
            Action::Continue
        }
    }

    impl Stream {
        /// Reads the whole body (as the router does before parsing it) and sends the
        /// request to the next cluster in turn.
        fn route(&self, body_size: usize) -> Action {
            let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
                .ok()
                .flatten()
                .unwrap_or_default();
            std::hint::black_box(&body);
            let t = &self.turns;
            if t.routes.floor_hostcalls {
                let now = hostcalls::get_current_time();
                let bell = hostcalls::get_shared_data(BELL_KEY);
                std::hint::black_box((&now, &bell));
            }
            if let Hop::Asker { route, reply } = t.hop {
                let mut ask = Vec::with_capacity(8 + body.len());
                ask.extend_from_slice(&reply.to_le_bytes());
                ask.extend_from_slice(&self.id.to_le_bytes());
                ask.extend_from_slice(&body);
                if hostcalls::enqueue_shared_queue(route, Some(&ask)).is_ok() {
                    return Action::Pause;
                }
            }
            if let Some(cluster) = t.next_cluster() {
                let _ = hostcalls::set_map_value(
                    MapType::HttpRequestHeaders,
                    &t.routes.header,
                    Some(cluster),
                );
            }
            // The route was chosen before the header existed; make Envoy look again.
            let _ = hostcalls::call_foreign_function("clear_route_cache", None);
            Action::Continue
        }
    }

    proxy_wasm::main! {{
        proxy_wasm::set_log_level(LogLevel::Warn);
        proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
    }}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clusters_come_from_the_routers_own_config() {
        let cfg = br#"{"policy":"cache_aware","workers":[
            {"name":"w0","cluster":"engine_w0","address":"127.0.0.1:1"},{"name":"w1"}]}"#;
        assert_eq!(
            routes(cfg),
            Some(Routes {
                header: DEFAULT_CLUSTER_HEADER.to_string(),
                clusters: vec!["engine_w0".to_string(), "w1".to_string()],
                floor_hostcalls: false,
                queue_hop: false,
            })
        );
        let custom = br#"{"cluster_header":"x-c","floor_hostcalls":true,"workers":[{"name":"a"}]}"#;
        let custom = routes(custom);
        assert_eq!(custom.as_ref().map(|r| r.header.as_str()), Some("x-c"));
        assert_eq!(custom.as_ref().map(|r| r.floor_hostcalls), Some(true));
        assert_eq!(custom.map(|r| r.queue_hop), Some(false));
        let hop = routes(br#"{"floor_queue_hop":true,"workers":[{"name":"a"}]}"#);
        assert_eq!(hop.map(|r| r.queue_hop), Some(true));
    }

    #[test]
    #[cfg(not(target_arch = "wasm32"))]
    fn the_header_names_are_the_routers() {
        use llm_router::config::{DEFAULT_CLUSTER_HEADER as CLUSTER, DEFAULT_ENDPOINT_HEADER};
        assert_eq!(DEFAULT_CLUSTER_HEADER, CLUSTER);
        assert_eq!(UNUSED_ROUTING_HEADER, DEFAULT_ENDPOINT_HEADER);
        assert_eq!(
            EXPLAIN_HEADER,
            llm_router::support::header_names::EXPLAIN_HEADER
        );
    }

    #[test]
    fn a_config_without_workers_is_refused() {
        assert_eq!(routes(b"{}"), None);
        assert_eq!(routes(b"not json"), None);
    }
}
