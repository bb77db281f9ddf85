//! A tiny blocking HTTP/1.1 client (one request per connection) for admin endpoints (Envoy's, the engines'), where a
//! whole async client would be ceremony.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// `GET path` on `addr`; returns (status, body).
pub fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    request(addr, "GET", path, "")
}

/// `POST path` with a JSON body; returns (status, body).
pub fn post(addr: SocketAddr, path: &str, body: &str) -> Result<(u16, String)> {
    request(addr, "POST", path, body)
}

fn request(addr: SocketAddr, method: &str, path: &str, body: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))
        .with_context(|| format!("connecting to {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let Some(split) = raw.windows(4).position(|w| w == b"\r\n\r\n") else {
        bail!("{method} {path} on {addr}: malformed response");
    };
    let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
    let rest = &raw[split + 4..];
    let body = if head.contains("transfer-encoding: chunked") {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    let body = String::from_utf8_lossy(&body);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// Decodes a chunked body; stops at the last chunk or at the first malformed size.
fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = data.windows(2).position(|w| w == b"\r\n") else {
            break;
        };
        let size_text = String::from_utf8_lossy(&data[..eol]);
        let size_hex = size_text.split(';').next().unwrap_or("").trim();
        let Ok(size) = usize::from_str_radix(size_hex, 16) else {
            break;
        };
        let start = eol + 2;
        if size == 0 || start + size > data.len() {
            break;
        }
        out.extend_from_slice(&data[start..start + size]);
        data = data.get(start + size + 2..).unwrap_or(&[]);
    }
    out
}
