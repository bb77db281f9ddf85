//! Properties: values the filter set on its stream, builder-provided ones, then the
//! built-in attributes this host knows (plugin name/root id/vm id, connection, request
//! and response attributes), as Envoy's `getProperty` answers them.

use super::{st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::HostState;
use crate::types::codes::Status;
use crate::types::pairs::{serialize_pairs, strings_to_pairs};
use crate::types::values::header_value;
use wasmtime::Result;

/// Registers the property hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap(
        "proxy_get_property",
        |mut c: C, ptr: i32, len: i32, ptr_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let path = g.read(ptr, len)?;
            let Some(value) = property(g.state(), &path) else {
                return st(Status::NotFound);
            };
            g.return_bytes(&value, ptr_ptr, size_ptr)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_set_property",
        |mut c: C, ptr: i32, len: i32, value_ptr: i32, value_len: i32| {
            let mut g = Guest::new(&mut c);
            let path = g.read(ptr, len)?;
            let value = g.read(value_ptr, value_len)?;
            let Some(stream) = g.state().stream() else {
                return st(Status::NotFound);
            };
            stream.properties.insert(path, value);
            st(Status::Ok)
        },
    )?;
    Ok(())
}

fn request_property(s: &HostState, ctx: u32, rest: &[&str]) -> Option<Vec<u8>> {
    let stream = s.streams.get(&ctx)?;
    let h = &stream.req.headers;
    let path = header_value(h, ":path").unwrap_or("");
    let text = |v: &str| Some(v.as_bytes().to_vec());
    match rest {
        ["path"] => text(path),
        ["url_path"] => text(path.split('?').next().unwrap_or("")),
        ["query"] => text(path.split_once('?').map(|(_, q)| q).unwrap_or("")),
        ["host"] => text(header_value(h, ":authority")?),
        ["method"] => text(header_value(h, ":method")?),
        ["scheme"] => text(header_value(h, ":scheme").unwrap_or("http")),
        ["protocol"] => text("HTTP/1.1"),
        ["id"] => text(header_value(h, "x-request-id")?),
        ["useragent"] => text(header_value(h, "user-agent")?),
        ["referer"] => text(header_value(h, "referer")?),
        ["time"] => Some((stream.start_ns as i64).to_le_bytes().to_vec()),
        ["headers"] => Some(serialize_pairs(&strings_to_pairs(h))),
        ["headers", name] => text(header_value(h, &name.to_ascii_lowercase())?),
        _ => None,
    }
}

fn response_property(s: &HostState, ctx: u32, rest: &[&str]) -> Option<Vec<u8>> {
    let stream = s.streams.get(&ctx)?;
    let h = &stream.resp.headers;
    match rest {
        ["code"] => {
            let code: i64 = header_value(h, ":status")?.parse().ok()?;
            Some(code.to_le_bytes().to_vec())
        }
        ["flags"] => Some(stream.response_flags.to_le_bytes().to_vec()),
        ["code_details"] if !stream.code_details.is_empty() => {
            Some(stream.code_details.as_bytes().to_vec())
        }
        ["headers"] if !h.is_empty() => Some(serialize_pairs(&strings_to_pairs(h))),
        ["headers", name] => Some(
            header_value(h, &name.to_ascii_lowercase())?
                .as_bytes()
                .to_vec(),
        ),
        _ => None,
    }
}

/// Envoy's `getProperty`: values set by the filter, builder-provided properties, then the
/// built-in attributes this host knows. Strings are raw bytes, integers 8-byte LE.
fn property(s: &mut HostState, path: &[u8]) -> Option<Vec<u8>> {
    if let Some(v) = s.stream().and_then(|st| st.properties.get(path).cloned()) {
        return Some(v);
    }
    if let Some(v) = s.root_properties.get(path) {
        return Some(v.clone());
    }
    let parts: Vec<String> = path
        .split(|&b| b == 0)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    let dotted = parts.join(".");
    if let Some((_, v)) = s.cfg.properties.iter().find(|(k, _)| *k == dotted) {
        return Some(v.clone());
    }
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let ctx = s.effective_ctx;
    let text = |v: &str| Some(v.as_bytes().to_vec());
    match parts.as_slice() {
        ["plugin_name"] => text(&s.cfg.plugin_name),
        ["plugin_root_id"] => text(&s.cfg.root_id),
        ["plugin_vm_id"] => text(&s.cfg.vm_id),
        ["connection_id"] if s.streams.contains_key(&ctx) => {
            Some((((s.vm as u64) << 32) | ctx as u64).to_le_bytes().to_vec())
        }
        ["source", "address"] if s.streams.contains_key(&ctx) => text("127.0.0.1:40000"),
        ["destination", "address"] if s.streams.contains_key(&ctx) => text("127.0.0.1:10000"),
        ["request", rest @ ..] => request_property(s, ctx, rest),
        ["response", rest @ ..] => response_property(s, ctx, rest),
        _ => None,
    }
}
