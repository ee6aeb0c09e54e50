//! The Redis [`Broker`]: starting the engine's tasks, publishing through
//! the pipelining publisher, watching topics through the pub/sub task, and
//! reading a topic's position and history.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use redis::Value;
use tokio::sync::{mpsc, oneshot};

use super::call::timed;
use super::connection::{self, Commands};
use super::lineage::Lineage;
use super::pages::{self, page_of};
use super::presence::Presence;
use super::reach::Reach;
use super::recover::recover_raw;
use super::replies::parse_published;
use super::scripts::{self, Keys};
use super::settings::{self, InvalidSetting, RedisSettings, redact_urls};
use super::shards::Shards;
use super::{control, history, millis, publisher, pubsub, sessions};
use crate::observe::Observer;
use crate::page::{Page, PageSize};
use crate::{
    Broker, BrokerError, BrokerStatus, Deliver, Epoch, Forward, HistoryPage, HistoryQuery,
    Namespaces, Outgoing, Position, PresenceCounts, PresencePage, PresenceUpdate, Recovery,
    ServerSubscription, Since, Topic, Unavailable,
};

/// How much longer than the command timeout a publish waits for the
/// publisher: a pipeline that times out says so itself (and its connection
/// is replaced) before its publishes give up on it.
const ANSWER_GRACE: Duration = Duration::from_millis(100);

/// The Redis [`Broker`] and [`crate::SessionStore`].
#[derive(Clone)]
pub struct RedisBroker {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) shards: Shards,
    /// The same Redis over connections of their own, for replays' reads
    /// (a `recover` with `since`, and [`Broker::history`]): a page is up to
    /// a few hundred KiB, and publishes, claims and saves on `shards` never
    /// wait behind one.
    pub(super) replay_shards: Shards,
    pub(super) namespaces: Arc<Namespaces>,
    pub(super) watches: mpsc::UnboundedSender<pubsub::Command>,
    pub(super) saves: mpsc::Sender<sessions::Save>,
    pub(super) publishes: mpsc::Sender<publisher::Pending>,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) lineage: Arc<Lineage>,
    pub(super) command_timeout: Duration,
    pub(super) redis_clock: sessions::RedisClock,
    pub(super) keys: Keys,
    /// Whether Redis was reached since the start.
    pub(super) reach: Arc<Reach>,
    pub(super) presence: Arc<Presence>,
}

impl RedisBroker {
    /// Starts the pub/sub and session-writer tasks (which end when the broker
    /// is dropped) and waits for a first connection, bounded by the command
    /// timeout. Only a Redis that refuses the pod's credentials fails the
    /// start: while Redis cannot be reached the broker keeps trying (about
    /// once a second), [`Broker::status`] says why it is not ready, and every
    /// call fails at once with [`BrokerError::Unavailable`]. Settings it
    /// cannot use fail it too ([`StartError::Config`]), before it connects.
    pub async fn start(
        settings: RedisSettings,
        namespaces: Arc<Namespaces>,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
    ) -> Result<Self, StartError> {
        let client = settings.connector().map_err(StartError::Config)?;
        let (target, shards, failed) = if settings.cluster.is_empty() {
            let (conn, failed) = Commands::start(client.clone()).await;
            (client.describe(), Shards::one(conn), failed)
        } else {
            let seeds = settings::seeds(&settings.cluster).map_err(|reason| {
                StartError::Config(InvalidSetting {
                    key: "redis.cluster",
                    reason,
                })
            })?;
            let target = format!(
                "the redis cluster at {}",
                redact_urls(&settings.cluster).join(", ")
            );
            let (shards, failed) = Shards::cluster(client.clone(), seeds).await;
            (target, shards, failed)
        };
        let unreached = failed.is_some();
        if let Some(e) = failed {
            if connection::refused(&e) {
                return Err(StartError::Refused { target, source: e });
            }
            tracing::warn!("redis: connecting to {target}: {e}; not ready until it answers");
        }
        let reach = Reach::new(target);
        let command_timeout = settings.command_timeout;
        let keys = Keys::new(&settings.prefix, shards.is_cluster());
        let (watches, commands) = mpsc::unbounded_channel();
        let (saves, pending_saves) = mpsc::channel(sessions::QUEUE);
        let (publishes, pending_publishes) = mpsc::channel(publisher::QUEUE);
        let lineage = Arc::new(Lineage::new(observer.clone(), shards.is_cluster()));
        let replay_shards = shards.apart();
        let presence = Presence::start(
            shards.clone(),
            replay_shards.clone(),
            &settings.prefix,
            sink.clone(),
            observer.clone(),
            settings.presence.clone(),
            command_timeout,
            namespaces.iter().any(|(_, ns)| ns.presence),
        );
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
                presence.replicas(),
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
        if !unreached {
            // Reachable a moment ago: ready as soon as pub/sub is, so that a
            // pod whose Redis is there starts ready, as before.
            let _ = tokio::time::timeout(command_timeout * 2, reach.first_attempt()).await;
        }
        Ok(Self {
            inner: Arc::new(Inner {
                replay_shards,
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
                presence,
            }),
        })
    }
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
        let presence = self.inner.namespaces.require(topic)?.presence;
        let (reply, answer) = oneshot::channel();
        self.inner
            .watches
            .send(pubsub::Command::Watch(topic.clone(), reply))
            .map_err(|_| ended("pub/sub task"))?;
        // A subscribe and a read, each bounded by the command timeout; a
        // watch given up on is released by the pub/sub task when it ends.
        let deadline = tokio::time::Instant::now() + self.inner.command_timeout * 3;
        match tokio::time::timeout_at(deadline, answer).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(_)) => return Err(ended("pub/sub task")),
            Err(_) => return Err(BrokerError::Unavailable(Unavailable::TimedOut("subscribe"))),
        }
        // Counted only once watched: the caller unwatches only a watch that
        // succeeded.
        if let Some(occupancy) = self.inner.presence.occupancy() {
            occupancy.watched(topic);
        }
        if presence {
            // Its room read too, so that a page asked for now has every
            // change after it handed on. Watched all the same if not: the
            // page is then read from Redis.
            let deadline = deadline + self.inner.command_timeout;
            if let Err(e) = self.inner.presence.synced(topic, deadline).await {
                tracing::warn!(%topic, error = %crate::Causes(&e), "presence: the room was not read in time");
            }
        }
        Ok(())
    }

    async fn unwatch(&self, topic: &Topic) {
        if let Some(occupancy) = self.inner.presence.occupancy() {
            occupancy.unwatched(topic);
        }
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

    async fn presence_update(
        &self,
        topic: &Topic,
        update: PresenceUpdate,
    ) -> Result<(), BrokerError> {
        self.inner.namespaces.require(topic)?;
        // Kept as this pod's part even while Redis is away: written with
        // the next beat that reaches it.
        let reached = self.inner.reach.check();
        self.inner.presence.update(topic, &update, reached).await
    }

    async fn presence(
        &self,
        topic: &Topic,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        self.inner.namespaces.require(topic)?;
        self.inner.reach.check()?;
        self.inner.presence.page(topic, after, limit).await
    }

    async fn presence_counts(&self, topic: &Topic) -> Result<PresenceCounts, BrokerError> {
        self.inner.namespaces.require(topic)?;
        self.inner.reach.check()?;
        self.inner.presence.counts(topic).await
    }

    async fn presence_depart(&self, linger: Duration) -> Result<(), BrokerError> {
        self.inner.reach.check()?;
        self.inner.presence.depart(linger).await
    }

    async fn resumed(&self, session: &str) -> Result<(), BrokerError> {
        self.inner.reach.check()?;
        let channel = self.inner.keys.control_channel();
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(&channel).arg(control::resumed(session));
        let sending = self.inner.shards.command::<()>(&channel, &publish);
        timed(&*self.inner.observer, "resumed", sending).await
    }

    async fn read_history(
        &self,
        topic: &Topic,
        query: &HistoryQuery,
    ) -> Result<HistoryPage, BrokerError> {
        let ttl = self.inner.namespaces.require(topic)?.history_ttl;
        self.inner.reach.check()?;
        let inner = &self.inner;
        let reader = history::Reader {
            keys: &inner.keys,
            shards: &inner.replay_shards,
            observer: &*inner.observer,
            lineage: &inner.lineage,
        };
        reader.read(topic, query, ttl).await
    }

    async fn subscription(
        &self,
        user: &str,
        command: ServerSubscription,
    ) -> Result<(), BrokerError> {
        self.inner.namespaces.require(command.topic())?;
        self.inner.reach.check()?;
        // Every pod, this one included, hears it from the control channel
        // (in a cluster, a `PUBLISH` reaches every node's subscribers).
        let channel = self.inner.keys.control_channel();
        let mut publish = redis::cmd("PUBLISH");
        publish
            .arg(&channel)
            .arg(control::subscription(user, &command));
        let sending = self.inner.shards.command::<()>(&channel, &publish);
        timed(&*self.inner.observer, "subscription", sending).await
    }

    async fn forward(&self, forward: Forward) -> Result<(), BrokerError> {
        self.forward_commands(&forward).await
    }
}

impl RedisBroker {
    /// The id this process's presence is kept under in Redis: the pod's
    /// name and a random suffix.
    pub fn presence_instance(&self) -> &str {
        self.inner.presence.instance()
    }

    /// Stops this pod's presence liveness beat, as if it had died: for
    /// tests of the cleanup of a dead pod's members.
    #[doc(hidden)]
    pub fn stop_presence_beat(&self) {
        self.inner.presence.stop_beating();
    }

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
            Err(_) => Err(BrokerError::Unavailable(Unavailable::TimedOut("publish"))),
        }
    }

    /// The position [`scripts::PUBLISH`] answered,
    /// `"<seq>:<epoch>:<clock>:<lineage>"`.
    fn published(
        &self,
        slot: u16,
        reply: Result<Value, BrokerError>,
    ) -> Result<Position, BrokerError> {
        let published = parse_published(reply?)?;
        if let Some((clock, line)) = &published.lineage {
            self.inner.lineage.saw(slot, line, *clock);
        }
        Ok(published.position)
    }
}

fn publisher_ended() -> BrokerError {
    ended("publish writer")
}

/// One of the engine's tasks ended: the broker is being dropped.
pub(super) fn ended(task: &'static str) -> BrokerError {
    BrokerError::Unavailable(Unavailable::Ended(task))
}

/// Why [`RedisBroker::start`] failed: not for lack of Redis (the broker
/// starts without it, not ready), but for what waiting will not mend.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A setting it cannot use: a configuration error, which the
    /// configuration's validation ([`RedisSettings::validate`]) finds first.
    #[error("redis: `{}`", .0.key)]
    Config(#[source] InvalidSetting),
    /// Redis refused the pod's credentials (a wrong password, a user without
    /// the rights): a corrected Secret will help, waiting will not.
    #[error("broker unavailable: redis: connecting to {target}")]
    Refused {
        target: String,
        #[source]
        source: redis::RedisError,
    },
}
