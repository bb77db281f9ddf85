//! Starts the real `engine-mock` binary and talks HTTP/1.1 to it with a tiny std-only client.

mod support;

use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};
use support::Running;

/// A running engine; killed (and reaped) on drop, so no test path leaks a process.
struct Engine {
    proc: Running,
    port: u16,
    /// Prefill role: the bootstrap server's port.
    bootstrap: Option<u16>,
}

impl Engine {
    fn start(worker: &str, extra: &[&str]) -> Engine {
        let args = [&["--port", "0", "--worker-id", worker], extra].concat();
        let proc = Running::start(&args);
        let line = &proc.line;
        let (head, port) = line
            .trim_end()
            .split_once(" listening on 127.0.0.1:")
            .unwrap_or_else(|| panic!("unexpected startup line {line:?}"));
        let port = port.parse().expect("port number");
        let head = head
            .strip_prefix(&format!("engine-mock {worker}"))
            .unwrap_or_else(|| panic!("unexpected startup line {line:?}"));
        let bootstrap = head
            .strip_prefix(" bootstrap 127.0.0.1:")
            .map(|p| p.parse().expect("bootstrap port"));
        Engine {
            proc,
            port,
            bootstrap,
        }
    }

    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> Reply {
        http(
            self.port,
            method,
            path,
            body.map(|b| b.to_string()).as_deref(),
        )
    }
}

struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {}", self.body))
    }
}

fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> Reply {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let body = body.unwrap_or("");
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).expect("read response");
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("header end");
    let head = String::from_utf8(raw[..split].to_vec()).unwrap();
    let mut rest = raw[split + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        rest = dechunk(&rest);
    }
    Reply {
        status,
        headers,
        body: String::from_utf8(rest).unwrap(),
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size_line = std::str::from_utf8(&data[..eol]).unwrap();
        let size = usize::from_str_radix(size_line.split(';').next().unwrap().trim(), 16).unwrap();
        data = &data[eol + 2..];
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[..size]);
        data = &data[size + 2..];
    }
}

/// Sample lines as (name, labels, value); panics on anything that is not valid text format.
fn parse_metrics(text: &str) -> Vec<(String, String, f64)> {
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix('#') {
            assert!(
                rest.starts_with(" HELP ") || rest.starts_with(" TYPE "),
                "bad comment {line:?}"
            );
            continue;
        }
        let open = line
            .find('{')
            .unwrap_or_else(|| panic!("no labels: {line:?}"));
        let close = line
            .rfind('}')
            .unwrap_or_else(|| panic!("no labels: {line:?}"));
        let name = &line[..open];
        assert!(
            !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad name {line:?}"
        );
        let labels = &line[open + 1..close];
        for pair in labels.split(',') {
            let (k, v) = pair
                .split_once('=')
                .unwrap_or_else(|| panic!("bad label {line:?}"));
            assert!(
                !k.is_empty() && v.starts_with('"') && v.ends_with('"'),
                "{line:?}"
            );
        }
        let value = line[close + 1..]
            .strip_prefix(' ')
            .expect("space before value");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value {line:?}")),
        };
        samples.push((name.to_string(), labels.to_string(), value));
    }
    samples
}

fn metric(samples: &[(String, String, f64)], name: &str) -> f64 {
    samples
        .iter()
        .find(|(n, _, _)| n == name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .2
}

fn chat(content: &str) -> Value {
    json!({"model": "m1", "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": content}
    ]})
}

#[test]
fn shared_prefix_streaming_and_metrics() {
    let engine = Engine::start("w-test", &["--prefill-us-per-token", "1"]);
    let prefix = "The same long shared document prefix. ".repeat(20);

    let first = engine.request(
        "POST",
        "/v1/chat/completions",
        Some(&chat(&format!("{prefix} question one"))),
    );
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("x-engine-worker"), Some("w-test"));
    let v = first.json();
    assert_eq!(v["worker"], "w-test");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "m1");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    let second = engine.request(
        "POST",
        "/v1/chat/completions",
        Some(&chat(&format!("{prefix} question two"))),
    );
    let v2 = second.json();
    assert_eq!(second.header("x-engine-worker"), Some("w-test"));
    assert_eq!(v2["worker"], "w-test");
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let prompt = v2["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached > 0 && cached < prompt, "cached {cached} of {prompt}");

    // Streaming: one chunk per token, then usage with empty choices, then [DONE].
    let mut body = chat(&format!("{prefix} question three"));
    body["stream"] = json!(true);
    body["max_tokens"] = json!(5);
    let streamed = engine.request("POST", "/v1/chat/completions", Some(&body));
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
    assert_eq!(streamed.header("x-engine-worker"), Some("w-test"));
    let events: Vec<&str> = streamed
        .body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data: prefix"))
        .collect();
    assert_eq!(events.len(), 5 + 2, "{}", streamed.body);
    assert_eq!(*events.last().unwrap(), "[DONE]");
    let text: String = events[..5]
        .iter()
        .map(|e| {
            let c: Value = serde_json::from_str(e).unwrap();
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(text, "tok0 tok1 tok2 tok3 tok4");
    let usage: Value = serde_json::from_str(events[5]).unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["worker"], "w-test");
    assert_eq!(usage["usage"]["completion_tokens"], 5);
    assert!(
        usage["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );

    // Completions and SGLang /generate share the cache.
    let c = engine.request(
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": [prefix.clone()]})),
    );
    assert_eq!(c.json()["object"], "text_completion");
    let g = engine.request("POST", "/generate", Some(&json!({"text": prefix})));
    assert!(g.json()["meta_info"]["cached_tokens"].as_u64().unwrap() > 0);

    // Errors are OpenAI-shaped and still carry the worker header.
    let bad = http(
        engine.port,
        "POST",
        "/v1/chat/completions",
        Some("not json"),
    );
    assert_eq!(bad.status, 400);
    assert_eq!(bad.header("x-engine-worker"), Some("w-test"));
    assert_eq!(bad.json()["error"]["type"], "invalid_request_error");
    let missing = engine.request("POST", "/v1/completions", Some(&json!({"model": "x"})));
    assert_eq!(missing.status, 400);
    let nf = engine.request("GET", "/nope", None);
    assert_eq!(nf.status, 404);
    assert!(nf.json()["error"]["message"].is_string());
    assert_eq!(engine.request("GET", "/health", None).body, "ok");
    assert_eq!(
        engine.request("GET", "/v1/models", None).json()["data"][0]["id"],
        "mock"
    );

    let m = engine.request("GET", "/metrics", None);
    assert_eq!(m.status, 200);
    assert!(m.header("content-type").unwrap().contains("version=0.0.4"));
    let samples = parse_metrics(&m.body);
    assert_eq!(metric(&samples, "vllm:request_success_total"), 5.0);
    assert_eq!(
        metric(&samples, "vllm:time_to_first_token_seconds_count"),
        5.0
    );
    assert!(metric(&samples, "vllm:prefix_cache_hits_total") > 0.0);
    assert!(
        metric(&samples, "vllm:prefix_cache_queries_total")
            > metric(&samples, "vllm:prefix_cache_hits_total")
    );
    let kv = metric(&samples, "vllm:kv_cache_usage_perc");
    assert!(kv > 0.0 && kv <= 1.0);
    // vLLM's info metric describes the cache, not a model: no model name, as there.
    let (info, series): (Vec<_>, Vec<_>) = samples
        .iter()
        .partition(|(name, _, _)| name == "vllm:cache_config_info");
    assert!(series
        .iter()
        .all(|(_, labels, _)| labels.contains("model_name=\"mock\"")));
    let [(_, labels, one)] = info.as_slice() else {
        panic!("one cache_config_info: {info:?}")
    };
    assert_eq!(*one, 1.0);
    assert!(
        labels.contains("num_gpu_blocks=\"4096\"") && labels.contains("block_size=\"16\""),
        "the default cache: 4096 blocks of 64 chars, 16 tokens each: {labels}"
    );
}

#[test]
fn max_running_queues_the_second_request() {
    let engine = Engine::start("w-q", &["--max-running", "1", "--ttft-ms", "1500"]);
    let port = engine.port;
    let slow = |tag: &'static str| {
        thread::spawn(move || {
            http(
                port,
                "POST",
                "/v1/completions",
                Some(&json!({"prompt": tag, "max_tokens": 1}).to_string()),
            )
        })
    };
    let a = slow("first");
    thread::sleep(Duration::from_millis(300));
    let b = slow("second");

    let deadline = Instant::now() + Duration::from_secs(1);
    let (mut waiting, mut running) = (0.0, 0.0);
    while Instant::now() < deadline {
        let samples = parse_metrics(&engine.request("GET", "/metrics", None).body);
        waiting = metric(&samples, "vllm:num_requests_waiting");
        running = metric(&samples, "vllm:num_requests_running");
        if waiting == 1.0 {
            break;
        }
        thread::sleep(Duration::from_millis(50));
    }
    assert_eq!((waiting, running), (1.0, 1.0));

    assert_eq!(a.join().unwrap().status, 200);
    assert_eq!(b.join().unwrap().status, 200);
    let samples = parse_metrics(&engine.request("GET", "/metrics", None).body);
    assert_eq!(metric(&samples, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(metric(&samples, "vllm:num_requests_running"), 0.0);
}

#[test]
fn a_prefix_still_being_prefilled_is_waited_for() {
    // 3200 chars (800 tokens) at 1 ms a token: the first request prefills for
    // 800 ms. A second one on the same document 200 ms in finds it cached but
    // not computed, and waits for it as SGLang does (the mock's default).
    let engine = Engine::start("w-p", &["--prefill-us-per-token", "1000"]);
    let port = engine.port;
    let document = "d".repeat(3200);
    let ask = move |question: &'static str| {
        let body = json!({"prompt": format!("{document}{question}"), "max_tokens": 1});
        thread::spawn(move || {
            let sent = Instant::now();
            let reply = http(port, "POST", "/v1/completions", Some(&body.to_string()));
            (reply, sent.elapsed())
        })
    };
    let first = ask("first?");
    thread::sleep(Duration::from_millis(200));
    let second = ask("again?");
    let (reply, _) = first.join().unwrap();
    assert_eq!(reply.status, 200);
    let (reply, took) = second.join().unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        800,
        "the document is reported cached"
    );
    assert!(
        took >= Duration::from_millis(400),
        "its first token waited for the document's prefill: {took:?}"
    );
}

#[test]
fn admin_latency_and_sglang_metrics() {
    let engine = Engine::start("w-s", &["--metrics-style", "sglang"]);
    let r = engine.request("POST", "/admin/latency", Some(&json!({"ttft_ms": 200})));
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["ttft_ms"], 200.0);
    let bad = engine.request("POST", "/admin/latency", Some(&json!({"ttft_ms": -1})));
    assert_eq!(bad.status, 400);
    let r = engine.request("POST", "/admin/latency", Some(&json!({"tpot_ms": 30})));
    assert_eq!(
        (r.json()["tpot_ms"].as_f64(), r.json()["ttft_ms"].as_f64()),
        (Some(30.0), Some(200.0)),
        "tpot_ms alone changes only the decode delay"
    );
    engine.request("POST", "/admin/latency", Some(&json!({"tpot_ms": 0})));

    let t = Instant::now();
    let g = engine.request("POST", "/generate", Some(&json!({"text": "hello"})));
    assert_eq!(g.status, 200);
    assert!(t.elapsed() >= Duration::from_millis(200));

    let samples = parse_metrics(&engine.request("GET", "/metrics", None).body);
    assert_eq!(metric(&samples, "sglang:num_queue_reqs"), 0.0);
    assert_eq!(metric(&samples, "sglang:num_running_reqs"), 0.0);
    assert_eq!(
        metric(&samples, "sglang:time_to_first_token_seconds_count"),
        1.0
    );
    metric(&samples, "sglang:token_usage");
    metric(&samples, "sglang:cache_hit_rate");
}

#[test]
fn client_disconnect_releases_the_slot() {
    let engine = Engine::start(
        "w-d",
        &["--max-running", "1", "--decode-ms-per-token", "50"],
    );
    {
        let mut s = TcpStream::connect(("127.0.0.1", engine.port)).unwrap();
        let body = json!({"prompt": "x", "stream": true, "max_tokens": 64}).to_string();
        write!(
            s,
            "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut buf = [0u8; 256];
        let _ = s.read(&mut buf).unwrap(); // headers + first token arrived: it is running
    } // dropped: client went away mid-stream
    let t = Instant::now();
    let r = engine.request(
        "POST",
        "/v1/completions",
        Some(&json!({"prompt": "y", "max_tokens": 1})),
    );
    assert_eq!(r.status, 200);
    // 64 tokens * 50 ms would hold the slot ~3 s if it leaked until completion.
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

#[test]
fn sigterm_exits_cleanly() {
    let mut engine = Engine::start("w-t", &[]);
    let pid = engine.proc.child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(st) = engine.proc.child.try_wait().unwrap() {
            assert!(st.success(), "{st:?}");
            break;
        }
        assert!(Instant::now() < deadline, "did not exit on SIGTERM");
        thread::sleep(Duration::from_millis(20));
    }
}

fn pd_body(content: &str, bootstrap_port: u16, room: u64) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 4,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap_port,
        "bootstrap_room": room,
    })
}

#[test]
fn prefill_and_decode_meet_by_room() {
    let prefill = Engine::start("p0", &["--role", "prefill"]);
    let decode = Engine::start("d0", &["--role", "decode", "--kv-wait-ms", "2000"]);
    let bport = prefill
        .bootstrap
        .expect("a prefill engine runs a bootstrap server");
    let prompt = "a long shared system prompt. ".repeat(20);
    let mut cached = Vec::new();
    for room in [41_u64, 42] {
        let body = pd_body(&prompt, bport, room);
        // The decode arrives first and waits for the prefill of its room.
        let port = decode.port;
        let waiting = {
            let body = body.clone();
            thread::spawn(move || {
                http(
                    port,
                    "POST",
                    "/v1/chat/completions",
                    Some(&body.to_string()),
                )
            })
        };
        thread::sleep(Duration::from_millis(50));
        let p = prefill.request("POST", "/v1/chat/completions", Some(&body));
        assert_eq!(p.status, 200, "{}", p.body);
        assert_eq!(
            p.json()["usage"]["completion_tokens"],
            1,
            "prefill stops at the first token"
        );
        let d = waiting.join().unwrap();
        assert_eq!(d.status, 200, "{}", d.body);
        assert_eq!(d.header("x-engine-prefill-worker"), Some("p0"));
        assert_eq!(d.header("x-engine-worker"), Some("d0"));
        assert_eq!(d.json()["usage"]["completion_tokens"], 4);
        cached.push(
            d.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap(),
        );
    }
    assert_eq!(cached[0], 0, "a cold prefill");
    assert!(
        cached[1] > 0,
        "the decode reports the prefill engine's cache hit: {cached:?}"
    );

    // A room no prefill engine computed fails the decode instead of hanging.
    let orphan = decode.request(
        "POST",
        "/v1/chat/completions",
        Some(&pd_body("x", bport, 99)),
    );
    assert_eq!(orphan.status, 500, "{}", orphan.body);
    assert!(
        orphan.body.contains("kv_transfer_failed"),
        "{}",
        orphan.body
    );
    // Both roles need the bootstrap fields.
    let plain = json!({"messages": [{"role": "user", "content": "x"}]});
    for e in [&prefill, &decode] {
        let r = e.request("POST", "/v1/chat/completions", Some(&plain));
        assert_eq!(r.status, 400, "{}", r.body);
    }
    let metrics = decode.request("GET", "/metrics", None).body;
    assert!(
        metrics.contains("engine_mock:pd_pairs_total{model_name=\"mock\"} 2\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("engine_mock:pd_kv_failures_total{model_name=\"mock\"} 1\n"),
        "{metrics}"
    );
}
