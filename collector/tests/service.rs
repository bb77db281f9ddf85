//! The collector as a service: several push URLs (one down, one hanging), its own
//! `/healthz` and `/metrics`, JSON logs, `--once` exit codes, and https scrapes and
//! pushes through a private CA given with `--ca-file`.
//!
//! Everything runs on loopback with OS-chosen ports: an in-test engine (static vLLM
//! metrics) and in-test push receivers, plain or TLS, and the real binary. Waits are
//! polls with deadlines, never sleeps standing in for synchronisation.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use llm_router_push::Push;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const TOKEN: &str = "service-test-token";

const VLLM_METRICS: &str = "\
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name=\"m\"} 3.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name=\"m\"} 2.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25
";

/// What an in-test server saw and how it answers pushes.
struct State {
    push_status: u16,
    bodies: Vec<Push>,
    /// Accept connections but never answer (a hung Envoy).
    hang: bool,
    /// Served on `GET /clusters` (standing in for Envoy's admin).
    clusters_json: String,
}

#[derive(Clone)]
struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    tls: bool,
}

impl Server {
    /// Serves `GET /metrics` (vLLM text) and `POST /llm-router/stats` (records the
    /// snapshot), over TLS when `tls` is given.
    async fn start(tls: Option<tokio_rustls::TlsAcceptor>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State {
            push_status: 200,
            bodies: Vec::new(),
            hang: false,
            clusters_json: "{}".into(),
        }));
        let st = state.clone();
        let is_tls = tls.is_some();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = st.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let st = st.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(&st, req).await) }
                    });
                    match tls {
                        Some(acceptor) => {
                            // A failed handshake (the client does not trust us) just ends.
                            if let Ok(s) = acceptor.accept(stream).await {
                                let _ = http1::Builder::new()
                                    .serve_connection(TokioIo::new(s), service)
                                    .await;
                            }
                        }
                        None => {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                });
            }
        });
        Server {
            addr,
            state,
            tls: is_tls,
        }
    }

    fn base(&self) -> String {
        format!(
            "{}://{}",
            if self.tls { "https" } else { "http" },
            self.addr
        )
    }

    fn push_url(&self) -> String {
        format!("{}/llm-router/stats", self.base())
    }

    fn bodies(&self) -> Vec<Push> {
        self.state.lock().unwrap().bodies.clone()
    }

    fn set_status(&self, s: u16) {
        self.state.lock().unwrap().push_status = s;
    }
}

async fn handle(st: &Mutex<State>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if st.lock().unwrap().hang {
        std::future::pending::<()>().await;
    }
    if req.method() == hyper::Method::GET && req.uri().path() == "/metrics" {
        return Response::new(Full::new(Bytes::from_static(VLLM_METRICS.as_bytes())));
    }
    if req.method() == hyper::Method::GET && req.uri().path() == "/clusters" {
        let body = st.lock().unwrap().clusters_json.clone();
        return Response::new(Full::new(Bytes::from(body)));
    }
    let auth_ok = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(&format!("Bearer {TOKEN}"));
    let body = req.into_body().collect().await.unwrap().to_bytes();
    let mut s = st.lock().unwrap();
    let status = if !auth_ok {
        401
    } else {
        s.bodies
            .push(serde_json::from_slice(&body).expect("a push in the shared format"));
        s.push_status
    };
    let mut r = Response::new(Full::new(Bytes::from(if status == 200 {
        "ok"
    } else {
        "no"
    })));
    *r.status_mut() = StatusCode::from_u16(status).unwrap();
    r
}

/// A child process killed and reaped on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn collector(args: &[String]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llm-collector"));
    c.args(["--token", TOKEN]).args(args).env_remove("RUST_LOG");
    c
}

/// An address that refuses connections: a socket bound and never listening.
/// The caller holds it while the test runs, so the kernel cannot hand the
/// port to an engine mock or receiver another test starts meanwhile.
fn dead_addr() -> (tokio::net::TcpSocket, SocketAddr) {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket.bind("127.0.0.1:0".parse().unwrap()).expect("bind");
    let addr = socket.local_addr().expect("bound address");
    (socket, addr)
}

/// Polls `check` until it returns `Some`, for at most `limit`.
async fn wait_for<T>(limit: Duration, mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(v) = check() {
            return Some(v);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    None
}

/// GET on the collector's own server: (status, body).
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    let resp = client
        .get(format!("http://{addr}{path}").parse().unwrap())
        .await
        .expect("collector's --listen server answers");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn parse_metrics(text: &str) -> prometheus_parse::Scrape {
    prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string())))
        .unwrap_or_else(|e| panic!("/metrics does not parse: {e}\n{text}"))
}

/// The value of the sample `name` whose labels include every `labels` pair.
fn sample(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape
        .samples
        .iter()
        .find(|s| s.metric == name && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(h) => h.iter().map(|b| b.count).fold(0.0, f64::max),
            other => panic!("unexpected {other:?}"),
        })
}

/// Collects stderr lines (JSON logs) on a thread.
fn log_lines(child: &mut Child) -> Arc<Mutex<Vec<String>>> {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let out = lines.clone();
    let stderr = child.stderr.take().expect("stderr piped");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            out.lock().unwrap().push(line);
        }
    });
    lines
}

/// The `--listen` address, read from the JSON start-up log line.
async fn listen_addr(lines: &Arc<Mutex<Vec<String>>>) -> SocketAddr {
    wait_for(Duration::from_secs(20), || {
        lines.lock().unwrap().iter().find_map(|l| {
            let v: Value = serde_json::from_str(l).ok()?;
            (v["message"] == "serving /healthz and /metrics")
                .then(|| v["addr"].as_str()?.parse().ok())
                .flatten()
        })
    })
    .await
    .unwrap_or_else(|| panic!("no listening line in {:?}", lines.lock().unwrap()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_push_urls_metrics_and_healthz() {
    let engine = Server::start(None).await;
    let good = Server::start(None).await;
    let hung = Server::start(None).await;
    hung.state.lock().unwrap().hang = true;
    let (_held, dead) = dead_addr();
    let dead = format!("http://{dead}/llm-router/stats");
    let args: Vec<String> = [
        "--engine",
        &format!("w0={}", engine.base()),
        "--push-url",
        &good.push_url(),
        "--push-url",
        &hung.push_url(),
        "--push-url",
        &dead,
        "--interval-ms",
        "100",
        "--scrape-timeout-ms",
        "1000",
        "--unhealthy-after-intervals",
        "3",
        "--listen",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut child = collector(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let logs = log_lines(&mut child);
    let _proc = Proc(child);
    let addr = listen_addr(&logs).await;

    // The good URL gets snapshot after snapshot while the hung one holds each push for
    // the whole 1 s timeout: it never waits on the others.
    let bodies = wait_for(Duration::from_secs(20), || {
        let b = good.bodies();
        (b.len() >= 20).then_some(b)
    })
    .await
    .expect("20 pushes to the good URL");
    let seqs: Vec<u64> = bodies.iter().map(|b| b.seq.unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    let span = seqs[seqs.len() - 1] - seqs[0] + 1;
    // Serial pushes would deliver about one in ten (one per 1 s timeout at 100 ms);
    // allow a few skipped on a loaded machine.
    assert!(
        seqs.len() as f64 >= 0.8 * span as f64,
        "the good URL missed snapshots: {seqs:?}"
    );
    assert_eq!(bodies[0].workers[0].num_waiting, Some(3));

    // /metrics: per-URL attempts and failures, push latency, scrapes, engines.
    let deadline = Instant::now() + Duration::from_secs(20);
    let scrape = loop {
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        let s = parse_metrics(&text);
        let hung_failed = sample(
            &s,
            "llm_collector_push_failures_total",
            &[("url", &hung.push_url()), ("kind", "undelivered")],
        );
        let dead_failed = sample(
            &s,
            "llm_collector_push_failures_total",
            &[("url", &dead), ("kind", "undelivered")],
        );
        if hung_failed >= Some(1.0) && dead_failed >= Some(1.0) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "no failures counted for the hung and dead URLs:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let good_url = good.push_url();
    let attempts = sample(
        &scrape,
        "llm_collector_push_attempts_total",
        &[("url", &good_url)],
    )
    .unwrap();
    assert!(attempts >= 20.0, "{attempts}");
    assert_eq!(
        sample(
            &scrape,
            "llm_collector_push_failures_total",
            &[("url", &good_url)]
        ),
        None,
        "no failure series for the good URL"
    );
    let latency = sample(
        &scrape,
        "llm_collector_push_duration_seconds",
        &[("url", &good_url)],
    )
    .expect("push latency histogram");
    assert!(latency >= 20.0, "histogram count {latency}");
    assert!(
        sample(
            &scrape,
            "llm_collector_last_successful_push_age_seconds",
            &[("url", &good_url)]
        )
        .unwrap()
            < 5.0
    );
    assert_eq!(
        sample(
            &scrape,
            "llm_collector_last_successful_push_age_seconds",
            &[("url", &dead)]
        ),
        None,
        "never accepted: no age"
    );
    assert!(sample(&scrape, "llm_collector_scrapes_total", &[("engine", "w0")]).unwrap() >= 20.0);
    assert_eq!(
        sample(&scrape, "llm_collector_scrape_failures_total", &[]),
        None
    );
    assert_eq!(sample(&scrape, "llm_collector_engines", &[]), Some(1.0));
    assert_eq!(
        sample(&scrape, "llm_collector_engines_reachable", &[]),
        Some(1.0)
    );
    assert_eq!(
        sample(&scrape, "llm_collector_membership_refreshes_total", &[]),
        Some(0.0),
        "static engines: no admin reads"
    );

    // /healthz: one URL delivering is enough.
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!((status, body.contains("1 of 3")), (200, true), "{body}");

    // Every URL failing for 3 intervals: 503 with the reason; back to 200 on recovery.
    good.set_status(503);
    let reason = wait_for_health(addr, 503).await;
    assert!(
        reason.contains("every push URL") && reason.contains(&good_url),
        "{reason}"
    );
    good.set_status(200);
    // The good URL is backing off after its 503s (at most a few seconds here).
    wait_for_health(addr, 200).await;

    assert_eq!(get(addr, "/nope").await.0, 404);

    // Every log line is JSON with a timestamp and a level; the failures are logged
    // once per state change, naming the URL.
    let lines = logs.lock().unwrap().clone();
    for l in &lines {
        let v: Value = serde_json::from_str(l).unwrap_or_else(|_| panic!("not JSON: {l}"));
        assert!(v["timestamp"].is_string() && v["level"].is_string(), "{l}");
    }
    let failed_logs = lines
        .iter()
        .filter(|l| l.contains("push failed") && l.contains(&dead))
        .count();
    assert_eq!(failed_logs, 1, "{lines:#?}");
}

/// Polls /healthz until it answers `want`; returns the body.
async fn wait_for_health(addr: SocketAddr, want: u16) -> String {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let (status, body) = get(addr, "/healthz").await;
        if status == want {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/healthz still {status} ({body}), wanted {want}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn once_args(engine: &Server, push_urls: &[String]) -> Vec<String> {
    let mut a = vec![
        "--once".to_string(),
        "--engine".into(),
        format!("w0={}", engine.base()),
    ];
    for u in push_urls {
        a.push("--push-url".into());
        a.push(u.clone());
    }
    a
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_exit_codes() {
    let engine = Server::start(None).await;
    let a = Server::start(None).await;
    let b = Server::start(None).await;

    // Both accept: 0, and both got the printed snapshot.
    let out = collector(&once_args(&engine, &[a.push_url(), b.push_url()]))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Push = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(a.bodies(), vec![printed.clone()]);
    assert_eq!(b.bodies(), vec![printed]);

    // One URL down: 1, the other still got it, stdout still has the snapshot, and
    // stderr names the failed URL.
    let (_held, dead) = dead_addr();
    let dead = format!("http://{dead}/llm-router/stats");
    let out = collector(&once_args(&engine, &[a.push_url(), dead.clone()]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let printed: Push = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(a.bodies().last(), Some(&printed));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&dead) && err.contains("connection refused"),
        "{err}"
    );
    assert!(err.contains("ERROR"), "leveled text logs: {err}");

    // Refused (wrong token): 1.
    let out = Command::new(env!("CARGO_BIN_EXE_llm-collector"))
        .args(["--token", "wrong"])
        .args(once_args(&engine, &[a.push_url()]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("HTTP 401"));

    // Undelivered (5xx): 1.
    a.set_status(500);
    let out = collector(&once_args(&engine, &[a.push_url()]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));

    // Bad flags: 2, naming the flag and the rule.
    let out = collector(&once_args(&engine, &["ftp://x/stats".to_string()]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--push-url ftp://x/stats: must be an http:// or https:// URL"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_scrape_and_push_trusting_a_private_ca() {
    let pki = llm_test_pki::private_ca("llm-collector test CA");
    let ca_file = std::env::temp_dir().join(format!("llm-collector-ca-{}.pem", std::process::id()));
    std::fs::write(&ca_file, &pki.ca_pem).unwrap();
    let engine = Server::start(Some(pki.acceptor())).await;
    let recv = Server::start(Some(pki.acceptor())).await;
    assert!(engine.base().starts_with("https://"));

    // Trusted through --ca-file: scraped and pushed over TLS.
    let mut args = once_args(&engine, &[recv.push_url()]);
    args.extend(["--ca-file".to_string(), ca_file.display().to_string()]);
    let out = collector(&args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Push = serde_json::from_slice(&out.stdout).unwrap();
    let w0 = &printed.workers[0];
    assert!(w0.reachable, "{printed:?}");
    assert_eq!((w0.num_waiting, w0.num_running), (Some(3), Some(2)));
    assert_eq!(recv.bodies(), vec![printed]);

    // Without it, the certificate is not trusted: the engine is unreachable (saying
    // why) and the push fails, so --once exits 1.
    let out = collector(&once_args(&engine, &[recv.push_url()]))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let printed: Push = serde_json::from_slice(&out.stdout).unwrap();
    let w0 = &printed.workers[0];
    assert!(!w0.reachable, "{printed:?}");
    assert!(
        w0.error.as_ref().is_some_and(|e| e.contains("certificate")),
        "{printed:?}"
    );
    assert_eq!(recv.bodies().len(), 1, "nothing delivered untrusted");

    // Engines named by Envoy's admin (plain http here) are scraped over https with
    // --engine-scheme https.
    let admin = Server::start(None).await;
    admin.state.lock().unwrap().clusters_json = format!(
        r#"{{"cluster_statuses":[{{"name":"engine_w0","host_statuses":[{{"address":{{"socket_address":{{"address":"127.0.0.1","port_value":{}}}}}}}]}}]}}"#,
        engine.addr.port()
    );
    let args: Vec<String> = [
        "--once",
        "--envoy-admin",
        &admin.base(),
        "--engine-scheme",
        "https",
        "--push-url",
        &recv.push_url(),
        "--ca-file",
        &ca_file.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let out = collector(&args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Push = serde_json::from_slice(&out.stdout).unwrap();
    assert!(printed.workers[0].reachable, "{printed:?}");
    assert_eq!(
        printed.workers[0].name.as_deref(),
        Some("w0"),
        "{printed:?}"
    );
    std::fs::remove_file(&ca_file).ok();
}
