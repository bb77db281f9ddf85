//! Layer 3, what every hostcall shares, whether it is a proxy-wasm (`env`) or a WASI
//! function: a [`Registry`] that registers one import module's functions with the linker
//! behind the fault check and remembers their names (so a module's imports can be
//! checked against what is implemented), and the one guest-memory helper, [`Guest`].
//!
//! Both are generic over the store's data so that the WASI functions serve the filter
//! VMs ([`HostState`]) and `wasi-run`'s command modules alike.

mod memory;

pub(crate) use memory::{Guest, GuestMemory};

use crate::state::{lock, HostState};
use crate::types::fault::Answer;
use wasmtime::{bail, Caller, IntoFunc, Linker, Result, WasmTy};

/// Store data whose hostcalls can be faulted ([`crate::Fault`]).
pub(crate) trait Faultable: Send + 'static {
    /// Counts a call of `name` and returns the injected answer, if a fault fires.
    fn injected(&self, name: &'static str) -> Option<Answer>;
}

impl Faultable for HostState {
    fn injected(&self, name: &'static str) -> Option<Answer> {
        lock(&self.shared).faults.check(name)
    }
}

/// Registers functions of one import module and remembers their names.
pub(crate) struct Registry<'a, T: 'static> {
    linker: &'a mut Linker<T>,
    module: &'static str,
    names: Vec<&'static str>,
}

impl<'a, T: Faultable> Registry<'a, T> {
    pub fn new(linker: &'a mut Linker<T>, module: &'static str) -> Self {
        Self {
            linker,
            module,
            names: Vec::new(),
        }
    }

    /// The names registered so far, to check a module's imports against.
    pub fn into_names(self) -> Vec<&'static str> {
        self.names
    }

    /// Registers a hostcall that answers a status (or errno), behind fault injection.
    pub fn wrap<P>(&mut self, name: &'static str, f: impl Hostcall<T, P>) -> Result<()> {
        f.define(self.linker, self.module, name)?;
        self.names.push(name);
        Ok(())
    }

    /// Registers a function that answers no status (`proc_exit`): it cannot be faulted.
    pub fn wrap_plain<P, A>(
        &mut self,
        name: &'static str,
        f: impl IntoFunc<T, P, A>,
    ) -> Result<()> {
        self.linker.func_wrap(self.module, name, f)?;
        self.names.push(name);
        Ok(())
    }
}

/// A hostcall implementation returning a status (or errno): registered behind the
/// fault check, which runs before the hostcall reads guest memory. Implemented for
/// closures of every arity the ABI uses.
pub(crate) trait Hostcall<T, Params>: Send + Sync + 'static {
    fn define(self, linker: &mut Linker<T>, module: &str, name: &'static str) -> Result<()>;
}

macro_rules! hostcall_arity {
    ($($arg:ident),*) => {
        #[allow(non_snake_case)]
        impl<T: Faultable, F, $($arg: WasmTy),*> Hostcall<T, ($($arg,)*)> for F
        where
            F: Fn(Caller<'_, T>, $($arg),*) -> Result<i32> + Send + Sync + 'static,
        {
            fn define(
                self,
                linker: &mut Linker<T>,
                module: &str,
                name: &'static str,
            ) -> Result<()> {
                linker.func_wrap(module, name, move |c: Caller<'_, T>, $($arg: $arg),*| {
                    match c.data().injected(name) {
                        Some(Answer::Status(code)) => Ok(code),
                        Some(Answer::Trap) => bail!("host-sim: injected trap in {name}"),
                        None => self(c, $($arg),*),
                    }
                })?;
                Ok(())
            }
        }
    };
}

hostcall_arity!();
hostcall_arity!(A1);
hostcall_arity!(A1, A2);
hostcall_arity!(A1, A2, A3);
hostcall_arity!(A1, A2, A3, A4);
hostcall_arity!(A1, A2, A3, A4, A5);
hostcall_arity!(A1, A2, A3, A4, A5, A6);
hostcall_arity!(A1, A2, A3, A4, A5, A6, A7);
hostcall_arity!(A1, A2, A3, A4, A5, A6, A7, A8);
hostcall_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9);
hostcall_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10);
hostcall_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11);
hostcall_arity!(A1, A2, A3, A4, A5, A6, A7, A8, A9, A10, A11, A12);

/// wasmtime 48 has its own error type; keep its full report (with the wasm backtrace)
/// when it becomes an `anyhow::Error` of the host's API.
pub(crate) fn wasm_err(e: wasmtime::Error) -> anyhow::Error {
    anyhow::anyhow!("{e:?}")
}
