//! The Redis engine: topics, seqs, history and sessions shared by every pod,
//! on one Redis (or Sentinel's master) or a Redis Cluster.
//!
//! - A publish is one item of a Lua script ([`scripts::PUBLISH`]): next seq,
//!   history append and trim, announcement on the topic's channel,
//!   idempotency key. Seq order is therefore the order every pod delivers
//!   in. Publishes are batched and pipelined ([`publisher`]): many per
//!   script call, many calls per round trip.
//! - Each pod keeps a pub/sub connection per Redis master ([`pubsub`]): it
//!   subscribes to a topic's channel while the pod has subscribers (sharded,
//!   at the topic's master, in a cluster), delivers in seq order, fills gaps
//!   from history and tells subscribers (`reset`) where it cannot.
//! - Commands go to the master of their key's slot ([`shards`]) over one
//!   multiplexed connection per master (pipelined, with timeouts,
//!   reconnecting by itself, to the current master with Sentinel:
//!   [`connection`]), following the cluster's redirects and failovers;
//!   session saves are batched ([`sessions`]).
//! - Every key and channel starts with the deployment's prefix
//!   ([`scripts::Keys`]), so that deployments can share a Redis; a topic's
//!   keys share its hash slot.
//! - A pod starts while Redis is away: not ready, saying why ([`reach`]),
//!   until its pub/sub connection first comes up.

mod connection;
mod lineage;
mod pages;
mod publisher;
mod pubsub;
mod reach;
mod scripts;
mod sessions;
mod shards;
pub mod slots;

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use connection::{Commands, Connector};
pub use connection::{InvalidSetting, SentinelSettings, TlsFiles};
pub use scripts::DEFAULT_PREFIX;
use scripts::Keys;
use shards::Shards;

use crate::observe::Observer;
use crate::page::{Page, PageSize};
use crate::session::unix_ms;
use crate::{
    Broker, BrokerError, BrokerStatus, Claim, Claimed, Deliver, Epoch, Namespaces, Outgoing,
    Position, Publication, Recovery, SessionSave, SessionSnapshot, SessionStore, Since, Stored,
    Topic,
};
use lineage::Lineage;
use pages::{bound, page_of};
use reach::Reach;

/// How much longer than the command timeout a publish waits for the
/// publisher: a pipeline that times out says so itself (and its connection
/// is replaced) before its publishes give up on it.
const ANSWER_GRACE: Duration = Duration::from_millis(100);

/// How long a topic's seq and epoch outlive its last publish. Longer than any
/// sensible history age: losing them starts a new epoch, which subscribers
/// are told about.
const META_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// How to reach Redis and how patient to be with it.
#[derive(Clone)]
pub struct RedisSettings {
    /// `redis://[user[:password]@]host:port/db`, or `rediss://` for TLS. With
    /// Sentinel, the host and port are not used.
    pub url: String,
    /// Replaces the URL's password (so that it can come from a Secret).
    pub password: Option<String>,
    /// For `rediss://`: the CA, and a client certificate for mTLS.
    pub tls: TlsFiles,
    /// Where to ask for the master, if Redis runs under Sentinel.
    pub sentinel: Option<SentinelSettings>,
    /// Redis Cluster: some of its nodes (`redis://host:port` URLs; the
    /// rest are found from them). Empty: not a cluster. The user, password
    /// and TLS of `url` apply to every node.
    pub cluster: Vec<String>,
    /// Longest a command (or a connection attempt) may take before it fails.
    pub command_timeout: Duration,
    /// How long a pod stays subscribed to a topic after its last local
    /// subscriber left, so that a quick resubscribe costs nothing.
    pub linger: Duration,
    /// What every key and channel starts with ([`scripts::check_prefix`]):
    /// deployments sharing a Redis are isolated by theirs.
    pub prefix: String,
}

/// The Redis [`Broker`] and [`SessionStore`].
#[derive(Clone)]
pub struct RedisBroker {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Shards,
    /// The same Redis over connections of their own, for replays' reads
    /// (a `recover` with `since`, and [`Broker::history`]): a page is up to
    /// a few hundred KiB, and publishes, claims and saves on `shards` never
    /// wait behind one.
    replay_shards: Shards,
    namespaces: Arc<Namespaces>,
    watches: mpsc::UnboundedSender<pubsub::Command>,
    saves: mpsc::Sender<sessions::Save>,
    publishes: mpsc::Sender<publisher::Pending>,
    observer: Arc<dyn Observer>,
    lineage: Arc<Lineage>,
    command_timeout: Duration,
    redis_clock: sessions::RedisClock,
    keys: Keys,
    /// Whether Redis was reached since the start.
    reach: Arc<Reach>,
}

impl RedisSettings {
    /// Checks what can be checked before connecting: the URL, the
    /// certificate files, the sentinels' addresses.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        scripts::check_prefix(&self.prefix).map_err(|reason| InvalidSetting {
            key: "redis.prefix",
            reason,
        })?;
        if !self.cluster.is_empty() {
            if self.sentinel.is_some() {
                return Err(InvalidSetting {
                    key: "redis.cluster",
                    reason: "cannot be used with `redis.sentinel`: a cluster fails over by itself"
                        .into(),
                });
            }
            connection::seeds(&self.cluster).map_err(|reason| InvalidSetting {
                key: "redis.cluster",
                reason,
            })?;
        }
        let connector = self.connector()?;
        if !self.cluster.is_empty() && !connector.first_database() {
            return Err(InvalidSetting {
                key: "redis.url",
                reason: "a Redis Cluster has only database 0".into(),
            });
        }
        Ok(())
    }

    fn connector(&self) -> Result<Connector, InvalidSetting> {
        Connector::new(
            &self.url,
            self.password.as_deref(),
            &self.tls,
            self.sentinel.as_ref(),
            self.command_timeout,
        )
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("tls", &self.tls)
            .field("sentinel", &self.sentinel)
            .field("cluster", &redact_urls(&self.cluster))
            .field("command_timeout", &self.command_timeout)
            .field("linger", &self.linger)
            .field("prefix", &self.prefix)
            .finish()
    }
}

/// [`redact_url`] of each.
pub fn redact_urls(urls: &[String]) -> Vec<String> {
    urls.iter().map(|url| redact_url(url)).collect()
}

/// The URL without the password it may hold (`redis://user:<redacted>@host`).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split_once(':').map_or("", |(user, _)| user);
            format!("{scheme}://{user}:<redacted>@{host}")
        }
        _ => url.to_owned(),
    }
}

impl RedisBroker {
    /// Starts the pub/sub and session-writer tasks (which end when the broker
    /// is dropped) and waits for a first connection, bounded by the command
    /// timeout. Only a Redis that refuses the pod's credentials fails the
    /// start: while Redis cannot be reached the broker keeps trying (about
    /// once a second), [`Broker::status`] says why it is not ready, and every
    /// call fails at once with [`BrokerError::Unavailable`].
    pub async fn start(
        settings: RedisSettings,
        namespaces: Arc<Namespaces>,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, BrokerError> {
        let client = settings
            .connector()
            .map_err(|e| BrokerError::Unavailable(format!("redis: `{}`: {e}", e.key)))?;
        let (target, shards, failed) = if settings.cluster.is_empty() {
            let (conn, failed) = Commands::start(client.clone()).await;
            (client.describe(), Shards::one(conn), failed)
        } else {
            let seeds = connection::seeds(&settings.cluster)
                .map_err(|e| BrokerError::Unavailable(format!("redis: `redis.cluster`: {e}")))?;
            let target = format!(
                "the redis cluster at {}",
                redact_urls(&settings.cluster).join(", ")
            );
            let (shards, failed) = Shards::cluster(client.clone(), seeds).await;
            (target, shards, failed)
        };
        if let Some(e) = &failed {
            let why = format!("redis: connecting to {target}: {e}");
            if connection::refused(e) {
                return Err(BrokerError::Unavailable(why));
            }
            tracing::warn!("{why}; not ready until it answers");
        }
        let reach = Reach::new(target);
        let command_timeout = settings.command_timeout;
        let keys = Keys::new(&settings.prefix, shards.is_cluster());
        let (watches, commands) = mpsc::unbounded_channel();
        let (saves, pending_saves) = mpsc::channel(sessions::QUEUE);
        let (publishes, pending_publishes) = mpsc::channel(publisher::QUEUE);
        let lineage = Arc::new(Lineage::new(observer.clone(), shards.is_cluster()));
        tokio::spawn(pubsub::run(
            pubsub::Pubsub::new(
                client,
                shards.clone(),
                sink,
                observer.clone(),
                lineage.clone(),
                namespaces.clone(),
                settings,
                reach.clone(),
            ),
            commands,
        ));
        tokio::spawn(sessions::write(
            shards.clone(),
            pending_saves,
            observer.clone(),
        ));
        tokio::spawn(
            publisher::Publisher {
                shards: shards.clone(),
                keys: keys.clone(),
                lineage: lineage.clone(),
                observer: observer.clone(),
            }
            .run(pending_publishes),
        );
        if failed.is_none() {
            // Reachable a moment ago: ready as soon as pub/sub is, so that a
            // pod whose Redis is there starts ready, as before.
            let _ = tokio::time::timeout(command_timeout * 2, reach.first_attempt()).await;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                replay_shards: shards.apart(),
                shards,
                namespaces,
                watches,
                saves,
                publishes,
                observer,
                lineage,
                command_timeout,
                redis_clock: sessions::RedisClock::default(),
                keys,
                reach,
            }),
        })
    }
}

fn unavailable(e: redis::RedisError) -> BrokerError {
    BrokerError::Unavailable(format!("redis: {e}"))
}

/// A fresh random epoch: 64 bits, hex.
fn new_epoch() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn millis(d: Duration) -> u64 {
    d.as_millis().min(u64::MAX as u128) as u64
}

/// Runs one Redis call, reporting its time and outcome.
async fn timed<T>(
    observer: &dyn Observer,
    op: &'static str,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> Result<T, BrokerError> {
    timed_raw(observer, op, call).await.map_err(unavailable)
}

/// [`timed`], keeping Redis's error: for a caller that decides by its kind.
async fn timed_raw<T>(
    observer: &dyn Observer,
    op: &'static str,
    call: impl Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    let start = Instant::now();
    let result = call.await;
    observer.redis_call(op, start.elapsed().as_secs_f64(), result.is_ok());
    result
}

/// Runs many calls at once ([`Shards::scripts`]), reporting their time, and
/// an error if any of them failed.
async fn timed_each(
    observer: &dyn Observer,
    op: &'static str,
    calls: impl Future<Output = Vec<redis::RedisResult<Value>>>,
) -> Vec<redis::RedisResult<Value>> {
    let start = Instant::now();
    let replies = calls.await;
    observer.redis_call(op, start.elapsed().as_secs_f64(), all_ok(&replies));
    replies
}

/// Whether every call succeeded: no error, and no error reply.
fn all_ok(replies: &[redis::RedisResult<Value>]) -> bool {
    replies
        .iter()
        .all(|r| matches!(r, Ok(value) if !matches!(value, Value::ServerError(_))))
}

/// What [`scripts::RECOVER`] answered.
pub(crate) struct Recovered {
    position: Position,
    now_ms: u64,
    /// The lineage clock when it was read: what was announced up to here
    /// is covered by `position`.
    clock: u64,
    /// With each one's publish time (ms); `None` when the script did not
    /// read history.
    entries: Option<Vec<(Publication, u64)>>,
    /// For a `since` of another epoch: the seq the current epoch began
    /// after, `entries` being its history from there.
    base: Option<u64>,
}

impl Recovered {
    /// For a `since` of an epoch left behind: the stream starts again where
    /// the current epoch began, with all of it from history, if Redis still
    /// has it all; else at the topic's seq.
    fn restart_at_epoch_start(self, ttl: Duration) -> Recovery {
        let position = self.position;
        match (self.base, self.entries) {
            (Some(base), Some(entries))
                if continuous(&entries, base, position.seq, self.now_ms, ttl) =>
            {
                Recovery {
                    position,
                    recovered: false,
                    publications: entries.into_iter().map(|(p, _)| p).collect(),
                    restart: base,
                }
            }
            _ => Recovery::lost(position),
        }
    }
}

/// How far [`scripts::RECOVER`] may trust a `since` (its `ARGV[7]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Vouch {
    /// As [`Since::vouched`] says.
    AsGiven,
    /// The pod saw a seq at or below `since` issued again in its epoch.
    Reissued,
}

/// One topic's [`scripts::RECOVER`] call.
fn recover_invocation(
    keys: &Keys,
    lineage: &Lineage,
    topic: &Topic,
    since: Option<&Since>,
    vouch: Vouch,
    history_ttl: Duration,
    page: PageSize,
) -> redis::ScriptInvocation<'static> {
    let vouched = match (vouch, since) {
        (Vouch::Reissued, _) => "2",
        (Vouch::AsGiven, Some(since)) if since.vouched => "1",
        _ => "0",
    };
    let slot = keys.slot(topic);
    let mut invocation = scripts::RECOVER.prepare_invoke();
    invocation
        .key(keys.meta(topic))
        .key(keys.history(topic))
        .key(keys.lineage(slot))
        .arg(new_epoch())
        .arg(since.map_or(-1, |s| i64::try_from(s.seq).unwrap_or(i64::MAX)))
        .arg(since.and_then(|s| s.epoch.as_deref()).unwrap_or(""))
        .arg(millis(history_ttl.min(META_TTL)).max(1))
        .arg(lineage.known(slot))
        .arg(lineage::fresh())
        .arg(vouched)
        .arg(bound(page.messages))
        .arg(bound(page.bytes));
    invocation
}

/// Runs [`scripts::RECOVER`]: the topic's position, and with `since` the
/// first page of the history after it.
#[allow(clippy::too_many_arguments)]
async fn recover_raw(
    keys: &Keys,
    shards: &Shards,
    observer: &dyn Observer,
    lineage: &Lineage,
    topic: &Topic,
    since: Option<&Since>,
    history_ttl: Duration,
    page: PageSize,
) -> Result<Recovered, BrokerError> {
    let invocation = recover_invocation(
        keys,
        lineage,
        topic,
        since,
        Vouch::AsGiven,
        history_ttl,
        page,
    );
    let meta = keys.meta(topic);
    let reading = shards.script(&meta, &scripts::RECOVER, &invocation);
    let value: Value = timed(observer, "recover", reading).await?;
    recovered(keys, lineage, topic, value)
}

/// [`recover_raw`] for many topics at once, in a pipeline per master (the
/// pub/sub task's reads after a reconnect): `(topic, since, vouch, history
/// ttl)` each.
async fn read_many(
    keys: &Keys,
    shards: &Shards,
    observer: &dyn Observer,
    lineage: &Lineage,
    reads: &[(Topic, Option<Since>, Vouch, Duration)],
) -> Result<Vec<Recovered>, BrokerError> {
    let calls: Vec<_> = reads
        .iter()
        .map(|(topic, since, vouch, ttl)| {
            // Whole: the pub/sub task delivers what it reads to every
            // subscriber at once, one copy for them all.
            let invocation = recover_invocation(
                keys,
                lineage,
                topic,
                since.as_ref(),
                *vouch,
                *ttl,
                PageSize::UNBOUNDED,
            );
            shards::Call {
                slot: slots::slot(keys.meta(topic).as_bytes()),
                script: &scripts::RECOVER,
                invocation,
            }
        })
        .collect();
    let values = timed_each(observer, "recover", shards.scripts(&calls))
        .await
        .into_iter()
        .map(|reply| match reply {
            Ok(Value::ServerError(e)) => Err(unavailable(e.into())),
            Ok(value) => Ok(value),
            Err(e) => Err(unavailable(e)),
        })
        .collect::<Result<Vec<Value>, BrokerError>>()?;
    reads
        .iter()
        .zip(values)
        .map(|((topic, ..), value)| recovered(keys, lineage, topic, value))
        .collect()
}

fn recovered(
    keys: &Keys,
    lineage: &Lineage,
    topic: &Topic,
    value: Value,
) -> Result<Recovered, BrokerError> {
    let (recovered, line) = parse_recovered(topic, value)
        .ok_or_else(|| BrokerError::Unavailable("redis: unexpected recover reply".into()))?;
    lineage.saw(keys.slot(topic), &line, recovered.clock);
    Ok(recovered)
}

fn parse_recovered(topic: &Topic, value: Value) -> Option<(Recovered, String)> {
    let Value::Array(items) = value else {
        return None;
    };
    let mut items = items.into_iter();
    let seq = as_u64(&items.next()?)?;
    let epoch: Epoch = Arc::from(as_string(&items.next()?)?);
    let now_ms = as_u64(&items.next()?)?;
    let clock = as_u64(&items.next()?)?;
    let line = as_string(&items.next()?)?;
    let entries = match items.next() {
        Some(entries) => Some(parse_entries(topic, &epoch, entries)?),
        None => None,
    };
    let base = match items.next() {
        Some(base) => Some(as_u64(&base)?),
        None => None,
    };
    Some((
        Recovered {
            position: Position { epoch, seq },
            now_ms,
            clock,
            entries,
            base,
        },
        line,
    ))
}

/// Parses an `XRANGE` reply into publications, with each one's publish time.
fn parse_entries(topic: &Topic, epoch: &Epoch, value: Value) -> Option<Vec<(Publication, u64)>> {
    let Value::Array(entries) = value else {
        return None;
    };
    entries
        .into_iter()
        .map(|entry| {
            let Value::Array(parts) = entry else {
                return None;
            };
            let mut parts = parts.into_iter();
            let id = as_string(&parts.next()?)?;
            let seq = id.split_once('-')?.0.parse().ok()?;
            let Value::Array(fields) = parts.next()? else {
                return None;
            };
            let mut data = None;
            let mut at = 0;
            for pair in fields.chunks(2) {
                match (pair.first().and_then(as_string).as_deref(), pair.get(1)) {
                    (Some("d"), Some(Value::BulkString(d))) => {
                        data = Some(Bytes::copy_from_slice(d))
                    }
                    (Some("t"), Some(t)) => at = as_u64(t)?,
                    _ => {}
                }
            }
            Some((
                Publication {
                    topic: topic.clone(),
                    epoch: epoch.clone(),
                    seq,
                    data: data?,
                },
                at,
            ))
        })
        .collect()
}

fn as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Int(i) => u64::try_from(*i).ok(),
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::SimpleString(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_string(value: &Value) -> Option<String> {
    match value {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

/// Whether `entries` (read after `since`) continue it without a gap up to
/// `seq`, none older than `ttl`.
fn continuous(
    entries: &[(Publication, u64)],
    since: u64,
    seq: u64,
    now_ms: u64,
    ttl: Duration,
) -> bool {
    let oldest_allowed = now_ms.saturating_sub(millis(ttl));
    entries.len() as u64 == seq - since
        && entries
            .first()
            .is_some_and(|(first, at)| first.seq == since + 1 && *at >= oldest_allowed)
        && entries.windows(2).all(|w| w[1].0.seq == w[0].0.seq + 1)
}

#[async_trait]
impl Broker for RedisBroker {
    fn status(&self) -> BrokerStatus {
        BrokerStatus {
            kind: "redis",
            not_ready: self.inner.reach.not_ready(),
            connected: self.inner.reach.connected(),
            lineage_clock: Some(self.inner.lineage.highest()),
        }
    }

    async fn publish(
        &self,
        topic: &Topic,
        data: Bytes,
        idempotency_key: Option<&str>,
        traceparent: Option<&str>,
    ) -> Result<Position, BrokerError> {
        let item = self.publish_item(topic, &data, idempotency_key, traceparent)?;
        let slot = item.slot;
        let deadline = Instant::now() + self.inner.command_timeout + ANSWER_GRACE;
        let reply = self.queue_publish(item).await?;
        self.published(slot, self.answer(reply, deadline).await)
    }

    async fn publish_many(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        // Queued together, in order: the writer sends them in one pipeline.
        let deadline = Instant::now() + self.inner.command_timeout + ANSWER_GRACE;
        let mut queued = Vec::with_capacity(items.len());
        for item in &items {
            let item = self.publish_item(
                &item.topic,
                &item.data,
                item.idempotency_key.as_deref(),
                item.traceparent.as_deref(),
            );
            queued.push(match item {
                Ok(item) => {
                    let slot = item.slot;
                    self.queue_publish(item).await.map(|reply| (slot, reply))
                }
                Err(e) => Err(e),
            });
        }
        let mut answers = Vec::with_capacity(queued.len());
        for queued in queued {
            answers.push(match queued {
                Ok((slot, reply)) => self.published(slot, self.answer(reply, deadline).await),
                Err(e) => Err(e),
            });
        }
        answers
    }

    async fn watch(&self, topic: &Topic) -> Result<(), BrokerError> {
        self.inner.namespaces.require(topic)?;
        let (reply, answer) = oneshot::channel();
        self.inner
            .watches
            .send(pubsub::Command::Watch(topic.clone(), reply))
            .map_err(|_| BrokerError::Unavailable("redis: pub/sub task ended".into()))?;
        // A subscribe and a read, each bounded by the command timeout; a
        // watch given up on is released by the pub/sub task when it ends.
        match tokio::time::timeout(self.inner.command_timeout * 3, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(BrokerError::Unavailable("redis: pub/sub task ended".into())),
            Err(_) => Err(BrokerError::Unavailable(
                "redis: timed out subscribing".into(),
            )),
        }
    }

    async fn unwatch(&self, topic: &Topic) {
        let _ = self
            .inner
            .watches
            .send(pubsub::Command::Unwatch(topic.clone()));
    }

    async fn pod_loads(
        &self,
        pod: &str,
        connections: u64,
        ttl: Duration,
    ) -> Result<Vec<u64>, BrokerError> {
        self.inner.reach.check()?;
        let key = self.inner.keys.pods();
        let mut invocation = scripts::POD_LOADS.prepare_invoke();
        invocation
            .key(&key)
            .arg(pod)
            .arg(connections)
            .arg(millis(ttl).max(1));
        let loads = self
            .inner
            .shards
            .script(&key, &scripts::POD_LOADS, &invocation);
        timed(&*self.inner.observer, "pod_loads", loads).await
    }

    async fn recover(
        &self,
        topic: &Topic,
        since: Option<Since>,
        size: PageSize,
    ) -> Result<Recovery, BrokerError> {
        let ttl = self.inner.namespaces.require(topic)?.history_ttl;
        self.inner.reach.check()?;
        // With `since`, the start of a replay: on the replay connections.
        let shards = match since {
            Some(_) => &self.inner.replay_shards,
            None => &self.inner.shards,
        };
        let recovered = recover_raw(
            &self.inner.keys,
            shards,
            &*self.inner.observer,
            &self.inner.lineage,
            topic,
            since.as_ref(),
            ttl,
            size,
        )
        .await?;
        let position = recovered.position.clone();
        let Some(since) = since else {
            return Ok(Recovery::recovered(position, Vec::new()));
        };
        let now_ms = recovered.now_ms;
        let same_epoch = since.epoch.as_deref().is_none_or(|e| *e == *position.epoch);
        if !same_epoch {
            // A since of an epoch left behind: the stream starts again where
            // the current epoch began, with all of it from history, if Redis
            // still has it all; else at the topic's seq.
            let restarted = match (recovered.base, recovered.entries) {
                (Some(base), Some(entries)) => {
                    page_of(entries, base, position.seq, now_ms, ttl, size)
                        .map(|publications| (base, publications))
                }
                _ => None,
            };
            return Ok(match restarted {
                Some((restart, publications)) => Recovery {
                    position,
                    recovered: false,
                    publications,
                    restart,
                },
                None => Recovery::lost(position),
            });
        }
        if since.seq > position.seq {
            return Ok(Recovery::lost(position));
        }
        if since.seq == position.seq {
            return Ok(Recovery::recovered(position, Vec::new()));
        }
        let entries = recovered.entries.unwrap_or_default();
        Ok(
            match page_of(entries, since.seq, position.seq, now_ms, ttl, size) {
                Some(publications) => Recovery::recovered(position, publications),
                None => Recovery::lost(position),
            },
        )
    }

    async fn history(
        &self,
        topic: &Topic,
        epoch: &Epoch,
        after: u64,
        size: PageSize,
    ) -> Result<Page, BrokerError> {
        let ttl = self.inner.namespaces.require(topic)?.history_ttl;
        self.inner.reach.check()?;
        let inner = &self.inner;
        let reader = pages::Reader {
            keys: &inner.keys,
            shards: &inner.replay_shards,
            observer: &*inner.observer,
            lineage: &inner.lineage,
        };
        reader.next(topic, epoch, after, ttl, size).await
    }
}

#[async_trait]
impl SessionStore for RedisBroker {
    async fn save(
        &self,
        id: &str,
        owner: &str,
        snapshot: SessionSnapshot,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let saved = self.queue_save(id, owner, Some(&snapshot), ttl).await?;
        let saved = saved.await.unwrap_or_else(|_| Err(writer_ended()))?;
        Ok(saved == Stored::Kept)
    }

    async fn extend(&self, id: &str, owner: &str, ttl: Duration) -> Result<Stored, BrokerError> {
        let extended = self.queue_save(id, owner, None, ttl).await?;
        extended.await.unwrap_or_else(|_| Err(writer_ended()))
    }

    async fn save_many(
        &self,
        batch: Vec<SessionSave>,
        ttl: Duration,
    ) -> Vec<Result<Stored, BrokerError>> {
        // Queued together, the writer sends them in one pipeline.
        let mut queued = Vec::with_capacity(batch.len());
        for save in &batch {
            let snapshot = save.snapshot.as_ref();
            queued.push(self.queue_save(&save.id, &save.owner, snapshot, ttl).await);
        }
        let mut answers = Vec::with_capacity(queued.len());
        for saved in queued {
            answers.push(match saved {
                Ok(saved) => saved.await.unwrap_or_else(|_| Err(writer_ended())),
                Err(e) => Err(e),
            });
        }
        answers
    }

    async fn claim(&self, id: &str, owner: &str, user: Option<&str>) -> Result<Claim, BrokerError> {
        self.claim_or_keep(id, owner, user, None).await
    }

    async fn adopt(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        snapshot: &SessionSnapshot,
        ttl: Duration,
    ) -> Result<Claim, BrokerError> {
        self.claim_or_keep(id, owner, user, Some((snapshot, ttl)))
            .await
    }

    async fn revoke(&self, user: &str, ttl: Duration) -> Result<(), BrokerError> {
        self.inner.reach.check()?;
        let user_hex = sessions::hex(user);
        // Twice the window: a pod that missed the announcement may still
        // save a session of the user's for a while.
        let keep = millis(ttl).max(1).saturating_mul(2);
        let key = self.inner.keys.revoked(&user_hex);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(unix_ms()).arg("PX").arg(keep);
        // Stored first, then told: a claim reads it from then on, and every
        // pod drops the user's connections (in a cluster, a `PUBLISH`
        // reaches every node's subscribers).
        let channel = self.inner.keys.control_channel();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&channel).arg(format!("disconnect {user_hex}"));
        let shards = &self.inner.shards;
        let revoking = async {
            shards.command::<()>(&key, &set).await?;
            shards.command::<()>(&channel, &publish).await
        };
        timed(&*self.inner.observer, "revoke", revoking).await
    }
}

impl RedisBroker {
    /// One publish, as the publisher sends it.
    fn publish_item(
        &self,
        topic: &Topic,
        data: &Bytes,
        idempotency_key: Option<&str>,
        traceparent: Option<&str>,
    ) -> Result<publisher::Item, BrokerError> {
        let ns = self.inner.namespaces.require(topic)?;
        self.inner.reach.check()?;
        let keys = &self.inner.keys;
        Ok(publisher::Item {
            slot: keys.slot(topic),
            meta: keys.meta(topic),
            history: keys.history(topic),
            idempotency: idempotency_key.map(|key| keys.idempotency(topic, key)),
            data: data.clone(),
            history_size: ns.history_size,
            history_ttl_ms: millis(ns.history_ttl).max(1),
            channel: keys.channel(topic),
            // Only a traced publish has one: the announcement of an untraced
            // one stays as it was, byte for byte.
            traceparent: traceparent
                .filter(|t| scripts::is_traceparent(t))
                .map(str::to_owned),
        })
    }

    /// Hands a publish to the pipelining writer; the receiver gets Redis's
    /// reply.
    async fn queue_publish(
        &self,
        item: publisher::Item,
    ) -> Result<oneshot::Receiver<Result<Value, BrokerError>>, BrokerError> {
        let (done, reply) = oneshot::channel();
        self.inner
            .publishes
            .send(publisher::Pending { item, done })
            .await
            .map_err(|_| publisher_ended())?;
        Ok(reply)
    }

    /// The publisher's reply, waited for until `deadline`: a publish that
    /// waits longer (Redis does not answer, and the pipelines before it
    /// wait out their timeouts) fails as its own command would have, and
    /// the writer drops it if it has not sent it yet.
    async fn answer(
        &self,
        reply: oneshot::Receiver<Result<Value, BrokerError>>,
        deadline: Instant,
    ) -> Result<Value, BrokerError> {
        match tokio::time::timeout_at(deadline.into(), reply).await {
            Ok(reply) => reply.unwrap_or_else(|_| Err(publisher_ended())),
            Err(_) => Err(BrokerError::Unavailable("redis: publish timed out".into())),
        }
    }

    /// The position [`scripts::PUBLISH`] answered,
    /// `"<seq>:<epoch>:<clock>:<lineage>"`.
    fn published(
        &self,
        slot: u16,
        reply: Result<Value, BrokerError>,
    ) -> Result<Position, BrokerError> {
        let reply = match reply? {
            Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
            Value::SimpleString(text) => Some(text),
            Value::ServerError(e) => return Err(unavailable(e.into())),
            _ => None,
        }
        .ok_or_else(|| BrokerError::Unavailable("redis: an unreadable publish reply".into()))?;
        let mut parts = reply.split(':');
        let (seq, epoch) = parts
            .next()
            .and_then(|seq| seq.parse().ok())
            .zip(parts.next())
            .ok_or_else(|| {
                BrokerError::Unavailable(format!("redis: unexpected publish reply {reply:?}"))
            })?;
        // The repeat of an idempotent publish stored by an older version
        // has no lineage.
        if let (Some(clock), Some(line)) = (parts.next().and_then(|c| c.parse().ok()), parts.next())
        {
            self.inner.lineage.saw(slot, line, clock);
        }
        Ok(Position {
            epoch: Arc::from(epoch),
            seq,
        })
    }
}

impl RedisBroker {
    /// Runs [`scripts::CLAIM_SESSION`]; with `keep`, a session that is not
    /// there is stored as that snapshot, for that long, and claimed.
    ///
    /// The claim must run within half the command timeout (Redis's clock, as
    /// far as this pod knows it): one that runs later, when this pod may have
    /// given up and its client resumed elsewhere, takes nothing. A claim
    /// answered in time that ran too late by that reckoning (the clocks
    /// differ more than learnt so far) is tried again once.
    ///
    /// A claim whose connection broke under it (the first command after Redis
    /// restarted, or after `CLIENT KILL`, meets the pod's stale socket) is
    /// also tried again once, on the new connection, with a deadline of its
    /// own: the client should not pay a reconnect for the pod's socket. That
    /// is safe whether or not the first attempt ran: a claim by the same
    /// owner only ranks it higher, and the stored snapshot is the same. What
    /// a first attempt that ran would have said of the previous owner is
    /// lost, though: `from` is then `None`, and an adopting connection takes
    /// the stored copy, whose subscriptions are all there (a `sub`'s `ok`
    /// waits for the store) and whose acks may be a little older (a replay
    /// the client drops).
    async fn claim_or_keep(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        keep: Option<(&SessionSnapshot, Duration)>,
    ) -> Result<Claim, BrokerError> {
        self.inner.reach.check()?;
        let user_hex = user.map(sessions::hex).unwrap_or_default();
        let within = self.inner.command_timeout / 2;
        let key = self.inner.keys.session(id);
        let shards = &self.inner.shards;
        // In a cluster the user's revocation is in another slot than the
        // session: read just before the claim, instead of by it.
        let revoked: Option<String> = match user {
            Some(_) if shards.is_cluster() => {
                let revocation = self.inner.keys.revoked(&user_hex);
                let mut get = redis::cmd("GET");
                get.arg(&revocation);
                let reading = shards.command(&revocation, &get);
                timed(&*self.inner.observer, "session_load", reading).await?
            }
            _ => None,
        };
        let mut retried = false;
        for attempt in 0..2 {
            let mut invocation = scripts::CLAIM_SESSION.prepare_invoke();
            invocation.key(&key);
            if user.is_some() && !shards.is_cluster() {
                invocation.key(self.inner.keys.revoked(&user_hex));
            }
            let sent_ms = unix_ms();
            invocation
                .arg(owner)
                .arg(&user_hex)
                .arg(self.inner.redis_clock.deadline(sent_ms, within))
                .arg(revoked.as_deref().unwrap_or(""));
            if let Some((snapshot, ttl)) = keep {
                invocation
                    .arg(sessions::encode_body(snapshot))
                    .arg(millis(ttl).max(1));
            }
            let claiming = shards.script(&key, &scripts::CLAIM_SESSION, &invocation);
            let value: Value = match timed_raw(&*self.inner.observer, "session_load", claiming)
                .await
            {
                Ok(value) => value,
                Err(e) if attempt == 0 && connection::broke_under(&e) => {
                    tracing::info!(error = %e, "a claim met a broken Redis connection; trying it on a new one");
                    retried = true;
                    continue;
                }
                Err(e) => return Err(unavailable(e)),
            };
            let claimed = match value {
                Value::Nil => return Ok(Claim::NotFound),
                Value::Int(0) => return Ok(Claim::OtherUser),
                value => sessions::ClaimReply::parse(value).ok_or_else(|| {
                    BrokerError::Unavailable("redis: an unreadable claim reply".into())
                })?,
            };
            self.inner
                .redis_clock
                .learn(sent_ms, unix_ms(), claimed.redis_ms);
            if let Some(taken) = claimed.taken {
                // Taken from this connection's own first attempt, which ran
                // before its connection broke: who held it before is lost.
                let own = retried && sessions::is_owned_by(&taken.from, owner);
                return Ok(Claim::Taken(Claimed {
                    snapshot: sessions::decode(&taken.body),
                    from: Some(taken.from).filter(|f| !f.is_empty() && !own),
                    owner: Arc::from(taken.owner),
                }));
            }
            // (No session id in the log: it is what resumes the session.)
            tracing::debug!("a claim ran after its deadline: trying again");
        }
        Err(BrokerError::Unavailable(format!(
            "redis: claims run later than {within:?} after they are sent: Redis or the network holds them back, or Redis's clock is ahead of this pod's"
        )))
    }

    /// Hands a save (`None`: an extend) to the session writer; the receiver
    /// says how it went.
    async fn queue_save(
        &self,
        id: &str,
        owner: &str,
        snapshot: Option<&SessionSnapshot>,
        ttl: Duration,
    ) -> Result<oneshot::Receiver<Result<Stored, BrokerError>>, BrokerError> {
        self.inner.reach.check()?;
        let (done, saved) = oneshot::channel();
        let save = sessions::Save {
            key: self.inner.keys.session(id),
            owner: owner.to_owned(),
            value: snapshot.map(|snapshot| sessions::encode(owner, snapshot)),
            ttl_ms: millis(ttl).max(1),
            done,
        };
        self.inner
            .saves
            .send(save)
            .await
            .map_err(|_| writer_ended())?;
        Ok(saved)
    }
}

fn publisher_ended() -> BrokerError {
    BrokerError::Unavailable("redis: publish writer ended".into())
}

fn writer_ended() -> BrokerError {
    BrokerError::Unavailable("redis: session writer ended".into())
}
