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
//! [`spawn`] (the rig's, which starts the load tool's servers the same
//! way): through `setpriv --pdeathsig KILL` (util-linux), the kernel kills
//! it as soon as the test process is gone, however it went.

use std::process::Output;
use std::time::Duration;

pub use rig::process::{command, show, spawn};

/// Runs `program args` to completion, killing it after `timeout`. `missing`
/// says where the program comes from, for when it cannot be started.
pub fn run(program: &str, args: &[&str], timeout: Duration, missing: &str) -> Output {
    match rig::process::run(program, args, None, timeout) {
        Ok(output) => output,
        Err(rig::Error::Spawn { source, .. }) => {
            panic!("cannot run `{program}` ({source}): {missing}")
        }
        Err(rig::Error::Timeout { .. }) => {
            panic!("{program} {args:?} did not finish within {timeout:?}")
        }
        Err(e) => panic!("{program} {args:?}: {e}"),
    }
}
