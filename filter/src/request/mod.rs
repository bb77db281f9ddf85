//! A request's path after its body is parsed: the serving candidates after the
//! screens (`candidates`), the policy's choice over the model's tree (`router`,
//! `model_trees`), the whole decision (`plan`, with PD's bootstrap rewrite, `pd`,
//! and the header naming the worker, `target`), and what applying it books
//! (`bookkeeping`); `models` answers `/v1/models` instead of routing. What each
//! worker's engine can hold of the trees is `kv_bounds`.

pub mod bookkeeping;
pub mod candidates;
pub mod kv_bounds;
pub mod model_trees;
pub mod models;
pub mod pd;
pub mod plan;
pub mod router;
pub mod target;
