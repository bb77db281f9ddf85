//! The rules of the collector's push endpoint settings (`stats_token`,
//! `stats_token_env`, `stats_only`, `stats_path`, `stats_max_bytes`): flat keys of the
//! plugin configuration, checked together because they only make sense together.

use super::{err, Config, ConfigError};

impl Config {
    pub(super) fn validate_stats_endpoint(&self) -> Result<(), ConfigError> {
        if self.stats_token.as_deref() == Some("") {
            return Err(err(
                "stats_token",
                "must not be empty (omit it to disable pushes)",
            ));
        }
        if self.stats_token_env.as_deref() == Some("") {
            return Err(err("stats_token_env", "must name an environment variable"));
        }
        if self.stats_token.is_some() && self.stats_token_env.is_some() {
            return Err(err(
                "stats_token_env",
                "and `stats_token` are exclusive: give the token one way",
            ));
        }
        if self.stats_only && self.stats_token.is_none() && self.stats_token_env.is_none() {
            return Err(err(
                "stats_only",
                "needs `stats_token` or `stats_token_env`: a stats listener without a token answers nothing",
            ));
        }
        if !self.stats_path.starts_with('/') {
            return Err(err("stats_path", "must start with `/`"));
        }
        if self.stats_max_bytes == 0 {
            return Err(err("stats_max_bytes", "must be >= 1"));
        }
        Ok(())
    }
}
