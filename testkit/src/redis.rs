//! A real `redis-server` on a free loopback port, started and stopped by the
//! test, over TCP or TLS only: the rig's ([`rig::redis`], which says how a
//! server knows it is the one answering on its port), where an error is
//! the test failing. Nothing is saved unless the test says `SAVE`
//! ([`Redis::save`]): a restart comes back empty, or to that dump
//! ([`Redis::restart_from_save`]), Redis gone back in time. Each server has
//! a scratch directory of its own (removed on drop), so that no dump lands
//! in the tests' working directory.

use crate::pki::Pki;

/// A failed step is the test failing.
fn must<T>(done: Result<T, rig::Error>) -> T {
    done.unwrap_or_else(|e| panic!("redis-server: {e}"))
}

pub struct Redis {
    pub port: u16,
    inner: rig::Redis,
}

impl From<rig::Redis> for Redis {
    fn from(inner: rig::Redis) -> Self {
        Self {
            port: inner.port(),
            inner,
        }
    }
}

impl Redis {
    pub async fn start() -> Self {
        Self::from(must(rig::Redis::start().await))
    }

    /// With more `redis-server` arguments (`--replicaof`, `--requirepass`).
    pub async fn start_with(args: &[&str]) -> Self {
        Self::from(must(rig::Redis::start_with(args).await))
    }

    /// TLS only (`--port 0`): the server shows `pki`'s server certificate and
    /// requires a client certificate signed by its CA (mTLS).
    pub async fn start_tls(pki: &Pki) -> Self {
        let tls = rig::redis::Tls {
            ca: pki.ca(),
            server: pki.server(),
            client: pki.client(),
        };
        Self::from(must(rig::Redis::start_tls(tls).await))
    }

    pub fn url(&self) -> String {
        self.inner.url()
    }

    /// Runs `redis-cli` against this server; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        must(self.inner.cli(args))
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.inner.pid()
    }

    /// Stops the server (its data is gone).
    pub fn stop(&mut self) {
        self.inner.stop();
    }

    /// Stops and starts again on the same port, empty.
    pub async fn restart_empty(&mut self) {
        must(self.inner.restart_empty().await);
    }

    /// Writes the dump [`Redis::restart_from_save`] comes back to.
    pub fn save(&self) {
        must(self.inner.save());
    }

    /// Kills the server (SIGKILL: nothing written since the last `SAVE`
    /// survives) and starts it again from its dump: Redis gone back in time.
    pub async fn restart_from_save(&mut self) {
        must(self.inner.restart_from_save().await);
    }

    /// Freezes the server (SIGSTOP): unreachable, data kept.
    pub fn freeze(&self) {
        must(self.inner.freeze());
    }

    pub fn thaw(&self) {
        must(self.inner.thaw());
    }
}
