//! The real `herald` binary as a child process: configured through
//! `HERALD_*` variables only, on a free loopback port, ready once `/readyz`
//! says so, and killed when dropped so that a failing test leaves no process
//! behind.
//!
//! The binary binds its ports itself, so they cannot be bound to port 0 and
//! read back as [`crate::Gateway`]'s are: it is given ports that were free a
//! moment ago ([`free_port`]), and started again on others if one was taken
//! in between (its log then says `binding`).
//!
//! The path of the binary comes from the caller: Cargo sets
//! `CARGO_BIN_EXE_herald` for the gateway package's own tests only, so they
//! pass `env!("CARGO_BIN_EXE_herald")`.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::http::get;

/// Longest the binary may take to become ready.
pub const READY_WAIT: Duration = Duration::from_secs(20);
/// Between two looks at something that has no event to wait on (an exit
/// status, a port that is not listening yet).
const POLL: Duration = Duration::from_millis(20);
/// Ports tried before giving up (another process may take the free port
/// between our look and the binary's bind).
const ATTEMPTS: usize = 5;

/// A running `herald`.
pub struct Herald {
    pub addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    child: Option<Child>,
    /// The binary's stdout and stderr, shown when a test fails.
    log: PathBuf,
}

impl Herald {
    /// Starts the `herald` at `bin` with `env` (plus `HERALD_LISTEN` and
    /// `HERALD_GRPC__LISTEN` on free loopback ports) and `args`, and waits
    /// until `GET /readyz` answers 200.
    pub async fn start(bin: impl AsRef<Path>, env: &[(&str, &str)], args: &[&str]) -> Self {
        Self::start_until(bin.as_ref(), env, args, "/readyz").await
    }

    /// [`Herald::start`], waiting only until it serves (`GET /healthz` answers
    /// 200): for a pod that is to start not ready (its Redis is away).
    pub async fn start_live(bin: impl AsRef<Path>, env: &[(&str, &str)], args: &[&str]) -> Self {
        Self::start_until(bin.as_ref(), env, args, "/healthz").await
    }

    async fn start_until(bin: &Path, env: &[(&str, &str)], args: &[&str], probe: &str) -> Self {
        let mut last_log = String::new();
        for _ in 0..ATTEMPTS {
            let addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let grpc_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
            let mut herald = Self::spawn(bin, addr, grpc_addr, env, args);
            match herald.wait_ready(probe).await {
                Ready::Yes => {
                    // Shown with the test's output if it fails or times out:
                    // a test killed for its timeout runs no destructor, and
                    // its pods' logs stay where this says.
                    eprintln!(
                        "herald pid {} on {}: log {}",
                        herald.pid(),
                        herald.addr,
                        herald.log.display()
                    );
                    return herald;
                }
                Ready::Exited(status) => {
                    last_log = herald.log();
                    assert!(
                        last_log.contains("binding"),
                        "herald exited with {status} before it was ready:\n{last_log}"
                    );
                    // The port was taken in the meantime: try another.
                }
            }
        }
        panic!(
            "herald could not bind a free port in {ATTEMPTS} attempts; last output:\n{last_log}"
        );
    }

    /// A pod of a cluster sharing the `redis-server` at `redis_url`, with
    /// sessions flushed every 50 ms so that a client that moves finds its
    /// acks at the next pod; plus `env`.
    pub async fn pod(bin: impl AsRef<Path>, redis_url: &str, env: &[(&str, &str)]) -> Self {
        let mut all = vec![
            ("HERALD_BROKER", "redis"),
            ("HERALD_REDIS__URL", redis_url),
            ("HERALD_SESSION__FLUSH_INTERVAL", "50ms"),
        ];
        all.extend_from_slice(env);
        Self::start(bin, &all, &[]).await
    }

    fn spawn(
        bin: &Path,
        addr: SocketAddr,
        grpc_addr: SocketAddr,
        env: &[(&str, &str)],
        args: &[&str],
    ) -> Self {
        let log = log_path();
        let out = std::fs::File::create(&log).expect("create the log file");
        let err = out.try_clone().expect("clone the log file");
        let mut command = crate::process::command(bin);
        // Only what the test says: no HERALD_* of the environment the tests run in.
        for (key, _) in std::env::vars_os() {
            if key.to_string_lossy().starts_with("HERALD_") {
                command.env_remove(key);
            }
        }
        command
            .args(args)
            .env("HERALD_LISTEN", addr.to_string())
            // A port of its own, so that binaries started side by side do
            // not compete for the default gRPC port.
            .env("HERALD_GRPC__LISTEN", grpc_addr.to_string())
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let child = crate::process::spawn(command).expect("spawn herald");
        Self {
            addr,
            grpc_addr,
            child: Some(child),
            log,
        }
    }

    async fn wait_ready(&mut self, probe: &str) -> Ready {
        let deadline = Instant::now() + READY_WAIT;
        loop {
            if let Some(status) = self.try_wait() {
                return Ready::Exited(status);
            }
            if let Ok((200, _)) = get(self.addr, probe).await {
                return Ready::Yes;
            }
            assert!(
                Instant::now() < deadline,
                "herald not ready within {READY_WAIT:?}:\n{}",
                self.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits until this pod is connected to Redis again after Redis
    /// restarted (once in the test): its pub/sub connection is back (a topic
    /// new to the pod is refused while its reconnects fail, as they may
    /// have while Redis was down), and it publishes again (its command
    /// connection, found broken, replaced: a publish that meets the broken
    /// one fails).
    pub async fn reconnected_to_redis(&self) {
        crate::eventually(crate::WAIT, || async {
            let reconnects = crate::metric(self.addr, "herald_redis_pubsub_reconnects_total").await;
            let up = crate::metric(self.addr, "herald_redis_pubsub_up").await;
            if reconnects >= 1.0 && up == 1.0 {
                Ok(())
            } else {
                Err(format!(
                    "pub/sub of {}: {reconnects} reconnects, up {up}",
                    self.addr
                ))
            }
        })
        .await;
        let body = br#"{"topic":"warm-up","data":0}"#;
        crate::eventually(crate::WAIT, || async {
            match crate::http(self.addr, "POST", "/v1/publish", &[], body).await {
                (200, _) => Ok(()),
                (status, answer) => Err(format!("publish on {}: {status} {answer}", self.addr)),
            }
        })
        .await;
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("child").id()
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

    /// Sends SIGTERM, as Kubernetes does to a pod it stops.
    pub fn sigterm(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -TERM failed: {status}");
    }

    /// SIGHUP: reload what can change without a restart.
    pub fn sighup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP failed: {status}");
    }

    /// SIGKILL: the pod dies with no chance to drain or save anything.
    pub fn kill9(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().expect("try_wait"))
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
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "--- herald output ({}) ---\n{}",
                self.log.display(),
                self.log()
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

enum Ready {
    Yes,
    Exited(ExitStatus),
}

/// A loopback port nobody listens on right now, for a process that binds
/// its ports itself (the binary, Prometheus): another process may take it
/// before that one binds, so the caller retries on a bind failure, or
/// accepts the small risk and says so. In this process, bind port 0 and read
/// the address instead.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
    listener.local_addr().expect("local addr").port()
}

fn log_path() -> PathBuf {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "herald-test-{}-{}.log",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}
