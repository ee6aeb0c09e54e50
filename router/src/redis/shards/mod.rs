//! Where a key lives: on the one Redis (or the master Sentinel names), or
//! in a Redis Cluster on the master of its hash slot.
//!
//! - [`Shards`] keeps a command connection ([`Commands`]) per master and the
//!   cluster's slot map, read with `CLUSTER SLOTS` from any node it knows
//!   (the configured seeds first known, then every master seen).
//! - [`Shards::script`] and [`Shards::command`] run one call where its key
//!   lives and follow the cluster when it moves: `MOVED` sends the call to
//!   the node it names (a map read at once may still name the old master,
//!   mid-failover) and reads the map again, `ASK` (a slot being migrated) sends the call to
//!   the slot's new node after `ASKING`, `TRYAGAIN` (a migration between two
//!   of the call's keys), `CLUSTERDOWN` and a lost connection (a failover
//!   under way) wait a moment, read the map again and retry, within
//!   [`ATTEMPTS`].
//! - Pipelines over many keys are sent per master ([`Shards::by_node`]);
//!   their callers send what came back redirected again through
//!   [`Shards::script`].
//!
//! Beside [`Shards`] (the connections, the map it holds, a call's way
//! through the cluster): the slot map as `CLUSTER SLOTS` tells it
//! ([`map`]), what a failed call asks for ([`redirect`]), and a call sent
//! alone or many in a pipeline ([`call`]).

mod call;
mod map;
mod redirect;

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, RwLock};
use std::time::Duration;

use backoff::Backoff;
use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, Script, ScriptInvocation, Value,
};
use tokio::time::Instant;

use super::connection::{Commands, Connector};
use super::slots;
pub use call::Call;
use call::{pipelined, run_command, run_script};
use map::Map;
use redirect::Redirect;

/// Tries of one call (the first and the retries) before its error is the
/// answer, whatever the redirects: a bound on a cluster that sends a call in
/// circles.
const ATTEMPTS: u32 = 16;
/// The waits before a retry that waits (`TRYAGAIN`, `CLUSTERDOWN`, a lost
/// connection): up to 25 ms, doubling up to 800 ms, at random.
const RETRY_BACKOFF: Backoff = Backoff::new(Duration::from_millis(25), Duration::from_millis(800));
/// How long one call keeps waiting for the cluster before its error is the
/// answer: a failover's few seconds. A time rather than a count of waits,
/// since jittered waits may all come out short.
const WAIT_BUDGET: Duration = Duration::from_secs(4);

/// See the module's docs.
#[derive(Clone)]
pub struct Shards {
    inner: Arc<Inner>,
}

enum Inner {
    One(Commands),
    Cluster(Cluster),
}

struct Cluster {
    /// How any node is reached: the URL's user, password and TLS.
    connector: Connector,
    seeds: Vec<(String, u16)>,
    map: RwLock<Arc<Map>>,
    /// A command connection per node, made when first needed.
    nodes: Mutex<HashMap<String, Commands>>,
    /// One reading of the map at a time; the others wait for it.
    refreshing: tokio::sync::Mutex<()>,
}

impl Shards {
    /// One Redis (or Sentinel's master), over `commands`.
    pub fn one(commands: Commands) -> Self {
        Self {
            inner: Arc::new(Inner::One(commands)),
        }
    }

    /// A Redis Cluster, found from `seeds` (`host:port`); reads the slot map
    /// once now. What failed is returned beside it: the map is read again
    /// when a call needs it, so that a pod can start while the cluster is away.
    pub async fn cluster(
        connector: Connector,
        seeds: Vec<(String, u16)>,
    ) -> (Self, Option<RedisError>) {
        let shards = Self {
            inner: Arc::new(Inner::Cluster(Cluster {
                connector,
                seeds,
                map: RwLock::new(Arc::new(Map::empty())),
                nodes: Mutex::new(HashMap::new()),
                refreshing: tokio::sync::Mutex::new(()),
            })),
        };
        let failed = shards.refresh().await.err();
        (shards, failed)
    }

    /// The same Redis (or cluster) over connections of its own, made when
    /// a call first needs them: for large reads (a replay's pages), so that
    /// the calls on this one never queue behind them on a connection. In a
    /// cluster it starts from this one's slot map and follows the cluster
    /// by itself from there.
    pub fn apart(&self) -> Self {
        let inner = match &*self.inner {
            Inner::One(commands) => Inner::One(commands.apart()),
            Inner::Cluster(cluster) => Inner::Cluster(Cluster {
                connector: cluster.connector.clone(),
                seeds: cluster.seeds.clone(),
                map: RwLock::new(cluster.map()),
                nodes: Mutex::new(HashMap::new()),
                refreshing: tokio::sync::Mutex::new(()),
            }),
        };
        Self {
            inner: Arc::new(inner),
        }
    }

    /// Whether this is a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(*self.inner, Inner::Cluster(_))
    }

    /// The slot map (of a single Redis: one with no masters).
    pub fn map(&self) -> Arc<Map> {
        /// A single Redis's, made once (it is asked for on every tick).
        static NONE: LazyLock<Arc<Map>> = LazyLock::new(|| Arc::new(Map::empty()));
        match &*self.inner {
            Inner::One(_) => NONE.clone(),
            Inner::Cluster(cluster) => cluster.map(),
        }
    }

    /// A connector to the cluster's node at `host:port` (`None` for a single
    /// Redis, or an address that is not `host:port`).
    pub fn connector(&self, address: &str) -> Option<Connector> {
        match &*self.inner {
            Inner::One(_) => None,
            Inner::Cluster(cluster) => {
                let (host, port) = split_address(address)?;
                cluster.connector.node(host, port).ok()
            }
        }
    }

    /// Reads the cluster's slot map again (nothing for a single Redis): from
    /// the masters it knows, then the seeds, the first that answers.
    pub async fn refresh(&self) -> RedisResult<()> {
        let Inner::Cluster(cluster) = &*self.inner else {
            return Ok(());
        };
        let seen = cluster.map().version;
        let _one_at_a_time = cluster.refreshing.lock().await;
        if cluster.map().version != seen {
            // Another call read it meanwhile.
            return Ok(());
        }
        let known = cluster.map().masters.clone();
        let seeds = cluster.seeds.iter().map(|(h, p)| format!("{h}:{p}"));
        let mut last_error = None;
        for address in known.into_iter().chain(seeds) {
            let reply = match cluster.node(&address) {
                Ok(mut conn) => {
                    redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query_async::<Value>(&mut conn)
                        .await
                }
                Err(e) => Err(e),
            };
            match reply {
                Ok(reply) => {
                    let Some(map) = Map::parse(&reply, seen + 1) else {
                        last_error = Some(unexpected("an unreadable CLUSTER SLOTS reply"));
                        continue;
                    };
                    if map.masters.is_empty() {
                        last_error = Some(unexpected("the cluster has no slots assigned"));
                        continue;
                    }
                    cluster.set_map(map);
                    return Ok(());
                }
                Err(e) => last_error = Some(e),
            }
        }
        Err(last_error.unwrap_or_else(|| unexpected("no cluster node is known")))
    }

    /// Runs `invocation` of `script` where `key` lives (see the module's
    /// docs for how it follows the cluster).
    pub async fn script<T: FromRedisValue>(
        &self,
        key: &str,
        script: &Script,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        self.script_at(slots::slot(key.as_bytes()), script, invocation)
            .await
    }

    /// [`Shards::script`] for a call whose keys are in `slot`.
    async fn script_at<T: FromRedisValue>(
        &self,
        slot: u16,
        script: &Script,
        invocation: &ScriptInvocation<'_>,
    ) -> RedisResult<T> {
        let mut attempt = Attempt::new(slot);
        loop {
            let result = match self.connection(&mut attempt) {
                Ok((mut conn, asking)) => run_script(&mut conn, script, invocation, asking).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if self.again(&mut attempt, &e).await => {}
                done => return done,
            }
        }
    }

    /// Runs `cmd` where `key` lives, as [`Shards::script`] does.
    pub async fn command<T: FromRedisValue>(&self, key: &str, cmd: &Cmd) -> RedisResult<T> {
        let mut attempt = Attempt::new(slots::slot(key.as_bytes()));
        loop {
            let result = match self.connection(&mut attempt) {
                Ok((mut conn, asking)) => run_command(&mut conn, cmd, asking).await,
                Err(e) => Err(e),
            };
            match result {
                Err(e) if self.again(&mut attempt, &e).await => {}
                done => return done,
            }
        }
    }

    /// The connection for the attempt's next try, and whether it follows an
    /// `ASK`.
    fn connection(&self, attempt: &mut Attempt) -> RedisResult<(Commands, bool)> {
        let cluster = match &*self.inner {
            Inner::One(commands) => return Ok((commands.clone(), false)),
            Inner::Cluster(cluster) => cluster,
        };
        if let Some(address) = attempt.asked.take() {
            return Ok((cluster.node(&address)?, true));
        }
        // Where `MOVED` said, even if the map read since still names the
        // old master: during a failover the nodes that answer `CLUSTER
        // SLOTS` may lag the one that redirected.
        if let Some(address) = attempt.moved.take() {
            return Ok((cluster.node(&address)?, false));
        }
        let map = cluster.map();
        let master = map
            .master(attempt.slot)
            .ok_or_else(|| unexpected("no master serves the slot"))?;
        Ok((cluster.node(master)?, false))
    }

    /// Whether to try again after `e`, having done what it asks for (read
    /// the map, wait a moment), within [`ATTEMPTS`] and [`WAIT_BUDGET`].
    async fn again(&self, attempt: &mut Attempt, e: &RedisError) -> bool {
        if !self.is_cluster() || attempt.tries >= ATTEMPTS {
            return false;
        }
        attempt.tries += 1;
        match Redirect::of(e) {
            Some(Redirect::Moved(address)) => {
                self.refresh_quietly().await;
                attempt.moved = Some(address);
            }
            Some(Redirect::Ask(address)) => attempt.asked = Some(address),
            Some(Redirect::Wait) => {
                let waiting_since = *attempt.waiting_since.get_or_insert_with(Instant::now);
                if waiting_since.elapsed() >= WAIT_BUDGET {
                    return false;
                }
                tokio::time::sleep(RETRY_BACKOFF.delay(attempt.waits)).await;
                attempt.waits += 1;
                self.refresh_quietly().await;
            }
            None => return false,
        }
        true
    }

    async fn refresh_quietly(&self) {
        if let Err(e) = self.refresh().await {
            tracing::debug!(error = %e, "reading the cluster's slot map failed");
        }
    }

    /// Runs many script calls, each given with the slot of its keys: in
    /// one pipeline per master, all at once; in a cluster, a call that came
    /// back redirected (or whose master could not be reached) is run again
    /// alone, following the cluster, in the calls' order. A reply per call,
    /// in order; a call's own error (a script error) is its reply.
    pub async fn scripts(&self, calls: &[Call<'_>]) -> Vec<RedisResult<Value>> {
        let sent = self.send(calls).await;
        self.follow(calls, sent).await
    }

    /// The first half of [`Shards::scripts`]: the pipelines, a reply per
    /// call as they came back (redirects included).
    pub async fn send(&self, calls: &[Call<'_>]) -> Vec<RedisResult<Value>> {
        let groups = self.by_node(calls.iter().enumerate().map(|(i, call)| (call.slot, i)));
        let sent = groups.into_iter().map(|(conn, indices)| async move {
            let replies = match conn {
                Some(mut conn) => pipelined(&mut conn, &indices, calls).await,
                None => Err(unexpected("no master serves the slot")),
            };
            (indices, replies)
        });
        let mut replies: Vec<RedisResult<Value>> = (0..calls.len())
            .map(|_| Err(unexpected("a call went unanswered")))
            .collect();
        for (indices, group) in futures_util::future::join_all(sent).await {
            match group {
                Ok(values) => {
                    for (i, value) in indices.into_iter().zip(values) {
                        replies[i] = Ok(value);
                    }
                }
                Err(e) => {
                    for i in indices {
                        replies[i] = Err(e.clone());
                    }
                }
            }
        }
        replies
    }

    /// The second half of [`Shards::scripts`]: in a cluster, each call that
    /// came back redirected (or whose master could not be reached) is run
    /// again alone, following the cluster, in the calls' order.
    pub async fn follow(
        &self,
        calls: &[Call<'_>],
        replies: Vec<RedisResult<Value>>,
    ) -> Vec<RedisResult<Value>> {
        if !self.is_cluster() {
            return replies;
        }
        let mut answers = Vec::with_capacity(calls.len());
        for (call, reply) in calls.iter().zip(replies) {
            let again = match &reply {
                Ok(value) => Redirect::of_reply(value).is_some(),
                Err(e) => Redirect::of(e).is_some(),
            };
            answers.push(if again {
                // A script's error is a reply like any other.
                self.script_at(call.slot, call.script, &call.invocation)
                    .await
                    .or_else(|e| redis::ServerError::try_from(e).map(Value::ServerError))
            } else {
                reply
            });
        }
        answers
    }

    /// Groups `items` by the master of each one's slot, keeping their order
    /// within a group; the connection of each group (`None`: no master
    /// known for those slots now).
    pub fn by_node<T>(
        &self,
        items: impl IntoIterator<Item = (u16, T)>,
    ) -> Vec<(Option<Commands>, Vec<T>)> {
        let cluster = match &*self.inner {
            Inner::One(commands) => {
                let items: Vec<T> = items.into_iter().map(|(_, item)| item).collect();
                return vec![(Some(commands.clone()), items)];
            }
            Inner::Cluster(cluster) => cluster,
        };
        let map = cluster.map();
        let mut groups: Vec<(Option<&str>, Vec<T>)> = Vec::new();
        for (slot, item) in items {
            let master = map.master(slot);
            match groups.iter_mut().find(|(m, _)| *m == master) {
                Some((_, group)) => group.push(item),
                None => groups.push((master, vec![item])),
            }
        }
        groups
            .into_iter()
            .map(|(master, items)| (master.and_then(|m| cluster.node(m).ok()), items))
            .collect()
    }
}

impl Cluster {
    fn map(&self) -> Arc<Map> {
        self.map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set_map(&self, map: Map) {
        let mut current = self.map.write().unwrap_or_else(PoisonError::into_inner);
        if current.same_owners(&map) && current.masters.len() == map.masters.len() {
            return;
        }
        tracing::info!(
            masters = ?map.masters,
            "redis cluster: slot map read"
        );
        *current = Arc::new(map);
    }

    /// The command connection to `address` (`host:port`).
    fn node(&self, address: &str) -> RedisResult<Commands> {
        let mut nodes = self.nodes.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(commands) = nodes.get(address) {
            return Ok(commands.clone());
        }
        let (host, port) = split_address(address)
            .ok_or_else(|| unexpected("a node address that is not host:port"))?;
        let commands = Commands::lazy(self.connector.node(host, port)?);
        nodes.insert(address.to_owned(), commands.clone());
        Ok(commands)
    }
}

/// One call's way through the cluster so far.
struct Attempt {
    slot: u16,
    /// Where an `ASK` sent it.
    asked: Option<String>,
    /// Where a `MOVED` sent it, for its next try only.
    moved: Option<String>,
    /// Since when it has been waiting for the cluster (its first wait).
    waiting_since: Option<Instant>,
    /// Waits so far: the next one's attempt number for [`RETRY_BACKOFF`].
    waits: u32,
    tries: u32,
}

impl Attempt {
    fn new(slot: u16) -> Self {
        Self {
            slot,
            asked: None,
            moved: None,
            waiting_since: None,
            waits: 0,
            tries: 1,
        }
    }
}

fn split_address(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    Some((host, port.parse().ok()?))
}

fn unexpected(what: &'static str) -> RedisError {
    RedisError::from((ErrorKind::Io, what))
}
