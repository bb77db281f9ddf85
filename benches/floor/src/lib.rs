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
//! Everything but the configuration reader is wasm32 only; natively the crate is
//! just `clusters`, so `cargo test --workspace` covers it.

use serde::Deserialize;

/// The router's default routing header (`target: cluster`).
pub const DEFAULT_CLUSTER_HEADER: &str = "x-llm-router-cluster";

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
}

/// The routing header and the workers' clusters, in order, from the router's plugin
/// configuration; `None` when it is not JSON or lists no worker.
pub fn clusters(config: &[u8]) -> Option<(String, Vec<String>)> {
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
    Some((header, clusters))
}

#[cfg(target_arch = "wasm32")]
mod glue {
    //! The proxy-wasm side, on the SDK's `hostcalls` (which return `Result`).
    use std::cell::Cell;
    use std::rc::Rc;

    use proxy_wasm::hostcalls;
    use proxy_wasm::traits::{Context, HttpContext, RootContext};
    use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType};

    /// The routing header and clusters, plus the round-robin position, per VM.
    #[derive(Default)]
    struct Routes {
        header: String,
        clusters: Vec<String>,
        next: Cell<usize>,
    }

    #[derive(Default)]
    struct Root {
        routes: Rc<Routes>,
    }

    impl Context for Root {}

    impl RootContext for Root {
        fn on_configure(&mut self, size: usize) -> bool {
            let bytes = hostcalls::get_buffer(BufferType::PluginConfiguration, 0, size)
                .ok()
                .flatten()
                .unwrap_or_default();
            match super::clusters(&bytes) {
                Some((header, clusters)) => {
                    self.routes = Rc::new(Routes {
                        header,
                        clusters,
                        next: Cell::new(0),
                    });
                    true
                }
                None => {
                    let _ = hostcalls::log(LogLevel::Error, "llm-floor: no workers configured");
                    false
                }
            }
        }

        fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
            Some(Box::new(Stream {
                routes: self.routes.clone(),
            }))
        }

        fn get_type(&self) -> Option<ContextType> {
            Some(ContextType::HttpContext)
        }
    }

    struct Stream {
        routes: Rc<Routes>,
    }

    impl Context for Stream {}

    impl HttpContext for Stream {
        fn on_http_request_headers(&mut self, _headers: usize, end_of_stream: bool) -> Action {
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
            let r = &self.routes;
            let i = r.next.get();
            r.next.set(i.wrapping_add(1));
            if let Some(cluster) = r.clusters.get(i % r.clusters.len().max(1)) {
                let _ =
                    hostcalls::set_map_value(MapType::HttpRequestHeaders, &r.header, Some(cluster));
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
            clusters(cfg),
            Some((
                DEFAULT_CLUSTER_HEADER.to_string(),
                vec!["engine_w0".to_string(), "w1".to_string()]
            ))
        );
        let custom = br#"{"cluster_header":"x-c","workers":[{"name":"a"}]}"#;
        assert_eq!(clusters(custom).map(|(h, _)| h), Some("x-c".to_string()));
    }

    #[test]
    fn a_config_without_workers_is_refused() {
        assert_eq!(clusters(b"{}"), None);
        assert_eq!(clusters(b"not json"), None);
    }
}
