//! A Redis Cluster of six `redis-server`s on free loopback ports: three
//! masters with a replica each, set to fail over quickly (a node counts as
//! down after [`NODE_TIMEOUT`]), all killed on drop. A test can kill a
//! master and wait for its replica to take over, or move a slot (in one go,
//! or in two halves to act mid-migration).
//!
//! The harness itself is the rig's ([`rig::cluster`]), which `chaos
//! --redis cluster` breaks too; here an error it reports is the test
//! failing, and the nodes' logs are shown when a test fails. The cluster's
//! directory is a scratch one, removed on drop.

use std::time::Duration;

use rig::cluster;

pub use rig::cluster::NODE_TIMEOUT;

pub struct RedisCluster {
    inner: cluster::RedisCluster,
}

/// A failed step is the test failing.
fn must<T>(done: Result<T, rig::Error>) -> T {
    done.unwrap_or_else(|e| panic!("redis cluster: {e}"))
}

impl RedisCluster {
    /// Starts six nodes, makes the cluster, and waits (at most 30 s)
    /// until every node says `cluster_state:ok`, all see the same masters,
    /// replicas and slots, and every replica is in sync.
    pub async fn start() -> Self {
        let dir = cluster::scratch_dir("herald-redis-cluster");
        Self {
            inner: must(cluster::RedisCluster::start(dir, true).await),
        }
    }

    /// Every node's port, killed ones included, ascending.
    pub fn ports(&self) -> Vec<u16> {
        self.inner.ports()
    }

    /// `redis://127.0.0.1:<port>` of every node: a gateway's seeds.
    pub fn urls(&self) -> Vec<String> {
        self.inner.urls()
    }

    /// The ports of the masters, as the first live node sees them.
    pub fn masters(&self) -> Vec<u16> {
        must(self.inner.masters())
    }

    /// Ports of the replicas of the master on `port`.
    pub fn replicas_of(&self, port: u16) -> Vec<u16> {
        must(self.inner.replicas_of(port))
    }

    /// Stops the node on `port` where it stands (SIGSTOP): a replica frozen
    /// so misses what its master writes meanwhile.
    pub fn freeze(&mut self, port: u16) {
        must(self.inner.freeze(port));
    }

    /// Lets a [`RedisCluster::freeze`]d node go on (SIGCONT).
    pub fn thaw(&mut self, port: u16) {
        must(self.inner.thaw(port));
    }

    /// The port of the master of `slot`, as the first live node sees it.
    pub fn master_of_slot(&self, slot: u16) -> u16 {
        must(self.inner.master_of_slot(slot))
    }

    /// The slot of `key` (CRC16/XMODEM mod 16384 of the key, or of its
    /// first non-empty `{hash tag}`): what `CLUSTER KEYSLOT` says, without
    /// asking.
    pub fn slot_of(key: &str) -> u16 {
        cluster::RedisCluster::slot_of(key)
    }

    /// Runs `redis-cli` (without `-c`: redirections come back as answers)
    /// against the node on `port`; its output.
    pub fn cli(&self, port: u16, args: &[&str]) -> String {
        must(self.inner.cli(port, args))
    }

    /// Waits (at most 10 s) until every replica of the master on `port`
    /// has all the master wrote.
    pub async fn replicated(&self, port: u16) {
        must(self.inner.replicated(port, Duration::from_secs(10)).await);
    }

    /// Kills the master on `port` (SIGKILL: whatever its replica did not get
    /// is lost), remembering its slots and replicas for
    /// [`RedisCluster::wait_for_failover`].
    pub fn kill_master(&mut self, port: u16) {
        must(self.inner.kill_master(port));
    }

    /// Waits, at most `within`, until one of the former replicas of the
    /// master killed on `old` holds all its slots and every surviving node
    /// says `cluster_state:ok` and sees the same cluster; the new master.
    pub async fn wait_for_failover(&self, old: u16, within: Duration) -> u16 {
        must(self.inner.wait_for_failover(old, within).await)
    }

    /// Moves `slot` with all its keys to the master on `to`, as
    /// `redis-cli --cluster reshard` does, and waits until every node agrees.
    pub async fn migrate_slot(&self, slot: u16, to: u16) {
        must(self.inner.migrate_slot(slot, to).await);
    }

    /// The first half of a migration: `to` imports `slot`, its master
    /// migrates it, and the keys there now move. The slot stays with its
    /// master (which answers `ASK` for keys it no longer has) until
    /// [`RedisCluster::finish_migration`].
    pub fn begin_migration(&self, slot: u16, to: u16) {
        must(self.inner.begin_migration(slot, to));
    }

    /// The second half: the keys left move, then `to` owns `slot`; waits
    /// until every node sees it so.
    pub async fn finish_migration(&self, slot: u16, to: u16) {
        must(self.inner.finish_migration(slot, to).await);
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("{}", self.inner.logs());
        }
    }
}
