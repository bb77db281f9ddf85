//! End-to-end test support: the differential scenario runner ([`scenario`]) and the
//! helpers every end-to-end test file shares ([`support`]). The fleet itself (engine
//! mocks, the collector, Envoy) is started by the demo's harness, `llm_demo`.

pub mod scenario;
pub mod support;
