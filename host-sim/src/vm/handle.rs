//! [`VmHandle`]: the requests, responses and stream ends one VM (worker thread) sees,
//! driven through the stream machine in [`super::stream`].

use super::host::Host;
use super::stream::{response_outcome, split_body};
use crate::state::{lock, Flow, HeaderState, StreamState};
use crate::types::values::{
    owned_headers, FailurePolicy, LogEntry, RequestSpec, ResponseOutcome, StreamHandle,
    StreamOutcome,
};
use anyhow::{bail, Result};

impl Host {
    /// One VM (worker thread). Out-of-range indexes make every call on the handle fail.
    pub fn vm(&mut self, index: usize) -> VmHandle<'_> {
        VmHandle::new(self, index)
    }
}

/// One VM (worker thread) of a [`Host`]; see [`Host::vm`].
pub struct VmHandle<'a> {
    host: &'a mut Host,
    vm: usize,
}

impl<'a> VmHandle<'a> {
    pub(super) fn new(host: &'a mut Host, vm: usize) -> Self {
        Self { host, vm }
    }

    /// Sends a request: `proxy_on_context_create`, `proxy_on_request_headers`, then the body
    /// chunks through `proxy_on_request_body` with Envoy's buffering rules, then deferred
    /// actions and queue notifications. Returns where the stream stands; if the filter
    /// paused it (e.g. waiting for an HTTP call), answer the call and look again with
    /// [`VmHandle::outcome`].
    pub fn request(&mut self, spec: RequestSpec<'_>) -> Result<StreamOutcome> {
        let (host, vm) = (&mut *self.host, self.vm);
        host.check_vm(vm)?;
        if host.cfg.failure_policy == FailurePolicy::FailReload && host.vms[vm].failed.is_some() {
            host.reload(vm)?;
        }
        let chunks = split_body(spec.body, spec.body_chunks);
        let now = lock(&host.shared).now_ns;
        let s = host.state(vm);
        let (ctx, root) = (s.next_ctx, s.root_ctx);
        s.next_ctx += 1;
        let stream = StreamState::new(owned_headers(&spec.headers), now);
        s.streams.insert(ctx, stream);
        let args = (ctx as i32, root as i32);
        let what = "proxy_on_context_create";
        host.invoke(vm, ctx, |e| e.context_create.clone(), args, what)?;
        host.settle(vm)?;
        host.headers_phase(vm, ctx, false, chunks.is_empty())?;
        let count = chunks.len();
        for (i, chunk) in chunks.into_iter().enumerate() {
            host.body_chunk(vm, ctx, false, chunk, i + 1 == count)?;
        }
        host.pump()?;
        host.outcome(vm, ctx)
    }

    /// The current state of a stream.
    pub fn outcome(&mut self, handle: StreamHandle) -> Result<StreamOutcome> {
        let ctx = self.host.stream_ctx(self.vm, handle)?;
        self.host.outcome(self.vm, ctx)
    }

    /// The upstream answers: `proxy_on_response_headers` (with `:status` first) and, if
    /// `body` is not empty, `proxy_on_response_body` with `end_of_stream`. Returns the
    /// response as the filter lets it go downstream. The request headers must have been
    /// forwarded upstream.
    pub fn respond(
        &mut self,
        handle: StreamHandle,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<ResponseOutcome> {
        let ctx = self.response_headers(handle, status, headers, body.is_empty())?;
        if !body.is_empty() {
            self.host
                .body_chunk(self.vm, ctx, true, body.to_vec(), true)?;
        }
        self.delivered(ctx)
    }

    /// The upstream's response headers (`:status` first) with more to come: the
    /// start of a response that `fail_upstream` can still cut, as a reset engine does.
    pub fn respond_headers(
        &mut self,
        handle: StreamHandle,
        status: u32,
        headers: &[(&str, &str)],
    ) -> Result<ResponseOutcome> {
        let ctx = self.response_headers(handle, status, headers, false)?;
        self.delivered(ctx)
    }

    /// More of a response already started (`respond_headers`): one
    /// `proxy_on_response_body` with `chunk`, `end_of_stream` on the last, as a
    /// streamed answer arrives a token at a time.
    pub fn respond_body(
        &mut self,
        handle: StreamHandle,
        chunk: &[u8],
        end_of_stream: bool,
    ) -> Result<ResponseOutcome> {
        let (host, vm) = (&mut *self.host, self.vm);
        let ctx = host.stream_ctx(vm, handle)?;
        let stream = host.state(vm).streams.get(&ctx).expect("checked");
        if stream.resp.hstate == HeaderState::Pending {
            bail!("stream {ctx} has no response yet: respond_headers first");
        }
        host.body_chunk(vm, ctx, true, chunk.to_vec(), end_of_stream)?;
        self.delivered(ctx)
    }

    /// Runs what the response's callbacks set in motion; the response as the filter
    /// lets it go downstream so far.
    fn delivered(&mut self, ctx: u32) -> Result<ResponseOutcome> {
        self.host.pump()?;
        let stream = self.host.state(self.vm).streams.get(&ctx).expect("checked");
        Ok(response_outcome(&stream.resp))
    }

    /// `proxy_on_response_headers` of an upstream answer; the stream's context.
    fn response_headers(
        &mut self,
        handle: StreamHandle,
        status: u32,
        headers: &[(&str, &str)],
        end_of_stream: bool,
    ) -> Result<u32> {
        let (host, vm) = (&mut *self.host, self.vm);
        let ctx = host.stream_ctx(vm, handle)?;
        let stream = host.state(vm).streams.get_mut(&ctx).expect("checked");
        upstream_open(stream, ctx)?;
        if stream.resp.hstate != HeaderState::Pending {
            bail!("stream {ctx} already has a response");
        }
        let mut all = vec![(":status".to_string(), status.to_string())];
        all.extend(owned_headers(headers));
        stream.resp = Flow::new(all);
        stream.code_details = "via_upstream".into();
        host.headers_phase(vm, ctx, true, end_of_stream)?;
        Ok(ctx)
    }

    /// The upstream failed (Envoy's router saw a refused connection, a reset, a
    /// timeout): `flags` and `details` go into the stream info (`response.flags`,
    /// `response.code_details`); if no response started, the router's own reply
    /// (`status`, e.g. 503) runs through the filter's response callbacks; then the
    /// stream completes (`proxy_on_log`...). A response already under way keeps its
    /// status and is cut.
    pub fn fail_upstream(
        &mut self,
        handle: StreamHandle,
        status: u32,
        flags: u64,
        details: &str,
    ) -> Result<()> {
        let started = self.fail_upstream_headers(handle, status, flags, details)?;
        let (host, vm) = (&mut *self.host, self.vm);
        let ctx = host.stream_ctx(vm, handle)?;
        host.end_stream(vm, ctx, started)?;
        host.pump()
    }

    /// `fail_upstream` up to the router's reply leaving for the client, before the
    /// stream completes (in Envoy the client may send its next request in between);
    /// whether a response had started before. `finish` completes it.
    pub fn fail_upstream_headers(
        &mut self,
        handle: StreamHandle,
        status: u32,
        flags: u64,
        details: &str,
    ) -> Result<bool> {
        let (host, vm) = (&mut *self.host, self.vm);
        let ctx = host.stream_ctx(vm, handle)?;
        let stream = host.state(vm).streams.get_mut(&ctx).expect("checked");
        upstream_open(stream, ctx)?;
        stream.response_flags = flags;
        stream.code_details = details.to_string();
        let started = stream.resp.hstate != HeaderState::Pending;
        if !started {
            stream.resp = Flow::new(vec![(":status".to_string(), status.to_string())]);
            host.headers_phase(vm, ctx, true, true)?;
        }
        Ok(started)
    }

    /// Completes the stream: `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`. A no-op if
    /// it already completed (local replies complete on their own, as in Envoy).
    pub fn finish(&mut self, handle: StreamHandle) -> Result<()> {
        let ctx = self.host.stream_ctx(self.vm, handle)?;
        self.host.end_stream(self.vm, ctx, false)?;
        self.host.pump()
    }

    /// Client disconnect: the stream ends without (further) response, through
    /// `proxy_on_log`, `proxy_on_done`, `proxy_on_delete`; its HTTP calls are cancelled.
    pub fn reset(&mut self, handle: StreamHandle) -> Result<()> {
        let ctx = self.host.stream_ctx(self.vm, handle)?;
        self.host.end_stream(self.vm, ctx, true)?;
        self.host.pump()
    }

    /// Fires `proxy_on_tick` on this VM now (without moving the clock).
    pub fn tick(&mut self) -> Result<()> {
        let (host, vm) = (&mut *self.host, self.vm);
        host.check_vm(vm)?;
        let root = host.state(vm).root_ctx;
        host.invoke(vm, root, |e| e.tick.clone(), root as i32, "proxy_on_tick")?;
        host.settle(vm)?;
        host.pump()
    }

    /// Log lines captured on this VM.
    pub fn logs(&self) -> &[LogEntry] {
        self.host.logs(self.vm)
    }

    /// The tick period the filter set on this VM (ms, 0 = none).
    pub fn tick_period_ms(&self) -> u64 {
        self.host
            .vms
            .get(self.vm)
            .map_or(0, |s| s.store.data().tick_period_ms)
    }
}

/// A response can only come for a stream still open whose request went upstream.
fn upstream_open(stream: &StreamState, ctx: u32) -> Result<()> {
    if stream.finished || stream.reset || stream.local_reply.is_some() {
        bail!("stream {ctx} already ended (finished, reset or answered locally)");
    }
    if stream.req.fwd_headers.is_none() {
        bail!("stream {ctx} was not sent upstream: the filter still holds its request");
    }
    Ok(())
}
