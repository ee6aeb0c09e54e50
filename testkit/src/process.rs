//! The processes a test starts, and that must not outlive it; and a helper
//! program run to completion by a test (a Python client, a conformance
//! runner), its output captured, and killed if it overruns.
//!
//! A test's servers (`herald`, `redis-server`, sentinels, Prometheus) are
//! killed when their handle is dropped, which covers a test that passes or
//! fails. It does not cover a test process that dies without unwinding: a
//! panic while panicking (abort), `cargo test` interrupted, a runner's
//! SIGKILL after its timeout, the OOM killer. Then the servers were left
//! running (a `herald` that kept a runner waiting on its output, ports
//! taken, CPU spent). So every such process is started by [`command`] and
//! [`spawn`] (the load tool's, which starts its own servers the same way):
//! through `setpriv --pdeathsig KILL` (util-linux), the kernel kills it as
//! soon as the test process is gone, however it went.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

pub use loadtest::process::{command, spawn};

/// Runs `program args` to completion, killing it after `timeout`. `missing`
/// says where the program comes from, for when it cannot be started.
pub fn run(program: &str, args: &[&str], timeout: Duration, missing: &str) -> Output {
    let mut command = command(program);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = match spawn(command) {
        Ok(child) => child,
        Err(e) => panic!("cannot run `{program}` ({e}): {missing}"),
    };
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(timeout) {
        // `setpriv` could not start it (126, 127: not there, not runnable).
        Ok(Ok(output))
            if matches!(output.status.code(), Some(126 | 127))
                && String::from_utf8_lossy(&output.stderr).contains("failed to execute") =>
        {
            panic!("cannot run `{program}`: {missing}\n{}", show(&output))
        }
        Ok(output) => output.expect("the program's output"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("{program} {args:?} did not finish within {timeout:?}");
        }
    }
}

/// A finished program's status and output, for an assertion's message.
pub fn show(output: &Output) -> String {
    format!(
        "status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
