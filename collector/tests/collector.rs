//! End to end: real `engine-mock` processes, the real `llm-collector` binary, and a
//! small in-test HTTP server standing in for the filter's stats endpoint (and for
//! Envoy's admin API).
//!
//! Needs `cargo build -p engine-mock` first (building it from inside a test would
//! wait forever on the cargo lock that `cargo test` holds).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use llm_router_push::{Push, WorkerStats};
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const TOKEN: &str = "test-token-123";

/// `target/debug`, found from this test executable (`target/debug/deps/<test>`).
fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("target/debug").to_path_buf()
}

/// A child process killed and reaped on drop, so a failing test leaves nothing behind.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Mock {
    proc: Proc,
    addr: SocketAddr,
}

impl Mock {
    fn start(id: &str, extra: &[&str]) -> Mock {
        let path = bin_dir().join("engine-mock");
        assert!(
            path.exists(),
            "{} is missing: run `cargo build -p engine-mock` first",
            path.display()
        );
        let mut child = Command::new(&path)
            .args(["--port", "0", "--worker-id", id])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn engine-mock");
        let stdout = child.stdout.take().expect("stdout");
        let proc = Proc(child);
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read listening line");
        let addr = line
            .trim()
            .rsplit(' ')
            .next()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("unexpected engine-mock output: {line:?}"));
        Mock { proc, addr }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Sends `n` concurrent completions to a mock; the tasks run in the background.
fn load(addr: SocketAddr, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http();
    (0..n)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let req = Request::post(format!("http://{addr}/v1/completions"))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(format!(
                        r#"{{"prompt":"request number {i}"}}"#
                    ))))
                    .unwrap();
                if let Ok(resp) = client.request(req).await {
                    let _ = resp.into_body().collect().await;
                }
            })
        })
        .collect()
}

/// What the stand-in filter saw and how it answers.
struct RecvState {
    status: u16,
    bodies: Vec<Push>,
    bad_auth: usize,
    clusters_json: String,
}

#[derive(Clone)]
struct Receiver {
    addr: SocketAddr,
    state: Arc<Mutex<RecvState>>,
    /// The accept loop and every connection task, aborted by `stop`.
    tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Receiver {
    async fn start() -> Receiver {
        Self::start_on("127.0.0.1:0".parse().unwrap()).await
    }

    async fn start_on(addr: SocketAddr) -> Receiver {
        let listener = TcpListener::bind(addr).await.expect("bind receiver");
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(RecvState {
            status: 200,
            bodies: Vec::new(),
            bad_auth: 0,
            clusters_json: "{}".into(),
        }));
        let st = state.clone();
        let tasks: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let conns = tasks.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let st = st.clone();
                let conn = tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let st = st.clone();
                        async move { Ok::<_, std::convert::Infallible>(handle(&st, req).await) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
                conns.lock().unwrap().push(conn.abort_handle());
            }
        });
        tasks.lock().unwrap().push(task.abort_handle());
        Receiver { addr, state, tasks }
    }

    fn push_url(&self) -> String {
        format!("http://{}/llm-router/stats", self.addr)
    }

    fn set_status(&self, s: u16) {
        self.state.lock().unwrap().status = s;
    }

    fn bodies(&self) -> Vec<Push> {
        self.state.lock().unwrap().bodies.clone()
    }

    /// Closes the listener and every open connection: the receiver is gone.
    fn stop(&self) {
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }
}

async fn handle(st: &Mutex<RecvState>, req: Request<Incoming>) -> Response<Full<Bytes>> {
    if req.method() == hyper::Method::GET && req.uri().path() == "/clusters" {
        let body = st.lock().unwrap().clusters_json.clone();
        return Response::new(Full::new(Bytes::from(body)));
    }
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let ctype = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut s = st.lock().unwrap();
    if auth.as_deref() != Some(&format!("Bearer {TOKEN}"))
        || ctype.as_deref() != Some("application/json")
    {
        s.bad_auth += 1;
        let mut r = Response::new(Full::new(Bytes::from("missing or wrong bearer token")));
        *r.status_mut() = hyper::StatusCode::UNAUTHORIZED;
        return r;
    }
    // Read as the filter reads it: a wrong type or a number out of range is
    // refused, so every push this test keeps is one the filter takes.
    match serde_json::from_slice::<Push>(&body) {
        Ok(push) => s.bodies.push(push),
        Err(e) => {
            let mut r = Response::new(Full::new(Bytes::from(e.to_string())));
            *r.status_mut() = hyper::StatusCode::BAD_REQUEST;
            return r;
        }
    }
    let mut r = Response::new(Full::new(Bytes::from(if s.status == 200 {
        "ok"
    } else {
        "boom"
    })));
    *r.status_mut() = hyper::StatusCode::from_u16(s.status).unwrap();
    r
}

fn collector_cmd(push_url: &str, args: &[String]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_llm-collector"));
    c.args(["--push-url", push_url, "--token", TOKEN])
        .args(args);
    c
}

fn worker<'a>(snapshot: &'a Push, name: &str) -> &'a WorkerStats {
    let named = |s: &Option<String>| s.as_deref() == Some(name);
    snapshot
        .workers
        .iter()
        .find(|w| named(&w.name) || named(&w.address))
        .unwrap_or_else(|| panic!("no worker {name} in {snapshot:?}"))
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
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_prints_a_snapshot_that_reflects_load() {
    let w0 = Mock::start("w0", &["--max-running", "1", "--ttft-ms", "300"]);
    let w1 = Mock::start(
        "w1",
        &[
            "--max-running",
            "1",
            "--ttft-ms",
            "300",
            "--metrics-style",
            "sglang",
        ],
    );
    let (_held, dead) = dead_addr();
    let recv = Receiver::start().await;
    let jobs = load(w0.addr, 4);
    tokio::time::sleep(Duration::from_millis(150)).await;

    let args: Vec<String> = vec![
        "--engine".into(),
        format!("w0={}", w0.url()),
        "--engine".into(),
        format!("w1={}", w1.url()),
        "--engine".into(),
        format!("down=http://{dead}"),
        "--once".into(),
    ];
    let out = collector_cmd(&recv.push_url(), &args)
        .output()
        .expect("run collector");
    assert!(
        out.status.success(),
        "exit {:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let printed: Push =
        serde_json::from_slice(&out.stdout).expect("stdout is the snapshot, in the shared format");

    assert_eq!(printed.collector.as_deref(), Some("llm-collector"));
    assert_eq!((printed.seq, printed.interval_ms), (Some(1), Some(1000)));
    let a = worker(&printed, "w0");
    assert!(a.reachable, "{a:?}");
    assert_eq!(a.engine.as_deref(), Some("vllm"));
    assert_eq!(a.address, Some(w0.addr.to_string()));
    assert_eq!(a.num_running, Some(1), "{a:?}");
    assert!(a.num_waiting >= Some(2), "queued requests show: {a:?}");
    assert_eq!(a.ttft_p90_s, None, "one scrape has no window yet: {a:?}");
    assert!(
        a.prompt_tokens_total > Some(0),
        "the running request's prompt is counted: {a:?}"
    );
    let b = worker(&printed, "w1");
    assert_eq!(
        (b.reachable, b.engine.as_deref()),
        (true, Some("sglang")),
        "{b:?}"
    );
    assert_eq!((b.num_waiting, b.num_running), (Some(0), Some(0)));
    assert_eq!(b.prompt_tokens_total, Some(0), "no request yet: a known 0");
    let d = worker(&printed, "down");
    assert!(!d.reachable, "a dead engine is never idle: {d:?}");
    assert!(
        d.error.as_ref().is_some_and(|e| e.contains("refused")),
        "{d:?}"
    );
    assert_eq!(
        (d.num_waiting, d.prompt_tokens_total),
        (None, None),
        "{d:?}"
    );

    // Exactly that snapshot was pushed, with the bearer token.
    let bodies = recv.bodies();
    assert_eq!(bodies, vec![printed]);
    assert_eq!(recv.state.lock().unwrap().bad_auth, 0);
    for j in jobs {
        j.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loop_tracks_load_and_survives_receiver_and_engine_failures() {
    let w0 = Mock::start("w0", &["--max-running", "1", "--ttft-ms", "300"]);
    let w1 = Mock::start("w1", &["--max-running", "1", "--ttft-ms", "300"]);
    let recv = Receiver::start().await;
    recv.set_status(500);
    let args: Vec<String> = vec![
        "--engine".into(),
        format!("w0={}", w0.url()),
        "--engine".into(),
        format!("w1={}", w1.url()),
        "--interval-ms".into(),
        "100".into(),
        "--window-s".into(),
        "30".into(),
    ];
    let mut collector = Proc(
        collector_cmd(&recv.push_url(), &args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // The receiver answers 500: the collector keeps trying (with backoff), alive.
    assert!(
        wait_for(Duration::from_secs(10), || (recv.bodies().len() >= 2)
            .then_some(()))
        .await
        .is_some(),
        "collector retried after a 500"
    );
    assert!(
        collector.0.try_wait().unwrap().is_none(),
        "still running after 500s"
    );
    recv.set_status(200);

    // Load w0; the pushes show its queue.
    let jobs = load(w0.addr, 4);
    let seen = wait_for(Duration::from_secs(15), || {
        recv.bodies()
            .into_iter()
            .find(|b| worker(b, "w0").num_waiting >= Some(1))
    })
    .await
    .expect("a push showing w0's queue");
    assert_eq!(worker(&seen, "w0").num_running, Some(1), "{seen:?}");
    assert_eq!(worker(&seen, "w1").num_waiting, Some(0), "{seen:?}");

    // Once requests finish, the windowed TTFT p90 is known and reflects the 300 ms.
    let p90 = wait_for(Duration::from_secs(15), || {
        recv.bodies()
            .last()
            .and_then(|b| worker(b, "w0").ttft_p90_s)
    })
    .await
    .expect("a ttft p90 once requests completed");
    assert!(p90 >= 0.25, "ttft p90 {p90} reflects the 300 ms TTFT");
    for j in jobs {
        let _ = j.await;
    }

    // Kill w1: it turns unreachable, not idle.
    drop(w1);
    let down = wait_for(Duration::from_secs(10), || {
        recv.bodies()
            .last()
            .filter(|b| !worker(b, "w1").reachable)
            .cloned()
    })
    .await
    .expect("w1 reported unreachable");
    assert_eq!(worker(&down, "w1").num_waiting, None, "{down:?}");
    assert!(worker(&down, "w0").reachable);

    // Sequence numbers only go up.
    let seqs: Vec<u64> = recv.bodies().iter().map(|b| b.seq.unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(recv.state.lock().unwrap().bad_auth, 0);

    // The receiver goes away entirely; the collector keeps running and pushes to
    // a receiver that comes back on the same port.
    let addr = recv.addr;
    recv.stop();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(
        collector.0.try_wait().unwrap().is_none(),
        "survives an absent receiver"
    );
    let back = Receiver::start_on(addr).await;
    assert!(
        wait_for(Duration::from_secs(35), || (!back.bodies().is_empty())
            .then_some(()))
        .await
        .is_some(),
        "pushes resume once the receiver is back"
    );
    drop(w0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_with_envoy_admin_membership() {
    let w0 = Mock::start("w0", &[]);
    let p = Mock::start("p", &["--metrics-style", "sglang"]);
    let recv = Receiver::start().await;
    let host = |a: SocketAddr| {
        format!(
            r#"{{"address":{{"socket_address":{{"address":"{}","port_value":{}}}}}}}"#,
            a.ip(),
            a.port()
        )
    };
    recv.state.lock().unwrap().clusters_json = format!(
        r#"{{"cluster_statuses":[{{"name":"engine_w0","host_statuses":[{}]}},{{"name":"pool","host_statuses":[{}]}},{{"name":"other","host_statuses":[]}}]}}"#,
        host(w0.addr),
        host(p.addr)
    );
    let args: Vec<String> = vec![
        "--envoy-admin".into(),
        format!("http://{}", recv.addr),
        "--pool-cluster".into(),
        "pool".into(),
        "--once".into(),
    ];
    let out = collector_cmd(&recv.push_url(), &args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: Push = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s.workers.len(), 2, "{s:?}");
    assert!(worker(&s, "w0").reachable);
    let pool = worker(&s, &p.addr.to_string());
    assert_eq!(pool.name, None, "pool hosts are sent by address: {pool:?}");
    assert_eq!(pool.engine.as_deref(), Some("sglang"));
    assert_eq!(recv.bodies().len(), 1);

    // Admin unreachable: --once fails rather than pushing an empty snapshot.
    let (_held, dead) = dead_addr();
    let args: Vec<String> = vec![
        "--envoy-admin".into(),
        format!("http://{dead}"),
        "--once".into(),
    ];
    let out = collector_cmd(&recv.push_url(), &args).output().unwrap();
    assert!(!out.status.success());
    assert_eq!(recv.bodies().len(), 1, "nothing pushed without membership");
    drop(w0);
    drop(p.proc);
}
