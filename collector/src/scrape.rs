//! HTTP GET with a hard timeout, shared by engine scrapes and Envoy admin reads, and
//! the one HTTP client (http and https) behind them and the pushes.
//!
//! One pooled HTTP/1 client serves every request so that steady-state scrapes reuse
//! keep-alive connections instead of opening one socket per engine per second.
//! https uses rustls with the ring provider; trusted roots are the system's store,
//! Mozilla's (webpki-roots, so a scratch container without CA files still works) and
//! `--ca-file`.

use anyhow::{bail, Context as _};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::StatusCode;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::CertificateDer;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// The shared client type (requests carry a buffered body: empty for GETs).
pub type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// TLS settings for every https request: system roots (when the system has any),
/// Mozilla's roots, and the certificates of `ca_file`.
pub fn tls_config(ca_file: Option<&Path>) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    // Best effort: a distroless image has no system store, and Mozilla's roots cover it.
    let native = rustls_native_certs::load_native_certs();
    let (_added, _ignored) = roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca_file {
        let flag = format!("--ca-file {}", path.display());
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .with_context(|| format!("{flag}: cannot read it"))?
            .collect::<Result<_, _>>()
            .with_context(|| format!("{flag}: not a PEM file"))?;
        if certs.is_empty() {
            bail!("{flag}: no CERTIFICATE block found (expected PEM certificates)");
        }
        for c in certs {
            roots
                .add(c)
                .with_context(|| format!("{flag}: a certificate is not a usable CA"))?;
        }
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .context("TLS: the ring provider supports no default protocol version")?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Larger responses are refused: a real engine's /metrics is tens of KiB, and a
/// runaway endpoint must not make the collector buffer without bound.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

pub fn client(tls: &Arc<rustls::ClientConfig>) -> HttpClient {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    // The https connector below decides per URL; let https:// through the TCP layer.
    http.enforce_http(false);
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(rustls::ClientConfig::clone(tls))
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    Client::builder(TokioExecutor::new())
        // Idle connections outliving an engine restart would only produce one
        // spurious error; keep them short anyway.
        .pool_idle_timeout(Duration::from_secs(30))
        .build(connector)
}

/// A short, operator-readable cause: "connection refused" rather than hyper's
/// nested "client error (Connect)".
pub fn describe(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut last = err.to_string();
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return match io.kind() {
                std::io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
                std::io::ErrorKind::ConnectionReset => "connection reset".to_string(),
                _ => io.to_string(),
            };
        }
        last = e.to_string();
        cur = e.source();
    }
    last
}

/// GETs `url` and returns the body as text. Errors are strings meant for the
/// snapshot's `error` field and the log.
pub async fn get_text(client: &HttpClient, url: &str, timeout: Duration) -> Result<String, String> {
    let uri: hyper::Uri = url.parse().map_err(|e| format!("bad URL {url}: {e}"))?;
    let req = hyper::Request::get(uri)
        .header(hyper::header::ACCEPT, "text/plain, application/json")
        .body(Full::new(Bytes::new()))
        .map_err(|e| format!("bad request: {e}"))?;
    let fetch = async {
        let resp = client.request(req).await.map_err(|e| describe(&e))?;
        let status = resp.status();
        let body = Limited::new(resp.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|e| format!("reading body: {e}"))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(format!("HTTP {}", status.as_u16()));
        }
        String::from_utf8(body.to_vec()).map_err(|_| "body is not UTF-8".to_string())
    };
    match tokio::time::timeout(timeout, fetch).await {
        Ok(r) => r,
        Err(_) => Err(format!("timeout after {} ms", timeout.as_millis())),
    }
}
