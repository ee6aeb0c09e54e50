//! The pod's local subscribers, by topic.
//!
//! The broker hands every publication of a watched topic to [`Hub::deliver`],
//! which encodes its frame once and pushes it to each subscriber's queue. The
//! topic table is sharded, each shard behind its own short lock: no global
//! lock on the publish path, no lock held across an `.await`.
//!
//! A new subscriber starts out *buffering*: publications that arrive while
//! its session reads history are kept aside, and [`Hub::go_live`] releases
//! those the history did not already cover. That is what makes `since`
//! gapless and duplicate-free under concurrent publishing.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use proto::ServerMessage;
use router::{Deliver, Epoch, Position, Publication, Topic};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::Span;

use crate::frame;
use crate::metrics::Metrics;
use crate::session::{IdleSockets, Outbound, Pushed};
use crate::telemetry;

const SHARDS: usize = 64;

/// A connection's id, unique within the pod.
pub type ConnId = u64;

pub struct Hub {
    shards: Box<[Mutex<HashMap<Topic, LocalTopic>>]>,
    metrics: Arc<Metrics>,
    /// Most publications a buffering subscriber may hold aside.
    max_pending: usize,
}

struct LocalTopic {
    subscribers: HashMap<ConnId, Subscriber>,
    /// Set once the broker watches the topic for this pod.
    watched: Arc<OnceCell<()>>,
    /// The newest seq any subscriber here was sent or told of: no client
    /// can have seen, and so ack, anything above it.
    head: u64,
}

struct Subscriber {
    out: Outbound,
    /// `Some` while the session reads history: frames held aside.
    pending: Option<Vec<Held>>,
}

/// A frame held aside for a subscriber that reads history.
struct Held {
    epoch: Epoch,
    seq: u64,
    frame: Bytes,
    at: Instant,
}

/// The result of [`Hub::join`].
pub struct Joined {
    /// Initialised by whoever gets there first with `Broker::watch`.
    pub watched: Arc<OnceCell<()>>,
}

impl Hub {
    pub fn new(metrics: Arc<Metrics>, max_pending: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            metrics,
            max_pending,
        }
    }

    fn shard(&self, topic: &Topic) -> MutexGuard<'_, HashMap<Topic, LocalTopic>> {
        let mut h = DefaultHasher::new();
        topic.as_str().hash(&mut h);
        let index = (h.finish() as usize) % SHARDS;
        self.shards[index].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a buffering subscriber.
    pub fn join(&self, topic: &Topic, conn: ConnId, out: Outbound) -> Joined {
        let mut shard = self.shard(topic);
        let local = shard.entry(topic.clone()).or_insert_with(|| {
            self.metrics.topics.inc();
            LocalTopic {
                subscribers: HashMap::new(),
                watched: Arc::new(OnceCell::new()),
                head: 0,
            }
        });
        let subscriber = Subscriber {
            out,
            pending: Some(Vec::new()),
        };
        if local.subscribers.insert(conn, subscriber).is_none() {
            self.metrics.subscriptions.inc();
        }
        Joined {
            watched: local.watched.clone(),
        }
    }

    /// Ends buffering: queues the held-aside frames after `position` (what
    /// the session already sent from history; frames of another epoch, a
    /// reset among them, all go), then delivers directly.
    pub fn go_live(&self, topic: &Topic, conn: ConnId, position: &Position) {
        let mut idle = IdleSockets::default();
        let mut shard = self.shard(topic);
        let Some(local) = shard.get_mut(topic) else {
            return;
        };
        local.head = local.head.max(position.seq);
        let Some(subscriber) = local.subscribers.get_mut(&conn) else {
            return;
        };
        for held in subscriber.pending.take().unwrap_or_default() {
            if held.epoch != position.epoch || held.seq > position.seq {
                self.count(subscriber.out.push(held.frame, held.at, &mut idle));
            }
        }
        drop(shard);
        idle.spawn(&self.metrics);
    }

    /// Removes a subscriber. Returns true when it was the topic's last one on
    /// this pod, whose broker watch was then established: the caller unwatches.
    pub fn leave(&self, topic: &Topic, conn: ConnId) -> bool {
        let mut shard = self.shard(topic);
        let Some(local) = shard.get_mut(topic) else {
            return false;
        };
        if local.subscribers.remove(&conn).is_some() {
            self.metrics.subscriptions.dec();
        }
        if !local.subscribers.is_empty() {
            return false;
        }
        let watched = local.watched.initialized();
        shard.remove(topic);
        self.metrics.topics.dec();
        watched
    }

    /// The newest seq this pod's subscribers of `topic` were sent or told of
    /// (any epoch); `None` when it has none.
    pub fn head(&self, topic: &Topic) -> Option<u64> {
        self.shard(topic).get(topic).map(|local| local.head)
    }

    /// Local subscribers of `topic`.
    pub fn subscribers(&self, topic: &Topic) -> usize {
        self.shard(topic)
            .get(topic)
            .map_or(0, |local| local.subscribers.len())
    }

    fn count(&self, pushed: Pushed) {
        if pushed == Pushed::Dropped {
            self.metrics.dropped_queue_full.inc();
        }
    }
}

impl Hub {
    /// Pushes `frame` (of `position`) to every subscriber of `topic`, and
    /// records their number on `span` (a traced fan-out's). The queues are
    /// filled under the shard lock, which keeps each topic's order; the
    /// sockets are written after it is released.
    fn fan_out(
        &self,
        topic: &Topic,
        position: (&Epoch, u64),
        frame: impl Fn() -> Bytes,
        span: Option<&Span>,
    ) {
        let mut shard = self.shard(topic);
        let Some(local) = shard.get_mut(topic) else {
            if let Some(span) = span {
                span.record("herald.subscribers", 0);
            }
            return;
        };
        if let Some(span) = span {
            span.record(
                "herald.subscribers",
                telemetry::int(local.subscribers.len()),
            );
        }
        local.head = local.head.max(position.1);
        let frame = frame();
        let at = Instant::now();
        let mut idle = IdleSockets::with_capacity(local.subscribers.len());
        for subscriber in local.subscribers.values_mut() {
            match &mut subscriber.pending {
                None => self.count(subscriber.out.push(frame.clone(), at, &mut idle)),
                Some(pending) if pending.len() < self.max_pending => {
                    pending.push(Held {
                        epoch: position.0.clone(),
                        seq: position.1,
                        frame: frame.clone(),
                        at,
                    });
                }
                // Held aside too much while replaying: the same rule as a
                // full queue.
                Some(_) => self.count(subscriber.out.overflow()),
            }
        }
        drop(shard);
        idle.spawn(&self.metrics);
    }
}

impl Deliver for Hub {
    fn deliver(&self, publication: &Publication, traceparent: Option<&str>) {
        let span =
            telemetry::fan_out_span(publication.topic.as_str(), publication.seq, traceparent);
        self.fan_out(
            &publication.topic,
            (&publication.epoch, publication.seq),
            || frame::publication(publication),
            span.as_ref(),
        );
    }

    /// The hub knows topics, not users: the pod's sink hands disconnects to
    /// the live sessions instead.
    fn disconnect(&self, _user: &str) {}

    fn reset(&self, topic: &Topic, position: &Position) {
        self.fan_out(
            topic,
            (&position.epoch, position.seq),
            || {
                frame::message(&ServerMessage::Reset {
                    topic: topic.as_str(),
                    epoch: &position.epoch,
                    seq: position.seq,
                })
            },
            None,
        );
    }
}
