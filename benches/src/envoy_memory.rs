//! What an Envoy holds: its resident memory (`VmRSS` in `/proc/<pid>/status`: every
//! thread's VM, trees and buffers with Envoy's own), and per Wasm VM its linear
//! memory and the chars its trees hold (the filter's `llm_router_vm.<id>.*` gauges,
//! set on each tick). The soak judges their growth; the overhead benchmark prints
//! them beside CPU.

use llm_router::support::metric_names::{split_vm_metric, vm};
use std::collections::BTreeMap;

/// One VM's gauges.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Vm {
    pub memory_bytes: u64,
    pub tree_chars: u64,
}

/// `VmRSS` of a `/proc/<pid>/status` text, in bytes.
pub fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// A process's resident memory now, in bytes.
pub fn rss(pid: u32) -> anyhow::Result<u64> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path)?;
    parse_rss(&text).ok_or_else(|| anyhow::anyhow!("{path}: no VmRSS"))
}

/// The per-VM gauges among Envoy's `/stats` (`wasmcustom.llm_router_vm.<id>.<field>`).
pub fn vm_gauges(stats: &BTreeMap<String, u64>) -> BTreeMap<String, Vm> {
    let mut out: BTreeMap<String, Vm> = BTreeMap::new();
    for (name, value) in stats {
        let Some((id, field)) = name.strip_prefix("wasmcustom.").and_then(split_vm_metric) else {
            continue;
        };
        let entry = out.entry(id.to_string()).or_default();
        match field {
            vm::MEMORY_BYTES => entry.memory_bytes = *value,
            vm::TREE_CHARS => entry.tree_chars = *value,
            _ => {}
        }
    }
    out
}

/// The router's VMs' Wasm memory together (`None`: no VM reports it, as for a
/// filter that is not the router).
pub fn vms_memory_bytes(stats: &BTreeMap<String, u64>) -> Option<u64> {
    let vms = vm_gauges(stats);
    (!vms.is_empty()).then(|| vms.values().map(|v| v.memory_bytes).sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_in_bytes_from_the_status_file() {
        let status = "Name:\tenvoy\nVmPeak:\t  900 kB\nVmRSS:\t   81234 kB\nThreads:\t12\n";
        assert_eq!(parse_rss(status), Some(81234 * 1024));
        assert_eq!(parse_rss("Name:\tx\n"), None);
    }

    #[test]
    fn vm_gauges_are_grouped_by_id() {
        let stats: BTreeMap<String, u64> = [
            ("wasmcustom.llm_router_vm.0a0b.memory_bytes", 3 << 20),
            ("wasmcustom.llm_router_vm.0a0b.tree_chars", 500),
            ("wasmcustom.llm_router_vm.ffff.memory_bytes", 2 << 20),
            ("wasmcustom.llm_router_tree_chars", 9),
            ("wasmcustom.llm_router_worker.w0.routed", 1),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        let vms = vm_gauges(&stats);
        assert_eq!(vms.len(), 2);
        assert_eq!(
            vms["0a0b"],
            Vm {
                memory_bytes: 3 << 20,
                tree_chars: 500
            }
        );
        assert_eq!(vms["ffff"].tree_chars, 0);
    }

    #[test]
    fn the_vms_memory_is_summed_and_absent_without_a_vm() {
        let stats: BTreeMap<String, u64> = [
            ("wasmcustom.llm_router_vm.1a2b.memory_bytes", 3 << 20),
            ("wasmcustom.llm_router_vm.5e6f.memory_bytes", 5 << 20),
        ]
        .map(|(k, v)| (k.to_string(), v))
        .into();
        assert_eq!(vms_memory_bytes(&stats), Some(8 << 20));
        assert_eq!(vms_memory_bytes(&BTreeMap::new()), None);
        assert!(
            rss(std::process::id()).unwrap() > 0,
            "this process is resident"
        );
    }
}
