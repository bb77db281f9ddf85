//! What the filter does between requests, on its ticks and the collector's pushes:
//! workers' failures and probes (`health`), the overload flags (`overload`),
//! discovery mode's worker list (`membership`), peer replicas' reports
//! (`replica`), and what each tick reports per worker (`worker_stats`).

pub mod health;
pub mod membership;
pub mod overload;
pub mod replica;
pub mod worker_stats;
