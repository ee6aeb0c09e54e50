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
//! [`spawn`]: through `setpriv --pdeathsig KILL` (util-linux), the kernel
//! kills it as soon as the test process is gone, however it went.
//!
//! The death signal follows the *thread* that started the child, not the
//! process (`prctl(2)`): a child started from a tokio worker or a blocking
//! pool thread would be killed when that thread retires, mid-test. So
//! [`spawn`] starts every child from one thread that lives as long as the
//! test process.

use std::ffi::OsStr;
use std::io;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

/// What `setpriv` is asked to do: kill the child when its parent dies.
const DEATH_SIGNAL: [&str; 3] = ["--pdeathsig", "KILL", "--"];

/// A command for `program` that is killed when the test process dies:
/// `setpriv --pdeathsig KILL -- program`. `setpriv` execs the program, so
/// the child's pid is the program's own (signals, `/proc` and `kill` reach
/// it). Where there is no `setpriv` (not Linux, no util-linux), the program
/// itself, with a warning: then a killed test may leave it behind.
pub fn command(program: impl AsRef<OsStr>) -> Command {
    if has_setpriv() {
        let mut command = Command::new("setpriv");
        command.args(DEATH_SIGNAL).arg(program);
        command
    } else {
        Command::new(program)
    }
}

/// Starts `command` (made by [`command`]) from the thread that lives as
/// long as the test process, so that its death signal comes only when the
/// process ends.
pub fn spawn(command: Command) -> io::Result<Child> {
    type Job = (Command, mpsc::Sender<io::Result<Child>>);
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Job>>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (jobs, incoming) = mpsc::channel::<Job>();
        // Never joined: it ends with the process (the sender is static).
        let started = std::thread::Builder::new()
            .name("testkit-spawner".into())
            .spawn(move || {
                for (mut command, reply) in incoming {
                    let _ = reply.send(command.spawn());
                }
            });
        if let Err(e) = started {
            panic!("cannot start the thread that starts the test's processes: {e}");
        }
        Mutex::new(jobs)
    });
    let (reply, answer) = mpsc::channel();
    let sent = spawner
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .send((command, reply));
    if sent.is_err() {
        return Err(io::Error::other("the spawner thread is gone"));
    }
    answer
        .recv()
        .unwrap_or_else(|_| Err(io::Error::other("the spawner thread is gone")))
}

/// Whether `setpriv` with `--pdeathsig` can be run; looked up once.
fn has_setpriv() -> bool {
    static FOUND: OnceLock<bool> = OnceLock::new();
    *FOUND.get_or_init(|| {
        let found = Command::new("setpriv")
            .args(DEATH_SIGNAL)
            .arg("true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !found {
            eprintln!(
                "testkit: no `setpriv --pdeathsig` (util-linux): a test process that is killed \
                 may leave its herald and redis-server processes running"
            );
        }
        found
    })
}

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
