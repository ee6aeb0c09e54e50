//! Redis under Sentinel: a master, one replica and three sentinels (quorum
//! 2) on free loopback ports, set to fail over quickly (the master counts as
//! down after [`DOWN_AFTER`] without answers), all killed on drop.
//!
//! The sentinels run `redis-sentinel`, or `redis-server --sentinel` where
//! Debian's `redis-sentinel` package is not installed (it is the same
//! binary). Each writes its log in the group's directory, shown when a test
//! fails.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::eventually::eventually_every;
use crate::herald::free_port;
use crate::{Redis, WAIT, eventually};

/// Between two looks at the sentinels (each look runs `redis-cli` per sentinel).
const POLL: Duration = Duration::from_millis(100);

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "herald";
/// Without an answer for this long, a sentinel takes the master for down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);

pub struct SentinelGroup {
    pub master: Redis,
    pub replica: Redis,
    sentinels: Vec<Sentinel>,
    dir: PathBuf,
}

struct Sentinel {
    port: u16,
    child: Child,
}

impl SentinelGroup {
    /// Starts everything and waits until every sentinel knows the replica
    /// and the two other sentinels (so that a failover can start at once).
    pub async fn start() -> Self {
        let master = Redis::start().await;
        let master_port = master.port.to_string();
        let replica = Redis::start_with(&["--replicaof", "127.0.0.1", &master_port]).await;
        eventually(WAIT, || async {
            let info = replica.cli(&["INFO", "replication"]);
            info.contains("master_link_status:up")
                .then_some(())
                .ok_or(format!("the replica is not in sync yet:\n{info}"))
        })
        .await;

        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "herald-sentinels-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the sentinels' directory");
        let sentinels = (0..3)
            .map(|i| Sentinel::spawn(&dir, i, master.port))
            .collect();
        let group = Self {
            master,
            replica,
            sentinels,
            dir,
        };
        let expected = group.master.port.to_string();
        eventually_every(POLL, WAIT, || async {
            for i in 0..group.sentinels.len() {
                let master = group.sentinel_master(i);
                let settled = master.get("port") == Some(&expected)
                    && master.get("num-slaves").map(String::as_str) == Some("1")
                    && master.get("num-other-sentinels").map(String::as_str) == Some("2");
                if !settled {
                    return Err(format!("sentinel {i} not settled yet: {master:?}"));
                }
            }
            Ok(())
        })
        .await;
        group
    }

    /// `host:port` of each sentinel.
    pub fn addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect()
    }

    /// `redis-cli` against sentinel `i`.
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.sentinels[i].port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// What sentinel `i` knows of the master (`SENTINEL MASTER`).
    pub fn sentinel_master(&self, i: usize) -> HashMap<String, String> {
        let out = self.sentinel_cli(i, &["SENTINEL", "MASTER", MASTER_NAME]);
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter_map(|kv| Some((kv.first()?.to_string(), kv.get(1)?.to_string())))
            .collect()
    }

    /// Waits, at most `within`, until every sentinel names a master other
    /// than the node on `old`; its port.
    pub async fn wait_for_failover(&self, old: u16, within: Duration) -> u16 {
        let old = old.to_string();
        eventually_every(POLL, within, || async {
            let ports: Vec<Option<String>> = (0..self.sentinels.len())
                .map(|i| self.sentinel_master(i).get("port").cloned())
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

    fn logs(&self) -> String {
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
    fn spawn(dir: &std::path::Path, i: usize, master_port: u16) -> Self {
        let port = free_port();
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
        .expect("write a sentinel's config");
        let mut command = if has_redis_sentinel() {
            let mut c = crate::process::command("redis-sentinel");
            c.arg(&config);
            c
        } else {
            let mut c = crate::process::command("redis-server");
            c.arg(&config).arg("--sentinel");
            c
        };
        command.stdout(Stdio::null()).stderr(Stdio::null());
        let child = crate::process::spawn(command).expect(
            "redis-sentinel or redis-server --sentinel (scripts/test.sh installs redis-server)",
        );
        Self { port, child }
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

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        for sentinel in &mut self.sentinels {
            let _ = sentinel.child.kill();
            let _ = sentinel.child.wait();
        }
        if std::thread::panicking() {
            eprintln!("{}", self.logs());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
