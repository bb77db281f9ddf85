//! The `env` import module: every proxy-wasm ABI 0.2.1 hostcall, the way Envoy 1.40
//! answers it. A bad argument returns a [`Status`] to the guest; a broken pointer traps.

use crate::abi::{self, deserialize_pairs, serialize_pairs, LogLevel, Status};
use crate::fault::Hostcall;
use crate::memory::Guest;
use crate::state::{lock, Deferred, HostState, MetricValue};
use crate::{HttpCall, LocalResponse, LogSource};
use wasmtime::{Caller, IntoFunc, Linker, Result};

type C<'a> = Caller<'a, HostState>;

/// Registers functions of one import module and remembers their names, so that the
/// module's imports can be checked against what is implemented.
pub(crate) struct Registry<'a> {
    pub linker: &'a mut Linker<HostState>,
    pub module: &'static str,
    pub names: Vec<&'static str>,
}

impl Registry<'_> {
    /// Registers a hostcall that answers a status (or errno), behind fault injection.
    pub fn wrap<P>(&mut self, name: &'static str, f: impl Hostcall<P>) -> Result<()> {
        f.define(self.linker, self.module, name)?;
        self.names.push(name);
        Ok(())
    }

    /// Registers a function that answers no status (`proc_exit`): it cannot be faulted.
    pub fn wrap_plain<P, A>(
        &mut self,
        name: &'static str,
        f: impl IntoFunc<HostState, P, A>,
    ) -> Result<()> {
        self.linker.func_wrap(self.module, name, f)?;
        self.names.push(name);
        Ok(())
    }
}

fn st(status: Status) -> Result<i32> {
    Ok(status.code())
}

fn to_strings(pairs: abi::Pairs) -> Vec<(String, String)> {
    pairs
        .into_iter()
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(&k).to_ascii_lowercase(),
                String::from_utf8_lossy(&v).into_owned(),
            )
        })
        .collect()
}

fn to_bytes(pairs: &[(String, String)]) -> abi::Pairs {
    pairs
        .iter()
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

/// Reads a pairs-encoded header list from the guest; `None` when malformed.
fn read_pairs(g: &mut Guest, ptr: i32, len: i32) -> Result<Option<Vec<(String, String)>>> {
    Ok(deserialize_pairs(&g.read(ptr, len)?).map(to_strings))
}

fn header<'h>(headers: &'h [(String, String)], name: &str) -> Option<&'h str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Envoy's `getBuffer` for reads.
fn buffer_for_read(s: &mut HostState, buffer_type: i32) -> Result<Vec<u8>, Status> {
    use abi::buffer::*;
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

fn request_property(s: &HostState, ctx: u32, rest: &[&str]) -> Option<Vec<u8>> {
    let stream = s.streams.get(&ctx)?;
    let h = &stream.req.headers;
    let path = header(h, ":path").unwrap_or("");
    let text = |v: &str| Some(v.as_bytes().to_vec());
    match rest {
        ["path"] => text(path),
        ["url_path"] => text(path.split('?').next().unwrap_or("")),
        ["query"] => text(path.split_once('?').map(|(_, q)| q).unwrap_or("")),
        ["host"] => text(header(h, ":authority")?),
        ["method"] => text(header(h, ":method")?),
        ["scheme"] => text(header(h, ":scheme").unwrap_or("http")),
        ["protocol"] => text("HTTP/1.1"),
        ["id"] => text(header(h, "x-request-id")?),
        ["useragent"] => text(header(h, "user-agent")?),
        ["referer"] => text(header(h, "referer")?),
        ["time"] => Some((stream.start_ns as i64).to_le_bytes().to_vec()),
        ["headers"] => Some(serialize_pairs(&to_bytes(h))),
        ["headers", name] => text(header(h, &name.to_ascii_lowercase())?),
        _ => None,
    }
}

fn response_property(s: &HostState, ctx: u32, rest: &[&str]) -> Option<Vec<u8>> {
    let stream = s.streams.get(&ctx)?;
    let h = &stream.resp.headers;
    match rest {
        ["code"] => {
            let code: i64 = header(h, ":status")?.parse().ok()?;
            Some(code.to_le_bytes().to_vec())
        }
        ["headers"] if !h.is_empty() => Some(serialize_pairs(&to_bytes(h))),
        ["headers", name] => Some(header(h, &name.to_ascii_lowercase())?.as_bytes().to_vec()),
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

/// Registers all `env.proxy_*` hostcalls.
pub(crate) fn register(r: &mut Registry) -> Result<()> {
    r.wrap("proxy_log", |mut c: C, level: i32, ptr: i32, len: i32| {
        let mut g = Guest::new(&mut c);
        let message = g.read_string(ptr, len)?;
        let Some(level) = LogLevel::from_raw(level) else {
            return st(Status::BadArgument);
        };
        g.state().log(level, LogSource::Proxy, message);
        st(Status::Ok)
    })?;
    r.wrap("proxy_get_log_level", |mut c: C, ptr: i32| {
        let mut g = Guest::new(&mut c);
        let level = g.state().cfg.log_level.raw();
        g.write_u32(ptr, level as u32)?;
        st(Status::Ok)
    })?;
    r.wrap(
        "proxy_get_current_time_nanoseconds",
        |mut c: C, ptr: i32| {
            let mut g = Guest::new(&mut c);
            let now = g.state().now_ns();
            g.write_u64(ptr, now)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_set_tick_period_milliseconds",
        |mut c: C, period: i32| {
            let s = c.data_mut();
            s.tick_period_ms = period as u32 as u64;
            let now = s.now_ns();
            let period_ns = s.tick_period_ms * 1_000_000;
            s.next_tick_ns = (period_ns > 0).then(|| now.saturating_add(period_ns));
            st(Status::Ok)
        },
    )?;
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
                abi::buffer::HTTP_REQUEST_BODY => false,
                abi::buffer::HTTP_RESPONSE_BODY => true,
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
    r.wrap(
        "proxy_get_header_map_pairs",
        |mut c: C, kind: i32, ptr_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            if !(0..=abi::map::HTTP_CALL_RESPONSE_TRAILERS).contains(&kind) {
                return st(Status::BadArgument);
            }
            let pairs = g.state().map_for_read(kind).unwrap_or_default();
            g.return_bytes(&serialize_pairs(&to_bytes(&pairs)), ptr_ptr, size_ptr)?;
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
            let map = match g.state().map_for_read(kind) {
                Ok(map) => map,
                Err(status) => return st(status),
            };
            let Some(value) = header(&map, &key) else {
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
    r.wrap(
        "proxy_get_shared_data",
        |mut c: C, key_ptr: i32, key_len: i32, ptr_ptr: i32, size_ptr: i32, cas_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let key = g.read_string(key_ptr, key_len)?;
            let entry = lock(&g.state().shared).data.get(&key).cloned();
            let Some((value, cas)) = entry else {
                return st(Status::NotFound);
            };
            g.return_bytes(&value, ptr_ptr, size_ptr)?;
            g.write_u32(cas_ptr, cas)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_set_shared_data",
        |mut c: C, key_ptr: i32, key_len: i32, ptr: i32, len: i32, cas: i32| {
            let mut g = Guest::new(&mut c);
            let key = g.read_string(key_ptr, key_len)?;
            let value = g.read(ptr, len)?;
            let status = lock(&g.state().shared).set_data(&key, value, cas as u32);
            st(status)
        },
    )?;
    r.wrap(
        "proxy_register_shared_queue",
        |mut c: C, ptr: i32, len: i32, token_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let name = g.read_string(ptr, len)?;
            let s = g.state();
            let (vm, ctx, key) = (s.vm, s.root_ctx, (s.cfg.vm_id.clone(), name));
            let token = {
                let mut shared = lock(&s.shared);
                let token = match shared.queue_names.get(&key) {
                    Some(token) => *token,
                    None => {
                        let token = shared.next_queue_token;
                        shared.next_queue_token = token.wrapping_add(1).max(1);
                        shared.queue_names.insert(key, token);
                        token
                    }
                };
                let queue = shared.queues.entry(token).or_insert(crate::state::Queue {
                    vm,
                    context_id: ctx,
                    items: Default::default(),
                });
                (queue.vm, queue.context_id) = (vm, ctx);
                token
            };
            g.write_u32(token_ptr, token)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_resolve_shared_queue",
        |mut c: C, vm_ptr: i32, vm_len: i32, ptr: i32, len: i32, token_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let mut vm_id = g.read_string(vm_ptr, vm_len)?;
            let name = g.read_string(ptr, len)?;
            if vm_id.is_empty() {
                vm_id = g.state().cfg.vm_id.clone();
            }
            let token = lock(&g.state().shared)
                .queue_names
                .get(&(vm_id, name))
                .copied();
            let Some(token) = token else {
                return st(Status::NotFound);
            };
            g.write_u32(token_ptr, token)?;
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_enqueue_shared_queue",
        |mut c: C, token: i32, ptr: i32, len: i32| {
            let mut g = Guest::new(&mut c);
            let value = g.read(ptr, len)?;
            let mut shared = lock(&g.state().shared);
            let Some(queue) = shared.queues.get_mut(&(token as u32)) else {
                return st(Status::NotFound);
            };
            queue.items.push_back(value);
            let ready = (queue.vm, queue.context_id, token as u32);
            shared.queue_ready.push_back(ready);
            st(Status::Ok)
        },
    )?;
    r.wrap(
        "proxy_dequeue_shared_queue",
        |mut c: C, token: i32, ptr_ptr: i32, size_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let item = {
                let mut shared = lock(&g.state().shared);
                let Some(queue) = shared.queues.get_mut(&(token as u32)) else {
                    return st(Status::NotFound);
                };
                queue.items.pop_front()
            };
            let Some(item) = item else {
                return st(Status::Empty);
            };
            g.return_bytes(&item, ptr_ptr, size_ptr)?;
            st(Status::Ok)
        },
    )?;
    r.wrap("proxy_continue_stream", |mut c: C, kind: i32| {
        let s = c.data_mut();
        let ctx = s.effective_ctx;
        match kind {
            abi::stream::HTTP_REQUEST | abi::stream::HTTP_RESPONSE => {
                if let Some(stream) = s.stream() {
                    // Envoy forgets the request maps/buffer once the filter continues.
                    stream.req.headers_live = false;
                    stream.req.body_live = false;
                    let response = kind == abi::stream::HTTP_RESPONSE;
                    s.deferred.push_back(Deferred::Continue { ctx, response });
                }
                st(Status::Ok)
            }
            abi::stream::DOWNSTREAM => st(Status::Ok),
            abi::stream::UPSTREAM => st(Status::Unimplemented),
            _ => st(Status::BadArgument),
        }
    })?;
    r.wrap("proxy_close_stream", |mut c: C, kind: i32| {
        let s = c.data_mut();
        let ctx = s.effective_ctx;
        match kind {
            abi::stream::HTTP_REQUEST | abi::stream::HTTP_RESPONSE => {
                if s.stream().is_some() {
                    s.deferred.push_back(Deferred::Close { ctx });
                }
                st(Status::Ok)
            }
            abi::stream::DOWNSTREAM | abi::stream::UPSTREAM => st(Status::Ok),
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
                || required.iter().any(|h| header(&headers, h).is_none())
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
    r.wrap(
        "proxy_define_metric",
        |mut c: C, kind: i32, ptr: i32, len: i32, id_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let name = format!("wasmcustom.{}", g.read_string(ptr, len)?);
            let initial = match kind {
                abi::metric::COUNTER => MetricValue::Counter(0),
                abi::metric::GAUGE => MetricValue::Gauge(0),
                abi::metric::HISTOGRAM => MetricValue::Histogram(Vec::new()),
                _ => return st(Status::BadArgument),
            };
            let s = g.state();
            // Envoy's ids: the low two bits are the type, then steps of 4.
            let id = s.next_metric_id[kind as usize];
            s.next_metric_id[kind as usize] = id.wrapping_add(4);
            lock(&s.shared)
                .metrics
                .entry(name.clone())
                .or_insert(initial);
            s.metric_ids.insert(id, name);
            g.write_u32(id_ptr, id)?;
            st(Status::Ok)
        },
    )?;
    r.wrap("proxy_get_metric", |mut c: C, id: i32, ptr: i32| {
        let mut g = Guest::new(&mut c);
        let id = id as u32;
        if id & 3 > 1 {
            return st(Status::BadArgument);
        }
        let s = g.state();
        let value =
            s.metric_ids
                .get(&id)
                .and_then(|name| match lock(&s.shared).metrics.get(name) {
                    Some(MetricValue::Counter(v) | MetricValue::Gauge(v)) => Some(*v),
                    _ => None,
                });
        let Some(value) = value else {
            return st(Status::NotFound);
        };
        g.write_u64(ptr, value)?;
        st(Status::Ok)
    })?;
    r.wrap("proxy_record_metric", |mut c: C, id: i32, value: i64| {
        let s = c.data_mut();
        let Some(name) = s.metric_ids.get(&(id as u32)) else {
            return st(Status::NotFound);
        };
        let value = value as u64;
        match lock(&s.shared).metrics.get_mut(name) {
            Some(MetricValue::Counter(v)) => *v = v.wrapping_add(value),
            Some(MetricValue::Gauge(v)) => *v = value,
            Some(MetricValue::Histogram(values)) => values.push(value),
            None => return st(Status::NotFound),
        }
        st(Status::Ok)
    })?;
    r.wrap(
        "proxy_increment_metric",
        |mut c: C, id: i32, offset: i64| {
            let s = c.data_mut();
            let id = id as u32;
            if id & 3 > 1 {
                return st(Status::BadArgument);
            }
            let Some(name) = s.metric_ids.get(&id) else {
                return st(Status::NotFound);
            };
            match lock(&s.shared).metrics.get_mut(name) {
                Some(MetricValue::Counter(_)) if offset <= 0 => return st(Status::BadArgument),
                Some(MetricValue::Counter(v)) => *v = v.wrapping_add(offset as u64),
                Some(MetricValue::Gauge(v)) if offset >= 0 => *v = v.saturating_add(offset as u64),
                Some(MetricValue::Gauge(v)) => *v = v.saturating_sub(offset.unsigned_abs()),
                _ => return st(Status::NotFound),
            }
            st(Status::Ok)
        },
    )?;
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

#[cfg(test)]
mod tests {
    use super::copy_into_body;
    use crate::abi::Status;

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
