//! The HTTP stream state machine with Envoy 1.40's rules: what a callback's return value
//! does (`Pause` from headers is StopAllIterationAndWatermark unless
//! `allow_on_headers_stop_iteration`; `Pause` from a body buffers), when the header
//! maps and body buffers are exposed to the filter, continuing, local replies through
//! the encoder path, and stream completion (`on_log`, `on_done`, `on_delete`).

use super::host::Host;
use crate::state::{lock, Flow, HeaderState};
use crate::types::values::{
    header_value, HttpCall, LocalResponse, ResponseOutcome, StreamHandle, StreamOutcome,
};
use anyhow::{anyhow, bail, Result};

impl Host {
    pub(super) fn alive(&mut self, vm: usize, ctx: u32, response: bool) -> bool {
        self.state(vm)
            .streams
            .get(&ctx)
            .is_some_and(|s| !s.finished && !s.reset && (response || s.local_reply.is_none()))
    }

    pub(super) fn flow(&mut self, vm: usize, ctx: u32, response: bool) -> Result<&mut Flow> {
        let stream = self
            .state(vm)
            .streams
            .get_mut(&ctx)
            .ok_or_else(|| anyhow!("VM {vm} has no stream {ctx}"))?;
        Ok(stream.flow(response))
    }

    pub(super) fn forward_headers(flow: &mut Flow) {
        flow.fwd_headers = Some(flow.headers.clone());
        flow.headers_live = false;
        flow.hstate = HeaderState::Forwarded;
        if flow.headers_eos {
            flow.fwd_eos = true;
        }
    }

    /// `decodeHeaders` / `encodeHeaders`.
    pub(super) fn headers_phase(
        &mut self,
        vm: usize,
        ctx: u32,
        response: bool,
        eos: bool,
    ) -> Result<()> {
        if !self.alive(vm, ctx, response) {
            return Ok(());
        }
        let flow = self.flow(vm, ctx, response)?;
        flow.headers_live = true;
        flow.headers_eos = eos;
        let args = (ctx as i32, flow.headers.len() as i32, eos as i32);
        let r = if response {
            let what = "proxy_on_response_headers";
            self.invoke(vm, ctx, |e| e.response_headers.clone(), args, what)?
        } else {
            let what = "proxy_on_request_headers";
            self.invoke(vm, ctx, |e| e.request_headers.clone(), args, what)?
        };
        if !self.alive(vm, ctx, response) {
            return self.settle(vm);
        }
        let stop = self.state(vm).stop_next_iteration;
        let allow = self.cfg.allow_on_headers_stop_iteration;
        let flow = self.flow(vm, ctx, response)?;
        match r.unwrap_or(0) {
            _ if stop => flow.hstate = HeaderState::StopAll,
            0 => Self::forward_headers(flow),
            1 if allow => flow.hstate = HeaderState::Stopped,
            _ => flow.hstate = HeaderState::StopAll,
        }
        self.settle(vm)
    }

    /// One body chunk arriving at the filter (`decodeData` / `encodeData`).
    pub(super) fn body_chunk(
        &mut self,
        vm: usize,
        ctx: u32,
        response: bool,
        chunk: Vec<u8>,
        eos: bool,
    ) -> Result<()> {
        if !self.alive(vm, ctx, response) {
            return Ok(());
        }
        let flow = self.flow(vm, ctx, response)?;
        if flow.hstate == HeaderState::StopAll {
            flow.held.extend(chunk);
            flow.held_any = true;
            flow.held_eos = eos;
            return Ok(());
        }
        if flow.buffering {
            flow.body.extend(chunk);
        } else {
            flow.body = chunk;
        }
        self.deliver_body(vm, ctx, response, eos)
    }

    pub(super) fn deliver_body(
        &mut self,
        vm: usize,
        ctx: u32,
        response: bool,
        eos: bool,
    ) -> Result<()> {
        let flow = self.flow(vm, ctx, response)?;
        flow.body_live = true;
        let args = (ctx as i32, flow.body.len() as i32, eos as i32);
        let r = if response {
            let what = "proxy_on_response_body";
            self.invoke(vm, ctx, |e| e.response_body.clone(), args, what)?
        } else {
            let what = "proxy_on_request_body";
            self.invoke(vm, ctx, |e| e.request_body.clone(), args, what)?
        };
        if !self.alive(vm, ctx, response) {
            return self.settle(vm);
        }
        let stop = self.state(vm).stop_next_iteration;
        let flow = self.flow(vm, ctx, response)?;
        flow.buffering = false;
        match r.unwrap_or(0) {
            // StopIterationNoBuffer (also forced after a local reply): data is dropped.
            action if stop || action >= 3 => {
                flow.body.clear();
                flow.body_live = false;
            }
            0 => {
                if flow.hstate != HeaderState::Forwarded {
                    Self::forward_headers(flow);
                }
                flow.fwd_body.append(&mut flow.body);
                flow.body_live = false;
                flow.fwd_eos |= eos;
            }
            // StopIterationAndBuffer / AndWatermark: Envoy keeps accumulating.
            _ => {
                flow.buffering = true;
                flow.stalled_eos = eos;
            }
        }
        self.settle(vm)
    }

    /// `continueDecoding` / `continueEncoding` after `proxy_continue_stream`.
    pub(super) fn resume(&mut self, vm: usize, ctx: u32, response: bool) -> Result<()> {
        if !self.alive(vm, ctx, response) {
            return Ok(());
        }
        let flow = self.flow(vm, ctx, response)?;
        let was_stop_all = flow.hstate == HeaderState::StopAll;
        if matches!(flow.hstate, HeaderState::Stopped | HeaderState::StopAll) {
            Self::forward_headers(flow);
        }
        if flow.buffering {
            flow.fwd_body.append(&mut flow.body);
            flow.buffering = false;
            flow.body_live = false;
            flow.fwd_eos |= flow.stalled_eos;
        }
        if was_stop_all && flow.held_any {
            // Envoy now hands the data it held back to this filter, in one piece.
            flow.body = std::mem::take(&mut flow.held);
            flow.held_any = false;
            let eos = flow.held_eos;
            return self.deliver_body(vm, ctx, response, eos);
        }
        Ok(())
    }

    /// `sendLocalReply`: the reply goes through the encoder path (this filter's response
    /// callbacks), then the stream completes.
    pub(super) fn local_reply(
        &mut self,
        vm: usize,
        ctx: u32,
        mut reply: LocalResponse,
    ) -> Result<()> {
        if !self.alive(vm, ctx, false) {
            return Ok(());
        }
        let stream = self.state(vm).streams.get_mut(&ctx).expect("alive stream");
        if stream.resp.hstate != HeaderState::Pending {
            // The response already started: Envoy can only reset the stream.
            stream.local_reply = Some(reply);
            return self.end_stream(vm, ctx, true);
        }
        let mut headers = vec![(":status".to_string(), reply.status.to_string())];
        headers.extend(reply.headers.iter().cloned());
        if !reply.body.is_empty() {
            if header_value(&headers, "content-length").is_none() {
                headers.push(("content-length".into(), reply.body.len().to_string()));
            }
            if header_value(&headers, "content-type").is_none() {
                headers.push(("content-type".into(), "text/plain".into()));
            }
        }
        let body = std::mem::take(&mut reply.body);
        stream.code_details = reply.details.clone();
        stream.local_reply = Some(reply);
        stream.resp = Flow::new(headers);
        self.headers_phase(vm, ctx, true, body.is_empty())?;
        if !body.is_empty() {
            self.body_chunk(vm, ctx, true, body, true)?;
        }
        let stream = self.state(vm).streams.get_mut(&ctx).expect("stream");
        let out = response_outcome(&stream.resp);
        if let Some(reply) = stream.local_reply.as_mut() {
            if let Some(status) = header_value(&out.headers, ":status").and_then(|s| s.parse().ok())
            {
                reply.status = status;
            }
            reply.headers = out.headers;
            reply.body = out.body;
        }
        self.end_stream(vm, ctx, false)
    }

    /// Stream completion: `proxy_on_log` (access-log phase), `proxy_on_done`,
    /// `proxy_on_delete`; pending HTTP calls of the context are cancelled.
    pub(super) fn end_stream(&mut self, vm: usize, ctx: u32, reset: bool) -> Result<()> {
        let Some(stream) = self.state(vm).streams.get_mut(&ctx) else {
            bail!("VM {vm} has no stream {ctx}");
        };
        if stream.finished {
            return Ok(());
        }
        stream.reset |= reset;
        stream.log_phase = true;
        let r = self.invoke(vm, ctx, |e| e.log.clone(), ctx as i32, "proxy_on_log");
        if let Some(stream) = self.state(vm).streams.get_mut(&ctx) {
            stream.log_phase = false;
        }
        r?;
        self.settle(vm)?;
        self.invoke(vm, ctx, |e| e.done.clone(), ctx as i32, "proxy_on_done")?;
        self.settle(vm)?;
        self.invoke(vm, ctx, |e| e.delete.clone(), ctx as i32, "proxy_on_delete")?;
        if let Some(stream) = self.state(vm).streams.get_mut(&ctx) {
            stream.finished = true;
        }
        lock(&self.shared)
            .http_calls
            .retain(|_, c| !(c.vm == vm && c.context_id == ctx));
        self.settle(vm)
    }

    pub(super) fn outcome(&mut self, vm: usize, ctx: u32) -> Result<StreamOutcome> {
        let calls: Vec<HttpCall> = lock(&self.shared)
            .http_calls
            .values()
            .filter(|c| c.vm == vm && c.context_id == ctx)
            .cloned()
            .collect();
        let Some(s) = self.state(vm).streams.get(&ctx) else {
            bail!("VM {vm} has no stream {ctx}");
        };
        let req = &s.req;
        let mut body = req.fwd_body.clone();
        if !req.fwd_eos {
            body.extend_from_slice(&req.body);
            body.extend_from_slice(&req.held);
        }
        Ok(StreamOutcome {
            handle: StreamHandle {
                vm,
                context_id: ctx,
            },
            request_headers: req.fwd_headers.clone().unwrap_or(req.headers.clone()),
            request_body: body,
            headers_forwarded: req.fwd_headers.is_some(),
            continued: req.fwd_eos && s.local_reply.is_none() && !s.reset,
            local_response: s.local_reply.clone(),
            clear_route_cache: s.clear_route_cache,
            foreign_calls: s.foreign_calls.clone(),
            request_header_reads: s.request_header_reads.clone(),
            http_calls: calls,
            properties: s
                .properties
                .iter()
                .map(|(k, v)| (String::from_utf8_lossy(k).replace('\0', "."), v.clone()))
                .collect(),
            finished: s.finished,
            reset: s.reset,
        })
    }

    pub(super) fn stream_ctx(&mut self, vm: usize, handle: StreamHandle) -> Result<u32> {
        if handle.vm != vm {
            bail!("stream {handle:?} belongs to VM {}, not VM {vm}", handle.vm);
        }
        self.check_vm(vm)?;
        if !self.state(vm).streams.contains_key(&handle.context_id) {
            bail!("VM {vm} has no stream {}", handle.context_id);
        }
        Ok(handle.context_id)
    }
}

pub(super) fn response_outcome(flow: &Flow) -> ResponseOutcome {
    let mut body = flow.fwd_body.clone();
    if !flow.fwd_eos {
        body.extend_from_slice(&flow.body);
        body.extend_from_slice(&flow.held);
    }
    ResponseOutcome {
        headers: flow.fwd_headers.clone().unwrap_or(flow.headers.clone()),
        body,
        continued: flow.fwd_eos,
    }
}

pub(super) fn split_body(body: Vec<u8>, chunks: usize) -> Vec<Vec<u8>> {
    if body.is_empty() {
        return Vec::new();
    }
    let n = chunks.clamp(1, body.len());
    let size = body.len().div_ceil(n);
    body.chunks(size).map(<[u8]>::to_vec).collect()
}
