//! The pod's pub/sub connections, and the order of what they deliver.
//!
//! One task owns the connections and, per watched topic, where delivery
//! stands ([`Flow`]). It never waits for Redis itself: reading the
//! connections is separate from every round trip. Subscribing, reading a new
//! topic's position, filling a gap from history and resyncing after a
//! reconnect run as their own tasks and report back ([`Done`]); meanwhile
//! that topic's announcements are held aside (at most [`MAX_HELD`]; past that
//! they are read from history afterwards), and every other topic keeps
//! flowing.
//!
//! A publication arrives in seq order; one already delivered is dropped; a
//! jump is filled from history (or, where history cannot, the topic's
//! subscribers get `reset`); a seq issued a second time in its epoch proves
//! that Redis went back in time, and moves the topic to a new epoch.
//!
//! **Links.** One Redis (or Sentinel's master) is one connection, a
//! [`Link`], with `SUBSCRIBE`. A Redis Cluster is a link per master, each
//! with `SSUBSCRIBE` (sharded pub/sub, Redis 7) of only the topics of its
//! slots that the pod watches, so that a publication reaches only the pods
//! that watch it. Links speak RESP3: every message is a push, taken from
//! the parser without a copy. When a link drops, for whatever reason (Redis
//! restarted, failed over, `CLIENT KILL`, the output buffer limit), the task
//! reconnects it with backoff and jitter, subscribes its topics again and
//! reads what was published meanwhile, in pipelines of [`READ_BATCH`]
//! topics. A topic watched meanwhile waits for that reconnect; only once an
//! attempt has failed (Redis is away) is a new watch refused at once.
//!
//! **Following a cluster.** Every [`MAP_CHECK`], after a link drops and when
//! a master unsubscribes a topic by itself (its slot migrated away), the task
//! reads the slot map again; a topic whose slot has another master now moves
//! to that master's link: subscribed there, then read (a catch-up from where
//! it stood, so nothing published meanwhile is lost and nothing delivered
//! twice), and unsubscribed at the old one. A reset comes only where the
//! cluster really lost data (a failover to a replica that lagged: the slot's
//! lineage tells).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use backoff::Backoff;
use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::connection::Connector;
use super::lineage::Lineage;
use super::reach::Reach;
use super::scripts::Keys;
use super::shards::Shards;
use super::{Recovered, RedisSettings, Vouch, parse_entries, read_many, slots, timed};
use crate::observe::Observer;
use crate::{BrokerError, Deliver, Epoch, Namespaces, Position, Publication, Since, Topic};

/// Channels per pipeline of `SUBSCRIBE` or `UNSUBSCRIBE` commands.
const SUBSCRIBE_BATCH: usize = 500;
/// Topics per pipeline of position reads.
const READ_BATCH: usize = 500;
/// Announcements one topic holds aside while its history is read.
pub const MAX_HELD: usize = 1024;
/// The waits before a link's reconnects: up to 100 ms at first, doubling
/// per failed attempt, at random (full jitter), so that pods do not
/// reconnect in lockstep. The cap is short, so that a pod that waits for
/// Redis (at start: not ready) is back within about a second of Redis: an
/// attempt a second per pod costs Redis nothing.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// The pause before a failed read of history is tried again, and the task's
/// tick for due reconnects.
const MIN_BACKOFF: Duration = RECONNECT.first;
/// How often a cluster's slot map is read again, besides when something
/// says it changed.
const MAP_CHECK: Duration = Duration::from_secs(1);

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
    /// The link it is (to be) subscribed on.
    link: usize,
    flow: Flow,
}

/// Where a topic's delivery stands.
enum Flow {
    /// Subscribing, then reading the position; the watches wait for it.
    Starting { waiters: Vec<Reply>, held: Held },
    /// Delivered up to `at`: announcements go straight to the sink.
    Live(At),
    /// Subscribing again (its link came back, or it moved to another
    /// master's), then reading what came after `at`; `sent` while the
    /// subscribe is under way.
    Resubscribing { at: At, held: Held, sent: bool },
    /// Reading history after `at` (a gap, a reconnect, a seq issued twice:
    /// `reissued`, and the read tells Redis that it went back in time).
    Catching { at: At, held: Held, reissued: bool },
    /// Unsubscribing after the linger. A watch that comes meanwhile waits
    /// for the unsubscribe to be confirmed before it subscribes again:
    /// sent in the other order, the two would leave the topic unsubscribed.
    Leaving { waiters: Vec<Reply> },
}

impl Flow {
    /// The flow, leaving a stand-in (that allocates nothing) to be replaced.
    fn take(&mut self) -> Self {
        std::mem::replace(
            self,
            Self::Leaving {
                waiters: Vec::new(),
            },
        )
    }

    fn held(&mut self) -> Option<&mut Held> {
        match self {
            Self::Starting { held, .. }
            | Self::Resubscribing { held, .. }
            | Self::Catching { held, .. } => Some(held),
            Self::Live(_) | Self::Leaving { .. } => None,
        }
    }
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

/// What a task that talked to Redis reports back. `link` and `generation`
/// name the connection it was started on: a report about an earlier one (or
/// about a topic that has moved to another link) is ignored.
enum Done {
    Connected {
        link: usize,
        generation: u64,
        result: redis::RedisResult<MultiplexedConnection>,
    },
    Subscribed {
        link: usize,
        generation: u64,
        topics: Vec<Topic>,
        result: Result<Vec<Subscription>, BrokerError>,
    },
    Read {
        link: usize,
        generation: u64,
        topics: Vec<Topic>,
        result: Result<Vec<Recovered>, BrokerError>,
    },
    Filled {
        link: usize,
        generation: u64,
        topic: Topic,
        upto: u64,
        result: Result<Vec<Publication>, BrokerError>,
    },
    Unsubscribed {
        link: usize,
        generation: u64,
        topics: Vec<Topic>,
        result: Result<(), BrokerError>,
    },
    /// The cluster's slot map was read.
    Mapped(Result<(), BrokerError>),
}

/// How Redis answered the subscribe of one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Subscription {
    Confirmed,
    /// Another master serves its slot now (`MOVED`): read the map again.
    Elsewhere,
}

/// One pub/sub connection: to the one Redis, or to a cluster's master.
struct Link {
    /// `host:port` of its master; empty for the one Redis.
    address: String,
    /// Counts its connections: which one a [`Done`] or a push belongs to.
    generation: u64,
    state: LinkState,
    /// Failed attempts to connect since it was last up: the next wait's
    /// attempt number for [`RECONNECT`].
    failures: u32,
    /// Why its last attempt to connect failed; `None` once it was up since.
    last_error: Option<String>,
}

impl Link {
    /// Whether a new topic may wait for this link: it is up, connecting, or
    /// down only because its connection was lost (its reconnect is due
    /// within a tick or two, and nothing says Redis is away: a resume right
    /// after Redis restarted must not be told to come back for the pod's
    /// stale socket). A link whose last attempt failed refuses at once:
    /// Redis is away, and the caller is better told now.
    fn takes_watches(&self) -> bool {
        !matches!(self.state, LinkState::Down { .. }) || self.last_error.is_none()
    }
}

enum LinkState {
    /// Connecting again at `retry_at` (or when a topic needs it).
    Down {
        retry_at: Instant,
    },
    Connecting,
    Up(MultiplexedConnection),
}

/// A push from a link's connection, with where it came from.
type Push = (usize, u64, PushInfo);

pub struct Pubsub {
    client: Connector,
    shards: Shards,
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
    /// The link the control channel is subscribed on (`SUBSCRIBE`: in a
    /// cluster, every node hears every `PUBLISH`).
    control: Option<usize>,
    topics: HashMap<Topic, Watched>,
    links: Vec<Link>,
    done: mpsc::UnboundedSender<Done>,
    reports: mpsc::UnboundedReceiver<Done>,
    push_sender: mpsc::UnboundedSender<Push>,
    pushes: mpsc::UnboundedReceiver<Push>,
    /// A read of the cluster's map is under way, or wanted.
    mapping: bool,
    map_wanted: bool,
    /// Announcements held over all topics.
    held: usize,
}

impl Pubsub {
    // One argument per part it shares with the broker.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Connector,
        shards: Shards,
        sink: Arc<dyn Deliver>,
        observer: Arc<dyn Observer>,
        lineage: Arc<Lineage>,
        namespaces: Arc<Namespaces>,
        settings: RedisSettings,
        reach: Arc<Reach>,
    ) -> Self {
        let (done, reports) = mpsc::unbounded_channel();
        let (push_sender, pushes) = mpsc::unbounded_channel();
        let keys = Keys::new(&settings.prefix, shards.is_cluster());
        Self {
            control_channel: keys.control_channel(),
            keys,
            reach,
            client,
            shards,
            sink,
            observer,
            lineage,
            namespaces,
            settings,
            control: None,
            topics: HashMap::new(),
            links: Vec::new(),
            done,
            reports,
            push_sender,
            pushes,
            mapping: false,
            map_wanted: false,
            held: 0,
        }
    }
}

pub async fn run(mut ps: Pubsub, mut commands: mpsc::UnboundedReceiver<Command>) {
    // The control channel's link first: its connection decides readiness.
    let control = ps.link_for(&ps.control_channel.clone());
    ps.control = control;
    let mut ticks = tokio::time::interval(MIN_BACKOFF);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_linger = Instant::now();
    let mut last_map = Instant::now();
    loop {
        tokio::select! {
            command = commands.recv() => {
                let Some(command) = command else { return };
                let mut batch = vec![command];
                while let Ok(more) = commands.try_recv() {
                    batch.push(more);
                }
                ps.command(batch);
            }
            Some(push) = ps.pushes.recv() => ps.push(push),
            Some(done) = ps.reports.recv() => ps.done(done),
            _ = ticks.tick() => {
                let now = Instant::now();
                ps.reconnect_due(now);
                let linger = ps.settings.linger.max(MIN_BACKOFF);
                if now.duration_since(last_linger) >= linger {
                    last_linger = now;
                    ps.unsubscribe_idle();
                }
                if ps.shards.is_cluster() && now.duration_since(last_map) >= MAP_CHECK {
                    last_map = now;
                    ps.read_map();
                }
                ps.resubscribe_waiting();
            }
        }
    }
}

impl Pubsub {
    /// The link for `channel`: the one Redis's, or its slot's master's
    /// (made, and connecting, if new); `None` while the cluster's map has no
    /// master for it.
    fn link_for(&mut self, channel: &str) -> Option<usize> {
        let address = if self.shards.is_cluster() {
            let slot = slots::slot(channel.as_bytes());
            self.shards.map().master(slot)?.to_owned()
        } else {
            String::new()
        };
        if let Some(i) = self.links.iter().position(|l| l.address == address) {
            return Some(i);
        }
        Some(self.add_link(address))
    }

    /// A new link to `address`, connecting.
    fn add_link(&mut self, address: String) -> usize {
        self.links.push(Link {
            address,
            generation: 0,
            state: LinkState::Down {
                retry_at: Instant::now(),
            },
            failures: 0,
            last_error: None,
        });
        let link = self.links.len() - 1;
        self.connect(link);
        link
    }

    /// Connects `link` in the background (a [`Done::Connected`] follows).
    fn connect(&mut self, link: usize) {
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        if !matches!(l.state, LinkState::Down { .. }) {
            return;
        }
        l.generation += 1;
        l.state = LinkState::Connecting;
        let generation = l.generation;
        let connector = if l.address.is_empty() {
            Some(self.client.clone())
        } else {
            self.shards.connector(&l.address)
        };
        let pushes = self.push_sender.clone();
        let done = self.done.clone();
        let timeout = self.settings.command_timeout;
        tokio::spawn(async move {
            let result = match connector {
                Some(connector) => {
                    let sender = move |info: PushInfo| pushes.send((link, generation, info));
                    tokio::time::timeout(timeout, connector.pubsub_link(sender))
                        .await
                        .unwrap_or_else(|_| Err(timed_out()))
                }
                None => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "a cluster node address that is not host:port",
                ))),
            };
            let _ = done.send(Done::Connected {
                link,
                generation,
                result,
            });
        });
    }

    /// Connects again the links whose backoff has passed, and those that
    /// topics wait for.
    fn reconnect_due(&mut self, now: Instant) {
        let map = self.shards.map();
        let due: Vec<usize> = (0..self.links.len())
            .filter(
                |&i| matches!(self.links[i].state, LinkState::Down { retry_at } if retry_at <= now),
            )
            // A link still of use: the control channel's, a master's (a
            // former master's only while topics wait on it).
            .filter(|&i| {
                Some(i) == self.control
                    || map.masters.contains(&self.links[i].address)
                    || self.topics.values().any(|w| w.link == i)
            })
            .collect();
        for link in due {
            self.connect(link);
        }
    }

    /// The connection of `link` and its generation, while it is up.
    fn up(&self, link: usize) -> Option<(MultiplexedConnection, u64)> {
        match self.links.get(link)? {
            Link {
                state: LinkState::Up(conn),
                generation,
                ..
            } => Some((conn.clone(), *generation)),
            _ => None,
        }
    }

    fn is_up(&self, link: usize) -> bool {
        matches!(
            self.links.get(link).map(|l| &l.state),
            Some(LinkState::Up(_))
        )
    }

    /// A link connected, or failed to.
    fn connected(&mut self, link: usize, result: redis::RedisResult<MultiplexedConnection>) {
        let is_control = Some(link) == self.control;
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        let conn = match result {
            Ok(conn) => conn,
            Err(e) => {
                let error = e.to_string();
                // Once a second while Redis is away: said again only when
                // the reason changes (`/readyz` and the metrics say it meanwhile).
                let retry_in = RECONNECT.delay(l.failures);
                if !RECONNECT.capped(l.failures) || l.last_error.as_deref() != Some(error.as_str())
                {
                    tracing::warn!(%error, node = %l.address, ?retry_in, "redis pub/sub connection failed");
                } else {
                    tracing::debug!(%error, node = %l.address, ?retry_in, "redis pub/sub connection failed");
                }
                l.state = LinkState::Down {
                    retry_at: Instant::now() + retry_in,
                };
                l.failures = l.failures.saturating_add(1);
                l.last_error = Some(error.clone());
                if is_control {
                    self.reach.down(&error);
                }
                // Watches that waited for it fail (their callers may try
                // again); the link is tried again after its backoff.
                let waiting: Vec<Topic> = self
                    .topics
                    .iter()
                    .filter(|(_, w)| w.link == link && matches!(w.flow, Flow::Starting { .. }))
                    .map(|(topic, _)| topic.clone())
                    .collect();
                for topic in waiting {
                    self.drop_pending(&topic, "redis pub/sub is reconnecting");
                }
                self.want_map();
                return;
            }
        };
        l.state = LinkState::Up(conn);
        l.failures = 0;
        l.last_error = None;
        // Everything this link had: subscribed again (all batches at once),
        // then read from where it stood.
        let mut again = Vec::new();
        for (topic, watched) in &mut self.topics {
            if watched.link != link {
                continue;
            }
            let flow = watched.flow.take();
            watched.flow = match flow {
                Flow::Live(at) => Flow::Resubscribing {
                    at,
                    held: Held::default(),
                    sent: true,
                },
                Flow::Resubscribing { at, held, .. } => Flow::Resubscribing {
                    at,
                    held,
                    sent: true,
                },
                other => other,
            };
            // Starting: watched while the link was connecting.
            if matches!(
                watched.flow,
                Flow::Resubscribing { .. } | Flow::Starting { .. }
            ) {
                again.push(topic.clone());
            }
        }
        let control = is_control.then(|| self.control_channel.clone());
        self.subscribe(link, again, control);
    }

    /// A link's connection is gone (or is dropped: a subscribe or unsubscribe
    /// failed): watches still starting on it fail (their callers may try
    /// again), its other topics are subscribed and read again once it is
    /// back (or at their slot's new master).
    fn link_lost(&mut self, link: usize, why: &str) {
        let is_control = Some(link) == self.control;
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        if !matches!(l.state, LinkState::Up(_)) {
            return;
        }
        l.generation += 1;
        l.state = LinkState::Down {
            retry_at: Instant::now() + RECONNECT.delay(0),
        };
        let node = l.address.clone();
        let on_link: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, w)| w.link == link)
            .map(|(t, _)| t.clone())
            .collect();
        tracing::warn!(
            topics = on_link.len(),
            %node,
            "redis pub/sub connection lost ({why}); reconnecting"
        );
        for topic in on_link {
            self.drop_pending(&topic, "redis pub/sub connection lost");
        }
        if is_control {
            self.observer.pubsub_up(false);
            self.reach.down("the pub/sub connection was lost");
        }
        self.observer.pubsub_backlog(self.held);
        self.want_map();
    }

    /// A topic whose link went away (or whose slot moved): a start or a
    /// leave fails (the topic is forgotten), anything else waits to be
    /// subscribed again and to catch up from where it stood.
    fn drop_pending(&mut self, topic: &Topic, why: &str) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        let mut flow = watched.flow.take();
        if let Some(held) = flow.held() {
            self.held -= held.items.len();
        }
        match flow {
            Flow::Live(at) | Flow::Resubscribing { at, .. } | Flow::Catching { at, .. } => {
                watched.flow = Flow::Resubscribing {
                    at,
                    held: Held::default(),
                    sent: false,
                };
            }
            Flow::Starting { waiters, .. } | Flow::Leaving { waiters } => {
                self.topics.remove(topic);
                for reply in waiters {
                    let _ = reply.send(Err(BrokerError::Unavailable(why.into())));
                }
            }
        }
    }

    /// A push from a link: a message, an unsubscribe Redis sent by itself,
    /// the connection's end.
    fn push(&mut self, (link, generation, push): Push) {
        if self
            .links
            .get(link)
            .is_none_or(|l| l.generation != generation)
        {
            return;
        }
        let PushInfo { kind, mut data } = push;
        match kind {
            PushKind::Message | PushKind::SMessage => {
                let (Some(Value::BulkString(payload)), Some(Value::BulkString(channel))) =
                    (data.pop(), data.pop())
                else {
                    return;
                };
                match std::str::from_utf8(&channel) {
                    Ok(channel) => self.message(channel, Bytes::from(payload)),
                    Err(_) => tracing::warn!("a message on a channel whose name is not UTF-8"),
                }
            }
            PushKind::Disconnection => self.link_lost(link, "disconnected"),
            PushKind::SUnsubscribe | PushKind::Unsubscribe => {
                // Our own unsubscribes are confirmed here too (a topic that
                // is leaving); any other is Redis's: the topic's slot moved
                // to another master.
                let Some(Value::BulkString(channel)) = data.first() else {
                    return;
                };
                let Some(topic) = std::str::from_utf8(channel)
                    .ok()
                    .and_then(|c| self.keys.topic_of_channel(c))
                else {
                    return;
                };
                if let Some(watched) = self.topics.get(&topic)
                    && watched.link == link
                    && !matches!(watched.flow, Flow::Leaving { .. } | Flow::Starting { .. })
                {
                    tracing::info!(%topic, "redis unsubscribed a topic (its slot moved); following it");
                    self.drop_pending(&topic, "its slot moved");
                    self.want_map();
                }
            }
            _ => {}
        }
    }

    /// Asks for the cluster's map to be read again (soon, once).
    fn want_map(&mut self) {
        if self.shards.is_cluster() {
            self.map_wanted = true;
            self.read_map();
        }
    }

    /// Reads the cluster's map in the background (a [`Done::Mapped`]
    /// follows), unless a read is under way.
    fn read_map(&mut self) {
        if self.mapping || !self.shards.is_cluster() {
            return;
        }
        self.mapping = true;
        self.map_wanted = false;
        let shards = self.shards.clone();
        let done = self.done.clone();
        tokio::spawn(async move {
            let result = shards.refresh().await.map_err(super::unavailable);
            let _ = done.send(Done::Mapped(result));
        });
    }

    /// The map was read: every topic (and the control channel) whose slot
    /// has another master now moves to that master's link.
    fn mapped(&mut self) {
        // A link to every master, before any topic needs it.
        for master in &self.shards.map().masters {
            if !self.links.iter().any(|l| l.address == *master) {
                self.add_link(master.clone());
            }
        }
        let control = self.control_channel.clone();
        if let Some(link) = self.link_for(&control)
            && Some(link) != self.control
        {
            let old = self.control.replace(link);
            tracing::info!(node = %self.links[link].address, "the control channel moves");
            if let Some(old) = old {
                self.unsubscribe_channels(old, vec![control.clone()]);
            }
            if self.is_up(link) {
                self.subscribe(link, Vec::new(), Some(control));
            }
        }
        let topics: Vec<Topic> = self.topics.keys().cloned().collect();
        let mut moved: HashMap<usize, Vec<Topic>> = HashMap::new();
        for topic in topics {
            let Some(link) = self.link_for(&self.keys.channel(&topic)) else {
                continue;
            };
            let Some(watched) = self.topics.get_mut(&topic) else {
                continue;
            };
            if watched.link == link
                || matches!(watched.flow, Flow::Starting { .. } | Flow::Leaving { .. })
            {
                continue;
            }
            let old = std::mem::replace(&mut watched.link, link);
            tracing::info!(%topic, node = %self.links[link].address, "a topic moves to its slot's new master");
            moved.entry(old).or_default().push(topic.clone());
            self.drop_pending(&topic, "its slot moved");
        }
        for (old, topics) in moved {
            let channels = topics.iter().map(|t| self.keys.channel(t)).collect();
            self.unsubscribe_channels(old, channels);
        }
        self.resubscribe_waiting();
    }

    /// Subscribes the topics that wait for it on links that are up (the
    /// others are subscribed when their link comes back: see
    /// [`Pubsub::reconnect_due`]).
    fn resubscribe_waiting(&mut self) {
        let mut by_link: HashMap<usize, Vec<Topic>> = HashMap::new();
        for (topic, watched) in &mut self.topics {
            if let Flow::Resubscribing { sent, .. } = &mut watched.flow
                && !*sent
                && matches!(
                    self.links.get(watched.link).map(|l| &l.state),
                    Some(LinkState::Up(_))
                )
            {
                *sent = true;
                by_link.entry(watched.link).or_default().push(topic.clone());
            }
        }
        for (link, topics) in by_link {
            self.subscribe(link, topics, None);
        }
    }

    /// Handles watches and unwatches that arrived together: new topics are
    /// subscribed in one pipeline per link, then their positions read.
    fn command(&mut self, batch: Vec<Command>) {
        let mut new: HashMap<usize, Vec<Topic>> = HashMap::new();
        for command in batch {
            match command {
                Command::Unwatch(topic) => self.release(&topic),
                Command::Watch(topic, reply) => match self.topics.get_mut(&topic) {
                    Some(watched) => {
                        watched.count += 1;
                        watched.idle_since = None;
                        match &mut watched.flow {
                            Flow::Starting { waiters, .. } | Flow::Leaving { waiters } => {
                                waiters.push(reply)
                            }
                            // Subscribed, or being subscribed again: what is
                            // published from now on reaches the sink.
                            Flow::Live(_) | Flow::Catching { .. } | Flow::Resubscribing { .. } => {
                                if reply.send(Ok(())).is_err() {
                                    self.release(&topic);
                                }
                            }
                        }
                    }
                    None => {
                        let channel = self.keys.channel(&topic);
                        // A link that is connecting, or lost and about to
                        // reconnect, subscribes it when it is up; one that
                        // failed to connect refuses it.
                        let link = match self.link_for(&channel) {
                            Some(link) if self.links[link].takes_watches() => link,
                            _ => {
                                self.want_map();
                                let _ = reply.send(Err(BrokerError::Unavailable(
                                    "redis pub/sub is reconnecting".into(),
                                )));
                                continue;
                            }
                        };
                        self.topics.insert(
                            topic.clone(),
                            Watched {
                                count: 1,
                                idle_since: None,
                                link,
                                flow: Flow::Starting {
                                    waiters: vec![reply],
                                    held: Held::default(),
                                },
                            },
                        );
                        if self.is_up(link) {
                            new.entry(link).or_default().push(topic);
                        }
                    }
                },
            }
        }
        for (link, topics) in new {
            self.subscribe(link, topics, None);
        }
    }

    /// One watch fewer.
    fn release(&mut self, topic: &Topic) {
        if let Some(watched) = self.topics.get_mut(topic) {
            watched.count = watched.count.saturating_sub(1);
            if watched.count == 0 {
                watched.idle_since = Some(Instant::now());
            }
        }
    }

    /// Subscribes `topics` (and `control`, the control channel) on `link`,
    /// in the background.
    fn subscribe(&self, link: usize, topics: Vec<Topic>, control: Option<String>) {
        let Some((mut conn, generation)) = self.up(link) else {
            return;
        };
        if topics.is_empty() && control.is_none() {
            return;
        }
        let sharded = self.shards.is_cluster();
        let channels: Vec<String> = topics.iter().map(|t| self.keys.channel(t)).collect();
        let (observer, done) = (self.observer.clone(), self.done.clone());
        let timeout = self.settings.command_timeout;
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            let subscribing = async {
                if let Some(control) = &control {
                    // The control channel is not a shard channel.
                    let confirmed =
                        confirm(&mut conn, "SUBSCRIBE", std::slice::from_ref(control)).await?;
                    if confirmed.first() != Some(&Subscription::Confirmed) {
                        return Err(broken("the control channel's subscribe was not confirmed"));
                    }
                }
                let command = if sharded { "SSUBSCRIBE" } else { "SUBSCRIBE" };
                let mut outcomes = Vec::with_capacity(channels.len());
                for chunk in channels.chunks(SUBSCRIBE_BATCH) {
                    outcomes.extend(confirm(&mut conn, command, chunk).await?);
                }
                Ok(outcomes)
            };
            let result = tokio::time::timeout(timeout, subscribing)
                .await
                .unwrap_or_else(|_| Err(timed_out()));
            observer.redis_call("subscribe", start.elapsed().as_secs_f64(), result.is_ok());
            let _ = done.send(Done::Subscribed {
                link,
                generation,
                topics,
                result: result.map_err(super::unavailable),
            });
        });
    }

    /// Reads the positions of `topics` on `link` (each as its flow needs: a
    /// start without `since`, a catch-up after where it stands), in one
    /// pipeline per master, after `delay`.
    fn read(&self, link: usize, topics: Vec<Topic>, delay: Duration) {
        let Some(generation) = self.links.get(link).map(|l| l.generation) else {
            return;
        };
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
        let shards = self.shards.clone();
        let observer = self.observer.clone();
        let lineage = self.lineage.clone();
        let done = self.done.clone();
        let bound = self.settings.command_timeout * 2;
        let keys = self.keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let reading = read_many(&keys, &shards, &*observer, &lineage, &reads);
            let result = tokio::time::timeout(bound, reading)
                .await
                .unwrap_or_else(|_| {
                    tracing::warn!(topics = reads.len(), "reading topics from redis timed out");
                    Err(BrokerError::Unavailable("redis: timed out".into()))
                });
            let _ = done.send(Done::Read {
                link,
                generation,
                topics,
                result,
            });
        });
    }

    /// Reads `after+1 ..= upto` of `epoch` from history.
    fn fill(&self, topic: &Topic, epoch: &Epoch, after: u64, upto: u64, delay: Duration) {
        let Some(link) = self.topics.get(topic).map(|w| w.link) else {
            return;
        };
        let Some(generation) = self.links.get(link).map(|l| l.generation) else {
            return;
        };
        let shards = self.shards.clone();
        let observer = self.observer.clone();
        let done = self.done.clone();
        let topic = topic.clone();
        let epoch = epoch.clone();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let history = keys.history(&topic);
            let mut range = redis::cmd("XRANGE");
            range
                .arg(&history)
                .arg(format!("{}-0", after + 1))
                .arg(format!("{upto}-0"));
            let result = timed(
                &*observer,
                "fill",
                shards.command::<Value>(&history, &range),
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
                link,
                generation,
                topic,
                upto,
                result,
            });
        });
    }

    /// Whether `generation` is no longer `link`'s connection.
    fn stale(&self, link: usize, generation: u64) -> bool {
        self.links
            .get(link)
            .is_none_or(|l| l.generation != generation)
    }

    /// Whether a report from `link`'s connection `generation` about `topic`
    /// still applies: the link has not reconnected since, and the topic is
    /// still on it.
    fn current(&self, link: usize, generation: u64, topic: &Topic) -> bool {
        self.links
            .get(link)
            .is_some_and(|l| l.generation == generation)
            && self.topics.get(topic).is_some_and(|w| w.link == link)
    }

    /// A report from Redis work.
    fn done(&mut self, done: Done) {
        match done {
            Done::Connected {
                link,
                generation,
                result,
            } => {
                if self
                    .links
                    .get(link)
                    .is_some_and(|l| l.generation == generation)
                {
                    self.connected(link, result);
                }
            }
            Done::Mapped(result) => {
                self.mapping = false;
                match result {
                    Ok(()) => self.mapped(),
                    Err(e) => {
                        tracing::warn!(error = %e, "reading the redis cluster's slot map failed");
                        if self.control.is_none() {
                            // Not even the map yet: `/readyz` says why.
                            self.reach.down(&e.to_string());
                        }
                    }
                }
                if self.map_wanted {
                    self.read_map();
                }
            }
            Done::Subscribed {
                link,
                generation,
                topics,
                result,
            } => {
                if self.stale(link, generation) {
                    return;
                }
                match result {
                    Ok(outcomes) => self.subscribed(link, topics, outcomes),
                    Err(e) => {
                        tracing::warn!(error = %e, "redis subscribe failed");
                        self.link_lost(link, "a subscribe failed");
                    }
                }
            }
            Done::Unsubscribed {
                link,
                generation,
                topics,
                result,
            } => {
                if self.stale(link, generation) {
                    return;
                }
                tracing::debug!(?topics, ?result, "unsubscribed");
                if let Err(e) = result {
                    tracing::warn!(error = %e, "redis unsubscribe failed");
                    self.link_lost(link, "an unsubscribe failed");
                    return;
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
                self.subscribe(link, again, None);
            }
            Done::Read {
                link,
                generation,
                topics,
                result,
            } => {
                let topics: Vec<Topic> = topics
                    .into_iter()
                    .filter(|t| self.current(link, generation, t))
                    .collect();
                match result {
                    Ok(reads) => {
                        for (topic, recovered) in topics.into_iter().zip(reads) {
                            self.positioned(&topic, recovered);
                        }
                    }
                    Err(e) => self.read_failed(link, topics, e),
                }
            }
            Done::Filled {
                link,
                generation,
                topic,
                upto,
                result,
            } => {
                if !self.current(link, generation, &topic) {
                    return;
                }
                match result {
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
                }
            }
        }
    }

    /// A subscribe was answered: starting topics read their position, those
    /// subscribed again catch up; a topic whose slot moved waits for the map.
    fn subscribed(&mut self, link: usize, topics: Vec<Topic>, outcomes: Vec<Subscription>) {
        if Some(link) == self.control && !self.reach.connected() {
            self.observer.pubsub_up(true);
            self.reach.up();
        }
        tracing::debug!(?topics, "subscribed");
        let mut reads = Vec::new();
        let mut elsewhere = false;
        for (topic, outcome) in topics.into_iter().zip(outcomes) {
            let Some(watched) = self.topics.get_mut(&topic) else {
                continue;
            };
            if watched.link != link {
                continue;
            }
            if outcome == Subscription::Elsewhere {
                elsewhere = true;
                self.drop_pending(&topic, "its slot moved");
                continue;
            }
            let flow = watched.flow.take();
            watched.flow = match flow {
                Flow::Resubscribing { at, held, .. } => {
                    reads.push(topic);
                    Flow::Catching {
                        at,
                        held,
                        reissued: false,
                    }
                }
                flow @ Flow::Starting { .. } => {
                    reads.push(topic);
                    flow
                }
                other => other,
            };
        }
        for batch in reads.chunks(READ_BATCH) {
            self.read(link, batch.to_vec(), Duration::ZERO);
        }
        if elsewhere {
            self.want_map();
        }
    }

    /// A read failed: new watches fail (their callers may try again), a
    /// catch-up is tried again.
    fn read_failed(&mut self, link: usize, topics: Vec<Topic>, e: BrokerError) {
        let mut retry = Vec::new();
        let mut abandoned = Vec::new();
        for topic in topics {
            match self
                .topics
                .get_mut(&topic)
                .map(|w| (&mut w.count, &mut w.flow))
            {
                Some((count, Flow::Starting { waiters, .. })) => {
                    *count = 0;
                    for reply in waiters.drain(..) {
                        let _ = reply.send(Err(e.clone()));
                    }
                    abandoned.push(topic);
                }
                Some((_, Flow::Catching { .. })) => retry.push(topic),
                _ => {}
            }
        }
        if !retry.is_empty() {
            tracing::warn!(error = %e, topics = retry.len(), "reading topics after a reconnect failed; retrying");
            self.read(link, retry, MIN_BACKOFF);
        }
        self.leave(abandoned);
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
                    self.release(topic);
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
            flow @ (Flow::Live(_) | Flow::Leaving { .. } | Flow::Resubscribing { .. }) => {
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
            Flow::Starting { held, .. }
            | Flow::Resubscribing { held, .. }
            | Flow::Catching { held, .. } => {
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
    fn message(&mut self, channel: &str, payload: Bytes) {
        if channel == self.control_channel {
            self.control(&payload);
            return;
        }
        let Some(topic) = self.keys.topic_of_channel(channel) else {
            return;
        };
        if payload.first() == Some(&b'+') {
            let Some(records) = split_batch(&payload) else {
                tracing::warn!(
                    channel,
                    "unreadable batch of publications on a herald channel"
                );
                return;
            };
            for record in records {
                self.announcement(channel, &topic, payload.slice_ref(record));
            }
        } else {
            self.announcement(channel, &topic, payload);
        }
    }

    /// One announcement of `topic`'s, parsed and run through the merge rule.
    fn announcement(&mut self, channel: &str, topic: &Topic, payload: Bytes) {
        let Some(announcement) = parse_payload(&payload) else {
            tracing::warn!(channel, "unreadable publication on a herald channel");
            return;
        };
        let lag_ms = now_ms().saturating_sub(announcement.at_ms);
        self.observer.pubsub_lag(lag_ms as f64 / 1000.0);
        if let Some(clock) = announcement.clock {
            self.lineage.saw_clock(self.keys.slot(topic), clock);
        }
        let Some(watched) = self.topics.get(topic) else {
            return;
        };
        // One epoch string per topic, not one per announcement.
        let epoch = match &watched.flow {
            Flow::Live(at) | Flow::Catching { at, .. } | Flow::Resubscribing { at, .. }
                if *at.epoch == *announcement.epoch =>
            {
                at.epoch.clone()
            }
            _ => Arc::from(announcement.epoch),
        };
        self.arrive(
            topic,
            Announced {
                epoch,
                seq: announcement.seq,
                clock: announcement.clock,
                traceparent: announcement.traceparent.map(Box::from),
                // A view into the payload the parser read: no copy.
                data: payload.slice_ref(announcement.data),
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
            Flow::Starting { held, .. }
            | Flow::Resubscribing { held, .. }
            | Flow::Catching { held, .. } => {
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
                let link = watched.link;
                watched.flow = Flow::Catching {
                    at: at.clone(),
                    held: Held::default(),
                    reissued: true,
                };
                self.read(link, vec![topic.clone()], Duration::ZERO);
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
    fn unsubscribe_idle(&mut self) {
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
        self.leave(idle);
    }

    /// Unsubscribes `topics` in the background; they are `Leaving` until
    /// Redis confirms it. A topic on a link that is down is forgotten at
    /// once (there is no subscription to end).
    fn leave(&mut self, topics: Vec<Topic>) {
        if topics.is_empty() {
            return;
        }
        tracing::debug!(?topics, "leaving");
        let mut by_link: HashMap<usize, Vec<Topic>> = HashMap::new();
        for topic in topics {
            let Some(watched) = self.topics.get_mut(&topic) else {
                continue;
            };
            let link = watched.link;
            let mut flow = std::mem::replace(
                &mut watched.flow,
                Flow::Leaving {
                    waiters: Vec::new(),
                },
            );
            if let Some(held) = flow.held() {
                self.held -= held.items.len();
            }
            if self.is_up(link) {
                by_link.entry(link).or_default().push(topic);
            } else {
                self.topics.remove(&topic);
            }
        }
        self.observer.pubsub_backlog(self.held);
        for (link, topics) in by_link {
            let Some((mut conn, generation)) = self.up(link) else {
                continue;
            };
            let command = self.unsubscribe_command();
            let channels: Vec<String> = topics.iter().map(|t| self.keys.channel(t)).collect();
            let (done, timeout) = (self.done.clone(), self.settings.command_timeout);
            tokio::spawn(async move {
                let mut result = Ok(());
                for chunk in channels.chunks(SUBSCRIBE_BATCH) {
                    let unsubscribing = confirm(&mut conn, command, chunk);
                    result = tokio::time::timeout(timeout, unsubscribing)
                        .await
                        .unwrap_or_else(|_| Err(timed_out()))
                        .map(drop)
                        .map_err(super::unavailable);
                    if result.is_err() {
                        break;
                    }
                }
                let _ = done.send(Done::Unsubscribed {
                    link,
                    generation,
                    topics,
                    result,
                });
            });
        }
    }

    /// Unsubscribes channels that moved away from `link`, in the
    /// background; how it went matters to nobody (the node may be gone).
    fn unsubscribe_channels(&self, link: usize, channels: Vec<String>) {
        let Some((mut conn, _)) = self.up(link) else {
            return;
        };
        let command = self.unsubscribe_command();
        let timeout = self.settings.command_timeout;
        tokio::spawn(async move {
            for chunk in channels.chunks(SUBSCRIBE_BATCH) {
                let _ = tokio::time::timeout(timeout, confirm(&mut conn, command, chunk)).await;
            }
        });
    }

    fn unsubscribe_command(&self) -> &'static str {
        if self.shards.is_cluster() {
            "SUNSUBSCRIBE"
        } else {
            "UNSUBSCRIBE"
        }
    }
}

/// Sends `command` (`SUBSCRIBE`, `SSUBSCRIBE`, or their unsubscribes) for
/// each channel, one command each in one pipeline, and checks each answer.
/// A channel whose slot another master serves now is
/// [`Subscription::Elsewhere`]. Any other answer than the command's
/// confirmation (an unsubscribe Redis sent by itself, taken for an answer)
/// fails the whole: the link is then made again, which leaves no doubt
/// about what it is subscribed to.
async fn confirm(
    conn: &mut MultiplexedConnection,
    command: &'static str,
    channels: &[String],
) -> redis::RedisResult<Vec<Subscription>> {
    let kind = match command {
        "SUBSCRIBE" => PushKind::Subscribe,
        "SSUBSCRIBE" => PushKind::SSubscribe,
        "UNSUBSCRIBE" => PushKind::Unsubscribe,
        _ => PushKind::SUnsubscribe,
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for channel in channels {
        pipe.cmd(command).arg(channel);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    channels
        .iter()
        .zip(replies)
        .map(|(channel, reply)| match reply {
            Value::Push { kind: k, data }
                if k == kind
                    && matches!(data.first(), Some(Value::BulkString(c)) if c == channel.as_bytes()) =>
            {
                Ok(Subscription::Confirmed)
            }
            Value::ServerError(e)
                if matches!(
                    e.kind(),
                    Some(
                        redis::ServerErrorKind::Moved
                            | redis::ServerErrorKind::Ask
                            | redis::ServerErrorKind::ClusterDown
                            | redis::ServerErrorKind::TryAgain
                    )
                ) =>
            {
                Ok(Subscription::Elsewhere)
            }
            other => Err(broken(&format!(
                "{command} {channel} was answered with {other:?}"
            ))),
        })
        .collect()
}

fn broken(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "an unexpected pub/sub answer",
        what.to_owned(),
    ))
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

/// Splits a batch of announcements, `+<n>` and `:<length>:<announcement>`
/// for each, into the announcements.
fn split_batch(payload: &[u8]) -> Option<Vec<&[u8]>> {
    fn number(bytes: &[u8]) -> Option<(usize, &[u8])> {
        let end = bytes.iter().position(|b| *b == b':')?;
        let n = std::str::from_utf8(&bytes[..end]).ok()?.parse().ok()?;
        Some((n, &bytes[end + 1..]))
    }
    let (count, mut rest) = number(payload.strip_prefix(b"+")?)?;
    let mut records = Vec::with_capacity(count.min(MAX_HELD));
    for i in 0..count {
        let (len, after) = number(rest)?;
        records.push(after.get(..len)?);
        rest = &after[len..];
        if i + 1 < count {
            rest = rest.strip_prefix(b":")?;
        }
    }
    rest.is_empty().then_some(records)
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
        for failures in 0..50 {
            let wait = RECONNECT.delay(failures);
            assert!(wait <= Duration::from_secs(1), "{wait:?}");
        }
        assert_eq!(RECONNECT.ceiling(50), Duration::from_secs(1));
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
    fn a_batch_of_announcements_splits_by_length() {
        let records: [&[u8]; 2] = [b"1:e:5;c1:{\"a\":\"x:y\"}", b"2:e:5;c2:[]"];
        let batch = format!(
            "+2:{}:{}:{}:{}",
            records[0].len(),
            String::from_utf8_lossy(records[0]),
            records[1].len(),
            String::from_utf8_lossy(records[1])
        );
        assert_eq!(split_batch(batch.as_bytes()), Some(records.to_vec()));
        assert_eq!(split_batch(b"+2:3:abc"), None);
        assert_eq!(split_batch(b"+1:3:abcd"), None);
        assert_eq!(split_batch(b"+1:9:abc"), None);
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
