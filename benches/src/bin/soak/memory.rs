//! What the soak measures and how it judges it: Envoy's resident memory
//! (`VmRSS` in `/proc/<pid>/status`), and per Wasm VM its linear memory and the
//! chars its trees hold (the filter's `llm_router_vm.<id>.*` gauges, set on each
//! tick). A VM's linear memory never shrinks (Wasm has no way to give pages back),
//! so it is a high-water mark: flat means no new page was needed.
//!
//! Verdict: after the warm-up sample (the first at or past `--warm-up` requests, when
//! the trees have reached their budget), Envoy's RSS and every VM's memory at the end
//! are within `bound_pct` percent of what they were then, and no VM was replaced (a
//! VM that trapped is reloaded under a new id, starting small again).

pub use llm_bench::envoy_memory::Vm;
use std::collections::BTreeMap;

/// One row of the table.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub requests: usize,
    pub elapsed_s: f64,
    pub errors: usize,
    pub envoy_rss_bytes: u64,
    /// By VM id.
    pub vms: BTreeMap<String, Vm>,
}

/// Growth from the warm-up sample to the last one.
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    /// The sample growth is measured from (its request count).
    pub warm_requests: usize,
    pub rss_growth_pct: f64,
    /// Per VM alive at both ends.
    pub vm_growth_pct: BTreeMap<String, f64>,
    /// VMs that appeared after the warm-up (a reloaded VM gets a new id).
    pub new_vms: Vec<String>,
    pub flat: bool,
}

fn growth_pct(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) * 100.0 / (from.max(1) as f64)
}

/// `None` when no sample is at or past the warm-up with one after it.
pub fn verdict(samples: &[Sample], warm_up: usize, bound_pct: f64) -> Option<Verdict> {
    let warm = samples.iter().position(|s| s.requests >= warm_up)?;
    let (first, last) = (&samples[warm], samples.last()?);
    if std::ptr::eq(first, last) {
        return None;
    }
    let rss_growth_pct = growth_pct(first.envoy_rss_bytes, last.envoy_rss_bytes);
    let vm_growth_pct: BTreeMap<String, f64> = last
        .vms
        .iter()
        .filter_map(|(id, v)| {
            let before = first.vms.get(id)?;
            Some((id.clone(), growth_pct(before.memory_bytes, v.memory_bytes)))
        })
        .collect();
    let new_vms: Vec<String> = last
        .vms
        .keys()
        .filter(|id| !first.vms.contains_key(*id))
        .cloned()
        .collect();
    // A reloaded VM (it trapped) starts small again and would hide growth.
    let flat = rss_growth_pct <= bound_pct
        && vm_growth_pct.values().all(|g| *g <= bound_pct)
        && new_vms.is_empty();
    Some(Verdict {
        warm_requests: first.requests,
        rss_growth_pct,
        vm_growth_pct,
        new_vms,
        flat,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(requests: usize, rss_mib: u64, vms: &[(&str, u64)]) -> Sample {
        Sample {
            requests,
            envoy_rss_bytes: rss_mib << 20,
            vms: vms
                .iter()
                .map(|(id, mib)| {
                    let v = Vm {
                        memory_bytes: mib << 20,
                        tree_chars: 0,
                    };
                    (id.to_string(), v)
                })
                .collect(),
            ..Sample::default()
        }
    }

    #[test]
    fn growth_is_judged_from_the_warm_up_sample_to_the_last() {
        let run = [
            sample(0, 50, &[("a", 2)]),
            sample(10, 80, &[("a", 20)]),
            sample(20, 100, &[("a", 40)]),
            sample(30, 104, &[("a", 40)]),
            sample(40, 109, &[("a", 42)]),
        ];
        let v = verdict(&run, 20, 10.0).expect("a sample past the warm-up");
        assert_eq!(v.warm_requests, 20);
        assert!((v.rss_growth_pct - 9.0).abs() < 1e-9);
        assert!((v.vm_growth_pct["a"] - 5.0).abs() < 1e-9);
        assert!(v.flat, "growth before the warm-up does not count");
        let v = verdict(&run, 10, 10.0).expect("verdict");
        assert!(!v.flat, "36% after a warm-up at 10");
        assert!(
            !verdict(&run, 20, 8.0).expect("verdict").flat,
            "9% is over 8%"
        );
    }

    #[test]
    fn a_reloaded_vm_is_reported_new_and_no_verdict_without_samples_after_warm_up() {
        let run = [sample(20, 100, &[("a", 40)]), sample(30, 100, &[("b", 40)])];
        let v = verdict(&run, 20, 10.0).expect("verdict");
        assert_eq!(v.new_vms, ["b"]);
        assert!(v.vm_growth_pct.is_empty());
        assert!(!v.flat, "a reload hides growth: not flat");
        assert_eq!(verdict(&run[..1], 20, 10.0), None);
        assert_eq!(verdict(&run, 40, 10.0), None);
    }
}
