//! Outgoing calls: `proxy_http_call` (recorded as a pending [`HttpCall`] for the test or
//! the simulator to answer; Envoy's argument checks), `proxy_get_status` for the
//! answer's status, and gRPC, which is not simulated (Envoy's statuses, and a warning).

use super::{read_pairs, st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::HostState;
use crate::types::codes::{LogLevel, Status};
use crate::types::values::header_value;
use crate::types::values::{HttpCall, LogSource};
use wasmtime::Result;

/// Registers the HTTP-call, status and gRPC hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap(
        "proxy_http_call",
        |mut c: C,
         up_ptr: i32,
         up_len: i32,
         headers_ptr: i32,
         headers_len: i32,
         body_ptr: i32,
         body_len: i32,
         trailers_ptr: i32,
         trailers_len: i32,
         timeout: i32,
         token_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let cluster = g.read_string(up_ptr, up_len)?;
            let headers = read_pairs(&mut g, headers_ptr, headers_len)?;
            let body = g.read(body_ptr, body_len)?;
            let trailers = read_pairs(&mut g, trailers_ptr, trailers_len)?;
            let (Some(mut headers), Some(trailers)) = (headers, trailers) else {
                return st(Status::BadArgument);
            };
            let s = g.state();
            let required = [":path", ":method", ":authority"];
            if timeout < 0
                || !s.cfg.clusters.contains(&cluster)
                || required.iter().any(|h| header_value(&headers, h).is_none())
            {
                return st(Status::BadArgument);
            }
            if !body.is_empty() {
                headers.retain(|(k, _)| k != "content-length");
                headers.push(("content-length".into(), body.len().to_string()));
            }
            let call = HttpCall {
                token: 0,
                vm: s.vm,
                context_id: s.effective_ctx,
                cluster,
                headers,
                body,
                trailers,
                timeout_ms: timeout as u32,
                dispatched_at_ms: 0,
            };
            let token = s.push_http_call(call);
            g.write_u32(token_ptr, token)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_get_status",
        |mut c: C, code_ptr: i32, ptr_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let (code, message) = g.state().status.clone();
            g.write_u32(code_ptr, code)?;
            g.return_bytes(&message, ptr_ptr, size_ptr)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_grpc_call",
        |mut c: C,
         up_ptr: i32,
         up_len: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32| {
            let mut g = Guest::new(&mut c);
            let cluster = g.read_string(up_ptr, up_len)?;
            grpc_unsupported(g.state(), &cluster)
        },
    )?;
    r.wrap(
        "proxy_grpc_stream",
        |mut c: C,
         up_ptr: i32,
         up_len: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32,
         _: i32| {
            let mut g = Guest::new(&mut c);
            let cluster = g.read_string(up_ptr, up_len)?;
            grpc_unsupported(g.state(), &cluster)
        },
    )?;
    r.wrap("proxy_grpc_send", |_: C, _: i32, _: i32, _: i32, _: i32| {
        st(Status::NotFound)
    })?;
    r.wrap("proxy_grpc_cancel", |_: C, _: i32| st(Status::NotFound))?;
    r.wrap("proxy_grpc_close", |_: C, _: i32| st(Status::NotFound))?;
    Ok(())
}

fn grpc_unsupported(s: &mut HostState, cluster: &str) -> Result<i32> {
    let known = s.cfg.clusters.iter().any(|c| c == cluster);
    s.log(
        LogLevel::Warn,
        LogSource::Host,
        format!("host-sim: gRPC calls are not simulated (cluster {cluster:?})"),
    );
    st(if known {
        Status::InternalFailure
    } else {
        Status::ParseFailure
    })
}
