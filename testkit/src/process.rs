//! A helper program run to completion by a test (a Python client, a
//! conformance runner), its output captured, and killed if it overruns.

use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs `program args` to completion, killing it after `timeout`. `missing`
/// says where the program comes from, for when it cannot be started.
pub fn run(program: &str, args: &[&str], timeout: Duration, missing: &str) -> Output {
    let child = match Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => panic!("cannot run `{program}` ({e}): {missing}"),
    };
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(timeout) {
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
