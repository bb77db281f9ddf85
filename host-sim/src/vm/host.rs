//! [`Host`]: a set of VMs running one filter, like the worker threads of one Envoy
//! process, and its public API: the virtual clock (ticks and HTTP-call timeouts fire in
//! time order), logs, metrics, shared data and queues, HTTP-call answers, faults.

use super::filter::Filter;
use super::instance::Slot;
use crate::state::{lock, CallResponse, Config, Shared};
use crate::types::fault::Fault;
use crate::types::values::{owned_headers, HttpCall, LogEntry, MetricValue};
use anyhow::{anyhow, bail, Result};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// A set of VMs running one filter, like the worker threads of one Envoy process.
pub struct Host {
    pub(super) cfg: Arc<Config>,
    pub(super) shared: Arc<Mutex<Shared>>,
    pub(super) filter: Filter,
    pub(super) vms: Vec<Slot>,
    /// Nesting of deferred actions (a filter that loops on continue/reply).
    pub(super) depth: u32,
}

impl Host {
    /// Number of VMs.
    pub fn vm_count(&self) -> usize {
        self.vms.len()
    }

    /// Virtual time, ms since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        lock(&self.shared).now_ns / 1_000_000
    }

    /// Advances the virtual clock by `ms`, firing in time order every due `proxy_on_tick` (on
    /// every VM whose tick period elapsed, as every Envoy worker ticks) and answering HTTP
    /// calls whose timeout expired with a 504, then delivering queue notifications.
    pub fn advance_time(&mut self, ms: u64) -> Result<()> {
        let target = lock(&self.shared)
            .now_ns
            .saturating_add(ms.saturating_mul(1_000_000));
        loop {
            let next_tick = self
                .vms
                .iter()
                .enumerate()
                .filter(|(_, slot)| slot.failed.is_none())
                .filter_map(|(vm, slot)| slot.store.data().next_tick_ns.map(|t| (t, vm)))
                .min();
            let next_timeout = lock(&self.shared)
                .http_calls
                .values()
                .filter(|c| c.timeout_ms > 0)
                .map(|c| {
                    let deadline_ms = c.dispatched_at_ms.saturating_add(c.timeout_ms as u64);
                    (deadline_ms.saturating_mul(1_000_000), c.token)
                })
                .min();
            let timeout_first = match (next_tick, next_timeout) {
                (_, Some((t, _))) if t > target => false,
                (Some((tick, _)), Some((t, _))) => t < tick,
                (None, Some(_)) => true,
                _ => false,
            };
            if timeout_first {
                let (t, token) = next_timeout.unwrap_or_default();
                self.set_now(t);
                let call = lock(&self.shared).http_calls.remove(&token);
                if let Some(call) = call {
                    let headers = vec![
                        (":status".to_string(), "504".to_string()),
                        ("content-length".to_string(), "24".to_string()),
                        ("content-type".to_string(), "text/plain".to_string()),
                    ];
                    let body = b"upstream request timeout".to_vec();
                    self.deliver_call_response(call, Some(CallResponse { headers, body }))?;
                }
                continue;
            }
            let Some((t, vm)) = next_tick.filter(|(t, _)| *t <= target) else {
                break;
            };
            self.set_now(t);
            let s = self.vms[vm].store.data_mut();
            s.next_tick_ns = Some(t.saturating_add(s.tick_period_ms * 1_000_000));
            let root = s.root_ctx;
            self.invoke(vm, root, |e| e.tick.clone(), root as i32, "proxy_on_tick")?;
            self.settle(vm)?;
            self.pump()?;
        }
        self.set_now(target);
        Ok(())
    }

    fn set_now(&self, t: u64) {
        let mut shared = lock(&self.shared);
        shared.now_ns = shared.now_ns.max(t);
    }

    /// Log lines captured on one VM (empty for an unknown VM).
    pub fn logs(&self, vm: usize) -> &[LogEntry] {
        self.vms
            .get(vm)
            .map_or(&[], |s| s.store.data().logs.as_slice())
    }

    /// Log lines of all VMs, VM by VM.
    pub fn all_logs(&self) -> Vec<LogEntry> {
        self.vms
            .iter()
            .flat_map(|s| s.store.data().logs.iter().cloned())
            .collect()
    }

    /// Value of a counter or gauge by its Envoy name (`wasmcustom.NAME`).
    pub fn metric(&self, name: &str) -> Option<u64> {
        match lock(&self.shared).metrics.get(name)? {
            MetricValue::Counter(v) | MetricValue::Gauge(v) => Some(*v),
            MetricValue::Histogram(_) => None,
        }
    }

    /// Values recorded into a histogram (`wasmcustom.NAME`).
    pub fn histogram(&self, name: &str) -> Option<Vec<u64>> {
        match lock(&self.shared).metrics.get(name)? {
            MetricValue::Histogram(values) => Some(values.clone()),
            _ => None,
        }
    }

    /// All metrics defined by the filter.
    pub fn metrics(&self) -> BTreeMap<String, MetricValue> {
        lock(&self.shared).metrics.clone()
    }

    /// Shared-data value (common to all VMs).
    pub fn shared_data(&self, key: &str) -> Option<Vec<u8>> {
        lock(&self.shared).data.get(key).map(|(v, _)| v.clone())
    }

    /// Shared-data keys, sorted.
    pub fn shared_data_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = lock(&self.shared).data.keys().cloned().collect();
        keys.sort();
        keys
    }

    /// Shared-data value with its CAS.
    pub fn shared_data_with_cas(&self, key: &str) -> Option<(Vec<u8>, u32)> {
        lock(&self.shared).data.get(key).cloned()
    }

    /// Delivers a new plugin configuration to every VM (`proxy_on_configure` again, as
    /// on a config update that keeps the VMs); an error if a VM rejects it.
    pub fn reconfigure(&mut self, plugin_config: impl Into<Vec<u8>>) -> Result<()> {
        Arc::make_mut(&mut self.cfg).plugin_config = plugin_config.into();
        for vm in 0..self.vms.len() {
            self.state(vm).cfg = self.cfg.clone();
            self.configure(vm)?;
        }
        Ok(())
    }

    /// Makes VM `vm`'s reads of `key` answer what the key holds now (`NotFound` if
    /// missing, with its CAS otherwise) until that VM next writes the key, whatever
    /// other VMs write meanwhile: a thread that read the key now and writes it only
    /// after them. The write itself meets the real store (a stale CAS mismatches),
    /// and later reads are real. With two VMs this reproduces, one step at a time,
    /// two Envoy threads racing a read-modify-write of one key.
    pub fn pin_reads(&mut self, vm: usize, key: &str) {
        let mut shared = lock(&self.shared);
        let now = shared.data.get(key).cloned();
        shared.pinned_reads.insert((vm, key.to_string()), now);
    }

    /// Sets shared data unconditionally (as another plugin would), bumping the CAS.
    pub fn set_shared_data(&mut self, key: &str, value: impl Into<Vec<u8>>) {
        lock(&self.shared).set_data(key, value.into(), 0);
    }

    /// All HTTP calls still waiting for an answer, by token.
    pub fn pending_http_calls(&self) -> Vec<HttpCall> {
        lock(&self.shared).http_calls.values().cloned().collect()
    }

    /// Total `clear_route_cache` calls over all VMs and contexts.
    pub fn clear_route_cache_total(&self) -> u64 {
        lock(&self.shared).clear_route_cache_total
    }

    /// Answers a pending HTTP call: runs `proxy_on_http_call_response` on the calling
    /// context with `:status` plus `headers` and `body`, then deferred actions (e.g. the
    /// filter resuming its stream).
    pub fn answer_http_call(
        &mut self,
        token: u32,
        status: u32,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<()> {
        let call = self.take_call(token)?;
        let mut all = vec![(":status".to_string(), status.to_string())];
        all.extend(owned_headers(headers));
        let response = CallResponse {
            headers: all,
            body: body.to_vec(),
        };
        self.deliver_call_response(call, Some(response))
    }

    /// Fails a pending HTTP call like a connection reset: the callback sees 0 headers and
    /// `proxy_get_status` returns BrokenConnection / "reset".
    pub fn fail_http_call(&mut self, token: u32) -> Result<()> {
        let call = self.take_call(token)?;
        self.deliver_call_response(call, None)
    }

    /// Enqueues `data` on a shared queue registered by the filter (as another VM would).
    pub fn enqueue(&mut self, queue: &str, data: &[u8]) -> Result<()> {
        {
            let mut shared = lock(&self.shared);
            let key = (self.cfg.vm_id.clone(), queue.to_string());
            let token = *shared
                .queue_names
                .get(&key)
                .ok_or_else(|| anyhow!("no shared queue named {queue:?}"))?;
            let Some(q) = shared.queues.get_mut(&token) else {
                bail!("no shared queue named {queue:?}");
            };
            q.items.push_back(data.to_vec());
            let ready = (q.vm, q.context_id, token);
            shared.queue_ready.push_back(ready);
        }
        self.pump()
    }

    /// Injects a fault: from now on, the hostcall answers the fault's status when its
    /// trigger fires (see [`Fault`]).
    pub fn inject(&mut self, fault: Fault) {
        lock(&self.shared).faults.rules.push(fault);
    }

    /// Removes every injected fault (call counts keep running).
    pub fn clear_faults(&mut self) {
        lock(&self.shared).faults.rules.clear();
    }

    /// How many hostcalls answered an injected fault so far.
    pub fn faults_fired(&self) -> u64 {
        lock(&self.shared).faults.fired
    }

    /// Wasm instructions the VMs ran so far (fuel, one unit per instruction), over all
    /// VMs; `None` unless the filter was loaded with [`Filter::metered`](crate::Filter::metered).
    /// A VM replaced after a trap starts counting again.
    pub fn guest_instructions(&self) -> Option<u64> {
        self.vms
            .iter()
            .map(|s| s.store.get_fuel().ok().map(|left| u64::MAX - left))
            .sum()
    }

    /// Calls per hostcall so far, over all VMs (faulted calls included).
    pub fn hostcall_counts(&self) -> BTreeMap<String, u64> {
        let shared = lock(&self.shared);
        let calls = shared.faults.calls.iter();
        calls.map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// How many times a VM was replaced by a fresh one
    /// ([`FailurePolicy::FailReload`](crate::FailurePolicy::FailReload)).
    pub fn reloads(&self, vm: usize) -> u32 {
        self.vms.get(vm).map_or(0, |s| s.reloads)
    }

    /// Why a VM failed (a trap), if it did and was not reloaded since.
    pub fn failure(&self, vm: usize) -> Option<&str> {
        self.vms.get(vm)?.failed.as_deref()
    }
}
