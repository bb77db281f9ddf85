//! `host-sim wasi-run`: runs a WASI preview1 *command* module (one exporting `_start`),
//! such as the libtest binaries `cargo test --target wasm32-wasip1` builds, on host-sim's
//! wasmtime. Cargo uses it as the target runner (see `.cargo/config.toml` and
//! `host-sim/wasi-runner.sh`).
//!
//! The preview1 functions are the filter VMs' ([`super`]), fed from the real process:
//! args (passed through), environ (the host's `RUST_*` variables, so
//! `RUST_TEST_THREADS`, `RUST_BACKTRACE` work), the real stdout/stderr and clocks, a
//! time-seeded `random_get`, `sched_yield`, and `poll_oneoff` for clock subscriptions
//! (`thread::sleep`). Any other preview1 import answers ENOSYS (52). There is no
//! filesystem: stdin reads as end of file, the stdio descriptors do not seek. Imports
//! of other modules (e.g. `env.proxy_*` of a proxy-wasm filter's test binary) are
//! linked as functions that trap when called. A broken pointer traps, as it does in a
//! filter VM.
//!
//! The exit code is the module's: `proc_exit(n)` gives `n`, returning from `_start`
//! gives 0, a trap (a panic under `panic=abort`, i.e. a failing test) gives 101 after
//! printing the trap.

use super::{add_to_linker, WasiHost, ENOSYS, MODULE};
use crate::hostcall::{wasm_err, Faultable, GuestMemory};
use crate::types::fault::Answer;
use crate::types::rng::Rng;
use anyhow::{bail, Context as _, Result};
use std::collections::HashSet;
use std::io::Write as _;
use std::path::Path;
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use wasmtime::{Engine, ExternType, Linker, Memory, Module, Store, TypedFunc, Val, ValType};

/// Exit code for a trapped module (what a panicking native test binary returns).
const TRAP_EXIT: i32 = 101;

/// The store data of a command module.
struct Ctx {
    args: Vec<Vec<u8>>,
    env: Vec<Vec<u8>>,
    exit_code: Option<i32>,
    start: Instant,
    rng: Rng,
    memory: Option<Memory>,
}

impl GuestMemory for Ctx {
    fn memory(&self) -> Option<Memory> {
        self.memory
    }

    fn allocator(&self) -> Option<TypedFunc<i32, i32>> {
        None
    }
}

impl Faultable for Ctx {
    fn injected(&self, _name: &'static str) -> Option<Answer> {
        None
    }
}

impl WasiHost for Ctx {
    const SLEEPS: bool = true;

    fn args(&self) -> &[Vec<u8>] {
        &self.args
    }

    fn environ(&self) -> &[Vec<u8>] {
        &self.env
    }

    fn output(&mut self, fd: i32, data: &[u8]) -> bool {
        let io = if fd == 1 {
            let mut out = std::io::stdout().lock();
            out.write_all(data).and_then(|_| out.flush())
        } else {
            let mut err = std::io::stderr().lock();
            err.write_all(data).and_then(|_| err.flush())
        };
        io.is_ok()
    }

    fn clock_ns(&self, id: i32) -> Option<u64> {
        match id {
            0 => Some(
                SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_nanos() as u64,
            ),
            // Monotonic; process and thread CPU time approximated by it.
            1..=3 => Some(self.start.elapsed().as_nanos() as u64 + 1),
            _ => None,
        }
    }

    fn fill_random(&mut self, buf: &mut [u8]) {
        self.rng.fill(buf);
    }

    fn exit(&mut self, code: i32) {
        self.exit_code = Some(code);
    }

    fn yield_now(&mut self) {
        std::thread::yield_now();
    }
}

/// Runs `module` with `args` (the module path is `argv[0]`) and returns its exit code.
pub fn run(module_path: &Path, args: &[String]) -> Result<i32> {
    let bytes =
        std::fs::read(module_path).with_context(|| format!("reading {}", module_path.display()))?;
    let engine = Engine::default();
    let module = Module::from_binary(&engine, &bytes)
        .map_err(wasm_err)
        .with_context(|| format!("compiling {}", module_path.display()))?;
    let mut linker: Linker<Ctx> = Linker::new(&engine);
    let implemented: HashSet<&str> = add_to_linker(&mut linker)
        .map_err(wasm_err)?
        .into_iter()
        .collect();
    for import in module.imports() {
        let ExternType::Func(ty) = import.ty() else {
            bail!(
                "the module imports a non-function {}.{}",
                import.module(),
                import.name()
            );
        };
        if import.module() != MODULE {
            // E.g. the proxy-wasm hostcalls of a filter's test binary: linked so the
            // module instantiates, but a call traps (the core tests make none).
            let what = format!("{}.{}", import.module(), import.name());
            linker
                .func_new(import.module(), import.name(), ty, move |_, _, _| {
                    wasmtime::bail!("wasi-run implements no {what} (only WASI preview1)")
                })
                .map_err(wasm_err)?;
            continue;
        }
        if implemented.contains(import.name()) {
            continue;
        }
        let results: Vec<ValType> = ty.results().collect();
        if !matches!(results.as_slice(), [ValType::I32]) {
            bail!("unsupported WASI import {MODULE}.{}", import.name());
        }
        linker
            .func_new(MODULE, import.name(), ty, |_, _, out: &mut [Val]| {
                out[0] = Val::I32(ENOSYS);
                Ok(())
            })
            .map_err(wasm_err)?;
    }
    let mut argv = vec![module_path.to_string_lossy().into_owned().into_bytes()];
    argv.extend(args.iter().map(|a| a.clone().into_bytes()));
    let env = std::env::vars()
        .filter(|(k, _)| k.starts_with("RUST_"))
        .map(|(k, v)| format!("{k}={v}").into_bytes())
        .collect();
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64
        ^ u64::from(std::process::id());
    let ctx = Ctx {
        args: argv,
        env,
        exit_code: None,
        start: Instant::now(),
        rng: Rng::new(seed),
        memory: None,
    };
    let mut store = Store::new(&engine, ctx);
    let instance = linker
        .instantiate(&mut store, &module)
        .map_err(wasm_err)
        .context("instantiating the module")?;
    store.data_mut().memory = instance.get_memory(&mut store, "memory");
    let start = instance
        .get_typed_func::<(), ()>(&mut store, "_start")
        .map_err(wasm_err)
        .context("the module exports no `_start` (is it a WASI command?)")?;
    let result = start.call(&mut store, ());
    let _ = std::io::stdout().flush();
    match (result, store.data().exit_code) {
        (_, Some(code)) => Ok(code),
        (Ok(()), None) => Ok(0),
        (Err(trap), None) => {
            eprintln!(
                "host-sim wasi-run: {} trapped: {trap:?}\n\
                 (wasm32 panics abort: a libtest binary dies with the first failing test \
                 and its captured panic message; pass `-- --nocapture` to see it)",
                module_path.display()
            );
            Ok(TRAP_EXIT)
        }
    }
}
