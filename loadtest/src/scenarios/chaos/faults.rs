//! The faults: a seeded schedule cycling through the kinds, and the [`Rig`]
//! (Redis master and replica, the proxy the pods reach them through, the
//! pods) that injects them. Where a fault changes what Redis holds (a
//! failover, a restart from a dump), the rig reads each topic's position
//! from the new Redis directly while the proxy still holds the pods back, so
//! that what Redis lost can be told from what the publishers were answered.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::Clock;
use super::cluster::{Pod, RedisServer, signal};
use super::proxy::Proxy;
use crate::Error;

/// Latency the `delay` fault adds, each way.
pub const DELAY: Duration = Duration::from_millis(200);

/// A kind of fault; on the command line `--faults freeze,delay,...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// SIGSTOP the master for the hold, then SIGCONT: nothing lost.
    Freeze,
    /// The proxy adds [`DELAY`] each way for the hold: nothing lost.
    Delay,
    /// The replica stops replicating (`REPLICAOF NO ONE`), the master takes
    /// writes for the hold, is killed (-9), and the proxy switches to the
    /// replica: what the master took meanwhile is lost. A fresh replica of
    /// the new master takes the old one's place.
    Failover,
    /// `SAVE`, writes for the hold, kill -9, and a restart from the dump:
    /// what came after the `SAVE` is lost.
    Restore,
    /// A pod is killed (-9) and started again after the hold.
    PodKill,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Freeze,
        Kind::Delay,
        Kind::Failover,
        Kind::Restore,
        Kind::PodKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Freeze => "freeze",
            Kind::Delay => "delay",
            Kind::Failover => "failover",
            Kind::Restore => "restore",
            Kind::PodKill => "pod-kill",
        }
    }

    /// The hold's range: the freeze, the delay, the writes the lagging
    /// replica or the dump miss, the pod's time away.
    fn hold(self) -> (Duration, Duration) {
        let s = Duration::from_secs;
        match self {
            Kind::Freeze => (s(2), s(5)),
            Kind::Delay => (s(3), s(8)),
            Kind::Failover | Kind::Restore => (s(2), s(4)),
            Kind::PodKill => (s(1), s(3)),
        }
    }
}

/// One fault of the schedule.
#[derive(Debug, Clone, Copy)]
pub struct Planned {
    pub kind: Kind,
    /// From the run's start.
    pub at: Duration,
    pub hold: Duration,
    /// The pod a [`Kind::PodKill`] kills.
    pub pod: usize,
}

/// The faults `kinds` in turn, the first at `first`, each `gap` (a random
/// span in the range) after the end of the previous one's hold, none
/// ending after `end`. The same seed gives the same schedule.
pub fn schedule(
    seed: u64,
    kinds: &[Kind],
    pods: usize,
    first: Duration,
    gap: (Duration, Duration),
    end: Duration,
) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut plan = Vec::new();
    let mut at = first;
    for kind in kinds.iter().cycle() {
        let (short, long) = kind.hold();
        let hold = rng.gen_range(short..=long);
        let pod = rng.gen_range(0..pods.max(1));
        if at + hold > end {
            break;
        }
        plan.push(Planned {
            kind: *kind,
            at,
            hold,
            pod,
        });
        at += hold + rng.gen_range(gap.0..=gap.1);
    }
    plan
}

/// A topic's position in a Redis: its epoch and newest seq.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub epoch: String,
    pub seq: u64,
}

/// What a fault did, and (filled in by the check) what it cost.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    pub kind: Kind,
    /// When it started and how long until Redis (or the pod) was back, s.
    pub at_s: f64,
    pub took_s: f64,
    pub hold_s: f64,
    /// What was done, to which process.
    pub detail: String,
    /// When the pods could reach the changed Redis (ms from the start).
    pub reopened_ms: Option<u64>,
    /// Each topic's position in the Redis the pods came back to, read
    /// before they could touch it (`None`: the topic was not there).
    pub restored: Option<Vec<Option<Position>>>,
    /// Writes Redis lost: seqs of the epoch current before the fault, above
    /// what the new Redis holds, that a publisher was answered or a client
    /// was delivered before the pods came back.
    pub lost_writes: u64,
    /// Of those, publishes that had been answered 200.
    pub lost_acked: u64,
    /// Resets clients got that this fault explains.
    pub resets: u64,
    /// Why the fault could not be injected as planned.
    pub error: Option<String>,
}

impl Fault {
    pub fn lossy(&self) -> bool {
        self.lost_writes > 0
    }
}

/// The processes a fault acts on.
pub struct Rig {
    pub redis: [RedisServer; 2],
    /// Which of `redis` the proxy sends the pods to.
    pub master: usize,
    pub proxy: Proxy,
    pub pods: Vec<Pod>,
    pub topics: Arc<[String]>,
    /// The run's directory: each Redis started in a directory of its own.
    pub dir: PathBuf,
    incarnations: usize,
}

impl Rig {
    /// A master, its replica (in sync), and the proxy in front of the master.
    pub async fn redis(dir: PathBuf) -> Result<([RedisServer; 2], Proxy), Error> {
        let master = RedisServer::start(dir.join("redis-0"), None, None).await?;
        let replica = RedisServer::start(dir.join("redis-1"), None, Some(master.port)).await?;
        replica.synced().await?;
        let proxy = Proxy::start(master.addr()).await?;
        Ok(([master, replica], proxy))
    }

    pub fn new(
        redis: [RedisServer; 2],
        proxy: Proxy,
        pods: Vec<Pod>,
        topics: Arc<[String]>,
        dir: PathBuf,
    ) -> Self {
        Self {
            redis,
            master: 0,
            proxy,
            pods,
            topics,
            dir,
            incarnations: 2,
        }
    }

    pub fn master_addr(&self) -> SocketAddr {
        self.redis[self.master].addr()
    }

    /// Injects `planned`; never fails: an error is recorded in the fault.
    pub async fn inject(&mut self, planned: &Planned, clock: &Clock) -> Fault {
        let started = clock.elapsed();
        let mut fault = Fault {
            kind: planned.kind,
            at_s: started.as_secs_f64(),
            took_s: 0.0,
            hold_s: planned.hold.as_secs_f64(),
            detail: String::new(),
            reopened_ms: None,
            restored: None,
            lost_writes: 0,
            lost_acked: 0,
            resets: 0,
            error: None,
        };
        let done = match planned.kind {
            Kind::Freeze => self.freeze(planned.hold, &mut fault).await,
            Kind::Delay => {
                self.delay(planned.hold, &mut fault).await;
                Ok(())
            }
            Kind::Failover => self.failover(planned.hold, &mut fault, clock).await,
            Kind::Restore => self.restore(planned.hold, &mut fault, clock).await,
            Kind::PodKill => self.pod_kill(planned.pod, planned.hold, &mut fault).await,
        };
        if let Err(e) = done {
            fault.error = Some(e.to_string());
            // Whatever happened, the pods must not stay cut off.
            self.proxy.release();
            self.proxy.set_delay(Duration::ZERO);
        }
        fault.took_s = (clock.elapsed() - started).as_secs_f64();
        fault
    }

    async fn freeze(&mut self, hold: Duration, fault: &mut Fault) -> Result<(), Error> {
        let master = &self.redis[self.master];
        let pid = master.pid()?;
        fault.detail = format!("SIGSTOP redis {} (pid {pid}), SIGCONT", master.port);
        signal(pid, "-STOP").await?;
        tokio::time::sleep(hold).await;
        signal(pid, "-CONT").await
    }

    async fn delay(&mut self, hold: Duration, fault: &mut Fault) {
        fault.detail = format!("proxy adds {} ms each way", DELAY.as_millis());
        self.proxy.set_delay(DELAY);
        tokio::time::sleep(hold).await;
        self.proxy.set_delay(Duration::ZERO);
    }

    async fn failover(
        &mut self,
        hold: Duration,
        fault: &mut Fault,
        clock: &Clock,
    ) -> Result<(), Error> {
        let (old, new) = (self.master, 1 - self.master);
        self.redis[new].synced().await?;
        // From here the replica lags: it gets nothing more.
        self.redis[new].ok(&["REPLICAOF", "NO", "ONE"]).await?;
        tokio::time::sleep(hold).await;
        self.proxy.hold();
        self.proxy.cut();
        self.redis[old].kill9().await;
        let restored = self.positions(new).await?;
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

    async fn restore(
        &mut self,
        hold: Duration,
        fault: &mut Fault,
        clock: &Clock,
    ) -> Result<(), Error> {
        let master = self.master;
        self.redis[master].ok(&["SAVE"]).await?;
        tokio::time::sleep(hold).await;
        self.proxy.hold();
        self.proxy.cut();
        self.redis[master].kill9().await;
        self.redis[master].restart(None).await?;
        let restored = self.positions(master).await?;
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

    async fn pod_kill(
        &mut self,
        pod: usize,
        hold: Duration,
        fault: &mut Fault,
    ) -> Result<(), Error> {
        let pod = pod % self.pods.len().max(1);
        let Some(target) = self.pods.get_mut(pod) else {
            return Err(Error::Cluster("no pod to kill".to_owned()));
        };
        fault.detail = format!("pod {pod} ({}) killed (-9), restarted", target.addr);
        target.kill9().await;
        tokio::time::sleep(hold).await;
        target.restart().await
    }

    /// Each topic's `(epoch, seq)` in `redis[server]`, read directly.
    async fn positions(&self, server: usize) -> Result<Vec<Option<Position>>, Error> {
        let mut positions = Vec::with_capacity(self.topics.len());
        for topic in self.topics.iter() {
            let meta = format!("herald:{{{topic}}}:meta");
            let answer = self.redis[server]
                .cli(&["HMGET", &meta, "epoch", "seq"])
                .await?;
            let mut lines = answer.lines();
            let epoch = lines.next().unwrap_or("").trim().to_owned();
            let seq = lines.next().unwrap_or("").trim().parse().unwrap_or(0);
            positions.push((!epoch.is_empty()).then_some(Position { epoch, seq }));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_cycles_through_the_kinds_within_the_run_and_repeats_by_seed() {
        let s = Duration::from_secs;
        let plan = schedule(7, &Kind::ALL, 3, s(5), (s(4), s(6)), s(100));
        assert!(plan.len() >= 6, "{plan:?}");
        for (i, p) in plan.iter().enumerate() {
            assert_eq!(p.kind, Kind::ALL[i % Kind::ALL.len()]);
            assert!(p.at + p.hold <= s(100));
            assert!(p.pod < 3);
            if i > 0 {
                let prev = &plan[i - 1];
                assert!(p.at >= prev.at + prev.hold + s(4));
            }
        }
        let again = schedule(7, &Kind::ALL, 3, s(5), (s(4), s(6)), s(100));
        assert_eq!(
            plan.iter().map(|p| p.at).collect::<Vec<_>>(),
            again.iter().map(|p| p.at).collect::<Vec<_>>()
        );
        let other = schedule(8, &Kind::ALL, 3, s(5), (s(4), s(6)), s(100));
        assert_ne!(
            plan.iter().map(|p| p.hold).collect::<Vec<_>>(),
            other.iter().map(|p| p.hold).collect::<Vec<_>>()
        );
        assert!(schedule(7, &[Kind::Freeze], 1, s(5), (s(1), s(1)), s(6)).is_empty());
    }
}
