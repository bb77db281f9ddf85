//! What the filter does between requests, on its ticks and the collector's pushes,
//! beside the workers' state machines (`crate::worker`): discovery mode's worker
//! list (`membership`), peer replicas' reports (`replica`), and what each tick
//! reports per worker (`worker_stats`).

pub mod membership;
pub mod replica;
pub mod worker_stats;
