//! Processes that must not outlive the process that started them: a
//! test's or a load run's servers (`herald`, `redis-server`, sentinels,
//! cluster nodes). Dropping a handle kills its child, but a process that
//! dies without unwinding (a runner's SIGKILL after its timeout, an abort,
//! the OOM killer) would leave them running. So each is started by
//! [`command`] and [`spawn`]: through `setpriv --pdeathsig KILL`
//! (util-linux), the kernel kills it as soon as its parent is gone.
//!
//! The death signal follows the *thread* that started the child, not the
//! process (`prctl(2)`): a child started from a tokio worker or a blocking
//! pool thread would be killed when that thread retires. So [`spawn`]
//! starts every child from one thread that lives as long as the process.
//!
//! Also here: a helper program run to completion, bounded in time
//! ([`run`]); a free loopback port for a process that binds its own
//! ([`free_port`]); signals ([`signal`]); and the bounded poll every
//! readiness wait goes through ([`poll`]).

use std::ffi::OsStr;
use std::io::{self, Write as _};
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, io, state};

/// What `setpriv` is asked to do: kill the child when its parent dies.
const DEATH_SIGNAL: [&str; 3] = ["--pdeathsig", "KILL", "--"];

/// Between two looks of [`poll`] (each look may run a few `redis-cli`).
pub const POLL: Duration = Duration::from_millis(100);

/// Longest a `kill` may take.
const KILL_TIMEOUT: Duration = Duration::from_secs(5);

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
            .name("rig-spawner".into())
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
                "rig: no `setpriv --pdeathsig` (util-linux): a test or load run that is killed \
                 may leave its herald and redis-server processes running"
            );
        }
        found
    })
}

/// Free ports a process is started on before giving up: another process
/// may take the port between our look ([`free_port`]) and its bind.
pub(crate) const PORT_ATTEMPTS: usize = 5;

/// Why `what` could not be started in [`PORT_ATTEMPTS`] tries, the last
/// try's failure (`last`) said.
pub(crate) fn not_started(what: &str, last: Option<Error>) -> Error {
    state(format!(
        "{what} did not start on a free port in {PORT_ATTEMPTS} attempts (the last: {})",
        last.map_or_else(|| "none".to_owned(), |e| e.to_string())
    ))
}

/// A loopback port nobody listens on right now, for a process that binds
/// its ports itself (the binary, `redis-server`, Prometheus): another
/// process may take it before that one binds, so the caller retries on a
/// bind failure, or accepts the small risk and says so. In this process,
/// bind port 0 and read the address instead.
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io("127.0.0.1:0"))?;
    Ok(listener.local_addr().map_err(io("127.0.0.1:0"))?.port())
}

/// Runs `program args` to completion (with `input` on its stdin), killing
/// it after `timeout`; its status and output, whatever the status.
pub fn run(
    program: &str,
    args: &[&str],
    input: Option<&str>,
    timeout: Duration,
) -> Result<Output, Error> {
    let spawn_error = |source| Error::Spawn {
        program: program.to_owned(),
        source,
    };
    let mut command = command(program);
    command
        .args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = spawn(command).map_err(spawn_error)?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        // A few commands: far less than a pipe holds, so this cannot block.
        stdin
            .write_all(input.as_bytes())
            .map_err(io(format!("{program}'s stdin")))?;
    }
    let pid = child.id();
    let (done, finished) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(timeout) {
        // `setpriv` could not start it (126, 127: not there, not runnable).
        Ok(Ok(output))
            if matches!(output.status.code(), Some(126 | 127))
                && String::from_utf8_lossy(&output.stderr).contains("failed to execute") =>
        {
            Err(spawn_error(io::Error::new(
                io::ErrorKind::NotFound,
                show(&output),
            )))
        }
        Ok(output) => output.map_err(io(format!("{program}'s output"))),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            Err(Error::Timeout {
                program: program.to_owned(),
                args: args.join(" "),
                timeout,
            })
        }
    }
}

/// A finished program's status and output, for an error's message.
pub fn show(output: &Output) -> String {
    format!(
        "status: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Sends `signal` (`-STOP`, `-CONT`, `-TERM`, `-HUP`, `-KILL`) to `pid`,
/// through the system's `kill` (this workspace has no unsafe code).
pub fn signal(pid: u32, signal: &str) -> Result<(), Error> {
    let pid = pid.to_string();
    let out = run("kill", &[signal, &pid], None, KILL_TIMEOUT)?;
    if !out.status.success() {
        return Err(state(format!("kill {signal} {pid}: {}", show(&out))));
    }
    Ok(())
}

/// The last lines of the log at `path`, for an error.
pub(crate) fn tail(path: &std::path::Path) -> String {
    let log = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    format!(
        "{}:\n{}",
        path.display(),
        lines[lines.len().saturating_sub(20)..].join("\n")
    )
}

/// Kills `child` (SIGKILL) and reaps it.
pub(crate) fn kill(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// Runs `f`, a call that blocks on a child process, without holding up
/// the other tasks of a multi-threaded runtime (elsewhere, as it is).
pub fn blocking<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
    }
}

/// Polls `look` through [`blocking`] every `every` until it is `Ok`, at
/// most `within`; its last reason otherwise.
pub async fn poll_every<T>(
    every: Duration,
    within: Duration,
    mut look: impl FnMut() -> Result<T, String>,
) -> Result<T, Error> {
    let deadline = Instant::now() + within;
    loop {
        match blocking(&mut look) {
            Ok(value) => return Ok(value),
            Err(why) if Instant::now() >= deadline => {
                return Err(state(format!("not within {within:?}: {why}")));
            }
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// [`poll_every`] [`POLL`].
pub async fn poll<T>(
    within: Duration,
    look: impl FnMut() -> Result<T, String>,
) -> Result<T, Error> {
    poll_every(POLL, within, look).await
}
