//! One `redis-server` of the cluster: started in a directory of its own on
//! a free port whose bus port is free too, ready once it is the one
//! answering there (moved to another port while that one turns out taken),
//! and asked with `redis-cli` (one argument per argv entry, bounded by
//! [`CLI_TIMEOUT`]).

use std::net::TcpListener;
use std::process::{Child, Stdio};

use super::{CLI_TIMEOUT, NODE_TIMEOUT, Node, RedisCluster};
use crate::error::{Error, state};
use crate::process::{self, PORT_ATTEMPTS, not_started, run};
use crate::redis::{cli_on, until_own};

/// The cluster bus listens on each node's port plus this.
const BUS_OFFSET: u16 = 10000;

impl RedisCluster {
    /// The process id of the live node on `port`.
    pub fn pid(&self, port: u16) -> Result<u32, Error> {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .and_then(|n| n.child.as_ref())
            .map(Child::id)
            .ok_or_else(|| state(format!("no live node on {port}")))
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

    /// Starts a node on `port`, in a directory of its own.
    pub(super) fn spawn(&mut self, port: u16) -> Result<Node, Error> {
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

    /// Waits until the node on `port` is the one answering there (`INFO
    /// server`'s `process_id`): until then another test's process may hold
    /// the port, taken between our look and the node's bind, and a `PING`
    /// would be answered by a server that is not ours. [`Error::Exited`] if
    /// the node exited first.
    pub(super) async fn wait_ready(&mut self, port: u16) -> Result<(), Error> {
        let Some(node) = self.nodes.iter_mut().find(|n| n.port == port) else {
            return Err(state(format!("no node on {port}")));
        };
        let log = node.dir.join("redis.log");
        until_own(
            &mut node.child,
            "redis-server (cluster node)",
            port,
            &log,
            || cli_on(port, None, &["INFO", "server"]),
        )
        .await
    }

    /// Waits until node `i` is ready ([`RedisCluster::wait_ready`]), moving
    /// it to another free port while the one it was given turns out taken.
    pub(super) async fn start_node(&mut self, i: usize) -> Result<(), Error> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let Some(port) = self.nodes.get(i).map(|n| n.port) else {
                return Err(state(format!("no node {i}")));
            };
            match self.wait_ready(port).await {
                Err(e @ Error::Exited { .. }) => last = Some(e),
                done => return done,
            }
            let Some(&port) = free_ports(1)?.first() else {
                return Err(state("no free port"));
            };
            let node = self.spawn(port)?;
            if let Some(slot) = self.nodes.get_mut(i) {
                *slot = node;
            }
        }
        Err(not_started("a cluster node", last))
    }
}

/// `n` distinct free loopback ports whose bus port (port + 10000) is free
/// too: each pair is held until all are found, so none repeats.
pub(super) fn free_ports(n: usize) -> Result<Vec<u16>, Error> {
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
