//! Helpers of the glue and the core alike: batched counters (`counters`), the names
//! of the headers and metrics the filter emits (`header_names`, `metric_names`), a
//! host header map read in place (`header_pairs`), and the VM's allocator
//! (`small_blocks`).

pub mod counters;
pub mod header_names;
pub mod header_pairs;
pub mod metric_names;
pub mod small_blocks;
