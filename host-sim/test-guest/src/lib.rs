//! Test guest for host-sim. Behaviour is selected by the request `:path` and by the plain
//! text plugin configuration (whitespace separated words: `fail`, `tick`).

use proxy_wasm::traits::*;
use proxy_wasm::types::*;
use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, UNIX_EPOCH};

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Trace);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root::default()) });
}}

#[derive(Default, Clone, Copy)]
struct Metrics {
    requests: u32,
    inflight: u32,
    body_size: u32,
}

#[derive(Default)]
struct Root {
    metrics: Metrics,
    queue: u32,
}

fn cas_increment(ctx: &dyn Context, key: &str) -> u64 {
    loop {
        let (value, cas) = ctx.get_shared_data(key);
        let n = value
            .and_then(|v| String::from_utf8(v).ok())
            .and_then(|s| s.parse::<u64>().ok())
            .unwrap_or(0)
            + 1;
        match ctx.set_shared_data(key, Some(n.to_string().as_bytes()), cas) {
            Ok(()) => return n,
            Err(Status::CasMismatch) => continue,
            Err(e) => panic!("set_shared_data: {e:?}"),
        }
    }
}

fn now_ms(ctx: &dyn Context) -> u128 {
    ctx.get_current_time()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

impl Context for Root {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        let status = self.get_http_call_response_header(":status");
        let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
        proxy_wasm::hostcalls::log(
            LogLevel::Info,
            &format!(
                "root callout {token} status={status:?} body={}",
                String::from_utf8_lossy(&body)
            ),
        )
        .unwrap();
    }
}

impl RootContext for Root {
    fn on_vm_start(&mut self, size: usize) -> bool {
        println!("stdout: vm_start {size}");
        let seed = std::hash::RandomState::new().build_hasher().finish();
        proxy_wasm::hostcalls::log(LogLevel::Info, &format!("random {seed}")).unwrap();
        let vm = self.get_vm_configuration().unwrap_or_default();
        proxy_wasm::hostcalls::log(
            LogLevel::Debug,
            &format!("vm_config={}", String::from_utf8_lossy(&vm)),
        )
        .unwrap();
        true
    }

    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        let config = String::from_utf8_lossy(&config).to_string();
        let words: Vec<&str> = config.split_whitespace().collect();
        if words.contains(&"fail") {
            return false;
        }
        if words.contains(&"tick") {
            self.set_tick_period(Duration::from_millis(100));
        }
        self.metrics = Metrics {
            requests: proxy_wasm::hostcalls::define_metric(MetricType::Counter, "requests")
                .unwrap(),
            inflight: proxy_wasm::hostcalls::define_metric(MetricType::Gauge, "inflight").unwrap(),
            body_size: proxy_wasm::hostcalls::define_metric(MetricType::Histogram, "body_size")
                .unwrap(),
        };
        self.queue = self.register_shared_queue("q");
        true
    }

    fn on_tick(&mut self) {
        let n = cas_increment(self, "ticks");
        proxy_wasm::hostcalls::log(LogLevel::Info, &format!("tick {n} at {}", now_ms(self)))
            .unwrap();
    }

    fn on_queue_ready(&mut self, queue_id: u32) {
        while let Ok(Some(item)) = self.dequeue_shared_queue(queue_id) {
            proxy_wasm::hostcalls::log(
                LogLevel::Info,
                &format!("queue item {}", String::from_utf8_lossy(&item)),
            )
            .unwrap();
        }
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            id: context_id,
            metrics: self.metrics,
            path: String::new(),
            callout: None,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Stream {
    id: u32,
    metrics: Metrics,
    path: String,
    callout: Option<u32>,
}

impl Context for Stream {
    fn on_http_call_response(&mut self, token: u32, _: usize, body_size: usize, _: usize) {
        // Pairs, not a single-value lookup: after a failure Envoy has no map and a lookup
        // returns BadArgument (the SDK would panic).
        let headers = self.get_http_call_response_headers();
        let status = headers
            .iter()
            .find(|(k, _)| k == ":status")
            .map(|(_, v)| v.clone())
            .unwrap_or_default();
        let body = self.get_http_call_response_body(0, body_size).unwrap_or_default();
        assert_eq!(Some(token), self.callout);
        if status.is_empty() || status == "500" {
            let (code, message) = self.get_grpc_status();
            let detail = format!("{code} {}", message.unwrap_or_default());
            self.send_http_response(
                502,
                vec![("x-callout", "failed"), ("x-status", &detail)],
                Some(b"bad gateway"),
            );
            return;
        }
        self.set_http_request_header("x-callout-status", Some(&status));
        self.set_http_request_header("x-callout-body", Some(&String::from_utf8_lossy(&body)));
        self.resume_http_request();
    }
}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, n: usize, eos: bool) -> Action {
        let m = self.metrics;
        proxy_wasm::hostcalls::increment_metric(m.requests, 1).unwrap();
        proxy_wasm::hostcalls::increment_metric(m.inflight, 1).unwrap();
        let inc0 = match proxy_wasm::hostcalls::increment_metric(m.requests, 0) {
            Err(Status::BadArgument) => "badarg",
            _ => "other",
        };
        self.path = self.get_http_request_header(":path").unwrap_or_default();
        let total = cas_increment(self, "requests_total");
        let name = self.get_property(vec!["plugin_name"]).unwrap_or_default();
        let prop_path = self.get_property(vec!["request", "path"]).unwrap_or_default();
        let missing = self.get_property(vec!["no", "such"]).is_none();
        let metric = proxy_wasm::hostcalls::get_metric(m.requests).unwrap();
        self.set_http_request_header("x-seen-headers", Some(&n.to_string()));
        self.set_http_request_header("x-eos", Some(&eos.to_string()));
        self.set_http_request_header("x-total", Some(&total.to_string()));
        self.set_http_request_header("x-plugin-name", Some(&String::from_utf8_lossy(&name)));
        self.set_http_request_header("x-prop-path", Some(&String::from_utf8_lossy(&prop_path)));
        self.set_http_request_header("x-prop-missing", Some(&missing.to_string()));
        self.set_http_request_header("x-requests-metric", Some(&metric.to_string()));
        self.set_http_request_header("x-inc0", Some(inc0));
        self.set_http_request_header("x-now-ms", Some(&now_ms(self).to_string()));
        self.add_http_request_header("x-multi", "a");
        self.add_http_request_header("x-multi", "b");
        self.remove_http_request_header("x-remove-me");
        match self.path.as_str() {
            "/local" => {
                self.send_http_response(403, vec![("x-reason", "denied")], Some(b"nope"));
                Action::Pause
            }
            "/callout" => {
                let bad = self.dispatch_http_call(
                    "no_such_cluster",
                    vec![(":method", "GET"), (":path", "/"), (":authority", "x")],
                    None,
                    vec![],
                    Duration::from_secs(1),
                );
                let missing_path = self.dispatch_http_call(
                    "engine_0",
                    vec![(":method", "GET"), (":authority", "x")],
                    None,
                    vec![],
                    Duration::from_secs(1),
                );
                let ok = bad == Err(Status::BadArgument) && missing_path == Err(Status::BadArgument);
                self.set_http_request_header("x-bad-calls", Some(&ok.to_string()));
                let token = self
                    .dispatch_http_call(
                        "engine_0",
                        vec![(":method", "GET"), (":path", "/state"), (":authority", "engine")],
                        Some(b"ping"),
                        vec![],
                        Duration::from_millis(500),
                    )
                    .unwrap();
                self.callout = Some(token);
                Action::Pause
            }
            "/enqueue" => {
                let q = self.resolve_shared_queue("", "q").unwrap();
                self.enqueue_shared_queue(q, Some(b"hello")).unwrap();
                let unknown = self.resolve_shared_queue("", "nope").is_none();
                self.set_http_request_header("x-unknown-queue", Some(&unknown.to_string()));
                Action::Continue
            }
            "/cas" => {
                let (_, cas) = self.get_shared_data("requests_total");
                let stale = cas.map(|c| c.wrapping_add(1000));
                let r = self.set_shared_data("requests_total", Some(b"x"), stale);
                let r = if r == Err(Status::CasMismatch) { "mismatch" } else { "other" };
                self.set_http_request_header("x-cas", Some(r));
                let missing = self.get_shared_data("no-such-key");
                self.set_http_request_header("x-missing", Some(&format!("{missing:?}")));
                Action::Continue
            }
            // Stops headers so that the body callback can still edit them (needs
            // allow_on_headers_stop_iteration, like Envoy).
            "/body" => Action::Pause,
            _ => Action::Continue,
        }
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        proxy_wasm::hostcalls::log(LogLevel::Debug, &format!("body {size} eos={eos}")).unwrap();
        if !eos {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, size).unwrap_or_default();
        proxy_wasm::hostcalls::record_metric(self.metrics.body_size, size as u64).unwrap();
        match self.path.as_str() {
            "/body" => {
                self.set_http_request_header("x-body-len", Some(&size.to_string()));
                self.call_foreign_function("clear_route_cache", None).unwrap();
                let unknown = self.call_foreign_function("no_such_function", None);
                let unknown = matches!(unknown, Err(Status::NotFound));
                self.set_http_request_header("x-ff-unknown", Some(&unknown.to_string()));
                let upper = body.to_ascii_uppercase();
                self.set_http_request_body(0, size, &upper);
            }
            // Headers were already continued: Envoy no longer exposes them, so this traps.
            "/late-header" => self.set_http_request_header("x-late", Some("1")),
            _ => {
                let mut out = body.clone();
                out.extend_from_slice(b"!");
                self.set_http_request_body(0, size, &out);
            }
        }
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _: usize, _: bool) -> Action {
        let status = self.get_http_response_header(":status").unwrap_or_default();
        self.set_http_response_header("x-resp-status-seen", Some(&status));
        self.set_http_response_header("x-context", Some(&self.id.to_string()));
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        if !eos {
            return Action::Pause;
        }
        let body = self.get_http_response_body(0, size).unwrap_or_default();
        let mut out = b"[".to_vec();
        out.extend_from_slice(&body);
        out.extend_from_slice(b"]");
        self.set_http_response_body(0, size, &out);
        Action::Continue
    }

    fn on_log(&mut self) {
        let path = self.get_http_request_header(":path");
        let status = self.get_http_response_header(":status");
        proxy_wasm::hostcalls::increment_metric(self.metrics.inflight, -1).unwrap();
        proxy_wasm::hostcalls::log(
            LogLevel::Info,
            &format!("on_log ctx={} path={path:?} status={status:?}", self.id),
        )
        .unwrap();
    }
}
