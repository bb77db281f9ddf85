//! What an Envoy holds: its resident memory (`VmRSS` of `/proc/<pid>/status`, every
//! thread's VM, tree and buffers with Envoy's own), and the Wasm linear memory of
//! the router's VMs, which each VM reports as a gauge
//! (`llm_router_vm.<vm>.memory_bytes`, a high-water mark). Read after a
//! repetition's loaded phase, so the trees are as large as the run makes them.

use anyhow::{Context, Result};
use llm_router::support::metric_names::{split_vm_metric, vm};
use std::collections::BTreeMap;

/// Resident memory of `pid`, in bytes.
pub fn rss_bytes(pid: u32) -> Result<u64> {
    let path = format!("/proc/{pid}/status");
    let status = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_rss(&status).with_context(|| format!("{path}: no VmRSS"))
}

/// `VmRSS:   123456 kB` in bytes.
fn parse_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The router's VMs' Wasm memory together, from an Envoy's stats (`None`: no VM
/// reports it, as for the floor).
pub fn vm_bytes(stats: &BTreeMap<String, u64>) -> Option<u64> {
    let gauges: Vec<u64> = stats
        .iter()
        .filter_map(|(name, v)| {
            let custom = name.strip_prefix("wasmcustom.")?;
            let (_, gauge) = split_vm_metric(custom)?;
            (gauge == vm::MEMORY_BYTES).then_some(*v)
        })
        .collect();
    (!gauges.is_empty()).then(|| gauges.iter().sum())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rss_is_read_in_bytes() {
        let status = "Name:\tenvoy\nVmPeak:\t  900 kB\nVmRSS:\t  51200 kB\nThreads:\t9\n";
        assert_eq!(parse_rss(status), Some(51200 * 1024));
        assert_eq!(parse_rss("Name:\tenvoy\n"), None);
        assert!(
            rss_bytes(std::process::id()).unwrap() > 0,
            "this process is resident"
        );
    }

    #[test]
    fn vm_memory_sums_every_vm_and_nothing_else() {
        let stats: BTreeMap<String, u64> = [
            ("wasmcustom.llm_router_vm.1a2b3c4d.memory_bytes", 3 << 20),
            ("wasmcustom.llm_router_vm.5e6f7a8b.memory_bytes", 5 << 20),
            ("wasmcustom.llm_router_vm.5e6f7a8b.tree_chars", 999),
            ("server.memory_allocated", 77),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(vm_bytes(&stats), Some(8 << 20));
        assert_eq!(vm_bytes(&BTreeMap::new()), None);
    }
}
