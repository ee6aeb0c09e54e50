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
//! (The test kit's `process` module re-exports both.)

use std::ffi::OsStr;
use std::io;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};

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
