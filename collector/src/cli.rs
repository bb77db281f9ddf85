//! Command-line flags and their validation into a [`Config`].
//!
//! Validation happens once, up front, so the run loop never meets a bad URL or an
//! empty token at 3 a.m.: the process refuses to start instead.

use crate::membership::{self, Worker};
use anyhow::{bail, Context as _};
use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Smallest accepted `--interval-ms`: below it scraping would cost the engines more
/// than the routing gains from fresher numbers.
pub const MIN_INTERVAL_MS: u64 = 50;

/// Scrapes engine Prometheus metrics and pushes load snapshots to the llm-router filter.
#[derive(Debug, Parser)]
#[command(name = "llm-collector", version)]
#[command(group = clap::ArgGroup::new("auth").required(true).args(["token", "token_file"]))]
#[command(group = clap::ArgGroup::new("engines").required(true).args(["engine", "envoy_admin"]))]
pub struct Args {
    /// The filter's stats endpoint, e.g. http://127.0.0.1:10001/llm-router/stats
    /// (repeatable: every snapshot goes to every URL, concurrently; http or https).
    #[arg(long = "push-url", value_name = "URL", required = true)]
    pub push_url: Vec<String>,
    /// Bearer token the filter expects (prefer --token-file: flags show up in `ps`).
    #[arg(long)]
    pub token: Option<String>,
    /// File holding the bearer token (surrounding whitespace is ignored).
    #[arg(long)]
    pub token_file: Option<std::path::PathBuf>,
    /// Scrape-and-push period in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(MIN_INTERVAL_MS..))]
    pub interval_ms: u64,
    /// Window (seconds) over which latency p90s are computed from histogram deltas.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub window_s: u64,
    /// Per-request timeout for scrapes, admin reads and pushes, in milliseconds.
    #[arg(long, default_value_t = 800, value_parser = clap::value_parser!(u64).range(1..))]
    pub scrape_timeout_ms: u64,
    /// A static engine, NAME=http://host:port or NAME=https://... (repeatable).
    #[arg(long = "engine", value_name = "NAME=URL")]
    pub engine: Vec<String>,
    /// Envoy admin base URL; engines are read from its /clusters?format=json.
    #[arg(long)]
    pub envoy_admin: Option<String>,
    /// A cluster named <prefix><NAME> with one host is worker NAME.
    #[arg(long, default_value = "engine_", requires = "envoy_admin")]
    pub cluster_prefix: String,
    /// A cluster whose every host is a worker named by its ip:port (repeatable).
    #[arg(
        long = "pool-cluster",
        value_name = "CLUSTER",
        requires = "envoy_admin"
    )]
    pub pool_cluster: Vec<String>,
    /// Scheme for scraping engines found through --envoy-admin (Envoy's clusters
    /// give only ip:port).
    #[arg(long, default_value = "http", value_parser = ["http", "https"], requires = "envoy_admin")]
    pub engine_scheme: String,
    /// Scrape and push once, print the snapshot JSON to stdout, and exit: 0 when every
    /// push URL accepted it, 1 otherwise.
    #[arg(long)]
    pub once: bool,
    /// Serve GET /healthz and GET /metrics (Prometheus text) on this address, e.g.
    /// 127.0.0.1:9102 (off by default; port 0 picks a free port, logged at start).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// /healthz answers 503 once every push URL has been failing (or has never been
    /// accepted) for this many intervals.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub unhealthy_after_intervals: u32,
    /// PEM file of extra CA certificates trusted for https scrapes and pushes (a
    /// private CA), on top of the system's and Mozilla's roots.
    #[arg(long, value_name = "PEM")]
    pub ca_file: Option<PathBuf>,
    /// Log line format on stderr.
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    pub log_format: crate::logging::LogFormat,
    /// Log filter in RUST_LOG syntax (e.g. `debug`, `llm_collector=debug,info`);
    /// default: the RUST_LOG environment variable, else `info`.
    #[arg(long, value_name = "FILTER")]
    pub log_filter: Option<String>,
    /// Follow an engine's KV cache events, NAME=tcp://host:port (its
    /// `--kv-events-config` endpoint), with `,replay=tcp://host:port` for its replay
    /// endpoint, which lost events are asked again from (repeatable).
    #[arg(long = "kv-events", value_name = "NAME=ENDPOINT[,replay=ENDPOINT]")]
    pub kv_events: Vec<String>,
    /// How the engines tokenize prompts, for `POST /kv/match` on `--listen` (which
    /// engines hold a request's prompt): the model's directory or its
    /// `tokenizer.json` (its `tokenizer_config.json` beside it gives the chat
    /// template), or `engine-mock` (the engine mock's documented tokenizer). Off by
    /// default; needs `--kv-events` and `--listen`.
    #[arg(long, value_name = "PATH|engine-mock", requires_all = ["kv_events", "listen"])]
    pub kv_tokenizer: Option<String>,
    /// A chat template (Jinja) replacing the model's (`--kv-tokenizer`).
    #[arg(long, value_name = "FILE", requires = "kv_tokenizer")]
    pub kv_chat_template: Option<std::path::PathBuf>,
    /// Tokens in an engine's KV block (vLLM's `--block-size`).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=65536))]
    pub kv_block_tokens: u64,
    /// The engines' `PYTHONHASHSEED`, which vLLM's block hash chain starts from (it
    /// must be set, and the same, on every engine; the default is the engine mock's).
    #[arg(long, default_value = llm_kv_events::vllm::DEFAULT_NONE_HASH_SEED)]
    pub kv_hash_seed: String,
    /// The engines publish whole digests as block hashes
    /// (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`) rather than their last 8 bytes.
    #[arg(long)]
    pub kv_digest_hashes: bool,
    /// The engines' hash chain: `vllm` (`--prefix-caching-hash-algo sha256_cbor`) or
    /// `sglang` (its per-page chain; `--kv-block-tokens` is then its `--page-size`).
    #[arg(long, default_value = "vllm", value_parser = ["vllm", "sglang"])]
    pub kv_hash: String,
}

/// One engine's KV event publisher (`--kv-events`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSource {
    pub worker: String,
    /// The PUB socket, `tcp://host:port`.
    pub endpoint: String,
    /// The replay (ROUTER) socket, if the engine has one.
    pub replay: Option<String>,
}

/// Reads `NAME=tcp://host:port[,replay=tcp://host:port]`.
pub fn parse_kv_source(spec: &str) -> anyhow::Result<KvSource> {
    let Some((worker, rest)) = spec.split_once('=') else {
        bail!("expected NAME=tcp://host:port[,replay=tcp://host:port]");
    };
    if worker.is_empty() {
        bail!("the worker name is empty");
    }
    let (endpoint, replay) = match rest.split_once(",replay=") {
        Some((e, r)) => (e, Some(r)),
        None => (rest, None),
    };
    for e in std::iter::once(endpoint).chain(replay) {
        let addr = e.strip_prefix("tcp://").unwrap_or("");
        if addr.parse::<SocketAddr>().is_err() && !addr.contains(':') {
            bail!("`{e}`: a ZMQ endpoint tcp://host:port");
        }
    }
    Ok(KvSource {
        worker: worker.to_string(),
        endpoint: endpoint.to_string(),
        replay: replay.map(str::to_string),
    })
}

/// Where the engine list comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Membership {
    /// `--engine` flags: fixed for the life of the process.
    Static(Vec<Worker>),
    /// Envoy's admin API, so Envoy's service discovery drives membership.
    Envoy {
        admin_url: String,
        cluster_prefix: String,
        pool_clusters: Vec<String>,
        /// `http` or `https`, for the engines' `/metrics`.
        engine_scheme: String,
    },
}

/// Validated settings for the run loop.
#[derive(Debug, Clone)]
pub struct Config {
    /// At least one, no duplicates.
    pub push_urls: Vec<String>,
    pub token: String,
    pub interval: Duration,
    pub window: Duration,
    pub timeout: Duration,
    pub membership: Membership,
    pub once: bool,
    pub listen: Option<SocketAddr>,
    pub unhealthy_after_intervals: u32,
    /// Roots for https: system, Mozilla and `--ca-file`.
    pub tls: Arc<rustls::ClientConfig>,
    /// Engines whose KV events are followed.
    pub kv_events: Vec<KvSource>,
    /// How `/kv/match` matches prompts (`--kv-tokenizer`): `None`, it is off.
    pub kv_matcher: Option<crate::kv_match::Matcher>,
}

impl Args {
    /// Checks the flags together (token present, URLs parse, engines well formed).
    pub fn into_config(self) -> anyhow::Result<Config> {
        let (token, source) = match (&self.token, &self.token_file) {
            (Some(t), _) => (t.trim().to_string(), "--token".to_string()),
            (None, Some(path)) => (
                std::fs::read_to_string(path)
                    .with_context(|| format!("--token-file {}: cannot read it", path.display()))?
                    .trim()
                    .to_string(),
                format!("--token-file {}", path.display()),
            ),
            (None, None) => bail!("one of --token or --token-file is required"),
        };
        if token.is_empty() {
            bail!("{source}: the bearer token is empty (surrounding whitespace is ignored)");
        }
        if hyper::header::HeaderValue::from_str(&format!("Bearer {token}")).is_err() {
            bail!("{source}: the bearer token contains characters not allowed in an HTTP header");
        }
        if self.push_url.is_empty() {
            bail!("--push-url is required (repeat it to push to several Envoys)");
        }
        for (i, url) in self.push_url.iter().enumerate() {
            check_url("--push-url", url)?;
            if self.push_url[..i].contains(url) {
                bail!("--push-url {url}: given twice (each URL gets every snapshot once)");
            }
        }
        let tls = crate::scrape::tls_config(self.ca_file.as_deref())?;
        if self.envoy_admin.is_none() && !self.pool_cluster.is_empty() {
            bail!("--pool-cluster needs --envoy-admin");
        }
        let membership = match (&self.envoy_admin, self.engine.is_empty()) {
            (Some(_), false) => bail!("use either --engine or --envoy-admin, not both"),
            (Some(admin), true) => {
                check_url("--envoy-admin", admin)?;
                Membership::Envoy {
                    admin_url: admin.trim_end_matches('/').to_string(),
                    cluster_prefix: self.cluster_prefix.clone(),
                    pool_clusters: self.pool_cluster.clone(),
                    engine_scheme: self.engine_scheme.clone(),
                }
            }
            (None, false) => {
                let mut workers = Vec::new();
                for spec in &self.engine {
                    let w = membership::parse_static(spec)
                        .with_context(|| format!("--engine {spec}"))?;
                    if workers.iter().any(|o: &Worker| o.name == w.name) {
                        bail!("--engine {spec}: worker `{}` given twice", w.name);
                    }
                    workers.push(w);
                }
                Membership::Static(workers)
            }
            (None, true) => bail!("give engines with --engine NAME=URL or --envoy-admin URL"),
        };
        let mut kv_events: Vec<KvSource> = Vec::new();
        for spec in &self.kv_events {
            let s = parse_kv_source(spec).with_context(|| format!("--kv-events {spec}"))?;
            if kv_events.iter().any(|o| o.worker == s.worker) {
                bail!("--kv-events {spec}: worker `{}` given twice", s.worker);
            }
            kv_events.push(s);
        }
        let kv_matcher = match &self.kv_tokenizer {
            None => None,
            Some(value) => {
                let template = self.kv_chat_template.as_deref();
                let tokenizer = crate::kv_match::Tokenizer::from_flag(value, template)
                    .with_context(|| format!("--kv-tokenizer {value}"))?;
                let hashing = match self.kv_hash.as_str() {
                    "sglang" => crate::kv_match::Hashing::sglang(self.kv_block_tokens as usize),
                    _ => crate::kv_match::Hashing::vllm(
                        self.kv_block_tokens as usize,
                        &self.kv_hash_seed,
                        !self.kv_digest_hashes,
                    ),
                };
                Some(crate::kv_match::Matcher { tokenizer, hashing })
            }
        };
        Ok(Config {
            push_urls: self.push_url,
            token,
            interval: Duration::from_millis(self.interval_ms),
            window: Duration::from_secs(self.window_s),
            timeout: Duration::from_millis(self.scrape_timeout_ms),
            membership,
            once: self.once,
            listen: self.listen,
            unhealthy_after_intervals: self.unhealthy_after_intervals,
            tls,
            kv_events,
            kv_matcher,
        })
    }
}

/// The client speaks HTTP/1 over TCP or TLS, so anything else is refused at start.
fn check_url(flag: &str, url: &str) -> anyhow::Result<()> {
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("{flag} {url}: not a URL"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
        bail!("{flag} {url}: must be an http:// or https:// URL with a host");
    }
    Ok(())
}

/// Whether `url` names this machine (a bearer token sent there in clear text stays on
/// the host); anything else over plain http deserves a warning.
pub fn is_loopback_http(url: &str) -> bool {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return false;
    };
    if uri.scheme_str() != Some("http") {
        return true;
    }
    let host = uri
        .host()
        .unwrap_or("")
        .trim_start_matches('[')
        .trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Config> {
        let mut v = vec!["llm-collector"];
        v.extend_from_slice(args);
        Args::try_parse_from(v)?.into_config()
    }

    const PUSH: &str = "--push-url=http://127.0.0.1:1/llm-router/stats";

    #[test]
    fn prompt_matching_needs_the_events_and_a_listener_and_a_tokenizer_that_loads() {
        let base = [PUSH, "--token", "t", "--engine", "w0=http://127.0.0.1:8001"];
        let with = |extra: &[&str]| {
            let mut a = base.to_vec();
            a.extend_from_slice(extra);
            parse(&a)
        };
        let kv = [
            "--kv-events",
            "w0=tcp://127.0.0.1:5557",
            "--listen",
            "127.0.0.1:0",
        ];
        let on = with(&[&kv[..], &["--kv-tokenizer", "engine-mock"]].concat()).unwrap();
        let m = on.kv_matcher.expect("matching on");
        let vllm_ints = |h: &crate::kv_match::Hashing| match h.chain {
            crate::kv_match::Chain::Vllm { int_hashes, .. } => Some(int_hashes),
            crate::kv_match::Chain::Sglang => None,
        };
        assert_eq!(
            (m.hashing.block_tokens, vllm_ints(&m.hashing)),
            (16, Some(true))
        );
        let sglang = with(
            &[
                &kv[..],
                &["--kv-tokenizer", "engine-mock", "--kv-hash", "sglang"],
            ]
            .concat(),
        )
        .unwrap()
        .kv_matcher
        .unwrap();
        assert_eq!(sglang.hashing, crate::kv_match::Hashing::sglang(16));
        assert!(with(
            &[
                &kv[..],
                &["--kv-tokenizer", "engine-mock", "--kv-hash", "md5"]
            ]
            .concat()
        )
        .is_err());
        let digest = with(
            &[
                &kv[..],
                &[
                    "--kv-tokenizer",
                    "engine-mock",
                    "--kv-digest-hashes",
                    "--kv-block-tokens",
                    "32",
                ],
            ]
            .concat(),
        )
        .unwrap()
        .kv_matcher
        .unwrap();
        assert_eq!(
            (digest.hashing.block_tokens, vllm_ints(&digest.hashing)),
            (32, Some(false))
        );
        assert!(with(&kv).unwrap().kv_matcher.is_none(), "off by default");
        // Without the events or the listener there is nothing to match or serve.
        assert!(with(&["--kv-tokenizer", "engine-mock", "--listen", "127.0.0.1:0"]).is_err());
        assert!(with(&[
            "--kv-tokenizer",
            "engine-mock",
            "--kv-events",
            "w0=tcp://h:1"
        ])
        .is_err());
        let missing = with(&[&kv[..], &["--kv-tokenizer", "/nonexistent/model"]].concat());
        let e = format!("{:#}", missing.unwrap_err());
        assert!(e.contains("--kv-tokenizer /nonexistent/model"), "{e}");
        assert!(with(&[&kv[..], &["--kv-block-tokens", "0"]].concat()).is_err());
    }

    #[test]
    fn kv_event_sources_are_checked_at_start() {
        let base = [PUSH, "--token", "t", "--engine", "w0=http://127.0.0.1:8001"];
        let with = |specs: &[&str]| {
            let mut a = base.to_vec();
            for s in specs {
                a.extend(["--kv-events", s]);
            }
            parse(&a)
        };
        let c = with(&[
            "w0=tcp://127.0.0.1:5557,replay=tcp://127.0.0.1:5558",
            "w1=tcp://engine-1:5557",
        ])
        .unwrap();
        assert_eq!(
            c.kv_events,
            vec![
                KvSource {
                    worker: "w0".into(),
                    endpoint: "tcp://127.0.0.1:5557".into(),
                    replay: Some("tcp://127.0.0.1:5558".into()),
                },
                KvSource {
                    worker: "w1".into(),
                    endpoint: "tcp://engine-1:5557".into(),
                    replay: None,
                },
            ]
        );
        assert!(parse(&base).unwrap().kv_events.is_empty());
        for bad in [
            "w0",
            "=tcp://127.0.0.1:1",
            "w0=http://127.0.0.1:1",
            "w0=tcp://nohost",
            "w0=tcp://127.0.0.1:1,replay=udp://x:1",
        ] {
            let e = with(&[bad]).unwrap_err();
            assert!(format!("{e:#}").contains("--kv-events"), "{bad}: {e:#}");
        }
        let twice = with(&["w0=tcp://127.0.0.1:1", "w0=tcp://127.0.0.1:2"]).unwrap_err();
        assert!(format!("{twice:#}").contains("given twice"));
    }

    #[test]
    fn defaults_and_static_engines() {
        let c = parse(&[PUSH, "--token", "t", "--engine", "w0=http://127.0.0.1:8001"]).unwrap();
        assert_eq!(c.interval, Duration::from_millis(1000));
        assert_eq!(c.window, Duration::from_secs(30));
        assert_eq!(c.timeout, Duration::from_millis(800));
        assert_eq!(c.push_urls, vec!["http://127.0.0.1:1/llm-router/stats"]);
        assert_eq!(c.listen, None);
        assert_eq!(c.unhealthy_after_intervals, 10);
        let Membership::Static(w) = c.membership else {
            panic!()
        };
        assert_eq!(w[0].name, "w0");
        assert_eq!(w[0].address, "127.0.0.1:8001");
        assert_eq!(w[0].metrics_url, "http://127.0.0.1:8001/metrics");
    }

    #[test]
    fn refusals() {
        let e = |a: &[&str]| parse(a).unwrap_err().to_string();
        assert!(
            parse(&[PUSH, "--engine", "w0=http://h:1"]).is_err(),
            "token required"
        );
        assert!(parse(&[PUSH, "--token", "t"]).is_err(), "engines required");
        assert!(parse(&[
            PUSH,
            "--token",
            "t",
            "--engine",
            "w0=http://h:1",
            "--interval-ms",
            "49"
        ])
        .is_err());
        assert!(e(&[PUSH, "--token", " ", "--engine", "w0=http://h:1"]).contains("empty"));
        assert!(e(&[
            PUSH,
            "--token",
            "t",
            "--engine",
            "w0=http://h:1",
            "--engine",
            "w0=http://h:2"
        ])
        .contains("twice"));
        assert!(
            parse(&[
                PUSH,
                "--token",
                "t",
                "--engine",
                "w0=http://h:1",
                "--envoy-admin",
                "http://h:9901"
            ])
            .is_err(),
            "one source only"
        );
        assert!(e(&[
            "--push-url",
            "ftp://x/y",
            "--token",
            "t",
            "--engine",
            "w0=http://h:1"
        ])
        .contains("--push-url ftp://x/y: must be an http:// or https://"));
        assert!(
            e(&[PUSH, PUSH, "--token", "t", "--engine", "w0=http://h:1"]).contains("given twice")
        );
        assert!(e(&[
            PUSH,
            "--token",
            "t",
            "--engine",
            "w0=http://h:1",
            "--ca-file",
            "/nonexistent/ca.pem"
        ])
        .contains("--ca-file /nonexistent/ca.pem"));
        assert!(
            parse(&["--token", "t", "--engine", "w0=http://h:1"]).is_err(),
            "a push URL is required"
        );
        assert!(
            parse(&[
                PUSH,
                "--token",
                "t",
                "--engine",
                "w0=http://h:1",
                "--pool-cluster",
                "p"
            ])
            .is_err(),
            "pool needs admin"
        );
    }

    #[test]
    fn several_push_urls_https_and_listen() {
        let c = parse(&[
            PUSH,
            "--push-url",
            "https://envoy-1.example:10001/llm-router/stats",
            "--token",
            "t",
            "--engine",
            "w0=https://127.0.0.1:8001",
            "--listen",
            "127.0.0.1:9102",
        ])
        .unwrap();
        assert_eq!(c.push_urls.len(), 2);
        assert_eq!(c.listen, Some("127.0.0.1:9102".parse().unwrap()));
        let Membership::Static(w) = c.membership else {
            panic!()
        };
        assert_eq!(w[0].metrics_url, "https://127.0.0.1:8001/metrics");
        assert!(is_loopback_http("http://127.0.0.1:1/x"));
        assert!(is_loopback_http("http://localhost:1/x"));
        assert!(is_loopback_http("http://[::1]:1/x"));
        assert!(is_loopback_http("https://envoy:1/x"));
        assert!(!is_loopback_http("http://envoy:1/x"));
    }

    #[test]
    fn envoy_mode_and_token_file() {
        let dir = std::env::temp_dir().join(format!("llm-collector-cli-{}", std::process::id()));
        std::fs::write(&dir, "s3cret\n").unwrap();
        let c = parse(&[
            PUSH,
            "--token-file",
            dir.to_str().unwrap(),
            "--envoy-admin",
            "http://127.0.0.1:9901/",
            "--pool-cluster",
            "pool",
        ])
        .unwrap();
        std::fs::remove_file(&dir).ok();
        assert_eq!(c.token, "s3cret");
        assert_eq!(c.push_urls.len(), 1);
        assert_eq!(
            c.membership,
            Membership::Envoy {
                admin_url: "http://127.0.0.1:9901".into(),
                cluster_prefix: "engine_".into(),
                pool_clusters: vec!["pool".into()],
                engine_scheme: "http".into(),
            }
        );
    }
}
