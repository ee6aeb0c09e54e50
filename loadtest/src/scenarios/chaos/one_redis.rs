//! One Redis (`--redis one`): a master (a dump only when told to `SAVE`)
//! and its replica, behind the [`Proxy`] the pods reach them through, and
//! the faults that fit it: freezing the master, delaying it, failing over
//! to a replica that lags, restarting from an older dump. Where a fault
//! changes what Redis holds, each topic's position is read from the new
//! Redis directly while the proxy still holds the pods back, so that what
//! Redis lost can be told from what the publishers were answered.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use rig::Redis;
use rig::process::blocking;

use super::Clock;
use super::faults::{DELAY, Fault, Position};
use super::proxy::Proxy;
use crate::Error;

/// Longest a replica may take to finish its sync.
const SYNC_WAIT: Duration = Duration::from_secs(20);

/// Every server's arguments besides its port and directory: replicas sync
/// without a dump, at once.
const REPLICATION: [&str; 4] = [
    "--repl-diskless-sync",
    "yes",
    "--repl-diskless-sync-delay",
    "0",
];

/// A server in `dir` (its log and dump, kept), on `port` or a free one, a
/// replica of the one on `replica_of` if given.
async fn server(dir: PathBuf, port: Option<u16>, replica_of: Option<u16>) -> Result<Redis, Error> {
    let master = replica_of.map(|p| p.to_string());
    let mut args = REPLICATION.to_vec();
    if let Some(master) = &master {
        args.extend(["--replicaof", "127.0.0.1", master]);
    }
    Ok(Redis::start_in(dir, port, &args).await?)
}

pub struct OneRedis {
    pub redis: [Redis; 2],
    /// Which of `redis` the proxy sends the pods to.
    pub master: usize,
    pub proxy: Proxy,
    /// The run's directory: each Redis started in a directory of its own.
    dir: PathBuf,
    incarnations: usize,
}

impl OneRedis {
    /// A master, its replica (in sync), and the proxy in front of the master.
    pub async fn start(dir: PathBuf) -> Result<Self, Error> {
        let master = server(dir.join("redis-0"), None, None).await?;
        let replica = server(dir.join("redis-1"), None, Some(master.port())).await?;
        replica.synced(SYNC_WAIT).await?;
        let proxy = Proxy::start(master.addr()).await?;
        Ok(Self {
            redis: [master, replica],
            master: 0,
            proxy,
            dir,
            incarnations: 2,
        })
    }

    pub fn master_addr(&self) -> SocketAddr {
        self.redis[self.master].addr()
    }

    /// After a fault that failed: the pods must not stay cut off.
    pub fn release(&self) {
        self.proxy.release();
        self.proxy.set_delay(Duration::ZERO);
    }

    /// `GET key` on the master.
    pub async fn get(&self, key: &str) -> Result<String, Error> {
        Ok(blocking(|| self.redis[self.master].cli(&["GET", key]))?)
    }

    pub async fn freeze(&mut self, hold: Duration, fault: &mut Fault) -> Result<(), Error> {
        let master = &self.redis[self.master];
        let pid = master.pid().ok_or_else(|| {
            Error::Cluster(format!("redis-server on {} is not running", master.port()))
        })?;
        fault.detail = format!("SIGSTOP redis {} (pid {pid}), SIGCONT", master.port());
        blocking(|| master.freeze())?;
        tokio::time::sleep(hold).await;
        Ok(blocking(|| master.thaw())?)
    }

    pub async fn delay(&mut self, hold: Duration, fault: &mut Fault) {
        fault.detail = format!("proxy adds {} ms each way", DELAY.as_millis());
        self.proxy.set_delay(DELAY);
        tokio::time::sleep(hold).await;
        self.proxy.set_delay(Duration::ZERO);
    }

    pub async fn failover(
        &mut self,
        hold: Duration,
        fault: &mut Fault,
        clock: &Clock,
        topics: &[String],
    ) -> Result<(), Error> {
        let (old, new) = (self.master, 1 - self.master);
        self.redis[new].synced(SYNC_WAIT).await?;
        // From here the replica lags: it gets nothing more.
        blocking(|| self.redis[new].ok(&["REPLICAOF", "NO", "ONE"]))?;
        tokio::time::sleep(hold).await;
        self.proxy.hold();
        self.proxy.cut();
        self.redis[old].stop();
        let restored = self.positions(new, topics).await?;
        let clock_line = self.lineage(new).await;
        fault.detail = format!(
            "replica {} detached, master {} killed (-9) {:.1} s later, proxy switched; {clock_line}",
            self.redis[new].port(),
            self.redis[old].port(),
            hold.as_secs_f64()
        );
        self.proxy.switch(self.redis[new].addr());
        fault.reopened_ms = Some(clock.ms());
        fault.restored = Some(restored);
        self.proxy.release();
        self.master = new;
        // The next failover needs a replica: a fresh one where the old master was.
        let dir = self.dir.join(format!("redis-{}", self.incarnations));
        self.incarnations += 1;
        let port = self.redis[old].port();
        self.redis[old] = server(dir, Some(port), Some(self.redis[new].port())).await?;
        Ok(())
    }

    pub async fn restore(
        &mut self,
        hold: Duration,
        fault: &mut Fault,
        clock: &Clock,
        topics: &[String],
    ) -> Result<(), Error> {
        let master = self.master;
        blocking(|| self.redis[master].save())?;
        tokio::time::sleep(hold).await;
        self.proxy.hold();
        self.proxy.cut();
        // Killed (-9), and back from the dump: a master, even if it was
        // started as a replica (and promoted since).
        self.redis[master].restart_with(&REPLICATION).await?;
        let restored = self.positions(master, topics).await?;
        let clock_line = self.lineage(master).await;
        fault.detail = format!(
            "SAVE, {:.1} s of writes, redis {} killed (-9) and restarted from the dump; {clock_line}",
            hold.as_secs_f64(),
            self.redis[master].port()
        );
        fault.reopened_ms = Some(clock.ms());
        fault.restored = Some(restored);
        self.proxy.release();
        Ok(())
    }

    /// Each topic's `(epoch, seq)` in `redis[server]`, read directly.
    async fn positions(
        &self,
        server: usize,
        topics: &[String],
    ) -> Result<Vec<Option<Position>>, Error> {
        let mut positions = Vec::with_capacity(topics.len());
        for topic in topics {
            let key = Position::meta_key(topic);
            let answer = blocking(|| self.redis[server].cli(&["HMGET", &key, "epoch", "seq"]))?;
            let mut lines = answer.lines();
            positions.push(Position::parse(lines.next(), lines.next()));
        }
        Ok(positions)
    }

    /// The lineage clock Redis holds, for the fault's detail.
    async fn lineage(&self, server: usize) -> String {
        match blocking(|| self.redis[server].cli(&["HGET", "herald:lineage", "clock"])) {
            Ok(clock) => format!("lineage clock {}", clock.trim()),
            Err(e) => format!("lineage clock unread: {e}"),
        }
    }
}
