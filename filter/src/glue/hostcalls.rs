//! The proxy-wasm hostcalls the filter makes, with the SDK's signatures but without its
//! panics: the SDK (0.2.5) panics on any status it does not expect (a
//! `BadArgument` from a header write, a `NotFound` from a local reply...) and on a
//! header value that is not UTF-8, and a panic traps the VM. Envoy answers such
//! statuses in some stream states, so here every status other than `Ok` is an `Err`
//! and header values are read lossily. host-sim's fault-injection test checks that no
//! hostcall failure makes the filter trap.
//!
//! Every hostcall the filter makes goes through here; a new one belongs here too (the
//! SDK's would bring its panics back). `dispatch_http_call` is the one the SDK must
//! make itself (see there).

use crate::support::header_pairs::{self, Pairs};
use proxy_wasm::types::{BufferType, Bytes, LogLevel, MapType, MetricType, Status};
use std::ptr::{null, null_mut};
use std::time::Duration;

/// Raw imports: statuses arrive as `u32`, as a host may answer any value.
mod raw {
    #[link(wasm_import_module = "env")]
    extern "C" {
        pub fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
        pub fn proxy_get_current_time_nanoseconds(time: *mut u64) -> u32;
        pub fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
        pub fn proxy_get_buffer_bytes(
            kind: u32,
            start: usize,
            max: usize,
            data: *mut *mut u8,
            size: *mut usize,
        ) -> u32;
        pub fn proxy_get_header_map_value(
            kind: u32,
            key: *const u8,
            key_size: usize,
            data: *mut *mut u8,
            size: *mut usize,
        ) -> u32;
        pub fn proxy_replace_header_map_value(
            kind: u32,
            key: *const u8,
            key_size: usize,
            value: *const u8,
            value_size: usize,
        ) -> u32;
        pub fn proxy_remove_header_map_value(kind: u32, key: *const u8, key_size: usize) -> u32;
        pub fn proxy_get_property(
            path: *const u8,
            path_size: usize,
            data: *mut *mut u8,
            size: *mut usize,
        ) -> u32;
        pub fn proxy_get_shared_data(
            key: *const u8,
            key_size: usize,
            data: *mut *mut u8,
            size: *mut usize,
            cas: *mut u32,
        ) -> u32;
        pub fn proxy_set_shared_data(
            key: *const u8,
            key_size: usize,
            value: *const u8,
            value_size: usize,
            cas: u32,
        ) -> u32;
        pub fn proxy_send_local_response(
            status: u32,
            details: *const u8,
            details_size: usize,
            body: *const u8,
            body_size: usize,
            headers: *const u8,
            headers_size: usize,
            grpc_status: i32,
        ) -> u32;
        pub fn proxy_call_foreign_function(
            name: *const u8,
            name_size: usize,
            args: *const u8,
            args_size: usize,
            data: *mut *mut u8,
            size: *mut usize,
        ) -> u32;
        pub fn proxy_define_metric(
            kind: u32,
            name: *const u8,
            name_size: usize,
            id: *mut u32,
        ) -> u32;
        pub fn proxy_increment_metric(id: u32, offset: i64) -> u32;
        pub fn proxy_record_metric(id: u32, value: u64) -> u32;
        pub fn proxy_set_buffer_bytes(
            kind: u32,
            start: usize,
            size: usize,
            data: *const u8,
            data_size: usize,
        ) -> u32;
        pub fn proxy_get_header_map_pairs(kind: u32, data: *mut *mut u8, size: *mut usize) -> u32;
        pub fn proxy_register_shared_queue(name: *const u8, name_size: usize, id: *mut u32) -> u32;
        pub fn proxy_resolve_shared_queue(
            vm_id: *const u8,
            vm_id_size: usize,
            name: *const u8,
            name_size: usize,
            id: *mut u32,
        ) -> u32;
        pub fn proxy_enqueue_shared_queue(id: u32, value: *const u8, value_size: usize) -> u32;
        pub fn proxy_dequeue_shared_queue(id: u32, data: *mut *mut u8, size: *mut usize) -> u32;
        pub fn proxy_set_effective_context(context_id: u32) -> u32;
        pub fn proxy_continue_stream(stream_type: u32) -> u32;
    }
}

/// `Ok(())` for status 0, else the status (unknown values as `InternalFailure`).
fn check(status: u32) -> Result<(), Status> {
    Err(match status {
        0 => return Ok(()),
        1 => Status::NotFound,
        2 => Status::BadArgument,
        3 => Status::SerializationFailure,
        4 => Status::ParseFailure,
        7 => Status::Empty,
        8 => Status::CasMismatch,
        _ => Status::InternalFailure,
    })
}

/// Takes ownership of a buffer the host allocated through `proxy_on_memory_allocate`
/// (the SDK's allocator: a `Vec<u8>` of exactly that capacity).
///
/// # Safety
/// `data`/`size` must come from a successful hostcall that returns a buffer.
unsafe fn take(data: *mut u8, size: usize) -> Option<Bytes> {
    (!data.is_null()).then(|| Vec::from_raw_parts(data, size, size))
}

pub fn log(level: LogLevel, message: &str) -> Result<(), Status> {
    check(unsafe { raw::proxy_log(level as u32, message.as_ptr(), message.len()) })
}

/// The host's clock in nanoseconds since the Unix epoch (as a number: a
/// `SystemTime` and its `duration_since` cost a 128-bit division a read).
pub fn current_time_ns() -> Result<u64, Status> {
    let mut ns = 0u64;
    check(unsafe { raw::proxy_get_current_time_nanoseconds(&mut ns) })?;
    Ok(ns)
}

pub fn set_tick_period(period: Duration) -> Result<(), Status> {
    let ms = u32::try_from(period.as_millis()).unwrap_or(u32::MAX);
    check(unsafe { raw::proxy_set_tick_period_milliseconds(ms) })
}

/// `Ok(None)` for an empty or absent buffer.
pub fn get_buffer(kind: BufferType, start: usize, max: usize) -> Result<Option<Bytes>, Status> {
    let (mut data, mut size) = (null_mut(), 0);
    match check(unsafe {
        raw::proxy_get_buffer_bytes(kind as u32, start, max, &mut data, &mut size)
    }) {
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(Status::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// `Ok(None)` when the header is absent; a value that is not UTF-8 is read lossily.
pub fn get_map_value(map: MapType, key: &str) -> Result<Option<String>, Status> {
    let (mut data, mut size) = (null_mut(), 0);
    let status = unsafe {
        raw::proxy_get_header_map_value(map as u32, key.as_ptr(), key.len(), &mut data, &mut size)
    };
    match check(status) {
        Ok(()) => {
            let bytes = unsafe { take(data, size) }.unwrap_or_default();
            // The host's copy becomes the string: a second copy only when it is not
            // UTF-8.
            Ok(Some(String::from_utf8(bytes).unwrap_or_else(|e| {
                String::from_utf8_lossy(e.as_bytes()).into_owned()
            })))
        }
        Err(Status::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// A stream or host attribute by path segments (`["response", "flags"]`); `Ok(None)`
/// when the host has no value for it.
pub fn get_property(path: &[&str]) -> Result<Option<Bytes>, Status> {
    let joined = path.join("\0");
    let (mut data, mut size) = (null_mut(), 0);
    let status =
        unsafe { raw::proxy_get_property(joined.as_ptr(), joined.len(), &mut data, &mut size) };
    match check(status) {
        Ok(()) => Ok(unsafe { take(data, size) }),
        Err(Status::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Replaces the header, or removes it for `None`.
pub fn set_map_value(map: MapType, key: &str, value: Option<&str>) -> Result<(), Status> {
    let Some(value) = value else {
        return remove_map_value(map, key);
    };
    check(unsafe {
        raw::proxy_replace_header_map_value(
            map as u32,
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

/// All pairs of a header map (names and values read lossily).
pub fn get_map(map: MapType) -> Result<Vec<(String, String)>, Status> {
    let bytes = get_map_bytes(map)?;
    Ok(Pairs::new(&bytes)
        .map(|(k, v)| {
            (
                String::from_utf8_lossy(k).into_owned(),
                String::from_utf8_lossy(v).into_owned(),
            )
        })
        .collect())
}

/// A header map as the host serializes it (`crate::support::header_pairs`), in one hostcall;
/// empty when the host has none.
pub fn get_map_bytes(map: MapType) -> Result<Bytes, Status> {
    let (mut data, mut size) = (null_mut(), 0);
    match check(unsafe { raw::proxy_get_header_map_pairs(map as u32, &mut data, &mut size) }) {
        Ok(()) => Ok(unsafe { take(data, size) }.unwrap_or_default()),
        Err(Status::NotFound) => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Replaces `size` bytes at `start` of a buffer with `value` (Envoy replaces a body
/// only with `start = 0, size >= len`).
pub fn set_buffer(kind: BufferType, start: usize, size: usize, value: &[u8]) -> Result<(), Status> {
    check(unsafe {
        raw::proxy_set_buffer_bytes(kind as u32, start, size, value.as_ptr(), value.len())
    })
}

/// The SDK's own: only it can register the call's token with its dispatcher, which
/// routes `on_http_call_response` back to the calling context (a call made around it
/// makes the dispatcher panic on the answer). It panics on statuses other than `Ok`,
/// `BadArgument` and `InternalFailure`, which are all Envoy's `proxy_http_call`
/// answers (host-sim's fault test holds it to that table).
pub use proxy_wasm::hostcalls::dispatch_http_call;

pub fn remove_map_value(map: MapType, key: &str) -> Result<(), Status> {
    check(unsafe { raw::proxy_remove_header_map_value(map as u32, key.as_ptr(), key.len()) })
}

pub fn get_shared_data(key: &str) -> Result<(Option<Bytes>, Option<u32>), Status> {
    let (mut data, mut size, mut cas) = (null_mut(), 0, 0);
    let status = unsafe {
        raw::proxy_get_shared_data(key.as_ptr(), key.len(), &mut data, &mut size, &mut cas)
    };
    match check(status) {
        Ok(()) => Ok((unsafe { take(data, size) }, (cas != 0).then_some(cas))),
        Err(Status::NotFound) => Ok((None, None)),
        Err(e) => Err(e),
    }
}

pub fn set_shared_data(key: &str, value: Option<&[u8]>, cas: Option<u32>) -> Result<(), Status> {
    let (ptr, len) = value.map_or((null(), 0), |v| (v.as_ptr(), v.len()));
    check(unsafe {
        raw::proxy_set_shared_data(key.as_ptr(), key.len(), ptr, len, cas.unwrap_or(0))
    })
}

pub fn send_http_response(
    status_code: u32,
    headers: Vec<(&str, &str)>,
    body: Option<&[u8]>,
) -> Result<(), Status> {
    let headers = header_pairs::serialize(&headers);
    let (ptr, len) = body.map_or((null(), 0), |b| (b.as_ptr(), b.len()));
    check(unsafe {
        raw::proxy_send_local_response(
            status_code,
            null(),
            0,
            ptr,
            len,
            headers.as_ptr(),
            headers.len(),
            -1,
        )
    })
}

pub fn call_foreign_function(name: &str, args: Option<&[u8]>) -> Result<Option<Bytes>, Status> {
    let (args_ptr, args_len) = args.map_or((null(), 0), |a| (a.as_ptr(), a.len()));
    let (mut data, mut size) = (null_mut(), 0);
    check(unsafe {
        raw::proxy_call_foreign_function(
            name.as_ptr(),
            name.len(),
            args_ptr,
            args_len,
            &mut data,
            &mut size,
        )
    })?;
    Ok(unsafe { take(data, size) })
}

pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, Status> {
    let mut id = 0;
    check(unsafe { raw::proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn increment_metric(id: u32, offset: i64) -> Result<(), Status> {
    check(unsafe { raw::proxy_increment_metric(id, offset) })
}

pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    check(unsafe { raw::proxy_record_metric(id, value) })
}

/// Registers the queue `name` for this VM (Envoy delivers it to the last
/// registrant); its id.
pub fn register_shared_queue(name: &str) -> Result<u32, Status> {
    let mut id = 0;
    check(unsafe { raw::proxy_register_shared_queue(name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

/// The id of the queue `name` registered in the VM `vm_id`; `None` if none is.
pub fn resolve_shared_queue(vm_id: &str, name: &str) -> Result<Option<u32>, Status> {
    let mut id = 0;
    let status = unsafe {
        raw::proxy_resolve_shared_queue(
            vm_id.as_ptr(),
            vm_id.len(),
            name.as_ptr(),
            name.len(),
            &mut id,
        )
    };
    match check(status) {
        Ok(()) => Ok(Some(id)),
        Err(Status::NotFound) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn enqueue_shared_queue(id: u32, value: &[u8]) -> Result<(), Status> {
    check(unsafe { raw::proxy_enqueue_shared_queue(id, value.as_ptr(), value.len()) })
}

/// The queue's next message; `None` when it is empty.
pub fn dequeue_shared_queue(id: u32) -> Result<Option<Bytes>, Status> {
    let (mut data, mut size) = (null_mut(), 0);
    match check(unsafe { raw::proxy_dequeue_shared_queue(id, &mut data, &mut size) }) {
        Ok(()) => Ok(Some(unsafe { take(data, size) }.unwrap_or_default())),
        Err(Status::Empty) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Makes the following hostcalls act on the stream `context_id` (from a root
/// context's callback).
pub fn set_effective_context(context_id: u32) -> Result<(), Status> {
    check(unsafe { raw::proxy_set_effective_context(context_id) })
}

/// Lets the effective context's paused request go on.
pub fn resume_http_request() -> Result<(), Status> {
    // ABI 0.2.1's stream types: 0 is the request.
    check(unsafe { raw::proxy_continue_stream(0) })
}
