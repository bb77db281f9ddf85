//! A compiled [`Filter`]: the module, checked against what this host implements, and
//! its imports pre-linked (the `env` hostcalls and WASI), so that VMs instantiate fast.

use crate::abi;
use crate::hostcall::wasm_err;
use crate::state::HostState;
use crate::wasi;
use anyhow::{bail, Context as _, Result};
use std::collections::HashSet;
use std::path::Path;
use wasmtime::{Engine, ExternType, InstancePre, Linker, Module};

/// Set (to anything): the guest's compiled code is named in a perf map.
const PERFMAP_ENV: &str = "HOST_SIM_PERFMAP";

/// A compiled filter: engine, module and pre-linked imports. Cheap to clone; build many
/// hosts from one `Filter` to compile the `.wasm` only once.
#[derive(Clone)]
pub struct Filter {
    pub(super) engine: Engine,
    module: Module,
    pub(super) pre: InstancePre<HostState>,
    /// Compiled to count the Wasm instructions it runs (`Filter::metered`).
    pub(super) metered: bool,
}

impl Filter {
    /// Compiles the `.wasm` file at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).with_context(|| format!("reading wasm {}", path.display()))?;
        Self::from_bytes(&bytes).with_context(|| format!("loading {}", path.display()))
    }

    /// Compiles a `.wasm` binary. Fails, naming them, if the module imports anything this
    /// host does not implement, or if it does not export a proxy-wasm 0.2.x ABI marker.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        Self::compile(bytes, false)
    }

    /// Compiles `path` to count the Wasm instructions its VMs run
    /// ([`Host::guest_instructions`](crate::Host::guest_instructions)): the guest's
    /// own work, exactly and whatever else runs on the machine, which a build can be
    /// compared by where timings are too noisy. Runs slower than [`Filter::load`].
    pub fn metered(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).with_context(|| format!("reading wasm {}", path.display()))?;
        Self::compile(&bytes, true).with_context(|| format!("loading {}", path.display()))
    }

    fn compile(bytes: &[u8], metered: bool) -> Result<Self> {
        let mut config = wasmtime::Config::new();
        config.consume_fuel(metered);
        // `HOST_SIM_PERFMAP=1`: Wasmtime writes `/tmp/perf-<pid>.map`, naming the
        // guest's compiled functions for `perf` and `benches/guest-profile` (a
        // filter built unstripped keeps its function names).
        if std::env::var_os(PERFMAP_ENV).is_some() {
            config.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&config).map_err(wasm_err)?;
        let module = Module::from_binary(&engine, bytes)
            .map_err(wasm_err)
            .context("compiling the wasm module")?;
        let mut linker = Linker::new(&engine);
        let mut implemented = HashSet::new();
        let env = abi::add_to_linker(&mut linker).map_err(wasm_err)?;
        implemented.extend(env.into_iter().map(|n| (abi::MODULE, n)));
        let wasi_names = wasi::add_to_linker(&mut linker).map_err(wasm_err)?;
        implemented.extend(wasi_names.into_iter().map(|n| (wasi::MODULE, n)));
        let missing: Vec<String> = module
            .imports()
            .filter(|i| {
                !matches!(i.ty(), ExternType::Func(_))
                    || !implemented.contains(&(i.module(), i.name()))
            })
            .map(|i| format!("{}.{}", i.module(), i.name()))
            .collect();
        if !missing.is_empty() {
            bail!(
                "the module imports functions host-sim does not implement: {}",
                missing.join(", ")
            );
        }
        let abi = ["proxy_abi_version_0_2_1", "proxy_abi_version_0_2_0"];
        if !module.exports().any(|e| abi.contains(&e.name())) {
            bail!("the module exports no proxy_abi_version_0_2_1 (is it a proxy-wasm filter?)");
        }
        let pre = linker
            .instantiate_pre(&module)
            .map_err(wasm_err)
            .context("linking the module's imports")?;
        Ok(Self {
            engine,
            module,
            pre,
            metered,
        })
    }

    /// The module's imports as `(module, name)`.
    pub fn imports(&self) -> Vec<(String, String)> {
        self.module
            .imports()
            .map(|i| (i.module().to_string(), i.name().to_string()))
            .collect()
    }
}
