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
//! so what those cost and what the router's own code costs are told apart.
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
            self.turns = Some(Rc::new(Turns {
                routes,
                next: Cell::new(0),
            }));
            true
        }

        fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Stream {
                turns: self.turns.clone()?,
            }))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    struct Stream {
        turns: Rc<Turns>,
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
            let i = t.next.get();
            t.next.set(i.wrapping_add(1));
            let clusters = &t.routes.clusters;
            if let Some(cluster) = clusters.get(i % clusters.len().max(1)) {
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
            })
        );
        let custom = br#"{"cluster_header":"x-c","floor_hostcalls":true,"workers":[{"name":"a"}]}"#;
        let custom = routes(custom);
        assert_eq!(custom.as_ref().map(|r| r.header.as_str()), Some("x-c"));
        assert_eq!(custom.map(|r| r.floor_hostcalls), Some(true));
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
