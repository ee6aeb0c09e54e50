//! The real `herald` binary as a child process, as a pod: configured
//! through `HERALD_*` variables (only those the caller gives: none of the
//! caller's environment) and arguments, on free loopback ports, started
//! once `/readyz` (or `/healthz`) answers 200, and killed when dropped.
//!
//! The binary binds its ports itself, so they cannot be bound to port 0 and
//! read back: it is given ports that were free a moment ago
//! ([`free_port`]), and started again on others if one was taken in
//! between (its log then says `binding`). A restart keeps its ports.
//!
//! Its stdout and stderr go to a log file: one the caller names (appended
//! to by every incarnation, and kept), or a scratch one removed on drop.
//! The path of the binary comes from the caller: Cargo sets
//! `CARGO_BIN_EXE_herald` for the gateway package's own tests only.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, io, state};
use crate::http::get;
use crate::process::{self, PORT_ATTEMPTS, free_port, tail};

/// Longest the binary may take to become ready.
pub const READY_WAIT: Duration = Duration::from_secs(20);
/// Between two looks at something that has no event to wait on (an exit
/// status, a port that is not listening yet).
const POLL: Duration = Duration::from_millis(20);

/// What a pod must answer 200 on before it counts as started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// `/readyz`: serving, and its broker reached.
    Ready,
    /// `/healthz`: serving, for a pod that is to start not ready (its
    /// Redis is away).
    Live,
}

impl Probe {
    fn path(self) -> &'static str {
        match self {
            Probe::Ready => "/readyz",
            Probe::Live => "/healthz",
        }
    }
}

/// How to start a pod: the binary, its environment and arguments (besides
/// `HERALD_LISTEN` and `HERALD_GRPC__LISTEN`, which the rig sets), its log.
#[derive(Debug, Clone)]
pub struct Spec {
    pub bin: PathBuf,
    pub env: Vec<(String, String)>,
    pub args: Vec<String>,
    /// Appended to and kept; `None`: a scratch file, removed on drop.
    pub log: Option<PathBuf>,
    pub probe: Probe,
}

impl Spec {
    /// The binary at `bin`, no environment, no arguments, waited for until
    /// ready.
    pub fn new(bin: impl Into<PathBuf>) -> Self {
        Self {
            bin: bin.into(),
            env: Vec::new(),
            args: Vec::new(),
            log: None,
            probe: Probe::Ready,
        }
    }

    /// One more `HERALD_*` variable (a later one of the same name wins).
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn envs<K: Into<String>, V: Into<String>>(
        mut self,
        env: impl IntoIterator<Item = (K, V)>,
    ) -> Self {
        self.env
            .extend(env.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    pub fn args<A: Into<String>>(mut self, args: impl IntoIterator<Item = A>) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// Its output appended to `path`, kept.
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// Started once it serves, ready or not ([`Probe::Live`]).
    pub fn live(mut self) -> Self {
        self.probe = Probe::Live;
        self
    }
}

/// A running `herald`.
pub struct Herald {
    /// HTTP and WebSocket.
    pub addr: SocketAddr,
    /// The gRPC publish API.
    pub grpc_addr: SocketAddr,
    spec: Spec,
    log: PathBuf,
    child: Option<Child>,
}

impl Herald {
    /// Starts the pod `spec` says on free loopback ports, and waits (at most
    /// [`READY_WAIT`]) until its probe answers 200.
    pub async fn start(spec: Spec) -> Result<Self, Error> {
        let mut last = String::new();
        for _ in 0..PORT_ATTEMPTS {
            let mut herald = Self {
                addr: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
                grpc_addr: SocketAddr::from(([127, 0, 0, 1], free_port()?)),
                log: match &spec.log {
                    Some(log) => log.clone(),
                    None => scratch_log(),
                },
                spec: spec.clone(),
                child: None,
            };
            match herald.spawn().await {
                Ok(()) => return Ok(herald),
                // The port was taken in the meantime: try another.
                Err(Error::Exited { log, .. }) if log.contains("binding") => last = log,
                Err(e) => return Err(e),
            }
        }
        Err(state(format!(
            "herald could not bind a free port in {PORT_ATTEMPTS} attempts; its last output: {last}"
        )))
    }

    async fn spawn(&mut self) -> Result<(), Error> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(io(self.log.display()))?;
        let err = out.try_clone().map_err(io(self.log.display()))?;
        let mut command = process::command(&self.spec.bin);
        // Only what the caller says: no HERALD_* of the environment it runs in.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                command.env_remove(key);
            }
        }
        command
            .args(&self.spec.args)
            .env("HERALD_LISTEN", self.addr.to_string())
            // A port of its own, so that binaries started side by side do
            // not compete for the default gRPC port.
            .env("HERALD_GRPC__LISTEN", self.grpc_addr.to_string())
            .envs(self.spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = process::spawn(command).map_err(|source| Error::Spawn {
            program: self.spec.bin.display().to_string(),
            source,
        })?;
        self.child = Some(child);
        let probe = self.spec.probe.path();
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if let Some(status) = self.try_wait() {
                self.child = None;
                return Err(Error::Exited {
                    what: format!("herald on {}", self.addr),
                    status,
                    log: tail(&self.log),
                });
            }
            if let Ok((200, _)) = get(self.addr, probe).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                process::kill(&mut self.child);
                return Err(state(format!(
                    "herald on {} not answering {probe} within {READY_WAIT:?}: {}",
                    self.addr,
                    tail(&self.log)
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The port of its HTTP and WebSocket listener.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn ws_url(&self) -> String {
        format!("ws://{}/ws", self.addr)
    }

    pub fn http_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the binary printed so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Sends `signal` (`-TERM`: what Kubernetes sends a pod it stops;
    /// `-HUP`: reload what can change without a restart).
    pub fn signal(&self, signal: &str) -> Result<(), Error> {
        let pid = self
            .pid()
            .ok_or_else(|| state(format!("herald on {} is not running", self.addr)))?;
        process::signal(pid, signal)
    }

    /// SIGKILL: the pod dies with no chance to drain or save anything.
    pub fn kill9(&mut self) {
        process::kill(&mut self.child);
    }

    /// Kills it if it runs, and starts it again on the same ports.
    pub async fn restart(&mut self) -> Result<(), Error> {
        self.kill9();
        self.spawn().await
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

impl Drop for Herald {
    fn drop(&mut self) {
        process::kill(&mut self.child);
        if self.spec.log.is_none() {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

fn scratch_log() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "herald-test-{}-{}.log",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}
