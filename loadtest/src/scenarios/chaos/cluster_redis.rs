//! A Redis Cluster (`--redis cluster`): three masters with a replica each
//! ([`crate::redis_cluster`], the harness the tests use too), the pods given
//! every node as a seed, and the faults that fit it: a master killed, a
//! manual failover, a failover to a replica that lagged, a topic's slot
//! migrated, each hitting one master (in turn) or one topic (in turn).
//!
//! Where a fault may lose writes (a master killed), each of that master's
//! topics' position is read from its replica before the replica can be
//! promoted (`READONLY` reads on it, then `ROLE` on the same connection to
//! prove it still was a replica), and only once the replica has noticed its
//! master is gone: what it holds then is what the new master holds when the
//! pods first reach it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use tokio::time::Instant;

use super::Clock;
use super::faults::{Fault, Kind, Position};
use crate::Error;
use crate::redis_cluster::{ClusterError, RedisCluster, blocking};

/// Longest a failover (by the cluster or by hand), a fresh replica's sync,
/// or the cluster's agreeing after a fault may take.
const SETTLE_WAIT: Duration = Duration::from_secs(20);
/// Longest a killed master's replica may take to notice.
const LINK_DOWN_WAIT: Duration = Duration::from_secs(5);
/// Between two looks at a replica's link.
const LINK_POLL: Duration = Duration::from_millis(10);
/// Names tried per topic for one on the master it should be on.
const NAMES_TRIED: usize = 10_000;

pub struct ClusterRedis {
    pub cluster: RedisCluster,
    /// Faults of each kind that hit a master so far: the next one of a
    /// kind hits the next master (ascending ports), so each kind comes to
    /// every master.
    master_turns: HashMap<Kind, usize>,
    /// Migrations so far: the next one moves the next topic.
    topic_turn: usize,
    /// A replica a failed fault may have left frozen.
    frozen: Option<u16>,
}

impl ClusterRedis {
    /// Six nodes under `dir` (kept: their logs are the run's).
    pub async fn start(dir: PathBuf) -> Result<Self, Error> {
        Ok(Self {
            cluster: RedisCluster::start(dir, false).await?,
            master_turns: HashMap::new(),
            topic_turn: 0,
            frozen: None,
        })
    }

    /// The seeds, for `HERALD_REDIS__CLUSTER`.
    pub fn urls(&self) -> String {
        self.cluster.urls().join(",")
    }

    pub fn describe(&self) -> String {
        let masters = blocking(|| self.cluster.masters()).unwrap_or_default();
        format!(
            "Redis Cluster on {:?}, masters {masters:?}",
            self.cluster.ports()
        )
    }

    /// `n` topics named `<run>.<t>[.<k>]`, topic `t` on the `t % 3`-th
    /// master (ascending ports), each in a slot of its own: the topics
    /// spread over every master.
    pub fn spread(&self, run: &str, n: usize) -> Result<Vec<String>, Error> {
        blocking(|| {
            let masters = self.cluster.masters()?;
            let mut topics: Vec<String> = Vec::with_capacity(n);
            let mut slots = Vec::with_capacity(n);
            for t in 0..n {
                let wanted = masters.get(t % masters.len().max(1)).copied();
                let mut found = None;
                for k in 0..NAMES_TRIED {
                    let name = if k == 0 {
                        format!("{run}.{t}")
                    } else {
                        format!("{run}.{t}.{k}")
                    };
                    let slot = RedisCluster::slot_of(&name);
                    if slots.contains(&slot) {
                        continue;
                    }
                    if Some(self.cluster.master_of_slot(slot)?) == wanted {
                        found = Some((name, slot));
                        break;
                    }
                }
                let (name, slot) = found.ok_or_else(|| {
                    Error::Cluster(format!("no name for topic {t} on master {wanted:?}"))
                })?;
                topics.push(name);
                slots.push(slot);
            }
            Ok(topics)
        })
    }

    /// `GET key`, following the cluster's redirection.
    pub fn get(&self, key: &str) -> Result<String, Error> {
        let port = *self
            .cluster
            .live()
            .first()
            .ok_or_else(|| Error::Cluster("no live redis node".to_owned()))?;
        Ok(blocking(|| self.cluster.cli(port, &["-c", "GET", key]))?)
    }

    /// After a fault that failed: no node stays frozen.
    pub fn release(&mut self) {
        if let Some(port) = self.frozen.take() {
            let _ = blocking(|| self.cluster.thaw(port));
        }
    }

    /// Once the cluster agrees, the next master in turn: it, its replica
    /// and the topics on it, noted in `fault`.
    async fn hit(
        &mut self,
        fault: &mut Fault,
        topics: &[String],
    ) -> Result<(u16, u16, Vec<usize>), Error> {
        self.cluster.wait_settled(SETTLE_WAIT).await?;
        let (master, replica) = self.next_master(fault.kind)?;
        let scope = self.on(master, topics)?;
        (fault.master, fault.topics) = (Some(master), Some(scope.clone()));
        Ok((master, replica, scope))
    }

    /// The next master in turn for a fault of `kind`, and its replica.
    fn next_master(&mut self, kind: Kind) -> Result<(u16, u16), Error> {
        let masters = blocking(|| self.cluster.masters())?;
        let turn = self.master_turns.entry(kind).or_default();
        let master = *masters
            .get(*turn % masters.len().max(1))
            .ok_or_else(|| Error::Cluster("no master".to_owned()))?;
        *turn += 1;
        let replica = blocking(|| self.cluster.replicas_of(master))?
            .first()
            .copied()
            .ok_or_else(|| Error::Cluster(format!("master {master} has no replica")))?;
        Ok((master, replica))
    }

    /// The topics whose slot `master` holds.
    fn on(&self, master: u16, topics: &[String]) -> Result<Vec<usize>, Error> {
        let mut on = Vec::new();
        for (t, topic) in topics.iter().enumerate() {
            let slot = RedisCluster::slot_of(topic);
            if blocking(|| self.cluster.master_of_slot(slot))? == master {
                on.push(t);
            }
        }
        Ok(on)
    }

    /// Each of `scope`'s topics' position on `replica`, whose master is
    /// gone: read once the replica has noticed, and while it still is a
    /// replica (nothing but its master writes to it).
    async fn read_replica(
        &self,
        replica: u16,
        topics: &[String],
        scope: &[usize],
    ) -> Result<Vec<Option<Position>>, Error> {
        let deadline = Instant::now() + LINK_DOWN_WAIT;
        loop {
            let info = blocking(|| self.cluster.cli(replica, &["INFO", "replication"]))?;
            if info.contains("master_link_status:down") {
                break;
            }
            if Instant::now() >= deadline {
                return Err(Error::Cluster(format!(
                    "replica {replica} still linked to its dead master after {LINK_DOWN_WAIT:?}"
                )));
            }
            tokio::time::sleep(LINK_POLL).await;
        }
        let mut commands = vec!["READONLY".to_owned()];
        for &t in scope {
            commands.push(format!(
                "HMGET {} epoch seq",
                Position::meta_key(&topics[t])
            ));
        }
        commands.push("ROLE".to_owned());
        let answer = blocking(|| self.cluster.script(replica, &commands))?;
        let mut lines = answer.lines();
        if lines.next().map(str::trim) != Some("OK") {
            return Err(Error::Cluster(format!(
                "READONLY on {replica}: {}",
                answer.trim()
            )));
        }
        let mut restored = vec![None; topics.len()];
        for &t in scope {
            restored[t] = Position::parse(lines.next(), lines.next());
        }
        match lines.next().map(str::trim) {
            Some("slave") => Ok(restored),
            other => Err(Error::Cluster(format!(
                "replica {replica} was no replica by the time its positions were read (ROLE {other:?})"
            ))),
        }
    }

    /// [`super::faults::Kind::MasterKill`].
    pub async fn master_kill(
        &mut self,
        hold: Duration,
        fault: &mut Fault,
        clock: &Clock,
        topics: &[String],
    ) -> Result<(), Error> {
        let (master, replica, scope) = self.hit(fault, topics).await?;
        fault.detail = format!("master {master} killed (-9)");
        let killed = Instant::now();
        blocking(|| self.cluster.kill_master(master))?;
        fault.restored = Some(self.read_replica(replica, topics, &scope).await?);
        fault.reopened_ms = Some(clock.ms());
        let new = self.cluster.wait_for_failover(master, SETTLE_WAIT).await?;
        fault.detail = format!(
            "master {master} killed (-9), its replica {replica} read, the cluster promoted {new} {:.1} s after the kill; a fresh replica on {master} after {:.1} s more",
            killed.elapsed().as_secs_f64(),
            hold.as_secs_f64()
        );
        tokio::time::sleep(hold).await;
        self.cluster.replace(master, new, SETTLE_WAIT).await?;
        Ok(())
    }

    /// [`super::faults::Kind::ManualFailover`].
    pub async fn manual_failover(
        &mut self,
        fault: &mut Fault,
        topics: &[String],
    ) -> Result<(), Error> {
        let (master, replica, _) = self.hit(fault, topics).await?;
        fault.detail = format!("CLUSTER FAILOVER: replica {replica} took over from {master}");
        self.cluster.promote(replica, false, SETTLE_WAIT).await?;
        Ok(())
    }

    /// [`super::faults::Kind::LaggingFailover`].
    pub async fn lagging_failover(
        &mut self,
        hold: Duration,
        fault: &mut Fault,
        clock: &Clock,
        topics: &[String],
    ) -> Result<(), Error> {
        let (master, replica, scope) = self.hit(fault, topics).await?;
        fault.detail = format!("replica {replica} of {master} frozen and cut off");
        let no_failover = |on: &'static str| ["CONFIG", "SET", "cluster-replica-no-failover", on];
        // Promoted only once read, by hand.
        blocking(|| self.cluster.ok(replica, &no_failover("yes")))?;
        blocking(|| self.cluster.freeze(replica))?;
        self.frozen = Some(replica);
        // A frozen replica's socket would still buffer what the master
        // sends: cut, it gets nothing more.
        blocking(|| {
            self.cluster
                .cli(master, &["CLIENT", "KILL", "TYPE", "replica"])
        })?;
        tokio::time::sleep(hold).await;
        blocking(|| self.cluster.kill_master(master))?;
        blocking(|| self.cluster.thaw(replica))?;
        self.frozen = None;
        fault.restored = Some(self.read_replica(replica, topics, &scope).await?);
        fault.reopened_ms = Some(clock.ms());
        self.cluster.promote(replica, true, SETTLE_WAIT).await?;
        blocking(|| self.cluster.ok(replica, &no_failover("no")))?;
        fault.detail = format!(
            "replica {replica} of {master} frozen and cut off, {:.1} s of writes, master killed (-9), replica thawed, read and promoted (FAILOVER FORCE); a fresh replica on {master}",
            hold.as_secs_f64()
        );
        self.cluster.replace(master, replica, SETTLE_WAIT).await?;
        Ok(())
    }

    /// [`super::faults::Kind::Migrate`].
    pub async fn migrate(
        &mut self,
        hold: Duration,
        fault: &mut Fault,
        topics: &[String],
    ) -> Result<(), Error> {
        self.cluster.wait_settled(SETTLE_WAIT).await?;
        let t = self.topic_turn % topics.len().max(1);
        self.topic_turn += 1;
        let topic = topics
            .get(t)
            .ok_or_else(|| Error::Cluster("no topic to migrate".to_owned()))?;
        let slot = RedisCluster::slot_of(topic);
        let (from, to) = blocking(|| {
            let from = self.cluster.master_of_slot(slot)?;
            let masters = self.cluster.masters()?;
            let next = masters.iter().position(|&m| m == from).map_or(0, |i| i + 1);
            let to = masters
                .get(next % masters.len().max(1))
                .copied()
                .ok_or_else(|| ClusterError::State("no master".to_owned()))?;
            Ok::<_, ClusterError>((from, to))
        })?;
        (fault.master, fault.topics) = (Some(from), Some(vec![t]));
        fault.detail = format!(
            "slot {slot} (topic {t}) from {from} to {to}: keys moved, {:.1} s mid-migration (ASK), then the owner changed",
            hold.as_secs_f64()
        );
        blocking(|| self.cluster.begin_migration(slot, to))?;
        tokio::time::sleep(hold).await;
        self.cluster.finish_migration(slot, to).await?;
        Ok(())
    }
}
