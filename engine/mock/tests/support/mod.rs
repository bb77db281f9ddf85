//! The real `engine-mock` binary, started for one test: its startup line read, and
//! the process killed and reaped on drop, so no test path leaks one.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};

pub struct Running {
    pub child: Child,
    /// The line it prints once it listens (ports, endpoints).
    pub line: String,
    /// Kept open: the mock's stdout stays a pipe it may write to.
    _stdout: BufReader<ChildStdout>,
}

impl Running {
    /// Starts `engine-mock` with `args` and reads its startup line.
    pub fn start(args: &[&str]) -> Running {
        let mut child = Command::new(env!("CARGO_BIN_EXE_engine-mock"))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn engine-mock");
        let stdout = child.stdout.take().expect("piped stdout");
        // The guard exists before the read, so a failed read still kills the child.
        let mut running = Running {
            child,
            line: String::new(),
            _stdout: BufReader::new(stdout),
        };
        running
            ._stdout
            .read_line(&mut running.line)
            .expect("read listening line");
        running
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
