//! A real `redis-server` on a free loopback port, started and stopped by the
//! test. Without persistence a restart comes back empty; a
//! [`Redis::persistent`] one keeps what it last `SAVE`d, so that a restart
//! can take it back in time. Like the binary, it binds its port itself: the
//! port was free a moment before ([`crate::herald::free_port`]).

use std::process::{Child, Command, Stdio};

use crate::herald::free_port;
use crate::{WAIT, eventually};

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    /// Where a persistent server keeps its dump (removed on drop).
    dir: Option<std::path::PathBuf>,
}

impl Redis {
    pub async fn start() -> Self {
        let port = free_port();
        let mut redis = Self {
            port,
            child: None,
            dir: None,
        };
        redis.spawn().await;
        redis
    }

    /// A server that loads its last `SAVE` when it starts again
    /// ([`Redis::save`], [`Redis::restart_from_save`]).
    pub async fn persistent() -> Self {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("herald-redis-{port}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for the dump");
        let mut redis = Self {
            port,
            child: None,
            dir: Some(dir),
        };
        redis.spawn().await;
        redis
    }

    /// Writes the dump a restart comes back to.
    pub fn save(&self) {
        assert_eq!(self.cli(&["SAVE"]).trim(), "OK", "SAVE");
    }

    /// Kills the server (SIGKILL: nothing written since the last `SAVE`
    /// survives) and starts it again from its dump: Redis gone back in time.
    pub async fn restart_from_save(&mut self) {
        assert!(self.dir.is_some(), "only a persistent server has a dump");
        self.stop();
        self.spawn().await;
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"]);
        if let Some(dir) = &self.dir {
            command.arg("--dir").arg(dir);
        }
        let child = command
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
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
