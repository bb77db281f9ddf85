//! Buffers: the HTTP bodies while Envoy exposes them, the VM and plugin configuration
//! (the latter only inside `proxy_on_configure`), and an HTTP call's response body.
//! Writes follow Envoy's `Buffer::copyFrom`, which only prepends/replaces at 0 or appends.

use super::{st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::HostState;
use crate::types::codes::{self, Status};
use wasmtime::Result;

/// Registers the buffer hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap(
        "proxy_get_buffer_bytes",
        |mut c: C, kind: i32, start: i32, max: i32, ptr_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let data = match buffer_for_read(g.state(), kind) {
                Ok(data) => data,
                Err(status) => return st(status),
            };
            let (start, max) = (start as u32 as usize, max as u32 as usize);
            if start > data.len() {
                return st(Status::BadArgument);
            }
            let end = start.saturating_add(max).min(data.len());
            if end > start {
                g.return_bytes(&data[start..end], ptr_ptr, size_ptr)?;
            }
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_set_buffer_bytes",
        |mut c: C, kind: i32, start: i32, size: i32, ptr: i32, len: i32| {
            let mut g = Guest::new(&mut c);
            let data = g.read(ptr, len)?;
            let response = match kind {
                codes::buffer::HTTP_REQUEST_BODY => false,
                codes::buffer::HTTP_RESPONSE_BODY => true,
                _ => return st(Status::BadArgument),
            };
            let Some(body) = g.state().body_mut(response) else {
                return st(Status::NotFound);
            };
            st(copy_into_body(
                body,
                start as u32 as usize,
                size as u32 as usize,
                &data,
            ))
        },
    )?;
    Ok(())
}

/// Envoy's `getBuffer` for reads.
fn buffer_for_read(s: &mut HostState, buffer_type: i32) -> Result<Vec<u8>, Status> {
    use codes::buffer::*;
    match buffer_type {
        HTTP_REQUEST_BODY | HTTP_RESPONSE_BODY => Ok(s
            .body_mut(buffer_type == HTTP_RESPONSE_BODY)
            .map(|b| b.clone())
            .unwrap_or_default()),
        VM_CONFIGURATION => Ok(s.cfg.vm_config.clone()),
        PLUGIN_CONFIGURATION if s.in_configure => Ok(s.cfg.plugin_config.clone()),
        HTTP_CALL_RESPONSE_BODY => s
            .call_response
            .as_ref()
            .map(|r| r.body.clone())
            .ok_or(Status::NotFound),
        DOWNSTREAM_DATA | UPSTREAM_DATA | GRPC_RECEIVE_BUFFER | PLUGIN_CONFIGURATION
        | CALL_DATA => Err(Status::NotFound),
        _ => Err(Status::BadArgument),
    }
}

/// Envoy's `Buffer::copyFrom` on an HTTP body.
fn copy_into_body(body: &mut Vec<u8>, start: usize, size: usize, data: &[u8]) -> Status {
    if start == 0 {
        body.drain(..size.min(body.len()));
        body.splice(0..0, data.iter().copied());
    } else if start >= body.len() {
        body.extend_from_slice(data);
    } else {
        return Status::BadArgument;
    }
    Status::Ok
}

#[cfg(test)]
mod tests {
    use super::copy_into_body;
    use crate::types::codes::Status;

    #[test]
    fn set_buffer_follows_envoy_copy_from() {
        let mut body = b"hello".to_vec();
        assert_eq!(copy_into_body(&mut body, 0, 5, b"HELLO!"), Status::Ok);
        assert_eq!(body, b"HELLO!");
        assert_eq!(copy_into_body(&mut body, 0, 0, b">"), Status::Ok);
        assert_eq!(body, b">HELLO!");
        assert_eq!(copy_into_body(&mut body, 0, 3, b"__"), Status::Ok);
        assert_eq!(body, b"__LLO!");
        assert_eq!(copy_into_body(&mut body, 6, 0, b"?"), Status::Ok);
        assert_eq!(body, b"__LLO!?");
        assert_eq!(copy_into_body(&mut body, 2, 1, b"x"), Status::BadArgument);
        assert_eq!(copy_into_body(&mut body, 0, usize::MAX, b""), Status::Ok);
        assert!(body.is_empty());
    }
}
