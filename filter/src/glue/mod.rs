//! The proxy-wasm layer. Every hostcall goes through [`hostcalls`], whose functions
//! return `Result` for every status: the SDK's trait helpers and its own `hostcalls`
//! panic on an unexpected status, and a panic kills this Envoy thread's VM.

mod host;
mod hostcalls;
mod http;
mod overload;
mod root;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> {
        Box::new(root::Root::new())
    });
}}
