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

use super::Clock;
use super::cluster::{RedisServer, signal};
use super::faults::{DELAY, Fault, Position};
use super::proxy::Proxy;
use crate::Error;

pub struct OneRedis {
    pub redis: [RedisServer; 2],
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
        let master = RedisServer::start(dir.join("redis-0"), None, None).await?;
        let replica = RedisServer::start(dir.join("redis-1"), None, Some(master.port)).await?;
        replica.synced().await?;
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
        self.redis[self.master].cli(&["GET", key]).await
    }

    pub async fn freeze(&mut self, hold: Duration, fault: &mut Fault) -> Result<(), Error> {
        let master = &self.redis[self.master];
        let pid = master.pid()?;
        fault.detail = format!("SIGSTOP redis {} (pid {pid}), SIGCONT", master.port);
        signal(pid, "-STOP").await?;
        tokio::time::sleep(hold).await;
        signal(pid, "-CONT").await
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
        self.redis[new].synced().await?;
        // From here the replica lags: it gets nothing more.
        self.redis[new].ok(&["REPLICAOF", "NO", "ONE"]).await?;
        tokio::time::sleep(hold).await;
        self.proxy.hold();
        self.proxy.cut();
        self.redis[old].kill9().await;
        let restored = self.positions(new, topics).await?;
        let clock_line = self.lineage(new).await;
        fault.detail = format!(
            "replica {} detached, master {} killed (-9) {:.1} s later, proxy switched; {clock_line}",
            self.redis[new].port,
            self.redis[old].port,
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
        let port = self.redis[old].port;
        self.redis[old] = RedisServer::start(dir, Some(port), Some(self.redis[new].port)).await?;
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
        self.redis[master].ok(&["SAVE"]).await?;
        tokio::time::sleep(hold).await;
        self.proxy.hold();
        self.proxy.cut();
        self.redis[master].kill9().await;
        self.redis[master].restart(None).await?;
        let restored = self.positions(master, topics).await?;
        let clock_line = self.lineage(master).await;
        fault.detail = format!(
            "SAVE, {:.1} s of writes, redis {} killed (-9) and restarted from the dump; {clock_line}",
            hold.as_secs_f64(),
            self.redis[master].port
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
            let answer = self.redis[server]
                .cli(&["HMGET", &Position::meta_key(topic), "epoch", "seq"])
                .await?;
            let mut lines = answer.lines();
            positions.push(Position::parse(lines.next(), lines.next()));
        }
        Ok(positions)
    }

    /// The lineage clock Redis holds, for the fault's detail.
    async fn lineage(&self, server: usize) -> String {
        match self.redis[server]
            .cli(&["HGET", "herald:lineage", "clock"])
            .await
        {
            Ok(clock) => format!("lineage clock {}", clock.trim()),
            Err(e) => format!("lineage clock unread: {e}"),
        }
    }
}
