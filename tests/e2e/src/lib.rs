//! End-to-end test support: the differential scenario runner ([`scenario`]), the
//! helpers every end-to-end test file shares ([`support`]) and a real Prometheus for
//! the observability tests ([`prometheus`]). The fleet itself (engine mocks, the
//! collector, Envoy) is started by the demo's harness, `llm_demo`.

pub mod prometheus;
pub mod scenario;
pub mod support;
