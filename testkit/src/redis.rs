//! A real `redis-server` on a free loopback port, started and stopped by the
//! test, over TCP or TLS only. Nothing is saved unless the test says `SAVE`
//! ([`Redis::save`]): a restart comes back empty, or to that dump
//! ([`Redis::restart_from_save`]), Redis gone back in time. Each server has a
//! directory of its own (removed on drop), so that no dump lands in the
//! tests' working directory. Like the binary, it binds its port itself: the
//! port was free a moment before ([`crate::herald::free_port`]).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::herald::free_port;
use crate::pki::Pki;
use crate::{WAIT, eventually};

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    /// More `redis-server` arguments, kept for a restart.
    args: Vec<String>,
    tls: Option<Tls>,
    /// Its working directory: where a `SAVE` goes.
    dir: PathBuf,
}

/// The files of a TLS server, and of the client `redis-cli` shows it.
struct Tls {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

impl Redis {
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// With more `redis-server` arguments (`--replicaof`, `--requirepass`).
    pub async fn start_with(args: &[&str]) -> Self {
        let port = free_port();
        let mut redis = Self {
            port,
            child: None,
            args: args.iter().map(|a| (*a).to_owned()).collect(),
            tls: None,
            dir: workdir(port),
        };
        redis.spawn().await;
        redis
    }

    /// TLS only (`--port 0`): the server shows `pki`'s server certificate and
    /// requires a client certificate signed by its CA (mTLS).
    pub async fn start_tls(pki: &Pki) -> Self {
        let port = free_port();
        let mut redis = Self {
            port,
            child: None,
            args: Vec::new(),
            dir: workdir(port),
            tls: Some(Tls {
                ca: pki.ca(),
                server: pki.server(),
                client: pki.client(),
            }),
        };
        redis.spawn().await;
        redis
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let port = self.port.to_string();
        let mut command = Command::new("redis-server");
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
        let child = command
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
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
        let mut command = Command::new("redis-cli");
        if let Some(tls) = &self.tls {
            command
                .args(["--tls", "--cacert"])
                .arg(&tls.ca)
                .arg("--cert")
                .arg(&tls.client.0)
                .arg("--key")
                .arg(&tls.client.1);
        }
        let output = command
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
        let _ = std::fs::remove_file(self.dir.join("dump.rdb"));
        self.spawn().await;
    }

    /// Writes the dump [`Redis::restart_from_save`] comes back to.
    pub fn save(&self) {
        assert_eq!(self.cli(&["SAVE"]).trim(), "OK", "SAVE");
    }

    /// Kills the server (SIGKILL: nothing written since the last `SAVE`
    /// survives) and starts it again from its dump: Redis gone back in time.
    pub async fn restart_from_save(&mut self) {
        assert!(self.dir.join("dump.rdb").exists(), "SAVE first");
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
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A fresh directory for the server on `port`.
fn workdir(port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("herald-redis-{port}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a directory for redis-server");
    dir
}
