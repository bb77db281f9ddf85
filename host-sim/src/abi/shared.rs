//! Shared data and shared queues: one store for all VMs of the host (Envoy's is per
//! process, scoped by `vm_id`), with Envoy's CAS rules (`cas = 0` is unconditional, a
//! mismatch is CasMismatch, a missing key is created whatever the CAS); a queue
//! delivers to its last registrant.

use super::{st, C};
use crate::hostcall::{Guest, Registry};
use crate::state::{lock, HostState, Queue};
use crate::types::codes::Status;
use wasmtime::Result;

/// Registers the shared-data and shared-queue hostcalls.
pub(super) fn register(r: &mut Registry<HostState>) -> Result<()> {
    r.wrap(
        "proxy_get_shared_data",
        |mut c: C, key_ptr: i32, key_len: i32, ptr_ptr: i32, size_ptr: i32, cas_ptr: i32| {
            let mut g = Guest::new(&mut c);
            let key = g.read_string(key_ptr, key_len)?;
            let vm = g.state().vm;
            let entry = lock(&g.state().shared).get_data(vm, &key);
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
            let vm = g.state().vm;
            let status = lock(&g.state().shared).set_data_from(vm, &key, value, cas as u32);
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
                let queue = shared.queues.entry(token).or_insert(Queue {
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
    Ok(())
}
