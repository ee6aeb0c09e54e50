//! The faults: a seeded schedule cycling through the kinds, and the [`Rig`]
//! (the Redis the pods use, [`Store`], and the pods) that injects them.
//! Where a fault changes what Redis holds (a failover, a restart from a
//! dump), the store reads each topic's position from the new Redis before
//! the pods can write to it, so that what Redis lost can be told from what
//! the publishers were answered. On a cluster a fault hits one master, and
//! only that master's topics may have lost writes (their reset is explained
//! by it, no other's).

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::Clock;
use super::cluster_redis::ClusterRedis;
use super::one_redis::OneRedis;
use crate::Error;
use rig::Herald;

/// Latency the `delay` fault adds, each way.
pub const DELAY: Duration = Duration::from_millis(200);

/// A kind of fault; on the command line `--faults freeze,delay,...`. The
/// first four fit one Redis, the four after `pod-kill` a cluster;
/// `pod-kill` either ([`Kind::ALL`], [`Kind::CLUSTER`]).
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
    /// A cluster's master is killed (-9); the cluster promotes its replica
    /// (after the node timeout): what the replica had not received is
    /// lost. A fresh replica takes the dead master's place after the hold.
    MasterKill,
    /// `CLUSTER FAILOVER` on a master's replica: the master pauses writes
    /// until the replica has them all, then they swap. Nothing lost.
    ManualFailover,
    /// A master's replica is frozen (SIGSTOP) and its replication link
    /// cut; the master takes writes for the hold, is killed (-9), and the
    /// replica is thawed and promoted (`CLUSTER FAILOVER FORCE`): what the
    /// master took meanwhile is lost, on its topics only.
    LaggingFailover,
    /// A topic's slot moves to the next master: its keys move at once, the
    /// slot stays mid-migration (`ASK`) for the hold, then changes owner.
    /// Nothing lost.
    Migrate,
}

impl Kind {
    /// One Redis's faults.
    pub const ALL: [Kind; 5] = [
        Kind::Freeze,
        Kind::Delay,
        Kind::Failover,
        Kind::Restore,
        Kind::PodKill,
    ];
    /// A cluster's faults.
    pub const CLUSTER: [Kind; 5] = [
        Kind::MasterKill,
        Kind::Migrate,
        Kind::LaggingFailover,
        Kind::ManualFailover,
        Kind::PodKill,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Freeze => "freeze",
            Kind::Delay => "delay",
            Kind::Failover => "failover",
            Kind::Restore => "restore",
            Kind::PodKill => "pod-kill",
            Kind::MasterKill => "master-kill",
            Kind::ManualFailover => "manual-failover",
            Kind::LaggingFailover => "lagging-failover",
            Kind::Migrate => "migrate",
        }
    }

    /// Whether it can be done to a Redis Cluster (else to one Redis).
    pub fn fits_cluster(self) -> bool {
        matches!(
            self,
            Kind::PodKill
                | Kind::MasterKill
                | Kind::ManualFailover
                | Kind::LaggingFailover
                | Kind::Migrate
        )
    }

    /// Whether it can be done to one Redis.
    pub fn fits_one(self) -> bool {
        Kind::ALL.contains(&self)
    }

    /// The hold's range: the freeze, the delay, the writes the lagging
    /// replica or the dump miss, the pod's time away, a killed master's
    /// time away after its failover, the time mid-migration.
    fn hold(self) -> (Duration, Duration) {
        let s = Duration::from_secs;
        match self {
            Kind::Freeze => (s(2), s(5)),
            Kind::Delay => (s(3), s(8)),
            Kind::Failover | Kind::Restore | Kind::LaggingFailover | Kind::Migrate => (s(2), s(4)),
            Kind::PodKill | Kind::MasterKill => (s(1), s(3)),
            Kind::ManualFailover => (s(0), s(0)),
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

impl Position {
    /// The key of `topic`'s position (Herald's default prefix).
    pub fn meta_key(topic: &str) -> String {
        format!("herald:{{{topic}}}:meta")
    }

    /// From `redis-cli`'s answer to `HMGET <meta> epoch seq`, one value a
    /// line (a nil an empty one): `None` where the topic is not.
    pub fn parse(epoch: Option<&str>, seq: Option<&str>) -> Option<Self> {
        let epoch = epoch.unwrap_or("").trim().to_owned();
        let seq = seq.unwrap_or("").trim().parse().unwrap_or(0);
        (!epoch.is_empty()).then_some(Self { epoch, seq })
    }
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
    /// On a cluster, the port of the master the fault hit.
    #[serde(default)]
    pub master: Option<u16>,
    /// The topics it could touch, by index (on a cluster, those on that
    /// master); `None`: all of them.
    #[serde(default)]
    pub topics: Option<Vec<usize>>,
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

    /// Whether it could touch topic `t`.
    pub fn covers(&self, t: usize) -> bool {
        self.topics
            .as_ref()
            .is_none_or(|topics| topics.contains(&t))
    }
}

/// The Redis the pods use, which the faults break.
pub enum Store {
    One(Box<OneRedis>),
    Cluster(ClusterRedis),
}

impl Store {
    /// What the pods are told of it: `HERALD_*` variables.
    pub fn env(&self) -> Vec<(String, String)> {
        match self {
            Store::One(one) => vec![(
                "HERALD_REDIS__URL".to_owned(),
                format!("redis://{}", one.proxy.addr),
            )],
            Store::Cluster(cluster) => vec![
                // Only its user, password and TLS would count: there are none.
                (
                    "HERALD_REDIS__URL".to_owned(),
                    "redis://127.0.0.1".to_owned(),
                ),
                ("HERALD_REDIS__CLUSTER".to_owned(), cluster.urls()),
            ],
        }
    }

    /// For the run's first line.
    pub fn describe(&self) -> String {
        match self {
            Store::One(one) => format!(
                "redis {} through proxy {}",
                one.master_addr(),
                one.proxy.addr
            ),
            Store::Cluster(cluster) => cluster.describe(),
        }
    }

    /// `GET key`, from the master holding it.
    pub async fn get(&self, key: &str) -> Result<String, Error> {
        match self {
            Store::One(one) => one.get(key).await,
            Store::Cluster(cluster) => cluster.get(key),
        }
    }
}

/// The processes a fault acts on.
pub struct Rig {
    pub store: Store,
    pub pods: Vec<Herald>,
    pub topics: Arc<[String]>,
}

impl Rig {
    pub fn new(store: Store, pods: Vec<Herald>, topics: Arc<[String]>) -> Self {
        Self {
            store,
            pods,
            topics,
        }
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
            master: None,
            topics: None,
            lost_writes: 0,
            lost_acked: 0,
            resets: 0,
            error: None,
        };
        let (hold, topics) = (planned.hold, &self.topics);
        let f = &mut fault;
        let done = match (&mut self.store, planned.kind) {
            (_, Kind::PodKill) => Self::pod_kill(&mut self.pods, planned.pod, hold, f).await,
            (Store::One(one), Kind::Freeze) => one.freeze(hold, f).await,
            (Store::One(one), Kind::Delay) => {
                one.delay(hold, f).await;
                Ok(())
            }
            (Store::One(one), Kind::Failover) => one.failover(hold, f, clock, topics).await,
            (Store::One(one), Kind::Restore) => one.restore(hold, f, clock, topics).await,
            (Store::Cluster(c), Kind::MasterKill) => c.master_kill(hold, f, clock, topics).await,
            (Store::Cluster(c), Kind::ManualFailover) => c.manual_failover(f, topics).await,
            (Store::Cluster(c), Kind::LaggingFailover) => {
                c.lagging_failover(hold, f, clock, topics).await
            }
            (Store::Cluster(c), Kind::Migrate) => c.migrate(hold, f, topics).await,
            (_, kind) => Err(Error::Options(format!(
                "{} does not fit this Redis",
                kind.name()
            ))),
        };
        if let Err(e) = done {
            fault.error = Some(e.to_string());
            // Whatever happened, the pods must not stay cut off.
            match &mut self.store {
                Store::One(one) => one.release(),
                Store::Cluster(cluster) => cluster.release(),
            }
        }
        fault.took_s = (clock.elapsed() - started).as_secs_f64();
        fault
    }

    async fn pod_kill(
        pods: &mut [Herald],
        pod: usize,
        hold: Duration,
        fault: &mut Fault,
    ) -> Result<(), Error> {
        let pod = pod % pods.len().max(1);
        let Some(target) = pods.get_mut(pod) else {
            return Err(Error::Cluster("no pod to kill".to_owned()));
        };
        fault.detail = format!("pod {pod} ({}) killed (-9), restarted", target.addr);
        target.kill9();
        tokio::time::sleep(hold).await;
        Ok(target.restart().await?)
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
