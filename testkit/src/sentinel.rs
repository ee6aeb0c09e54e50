//! Redis under Sentinel: a master, one replica and three sentinels (quorum
//! 2) on free loopback ports, set to fail over quickly (the master counts as
//! down after [`DOWN_AFTER`] without answers), all killed on drop: the
//! rig's ([`rig::sentinel`]), where an error is the test failing, and the
//! sentinels' logs are shown when a test fails.

use std::collections::HashMap;
use std::time::Duration;

use crate::Redis;

pub use rig::sentinel::{DOWN_AFTER, MASTER_NAME};

pub struct SentinelGroup {
    pub master: Redis,
    pub replica: Redis,
    sentinels: rig::sentinel::Sentinels,
}

/// A failed step is the test failing.
fn must<T>(done: Result<T, rig::Error>) -> T {
    done.unwrap_or_else(|e| panic!("sentinels: {e}"))
}

impl SentinelGroup {
    /// Starts everything and waits until every sentinel knows the replica
    /// and the two other sentinels (so that a failover can start at once).
    pub async fn start() -> Self {
        let group = must(rig::SentinelGroup::start().await);
        Self {
            master: Redis::from(group.master),
            replica: Redis::from(group.replica),
            sentinels: group.sentinels,
        }
    }

    /// `host:port` of each sentinel.
    pub fn addresses(&self) -> Vec<String> {
        self.sentinels.addresses()
    }

    /// `redis-cli` against sentinel `i`.
    pub fn sentinel_cli(&self, i: usize, args: &[&str]) -> String {
        must(self.sentinels.cli(i, args))
    }

    /// What sentinel `i` knows of the master (`SENTINEL MASTER`).
    pub fn sentinel_master(&self, i: usize) -> HashMap<String, String> {
        must(self.sentinels.master(i))
    }

    /// Waits, at most `within`, until every sentinel names a master other
    /// than the node on `old`; its port.
    pub async fn wait_for_failover(&self, old: u16, within: Duration) -> u16 {
        must(self.sentinels.wait_for_failover(old, within).await)
    }
}

impl Drop for SentinelGroup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.sentinels.logs());
        }
    }
}
