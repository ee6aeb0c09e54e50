//! The real `herald` binary as a child process: the rig's ([`rig::herald`]:
//! configured through `HERALD_*` variables only, on free loopback ports,
//! ready once `/readyz` says so, killed when dropped), where an error is
//! the test failing, and the binary's output is shown when a test fails.
//!
//! The path of the binary comes from the caller: Cargo sets
//! `CARGO_BIN_EXE_herald` for the gateway package's own tests only, so they
//! pass `env!("CARGO_BIN_EXE_herald")`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::ExitStatus;
use std::time::Duration;

use rig::herald::Spec;

pub use rig::herald::READY_WAIT;

/// A running `herald`.
pub struct Herald {
    pub addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    inner: rig::Herald,
}

impl Herald {
    /// Starts the `herald` at `bin` with `env` (plus `HERALD_LISTEN` and
    /// `HERALD_GRPC__LISTEN` on free loopback ports) and `args`, and waits
    /// until `GET /readyz` answers 200.
    pub async fn start(bin: impl AsRef<Path>, env: &[(&str, &str)], args: &[&str]) -> Self {
        Self::start_spec(spec(bin.as_ref(), env, args)).await
    }

    /// [`Herald::start`], waiting only until it serves (`GET /healthz` answers
    /// 200): for a pod that is to start not ready (its Redis is away).
    pub async fn start_live(bin: impl AsRef<Path>, env: &[(&str, &str)], args: &[&str]) -> Self {
        Self::start_spec(spec(bin.as_ref(), env, args).live()).await
    }

    async fn start_spec(spec: Spec) -> Self {
        let inner = rig::Herald::start(spec)
            .await
            .unwrap_or_else(|e| panic!("herald: {e}"));
        // Shown with the test's output if it fails or times out: a test
        // killed for its timeout runs no destructor, and its pods' logs stay
        // where this says.
        eprintln!(
            "herald pid {} on {}: log {}",
            inner.pid().unwrap_or_default(),
            inner.addr,
            inner.log_path().display()
        );
        Self {
            addr: inner.addr,
            grpc_addr: inner.grpc_addr,
            inner,
        }
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
        self.inner.pid().expect("child")
    }

    pub fn ws_url(&self) -> String {
        self.inner.ws_url()
    }

    pub fn http_url(&self) -> String {
        self.inner.http_url()
    }

    /// What the binary printed so far.
    pub fn log(&self) -> String {
        self.inner.log()
    }

    /// Sends SIGTERM, as Kubernetes does to a pod it stops.
    pub fn sigterm(&self) {
        if let Err(e) = self.inner.signal("-TERM") {
            panic!("kill -TERM failed: {e}");
        }
    }

    /// SIGHUP: reload what can change without a restart.
    pub fn sighup(&self) {
        if let Err(e) = self.inner.signal("-HUP") {
            panic!("kill -HUP failed: {e}");
        }
    }

    /// SIGKILL: the pod dies with no chance to drain or save anything.
    pub fn kill9(&mut self) {
        self.inner.kill9();
    }

    /// The exit status, if the process has exited.
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.inner.try_wait()
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        self.inner.wait_exit(timeout).await
    }
}

impl Drop for Herald {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- herald output ({}) ---\n{}",
                self.inner.log_path().display(),
                self.inner.log()
            );
        }
    }
}

fn spec(bin: &Path, env: &[(&str, &str)], args: &[&str]) -> Spec {
    Spec::new(bin)
        .envs(env.iter().copied())
        .args(args.iter().copied())
}

/// A loopback port nobody listens on right now, for a process that binds
/// its ports itself (the binary, Prometheus): another process may take it
/// before that one binds, so the caller retries on a bind failure, or
/// accepts the small risk and says so. In this process, bind port 0 and read
/// the address instead.
pub fn free_port() -> u16 {
    rig::process::free_port().expect("a free loopback port")
}
