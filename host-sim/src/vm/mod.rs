//! Layer 5, the VMs and their streams: compiling and linking a [`Filter`], one wasmtime
//! `Store` per VM ([`instance`]), the [`HostBuilder`], the [`Host`] API, calling the
//! guest's exports with Envoy's failure policies ([`calls`]), and the HTTP stream state
//! machine with Envoy's rules ([`stream`]) that [`VmHandle`] drives.

mod builder;
mod calls;
mod filter;
mod handle;
mod host;
mod instance;
mod stream;

pub use builder::HostBuilder;
pub use filter::Filter;
pub use handle::VmHandle;
pub use host::Host;
