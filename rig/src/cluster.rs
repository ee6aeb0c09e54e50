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

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::Duration;

use router::redis::slots::SLOTS;

use crate::error::{Error, state};
use crate::process::{self, blocking, poll, run, show};

/// Without an answer for this long, a node counts as failing.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// Longest one `redis-cli` call may take.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new cluster may take to agree (six nodes meeting, replicas
/// syncing).
const SETTLE: Duration = Duration::from_secs(30);
/// Longest a fresh `redis-server` may take to answer `PING`.
const NODE_READY: Duration = Duration::from_secs(10);
/// The cluster bus listens on each node's port plus this.
const BUS_OFFSET: u16 = 10000;

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

struct Held {
    id: String,
    slots: Vec<(u16, u16)>,
    replicas: Vec<u16>,
}

/// A node's part in one node's view of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// Its slot ranges (inclusive), ascending.
    Master(Vec<(u16, u16)>),
    /// The port of its master.
    Replica(u16),
}

/// One node's view: every node it does not take for failing, by port.
type Topology = BTreeMap<u16, Role>;

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
        for port in cluster.ports() {
            cluster.wait_ready(port).await?;
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

    /// The ports of the masters, as the first live node sees them.
    pub fn masters(&self) -> Result<Vec<u16>, Error> {
        Ok(self
            .view()?
            .into_iter()
            .filter_map(|(port, role)| matches!(role, Role::Master(_)).then_some(port))
            .collect())
    }

    /// Ports of the replicas of the master on `port`.
    pub fn replicas_of(&self, port: u16) -> Result<Vec<u16>, Error> {
        Ok(self
            .view()?
            .into_iter()
            .filter_map(|(p, role)| (role == Role::Replica(port)).then_some(p))
            .collect())
    }

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

    /// The process id of the live node on `port`.
    pub fn pid(&self, port: u16) -> Result<u32, Error> {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
            .map(Child::id)
            .ok_or_else(|| state(format!("no live node on {port}")))
    }

    fn signal(&self, port: u16, signal: &str) -> Result<(), Error> {
        process::signal(self.pid(port)?, signal)
    }

    /// The port of the master of `slot`, as the first live node sees it.
    pub fn master_of_slot(&self, slot: u16) -> Result<u16, Error> {
        let view = self.view()?;
        owner(&view, slot).ok_or_else(|| state(format!("nobody holds slot {slot}: {view:?}")))
    }

    /// The slot of `key` (CRC16/XMODEM mod 16384 of the key, or of its
    /// first non-empty `{hash tag}`): what `CLUSTER KEYSLOT` says, without
    /// asking.
    pub fn slot_of(key: &str) -> u16 {
        router::redis::slots::slot(key.as_bytes())
    }

    /// Runs `redis-cli` (without `-c`: redirections come back as answers)
    /// against the node on `port`; its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> Result<String, Error> {
        let port = port.to_string();
        let mut argv = vec!["-p", &port];
        argv.extend(args);
        let out = run("redis-cli", &argv, None, CLI_TIMEOUT)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Runs `commands`, one a line, on one connection to the node on
    /// `port` (so `READONLY` first lets a replica answer reads); the
    /// answers, one value a line.
    pub fn script(&self, port: u16, commands: &[String]) -> Result<String, Error> {
        let port = port.to_string();
        let input = commands.join("\n") + "\n";
        let out = run("redis-cli", &["-p", &port], Some(&input), CLI_TIMEOUT)?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
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

    /// Waits, at most `within`, until every live node agrees (see
    /// [`RedisCluster::start`]).
    pub async fn wait_settled(&self, within: Duration) -> Result<(), Error> {
        poll(within, || self.settled().map(drop)).await
    }

    /// Waits, at most `within`, until every replica of the master on `port`
    /// has acknowledged all the master has written (its offset in the
    /// master's `INFO replication` reaches `master_repl_offset`). `WAIT`
    /// cannot say so from a fresh `redis-cli`: it waits for that
    /// connection's own writes, of which there are none.
    pub async fn replicated(&self, port: u16, within: Duration) -> Result<(), Error> {
        let replicas = self.replicas_of(port)?.len();
        poll(within, || {
            let info = self
                .cli(port, &["INFO", "replication"])
                .map_err(|e| e.to_string())?;
            let field = |line: &str, key: &str| -> Option<u64> {
                line.split(',')
                    .find_map(|f| f.strip_prefix(key))
                    .and_then(|v| v.trim().parse().ok())
            };
            let written = info
                .lines()
                .find_map(|l| field(l, "master_repl_offset:"))
                .ok_or("no master_repl_offset")?;
            let acked: Vec<u64> = info
                .lines()
                .filter(|l| l.starts_with("slave"))
                .filter_map(|l| field(l.split_once(':')?.1, "offset="))
                .collect();
            if acked.len() >= replicas && acked.iter().all(|&o| o >= written) {
                Ok(())
            } else {
                Err(format!("replicas at {acked:?} of {written}"))
            }
        })
        .await
    }

    /// Moves `slot` with all its keys to the master on `to`, as
    /// `redis-cli --cluster reshard` does, and waits until every node agrees.
    pub async fn migrate_slot(&self, slot: u16, to: u16) -> Result<(), Error> {
        blocking(|| self.begin_migration(slot, to))?;
        self.finish_migration(slot, to).await
    }

    /// The first half of a migration: `to` imports `slot`, its master
    /// migrates it, and the keys there now move. The slot stays with its
    /// master (which answers `ASK` for keys it no longer has) until
    /// [`RedisCluster::finish_migration`].
    pub fn begin_migration(&self, slot: u16, to: u16) -> Result<(), Error> {
        let from = self.master_of_slot(slot)?;
        if from == to {
            return Err(state(format!("slot {slot} is on {to} already")));
        }
        let slot_arg = slot.to_string();
        self.ok(
            to,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_arg,
                "IMPORTING",
                &self.id(from)?,
            ],
        )?;
        self.ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &self.id(to)?],
        )?;
        self.move_keys(slot, from, to)
    }

    /// The second half: the keys left move, then `to` owns `slot` (told to
    /// `to`, the old master and every other master, in that order); waits
    /// until every node sees it so.
    pub async fn finish_migration(&self, slot: u16, to: u16) -> Result<(), Error> {
        blocking(|| {
            let from = self.master_of_slot(slot)?;
            self.move_keys(slot, from, to)?;
            let slot_arg = slot.to_string();
            let to_id = self.id(to)?;
            let others: Vec<u16> = self
                .masters()?
                .into_iter()
                .filter(|&p| p != from && p != to)
                .collect();
            for port in [to, from].into_iter().chain(others) {
                self.ok(port, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id])?;
            }
            Ok::<_, Error>(())
        })?;
        poll(CLI_TIMEOUT, || {
            let view = self.settled()?;
            match owner(&view, slot) {
                Some(p) if p == to => Ok(()),
                other => Err(format!("slot {slot} is with {other:?}, not {to}")),
            }
        })
        .await
    }

    /// `MIGRATE`s the keys of `slot` from `from` to `to`, 100 at a time,
    /// until `from` has none.
    fn move_keys(&self, slot: u16, from: u16, to: u16) -> Result<(), Error> {
        let (slot, to) = (slot.to_string(), to.to_string());
        loop {
            let listed = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"])?;
            let keys: Vec<&str> = listed.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                return Ok(());
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to, "", "0", "5000", "KEYS"];
            args.extend(keys);
            // NOKEY: they all expired in between.
            let answer = self.cli(from, &args)?;
            if !matches!(answer.trim(), "OK" | "NOKEY") {
                return Err(state(format!("{args:?} on {from}: {answer}")));
            }
        }
    }

    /// Runs a command that must answer `OK`.
    pub fn ok(&self, port: u16, args: &[&str]) -> Result<(), Error> {
        let answer = self.cli(port, args)?;
        if answer.trim() != "OK" {
            return Err(state(format!("{args:?} on {port}: {}", answer.trim())));
        }
        Ok(())
    }

    /// The node id of the node on `port`.
    pub fn id(&self, port: u16) -> Result<String, Error> {
        let id = self.cli(port, &["CLUSTER", "MYID"])?.trim().to_owned();
        if id.is_empty() {
            return Err(state(format!("no node id from {port}")));
        }
        Ok(id)
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

    /// The first live node that is not frozen: the one asked.
    fn asked(&self) -> Result<u16, Error> {
        self.live()
            .into_iter()
            .find(|&p| !self.nodes.iter().any(|n| n.port == p && n.frozen))
            .ok_or_else(|| state("no live node"))
    }

    /// The view of the first live node that is not frozen.
    fn view(&self) -> Result<Topology, Error> {
        self.topology(self.asked()?, false)
    }

    /// The view of the node on `port`, from its `CLUSTER NODES`: `<id>
    /// <ip:port@bus> <flags> <master-id> <ping> <pong> <epoch> <link>
    /// <slots>...`, where a slot is `n`, `a-b`, or (mid-migration, on the two
    /// masters concerned only) `[n->-id]` / `[n-<-id]`, skipped here. Nodes
    /// it takes for failing are left out, unless `failing`.
    fn topology(&self, port: u16, failing: bool) -> Result<Topology, Error> {
        let listed = self.cli(port, &["CLUSTER", "NODES"])?;
        let lines: Vec<Vec<&str>> = listed
            .lines()
            .map(|l| l.split_whitespace().collect())
            .filter(|f: &Vec<&str>| f.len() >= 8)
            .collect();
        let port_of = |addr: &str| -> u16 {
            let port = addr.split('@').next().and_then(|a| a.rsplit(':').next());
            port.and_then(|p| p.parse().ok()).unwrap_or(0)
        };
        let ids: HashMap<&str, u16> = lines.iter().map(|f| (f[0], port_of(f[1]))).collect();
        Ok(lines
            .iter()
            .filter(|f| {
                failing
                    || !f[2].split(',').any(|flag| {
                        flag.starts_with("fail") || flag == "handshake" || flag == "noaddr"
                    })
            })
            .map(|f| {
                let role = if f[2].split(',').any(|flag| flag == "master") {
                    let mut slots: Vec<(u16, u16)> = f[8..]
                        .iter()
                        .filter(|s| !s.starts_with('['))
                        .filter_map(|s| {
                            let (a, b) = s.split_once('-').unwrap_or((s, s));
                            Some((a.parse().ok()?, b.parse().ok()?))
                        })
                        .collect();
                    slots.sort_unstable();
                    Role::Master(slots)
                } else {
                    Role::Replica(ids.get(f[3]).copied().unwrap_or(0))
                };
                (port_of(f[1]), role)
            })
            .collect())
    }

    /// The view every live node shares, if they all say `cluster_state:ok`,
    /// none is missing from it or taken for failing, the masters hold every
    /// slot, and every replica is in sync with its master; else why not.
    fn settled(&self) -> Result<Topology, String> {
        let live = self.live();
        let mut shared: Option<(u16, Topology)> = None;
        for &port in &live {
            let info = self
                .cli(port, &["CLUSTER", "INFO"])
                .map_err(|e| e.to_string())?;
            let state = info.lines().find(|l| l.starts_with("cluster_state:"));
            if state.map(str::trim) != Some("cluster_state:ok") {
                return Err(format!("{port} says {state:?}"));
            }
            let view = self.topology(port, false).map_err(|e| e.to_string())?;
            match &shared {
                Some((first, seen)) if *seen != view => {
                    return Err(format!("{port} sees {view:?}, {first} sees {seen:?}"));
                }
                Some(_) => {}
                None => shared = Some((port, view)),
            }
        }
        let (_, view) = shared.ok_or("no node alive")?;
        if !view.keys().copied().eq(live.iter().copied()) {
            return Err(format!("the nodes see {view:?}, alive are {live:?}"));
        }
        let covered: u32 = view
            .values()
            .filter_map(|r| match r {
                Role::Master(slots) => Some(
                    slots
                        .iter()
                        .map(|&(a, b)| u32::from(b - a) + 1)
                        .sum::<u32>(),
                ),
                Role::Replica(_) => None,
            })
            .sum();
        if covered != SLOTS as u32 {
            return Err(format!("{covered} slots held: {view:?}"));
        }
        for (&port, role) in &view {
            if let Role::Replica(master) = role {
                let info = self
                    .cli(port, &["INFO", "replication"])
                    .map_err(|e| e.to_string())?;
                if !info.contains("master_link_status:up") {
                    return Err(format!("replica {port} is not in sync with {master} yet"));
                }
            }
        }
        Ok(view)
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

    /// Starts a node on `port`, in a directory of its own.
    fn spawn(&mut self, port: u16) -> Result<Node, Error> {
        self.started += 1;
        let dir = self.dir.join(format!("{port}-{}", self.started));
        std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
            path: dir.display().to_string(),
            source,
        })?;
        let mut command = process::command("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .arg("--dir")
            .arg(&dir)
            .arg("--logfile")
            .arg(dir.join("redis.log"))
            .args(["--cluster-enabled", "yes"])
            .arg("--cluster-config-file")
            .arg(dir.join("nodes.conf"))
            .args([
                "--cluster-node-timeout",
                &NODE_TIMEOUT.as_millis().to_string(),
            ])
            // A replica may take over however long it was cut off from its
            // master: the callers kill masters, they do not partition them.
            .args(["--cluster-replica-validity-factor", "0"])
            // A replica's first sync starts at once, not after 5 s.
            .args(["--repl-diskless-sync-delay", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = process::spawn(command).map_err(|source| Error::Spawn {
            program: "redis-server".to_owned(),
            source,
        })?;
        Ok(Node {
            port,
            dir,
            child: Some(child),
            frozen: false,
        })
    }

    /// Waits until the node on `port` answers `PING`.
    async fn wait_ready(&self, port: u16) -> Result<(), Error> {
        let log = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .map(|n| n.dir.join("redis.log").display().to_string())
            .unwrap_or_default();
        poll(NODE_READY, || {
            match self.cli(port, &["PING"]).map_err(|e| e.to_string())?.trim() {
                "PONG" => Ok(()),
                other => Err(format!(
                    "redis-server on {port}: PING says {other:?} (its log: {log})"
                )),
            }
        })
        .await
    }
}

/// The master holding `slot` in `view`.
fn owner(view: &Topology, slot: u16) -> Option<u16> {
    view.keys().copied().find(|&p| holds(view, p, slot, slot))
}

/// Whether `port` holds all of `first..=last` in `view`.
fn holds(view: &Topology, port: u16, first: u16, last: u16) -> bool {
    matches!(view.get(&port), Some(Role::Master(slots)) if slots.iter().any(|&(a, b)| a <= first && last <= b))
}

/// `n` distinct free loopback ports whose bus port (port + 10000) is free
/// too: each pair is held until all are found, so none repeats.
fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| Error::Io {
            path: "127.0.0.1:0".to_owned(),
            source,
        })?;
        let port = listener
            .local_addr()
            .map_err(|source| Error::Io {
                path: "127.0.0.1:0".to_owned(),
                source,
            })?
            .port();
        held.push(listener);
        let bus = port
            .checked_add(BUS_OFFSET)
            .and_then(|bus| TcpListener::bind(("127.0.0.1", bus)).ok());
        if let Some(bus) = bus {
            held.push(bus);
            ports.push(port);
            if ports.len() == n {
                return Ok(ports);
            }
        }
    }
    Err(state(format!(
        "no {n} free ports with their bus ports free too"
    )))
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
