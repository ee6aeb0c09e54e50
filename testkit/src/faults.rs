//! A real `redis-server` behind a network path the test controls: added
//! latency, packet loss, a partition, each changed while the path is in use.
//!
//! Two ways to build the path, picked when it starts:
//! - **netns**: the server runs in a network namespace of its own, reached
//!   over a veth pair whose two ends `tc netem` impairs; the kernel drops
//!   and delays real packets, and TCP copes as it would across a network.
//!   Needs root (or `CAP_NET_ADMIN`) and a kernel with `sch_netem`. Each
//!   path has its own namespace and veth pair (`herald-faults-<pid>-<n>`,
//!   a /30 in 100.64.0.0/10 picked at random), removed when it is dropped,
//!   also during a panic; those of test processes that died without
//!   unwinding are removed by the next path to start.
//! - **proxy**: the server on loopback behind a TCP proxy on a thread of
//!   the test process ([`rig::proxy`]): latency as delay, loss as a
//!   retransmission's delay, a partition as a link where nothing moves.
//!   Used when the namespace cannot be made.
//!
//! `HERALD_TEST_FAULTS=proxy` or `=netns` picks one instead.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use rand::Rng;
use rig::proxy::{Faults, Proxy};

use crate::{Redis, WAIT, eventually};

/// Picks the way a path is built: `netns`, `proxy`, or unset for netns
/// where it works and the proxy otherwise.
pub const MODE_VAR: &str = "HERALD_TEST_FAULTS";

/// Every namespace of ours starts with this, then `<pid>-<n>`.
const NETNS_PREFIX: &str = "herald-faults-";

/// The port the server listens on inside its namespace (it has the
/// namespace's ports to itself).
const NETNS_PORT: u16 = 6379;

/// Packets a netem queue holds: the default (1000) would drop packets of
/// its own under load with hundreds of milliseconds of delay.
const NETEM_LIMIT: &str = "100000";

/// Redis behind a path the test controls; the namespace or proxy and the
/// server go when it is dropped.
pub struct FaultyRedis {
    path: Path,
}

enum Path {
    Netns(Netns),
    Proxy { proxy: Proxy, redis: Redis },
}

impl FaultyRedis {
    /// Starts the server and its path, with no fault yet.
    pub async fn start() -> io::Result<Self> {
        let mode = std::env::var(MODE_VAR).unwrap_or_default();
        if mode != "proxy" {
            match Netns::start().await {
                Ok(netns) => {
                    return Ok(Self {
                        path: Path::Netns(netns),
                    });
                }
                Err(e) if mode == "netns" => return Err(e),
                // Not root, or no netem: the proxy does it.
                Err(_) => {}
            }
        }
        let redis = Redis::start().await;
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, redis.port));
        let listen = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
        let proxy = Proxy::start(listen, upstream, Faults::default())?;
        Ok(Self {
            path: Path::Proxy { proxy, redis },
        })
    }

    /// Where herald reaches the server, across the path.
    pub fn url(&self) -> String {
        match &self.path {
            Path::Netns(netns) => format!("redis://{}:{NETNS_PORT}", netns.server),
            Path::Proxy { proxy, .. } => format!("redis://{}", proxy.addr()),
        }
    }

    /// How the path is built: `"netns"` or `"proxy"`.
    pub fn kind(&self) -> &'static str {
        match &self.path {
            Path::Netns(_) => "netns",
            Path::Proxy { .. } => "proxy",
        }
    }

    /// Every round trip takes `round_trip` longer (half each way).
    pub fn delay(&self, round_trip: Duration) {
        self.change(|f| f.delay = round_trip);
    }

    /// Loses `percent` of the packets each way.
    pub fn loss(&self, percent: f64) {
        self.change(|f| f.loss = percent);
    }

    /// Nothing gets through, either way, until [`heal`](Self::heal);
    /// connections stay open.
    pub fn partition(&self) {
        self.change(|f| f.partitioned = true);
    }

    /// Ends the partition; the delay and loss set before stay.
    pub fn heal(&self) {
        self.change(|f| f.partitioned = false);
    }

    fn change(&self, change: impl FnOnce(&mut Faults)) {
        match &self.path {
            Path::Netns(netns) => netns
                .change(change)
                .unwrap_or_else(|e| panic!("tc netem: {e}")),
            Path::Proxy { proxy, .. } => proxy.update(change),
        }
    }

    /// Runs `redis-cli` against the server directly, past the path's
    /// faults; its output.
    pub fn cli(&self, args: &[&str]) -> String {
        match &self.path {
            Path::Netns(netns) => {
                let output = Command::new("ip")
                    .args(["netns", "exec", &netns.name, "redis-cli"])
                    .args(["-p", &NETNS_PORT.to_string()])
                    .args(args)
                    .output()
                    .expect("redis-cli in the namespace");
                String::from_utf8_lossy(&output.stdout).into_owned()
            }
            Path::Proxy { redis, .. } => redis.cli(args),
        }
    }
}

/// A namespace with the server in it, and the veth pair to it.
struct Netns {
    name: String,
    /// The pair's end on the host's side, and the one in the namespace.
    host_if: String,
    ns_if: String,
    /// The server's address, on the namespace's end.
    server: Ipv4Addr,
    redis: Option<Child>,
    faults: Mutex<Faults>,
}

impl Netns {
    async fn start() -> io::Result<Self> {
        remove_stale();
        // A veth name taken by another path: pick again.
        for _ in 0..5 {
            if let Some(mut netns) = Self::make()? {
                netns.spawn_redis().await?;
                return Ok(netns);
            }
        }
        Err(io::Error::other("no free veth name in 5 tries"))
    }

    /// The namespace and the link, unimpaired; `None` when the name picked
    /// is taken. The host's end of the pair is named after the /30 it
    /// carries, so that the kernel's refusal of a name in use also keeps
    /// two paths off one subnet.
    fn make() -> io::Result<Option<Self>> {
        let index: u32 = rand::thread_rng().gen_range(0..1 << 20);
        let name = format!("{NETNS_PREFIX}{}-{index:05x}", std::process::id());
        ip(&["netns", "add", &name])?;
        let mut netns = Self {
            name,
            host_if: String::new(),
            ns_if: format!("hf{index:05x}n"),
            server: Ipv4Addr::UNSPECIFIED,
            redis: None,
            faults: Mutex::new(Faults::default()),
        };
        let host_if = format!("hf{index:05x}h");
        if ip(&["link", "show", &host_if]).is_ok() {
            return Ok(None);
        }
        ip(&[
            "link",
            "add",
            &host_if,
            "type",
            "veth",
            "peer",
            "name",
            &netns.ns_if,
            "netns",
            &netns.name,
        ])?;
        netns.host_if = host_if;
        let base = u32::from(Ipv4Addr::new(100, 64, 0, 0)) + index * 4;
        let host = Ipv4Addr::from(base + 1);
        netns.server = Ipv4Addr::from(base + 2);
        ip(&["addr", "add", &format!("{host}/30"), "dev", &netns.host_if])?;
        ip(&["link", "set", &netns.host_if, "up"])?;
        let server = format!("{}/30", netns.server);
        ip(&[
            "-n",
            &netns.name,
            "addr",
            "add",
            &server,
            "dev",
            &netns.ns_if,
        ])?;
        ip(&["-n", &netns.name, "link", "set", &netns.ns_if, "up"])?;
        ip(&["-n", &netns.name, "link", "set", "lo", "up"])?;
        // Fails without netem: the caller falls back to the proxy.
        netns.change(|_| {})?;
        Ok(Some(netns))
    }

    async fn spawn_redis(&mut self) -> io::Result<()> {
        let mut command = crate::process::command("ip");
        command
            .args(["netns", "exec", &self.name, "redis-server"])
            .args(["--port", &NETNS_PORT.to_string()])
            .args(["--bind", &self.server.to_string(), "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = crate::process::spawn(command)?;
        self.redis = Some(child);
        // Across the link, as herald will reach it.
        let (host, port) = (self.server.to_string(), NETNS_PORT.to_string());
        eventually(WAIT, || async {
            let output = Command::new("redis-cli")
                .args(["-h", &host, "-p", &port, "PING"])
                .output()
                .map_err(|e| format!("redis-cli: {e}"))?;
            match String::from_utf8_lossy(&output.stdout).trim() {
                "PONG" => Ok(()),
                other => Err(format!("redis-server did not start: PING says {other:?}")),
            }
        })
        .await;
        Ok(())
    }

    /// Applies `change` to both ends of the link.
    fn change(&self, change: impl FnOnce(&mut Faults)) -> io::Result<()> {
        let mut faults = self.faults.lock().unwrap_or_else(PoisonError::into_inner);
        change(&mut faults);
        let netem = netem(&faults);
        let netem: Vec<&str> = netem.iter().map(String::as_str).collect();
        let qdisc = ["qdisc", "replace", "dev"];
        tc(&[&qdisc[..], &[&self.host_if, "root", "netem"], &netem].concat())?;
        tc(&[
            &["-n", &self.name],
            &qdisc[..],
            &[&self.ns_if, "root", "netem"],
            &netem,
        ]
        .concat())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut redis) = self.redis.take() {
            let _ = redis.kill();
            let _ = redis.wait();
        }
        if !self.host_if.is_empty() {
            let _ = ip(&["link", "del", &self.host_if]);
        }
        let _ = ip(&["netns", "del", &self.name]);
    }
}

/// netem's arguments for `faults`, for one direction.
fn netem(faults: &Faults) -> Vec<String> {
    let loss = if faults.partitioned {
        100.0
    } else {
        faults.loss
    };
    let one_way = faults.delay / 2;
    vec![
        "limit".into(),
        NETEM_LIMIT.into(),
        "delay".into(),
        format!("{}us", one_way.as_micros()),
        "loss".into(),
        format!("{loss}%"),
    ]
}

/// Removes the namespaces of test processes that are gone (killed before
/// they could unwind), and their servers.
fn remove_stale() {
    let Ok(list) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(NETNS_PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if std::path::Path::new("/proc").join(pid).exists() {
            continue;
        }
        if let Ok(pids) = Command::new("ip").args(["netns", "pids", name]).output() {
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
        }
        let _ = ip(&["netns", "del", name]);
    }
}

fn ip(args: &[&str]) -> io::Result<()> {
    run("ip", args)
}

fn tc(args: &[&str]) -> io::Result<()> {
    run("tc", args)
}

fn run(program: &str, args: &[&str]) -> io::Result<()> {
    let output = Command::new(program).args(args).output()?;
    if output.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr).trim()
    )))
}
