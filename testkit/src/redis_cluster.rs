//! A Redis Cluster of six `redis-server`s on free loopback ports: three
//! masters with a replica each, made by `redis-cli --cluster create`, set to
//! fail over quickly (a node counts as down after [`NODE_TIMEOUT`]), all
//! killed on drop. A test can kill a master and wait for its replica to take
//! over, or move a slot (in one go, or in two halves to act mid-migration).
//!
//! Each node has a directory of its own in the cluster's (its
//! `nodes.conf`, its log, shown when a test fails), removed on drop. Every
//! question is asked with `redis-cli`, one argument per argv entry (keys may
//! hold `{`, `}` or `:`), and every answer comes from the cluster's own view
//! (`CLUSTER NODES`), never from what the harness did last.

use std::collections::{BTreeMap, HashMap};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::eventually::eventually_every;
use crate::process::{run, show};
use crate::{WAIT, eventually};

/// Without an answer for this long, a node counts as failing.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long a new cluster may take to agree (six nodes meeting, replicas
/// syncing).
const SETTLE: Duration = Duration::from_secs(30);
/// Between two looks (each look runs a few `redis-cli` per node).
const POLL: Duration = Duration::from_millis(100);
/// The cluster bus listens on each node's port plus this.
const BUS_OFFSET: u16 = 10000;
const SLOTS: u32 = 16384;
const MISSING: &str = "redis-cli (scripts/test.sh installs redis-server)";

pub struct RedisCluster {
    nodes: Vec<Node>,
    dir: PathBuf,
    /// What each master [`RedisCluster::kill_master`] killed held, for
    /// [`RedisCluster::wait_for_failover`] (the survivors forget it).
    killed: HashMap<u16, Held>,
}

struct Node {
    port: u16,
    /// `None` once killed.
    child: Option<Child>,
}

struct Held {
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

impl RedisCluster {
    /// Starts six nodes, makes the cluster, and waits (at most 30 s)
    /// until every node says `cluster_state:ok`, all see the same masters,
    /// replicas and slots, and every replica is in sync.
    pub async fn start() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "herald-redis-cluster-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let nodes = free_ports(6)
            .into_iter()
            .map(|port| Node::spawn(&dir, port))
            .collect();
        let cluster = Self {
            nodes,
            dir,
            killed: HashMap::new(),
        };
        for port in cluster.ports() {
            eventually(WAIT, || async {
                match cluster.cli(port, &["PING"]).trim() {
                    "PONG" => Ok(()),
                    other => Err(format!("redis-server on {port}: PING says {other:?}")),
                }
            })
            .await;
        }
        let addrs: Vec<String> = cluster
            .ports()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let mut args = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", "1", "--cluster-yes"]);
        let out = run("redis-cli", &args, SETTLE, MISSING);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && said.contains("[OK] All 16384 slots covered"),
            "redis-cli --cluster create:\n{}",
            show(&out)
        );
        eventually_every(POLL, SETTLE, || async { cluster.settled().map(drop) }).await;
        cluster
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
    pub fn masters(&self) -> Vec<u16> {
        self.view()
            .into_iter()
            .filter_map(|(port, role)| matches!(role, Role::Master(_)).then_some(port))
            .collect()
    }

    /// Ports of the replicas of the master on `port`.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        self.view()
            .into_iter()
            .filter_map(|(p, role)| (role == Role::Replica(port)).then_some(p))
            .collect()
    }

    /// Stops the node on `port` where it stands (SIGSTOP): a replica frozen
    /// so misses what its master writes meanwhile.
    pub fn freeze(&self, port: u16) {
        self.signal(port, "-STOP");
    }

    /// Lets a [`RedisCluster::freeze`]d node go on (SIGCONT).
    pub fn thaw(&self, port: u16) {
        self.signal(port, "-CONT");
    }

    fn signal(&self, port: u16, signal: &str) {
        let pid = self
            .nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
            .map(Child::id)
            .unwrap_or_else(|| panic!("no live node on {port}"));
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {pid}");
    }

    /// The port of the master of `slot`, as the first live node sees it.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        let view = self.view();
        owner(&view, slot).unwrap_or_else(|| panic!("nobody holds slot {slot}: {view:?}"))
    }

    /// The slot of `key` (CRC16/XMODEM mod 16384 of the key, or of its
    /// first non-empty `{hash tag}`): what `CLUSTER KEYSLOT` says, without
    /// asking.
    pub fn slot_of(key: &str) -> u16 {
        let key = key.as_bytes();
        let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        });
        let crc = tag.unwrap_or(key).iter().fold(0u16, |crc, &b| {
            (0..8).fold(crc ^ (u16::from(b) << 8), |crc, _| {
                if crc & 0x8000 == 0 {
                    crc << 1
                } else {
                    (crc << 1) ^ 0x1021
                }
            })
        });
        crc % SLOTS as u16
    }

    /// Runs `redis-cli` (without `-c`: redirections come back as answers)
    /// against the node on `port`; its output. Bounded by [`WAIT`].
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        let port = port.to_string();
        let mut argv = vec!["-p", &port];
        argv.extend(args);
        String::from_utf8_lossy(&run("redis-cli", &argv, WAIT, MISSING).stdout).into_owned()
    }

    /// Kills the master on `port` (SIGKILL: whatever its replica did not get
    /// is lost), remembering its slots and replicas for
    /// [`RedisCluster::wait_for_failover`].
    pub fn kill_master(&mut self, port: u16) {
        let view = self.view();
        let Some(Role::Master(slots)) = view.get(&port).cloned() else {
            panic!("{port} is not a master: {view:?}");
        };
        let replicas = view
            .iter()
            .filter_map(|(&p, role)| (*role == Role::Replica(port)).then_some(p))
            .collect();
        let node = self.nodes.iter_mut().find(|n| n.port == port);
        if let Some(mut child) = node.and_then(|n| n.child.take()) {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.killed.insert(port, Held { slots, replicas });
    }

    /// Waits, at most `within`, until one of the former replicas of the
    /// master killed on `old` holds all its slots and every surviving node
    /// says `cluster_state:ok` and sees the same cluster; the new master.
    pub async fn wait_for_failover(&self, old: u16, within: Duration) -> u16 {
        let held = self
            .killed
            .get(&old)
            .unwrap_or_else(|| panic!("kill_master({old}) first"));
        eventually_every(POLL, within, || async {
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

    /// Moves `slot` with all its keys to the master on `to`, as
    /// `redis-cli --cluster reshard` does, and waits until every node agrees.
    pub async fn migrate_slot(&self, slot: u16, to: u16) {
        self.begin_migration(slot, to);
        self.finish_migration(slot, to).await;
    }

    /// The first half of a migration: `to` imports `slot`, its master
    /// migrates it, and the keys there now move. The slot stays with its
    /// master (which answers `ASK` for keys it no longer has) until
    /// [`RedisCluster::finish_migration`].
    pub fn begin_migration(&self, slot: u16, to: u16) {
        let from = self.master_of_slot(slot);
        assert_ne!(from, to, "slot {slot} is on {to} already");
        let slot_arg = slot.to_string();
        self.ok(
            to,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &self.id(from)],
        );
        self.ok(
            from,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &self.id(to)],
        );
        self.move_keys(slot, from, to);
    }

    /// The second half: the keys left move, then `to` owns `slot` (told to
    /// `to`, the old master and every other master, in that order); waits
    /// until every node sees it so.
    pub async fn finish_migration(&self, slot: u16, to: u16) {
        let from = self.master_of_slot(slot);
        self.move_keys(slot, from, to);
        let slot_arg = slot.to_string();
        let to_id = self.id(to);
        let others = self.masters().into_iter().filter(|&p| p != from && p != to);
        for port in [to, from].into_iter().chain(others) {
            self.ok(port, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id]);
        }
        eventually_every(POLL, WAIT, || async {
            let view = self.settled()?;
            match owner(&view, slot) {
                Some(p) if p == to => Ok(()),
                other => Err(format!("slot {slot} is with {other:?}, not {to}")),
            }
        })
        .await;
    }

    /// `MIGRATE`s the keys of `slot` from `from` to `to`, 100 at a time,
    /// until `from` has none.
    fn move_keys(&self, slot: u16, from: u16, to: u16) {
        let (slot, to) = (slot.to_string(), to.to_string());
        loop {
            let listed = self.cli(from, &["CLUSTER", "GETKEYSINSLOT", &slot, "100"]);
            let keys: Vec<&str> = listed.lines().filter(|k| !k.is_empty()).collect();
            if keys.is_empty() {
                return;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to, "", "0", "5000", "KEYS"];
            args.extend(keys);
            // NOKEY: they all expired in between.
            let answer = self.cli(from, &args);
            assert!(
                matches!(answer.trim(), "OK" | "NOKEY"),
                "{args:?} on {from}: {answer}"
            );
        }
    }

    /// Runs a command that must answer `OK`.
    fn ok(&self, port: u16, args: &[&str]) {
        let answer = self.cli(port, args);
        assert_eq!(answer.trim(), "OK", "{args:?} on {port}");
    }

    fn id(&self, port: u16) -> String {
        self.cli(port, &["CLUSTER", "MYID"]).trim().to_owned()
    }

    /// The ports of the nodes not killed, ascending.
    fn live(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self
            .nodes
            .iter()
            .filter(|n| n.child.is_some())
            .map(|n| n.port)
            .collect();
        ports.sort_unstable();
        ports
    }

    /// The first live node's view.
    fn view(&self) -> Topology {
        let first = *self.live().first().expect("a live node");
        self.topology(first)
    }

    /// The view of the node on `port`, from its `CLUSTER NODES`: `<id>
    /// <ip:port@bus> <flags> <master-id> <ping> <pong> <epoch> <link>
    /// <slots>...`, where a slot is `n`, `a-b`, or (mid-migration, on the two
    /// masters concerned only) `[n->-id]` / `[n-<-id]`, skipped here.
    fn topology(&self, port: u16) -> Topology {
        let listed = self.cli(port, &["CLUSTER", "NODES"]);
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
        lines
            .iter()
            .filter(|f| {
                !f[2]
                    .split(',')
                    .any(|flag| flag.starts_with("fail") || flag == "handshake" || flag == "noaddr")
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
            .collect()
    }

    /// The view every live node shares, if they all say `cluster_state:ok`,
    /// none is missing from it or taken for failing, the masters hold every
    /// slot, and every replica is in sync with its master; else why not.
    fn settled(&self) -> Result<Topology, String> {
        let live = self.live();
        let mut shared: Option<(u16, Topology)> = None;
        for &port in &live {
            let info = self.cli(port, &["CLUSTER", "INFO"]);
            let state = info.lines().find(|l| l.starts_with("cluster_state:"));
            if state.map(str::trim) != Some("cluster_state:ok") {
                return Err(format!("{port} says {state:?}"));
            }
            let view = self.topology(port);
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
        if covered != SLOTS {
            return Err(format!("{covered} slots held: {view:?}"));
        }
        for (&port, role) in &view {
            if let Role::Replica(master) = role {
                let info = self.cli(port, &["INFO", "replication"]);
                if !info.contains("master_link_status:up") {
                    return Err(format!("replica {port} is not in sync with {master} yet"));
                }
            }
        }
        Ok(view)
    }

    /// The last lines of every node's log, for a failed test.
    fn logs(&self) -> String {
        self.ports()
            .iter()
            .map(|port| {
                let log =
                    std::fs::read_to_string(self.dir.join(port.to_string()).join("redis.log"))
                        .unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(30)..].join("\n");
                format!("--- redis-server {port} ---\n{tail}\n")
            })
            .collect()
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

impl Node {
    fn spawn(dir: &Path, port: u16) -> Self {
        let dir = dir.join(port.to_string());
        std::fs::create_dir_all(&dir).expect("a directory for redis-server");
        let mut command = crate::process::command("redis-server");
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
            // master: a test kills masters, it does not partition them.
            .args(["--cluster-replica-validity-factor", "0"])
            // A replica's first sync starts at once, not after 5 s.
            .args(["--repl-diskless-sync-delay", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child =
            crate::process::spawn(command).expect("redis-server (scripts/test.sh installs it)");
        Self {
            port,
            child: Some(child),
        }
    }
}

/// `n` distinct free loopback ports whose bus port (port + 10000) is free
/// too: each pair is held until all are found, so none repeats.
fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    for _ in 0..1000 {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind port 0");
        let port = listener.local_addr().expect("local addr").port();
        held.push(listener);
        let bus = port
            .checked_add(BUS_OFFSET)
            .and_then(|bus| TcpListener::bind(("127.0.0.1", bus)).ok());
        if let Some(bus) = bus {
            held.push(bus);
            ports.push(port);
            if ports.len() == n {
                return ports;
            }
        }
    }
    panic!("no {n} free ports with their bus ports free too");
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            if let Some(mut child) = node.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
