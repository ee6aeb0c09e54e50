//! What a caller breaks: a node frozen where it stands and thawed, a
//! master killed (what it held remembered) and its replica's takeover
//! awaited, a fresh node put in the killed one's place, a failover by hand.

use std::time::Duration;

use super::RedisCluster;
use super::topology::{Role, holds, owner};
use crate::error::{Error, state};
use crate::process::{self, blocking, poll};

pub(super) struct Held {
    id: String,
    slots: Vec<(u16, u16)>,
    replicas: Vec<u16>,
}

impl RedisCluster {
    /// Stops the node on `port` where it stands (SIGSTOP): a replica frozen
    /// so misses what its master writes meanwhile.
    pub fn freeze(&mut self, port: u16) -> Result<(), Error> {
        self.signal(port, "-STOP")?;
        self.set_frozen(port, true);
        Ok(())
    }

    /// Lets a [`RedisCluster::freeze`]d node go on (SIGCONT).
    pub fn thaw(&mut self, port: u16) -> Result<(), Error> {
        self.signal(port, "-CONT")?;
        self.set_frozen(port, false);
        Ok(())
    }

    fn set_frozen(&mut self, port: u16, frozen: bool) {
        if let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) {
            node.frozen = frozen;
        }
    }

    fn signal(&self, port: u16, signal: &str) -> Result<(), Error> {
        process::signal(self.pid(port)?, signal)
    }

    /// Kills the master on `port` (SIGKILL: whatever its replica did not get
    /// is lost), remembering its id, slots and replicas for
    /// [`RedisCluster::wait_for_failover`] and [`RedisCluster::replace`].
    pub fn kill_master(&mut self, port: u16) -> Result<(), Error> {
        // Its replicas, a frozen one (taken for failing by now) too.
        let first = self.asked()?;
        let view = self.topology(first, true)?;
        let Some(Role::Master(slots)) = view.get(&port).cloned() else {
            return Err(state(format!("{port} is not a master: {view:?}")));
        };
        let id = self.id(port)?;
        let replicas = view
            .iter()
            .filter_map(|(&p, role)| (*role == Role::Replica(port)).then_some(p))
            .collect();
        let node = self.nodes.iter_mut().find(|n| n.port == port);
        if let Some(mut child) = node.and_then(|n| n.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.killed.insert(
            port,
            Held {
                id,
                slots,
                replicas,
            },
        );
        Ok(())
    }

    /// Waits, at most `within`, until one of the former replicas of the
    /// master killed on `old` holds all its slots and every surviving node
    /// says `cluster_state:ok` and sees the same cluster; the new master.
    pub async fn wait_for_failover(&self, old: u16, within: Duration) -> Result<u16, Error> {
        let held = self
            .killed
            .get(&old)
            .ok_or_else(|| state(format!("no master killed on {old}")))?;
        poll(within, || {
            let view = self.settled()?;
            let new = held
                .slots
                .first()
                .and_then(|&(first, _)| owner(&view, first));
            match new {
                Some(new)
                    if held.replicas.contains(&new)
                        && held.slots.iter().all(|&(a, b)| holds(&view, new, a, b)) =>
                {
                    Ok(new)
                }
                _ => Err(format!(
                    "the slots of {old} ({:?}, replicas {:?}) are not with one of them: {view:?}",
                    held.slots, held.replicas
                )),
            }
        })
        .await
    }

    /// Puts a fresh, empty node on the port of the master killed there
    /// (after its failover): the others forget the dead one, the new one
    /// meets them and replicates `master`; waits (at most `within`) until
    /// it is in sync and every node agrees. A fresh node, not the old one
    /// restarted: that one's `nodes.conf` would have it claim its old slots
    /// until told otherwise, and take writes meanwhile.
    pub async fn replace(&mut self, port: u16, master: u16, within: Duration) -> Result<(), Error> {
        let Some(held) = self.killed.remove(&port) else {
            return Err(state(format!("no master killed on {port}")));
        };
        for live in self.live() {
            let answer = blocking(|| self.cli(live, &["CLUSTER", "FORGET", &held.id]))?;
            // Told by gossip before: the node is forgotten either way.
            if !matches!(answer.trim(), "OK") && !answer.contains("Unknown node") {
                return Err(state(format!(
                    "CLUSTER FORGET on {live}: {}",
                    answer.trim()
                )));
            }
        }
        let node = self.spawn(port)?;
        if let Some(slot) = self.nodes.iter_mut().find(|n| n.port == port) {
            *slot = node;
        }
        self.wait_ready(port).await?;
        let master_id = blocking(|| self.id(master))?;
        let meet =
            blocking(|| self.cli(port, &["CLUSTER", "MEET", "127.0.0.1", &master.to_string()]))?;
        if meet.trim() != "OK" {
            return Err(state(format!("CLUSTER MEET from {port}: {}", meet.trim())));
        }
        // Once it knows the master (gossip), it can replicate it.
        poll(within, || {
            let answer = self
                .cli(port, &["CLUSTER", "REPLICATE", &master_id])
                .map_err(|e| e.to_string())?;
            match answer.trim() {
                "OK" => Ok(()),
                other => Err(format!("CLUSTER REPLICATE on {port}: {other}")),
            }
        })
        .await?;
        poll(within, || {
            let view = self.settled()?;
            match view.get(&port) {
                Some(Role::Replica(m)) if *m == master => Ok(()),
                other => Err(format!("{port} is {other:?}, not a replica of {master}")),
            }
        })
        .await
    }

    /// A manual failover: the replica on `replica` takes over its master's
    /// slots. Without `force`, the master stops taking writes until the
    /// replica has them all (`CLUSTER FAILOVER`), so nothing is lost; with
    /// it, the replica takes over as it stands, its master being
    /// unreachable (`CLUSTER FAILOVER FORCE`). Waits (at most `within`)
    /// until every node agrees.
    pub async fn promote(&self, replica: u16, force: bool, within: Duration) -> Result<(), Error> {
        let mut args = vec!["CLUSTER", "FAILOVER"];
        if force {
            args.push("FORCE");
        }
        blocking(|| self.ok(replica, &args))?;
        poll(within, || {
            let view = self.settled()?;
            match view.get(&replica) {
                Some(Role::Master(slots)) if !slots.is_empty() => Ok(()),
                other => Err(format!("{replica} is {other:?}, not a master yet")),
            }
        })
        .await
    }
}
