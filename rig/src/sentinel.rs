//! Redis under Sentinel: a master, one replica and three sentinels (quorum
//! 2) on free loopback ports, set to fail over quickly (the master counts as
//! down after [`DOWN_AFTER`] without answers), all killed on drop.
//!
//! The sentinels run `redis-sentinel`, or `redis-server --sentinel` where
//! Debian's `redis-sentinel` package is not installed (it is the same
//! binary). Each writes its log in the group's directory ([`Sentinels::logs`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::error::{Error, io, state};
use crate::process::{self, PORT_ATTEMPTS, free_port, not_started, poll};
use crate::redis::{Redis, cli_on, until_own};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "herald";
/// Without an answer for this long, a sentinel takes the master for down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// Longest the group may take to settle (the replica in sync, every
/// sentinel knowing the others).
pub const SETTLE_WAIT: Duration = Duration::from_secs(10);

/// A master, its replica and the [`Sentinels`] watching them.
pub struct SentinelGroup {
    pub master: Redis,
    pub replica: Redis,
    pub sentinels: Sentinels,
}

/// Three sentinels watching one master; killed on drop.
pub struct Sentinels {
    sentinels: Vec<Sentinel>,
    dir: PathBuf,
}

/// One `redis-sentinel`; killed on drop.
struct Sentinel {
    port: u16,
    /// `None` once it exited (its port was taken) or was killed.
    child: Option<Child>,
}

impl SentinelGroup {
    /// Starts everything and waits until every sentinel knows the replica
    /// and the two other sentinels (so that a failover can start at once).
    pub async fn start() -> Result<Self, Error> {
        let master = Redis::start().await?;
        let master_port = master.port().to_string();
        let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &master_port]).await?;
        replica.synced(SETTLE_WAIT).await?;
        let sentinels = Sentinels::start(master.port()).await?;
        Ok(Self {
            master,
            replica,
            sentinels,
        })
    }
}

impl Sentinels {
    /// Three sentinels monitoring the master on `master_port` (and its one
    /// replica); waits until each knows the replica and the other two.
    pub async fn start(master_port: u16) -> Result<Self, Error> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "herald-sentinels-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).map_err(io(dir.display()))?;
        let mut group = Self {
            sentinels: Vec::new(),
            dir,
        };
        for i in 0..3 {
            let sentinel = Sentinel::start(&group.dir, i, master_port).await?;
            group.sentinels.push(sentinel);
        }
        let expected = master_port.to_string();
        poll(SETTLE_WAIT, || {
            for i in 0..group.sentinels.len() {
                let master = group.master(i).map_err(|e| e.to_string())?;
                let settled = master.get("port") == Some(&expected)
                    && master.get("num-slaves").map(String::as_str) == Some("1")
                    && master.get("num-other-sentinels").map(String::as_str) == Some("2");
                if !settled {
                    return Err(format!("sentinel {i} not settled yet: {master:?}"));
                }
            }
            Ok(())
        })
        .await
        .map_err(|e| state(format!("{e}\n{}", group.logs())))?;
        Ok(group)
    }

    /// `host:port` of each sentinel.
    pub fn addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// How many there are.
    pub fn len(&self) -> usize {
        self.sentinels.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sentinels.is_empty()
    }

    /// `redis-cli` against sentinel `i`; its output.
    pub fn cli(&self, i: usize, args: &[&str]) -> Result<String, Error> {
        let sentinel = self
            .sentinels
            .get(i)
            .ok_or_else(|| state(format!("no sentinel {i}")))?;
        cli_on(sentinel.port, None, args)
    }

    /// What sentinel `i` knows of the master (`SENTINEL MASTER`).
    pub fn master(&self, i: usize) -> Result<HashMap<String, String>, Error> {
        let out = self.cli(i, &["SENTINEL", "MASTER", MASTER_NAME])?;
        let lines: Vec<&str> = out.lines().collect();
        Ok(lines
            .chunks(2)
            .filter_map(|kv| Some((kv.first()?.to_string(), kv.get(1)?.to_string())))
            .collect())
    }

    /// Waits, at most `within`, until every sentinel names a master other
    /// than the node on `old`; its port.
    pub async fn wait_for_failover(&self, old: u16, within: Duration) -> Result<u16, Error> {
        let old = old.to_string();
        poll(within, || {
            let ports: Vec<Option<String>> = (0..self.sentinels.len())
                .map(|i| self.master(i).ok().and_then(|m| m.get("port").cloned()))
                .collect();
            match ports.first() {
                Some(Some(port))
                    if *port != old && ports.iter().all(|p| p.as_ref() == Some(port)) =>
                {
                    port.parse::<u16>().map_err(|e| e.to_string())
                }
                _ => Err(format!("the sentinels name {ports:?}")),
            }
        })
        .await
    }

    /// Every sentinel's log, for whoever looks into a failure.
    pub fn logs(&self) -> String {
        (0..self.sentinels.len())
            .map(|i| {
                let log = std::fs::read_to_string(self.dir.join(format!("sentinel-{i}.log")))
                    .unwrap_or_default();
                format!("--- sentinel {i} ---\n{log}")
            })
            .collect()
    }
}

impl Sentinel {
    /// Starts sentinel `i` on a free port, and waits until it is the one
    /// answering there: another test's process may take the port first, and
    /// a sentinel that could not bind would leave the group one short,
    /// never settling.
    async fn start(dir: &Path, i: usize, master_port: u16) -> Result<Self, Error> {
        let log = dir.join(format!("sentinel-{i}.log"));
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            let mut sentinel = Self {
                port,
                child: Some(Self::spawn(dir, i, port, master_port)?),
            };
            let info = || cli_on(port, None, &["INFO", "server"]);
            match until_own(&mut sentinel.child, "redis-sentinel", port, &log, info).await {
                Ok(()) => return Ok(sentinel),
                // The port was taken in the meantime: try another.
                Err(e @ Error::Exited { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(not_started(&format!("sentinel {i}"), last))
    }

    /// Starts sentinel `i` on `port` with a fresh config (a sentinel
    /// rewrites its own).
    fn spawn(dir: &Path, i: usize, port: u16, master_port: u16) -> Result<Child, Error> {
        let config = dir.join(format!("sentinel-{i}.conf"));
        let log = dir.join(format!("sentinel-{i}.log"));
        let down_after = DOWN_AFTER.as_millis();
        // The config is the sentinel's own to rewrite: one file each.
        std::fs::write(
            &config,
            format!(
                "port {port}\n\
                 bind 127.0.0.1\n\
                 protected-mode no\n\
                 dir {dir}\n\
                 logfile {log}\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} {down_after}\n\
                 sentinel failover-timeout {MASTER_NAME} 5000\n\
                 sentinel parallel-syncs {MASTER_NAME} 1\n",
                dir = dir.display(),
                log = log.display(),
            ),
        )
        .map_err(io(config.display()))?;
        let (program, mut command) = if has_redis_sentinel() {
            let mut c = process::command("redis-sentinel");
            c.arg(&config);
            ("redis-sentinel", c)
        } else {
            let mut c = process::command("redis-server");
            c.arg(&config).arg("--sentinel");
            ("redis-server --sentinel", c)
        };
        command.stdout(Stdio::null()).stderr(Stdio::null());
        process::spawn(command).map_err(|source| Error::Spawn {
            program: program.to_owned(),
            source,
        })
    }
}

fn has_redis_sentinel() -> bool {
    Command::new("redis-sentinel")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        // Killed before their directory goes (a sentinel rewrites its
        // config there).
        self.sentinels.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        process::kill(&mut self.child);
    }
}
