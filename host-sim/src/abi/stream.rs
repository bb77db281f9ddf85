//! Stream control: `continue_stream`, `close_stream` and `send_local_response` are
//! deferred until the guest call returns (Envoy's after-VM-call actions) and run by the
//! stream machine in `vm`; `set_effective_context`, foreign functions (only
//! `clear_route_cache` exists) and `proxy_done`.

use super::{read_pairs, st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::{lock, Deferred, HostState};
use crate::types::codes::{self, Status};
use crate::types::values::LocalResponse;
use wasmtime::Result;

/// Registers the stream-control hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap("proxy_continue_stream", |mut c: C, kind: i32| {
        let s = c.data_mut();
        let ctx = s.effective_ctx;
        match kind {
            codes::stream::HTTP_REQUEST | codes::stream::HTTP_RESPONSE => {
                if let Some(stream) = s.stream() {
                    // Envoy forgets the request maps/buffer once the filter continues.
                    stream.req.headers_live = false;
                    stream.req.body_live = false;
                    let response = kind == codes::stream::HTTP_RESPONSE;
                    s.deferred.push_back(Deferred::Continue { ctx, response });
                }
                st(Status::Ok)
            }
            codes::stream::DOWNSTREAM => st(Status::Ok),
            codes::stream::UPSTREAM => st(Status::Unimplemented),
            _ => st(Status::BadArgument),
        }
    })?;
    r.wrap("proxy_close_stream", |mut c: C, kind: i32| {
        let s = c.data_mut();
        let ctx = s.effective_ctx;
        match kind {
            codes::stream::HTTP_REQUEST | codes::stream::HTTP_RESPONSE => {
                if s.stream().is_some() {
                    s.deferred.push_back(Deferred::Close { ctx });
                }
                st(Status::Ok)
            }
            codes::stream::DOWNSTREAM | codes::stream::UPSTREAM => st(Status::Ok),
            _ => st(Status::BadArgument),
        }
    })?;
    r.wrap(
        "proxy_send_local_response",
        |mut c: C,
         status: i32,
         details_ptr: i32,
         details_len: i32,
         body_ptr: i32,
         body_len: i32,
         headers_ptr: i32,
         headers_len: i32,
         grpc_status: i32| {
            let mut g = Guest::new(&mut c);
            let details = g.read_string(details_ptr, details_len)?;
            let body = g.read(body_ptr, body_len)?;
            let Some(headers) = read_pairs(&mut g, headers_ptr, headers_len)? else {
                return st(Status::BadArgument);
            };
            let s = g.state();
            let ctx = s.effective_ctx;
            let reply = LocalResponse {
                status: status as u32,
                headers,
                body,
                details,
                grpc_status,
            };
            if s.stream().is_some() {
                s.deferred.push_back(Deferred::LocalReply { ctx, reply });
            }
            s.stop_next_iteration = true;
            st(Status::Ok)
        },
    )?;
    r.wrap("proxy_set_effective_context", |mut c: C, ctx: i32| {
        let s = c.data_mut();
        let ctx = ctx as u32;
        let live = s.streams.get(&ctx).is_some_and(|st| !st.finished);
        if ctx != s.root_ctx && !live {
            return st(Status::BadArgument);
        }
        s.effective_ctx = ctx;
        st(Status::Ok)
    })?;
    r.wrap(
        "proxy_call_foreign_function",
        |mut c: C, name_ptr: i32, name_len: i32, args_ptr: i32, args_len: i32, _: i32, _: i32| {
            let mut g = Guest::new(&mut c);
            let name = g.read_string(name_ptr, name_len)?;
            g.read(args_ptr, args_len)?;
            let s = g.state();
            let known = name == "clear_route_cache";
            if let Some(stream) = s.stream() {
                stream.foreign_calls.push(name);
                if known {
                    stream.clear_route_cache += 1;
                }
            }
            if !known {
                return st(Status::NotFound);
            }
            lock(&s.shared).clear_route_cache_total += 1;
            st(Status::Ok)
        },
    )?;
    r.wrap("proxy_done", |_: C| st(Status::NotFound))?;
    Ok(())
}
