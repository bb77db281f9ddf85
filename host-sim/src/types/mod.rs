//! Layer 1, plain types: the ABI's codes, the pairs encoding, the values the host's API
//! takes and returns, fault descriptions, the seeded generator. Nothing here knows about
//! wasmtime or imports another module of the crate; every layer above may use it.

pub(crate) mod codes;
pub(crate) mod fault;
pub(crate) mod pairs;
pub(crate) mod rng;
pub(crate) mod values;
