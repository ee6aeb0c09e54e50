//! A real `redis-server` on a free loopback port, started and stopped by the
//! test (no persistence: a restart comes back empty). Like the binary, it
//! binds its port itself: the port was free a moment before
//! ([`crate::herald::free_port`]).

use std::process::{Child, Command, Stdio};

use crate::herald::free_port;
use crate::{WAIT, eventually};

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
}

impl Redis {
    pub async fn start() -> Self {
        let port = free_port();
        let mut redis = Self { port, child: None };
        redis.spawn().await;
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test.sh installs it)");
        self.child = Some(child);
        let answer = |s: String| match s.trim() {
            "PONG" => Ok(()),
            other => Err(format!("redis-server did not start: PING says {other:?}")),
        };
        eventually(WAIT, || async { answer(self.cli(&["PING"])) }).await;
    }

    /// Runs `redis-cli` against this server; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Stops the server (its data is gone).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops and starts again on the same port, empty.
    pub async fn restart_empty(&mut self) {
        self.stop();
        self.spawn().await;
    }

    /// Freezes the server (SIGSTOP): unreachable, data kept.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        if let Some(child) = &self.child {
            let status = Command::new("kill")
                .args([signal, &child.id().to_string()])
                .status();
            assert!(status.is_ok_and(|s| s.success()), "kill {signal}");
        }
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.thaw();
        self.stop();
    }
}
