//! WASI inside a filter VM, as Envoy provides it: output becomes log lines, time is the
//! host's virtual clock, randomness is the VM's seeded generator, no args, the
//! configured environment (`HostBuilder::env`), no blocking.

use super::WasiHost;
use crate::state::{lock, HostState};

impl WasiHost for HostState {
    const SLEEPS: bool = false;

    fn args(&self) -> &[Vec<u8>] {
        &[]
    }

    fn environ(&self) -> &[Vec<u8>] {
        &self.cfg.environ
    }

    fn output(&mut self, fd: i32, data: &[u8]) -> bool {
        self.write_stdio(fd, data);
        true
    }

    fn clock_ns(&self, id: i32) -> Option<u64> {
        let shared = lock(&self.shared);
        match id {
            0 => Some(shared.now_ns),
            // Monotonic and CPU clocks: time since the host started, plus one second.
            1..=3 => Some(
                shared
                    .now_ns
                    .saturating_sub(shared.start_ns)
                    .saturating_add(1_000_000_000),
            ),
            _ => None,
        }
    }

    fn fill_random(&mut self, buf: &mut [u8]) {
        self.rng.fill(buf);
    }

    fn exit(&mut self, _code: i32) {}
}
