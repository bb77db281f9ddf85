//! What the demo's end-to-end tests share.

use serde_json::Value;
use std::process::Command;

/// Runs `cmd`, which must succeed and end its stdout with a JSON line (`llm-demo`'s
/// and `host-sim replay`'s reports do): its stdout, its stderr and that line.
pub fn run(mut cmd: Command) -> (String, String, Value) {
    let out = cmd.output().expect("the command runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{cmd:?} failed: {stdout}\n{stderr}");
    let last = stdout.lines().last().unwrap_or_default();
    let line = serde_json::from_str(last)
        .unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"));
    (stdout, stderr, line)
}
