//! The pod's one pub/sub connection, and the order of what it delivers.
//!
//! One task owns the connection and, per watched topic, where delivery
//! stands ([`Flow`]). It never waits for Redis itself: reading the channel is
//! separate from every round trip. Subscribing, reading a new topic's
//! position, filling a gap from history and resyncing after a reconnect run
//! as their own tasks and report back ([`Done`]); meanwhile that topic's
//! announcements are held aside (at most [`MAX_HELD`]; past that they are
//! read from history afterwards), and every other topic keeps flowing.
//!
//! A publication arrives in seq order; one already delivered is dropped; a
//! jump is filled from history (or, where history cannot, the topic's
//! subscribers get `reset`); a seq issued a second time in its epoch proves
//! that Redis went back in time, and moves the topic to a new epoch. When the
//! connection drops, for whatever reason (Redis restarted, failed over,
//! `CLIENT KILL`, the output buffer limit), the task reconnects with backoff
//! and jitter, subscribes every topic again, and reads what was published
//! meanwhile in pipelines of [`READ_BATCH`] topics.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use rand::Rng;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::connection::{Commands, Connector};
use super::lineage::Lineage;
use super::reach::Reach;
use super::scripts::Keys;
use super::{Recovered, RedisSettings, Vouch, parse_entries, read_many, timed};
use crate::observe::Observer;
use crate::{BrokerError, Deliver, Epoch, Namespaces, Position, Publication, Since, Topic};

/// Channels per SUBSCRIBE or UNSUBSCRIBE command.
const SUBSCRIBE_BATCH: usize = 500;
/// Topics per pipeline of position reads.
const READ_BATCH: usize = 500;
/// Announcements one topic holds aside while its history is read.
pub const MAX_HELD: usize = 1024;
/// The wait before the first reconnect; it doubles per failed attempt, up
/// to [`MAX_BACKOFF`], and each wait is between half of it and all of it, at
/// random, so that pods do not reconnect in lockstep.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
/// Short, so that a pod that waits for Redis (at start: not ready) is back
/// within about a second of Redis: an attempt a second per pod costs Redis
/// nothing.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

pub enum Command {
    Watch(Topic, oneshot::Sender<Result<(), BrokerError>>),
    Unwatch(Topic),
}

type Reply = oneshot::Sender<Result<(), BrokerError>>;

struct Watched {
    /// Watches not yet unwatched.
    count: usize,
    /// When `count` fell to 0: unsubscribed once the linger has passed.
    idle_since: Option<Instant>,
    flow: Flow,
}

/// Where a topic's delivery stands.
enum Flow {
    /// Subscribing, then reading the position; the watches wait for it.
    Starting { waiters: Vec<Reply>, held: Held },
    /// Delivered up to `at`: announcements go straight to the sink.
    Live(At),
    /// Reading history after `at` (a gap, a reconnect, a seq issued twice:
    /// `reissued`, and the read tells Redis that it went back in time).
    Catching { at: At, held: Held, reissued: bool },
    /// Unsubscribing after the linger. A watch that comes meanwhile waits
    /// for the unsubscribe to be confirmed before it subscribes again:
    /// sent in the other order, the two would leave the topic unsubscribed.
    Leaving { waiters: Vec<Reply> },
}

/// How far a topic was delivered on this pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub epoch: Epoch,
    pub seq: u64,
    /// The newest seq known from a read of Redis rather than from the
    /// channel, and the lineage clock of that read: an announcement at or
    /// below it that was issued before the read is a duplicate; any other
    /// announcement at or below `seq` is a seq issued twice.
    pub read_seq: u64,
    pub read_clock: u64,
}

/// One announcement from a topic's channel.
#[derive(Debug, Clone)]
pub struct Announced {
    pub epoch: Epoch,
    pub seq: u64,
    /// The lineage clock of its publish; `None` from a pod of an older
    /// version.
    pub clock: Option<u64>,
    pub traceparent: Option<Box<str>>,
    pub data: Bytes,
}

/// What to do with an announcement, given where the topic stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The next seq: deliver it.
    Deliver,
    /// Delivered already, or of an epoch that was already left behind.
    Drop,
    /// The first of a new epoch: reset the subscribers, then deliver.
    NewEpoch,
    /// Seqs are missing before it: fill them from history first.
    Gap,
    /// A seq at or below one delivered, issued after it: Redis went back in
    /// time.
    Reissued,
}

/// The merge rule of the channel: seq order within an epoch, each seq once.
pub fn decide(at: &At, a: &Announced) -> Decision {
    if a.epoch != at.epoch {
        // Issued before the read that moved us to `at.epoch`: a straggler.
        return match a.clock {
            Some(clock) if clock <= at.read_clock => Decision::Drop,
            _ => Decision::NewEpoch,
        };
    }
    if a.seq <= at.seq {
        let duplicate = a.seq <= at.read_seq && a.clock.is_none_or(|clock| clock <= at.read_clock);
        return if duplicate {
            Decision::Drop
        } else {
            Decision::Reissued
        };
    }
    if a.seq == at.seq + 1 {
        Decision::Deliver
    } else {
        Decision::Gap
    }
}

/// Announcements held aside while a topic's history is read.
#[derive(Default)]
struct Held {
    items: Vec<Announced>,
    /// The newest announcement dropped for want of room (without its data):
    /// what follows the held ones is read from history up to it.
    overflow: Option<Announced>,
}

/// What a task that talked to Redis reports back. `generation` names the
/// connection it was started on: a report about an earlier one is ignored.
enum Done {
    Subscribed {
        generation: u64,
        topics: Vec<Topic>,
        result: Result<(), BrokerError>,
    },
    Read {
        generation: u64,
        topics: Vec<Topic>,
        result: Result<Vec<Recovered>, BrokerError>,
    },
    Filled {
        generation: u64,
        topic: Topic,
        upto: u64,
        result: Result<Vec<Publication>, BrokerError>,
    },
    Unsubscribed {
        generation: u64,
        topics: Vec<Topic>,
        result: Result<(), BrokerError>,
    },
}

pub struct Pubsub {
    client: Connector,
    conn: Commands,
    sink: Arc<dyn Deliver>,
    observer: Arc<dyn Observer>,
    lineage: Arc<Lineage>,
    namespaces: Arc<Namespaces>,
    settings: RedisSettings,
    /// The names of this deployment's keys and channels.
    keys: Keys,
    /// Told when the connection comes up or fails.
    reach: Arc<Reach>,
    control_channel: String,
    topics: HashMap<Topic, Watched>,
    /// Counts connections: which one a [`Done`] belongs to.
    generation: u64,
    done: mpsc::UnboundedSender<Done>,
    reports: mpsc::UnboundedReceiver<Done>,
    /// Announcements held over all topics.
    held: usize,
}

/// Why the connected loop ended.
enum Ended {
    /// The broker was dropped.
    Shutdown,
    /// The connection failed; reconnect.
    Lost,
}

impl Pubsub {
    // One argument per part it shares with the broker.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Connector,
        conn: Commands,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
        lineage: Arc<Lineage>,
        namespaces: Arc<Namespaces>,
        settings: RedisSettings,
        reach: Arc<Reach>,
    ) -> Self {
        let (done, reports) = mpsc::unbounded_channel();
        let keys = Keys::new(&settings.prefix);
        Self {
            control_channel: keys.control_channel(),
            keys,
            reach,
            client,
            conn,
            sink,
            observer,
            lineage,
            namespaces,
            settings,
            topics: HashMap::new(),
            generation: 0,
            done,
            reports,
            held: 0,
        }
    }
}

pub async fn run(mut ps: Pubsub, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut backoff = MIN_BACKOFF;
    let mut last_error: Option<String> = None;
    loop {
        let connected = tokio::time::timeout(ps.settings.command_timeout, ps.client.pubsub()).await;
        let (subscriber, mut stream) = match connected {
            Ok(Ok(pubsub)) => pubsub.split(),
            failed => {
                let error = match failed {
                    Ok(Err(e)) => e.to_string(),
                    _ => "timed out".to_owned(),
                };
                // Once a second while Redis is away: said again only when
                // the reason changes (`/readyz` and the metrics say it meanwhile).
                if backoff < MAX_BACKOFF || last_error.as_deref() != Some(error.as_str()) {
                    tracing::warn!(%error, retry_in = ?backoff, "redis pub/sub connection failed");
                } else {
                    tracing::debug!(%error, retry_in = ?backoff, "redis pub/sub connection failed");
                }
                ps.reach.down(&error);
                last_error = Some(error);
                // Keep answering watches (they fail fast) while waiting.
                let wait = tokio::time::sleep(jitter(backoff));
                tokio::pin!(wait);
                loop {
                    tokio::select! {
                        _ = &mut wait => break,
                        command = commands.recv() => match command {
                            Some(command) => ps.refuse(command),
                            None => return,
                        },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                continue;
            }
        };
        match ps.serve(subscriber, &mut stream, &mut commands).await {
            Ended::Shutdown => return,
            Ended::Lost => {
                ps.observer.pubsub_up(false);
                ps.reach.down("the pub/sub connection was lost");
                ps.lost();
                tracing::warn!(
                    topics = ps.topics.len(),
                    "redis pub/sub connection lost; reconnecting"
                );
                backoff = MIN_BACKOFF;
                last_error = None;
                tokio::time::sleep(jitter(backoff)).await;
            }
        }
    }
}

/// Between half of `d` and `d`, so that pods do not reconnect in lockstep.
fn jitter(d: Duration) -> Duration {
    d.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
}

impl Pubsub {
    /// A watch while disconnected fails at once; an unwatch is recorded.
    fn refuse(&mut self, command: Command) {
        match command {
            Command::Watch(_, reply) => {
                let _ = reply.send(Err(BrokerError::Unavailable(
                    "redis pub/sub is reconnecting".into(),
                )));
            }
            Command::Unwatch(topic) => self.release(&topic, true),
        }
    }

    /// One watch fewer; `forget` drops an idle topic at once (there is no
    /// subscription to end).
    fn release(&mut self, topic: &Topic, forget: bool) {
        if let Some(watched) = self.topics.get_mut(topic) {
            watched.count = watched.count.saturating_sub(1);
            if watched.count == 0 {
                if forget {
                    self.forget(topic);
                } else {
                    watched.idle_since = Some(Instant::now());
                }
            }
        }
    }

    fn forget(&mut self, topic: &Topic) {
        if let Some(Watched {
            flow: Flow::Starting { held, .. } | Flow::Catching { held, .. },
            ..
        }) = self.topics.remove(topic)
        {
            self.held -= held.items.len();
        }
    }

    /// The connection is gone: watches still starting fail (their callers
    /// may try again), the others are read again once reconnected.
    fn lost(&mut self) {
        let starting: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, w)| matches!(w.flow, Flow::Starting { .. } | Flow::Leaving { .. }))
            .map(|(topic, _)| topic.clone())
            .collect();
        for topic in starting {
            let waiters = match self.topics.remove(&topic).map(|w| w.flow) {
                Some(Flow::Starting { waiters, held }) => {
                    self.held -= held.items.len();
                    waiters
                }
                Some(Flow::Leaving { waiters }) => waiters,
                _ => Vec::new(),
            };
            {
                for reply in waiters {
                    let _ = reply.send(Err(BrokerError::Unavailable(
                        "redis pub/sub connection lost".into(),
                    )));
                }
            }
        }
        for watched in self.topics.values_mut() {
            if let Flow::Catching { at, held, .. } = &mut watched.flow {
                self.held -= held.items.len();
                watched.flow = Flow::Live(at.clone());
            }
        }
        self.observer.pubsub_backlog(self.held);
    }

    async fn serve(
        &mut self,
        mut subscriber: PubSubSink,
        stream: &mut PubSubStream,
        commands: &mut mpsc::UnboundedReceiver<Command>,
    ) -> Ended {
        self.generation += 1;
        // Everything watched before the connection dropped: subscribe again
        // (all batches at once), then read what was published meanwhile.
        let channels: Vec<String> = std::iter::once(self.keys.control_channel())
            .chain(self.topics.keys().map(|topic| self.keys.channel(topic)))
            .collect();
        if subscribe(&mut subscriber, &channels, &self.settings, &*self.observer)
            .await
            .is_err()
        {
            return Ended::Lost;
        }
        self.observer.pubsub_up(true);
        self.reach.up();
        let mut resync = Vec::new();
        for (topic, watched) in &mut self.topics {
            if let Flow::Live(at) = &watched.flow {
                watched.flow = Flow::Catching {
                    at: at.clone(),
                    held: Held::default(),
                    reissued: false,
                };
                resync.push(topic.clone());
            }
        }
        for batch in resync.chunks(READ_BATCH) {
            self.read(batch.to_vec(), Duration::ZERO);
        }
        let mut linger =
            tokio::time::interval(self.settings.linger.max(Duration::from_millis(100)));
        linger.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = commands.recv() => {
                    let Some(command) = command else { return Ended::Shutdown };
                    let mut batch = vec![command];
                    while let Ok(more) = commands.try_recv() {
                        batch.push(more);
                    }
                    self.command(&subscriber, batch);
                }
                message = stream.next() => {
                    let Some(message) = message else { return Ended::Lost };
                    self.message(message.get_channel_name(), message.get_payload_bytes());
                }
                Some(done) = self.reports.recv() => {
                    if self.done(done, &subscriber).is_err() {
                        return Ended::Lost;
                    }
                }
                _ = linger.tick() => self.unsubscribe_idle(&subscriber),
            }
        }
    }

    /// Handles watches and unwatches that arrived together: new topics are
    /// subscribed in one command, then their positions read in one pipeline.
    fn command(&mut self, subscriber: &PubSubSink, batch: Vec<Command>) {
        let mut new = Vec::new();
        for command in batch {
            match command {
                Command::Unwatch(topic) => self.release(&topic, false),
                Command::Watch(topic, reply) => match self.topics.get_mut(&topic) {
                    Some(watched) => {
                        watched.count += 1;
                        watched.idle_since = None;
                        match &mut watched.flow {
                            Flow::Starting { waiters, .. } | Flow::Leaving { waiters } => {
                                waiters.push(reply)
                            }
                            // Subscribed: what is published from now on
                            // reaches the sink.
                            Flow::Live(_) | Flow::Catching { .. } => {
                                if reply.send(Ok(())).is_err() {
                                    self.release(&topic, false);
                                }
                            }
                        }
                    }
                    None => {
                        self.topics.insert(
                            topic.clone(),
                            Watched {
                                count: 1,
                                idle_since: None,
                                flow: Flow::Starting {
                                    waiters: vec![reply],
                                    held: Held::default(),
                                },
                            },
                        );
                        new.push(topic);
                    }
                },
            }
        }
        self.subscribe(subscriber, new);
    }

    /// Subscribes topics that are starting, in the background.
    fn subscribe(&self, subscriber: &PubSubSink, new: Vec<Topic>) {
        if new.is_empty() {
            return;
        }
        let mut subscriber = subscriber.clone();
        let settings = self.settings.clone();
        let observer = self.observer.clone();
        let done = self.done.clone();
        let generation = self.generation;
        let keys = self.keys.clone();
        tokio::spawn(async move {
            let channels: Vec<String> = new.iter().map(|topic| keys.channel(topic)).collect();
            let result = subscribe(&mut subscriber, &channels, &settings, &*observer)
                .await
                .map_err(super::unavailable);
            let _ = done.send(Done::Subscribed {
                generation,
                topics: new,
                result,
            });
        });
    }

    /// Reads the positions of `topics` (each as its flow needs: a start
    /// without `since`, a catch-up after where it stands), in one pipeline,
    /// after `delay`.
    fn read(&self, topics: Vec<Topic>, delay: Duration) {
        if topics.is_empty() {
            return;
        }
        let reads: Vec<_> = topics
            .iter()
            .map(|topic| {
                let (since, vouch) = match self.topics.get(topic).map(|w| &w.flow) {
                    Some(Flow::Catching { at, reissued, .. }) => (
                        Some(Since {
                            seq: at.seq,
                            epoch: Some(at.epoch.to_string()),
                            vouched: true,
                        }),
                        if *reissued {
                            Vouch::Reissued
                        } else {
                            Vouch::AsGiven
                        },
                    ),
                    _ => (None, Vouch::AsGiven),
                };
                (topic.clone(), since, vouch, self.history_ttl(topic))
            })
            .collect();
        let conn = self.conn.clone();
        let observer = self.observer.clone();
        let lineage = self.lineage.clone();
        let done = self.done.clone();
        let generation = self.generation;
        let bound = self.settings.command_timeout * 2;
        let keys = self.keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let reading = read_many(&keys, &conn, &*observer, &lineage, &reads);
            let result = tokio::time::timeout(bound, reading)
                .await
                .unwrap_or_else(|_| {
                    tracing::warn!(topics = reads.len(), "reading topics from redis timed out");
                    Err(BrokerError::Unavailable("redis: timed out".into()))
                });
            let _ = done.send(Done::Read {
                generation,
                topics,
                result,
            });
        });
    }

    /// Reads `after+1 ..= upto` of `epoch` from history.
    fn fill(&self, topic: &Topic, epoch: &Epoch, after: u64, upto: u64, delay: Duration) {
        let conn = self.conn.clone();
        let observer = self.observer.clone();
        let done = self.done.clone();
        let generation = self.generation;
        let topic = topic.clone();
        let epoch = epoch.clone();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let mut conn = conn;
            let result = timed(
                &*observer,
                "fill",
                redis::cmd("XRANGE")
                    .arg(keys.history(&topic))
                    .arg(format!("{}-0", after + 1))
                    .arg(format!("{upto}-0"))
                    .query_async::<redis::Value>(&mut conn),
            )
            .await
            .map(|reply| {
                parse_entries(&topic, &epoch, reply)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(p, _)| p)
                    .collect()
            });
            let _ = done.send(Done::Filled {
                generation,
                topic,
                upto,
                result,
            });
        });
    }

    /// A report from Redis work. `Err` when the connection must be made
    /// again (a subscribe failed).
    fn done(&mut self, done: Done, subscriber: &PubSubSink) -> Result<(), ()> {
        match done {
            Done::Subscribed { generation, .. }
            | Done::Read { generation, .. }
            | Done::Filled { generation, .. }
            | Done::Unsubscribed { generation, .. }
                if generation != self.generation => {}
            Done::Unsubscribed { topics, result, .. } => {
                tracing::debug!(?topics, ?result, "unsubscribed");
                if let Err(e) = result {
                    tracing::warn!(error = %e, "redis unsubscribe failed");
                    return Err(());
                }
                let mut again = Vec::new();
                for topic in topics {
                    let Some(watched) = self.topics.get_mut(&topic) else {
                        continue;
                    };
                    match &mut watched.flow {
                        Flow::Leaving { waiters } if waiters.is_empty() => {
                            self.topics.remove(&topic);
                        }
                        Flow::Leaving { waiters } => {
                            watched.flow = Flow::Starting {
                                waiters: std::mem::take(waiters),
                                held: Held::default(),
                            };
                            again.push(topic);
                        }
                        _ => {}
                    }
                }
                self.subscribe(subscriber, again);
            }
            Done::Subscribed { topics, result, .. } => {
                if let Err(e) = result {
                    tracing::warn!(error = %e, "redis subscribe failed");
                    return Err(());
                }
                tracing::debug!(?topics, "subscribed");
                let starting = topics
                    .into_iter()
                    .filter(|t| {
                        self.topics
                            .get(t)
                            .is_some_and(|w| matches!(w.flow, Flow::Starting { .. }))
                    })
                    .collect();
                self.read(starting, Duration::ZERO);
            }
            Done::Read { topics, result, .. } => match result {
                Ok(reads) => {
                    for (topic, recovered) in topics.into_iter().zip(reads) {
                        self.positioned(&topic, recovered);
                    }
                }
                Err(e) => self.read_failed(topics, e, subscriber),
            },
            Done::Filled {
                topic,
                upto,
                result,
                ..
            } => match result {
                Ok(publications) => self.filled(&topic, upto, publications),
                Err(e) => {
                    tracing::warn!(error = %e, %topic, "reading a gap from history failed; retrying");
                    if let Some(Watched {
                        flow: Flow::Catching { at, .. },
                        ..
                    }) = self.topics.get(&topic)
                    {
                        let (epoch, after) = (at.epoch.clone(), at.seq);
                        self.fill(&topic, &epoch, after, upto, MIN_BACKOFF);
                    }
                }
            },
        }
        Ok(())
    }

    /// A read failed: new watches fail (their callers may try again), a
    /// catch-up is tried again.
    fn read_failed(&mut self, topics: Vec<Topic>, e: BrokerError, subscriber: &PubSubSink) {
        let mut retry = Vec::new();
        let mut abandoned = Vec::new();
        for topic in topics {
            match self.topics.get(&topic).map(|w| &w.flow) {
                Some(Flow::Starting { .. }) => {
                    if let Some(watched) = self.topics.get_mut(&topic) {
                        watched.count = 0;
                        if let Flow::Starting { waiters, .. } = &mut watched.flow {
                            for reply in waiters.drain(..) {
                                let _ = reply.send(Err(e.clone()));
                            }
                        }
                    }
                    abandoned.push(topic);
                }
                Some(Flow::Catching { .. }) => retry.push(topic),
                _ => {}
            }
        }
        if !retry.is_empty() {
            tracing::warn!(error = %e, topics = retry.len(), "reading topics after a reconnect failed; retrying");
            self.read(retry, MIN_BACKOFF);
        }
        if !abandoned.is_empty() {
            self.leave(subscriber, abandoned);
        }
        self.observer.pubsub_backlog(self.held);
    }

    /// A topic's position was read: a new watch starts from it, a catch-up
    /// delivers what history holds after where the topic stood (or resets).
    fn positioned(&mut self, topic: &Topic, recovered: Recovered) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        if matches!(watched.flow, Flow::Leaving { .. }) {
            return;
        }
        let position = recovered.position.clone();
        tracing::debug!(%topic, ?position, clock = recovered.clock, "read");
        let read = At {
            epoch: position.epoch.clone(),
            seq: position.seq,
            read_seq: position.seq,
            read_clock: recovered.clock,
        };
        match std::mem::replace(&mut watched.flow, Flow::Live(read)) {
            Flow::Starting { waiters, held } => {
                let mut given_up = 0;
                for reply in waiters {
                    if reply.send(Ok(())).is_err() {
                        given_up += 1;
                    }
                }
                for _ in 0..given_up {
                    self.release(topic, false);
                }
                self.replay_held(topic, held);
            }
            Flow::Catching { at, held, .. } => {
                let ttl = self.history_ttl(topic);
                match &recovered.entries {
                    _ if at.epoch == position.epoch && at.seq == position.seq => {}
                    Some(entries)
                        if at.epoch == position.epoch
                            && super::continuous(
                                entries,
                                at.seq,
                                position.seq,
                                recovered.now_ms,
                                ttl,
                            ) =>
                    {
                        self.observer.gap_filled(entries.len() as u64);
                        for (publication, _) in entries {
                            self.sink.deliver(publication, None);
                        }
                    }
                    _ if at.epoch != position.epoch => {
                        // Back to where the new epoch began, and all of it
                        // after: a subscriber that is in it already (its
                        // own resume got there first) skips nothing.
                        let restarted = recovered.restart_at_epoch_start(ttl);
                        let restart = Position {
                            epoch: position.epoch.clone(),
                            seq: restarted.restart,
                        };
                        self.reset(topic, &restart);
                        for publication in &restarted.publications {
                            self.sink.deliver(publication, None);
                        }
                    }
                    _ => self.reset(topic, &position),
                }
                self.replay_held(topic, held);
            }
            // Read twice (a retry crossed a report): the first one won.
            flow @ (Flow::Live(_) | Flow::Leaving { .. }) => {
                if let Some(watched) = self.topics.get_mut(topic) {
                    watched.flow = flow;
                }
            }
        }
    }

    /// A gap was read from history: delivered if it is all there, else the
    /// subscribers are reset past it.
    fn filled(&mut self, topic: &Topic, upto: u64, publications: Vec<Publication>) {
        tracing::debug!(%topic, upto, n = publications.len(), "filled");
        let Some(Watched {
            flow: Flow::Catching { at, .. },
            ..
        }) = self.topics.get(topic)
        else {
            return;
        };
        let mut at = at.clone();
        let complete = publications.len() as u64 == upto - at.seq
            && publications
                .iter()
                .zip(at.seq + 1..)
                .all(|(p, seq)| p.seq == seq);
        if complete {
            self.observer.gap_filled(publications.len() as u64);
            for publication in &publications {
                self.sink.deliver(publication, None);
            }
        } else {
            self.reset(
                topic,
                &Position {
                    epoch: at.epoch.clone(),
                    seq: upto,
                },
            );
        }
        at.seq = upto;
        at.read_seq = at.read_seq.max(upto);
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        if let Flow::Catching { held, .. } = std::mem::replace(&mut watched.flow, Flow::Live(at)) {
            self.replay_held(topic, held);
        }
    }

    /// Runs what a topic held aside through the merge rule, now that it is
    /// live again (it may catch up again on the way: the rest is held anew).
    fn replay_held(&mut self, topic: &Topic, held: Held) {
        self.held -= held.items.len();
        for announced in held.items {
            self.arrive(topic, announced);
        }
        if let Some(last) = held.overflow {
            self.overflowed(topic, last);
        }
        self.observer.pubsub_backlog(self.held);
    }

    /// After the held announcements: the newest one dropped for want of
    /// room, whose data is only in history.
    fn overflowed(&mut self, topic: &Topic, last: Announced) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        match &mut watched.flow {
            // Catching up again: whatever it reads next covers it, or the
            // next announcement shows the gap.
            Flow::Starting { held, .. } | Flow::Catching { held, .. } => {
                held.overflow = Some(last);
            }
            Flow::Leaving { .. } => {}
            Flow::Live(at) => match decide(at, &last) {
                Decision::Drop => {}
                Decision::Deliver | Decision::Gap => {
                    let (epoch, after) = (at.epoch.clone(), at.seq);
                    watched.flow = Flow::Catching {
                        at: at.clone(),
                        held: Held::default(),
                        reissued: false,
                    };
                    self.fill(topic, &epoch, after, last.seq, Duration::ZERO);
                }
                Decision::NewEpoch | Decision::Reissued => {
                    let position = Position {
                        epoch: last.epoch.clone(),
                        seq: last.seq,
                    };
                    *at = At {
                        epoch: last.epoch,
                        seq: last.seq,
                        read_seq: last.seq,
                        read_clock: last.clock.unwrap_or(0),
                    };
                    self.reset(topic, &position);
                }
            },
        }
    }

    fn history_ttl(&self, topic: &Topic) -> Duration {
        self.namespaces
            .get(topic)
            .map_or(Duration::ZERO, |ns| ns.history_ttl)
    }

    /// A message on the control channel: `disconnect <user hex>`.
    fn control(&self, payload: &[u8]) {
        let user = std::str::from_utf8(payload)
            .ok()
            .and_then(|text| text.strip_prefix("disconnect "))
            .and_then(super::sessions::unhex);
        match user {
            Some(user) => self.sink.disconnect(&user),
            None => tracing::warn!("unreadable message on the control channel"),
        }
    }

    /// A message from the channel: a publication's announcement, or a
    /// control message.
    fn message(&mut self, channel: &str, payload: &[u8]) {
        if channel == self.control_channel {
            self.control(payload);
            return;
        }
        let Some(topic) = self.keys.topic_of_channel(channel) else {
            return;
        };
        let Some(announcement) = parse_payload(payload) else {
            tracing::warn!(channel, "unreadable publication on a herald channel");
            return;
        };
        let lag_ms = now_ms().saturating_sub(announcement.at_ms);
        self.observer.pubsub_lag(lag_ms as f64 / 1000.0);
        if let Some(clock) = announcement.clock {
            self.lineage.saw_clock(clock);
        }
        let Some(watched) = self.topics.get(&topic) else {
            return;
        };
        // One epoch string per topic, not one per announcement.
        let epoch = match &watched.flow {
            Flow::Live(at) | Flow::Catching { at, .. } if *at.epoch == *announcement.epoch => {
                at.epoch.clone()
            }
            _ => Arc::from(announcement.epoch),
        };
        self.arrive(
            &topic,
            Announced {
                epoch,
                seq: announcement.seq,
                clock: announcement.clock,
                traceparent: announcement.traceparent.map(Box::from),
                data: Bytes::copy_from_slice(announcement.data),
            },
        );
    }

    /// An announcement for a watched topic: delivered, held, or the start of
    /// a catch-up.
    fn arrive(&mut self, topic: &Topic, a: Announced) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        let at = match &mut watched.flow {
            Flow::Starting { held, .. } | Flow::Catching { held, .. } => {
                if held.items.len() < MAX_HELD {
                    held.items.push(a);
                    self.held += 1;
                    self.observer.pubsub_backlog(self.held);
                } else {
                    held.overflow = Some(Announced {
                        data: Bytes::new(),
                        ..a
                    });
                }
                return;
            }
            Flow::Leaving { .. } => return,
            Flow::Live(at) => at,
        };
        match decide(at, &a) {
            Decision::Drop => {}
            Decision::Deliver => {
                at.seq = a.seq;
                self.deliver(topic, &a);
            }
            Decision::NewEpoch => {
                // Nothing of the new epoch before `a` was announced here.
                *at = At {
                    epoch: a.epoch.clone(),
                    seq: a.seq,
                    read_seq: a.seq - 1,
                    read_clock: 0,
                };
                self.reset(
                    topic,
                    &Position {
                        epoch: a.epoch.clone(),
                        seq: a.seq - 1,
                    },
                );
                self.deliver(topic, &a);
            }
            Decision::Gap => {
                tracing::debug!(%topic, ?at, seq = a.seq, "gap");
                let (epoch, after) = (at.epoch.clone(), at.seq);
                watched.flow = Flow::Catching {
                    at: at.clone(),
                    held: Held::default(),
                    reissued: false,
                };
                let upto = a.seq - 1;
                self.arrive(topic, a);
                self.fill(topic, &epoch, after, upto, Duration::ZERO);
            }
            Decision::Reissued => {
                tracing::warn!(%topic, epoch = %at.epoch, seq = a.seq, delivered = at.seq, "a seq was issued twice: redis went back in time");
                // Read again, vouching that Redis went back: the topic
                // moves to a new epoch, and its subscribers are reset.
                watched.flow = Flow::Catching {
                    at: at.clone(),
                    held: Held::default(),
                    reissued: true,
                };
                self.read(vec![topic.clone()], Duration::ZERO);
            }
        }
    }

    fn deliver(&self, topic: &Topic, a: &Announced) {
        let publication = Publication {
            topic: topic.clone(),
            epoch: a.epoch.clone(),
            seq: a.seq,
            data: a.data.clone(),
        };
        self.sink.deliver(&publication, a.traceparent.as_deref());
    }

    fn reset(&self, topic: &Topic, position: &Position) {
        tracing::warn!(%topic, epoch = %position.epoch, seq = position.seq, "topic lost continuity; subscribers reset");
        self.observer.topic_reset();
        self.sink.reset(topic, position);
    }

    /// Ends the subscriptions nobody watched for the linger time.
    fn unsubscribe_idle(&mut self, subscriber: &PubSubSink) {
        let linger = self.settings.linger;
        let now = Instant::now();
        let idle: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, w)| {
                w.count == 0
                    && !matches!(w.flow, Flow::Leaving { .. })
                    && w.idle_since
                        .is_some_and(|t| now.duration_since(t) >= linger)
            })
            .map(|(topic, _)| topic.clone())
            .collect();
        self.leave(subscriber, idle);
    }

    /// Unsubscribes `topics` in the background; they are `Leaving` until
    /// Redis confirms it.
    fn leave(&mut self, subscriber: &PubSubSink, topics: Vec<Topic>) {
        if topics.is_empty() {
            return;
        }
        tracing::debug!(?topics, "leaving");
        for topic in &topics {
            if let Some(watched) = self.topics.get_mut(topic) {
                let flow = std::mem::replace(
                    &mut watched.flow,
                    Flow::Leaving {
                        waiters: Vec::new(),
                    },
                );
                if let Flow::Starting { held, .. } | Flow::Catching { held, .. } = flow {
                    self.held -= held.items.len();
                }
            }
        }
        self.observer.pubsub_backlog(self.held);
        let mut subscriber = subscriber.clone();
        let timeout = self.settings.command_timeout;
        let done = self.done.clone();
        let generation = self.generation;
        let keys = self.keys.clone();
        tokio::spawn(async move {
            let channels: Vec<String> = topics.iter().map(|topic| keys.channel(topic)).collect();
            let mut result = Ok(());
            for chunk in channels.chunks(SUBSCRIBE_BATCH) {
                result = tokio::time::timeout(timeout, subscriber.unsubscribe(chunk))
                    .await
                    .unwrap_or_else(|_| Err(timed_out()))
                    .map_err(super::unavailable);
                if result.is_err() {
                    break;
                }
            }
            let _ = done.send(Done::Unsubscribed {
                generation,
                topics,
                result,
            });
        });
    }
}

/// Subscribes `channels`, all batches at once.
async fn subscribe(
    subscriber: &mut PubSubSink,
    channels: &[String],
    settings: &RedisSettings,
    observer: &dyn Observer,
) -> redis::RedisResult<()> {
    let start = std::time::Instant::now();
    let batches = channels.chunks(SUBSCRIBE_BATCH).map(|chunk| {
        let mut subscriber = subscriber.clone();
        async move { subscriber.subscribe(chunk).await }
    });
    let result = tokio::time::timeout(
        settings.command_timeout,
        futures_util::future::try_join_all(batches),
    )
    .await
    .unwrap_or_else(|_| Err(timed_out()))
    .map(drop);
    observer.redis_call("subscribe", start.elapsed().as_secs_f64(), result.is_ok());
    result
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "timed out",
    ))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// An announcement on a topic's channel, parsed.
#[derive(Debug, PartialEq, Eq)]
struct Announcement<'a> {
    seq: u64,
    epoch: &'a str,
    /// When Redis ran the publish, in ms since the epoch.
    at_ms: u64,
    /// The publish's W3C `traceparent`, when it was traced.
    traceparent: Option<&'a str>,
    /// The lineage clock of the publish.
    clock: Option<u64>,
    data: &'a [u8],
}

/// Splits `<seq>:<epoch>:<ms>[;<traceparent>][;c<clock>]:<data>`.
fn parse_payload(payload: &[u8]) -> Option<Announcement<'_>> {
    let mut parts = payload.splitn(4, |b| *b == b':');
    let seq = std::str::from_utf8(parts.next()?).ok()?.parse().ok()?;
    let epoch = std::str::from_utf8(parts.next()?).ok()?;
    let mut stamp = std::str::from_utf8(parts.next()?).ok()?.split(';');
    let at_ms = stamp.next()?.parse().ok()?;
    let mut traceparent = None;
    let mut clock = None;
    for part in stamp {
        match part.strip_prefix('c') {
            Some(c) => clock = Some(c.parse().ok()?),
            None => traceparent = Some(part),
        }
    }
    Some(Announcement {
        seq,
        epoch,
        at_ms,
        traceparent,
        clock,
        data: parts.next()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_pod_waiting_for_redis_tries_at_least_once_a_second() {
        // So that a pod that started without Redis is ready within about a
        // second of Redis coming back, however long it waited.
        let mut backoff = MIN_BACKOFF;
        for _ in 0..50 {
            let wait = jitter(backoff);
            assert!(wait <= Duration::from_secs(1), "{wait:?}");
            assert!(wait >= backoff / 2, "{wait:?}");
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    fn announced(epoch: &Epoch, seq: u64, clock: u64) -> Announced {
        Announced {
            epoch: epoch.clone(),
            seq,
            clock: Some(clock),
            traceparent: None,
            data: Bytes::new(),
        }
    }

    /// Runs announcements through the merge rule as the task does, a gap
    /// filled from `history` (seq `n` has clock `n` there); the seqs
    /// delivered, and whether anything was taken for a rewind.
    fn merge(mut at: At, stream: &[Announced]) -> (Vec<u64>, bool) {
        let mut delivered = Vec::new();
        let mut rewound = false;
        for a in stream {
            match decide(&at, a) {
                Decision::Drop => {}
                Decision::Deliver => {}
                Decision::Gap => delivered.extend(at.seq + 1..a.seq),
                Decision::NewEpoch | Decision::Reissued => {
                    rewound = true;
                    continue;
                }
            }
            if a.seq > at.seq {
                delivered.push(a.seq);
                at.seq = a.seq;
            }
        }
        (delivered, rewound)
    }

    proptest! {
        /// Whatever arrives from before the read (duplicates, in any order
        /// among the live ones' start) and whichever live announcements go
        /// missing, delivery is `read+1 ..= last`, each once, in order.
        #[test]
        fn duplicates_and_gaps_merge_into_one_ordered_stream(
            read in 0u64..50,
            early in proptest::collection::vec(0u64..50, 0..20),
            live in proptest::collection::vec(any::<bool>(), 1..60),
        ) {
            let epoch: Epoch = Arc::from("e1");
            let at = At { epoch: epoch.clone(), seq: read, read_seq: read, read_clock: read };
            let mut stream: Vec<Announced> = early
                .iter()
                .filter(|&&s| s >= 1 && s <= read)
                .map(|&s| announced(&epoch, s, s))
                .collect();
            // Live ones in seq order, some lost on the way (the last kept).
            let last = read + live.len() as u64;
            for (i, kept) in live.iter().enumerate() {
                let seq = read + 1 + i as u64;
                if *kept || seq == last {
                    stream.push(announced(&epoch, seq, seq));
                }
            }
            let (delivered, rewound) = merge(at, &stream);
            prop_assert!(!rewound);
            prop_assert_eq!(delivered, (read + 1..=last).collect::<Vec<_>>());
        }

        /// After Redis went back, a seq at or below what was delivered that
        /// comes again is never delivered, and is taken for what it is when
        /// the channel delivered the first one or it was issued after the
        /// read.
        #[test]
        fn a_seq_issued_again_is_never_delivered_twice(
            read in 0u64..20,
            streamed in 1u64..20,
            back_to in 0u64..40,
            clock_after in any::<bool>(),
        ) {
            let epoch: Epoch = Arc::from("e1");
            let delivered_up_to = read + streamed;
            let at = At {
                epoch: epoch.clone(),
                seq: delivered_up_to,
                read_seq: read,
                read_clock: read,
            };
            let seq = back_to.min(delivered_up_to).max(1);
            let clock = if clock_after { delivered_up_to + 1 } else { seq.min(read) };
            let decision = decide(&at, &announced(&epoch, seq, clock));
            prop_assert!(!matches!(decision, Decision::Deliver | Decision::Gap | Decision::NewEpoch));
            if seq > read || clock_after {
                prop_assert_eq!(decision, Decision::Reissued);
            }
        }
    }

    #[test]
    fn a_straggler_of_a_left_epoch_is_dropped_and_a_newer_epoch_resets() {
        let (old, new): (Epoch, Epoch) = (Arc::from("old"), Arc::from("new"));
        let at = At {
            epoch: new.clone(),
            seq: 5,
            read_seq: 5,
            read_clock: 100,
        };
        assert_eq!(decide(&at, &announced(&old, 9, 90)), Decision::Drop);
        assert_eq!(decide(&at, &announced(&old, 1, 101)), Decision::NewEpoch);
        let unknown_clock = Announced {
            clock: None,
            ..announced(&old, 9, 0)
        };
        assert_eq!(decide(&at, &unknown_clock), Decision::NewEpoch);
    }

    #[test]
    fn payloads_split_at_the_first_three_colons() {
        assert_eq!(
            parse_payload(b"42:9f3c:1700000000000:{\"a\":\"b:c\"}"),
            Some(Announcement {
                seq: 42,
                epoch: "9f3c",
                at_ms: 1_700_000_000_000,
                traceparent: None,
                clock: None,
                data: &b"{\"a\":\"b:c\"}"[..],
            })
        );
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let traced = format!("7:9f3c:1700000000000;{tp};c12:[1]");
        assert_eq!(
            parse_payload(traced.as_bytes()),
            Some(Announcement {
                seq: 7,
                epoch: "9f3c",
                at_ms: 1_700_000_000_000,
                traceparent: Some(tp),
                clock: Some(12),
                data: &b"[1]"[..],
            })
        );
        assert_eq!(parse_payload(b"x:9f3c:1:{}"), None);
    }
}
