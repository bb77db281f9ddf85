//! The shape and naming of a simulated fleet, shared by everything that starts one
//! (`envoy/demo`'s engine mocks and Envoy config, `host-sim replay`'s simulated
//! engines, the end-to-end harness), so a worker is called the same everywhere and a
//! run in Envoy can be compared with a run in host-sim name for name.

/// Engine (worker) names: `w0`, `w1`...
pub fn worker_name(i: usize) -> String {
    format!("w{i}")
}

/// The Envoy cluster of a worker in `target: cluster` mode.
pub fn cluster_name(worker: &str) -> String {
    format!("engine_{worker}")
}

/// Prefill/decode flags; `envoy/demo` and `host-sim replay` take the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Args)]
pub struct PdArgs {
    /// Prefill/decode disaggregation: `--prefill-workers` prefill and
    /// `--decode-workers` decode engines instead of `--workers` regular ones;
    /// `--policy` (and the baseline) is then the prefill pool's policy.
    #[arg(long)]
    pub pd: bool,
    #[arg(long, default_value_t = 2)]
    pub prefill_workers: usize,
    #[arg(long, default_value_t = 2)]
    pub decode_workers: usize,
}

impl PdArgs {
    /// `(prefill, decode)` engines with `--pd`.
    pub fn pools(&self) -> Option<(usize, usize)> {
        self.pd
            .then_some((self.prefill_workers, self.decode_workers))
    }

    /// Engines in the fleet: the two pools', else `workers` regular ones.
    pub fn engines(&self, workers: usize) -> usize {
        self.pools().map_or(workers, |(p, d)| p + d)
    }

    /// The pool the demo's `--policy` routes: the prefill pool's size, else `workers`.
    pub fn routed_pool(&self, workers: usize) -> usize {
        self.pools().map_or(workers, |(p, _)| p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pd_flags_size_the_fleet() {
        let off = PdArgs {
            pd: false,
            prefill_workers: 3,
            decode_workers: 1,
        };
        assert_eq!(
            (off.pools(), off.engines(4), off.routed_pool(4)),
            (None, 4, 4)
        );
        let on = PdArgs { pd: true, ..off };
        assert_eq!(
            (on.pools(), on.engines(4), on.routed_pool(4)),
            (Some((3, 1)), 4, 3)
        );
    }
}
