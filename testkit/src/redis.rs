//! A real `redis-server` on a free loopback port, started and stopped by the
//! test, over TCP or TLS only. Nothing is saved unless the test says `SAVE`
//! ([`Redis::save`]): a restart comes back empty, or to that dump
//! ([`Redis::restart_from_save`]), Redis gone back in time. Each server has a
//! directory of its own (removed on drop), so that no dump lands in the
//! tests' working directory. Like the binary, it binds its port itself: the
//! port was free a moment before ([`crate::herald::free_port`]), and another
//! test's process may take it first. So a server counts as started only
//! once the one answering on its port says it is this child (`INFO`'s
//! `process_id`): otherwise two tests could share one Redis, each flushing,
//! restarting and `CLIENT KILL`ing under the other. A start whose port was
//! taken tries another; a restart, which must come back on the same port,
//! fails saying so.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tokio::time::Instant;

use crate::WAIT;
use crate::herald::free_port;
use crate::pki::Pki;

/// Ports tried before giving up (another process may take the free port
/// between our look and the server's bind).
const ATTEMPTS: usize = 5;
/// Between two looks at a server that is not answering yet.
const POLL: Duration = Duration::from_millis(20);

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
        Self::start_on_a_free_port(args.iter().map(|a| (*a).to_owned()).collect(), None).await
    }

    /// TLS only (`--port 0`): the server shows `pki`'s server certificate and
    /// requires a client certificate signed by its CA (mTLS).
    pub async fn start_tls(pki: &Pki) -> Self {
        let tls = Tls {
            ca: pki.ca(),
            server: pki.server(),
            client: pki.client(),
        };
        Self::start_on_a_free_port(Vec::new(), Some(tls)).await
    }

    async fn start_on_a_free_port(args: Vec<String>, tls: Option<Tls>) -> Self {
        let mut redis = Self {
            port: 0,
            child: None,
            args,
            tls,
            dir: PathBuf::new(),
        };
        let mut last = None;
        for _ in 0..ATTEMPTS {
            redis.port = free_port();
            redis.dir = workdir(redis.port);
            match redis.spawn().await {
                Ok(()) => return redis,
                Err(exited) => {
                    // The port was taken in the meantime: try another.
                    let _ = std::fs::remove_dir_all(&redis.dir);
                    last = Some(exited);
                }
            }
        }
        panic!(
            "redis-server did not start on a free port in {ATTEMPTS} attempts (it exited: {last:?}; \
             is it installed? scripts/test.sh installs it)"
        );
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    /// Starts the server on `self.port` and waits until it answers there;
    /// `Err` if it exited first (its port was taken).
    async fn spawn(&mut self) -> Result<(), ExitStatus> {
        let port = self.port.to_string();
        let mut command = crate::process::command("redis-server");
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
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child =
            crate::process::spawn(command).expect("redis-server (scripts/test.sh installs it)");
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(status);
            }
            let info = self.cli(&["INFO", "server"]);
            let answering = info
                .lines()
                .find_map(|line| line.trim().strip_prefix("process_id:")?.parse::<u32>().ok());
            match answering {
                Some(answering) if answering == pid => return Ok(()),
                // Another test's server, until ours fails to bind and exits.
                Some(_) | None => {}
            }
            assert!(
                Instant::now() < deadline,
                "redis-server (pid {pid}) not answering on port {port} within {WAIT:?}; \
                 INFO server says: {info:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Starts the server again on its port, which it must get back.
    async fn respawn(&mut self) {
        if let Err(status) = self.spawn().await {
            panic!(
                "redis-server could not come back on port {} ({status}): another process took \
                 the port while it was down",
                self.port
            );
        }
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

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
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
        self.respawn().await;
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
        self.respawn().await;
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
