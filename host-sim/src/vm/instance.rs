//! One VM instance: a wasmtime `Store` holding the [`HostState`], the guest's
//! proxy-wasm exports (typed once), and whether the VM failed. Instantiation runs the
//! WASI initializer (`_initialize`, else `_start`).

use super::filter::Filter;
use crate::hostcall::wasm_err;
use crate::state::{Config, HostState, Shared};
use crate::types::values::LogEntry;
use anyhow::{bail, Context as _, Result};
use std::sync::{Arc, Mutex};
use wasmtime::{Instance, Store, TypedFunc, WasmParams, WasmResults};

pub(super) type Export<P, R> = Option<TypedFunc<P, R>>;

/// The guest's proxy-wasm callbacks, typed once at instantiation; `None` where the
/// guest does not export one (the call is then skipped, as Envoy skips it).
pub(super) struct Exports {
    pub(super) context_create: Export<(i32, i32), ()>,
    pub(super) vm_start: Export<(i32, i32), i32>,
    pub(super) configure: Export<(i32, i32), i32>,
    pub(super) tick: Export<i32, ()>,
    pub(super) queue_ready: Export<(i32, i32), ()>,
    pub(super) request_headers: Export<(i32, i32, i32), i32>,
    pub(super) request_body: Export<(i32, i32, i32), i32>,
    pub(super) response_headers: Export<(i32, i32, i32), i32>,
    pub(super) response_body: Export<(i32, i32, i32), i32>,
    pub(super) http_call_response: Export<(i32, i32, i32, i32, i32), ()>,
    pub(super) log: Export<i32, ()>,
    pub(super) done: Export<i32, i32>,
    pub(super) delete: Export<i32, ()>,
}

/// One VM: its store, its callbacks, and why it failed (a trap), if it did.
pub(super) struct Slot {
    pub(super) store: Store<HostState>,
    pub(super) ex: Exports,
    pub(super) failed: Option<String>,
    /// Fresh VMs that replaced a failed one
    /// ([`FailurePolicy::FailReload`](crate::FailurePolicy::FailReload)).
    pub(super) reloads: u32,
}

/// The export `name` typed as proxy-wasm 0.2.1 declares it; `None` if absent.
fn export<P: WasmParams, R: WasmResults>(
    instance: &Instance,
    store: &mut Store<HostState>,
    name: &str,
) -> Result<Export<P, R>> {
    match instance.get_func(&mut *store, name) {
        None => Ok(None),
        Some(f) => Ok(Some(f.typed(&*store).map_err(wasm_err).with_context(
            || format!("export {name} does not have the proxy-wasm 0.2.1 signature"),
        )?)),
    }
}

impl Slot {
    pub(super) fn instantiate(
        filter: &Filter,
        vm: usize,
        cfg: Arc<Config>,
        shared: Arc<Mutex<Shared>>,
    ) -> Result<Self> {
        let mut store = Store::new(&filter.engine, HostState::new(vm, cfg, shared));
        store.limiter(|s| &mut s.limits);
        if filter.metered {
            store.set_fuel(u64::MAX).map_err(wasm_err)?;
        }
        let instance = filter.pre.instantiate(&mut store).map_err(wasm_err)?;
        let memory = instance.get_memory(&mut store, "memory");
        let alloc = match export::<i32, i32>(&instance, &mut store, "proxy_on_memory_allocate")? {
            Some(f) => Some(f),
            None => export(&instance, &mut store, "malloc")?,
        };
        store.data_mut().memory = memory;
        store.data_mut().alloc = alloc;
        let s = &mut store;
        let ex = Exports {
            context_create: export(&instance, s, "proxy_on_context_create")?,
            vm_start: export(&instance, s, "proxy_on_vm_start")?,
            configure: export(&instance, s, "proxy_on_configure")?,
            tick: export(&instance, s, "proxy_on_tick")?,
            queue_ready: export(&instance, s, "proxy_on_queue_ready")?,
            request_headers: export(&instance, s, "proxy_on_request_headers")?,
            request_body: export(&instance, s, "proxy_on_request_body")?,
            response_headers: export(&instance, s, "proxy_on_response_headers")?,
            response_body: export(&instance, s, "proxy_on_response_body")?,
            http_call_response: export(&instance, s, "proxy_on_http_call_response")?,
            log: export(&instance, s, "proxy_on_log")?,
            done: export(&instance, s, "proxy_on_done")?,
            delete: export(&instance, s, "proxy_on_delete")?,
        };
        if ex.context_create.is_none() {
            bail!("the module does not export proxy_on_context_create");
        }
        let init = match export::<(), ()>(&instance, s, "_initialize")? {
            Some(f) => Some(f),
            None => export::<(), ()>(&instance, s, "_start")?,
        };
        if let Some(init) = init {
            if let Err(e) = init.call(&mut store, ()) {
                store.data_mut().flush_stdio();
                let tail = tail_logs(&store.data().logs);
                bail!("_initialize/_start trapped: {e:?}\nrecent guest logs:\n{tail}");
            }
        }
        Ok(Self {
            store,
            ex,
            failed: None,
            reloads: 0,
        })
    }
}

pub(super) fn tail_logs(logs: &[LogEntry]) -> String {
    let start = logs.len().saturating_sub(12);
    logs[start..]
        .iter()
        .map(|l| format!("  [{:?} {:?}] {}", l.source, l.level, l.message))
        .collect::<Vec<_>>()
        .join("\n")
}
