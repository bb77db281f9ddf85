//! Runs the real `llm-load` binary: generates a workload, replays it against a tiny
//! in-test OpenAI-like hyper server on an ephemeral port, and checks the JSON summary
//! on the last stdout line (and in `--json-out`).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_llm-load");

/// The API key the test server requires.
const API_KEY: &str = "sk-test-key";

/// Answers like an engine behind the router: worker alternates w0/w1, every completion
/// reports 100 prompt tokens of which 40 cached. Without `Authorization: Bearer
/// API_KEY` it answers 401. `model: "fail"` gets a 500 and `model: "nousage"` a 200
/// without usage, `model: "slow"` answers after the client's timeout;
/// `/v1/completions` names the worker only in the `x-engine-worker` header, and
/// `model: "routed"` only in the router's `x-llm-router-worker` (as a real engine
/// behind the filter does). Like the router, it adds `x-llm-router-decision` only
/// when the request asks with `x-llm-router-explain`.
async fn handle(
    req: Request<Incoming>,
    counter: Arc<AtomicUsize>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let explain = req.headers().contains_key("x-llm-router-explain");
    let authorized = req
        .headers()
        .get("authorization")
        .is_some_and(|v| v.as_bytes() == format!("Bearer {API_KEY}").as_bytes());
    if !authorized {
        let mut resp = Response::new(Full::from("{\"error\":{\"message\":\"bad key\"}}"));
        *resp.status_mut() = StatusCode::UNAUTHORIZED;
        return Ok(resp);
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let worker = format!("w{}", counter.fetch_add(1, Ordering::SeqCst) % 2);
    let usage = json!({"prompt_tokens": 100, "completion_tokens": 5,
                       "prompt_tokens_details": {"cached_tokens": 40}});
    let mut builder = Response::builder();
    if explain {
        builder = builder.header("x-llm-router-decision", "prefix");
    }
    let resp = match v["model"].as_str() {
        Some("fail") => Response::builder()
            .status(StatusCode::INTERNAL_SERVER_ERROR)
            .body(Full::from("{\"error\":{\"message\":\"engine down\"}}")),
        Some("slow") => {
            tokio::time::sleep(std::time::Duration::from_secs(4)).await;
            builder.body(Full::from(
                json!({"worker": worker, "usage": usage}).to_string(),
            ))
        }
        Some("nousage") => builder.body(Full::from(
            json!({"worker": worker, "choices": []}).to_string(),
        )),
        Some("routed") => builder.header("x-llm-router-worker", "r1").body(Full::from(
            json!({"choices": [{"text": "ok"}], "usage": usage}).to_string(),
        )),
        _ if v["stream"] == json!(true) => {
            let sse = format!(
                "data: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
                json!({"choices": [{"delta": {"content": "hi"}}]}),
                json!({"choices": [], "worker": worker, "usage": usage}),
            );
            builder
                .header("content-type", "text/event-stream")
                .body(Full::from(sse))
        }
        _ if path == "/v1/completions" => builder.header("x-engine-worker", worker).body(
            Full::from(json!({"choices": [{"text": "ok"}], "usage": usage}).to_string()),
        ),
        _ => builder
            .header("content-type", "application/json")
            .body(Full::from(
                json!({"worker": worker, "choices": [], "usage": usage}).to_string(),
            )),
    };
    Ok(resp.unwrap_or_else(|_| Response::new(Full::from("builder error"))))
}

async fn start_server() -> u16 {
    start_server_with(None, Arc::default()).await
}

/// The test server, over TLS when given an acceptor; `accepted` counts connections.
async fn start_server_with(
    tls: Option<tokio_rustls::TlsAcceptor>,
    accepted: Arc<AtomicUsize>,
) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let counter = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            accepted.fetch_add(1, Ordering::SeqCst);
            let counter = Arc::clone(&counter);
            let tls = tls.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| handle(req, Arc::clone(&counter)));
                match tls {
                    None => {
                        let _ = http1::Builder::new()
                            .serve_connection(TokioIo::new(stream), svc)
                            .await;
                    }
                    Some(acceptor) => {
                        // A client that does not trust the certificate just fails.
                        if let Ok(stream) = acceptor.accept(stream).await {
                            let _ = http1::Builder::new()
                                .serve_connection(TokioIo::new(stream), svc)
                                .await;
                        }
                    }
                }
            });
        }
    });
    port
}

fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("llm-load-cli");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

async fn generate(out: &PathBuf) {
    let status = Command::new(BIN)
        .args([
            "generate",
            "--sessions",
            "4",
            "--turns",
            "3",
            "--system-prompts",
            "2",
        ])
        .args([
            "--system-prompt-chars",
            "300",
            "--user-chars",
            "50",
            "--stream-fraction",
            "0.5",
        ])
        .arg("--out")
        .arg(out)
        .status()
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spread_urls_get_requests_round_robin_each_on_a_new_connection() {
    let accepted: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::default()).collect();
    let mut ports = Vec::new();
    for a in &accepted {
        ports.push(start_server_with(None, Arc::clone(a)).await);
    }
    let workload = scratch("spread.jsonl");
    generate(&workload).await;
    let url = |p: u16| format!("http://127.0.0.1:{p}");
    let out = Command::new(BIN)
        .args(["run", "--url", &url(ports[0])])
        .args([
            "--spread-url",
            &url(ports[1]),
            "--spread-url",
            &url(ports[2]),
        ])
        .args(["--concurrency", "2"])
        .arg("--workload")
        .arg(&workload)
        .env("OPENAI_API_KEY", API_KEY)
        .output()
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counts: Vec<usize> = accepted.iter().map(|a| a.load(Ordering::SeqCst)).collect();
    assert_eq!(
        counts,
        vec![4, 4, 4],
        "12 requests round robin over 3 URLs, a connection each"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replays_workload_and_reports_json_summary() {
    let port = start_server().await;

    // Generate twice: byte-identical.
    let workload = scratch("workload.jsonl");
    let again = scratch("workload-again.jsonl");
    generate(&workload).await;
    generate(&again).await;
    let mut text = std::fs::read_to_string(&workload).unwrap();
    assert_eq!(text, std::fs::read_to_string(&again).unwrap());
    assert_eq!(text.lines().count(), 12);
    assert!(text.contains("\"stream\":true"), "some streams expected");

    // Add a header-only worker, a 500, a 2xx without usage, and a timeout.
    text.push_str("{\"body\":{\"model\":\"m\",\"prompt\":\"hello\"}}\n\n");
    text.push_str("{\"body\":{\"model\":\"fail\",\"messages\":[]},\"session\":\"x\"}\n");
    text.push_str("{\"body\":{\"model\":\"nousage\",\"messages\":[]},\"session\":\"x\"}\n");
    text.push_str("{\"body\":{\"model\":\"slow\",\"messages\":[]}}\n");
    std::fs::write(&workload, text).unwrap();

    let json_out = scratch("summary.json");
    let out = Command::new(BIN)
        .args([
            "run",
            "--url",
            &format!("http://127.0.0.1:{port}/"),
            "--concurrency",
            "3",
            "--timeout-s",
            "1",
        ])
        .arg("--workload")
        .arg(&workload)
        .arg("--json-out")
        .arg(&json_out)
        .env("OPENAI_API_KEY", API_KEY)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "failed requests make the run fail; stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    let last = stdout.lines().last().unwrap();
    let summary: Value = serde_json::from_str(last).unwrap();
    assert_eq!(summary["requests"], 16, "{last}");
    assert_eq!(summary["errors"], 3, "{last}");
    // Every response but the 500 and the timeout named a worker; w0/w1 alternate.
    let per_worker = summary["per_worker"].as_object().unwrap();
    let named: u64 = per_worker.values().map(|v| v.as_u64().unwrap()).sum();
    assert_eq!(named, 14, "{last}");
    assert_eq!(per_worker.keys().collect::<Vec<_>>(), ["w0", "w1"]);
    assert_eq!(summary["prompt_tokens"], 1300, "{last}");
    assert_eq!(summary["cached_tokens"], 520, "{last}");
    assert_eq!(summary["cached_token_ratio"], 0.4, "{last}");
    assert_eq!(summary["decisions_seen"], json!({"prefix": 14}), "{last}");
    assert!(summary["p50_ms"].as_f64().unwrap() > 0.0);
    assert!(summary["p99_ms"].as_f64().unwrap() >= summary["p50_ms"].as_f64().unwrap());
    assert!(summary["streams"].as_u64().unwrap() > 0);
    assert!(summary["ttft_p50_ms"].as_f64().unwrap() > 0.0, "{last}");
    assert!(summary["wall_s"].as_f64().unwrap() > 0.0);
    // Human report above, with the error reasons.
    assert!(stdout.contains("HTTP 500"), "{stdout}");
    assert!(stdout.contains("timeout after 1.0s"), "{stdout}");
    assert!(stdout.contains("without usage"), "{stdout}");

    let file: Value = serde_json::from_str(&std::fs::read_to_string(&json_out).unwrap()).unwrap();
    assert_eq!(file, summary);

    // A production client's view: no decision asked for, none seen.
    let out = Command::new(BIN)
        .args(["run", "--url", &format!("http://127.0.0.1:{port}")])
        .arg("--workload")
        .arg(&again)
        .arg("--no-explain")
        .env("OPENAI_API_KEY", API_KEY)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["requests"], 12, "{summary}");
    assert_eq!(summary["decisions_seen"], json!({}), "{summary}");
}

#[tokio::test]
async fn setup_failures_exit_non_zero() {
    let bad = scratch("bad.jsonl");
    std::fs::write(&bad, "{\"body\":{\"prompt\":\"x\"}}\n{oops\n").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--url", "http://127.0.0.1:9"])
        .arg("--workload")
        .arg(&bad)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));

    let good = scratch("good.jsonl");
    std::fs::write(&good, "{\"body\":{\"prompt\":\"x\"}}\n").unwrap();
    let out = Command::new(BIN)
        .args(["run", "--url", "ftp://nowhere"])
        .arg("--workload")
        .arg(&good)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
}

/// Open loop with `--request-rate`: no request goes before its Poisson arrival; every
/// request gets a record line with its send time; a worker named only by the router's
/// header is counted; and a missing API key fails the run with the server's 401s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_run_writes_records_and_counts_router_named_workers() {
    let port = start_server().await;
    let workload = scratch("routed.jsonl");
    let line =
        "{\"body\":{\"model\":\"routed\",\"prompt\":\"hello\"},\"path\":\"/v1/completions\"}\n";
    std::fs::write(&workload, line.repeat(12)).unwrap();
    let records = scratch("records.jsonl");
    let run = |key: Option<&str>| {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--url", &format!("http://127.0.0.1:{port}")])
            .args(["--request-rate", "40", "--seed", "5", "--concurrency", "4"])
            .args(["--progress", "always"])
            .arg("--workload")
            .arg(&workload)
            .arg("--records-out")
            .arg(&records)
            .env_remove("OPENAI_API_KEY");
        if let Some(k) = key {
            cmd.args(["--api-key", k]);
        }
        cmd.output()
    };
    let out = run(Some(API_KEY)).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(
        stderr.contains("12/12 done, 0 failed"),
        "progress: {stderr}"
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["per_worker"], json!({"r1": 12}));

    let text = std::fs::read_to_string(&records).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 12);
    let mut arrivals = llm_load::arrivals::Arrivals::poisson(40.0, 5);
    let mut due = 0.0;
    for (i, r) in lines.iter().enumerate() {
        assert_eq!(r["line"], i + 1);
        assert_eq!(r["status"], 200);
        assert_eq!(r["worker"], "r1");
        assert!(r["start_unix_ms"].as_u64().unwrap() > 1_600_000_000_000);
        let start = r["start_ms"].as_f64().unwrap();
        assert!(
            start + 1.0 >= due,
            "request {i} sent at {start} ms, before its arrival at {due} ms"
        );
        due += arrivals.next_gap().as_secs_f64() * 1000.0;
    }

    let out = run(None).await.unwrap();
    assert_eq!(out.status.code(), Some(3), "401s are failures");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("HTTP 401"), "{stdout}");
}

/// `https://` against a server whose certificate a private CA signed: trusted through
/// the system store's `SSL_CERT_FILE`, refused without it (every request fails, exit 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_runs_against_a_server_the_system_store_trusts() {
    let pki = llm_test_pki::private_ca("llm-load test CA");
    let (ca_pem, acceptor) = (pki.ca_pem.clone(), pki.acceptor());
    let port = start_server_with(Some(acceptor), Arc::default()).await;
    let ca_file = scratch("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let workload = scratch("tls.jsonl");
    let line = "{\"body\":{\"model\":\"m\",\"prompt\":\"hello\"}}\n";
    std::fs::write(&workload, line.repeat(3)).unwrap();
    let run = |trust: bool| {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--url", &format!("https://127.0.0.1:{port}")])
            .arg("--workload")
            .arg(&workload)
            .env("OPENAI_API_KEY", API_KEY);
        if trust {
            cmd.env("SSL_CERT_FILE", &ca_file);
        } else {
            cmd.env_remove("SSL_CERT_FILE");
        }
        cmd.output()
    };
    let out = run(true).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        (summary["requests"].clone(), summary["errors"].clone()),
        (json!(3), json!(0))
    );
    let out = run(false).await.unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "an untrusted certificate fails every request"
    );
}

/// A stream whose three text chunks arrive 150 ms apart (chunked HTTP/1.1 written by
/// hand): the record has its time to first token and two inter-token gaps of about
/// the delay each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_report_ttft_and_inter_token_gaps() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                            transfer-encoding: chunked\r\nx-llm-router-worker: w7\r\n\r\n";
                let _ = s.write_all(head.as_bytes()).await;
                let usage =
                    json!({"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 4}});
                let events = [
                    json!({"choices": [{"delta": {"content": "a"}}]}).to_string(),
                    json!({"choices": [{"delta": {"content": "b"}}]}).to_string(),
                    json!({"choices": [{"delta": {"content": "c"}}]}).to_string(),
                    json!({"choices": [], "usage": usage}).to_string(),
                ];
                for (i, e) in events.iter().enumerate() {
                    if i > 0 && i < 3 {
                        tokio::time::sleep(std::time::Duration::from_millis(150)).await;
                    }
                    let data = format!("data: {e}\n\n");
                    let _ = s
                        .write_all(format!("{:x}\r\n{data}\r\n", data.len()).as_bytes())
                        .await;
                    let _ = s.flush().await;
                }
                let done = "data: [DONE]\n\n";
                let _ = s
                    .write_all(format!("{:x}\r\n{done}\r\n0\r\n\r\n", done.len()).as_bytes())
                    .await;
            });
        }
    });
    let workload = scratch("drip.jsonl");
    std::fs::write(
        &workload,
        "{\"body\":{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}}\n",
    )
    .unwrap();
    let records = scratch("drip-records.jsonl");
    let out = Command::new(BIN)
        .args(["run", "--url", &format!("http://127.0.0.1:{port}")])
        .arg("--workload")
        .arg(&workload)
        .arg("--records-out")
        .arg(&records)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "stdout:\n{stdout}");
    let r: Value = serde_json::from_str(std::fs::read_to_string(&records).unwrap().trim()).unwrap();
    let itl: Vec<f64> = r["itl_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(itl.len(), 2, "two gaps between three text reads: {r}");
    assert!(
        itl.iter().all(|g| *g >= 140.0),
        "each gap is the server's delay: {itl:?}"
    );
    let (ttft, total) = (
        r["ttft_ms"].as_f64().unwrap(),
        r["latency_ms"].as_f64().unwrap(),
    );
    assert!(
        ttft + 250.0 <= total,
        "the first token came before both delays: ttft {ttft} of {total} ms"
    );
    assert_eq!(r["worker"], "w7", "named by the router's header");
    let summary: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert!(
        summary["itl_p50_ms"].as_f64().unwrap() >= 140.0,
        "{summary}"
    );
}

/// `generate --family SEED` writes that member of the sweep's family, byte for byte
/// what the library generates for it, and names its load and fleet.
#[tokio::test]
async fn generate_family_writes_the_members_workload() {
    use llm_load::family::Member;
    use llm_load::generate::{generate, to_jsonl};
    let out = scratch("family-5.jsonl");
    let done = Command::new(BIN)
        .args(["generate", "--family", "5", "--out"])
        .arg(&out)
        .output()
        .await
        .unwrap();
    assert!(done.status.success(), "{done:?}");
    let member = Member::draw(5);
    let expected = to_jsonl(&generate(&member.workload)).unwrap();
    assert_eq!(std::fs::read_to_string(&out).unwrap(), expected);
    let said = String::from_utf8_lossy(&done.stderr);
    assert!(said.contains(&member.describe()), "{said}");
}
