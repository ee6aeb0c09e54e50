//! The processes `chaos` runs and breaks: two `redis-server`s (a master that
//! persists only when told to `SAVE`, and its replica), the `herald` pods,
//! all on loopback, each with its log in the run's directory. Every child
//! is killed when its handle is dropped; every wait is bounded.
//!
//! Signals go through the system's `kill` (this crate has no unsafe code).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::Error;
use crate::metrics::Scraper;

/// Longest a `redis-server` may take to answer `PING` (loading a dump included).
const REDIS_READY: Duration = Duration::from_secs(20);
/// Longest a replica may take to finish its sync.
const SYNC_WAIT: Duration = Duration::from_secs(20);
/// Longest a `herald` may take to answer `/readyz`.
const HERALD_READY: Duration = Duration::from_secs(20);
/// Longest one `redis-cli` command may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(5);
/// Between two looks at something with no event to await (a port, a status).
const POLL: Duration = Duration::from_millis(25);
/// Free ports tried when another process took the one we picked.
const ATTEMPTS: usize = 5;

fn fail(what: impl std::fmt::Display) -> Error {
    Error::Cluster(what.to_string())
}

/// A loopback port nobody listens on right now. The process we give it to
/// binds it itself, so another may take it in between: the callers retry.
fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|e| fail(format!("bind: {e}")))?;
    Ok(listener
        .local_addr()
        .map_err(|e| fail(format!("address: {e}")))?
        .port())
}

/// A log file, appended to by every incarnation of a process.
fn log_file(path: &Path) -> Result<(Stdio, Stdio), Error> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| fail(format!("{}: {e}", path.display())))?;
    let copy = file
        .try_clone()
        .map_err(|e| fail(format!("{}: {e}", path.display())))?;
    Ok((Stdio::from(file), Stdio::from(copy)))
}

/// Sends `signal` (`-STOP`, `-CONT`, `-KILL`) to `pid`.
pub async fn signal(pid: u32, signal: &str) -> Result<(), Error> {
    let status = tokio::time::timeout(
        CLI_TIMEOUT,
        Command::new("kill")
            .args([signal, &pid.to_string()])
            .kill_on_drop(true)
            .status(),
    )
    .await
    .map_err(|_| fail(format!("kill {signal} {pid}: no answer")))?
    .map_err(|e| fail(format!("running kill: {e}")))?;
    if !status.success() {
        return Err(fail(format!("kill {signal} {pid}: {status}")));
    }
    Ok(())
}

/// Kills a child (SIGKILL) and reaps it.
async fn kill(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        let _ = c.start_kill();
        let _ = tokio::time::timeout(CLI_TIMEOUT, c.wait()).await;
    }
}

/// One `redis-server`. Its dump (written only by `SAVE`) lives in `dir`;
/// a restart on the same port and directory comes back to it.
pub struct RedisServer {
    pub port: u16,
    dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server in `dir` (created), a replica of `replica_of` if
    /// given, on `port` or a free one; waits until it answers.
    pub async fn start(
        dir: PathBuf,
        port: Option<u16>,
        replica_of: Option<u16>,
    ) -> Result<Self, Error> {
        std::fs::create_dir_all(&dir).map_err(|e| fail(format!("{}: {e}", dir.display())))?;
        let log = dir.join("redis.log");
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let mut server = Self {
                port: match port {
                    Some(p) => p,
                    None => free_port()?,
                },
                dir: dir.clone(),
                log: log.clone(),
                child: None,
            };
            match server.spawn(replica_of).await {
                Ok(()) => return Ok(server),
                Err(e) if port.is_none() => last = e.to_string(),
                Err(e) => return Err(e),
            }
        }
        Err(fail(format!("redis-server did not start: {last}")))
    }

    async fn spawn(&mut self, replica_of: Option<u16>) -> Result<(), Error> {
        let (out, err) = log_file(&self.log)?;
        // Killed with this process however it ends (see `process`); started
        // from a runtime worker, which lives as long as the run.
        let mut command = Command::from(crate::process::command("redis-server"));
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&self.dir)
            // A dump only when told to SAVE; replicas sync without one.
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .args([
                "--repl-diskless-sync",
                "yes",
                "--repl-diskless-sync-delay",
                "0",
            ]);
        if let Some(master) = replica_of {
            command.args(["--replicaof", "127.0.0.1", &master.to_string()]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("redis-server (is it installed?): {e}")))?;
        self.child = Some(child);
        let deadline = Instant::now() + REDIS_READY;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                return Err(fail(format!(
                    "redis-server on {} exited with {status} (log {})",
                    self.port,
                    self.log.display()
                )));
            }
            if self.cli(&["PING"]).await.is_ok_and(|a| a.trim() == "PONG") {
                return Ok(());
            }
            if Instant::now() >= deadline {
                kill(&mut self.child).await;
                return Err(fail(format!(
                    "redis-server on {} not ready within {REDIS_READY:?}",
                    self.port
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn pid(&self) -> Result<u32, Error> {
        self.child
            .as_ref()
            .and_then(Child::id)
            .ok_or_else(|| fail(format!("redis-server on {} is not running", self.port)))
    }

    /// `redis-cli` against this server (never through the proxy); its
    /// output, one line per value, a nil as an empty line.
    pub async fn cli(&self, args: &[&str]) -> Result<String, Error> {
        let output = tokio::time::timeout(
            CLI_TIMEOUT,
            Command::new("redis-cli")
                .args(["-p", &self.port.to_string()])
                .args(args)
                .stdin(Stdio::null())
                .kill_on_drop(true)
                .output(),
        )
        .await
        .map_err(|_| {
            fail(format!(
                "redis-cli {args:?}: no answer within {CLI_TIMEOUT:?}"
            ))
        })?
        .map_err(|e| fail(format!("redis-cli: {e}")))?;
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Runs a command that must answer `OK`.
    pub async fn ok(&self, args: &[&str]) -> Result<(), Error> {
        let answer = self.cli(args).await?;
        if answer.trim() != "OK" {
            return Err(fail(format!(
                "{args:?} on {}: {}",
                self.port,
                answer.trim()
            )));
        }
        Ok(())
    }

    /// Waits until this replica's link is up and its sync done.
    pub async fn synced(&self) -> Result<(), Error> {
        let deadline = Instant::now() + SYNC_WAIT;
        loop {
            let info = self.cli(&["INFO", "replication"]).await.unwrap_or_default();
            if info.contains("master_link_status:up") && info.contains("master_sync_in_progress:0")
            {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(fail(format!(
                    "replica on {} not in sync within {SYNC_WAIT:?}",
                    self.port
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGKILL: whatever was not saved is gone.
    pub async fn kill9(&mut self) {
        kill(&mut self.child).await;
    }

    /// Starts again on the same port and directory (so from its last dump).
    pub async fn restart(&mut self, replica_of: Option<u16>) -> Result<(), Error> {
        kill(&mut self.child).await;
        self.spawn(replica_of).await
    }
}

/// One `herald` pod, reaching Redis at `redis_url` (the proxy).
pub struct Pod {
    pub addr: SocketAddr,
    grpc: SocketAddr,
    bin: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    child: Option<Child>,
}

impl Pod {
    /// Starts pod `index` on free ports, with `env` besides the listen
    /// addresses; waits until it is ready.
    pub async fn start(
        bin: &Path,
        index: usize,
        env: Vec<(String, String)>,
        dir: &Path,
    ) -> Result<Self, Error> {
        let mut last = String::new();
        for _ in 0..ATTEMPTS {
            let mut pod = Self {
                addr: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
                grpc: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
                bin: bin.to_owned(),
                env: env.clone(),
                log: dir.join(format!("herald-{index}.log")),
                child: None,
            };
            match pod.spawn().await {
                Ok(()) => return Ok(pod),
                // A port taken in between: the log says `binding`; try others.
                Err(e) if e.to_string().contains("binding") => last = e.to_string(),
                Err(e) => return Err(e),
            }
        }
        Err(fail(format!("herald could not bind free ports: {last}")))
    }

    async fn spawn(&mut self) -> Result<(), Error> {
        let (out, err) = log_file(&self.log)?;
        let mut command = Command::from(crate::process::command(&self.bin));
        // Only what the scenario says: no HERALD_* of the caller's environment.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                command.env_remove(key);
            }
        }
        let child = command
            .env("HERALD_LISTEN", self.addr.to_string())
            .env("HERALD_GRPC__LISTEN", self.grpc.to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| fail(format!("{}: {e}", self.bin.display())))?;
        self.child = Some(child);
        let deadline = Instant::now() + HERALD_READY;
        loop {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: String = log.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
                return Err(fail(format!(
                    "herald on {} exited with {status}: {tail}",
                    self.addr
                )));
            }
            if Scraper::new(self.addr).get("/readyz").await.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                kill(&mut self.child).await;
                return Err(fail(format!(
                    "herald on {} not ready within {HERALD_READY:?} (log {})",
                    self.addr,
                    self.log.display()
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// SIGKILL: no drain, its clients' latest acks unsaved.
    pub async fn kill9(&mut self) {
        kill(&mut self.child).await;
    }

    /// Starts again on the same ports.
    pub async fn restart(&mut self) -> Result<(), Error> {
        kill(&mut self.child).await;
        self.spawn().await
    }
}
