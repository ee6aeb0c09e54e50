//! A Redis Cluster of six `redis-server`s on free loopback ports: three
//! masters with a replica each (or another [`Shape`]: a benchmark's three
//! masters without replicas), made by `redis-cli --cluster create`, set to
//! fail over quickly (a node counts as down after [`NODE_TIMEOUT`]), all
//! killed on drop. A caller can kill a master and wait for its replica to
//! take over, put a fresh node in the killed one's place as a replica, fail
//! over by hand, freeze a node, or move a slot (in one go, or in two halves
//! to act mid-migration).
//!
//! One harness, two users: the test kit's `RedisCluster` (where an error is
//! the test failing) and `chaos --redis cluster` (where it is a fault that
//! could not be injected). So every step returns an [`Error`] here.
//!
//! Each node has a directory of its own in the cluster's (its `nodes.conf`,
//! its log). Every question is asked with `redis-cli`, one argument per argv
//! entry (keys may hold `{`, `}` or `:`), bounded by [`CLI_TIMEOUT`], and
//! every answer comes from the cluster's own view (`CLUSTER NODES`), never
//! from what the harness did last. A `redis-cli` call blocks its thread for
//! a few milliseconds: the waits here run each look through [`blocking`],
//! and an async caller should too. The slot of a key is the broker's own
//! function ([`RedisCluster::slot_of`]).
//!
//! Its parts, one noun each:
//! - here, the cluster's lifecycle and handles: started in a [`Shape`]
//!   ([`RedisCluster::start`]), its ports and URLs, its nodes' logs, all
//!   killed on drop; a scratch directory for it ([`scratch_dir`]).
//! - [`node`]: one `redis-server` of it: started in a directory of its
//!   own on free ports (its bus port too), ready once it is the one
//!   answering there,
//!   asked with `redis-cli`.
//! - [`topology`]: the cluster as a node's `CLUSTER NODES` reports it
//!   (masters and their slots, replicas and their masters), and the waits
//!   until every node agrees and every replica is in sync.
//! - [`faults`]: what a caller breaks: a node frozen and thawed, a master
//!   killed and its failover, a fresh node in its place, a failover by hand.
//! - [`migration`]: a slot and its keys moved to another master, in one go
//!   or in two halves.

mod faults;
mod migration;
mod node;
mod topology;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Child;
use std::time::Duration;

use crate::error::{Error, state};
use crate::process::{blocking, poll, run, show};

use self::faults::Held;
use self::node::free_ports;

/// Without an answer for this long, a node counts as failing.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Longest one `redis-cli` call may take.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cluster may take to agree (six nodes meeting, replicas
/// syncing).
const SETTLE: Duration = Duration::from_secs(30);

pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
    /// Whether `dir` goes on drop (a scratch directory), or stays (a run's logs).
    scratch: bool,
    /// What each master [`RedisCluster::kill_master`] killed held, for
    /// [`RedisCluster::wait_for_failover`] and [`RedisCluster::replace`]
    /// (the survivors forget it).
    killed: HashMap<u16, Held>,
    /// Nodes started, for each new node's directory.
    started: usize,
}

struct Node {
    port: u16,
    dir: PathBuf,
    /// `None` once killed.
    child: Option<Child>,
    /// Stopped by [`RedisCluster::freeze`]: asked nothing until thawed.
    frozen: bool,
}

/// How many masters, and how many replicas each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub masters: usize,
    pub replicas: usize,
}

impl Default for Shape {
    /// Three masters with a replica each: what a failover needs.
    fn default() -> Self {
        Self {
            masters: 3,
            replicas: 1,
        }
    }
}

impl RedisCluster {
    /// Starts six nodes under `dir` (created; removed on drop if
    /// `scratch`), makes the cluster, and waits (at most 30 s) until every
    /// node says `cluster_state:ok`, all see the same masters, replicas and
    /// slots, and every replica is in sync.
    pub async fn start(dir: PathBuf, scratch: bool) -> Result<Self, Error> {
        Self::start_shaped(dir, scratch, Shape::default()).await
    }

    /// [`RedisCluster::start`] with `shape`'s nodes (Redis wants three
    /// masters at least).
    pub async fn start_shaped(dir: PathBuf, scratch: bool, shape: Shape) -> Result<Self, Error> {
        let nodes = shape.masters * (1 + shape.replicas);
        // A node moves into its `--dir` before it opens its log and
        // `nodes.conf`: their paths must not be relative.
        let dir = std::path::absolute(&dir).map_err(|source| Error::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut cluster = Self {
            nodes: Vec::with_capacity(nodes),
            dir,
            scratch,
            killed: HashMap::new(),
            started: 0,
        };
        for port in free_ports(nodes)? {
            let node = cluster.spawn(port)?;
            cluster.nodes.push(node);
        }
        for i in 0..nodes {
            cluster.start_node(i).await?;
        }
        let addrs: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        let replicas = shape.replicas.to_string();
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let out = blocking(|| run("redis-cli", &args, None, SETTLE))?;
        let said = String::from_utf8_lossy(&out.stdout);
        if !(out.status.success() && said.contains("[OK] All 16384 slots covered")) {
            return Err(state(format!(
                "redis-cli --cluster create:\n{}",
                show(&out)
            )));
        }
        poll(SETTLE, || cluster.settled().map(drop)).await?;
        Ok(cluster)
    }

    /// Every node's port, killed ones included, ascending.
    pub fn ports(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        ports.sort_unstable();
        ports
    }

    /// `redis://127.0.0.1:<port>` of every node: a gateway's seeds.
    pub fn urls(&self) -> Vec<String> {
        self.ports()
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect()
    }

    /// The ports of the nodes not killed, ascending.
    pub fn live(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The last lines of every node's log, for whoever looks into a failure.
    pub fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|node| {
                let log = std::fs::read_to_string(node.dir.join("redis.log")).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                format!("--- redis-server {} ---\n{tail}\n", node.port)
            })
            .collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if self.scratch {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// The nodes' directories are under `dir`; a path for a scratch one.
pub fn scratch_dir(name: &str) -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    std::env::temp_dir().join(format!(
        "{name}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ))
}
