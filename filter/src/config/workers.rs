//! The workers of the plugin configuration: who they are, which pool they serve,
//! how Envoy reaches them, and the rules a worker list must follow (names unique,
//! addresses well formed, PD pools all-or-nothing, bootstrap fields on prefill
//! workers only, at most `max_workers`), so a broken list is refused before any of
//! it is used.
//!
//! In discovery mode (`workers_from: collector`) the plugin config lists no workers:
//! the collector's membership pushes do (`crate::background::membership`), and a pushed list
//! passes the same rules, checked by the same code, as a configured one.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;

use super::{err, Config, ConfigError, Target};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, Default, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Pool {
    #[default]
    Regular,
    Prefill,
    Decode,
}

/// Where the worker list comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum WorkersFrom {
    /// `workers` in the plugin config.
    #[default]
    Config,
    /// The collector's membership pushes, which follow Envoy's service discovery.
    Collector,
}

/// Worker index by name (names are unique), built once per worker list: every
/// request spreads the shared tables' rows (by name) over the workers (by index),
/// and hashing all 256 names of a large fleet to do it, once per table, showed in a
/// profile; looking up each row instead costs what the rows hold.
#[derive(Debug, Clone, Default)]
pub struct WorkerNames {
    index: hashbrown::HashMap<String, u32>,
    len: usize,
    /// This list's identity: what was spread over it by index (`spread`) holds
    /// while the id is the same, so a copy kept by index is rebuilt only when the
    /// list changes.
    id: u64,
}

/// The next `WorkerNames::id` (0 is the empty default's).
static NEXT_NAMES_ID: AtomicU64 = AtomicU64::new(1);

impl WorkerNames {
    pub fn new(workers: &[WorkerConfig]) -> WorkerNames {
        WorkerNames {
            index: workers
                .iter()
                .enumerate()
                .map(|(i, w)| (w.name.clone(), i as u32))
                .collect(),
            len: workers.len(),
            id: NEXT_NAMES_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Unique to this list (and its clones): two lists built apart differ.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Workers in the list.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The index of the worker named `name`.
    pub fn get(&self, name: &str) -> Option<usize> {
        self.index.get(name).map(|i| *i as usize)
    }

    /// `rows`' values by worker index (`missing` for a worker without a row; the
    /// last row of a name wins).
    pub fn spread<T: Copy>(&self, rows: &[(String, T)], missing: T) -> Vec<T> {
        let mut out = vec![missing; self.len];
        for (name, v) in rows {
            if let Some(slot) = self.get(name).and_then(|i| out.get_mut(i)) {
                *slot = *v;
            }
        }
        out
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// The worker's name: a tenant in the tree, a label in metrics and headers.
    pub name: String,
    /// Envoy cluster for `target: cluster`; defaults to `name`.
    #[serde(default)]
    pub cluster: Option<String>,
    /// `ip:port`, required for `target: endpoint`.
    #[serde(default)]
    pub address: Option<String>,
    #[serde(default)]
    pub pool: Pool,
    /// Models served; empty serves any model (a single-model fleet).
    #[serde(default)]
    pub models: Vec<String>,
    /// Prefill workers only: the port of the engine's bootstrap server, where decode
    /// engines fetch the KV (SGLang's `--disaggregation-bootstrap-port`).
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// Prefill workers only: the host decode engines reach the bootstrap server at;
    /// defaults to the host of `address`.
    #[serde(default)]
    pub bootstrap_host: Option<String>,
    /// Discovery mode: when the collector stopped listing this worker. It takes no
    /// new requests, but keeps its tenants until `leave_grace_ms` has passed, so an
    /// endpoint that flaps back keeps its cache affinity. Never read from JSON.
    #[serde(skip)]
    pub leaving_since_ms: Option<u64>,
}

impl WorkerConfig {
    pub fn cluster(&self) -> &str {
        self.cluster.as_deref().unwrap_or(&self.name)
    }

    pub fn serves(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }

    /// Whether the worker takes new requests (a leaving worker does not).
    pub fn routable(&self) -> bool {
        self.leaving_since_ms.is_none()
    }

    /// Where decode engines meet this prefill worker: `bootstrap_host` or the host of
    /// `address` (validated to exist for prefill workers).
    pub fn bootstrap_host(&self) -> Option<&str> {
        self.bootstrap_host.as_deref().or_else(|| {
            self.address
                .as_deref()
                .and_then(|a| a.rsplit_once(':'))
                .map(|(host, _)| host)
        })
    }
}

fn is_host_port(s: &str) -> bool {
    let Some((host, port)) = s.rsplit_once(':') else {
        return false;
    };
    !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0)
}

impl Config {
    /// Whether the workers come from the collector's membership pushes.
    pub fn discovers(&self) -> bool {
        self.workers_from == WorkersFrom::Collector
    }

    /// This config with `workers` as its worker list, checked by every rule a
    /// configured list must pass (discovery mode's membership updates).
    pub fn with_workers(&self, workers: Vec<WorkerConfig>) -> Result<Config, ConfigError> {
        let cfg = Config {
            workers,
            ..self.clone()
        };
        cfg.validate()?;
        Ok(cfg)
    }

    /// The mode's own rules: discovery needs the push endpoint and an empty list (an
    /// empty list is then "no membership yet"); static mode needs a list.
    fn validate_mode(&self) -> Result<(), ConfigError> {
        if self.workers.len() > self.max_workers {
            return Err(err(
                "workers",
                format!(
                    "lists {} workers, more than `max_workers` ({})",
                    self.workers.len(),
                    self.max_workers
                ),
            ));
        }
        if !self.discovers() {
            if self.leave_grace_ms.is_some() {
                return Err(err(
                    "leave_grace_ms",
                    "applies to `workers_from: collector` only",
                ));
            }
            if self.workers.is_empty() {
                return Err(err(
                    "workers",
                    "must list at least one worker (or set `workers_from: collector`)",
                ));
            }
        } else if self.stats_token.is_none() {
            return Err(err(
                "stats_token",
                "is required with `workers_from: collector` (membership arrives as pushes)",
            ));
        }
        Ok(())
    }

    pub(super) fn validate_workers(&self) -> Result<(), ConfigError> {
        self.validate_mode()?;
        if self.workers.is_empty() {
            return Ok(());
        }
        for (i, w) in self.workers.iter().enumerate() {
            if w.name.is_empty() || w.name.len() > 128 {
                return Err(err(format!("workers[{i}].name"), "must be 1 to 128 bytes"));
            }
            if self.workers.iter().take(i).any(|o| o.name == w.name) {
                return Err(err(
                    format!("workers[{i}].name"),
                    format!("must be unique (`{}` repeats)", w.name),
                ));
            }
            if w.cluster().is_empty() {
                return Err(err(format!("workers[{i}].cluster"), "must not be empty"));
            }
            if let Some(addr) = &w.address {
                if !is_host_port(addr) {
                    return Err(err(
                        format!("workers[{i}].address"),
                        "must be host:port with a port in 1..=65535",
                    ));
                }
            }
            if self.target == Target::Endpoint && w.address.is_none() {
                return Err(err(
                    format!("workers[{i}].address"),
                    "is required with `target: endpoint`",
                ));
            }
        }
        self.validate_pools()
    }

    /// Either a regular pool, or a prefill and a decode pool (PD): one listener routes
    /// one way. Prefill workers say where decode engines fetch their KV.
    fn validate_pools(&self) -> Result<(), ConfigError> {
        let has = |p: Pool| self.workers.iter().any(|w| w.pool == p);
        if self.workers.iter().any(|w| w.pool != Pool::Regular) {
            if let Some(i) = self.workers.iter().position(|w| w.pool == Pool::Regular) {
                return Err(err(
                    format!("workers[{i}].pool"),
                    "`regular` cannot be mixed with `prefill`/`decode` workers (run PD on its own listener)",
                ));
            }
            for (pool, name) in [(Pool::Prefill, "prefill"), (Pool::Decode, "decode")] {
                if !has(pool) {
                    return Err(err(
                        "workers",
                        format!("PD mode needs at least one worker of `pool: {name}`"),
                    ));
                }
            }
        } else if !has(Pool::Regular) {
            return Err(err("workers", "must list at least one worker"));
        }
        for (i, w) in self.workers.iter().enumerate() {
            if w.pool != Pool::Prefill {
                for (field, set) in [
                    ("bootstrap_port", w.bootstrap_port.is_some()),
                    ("bootstrap_host", w.bootstrap_host.is_some()),
                ] {
                    if set {
                        return Err(err(
                            format!("workers[{i}].{field}"),
                            "applies to `pool: prefill` workers only",
                        ));
                    }
                }
                continue;
            }
            match w.bootstrap_port {
                None => {
                    return Err(err(
                        format!("workers[{i}].bootstrap_port"),
                        "is required for `pool: prefill` (the engine's bootstrap server port)",
                    ))
                }
                Some(0) => {
                    return Err(err(
                        format!("workers[{i}].bootstrap_port"),
                        "must be in 1..=65535",
                    ))
                }
                Some(_) => {}
            }
            match w.bootstrap_host() {
                None => {
                    return Err(err(
                        format!("workers[{i}].bootstrap_host"),
                        "is required for `pool: prefill` without an `address`",
                    ))
                }
                Some(h) if h.is_empty() || h.contains(['/', ' ', '"']) => {
                    return Err(err(
                        format!("workers[{i}].bootstrap_host"),
                        "must be a host name or IP address",
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::named_workers;
    use super::*;
    #[cfg(all(target_arch = "wasm32", target_os = "unknown"))]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn rows_are_spread_by_name_over_the_workers() {
        let names = WorkerNames::new(&named_workers(3));
        assert_eq!(
            (names.len(), names.get("w2"), names.get("w9")),
            (3, Some(2), None)
        );
        let rows = vec![
            ("w2".to_string(), 5),
            ("gone".to_string(), 9),
            ("w0".to_string(), 1),
            ("w2".to_string(), 7),
        ];
        assert_eq!(
            names.spread(&rows, 0),
            vec![1, 0, 7],
            "unknown names are dropped, the last row of a name wins"
        );
        assert!(WorkerNames::new(&[]).spread(&rows, 0).is_empty());
    }
}
