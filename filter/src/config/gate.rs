//! The queue gate's knobs (`worker_queue_limit`, `saturation_queue_floor`), which
//! depend on each other: checked in the order an operator should fix them.

use super::{err, Config, ConfigError};

impl Config {
    /// The limit's value, then the floor's dependency on the limit, its own value,
    /// and its bound by the limit: each error names the first thing to fix, so an
    /// operator never fixes a value only to learn it needed another field.
    pub(super) fn validate_queue_knobs(&self) -> Result<(), ConfigError> {
        if self.worker_queue_limit == Some(0) {
            return Err(err("worker_queue_limit", "must be at least 1"));
        }
        if let Some(floor) = self.saturation_queue_floor {
            let Some(limit) = self.worker_queue_limit else {
                return Err(err(
                    "saturation_queue_floor",
                    "requires `worker_queue_limit` (there is no diversion to cancel without it)",
                ));
            };
            if floor == 0 {
                return Err(err("saturation_queue_floor", "must be at least 1"));
            }
            // Above the limit, the fleet would be called saturated while the gate
            // still admits some workers.
            if floor > limit {
                return Err(err(
                    "saturation_queue_floor",
                    format!("({floor}) must be at most `worker_queue_limit` ({limit})"),
                ));
            }
        }
        Ok(())
    }
}
