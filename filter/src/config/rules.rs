//! The rules a configuration must keep, checked before any of it is used: each
//! value on its own first, then the rules across fields, and the policies' rules
//! last, so a value wrong under any policy is reported as such. A broken rule names
//! its field. The rules of one part (workers, overload, health, replicas, the queue
//! knobs, the stats endpoint) live with that part.

use super::{err, Config, ConfigError, Policy, MAX_SYNC_BATCH_MS};

impl Config {
    /// Every rule, in the order above: the first broken one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_values()?;
        self.overload.validate()?;
        self.health.validate()?;
        self.replicas.validate(&self.stats_path)?;
        if let Some(kv) = &self.kv_match {
            kv.validate()?;
        }
        self.validate_queue_knobs()?;
        self.validate_workers()?;
        // Knobs of one policy are refused where no pool routes by it.
        let knobs: [(Policy, &[(&str, bool)]); 2] = [
            (
                Policy::PredictedTtft,
                &[
                    ("load_factor", self.load_factor.is_some()),
                    ("prefill_us_per_char", self.prefill_us_per_char.is_some()),
                    ("service_ms", self.service_ms.is_some()),
                    ("stay_factor", self.stay_factor.is_some()),
                    ("ttft_sample_size", self.ttft_sample_size.is_some()),
                ],
            ),
            (
                Policy::CacheAware,
                &[
                    ("cache_threshold", self.cache_threshold.is_some()),
                    (
                        "balance_abs_threshold",
                        self.balance_abs_threshold.is_some(),
                    ),
                    (
                        "balance_rel_threshold",
                        self.balance_rel_threshold.is_some(),
                    ),
                    ("worker_queue_limit", self.worker_queue_limit.is_some()),
                    (
                        "saturation_queue_floor",
                        self.saturation_queue_floor.is_some(),
                    ),
                ],
            ),
        ];
        // The engines' word feeds the two policies that read a tree.
        if self.kv_match.is_some()
            && !self.routes_by(Policy::PredictedTtft)
            && !self.routes_by(Policy::CacheAware)
        {
            let rule = if self.is_pd() {
                "requires `prefill_policy` or `decode_policy` to be `predicted_ttft` or `cache_aware`"
            } else {
                "requires `policy: predicted_ttft` (the default) or `cache_aware`"
            };
            return Err(err("kv_match", rule));
        }
        for (policy, fields) in knobs {
            if self.routes_by(policy) {
                continue;
            }
            if let Some((field, _)) = fields.iter().find(|(_, set)| *set) {
                let rule = if self.is_pd() {
                    format!(
                        "requires `prefill_policy` or `decode_policy` to be `{}`",
                        policy.as_str()
                    )
                } else {
                    format!("requires `policy: {}`", policy.as_str())
                };
                return Err(err(*field, rule));
            }
        }
        Ok(())
    }

    fn validate_values(&self) -> Result<(), ConfigError> {
        if self
            .cache_threshold
            .is_some_and(|t| !(0.0..=1.0).contains(&t))
        {
            return Err(err("cache_threshold", "must be between 0 and 1"));
        }
        if self
            .balance_rel_threshold
            .is_some_and(|r| !(r.is_finite() && r >= 1.0))
        {
            return Err(err("balance_rel_threshold", "must be a finite number >= 1"));
        }
        if self.max_tree_size == 0 {
            return Err(err("max_tree_size", "must be >= 1"));
        }
        if self.max_total_tree_chars == 0 {
            return Err(err("max_total_tree_chars", "must be >= 1"));
        }
        if self.eviction_interval_ms == 0 {
            return Err(err("eviction_interval_ms", "must be >= 1"));
        }
        if self.max_models == 0 {
            return Err(err("max_models", "must be >= 1"));
        }
        if !(1..=65_536).contains(&self.sync_ring_slots) {
            return Err(err("sync_ring_slots", "must be between 1 and 65536"));
        }
        if self.max_routing_text_bytes == 0 {
            return Err(err("max_routing_text_bytes", "must be >= 1"));
        }
        if self.sync_interval_ms < 10 {
            return Err(err("sync_interval_ms", "must be >= 10"));
        }
        if self.sync_batch_ms > MAX_SYNC_BATCH_MS {
            return Err(err("sync_batch_ms", "must be at most 1000"));
        }
        if !(10..=60_000).contains(&self.relay_deadline_ms) {
            return Err(err("relay_deadline_ms", "must be between 10 and 60000"));
        }
        self.validate_target_headers()?;
        if self.prefill_timeout_ms == 0 {
            return Err(err("prefill_timeout_ms", "must be >= 1"));
        }
        self.validate_ttft_values()?;
        if self.max_body_bytes == 0 {
            return Err(err("max_body_bytes", "must be >= 1"));
        }
        if self.stale_after_ms == 0 {
            return Err(err("stale_after_ms", "must be >= 1"));
        }
        self.validate_stats_endpoint()?;
        if !(1..=4096).contains(&self.max_workers) {
            return Err(err("max_workers", "must be between 1 and 4096"));
        }
        Ok(())
    }
}
