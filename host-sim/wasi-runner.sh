#!/bin/sh
# Cargo runner for wasm32-wasip1 (see .cargo/config.toml): runs a WASI command module,
# e.g. a libtest binary from `cargo test --target wasm32-wasip1`, with
# `host-sim wasi-run`. Build the runner first: `cargo build -p host-sim`.
# (It is not built from here: cargo holds the target dir's lock while it runs tests.)
set -eu
root=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
case $target in /*) ;; *) target=$root/$target ;; esac
bin=$target/debug/host-sim
if [ ! -x "$bin" ]; then
    echo "wasi-runner: $bin is missing; build it first with: cargo build -p host-sim" >&2
    exit 127
fi
exec "$bin" wasi-run "$@"
