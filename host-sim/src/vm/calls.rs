//! Calling into the guest, as Envoy's context code does: one [`Host::invoke`] for every
//! export (sets the current and effective context; a trap fails the VM under the
//! [`FailurePolicy`]), the VM lifecycle (start, configure, reload), the after-call
//! actions (`settle`), queue deliveries (`pump`) and HTTP-call responses.

use super::host::Host;
use super::instance::{tail_logs, Export, Exports, Slot};
use crate::state::{lock, CallResponse, Deferred, HostState};
use crate::types::codes::{LogLevel, Status};
use crate::types::values::{FailurePolicy, HttpCall, LocalResponse, LogSource};
use anyhow::{anyhow, bail, Context as _, Result};
use wasmtime::{WasmParams, WasmResults};

impl Host {
    /// Removes a pending HTTP call to answer it.
    pub(super) fn take_call(&mut self, token: u32) -> Result<HttpCall> {
        lock(&self.shared)
            .http_calls
            .remove(&token)
            .ok_or_else(|| anyhow!("no pending HTTP call with token {token}"))
    }

    /// The store data of VM `vm` (an index already checked).
    pub(super) fn state(&mut self, vm: usize) -> &mut HostState {
        self.vms[vm].store.data_mut()
    }

    /// Fails for an unknown VM, and for a failed one under [`FailurePolicy::Strict`]
    /// (the other policies answer per stream, in [`Host::invoke`]).
    pub(super) fn check_vm(&self, vm: usize) -> Result<()> {
        match self.vms.get(vm) {
            None => bail!("no VM {vm} (the host has {})", self.vms.len()),
            Some(Slot {
                failed: Some(why), ..
            }) if self.cfg.failure_policy == FailurePolicy::Strict => {
                bail!("VM {vm} failed earlier: {why}")
            }
            Some(_) => Ok(()),
        }
    }

    /// Calls a guest export with `ctx` as current and effective context. `Ok(None)` when the
    /// guest does not export it. A trap marks the VM failed and returns an error with the
    /// last guest logs (a Rust panic message is on stderr).
    pub(super) fn invoke<P: WasmParams, R: WasmResults>(
        &mut self,
        vm: usize,
        ctx: u32,
        pick: impl FnOnce(&Exports) -> Export<P, R>,
        args: P,
        what: &str,
    ) -> Result<Option<R>> {
        self.check_vm(vm)?;
        if self.vms[vm].failed.is_some() {
            self.fail_stream(vm, ctx);
            return Ok(None);
        }
        let slot = &mut self.vms[vm];
        let Some(f) = pick(&slot.ex) else {
            return Ok(None);
        };
        let s = slot.store.data_mut();
        s.current_ctx = ctx;
        s.effective_ctx = ctx;
        s.stop_next_iteration = false;
        match f.call(&mut slot.store, args) {
            Ok(r) => Ok(Some(r)),
            Err(e) => {
                slot.store.data_mut().flush_stdio();
                let why = format!("{what}(context {ctx}) trapped: {e:?}");
                let tail = tail_logs(&slot.store.data().logs);
                slot.failed = Some(why.clone());
                if self.cfg.failure_policy == FailurePolicy::Strict {
                    return Err(anyhow!("VM {vm}: {why}\nrecent guest logs:\n{tail}"));
                }
                let policy = self.cfg.failure_policy;
                let s = slot.store.data_mut();
                s.log(
                    LogLevel::Critical,
                    LogSource::Host,
                    format!("{why} ({policy:?})"),
                );
                lock(&self.shared)
                    .http_calls
                    .retain(|_, c| c.vm != vm || c.context_id == ctx);
                self.fail_stream(vm, ctx);
                Ok(None)
            }
        }
    }

    /// Envoy's `failStream` on a failed VM: a local 503 `wasm_fail_stream` that does not
    /// go through the filter (unless the policy is fail-open), and the stream's HTTP
    /// calls are cancelled.
    pub(super) fn fail_stream(&mut self, vm: usize, ctx: u32) {
        if self.cfg.failure_policy == FailurePolicy::FailOpen {
            return;
        }
        let Some(stream) = self.vms[vm].store.data_mut().streams.get_mut(&ctx) else {
            return;
        };
        if stream.finished {
            return;
        }
        stream.local_reply.get_or_insert_with(|| LocalResponse {
            status: 503,
            headers: vec![(":status".into(), "503".into())],
            body: Vec::new(),
            details: "wasm_fail_stream".into(),
            grpc_status: 14,
        });
        stream.finished = true;
        lock(&self.shared)
            .http_calls
            .retain(|_, c| !(c.vm == vm && c.context_id == ctx));
    }

    /// [`FailurePolicy::FailReload`]: a fresh VM replaces a failed one, on the same shared
    /// state.
    pub(super) fn reload(&mut self, vm: usize) -> Result<()> {
        let mut slot = Slot::instantiate(&self.filter, vm, self.cfg.clone(), self.shared.clone())
            .with_context(|| format!("reloading VM {vm}"))?;
        let reloads = self.vms[vm].reloads + 1;
        slot.store.data_mut().reseed(reloads);
        self.vms[vm] = Slot { reloads, ..slot };
        lock(&self.shared).http_calls.retain(|_, c| c.vm != vm);
        self.start_vm(vm)
    }

    pub(super) fn start_vm(&mut self, vm: usize) -> Result<()> {
        let root = self.state(vm).root_ctx as i32;
        let vm_size = self.cfg.vm_config.len() as i32;
        let what = "proxy_on_context_create";
        self.invoke(
            vm,
            root as u32,
            |e| e.context_create.clone(),
            (root, 0),
            what,
        )?;
        let what = "proxy_on_vm_start";
        let ok = self.invoke(
            vm,
            root as u32,
            |e| e.vm_start.clone(),
            (root, vm_size),
            what,
        )?;
        if ok == Some(0) {
            let tail = tail_logs(self.logs(vm));
            bail!("VM {vm}: proxy_on_vm_start returned false\nrecent guest logs:\n{tail}");
        }
        self.configure(vm)
    }

    /// `proxy_on_configure` on `vm` with the current plugin configuration.
    pub(super) fn configure(&mut self, vm: usize) -> Result<()> {
        let root = self.state(vm).root_ctx as i32;
        let plugin_size = self.cfg.plugin_config.len() as i32;
        self.state(vm).in_configure = true;
        let what = "proxy_on_configure";
        let ok = self.invoke(
            vm,
            root as u32,
            |e| e.configure.clone(),
            (root, plugin_size),
            what,
        );
        self.state(vm).in_configure = false;
        if ok? == Some(0) {
            let tail = tail_logs(self.logs(vm));
            bail!(
                "VM {vm}: proxy_on_configure returned false (plugin configuration rejected)\n\
                 recent guest logs:\n{tail}"
            );
        }
        self.settle(vm)
    }

    /// Runs actions deferred by the last guest calls (Envoy's after-VM-call actions).
    pub(super) fn settle(&mut self, vm: usize) -> Result<()> {
        if self.depth > 32 {
            bail!("VM {vm}: deferred actions nest too deeply (filter loops on continue/reply?)");
        }
        self.depth += 1;
        let mut result = Ok(());
        while let Some(action) = self.state(vm).deferred.pop_front() {
            result = match action {
                Deferred::Continue { ctx, response } => self.resume(vm, ctx, response),
                Deferred::LocalReply { ctx, reply } => self.local_reply(vm, ctx, reply),
                Deferred::Close { ctx } => self.end_stream(vm, ctx, true),
            };
            if result.is_err() {
                break;
            }
        }
        self.depth -= 1;
        result
    }

    /// Delivers queue notifications (Envoy posts them to the registrant's worker).
    pub(super) fn pump(&mut self) -> Result<()> {
        for _ in 0..100_000 {
            let next = lock(&self.shared).queue_ready.pop_front();
            let Some((vm, ctx, token)) = next else {
                return Ok(());
            };
            if self.vms.get(vm).is_none_or(|s| s.failed.is_some()) {
                continue;
            }
            let args = (ctx as i32, token as i32);
            self.invoke(
                vm,
                ctx,
                |e| e.queue_ready.clone(),
                args,
                "proxy_on_queue_ready",
            )?;
            self.settle(vm)?;
        }
        bail!("shared queue notifications keep coming (enqueue loop?)")
    }

    pub(super) fn deliver_call_response(
        &mut self,
        call: HttpCall,
        response: Option<CallResponse>,
    ) -> Result<()> {
        let (vm, ctx) = (call.vm, call.context_id);
        self.check_vm(vm)?;
        let s = self.state(vm);
        if ctx != s.root_ctx && s.streams.get(&ctx).is_none_or(|st| st.finished) {
            bail!(
                "HTTP call {} was cancelled: its context {ctx} is gone",
                call.token
            );
        }
        let (headers, body) = match &response {
            Some(r) => (r.headers.len(), r.body.len()),
            None => (0, 0),
        };
        if response.is_none() {
            s.status = (Status::BrokenConnection as u32, b"reset".to_vec());
        }
        s.call_response = response;
        let args = (
            ctx as i32,
            call.token as i32,
            headers as i32,
            body as i32,
            0,
        );
        let what = "proxy_on_http_call_response";
        let r = self.invoke(vm, ctx, |e| e.http_call_response.clone(), args, what);
        let s = self.state(vm);
        s.call_response = None;
        s.status.1.clear();
        r?;
        self.settle(vm)?;
        self.pump()
    }
}
