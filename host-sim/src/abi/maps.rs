//! Header maps: the request and response headers while Envoy exposes them
//! (`HostState::map_for_read` / `map_for_write` say when), and an HTTP call's response
//! headers. Names are lower-cased as Envoy's header maps do.

use super::{read_pairs, st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::HostState;
use crate::types::codes::{self, Status};
use crate::types::pairs::{serialize_pairs, strings_to_pairs};
use crate::types::values::header_value;
use wasmtime::Result;

/// Notes a read of the current stream's request headers: `name`, or `*` for the
/// whole map (`StreamOutcome::request_header_reads`).
fn read_request_header(g: &mut Guest<'_, '_, HostState>, kind: i32, name: &str) {
    if kind == codes::map::HTTP_REQUEST_HEADERS {
        if let Some(stream) = g.state().stream() {
            stream.request_header_reads.push(name.to_string());
        }
    }
}

/// Registers the header-map hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap(
        "proxy_get_header_map_pairs",
        |mut c: C, kind: i32, ptr_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            if !(0..=codes::map::HTTP_CALL_RESPONSE_TRAILERS).contains(&kind) {
                return st(Status::BadArgument);
            }
            let pairs = g.state().map_for_read(kind).unwrap_or_default();
            read_request_header(&mut g, kind, "*");
            g.return_bytes(
                &serialize_pairs(&strings_to_pairs(&pairs)),
                ptr_ptr,
                size_ptr,
            )?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_set_header_map_pairs",
        |mut c: C, kind: i32, ptr: i32, len: i32| {
            let mut g = Guest::new(&mut c);
            let Some(pairs) = read_pairs(&mut g, ptr, len)? else {
                return st(Status::BadArgument);
            };
            let Some(map) = g.state().map_for_write(kind) else {
                return st(Status::BadArgument);
            };
            *map = pairs;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_get_header_map_value",
        |mut c: C, kind: i32, key_ptr: i32, key_len: i32, ptr_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let key = g.read_string(key_ptr, key_len)?.to_ascii_lowercase();
            read_request_header(&mut g, kind, &key);
            let map = match g.state().map_for_read(kind) {
                Ok(map) => map,
                Err(status) => return st(status),
            };
            let Some(value) = header_value(&map, &key) else {
                return st(Status::NotFound);
            };
            g.return_bytes(value.as_bytes(), ptr_ptr, size_ptr)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_replace_header_map_value",
        |mut c: C, kind: i32, key_ptr: i32, key_len: i32, ptr: i32, len: i32| {
            let mut g = Guest::new(&mut c);
            let key = g.read_string(key_ptr, key_len)?.to_ascii_lowercase();
            let value = g.read_string(ptr, len)?;
            let Some(map) = g.state().map_for_write(kind) else {
                return st(Status::BadArgument);
            };
            match map.iter().position(|(k, _)| *k == key) {
                Some(first) => {
                    map[first].1 = value;
                    let mut i = 0;
                    map.retain(|(k, _)| {
                        i += 1;
                        i - 1 == first || *k != key
                    });
                }
                None => map.push((key, value)),
            }
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_add_header_map_value",
        |mut c: C, kind: i32, key_ptr: i32, key_len: i32, ptr: i32, len: i32| {
            let mut g = Guest::new(&mut c);
            let key = g.read_string(key_ptr, key_len)?.to_ascii_lowercase();
            let value = g.read_string(ptr, len)?;
            let Some(map) = g.state().map_for_write(kind) else {
                return st(Status::BadArgument);
            };
            map.push((key, value));
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_remove_header_map_value",
        |mut c: C, kind: i32, key_ptr: i32, key_len: i32| {
            let mut g = Guest::new(&mut c);
            let key = g.read_string(key_ptr, key_len)?.to_ascii_lowercase();
            let Some(map) = g.state().map_for_write(kind) else {
                return st(Status::BadArgument);
            };
            map.retain(|(k, _)| *k != key);
            st(Status::Ok)
        },
    )?;
    Ok(())
}
