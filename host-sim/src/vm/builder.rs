//! [`HostBuilder`]: Envoy's plugin and VM configuration for a [`Host`], and `build`,
//! which instantiates every VM and runs its start-up (`on_vm_start`, `on_configure`).

use super::filter::Filter;
use super::host::Host;
use super::instance::Slot;
use crate::state::{Config, Shared, DEFAULT_MAX_MEMORY_BYTES};
use crate::types::codes::LogLevel;
use crate::types::fault::Fault;
use crate::types::values::FailurePolicy;
use anyhow::{bail, Context as _, Result};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// Where a builder takes its module from: a file to compile, or a compiled [`Filter`]
/// (compiled once, shared by many hosts).
enum Source {
    Path(PathBuf),
    Filter(Filter),
}

/// Builder for a [`Host`]; see [`Host::builder`].
/// Building starts from the host (`Host::builder`), the way users find it.
impl Host {
    /// Starts building a host for the `.wasm` file at `wasm_path`.
    pub fn builder(wasm_path: impl AsRef<std::path::Path>) -> HostBuilder {
        HostBuilder::new(Source::Path(wasm_path.as_ref().to_path_buf()))
    }

    /// Starts building a host for an already compiled [`Filter`].
    pub fn builder_for(filter: &Filter) -> HostBuilder {
        HostBuilder::new(Source::Filter(filter.clone()))
    }
}

pub struct HostBuilder {
    source: Source,
    vms: usize,
    faults: Vec<Fault>,
    start_time_ms: u64,
    cfg: Config,
}

impl HostBuilder {
    fn new(source: Source) -> Self {
        Self {
            source,
            vms: 1,
            faults: Vec::new(),
            start_time_ms: 1_700_000_000_000,
            cfg: Config {
                plugin_config: Vec::new(),
                vm_config: Vec::new(),
                plugin_name: "host-sim".into(),
                root_id: String::new(),
                vm_id: String::new(),
                clusters: Vec::new(),
                log_level: LogLevel::Info,
                allow_on_headers_stop_iteration: false,
                seed: 0,
                properties: Vec::new(),
                environ: Vec::new(),
                failure_policy: FailurePolicy::Strict,
                max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
            },
        }
    }

    /// Plugin configuration bytes (`configuration` of the plugin config in Envoy), read by the
    /// filter in `on_configure` (BufferType PluginConfiguration).
    pub fn plugin_config(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.cfg.plugin_config = bytes.into();
        self
    }

    /// VM configuration bytes (`vm_config.configuration`), BufferType VmConfiguration.
    pub fn vm_config(mut self, bytes: impl Into<Vec<u8>>) -> Self {
        self.cfg.vm_config = bytes.into();
        self
    }

    /// Number of VMs, i.e. Envoy worker threads (`--concurrency`). Default 1.
    pub fn vms(mut self, n: usize) -> Self {
        self.vms = n;
        self
    }

    /// A VM's linear memory cap in bytes. Default 1 GiB, Envoy's: a guest that
    /// allocates past it traps there, and so it does here.
    pub fn max_memory(mut self, bytes: usize) -> Self {
        self.cfg.max_memory_bytes = bytes;
        self
    }

    /// Seed of the per-VM random generators behind WASI `random_get`. Default 0.
    pub fn seed(mut self, seed: u64) -> Self {
        self.cfg.seed = seed;
        self
    }

    /// Cluster names `proxy_http_call` accepts (others: BadArgument, like Envoy).
    pub fn clusters<S: AsRef<str>>(mut self, names: &[S]) -> Self {
        self.cfg.clusters = names.iter().map(|n| n.as_ref().to_string()).collect();
        self
    }

    /// Plugin name (`plugin_name` property). Default "host-sim".
    pub fn plugin_name(mut self, name: &str) -> Self {
        self.cfg.plugin_name = name.into();
        self
    }

    /// Root id (`plugin_root_id` property). Default "".
    pub fn root_id(mut self, id: &str) -> Self {
        self.cfg.root_id = id.into();
        self
    }

    /// VM id (`plugin_vm_id`; scopes shared data and queues). Default "".
    pub fn vm_id(mut self, id: &str) -> Self {
        self.cfg.vm_id = id.into();
        self
    }

    /// Level returned by `proxy_get_log_level` (all logs are captured regardless).
    /// Default Info, as Envoy's default.
    pub fn log_level(mut self, level: LogLevel) -> Self {
        self.cfg.log_level = level;
        self
    }

    /// Envoy's plugin option `allow_on_headers_stop_iteration` (default false, as in Envoy
    /// 1.40). When false, `Pause` from a headers callback becomes StopAllIterationAndWatermark:
    /// Envoy holds the body back and the filter sees no body callback until it calls
    /// `continue_stream`. When true, `Pause` is StopIteration: body callbacks still run and
    /// the headers stay editable until the filter continues.
    pub fn allow_on_headers_stop_iteration(mut self, allow: bool) -> Self {
        self.cfg.allow_on_headers_stop_iteration = allow;
        self
    }

    /// Initial virtual time (ms since the Unix epoch). Default 1_700_000_000_000.
    pub fn start_time_ms(mut self, ms: u64) -> Self {
        self.start_time_ms = ms;
        self
    }

    /// What a trap of the guest does (Envoy's `failure_policy`). Default
    /// [`FailurePolicy::Strict`].
    pub fn failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.cfg.failure_policy = policy;
        self
    }

    /// A fault injected from the start, so it can hit the VMs' start-up
    /// (`on_vm_start`, `on_configure`); see [`Host::inject`].
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// An extra property for `proxy_get_property`, by dotted path (e.g. "node.id").
    pub fn property(mut self, path: &str, value: impl Into<Vec<u8>>) -> Self {
        self.cfg.properties.push((path.into(), value.into()));
        self
    }

    /// An environment variable of every VM (Envoy's
    /// `vm_config.environment_variables`).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.cfg
            .environ
            .push(format!("{name}={value}").into_bytes());
        self
    }

    /// Compiles (unless given a [`Filter`]), instantiates every VM and runs its lifecycle:
    /// `_initialize` (else `_start`), `proxy_on_context_create(root, 0)`,
    /// `proxy_on_vm_start`, `proxy_on_configure`. A `false` from either is an error.
    pub fn build(self) -> Result<Host> {
        if self.vms == 0 {
            bail!("a host needs at least one VM");
        }
        let filter = match self.source {
            Source::Path(path) => Filter::load(path)?,
            Source::Filter(filter) => filter,
        };
        let cfg = Arc::new(self.cfg);
        let mut shared = Shared::new(self.start_time_ms, cfg.seed);
        shared.faults.rules = self.faults;
        let shared = Arc::new(Mutex::new(shared));
        let mut host = Host {
            cfg: cfg.clone(),
            shared: shared.clone(),
            filter: filter.clone(),
            vms: Vec::new(),
            depth: 0,
        };
        for vm in 0..self.vms {
            let slot = Slot::instantiate(&filter, vm, cfg.clone(), shared.clone())
                .with_context(|| format!("instantiating VM {vm}"))?;
            host.vms.push(slot);
            host.start_vm(vm)?;
        }
        host.pump()?;
        Ok(host)
    }
}
