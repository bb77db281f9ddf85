//! Each VM reports its own linear memory and tree size (`llm_router_vm.<id>.*`), the
//! figures `benches/soak` reads: one name per VM, since a gauge of one name is one value
//! for all VMs in Envoy.

mod support;

use host_sim::MetricValue;
use llm_router::support::metric_names::{split_vm_metric, vm};
use std::collections::BTreeMap;

/// `(memory_bytes, tree_chars)` by VM id.
fn vm_gauges(host: &host_sim::Host) -> BTreeMap<String, (u64, u64)> {
    let mut out: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for (name, value) in host.metrics() {
        let (Some((id, field)), MetricValue::Gauge(v)) = (
            name.strip_prefix("wasmcustom.").and_then(split_vm_metric),
            value,
        ) else {
            continue;
        };
        let e = out.entry(id.to_string()).or_default();
        match field {
            vm::MEMORY_BYTES => e.0 = v,
            vm::TREE_CHARS => e.1 = v,
            other => panic!("unexpected VM gauge field {other}"),
        }
    }
    out
}

#[test]
fn every_vm_reports_its_own_memory_and_tree_chars_on_its_tick() {
    // Every VM keeping a replica of the trees (`one_vm`: `tests/relay.rs`).
    let config = support::fleet_config(2, r#","route_in":"every_vm""#);
    let mut host = support::host::<&str>(&config, 2, 7, &[]);
    let prompt = "a prompt long enough to be worth caching ".repeat(50);
    // A VM keeps the tree once it has had a stream (Envoy's main thread never does).
    support::route_completion(&mut host, 1, "hi");
    support::route_completion(&mut host, 0, &prompt);
    // Every VM ticks (sync_interval_ms is 1 s): VM 1 catches up with VM 0's insert.
    host.advance_time(2_000).expect("ticks");
    let gauges = vm_gauges(&host);
    assert_eq!(gauges.len(), 2, "one id per VM: {gauges:?}");
    for (id, (memory, tree)) in &gauges {
        assert!(
            *memory > 0 && memory % 65_536 == 0,
            "VM {id}: memory is whole Wasm pages, got {memory}"
        );
        assert!(
            *tree >= prompt.len() as u64,
            "VM {id} holds the routed prompt ({} chars), got {tree}",
            prompt.len()
        );
    }
    let trees: Vec<u64> = gauges.values().map(|g| g.1).collect();
    assert_eq!(trees[0], trees[1], "both VMs hold the same tree");
}
