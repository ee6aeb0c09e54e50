//! A real `redis-server` on a loopback port, over TCP or TLS only. Nothing
//! is saved unless the caller says `SAVE` ([`Redis::save`]): a restart
//! comes back empty, or to that dump ([`Redis::restart_from_save`]), Redis
//! gone back in time. Each server has a directory of its own: a scratch
//! one (removed on drop), so that no dump lands in the caller's working
//! directory, or one the caller names and keeps (its log and dump are a
//! run's). The server's output goes to `redis.log` there.
//!
//! Like the binary, it binds its port itself: the port was free a moment
//! before ([`free_port`]), and another test's process may take it first. So
//! a server counts as started only once the one answering on its port says
//! it is this child (`INFO`'s `process_id`): otherwise two tests could share
//! one Redis, each flushing, restarting and `CLIENT KILL`ing under the
//! other. A start whose port was taken tries another; a restart, which must
//! come back on the same port, fails saying so.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, io, state};
use crate::process::{self, PORT_ATTEMPTS, blocking, free_port, tail};

/// Longest a server may take to answer (loading a dump included).
pub const READY_WAIT: Duration = Duration::from_secs(20);
/// Longest one `redis-cli` call may take.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// Between two looks at a server that is not answering yet.
const POLL: Duration = Duration::from_millis(20);

/// A running `redis-server`; killed on drop.
pub struct Redis {
    port: u16,
    child: Option<Child>,
    /// More `redis-server` arguments, kept for a restart.
    args: Vec<String>,
    tls: Option<Tls>,
    /// Its working directory: where a `SAVE` goes, and its log.
    dir: PathBuf,
    /// Whether `dir` goes on drop.
    scratch: bool,
    /// While stopped: its port, bound (not listening, so connecting is still
    /// refused), so that no other test's process takes it before the
    /// restart.
    held: Option<tokio::net::TcpSocket>,
}

/// The files of a TLS server (`--port 0`, TLS only): its certificate and
/// key, the CA its clients' certificates must be signed by (mTLS), and the
/// client certificate and key [`Redis::cli`] shows it.
#[derive(Debug, Clone)]
pub struct Tls {
    pub ca: PathBuf,
    /// Certificate and key.
    pub server: (PathBuf, PathBuf),
    /// Certificate and key.
    pub client: (PathBuf, PathBuf),
}

impl Redis {
    /// On a free port, in a scratch directory.
    pub async fn start() -> Result<Self, Error> {
        Self::start_with(&[]).await
    }

    /// With more `redis-server` arguments (`--replicaof`, `--requirepass`).
    pub async fn start_with(args: &[&str]) -> Result<Self, Error> {
        Self::start_scratch(owned(args), None).await
    }

    /// TLS only (`--port 0`): the server shows `tls`'s server certificate
    /// and requires a client certificate signed by its CA (mTLS).
    pub async fn start_tls(tls: Tls) -> Result<Self, Error> {
        Self::start_scratch(Vec::new(), Some(tls)).await
    }

    /// In `dir` (created, and kept: its log and dump stay), on `port` or
    /// else a free one, with more `redis-server` arguments.
    pub async fn start_in(dir: PathBuf, port: Option<u16>, args: &[&str]) -> Result<Self, Error> {
        std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
        let mut redis = Self {
            port: 0,
            child: None,
            args: owned(args),
            tls: None,
            dir,
            scratch: false,
            held: None,
        };
        if let Some(port) = port {
            redis.port = port;
            redis.spawn().await?;
            return Ok(redis);
        }
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            redis.port = free_port()?;
            match redis.spawn().await {
                Ok(()) => return Ok(redis),
                // The port was taken in the meantime: try another.
                Err(e @ Error::Exited { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(not_started(last))
    }

    async fn start_scratch(args: Vec<String>, tls: Option<Tls>) -> Result<Self, Error> {
        let mut redis = Self {
            port: 0,
            child: None,
            args,
            tls,
            dir: PathBuf::new(),
            scratch: true,
            held: None,
        };
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            redis.port = free_port()?;
            redis.dir = workdir(redis.port)?;
            match redis.spawn().await {
                Ok(()) => return Ok(redis),
                Err(e) => {
                    // The port was taken in the meantime: try another.
                    let _ = std::fs::remove_dir_all(&redis.dir);
                    if !matches!(e, Error::Exited { .. }) {
                        return Err(e);
                    }
                    last = Some(e);
                }
            }
        }
        Err(not_started(last))
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// `redis://127.0.0.1:<port>`, or `rediss://` over TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Its directory (its log, `redis.log`, and its dump).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts the server on `self.port` and waits until it answers there;
    /// [`Error::Exited`] if it exited first (its port was taken).
    async fn spawn(&mut self) -> Result<(), Error> {
        let port = self.port.to_string();
        let log = self.dir.join("redis.log");
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(io(log.display()))?;
        let err = out.try_clone().map_err(io(log.display()))?;
        let mut command = process::command("redis-server");
        match &self.tls {
            None => command.args(["--port", &port]),
            Some(tls) => command
                .args(["--port", "0", "--tls-port", &port])
                .arg("--tls-cert-file")
                .arg(&tls.server.0)
                .arg("--tls-key-file")
                .arg(&tls.server.1)
                .arg("--tls-ca-cert-file")
                .arg(&tls.ca)
                .args(["--tls-auth-clients", "yes"]),
        };
        command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = process::spawn(command).map_err(|source| Error::Spawn {
            program: "redis-server".to_owned(),
            source,
        })?;
        self.child = Some(child);
        let tls = self.tls.clone();
        let on = self.port;
        until_own(&mut self.child, "redis-server", on, &log, || {
            cli_on(on, tls.as_ref(), &["INFO", "server"])
        })
        .await
    }

    /// Starts the server again on its port, which it must get back.
    async fn respawn(&mut self) -> Result<(), Error> {
        self.held = None;
        match self.spawn().await {
            Err(Error::Exited { status, log, .. }) => Err(state(format!(
                "redis-server could not come back on port {} ({status}): another process took \
                 the port while it was down? its log: {log}",
                self.port
            ))),
            done => done,
        }
    }

    /// Runs `redis-cli` against this server (one argument per argv entry,
    /// bounded by [`CLI_TIMEOUT`]); its output, one line per value, a nil as
    /// an empty line. It blocks its thread a few milliseconds: an async
    /// caller runs it through [`blocking`].
    pub fn cli(&self, args: &[&str]) -> Result<String, Error> {
        cli_on(self.port, self.tls.as_ref(), args)
    }

    /// Runs a command that must answer `OK`.
    pub fn ok(&self, args: &[&str]) -> Result<(), Error> {
        let answer = self.cli(args)?;
        if answer.trim() != "OK" {
            return Err(state(format!(
                "{args:?} on {}: {}",
                self.port,
                answer.trim()
            )));
        }
        Ok(())
    }

    /// Waits, at most `within`, until this replica's link to its master is
    /// up and its sync done.
    pub async fn synced(&self, within: Duration) -> Result<(), Error> {
        process::poll(within, || {
            let info = self
                .cli(&["INFO", "replication"])
                .map_err(|e| e.to_string())?;
            if info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
            {
                Ok(())
            } else {
                Err(format!(
                    "the replica on {} is not in sync yet:\n{info}",
                    self.port
                ))
            }
        })
        .await
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Stops the server (SIGKILL: nothing written since the last `SAVE`
    /// survives).
    pub fn stop(&mut self) {
        process::kill(&mut self.child);
        if self.held.is_none() {
            self.held = hold(self.port);
        }
    }

    /// Stops and starts again on the same port and directory, with the
    /// same arguments: back to its last dump, if it has one.
    pub async fn restart(&mut self) -> Result<(), Error> {
        self.stop();
        self.respawn().await
    }

    /// [`Redis::restart`] with these arguments from now on (instead of
    /// those it was started with): a replica promoted since, say, comes
    /// back a master without its `--replicaof`.
    pub async fn restart_with(&mut self, args: &[&str]) -> Result<(), Error> {
        self.args = owned(args);
        self.restart().await
    }

    /// Stops and starts again on the same port, empty.
    pub async fn restart_empty(&mut self) -> Result<(), Error> {
        self.stop();
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        self.respawn().await
    }

    /// Writes the dump [`Redis::restart_from_save`] comes back to.
    pub fn save(&self) -> Result<(), Error> {
        self.ok(&["SAVE"])
    }

    /// Kills the server (SIGKILL: nothing written since the last `SAVE`
    /// survives) and starts it again from its dump: Redis gone back in time.
    pub async fn restart_from_save(&mut self) -> Result<(), Error> {
        if !self.dir.join("dump.rdb").exists() {
            return Err(state("restart from a save: SAVE first"));
        }
        self.restart().await
    }

    /// Freezes the server (SIGSTOP): unreachable, data kept.
    pub fn freeze(&self) -> Result<(), Error> {
        self.signal("-STOP")
    }

    /// Lets a [`Redis::freeze`]d server go on (SIGCONT).
    pub fn thaw(&self) -> Result<(), Error> {
        self.signal("-CONT")
    }

    fn signal(&self, signal: &str) -> Result<(), Error> {
        match self.pid() {
            Some(pid) => process::signal(pid, signal),
            None => Ok(()),
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.thaw();
        self.stop();
        if self.scratch {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// `redis-cli` against the server on `port` (over TLS with `tls`'s files).
pub(crate) fn cli_on(port: u16, tls: Option<&Tls>, args: &[&str]) -> Result<String, Error> {
    let port = port.to_string();
    let mut argv: Vec<&str> = Vec::new();
    let files;
    if let Some(tls) = tls {
        files = [
            tls.ca.display().to_string(),
            tls.client.0.display().to_string(),
            tls.client.1.display().to_string(),
        ];
        argv.extend(["--tls", "--cacert", &files[0], "--cert", &files[1]]);
        argv.extend(["--key", &files[2]]);
    }
    argv.extend(["-p", &port]);
    argv.extend(args);
    let out = process::run("redis-cli", &argv, None, CLI_TIMEOUT)?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until the server answering on `port` is `child` itself (`INFO
/// server`'s `process_id`, asked by `info`), at most [`READY_WAIT`]: until
/// then it may be another test's process that took the free port first, and
/// ours exits when its bind fails: [`Error::Exited`], for the caller to try
/// another port. A sentinel is a `redis-server` too, and is started alike.
pub(crate) async fn until_own(
    child: &mut Option<Child>,
    what: &str,
    port: u16,
    log: &Path,
    info: impl Fn() -> Result<String, Error>,
) -> Result<(), Error> {
    let Some(pid) = child.as_ref().map(Child::id) else {
        return Err(state(format!("{what} on {port}: not started")));
    };
    let deadline = Instant::now() + READY_WAIT;
    loop {
        if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
            *child = None;
            return Err(Error::Exited {
                what: format!("{what} on {port}"),
                status,
                log: tail(log),
            });
        }
        let info = blocking(&info).unwrap_or_default();
        let answering = info
            .lines()
            .find_map(|line| line.trim().strip_prefix("process_id:")?.parse::<u32>().ok());
        if answering == Some(pid) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            process::kill(child);
            return Err(state(format!(
                "{what} (pid {pid}) not answering on port {port} within {READY_WAIT:?}; INFO \
                 server says: {info:?}; its log: {}",
                tail(log)
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

fn owned(args: &[&str]) -> Vec<String> {
    args.iter().map(|a| (*a).to_owned()).collect()
}

fn not_started(last: Option<Error>) -> Error {
    let why = process::not_started("redis-server", last);
    state(format!(
        "{why} (is it installed? scripts/test.sh installs it)"
    ))
}

/// A fresh scratch directory for the server on `port`.
fn workdir(port: u16) -> Result<PathBuf, Error> {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "herald-redis-{port}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
    Ok(dir)
}

/// A socket bound to `port` on loopback and not listening: a connection to
/// it is refused, as to a port nobody holds, but no other process can bind
/// it (a free port is found by binding port 0, which skips bound ones).
/// `SO_REUSEADDR`: the stopped server's connections may linger in
/// `TIME_WAIT`. `None` if the port is taken already.
fn hold(port: u16) -> Option<tokio::net::TcpSocket> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.set_reuseaddr(true).ok()?;
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
        .ok()?;
    Some(socket)
}
