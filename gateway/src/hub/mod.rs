//! The pod's local subscribers, by topic.
//!
//! The broker hands every publication of a watched topic to [`Hub::deliver`],
//! which encodes its frame once and pushes it to each subscriber's queue. The
//! topic table is sharded, each shard behind its own short lock: no global
//! lock on the publish path, no lock held across an `.await`.
//!
//! A new subscriber starts out *buffering*: publications that arrive while
//! its session reads history are kept aside, and [`Hub::go_live`] releases
//! those the history did not already cover. From then on each subscriber has
//! a cursor, where it stands ([`admit`]): a publication at or below it, or of
//! an epoch it has left, is not sent again, however late the broker delivers
//! it. That is what makes `since` gapless and duplicate-free under
//! concurrent publishing.
//!
//! What a subscriber keeps aside is bounded as its queue is (frames and
//! bytes): past that, it is all dropped, and its session reads on from
//! history instead, which holds the same messages ([`Hub::go_live`] says
//! so). A long replay to a slow client thus costs its queue, not everything
//! published while it lasts.
//!
//! A live subscriber whose queue has no room for a topic's frame (it reads
//! slower than the topic goes) meets the topic's lag policy ([`OnLag`]):
//! with `catch_up`, it goes back to holding, overrun from the start (nothing
//! held: history has it), its cursor at the last frame it was given, and its
//! session is told ([`Resets::lagged`]) and woken: it reads the topic's
//! history after the cursor at the client's pace and goes live again
//! ([`Hub::caught_up`]) as a replay does. `disconnect` and `drop_newest`
//! are the connection's overflow rules, as before namespaces had a say.
//!
//! A subscriber of a state topic that asked for deltas is sent each live
//! publication as a Fossil delta against the one before where it can take
//! one, and in full otherwise ([`delta`]).

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use proto::ServerMessage;
use router::{Deliver, Epoch, OnLag, Position, Publication, Topic};
use tokio::sync::OnceCell;
use tokio::time::Instant;
use tracing::Span;

use crate::admission::ConnId;
use crate::config::Overflow;
use crate::frame::{self, Body, Format, Frames, Variant};
use crate::metrics::Metrics;
use crate::outbound::{IdleSockets, Mark, Outbound, Pushed};
use crate::telemetry;

mod cursor;
mod delta;
mod holding;

pub use cursor::{Kind, admit};
use delta::{Delta, Encoder, Last};
pub use holding::CaughtUp;
use holding::{Held, Holding};

const SHARDS: usize = 64;

pub struct Hub {
    shards: Box<[Mutex<HashMap<Topic, LocalTopic>>]>,
    metrics: Arc<Metrics>,
    /// Most frames a buffering subscriber may hold aside...
    max_pending: usize,
    /// ...and most bytes.
    max_pending_bytes: usize,
}

struct LocalTopic {
    subscribers: HashMap<ConnId, Subscriber>,
    /// Set once the broker watches the topic for this pod.
    watched: Arc<OnceCell<()>>,
    /// The newest seq any subscriber here was sent or told of: no client
    /// can have seen, and so ack, anything above it.
    head: u64,
    /// Subscribers that asked for deltas; while there are any, the topic's
    /// newest publication is kept in `last`, the base of the next delta.
    deltas: usize,
    last: Option<Last>,
}

struct Subscriber {
    out: Outbound,
    /// The session's subscriptions: a `reset` it is sent moves its epoch,
    /// so that a resume continues in the new one.
    session: Box<dyn Resets>,
    /// What it was sent up to (set by `go_live`).
    cursor: Position,
    /// `Some` while the session reads history: frames held aside.
    pending: Option<Holding>,
    /// What a frame its queue has no room for leads to.
    on_lag: OnLag,
    /// Whether it asked for deltas, and what base it holds.
    delta: Delta,
}

/// Where a subscriber keeps its place for a resume (the session's
/// [`Subscriptions`](crate::session::Subscriptions)): told of every `reset`
/// the fan-out sends it. Defined here, implemented by the session, so that
/// the hub depends on the connection's outgoing queue and not on the session.
pub trait Resets: Send {
    /// The subscriber was sent a reset of `topic` to `epoch` and `seq`.
    fn reset(&self, topic: &Topic, epoch: &Epoch, seq: u64);

    /// The subscriber's queue had no room for a frame of `topic` (its
    /// policy `catch_up`): it was sent up to `cursor`, and is to be caught
    /// up from history from there (the hub pokes its connection after
    /// this). Ignored by default: a subscriber that never lags.
    fn lagged(&self, _topic: &Topic, _cursor: &Position) {}
}

/// The result of [`Hub::join`].
pub struct Joined {
    /// Initialised by whoever gets there first with `Broker::watch`.
    pub watched: Arc<OnceCell<()>>,
}

impl Hub {
    /// A buffering subscriber holds aside at most `max_pending` frames and
    /// `max_pending_bytes` (its queue's bounds).
    pub fn new(metrics: Arc<Metrics>, max_pending: usize, max_pending_bytes: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            metrics,
            max_pending,
            max_pending_bytes,
        }
    }

    fn shard(&self, topic: &Topic) -> MutexGuard<'_, HashMap<Topic, LocalTopic>> {
        let mut h = DefaultHasher::new();
        topic.as_str().hash(&mut h);
        let index = (h.finish() as usize) % SHARDS;
        self.shards[index].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a buffering subscriber whose queue's overflow rule is its lag
    /// policy.
    pub fn join(
        &self,
        topic: &Topic,
        conn: ConnId,
        out: Outbound,
        session: impl Resets + 'static,
    ) -> Joined {
        self.join_as(topic, conn, out, session, None, false)
    }

    /// Adds a buffering subscriber with the lag policy `on_lag` (its
    /// namespace's; `None`: its queue's overflow rule), sent deltas where
    /// `delta` (granted: its namespace has them, and it asked).
    pub fn join_as(
        &self,
        topic: &Topic,
        conn: ConnId,
        out: Outbound,
        session: impl Resets + 'static,
        on_lag: Option<OnLag>,
        delta: bool,
    ) -> Joined {
        let on_lag = on_lag.unwrap_or(match out.overflow_rule() {
            Overflow::Disconnect => OnLag::Disconnect,
            Overflow::DropNewest => OnLag::DropNewest,
        });
        let mut shard = self.shard(topic);
        let local = shard.entry(topic.clone()).or_insert_with(|| {
            self.metrics.topics.inc();
            LocalTopic {
                subscribers: HashMap::new(),
                watched: Arc::new(OnceCell::new()),
                head: 0,
                deltas: 0,
                last: None,
            }
        });
        let subscriber = Subscriber {
            out,
            session: Box::new(session),
            cursor: Position {
                epoch: Epoch::from(""),
                seq: 0,
            },
            pending: Some(Holding::default()),
            on_lag,
            delta: Delta::new(delta),
        };
        local.deltas += usize::from(delta);
        match local.subscribers.insert(conn, subscriber) {
            None => self.metrics.subscriptions.inc(),
            Some(before) => local.deltas -= usize::from(before.delta.is_on()),
        }
        Joined {
            watched: local.watched.clone(),
        }
    }

    /// Ends buffering: queues the held-aside frames that [`admit`] lets
    /// past `position` (what the session already sent from history), then
    /// delivers directly. False when more arrived meanwhile than could be
    /// held: then nothing was sent, the subscriber holds aside again from
    /// now, and the session reads on from history past `position` (it holds
    /// what was dropped) before it calls this again.
    ///
    /// Where the queue has no room for all that was held, the subscriber
    /// lags at once, as a live one would (its session is told): the
    /// handshake is over all the same.
    #[must_use]
    pub fn go_live(&self, topic: &Topic, conn: ConnId, position: &Position) -> bool {
        self.release(topic, conn, position, false) != CaughtUp::Overrun
    }

    /// [`go_live`](Self::go_live) for a lagging subscriber's catch-up,
    /// which has sent it up to `position` from history: what it finds is
    /// the catch-up's to act on (it is not told of a new lag, it reads on).
    pub fn caught_up(&self, topic: &Topic, conn: ConnId, position: &Position) -> CaughtUp {
        self.release(topic, conn, position, true)
    }

    fn release(
        &self,
        topic: &Topic,
        conn: ConnId,
        position: &Position,
        catching_up: bool,
    ) -> CaughtUp {
        let mut idle = IdleSockets::default();
        let mut shard = self.shard(topic);
        let subscriber = shard.get_mut(topic).and_then(|local| {
            local.head = local.head.max(position.seq);
            local.subscribers.get_mut(&conn)
        });
        let Some(subscriber) = subscriber else {
            return CaughtUp::Gone;
        };
        let lag = match &subscriber.pending {
            Some(holding) => holding.lag,
            None => return CaughtUp::Gone,
        };
        if lag != catching_up {
            // A catch-up of a subscriber that left and joined again, or a
            // handshake of one that lags: not this caller's to release.
            return CaughtUp::Gone;
        }
        if subscriber.pending.as_ref().is_some_and(|h| h.overrun) {
            subscriber.pending = Some(Holding::fresh(lag));
            return CaughtUp::Overrun;
        }
        subscriber.cursor = position.clone();
        // It was sent history: the next message is full (the frames held
        // aside are).
        subscriber.delta.lost();
        let held = subscriber.pending.take().unwrap_or_default();
        let mut result = CaughtUp::Live;
        for held in held.frames {
            let delivered = self.deliver_to(
                topic,
                subscriber,
                held.kind,
                (&held.epoch, held.seq),
                (held.frame, held.variant),
                held.at,
                &mut idle,
            );
            if !delivered {
                // The rest is dropped with the holding: history has it.
                if catching_up {
                    subscriber.pending = Some(Holding::overrun(true));
                    subscriber.delta.lost();
                    self.metrics.lag.lagged(OnLag::CatchUp);
                    result = CaughtUp::Lagged(subscriber.cursor.clone());
                } else {
                    self.lag(topic, subscriber);
                }
                break;
            }
        }
        drop(shard);
        idle.spawn(&self.metrics);
        result
    }

    /// Offers a live subscriber a frame (of `variant`: what its delta base
    /// becomes), as [`admit`] allows, applying its lag policy when its
    /// queue has no room. False when it lags (`catch_up`): its cursor was
    /// left where it was, and the caller marks it lagging.
    #[allow(clippy::too_many_arguments)]
    fn deliver_to(
        &self,
        topic: &Topic,
        subscriber: &mut Subscriber,
        kind: Kind,
        position: (&Epoch, u64),
        frame: (Bytes, Variant),
        at: Instant,
        idle: &mut IdleSockets,
    ) -> bool {
        let (epoch, seq) = position;
        let (frame, variant) = frame;
        // A reset moves the cursor to another epoch: kept to put back, as a
        // publication's seq is.
        let before = (kind == Kind::Reset).then(|| subscriber.cursor.clone());
        let before_seq = subscriber.cursor.seq;
        if !admit(&mut subscriber.cursor, kind, epoch, seq) {
            return true;
        }
        // The frame moves an SSE stream's place in the topic (its event ids).
        let mark = Mark {
            topic: topic.as_str(),
            epoch,
            seq,
        };
        let offered = subscriber.out.offer(frame, Some(mark), at, idle);
        if offered == Pushed::Full {
            // Whatever its policy, the client does not get this one.
            subscriber.delta.lost();
            match subscriber.on_lag {
                OnLag::CatchUp => {
                    match before {
                        Some(before) => subscriber.cursor = before,
                        None => subscriber.cursor.seq = before_seq,
                    }
                    return false;
                }
                OnLag::DropNewest => {
                    self.metrics.lag.lagged(OnLag::DropNewest);
                    self.count(subscriber.out.overflow_as(Overflow::DropNewest));
                }
                OnLag::Disconnect => {
                    self.metrics.lag.lagged(OnLag::Disconnect);
                    subscriber.out.overflow_as(Overflow::Disconnect);
                }
            }
        } else if offered == Pushed::Queued && subscriber.delta.is_on() {
            subscriber.delta.queued(variant);
            if kind == Kind::Publication {
                self.metrics.delta.delivered(variant == Variant::Delta);
            }
        } else {
            subscriber.delta.lost();
        }
        if kind == Kind::Reset {
            subscriber.session.reset(topic, epoch, seq);
        }
        true
    }

    /// A live subscriber lags (`catch_up`): nothing more of the topic goes
    /// to it (history holds it), and its session is told and woken.
    fn lag(&self, topic: &Topic, subscriber: &mut Subscriber) {
        subscriber.pending = Some(Holding::overrun(true));
        subscriber.delta.lost();
        self.metrics.lag.lagged(OnLag::CatchUp);
        subscriber.session.lagged(topic, &subscriber.cursor);
        subscriber.out.poke();
    }

    /// Drops what a buffering subscriber held aside, and holds aside from
    /// now: its session starts over from a position it reads after this.
    pub fn hold_again(&self, topic: &Topic, conn: ConnId) {
        let mut shard = self.shard(topic);
        let subscriber = shard
            .get_mut(topic)
            .and_then(|local| local.subscribers.get_mut(&conn));
        if let Some(subscriber) = subscriber
            && let Some(holding) = &subscriber.pending
        {
            subscriber.pending = Some(Holding::fresh(holding.lag));
            subscriber.delta.lost();
        }
    }

    /// Removes a subscriber. Returns true when it was the topic's last one on
    /// this pod, whose broker watch was then established: the caller unwatches.
    pub fn leave(&self, topic: &Topic, conn: ConnId) -> bool {
        let mut shard = self.shard(topic);
        let Some(local) = shard.get_mut(topic) else {
            return false;
        };
        if let Some(left) = local.subscribers.remove(&conn) {
            self.metrics.subscriptions.dec();
            if left.delta.is_on() {
                local.deltas -= 1;
                if local.deltas == 0 {
                    local.last = None;
                }
            }
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

    /// Pushes `message`, one not in the topic's seq order (a
    /// `presence_diff`), to every live subscriber of `topic` here, without
    /// waiting, encoded once per format. How many it was pushed to. One
    /// still in its subscribe handshake is skipped: it has not had its `ok`
    /// yet, and its session takes no other command (a `presence` query)
    /// before it is live, so any page it asks for is at or past what this
    /// message says. One that lags is offered it, and misses it only where
    /// its queue has no room (counted as dropped): it is in no history.
    pub fn broadcast(&self, topic: &Topic, message: &ServerMessage<'_>) -> usize {
        let mut frames = Frames::new(|format| frame::message(format, message));
        let mut shard = self.shard(topic);
        let Some(local) = shard.get_mut(topic) else {
            return 0;
        };
        let at = Instant::now();
        let mut idle = IdleSockets::with_capacity(local.subscribers.len());
        let mut pushed = 0;
        for subscriber in local.subscribers.values_mut() {
            let lags = match &subscriber.pending {
                Some(holding) if !holding.lag => continue,
                Some(_) => true,
                None => false,
            };
            let frame = frames.get(subscriber.out.format());
            let result = match subscriber.out.offer(frame, None, at, &mut idle) {
                Pushed::Full if lags || subscriber.on_lag != OnLag::Disconnect => Pushed::Dropped,
                Pushed::Full => subscriber.out.overflow_as(Overflow::Disconnect),
                pushed => pushed,
            };
            if result != Pushed::Closed {
                pushed += 1;
            }
            self.count(result);
        }
        drop(shard);
        idle.spawn(&self.metrics);
        pushed
    }

    fn count(&self, pushed: Pushed) {
        if pushed == Pushed::Dropped {
            self.metrics.dropped_queue_full.inc();
        }
    }
}

impl Hub {
    /// Pushes a frame of `position` to every subscriber of `topic` (each
    /// form encoded once per format among them, by `frame`), and records
    /// their number on `span` (a traced fan-out's). A publication (`Some`)
    /// goes to a delta subscriber in full or as a delta against the one
    /// before ([`delta`]). The queues are filled under the shard lock,
    /// which keeps each topic's order; the sockets are written after it is
    /// released.
    fn fan_out(
        &self,
        topic: &Topic,
        kind: Kind,
        position: (&Epoch, u64),
        publication: Option<&Publication>,
        frame: impl Fn((Format, Variant), Option<&[u8]>) -> Bytes,
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
        let deltas = match publication {
            Some(p) if local.deltas > 0 => {
                Encoder::new(local.last.as_ref(), p, &self.metrics.delta)
            }
            _ => Encoder::none(&self.metrics.delta),
        };
        let binary = publication.is_some_and(|p| crate::payload::Payload::of(&p.data).is_binary());
        let mut frames = Frames::new(|(format, variant)| {
            let delta = match variant {
                Variant::Delta => deltas.get(),
                Variant::Data | Variant::Full => None,
            };
            frame((format, variant), delta)
        });
        let at = Instant::now();
        let mut idle = IdleSockets::with_capacity(local.subscribers.len());
        for subscriber in local.subscribers.values_mut() {
            let format = subscriber.out.format();
            let variant = match kind {
                Kind::Publication => subscriber.delta.variant(
                    &subscriber.cursor,
                    format,
                    (position.0, position.1, binary),
                    &deltas,
                ),
                Kind::Reset => Variant::Data,
            };
            let frame = frames.get((format, variant.in_format(format)));
            match &mut subscriber.pending {
                None => {
                    let frame = (frame, variant);
                    if !self.deliver_to(topic, subscriber, kind, position, frame, at, &mut idle) {
                        self.lag(topic, subscriber);
                    }
                }
                // History holds it: the session reads it from there.
                Some(holding) if holding.overrun => {}
                Some(holding) => {
                    let held = Held {
                        kind,
                        variant,
                        epoch: position.0.clone(),
                        seq: position.1,
                        frame,
                        at,
                    };
                    holding.hold(held, self.max_pending, self.max_pending_bytes);
                }
            }
        }
        drop(frames);
        drop(deltas);
        match publication {
            Some(p) if local.deltas > 0 => Last::keep(&mut local.last, p),
            _ => {}
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
            Kind::Publication,
            (&publication.epoch, publication.seq),
            Some(publication),
            |(format, variant), delta| {
                let body = match (variant, delta) {
                    (Variant::Delta, Some(delta)) => Body::Delta(delta),
                    (Variant::Full, _) => Body::Full,
                    _ => Body::Data,
                };
                frame::publication(format, publication, body)
            },
            span.as_ref(),
        );
    }

    /// The hub knows topics, not users: the pod's sink hands disconnects to
    /// the live sessions instead.
    fn disconnect(&self, _user: &str) {}

    fn reset(&self, topic: &Topic, position: &Position) {
        self.fan_out(
            topic,
            Kind::Reset,
            (&position.epoch, position.seq),
            None,
            |(format, _), _| {
                frame::message(
                    format,
                    &ServerMessage::Reset {
                        topic: topic.as_str(),
                        epoch: &position.epoch,
                        seq: position.seq,
                    },
                )
            },
            None,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_outgrows_the_queue_while_replaying_is_dropped_and_left_to_history() {
        use crate::config::{Limits, Overflow};

        struct Unsaved;
        impl Resets for Unsaved {
            fn reset(&self, _: &Topic, _: &Epoch, _: u64) {}
        }

        let hub = Hub::new(Arc::new(Metrics::new()), 4, 1 << 20);
        let topic = Topic::parse("t").unwrap_or_else(|e| panic!("{e}"));
        let epoch: Epoch = Arc::from("e");
        let out = Outbound::new(Limits {
            frames: 4,
            bytes: 1 << 20,
            overflow: Overflow::Disconnect,
        });
        let publish = |seq| {
            hub.deliver(
                &Publication {
                    topic: topic.clone(),
                    epoch: epoch.clone(),
                    seq,
                    data: Bytes::from_static(b"1"),
                },
                None,
            )
        };
        let at = |seq| Position {
            epoch: epoch.clone(),
            seq,
        };
        // Frames queued since the last look.
        let queued = |out: &Outbound| match out.take(&mut Vec::new()) {
            Some(taken) => {
                out.written(taken.bytes);
                taken.frames
            }
            None => 0,
        };
        hub.join(&topic, 1, out.clone(), Unsaved);
        for seq in 1..=5 {
            publish(seq);
        }
        assert!(!hub.go_live(&topic, 1, &at(0)), "five held where four fit");
        assert_eq!(queued(&out), 0, "nothing of it was sent");
        assert!(!out.is_closing(), "and the connection goes on");
        // Held aside again from here: history had 1..=5.
        publish(6);
        assert!(hub.go_live(&topic, 1, &at(5)));
        assert_eq!(queued(&out), 1, "6 only");
    }

    /// What a session is told of its subscription: the lags.
    #[derive(Clone, Default)]
    struct Told(Arc<Mutex<Vec<Position>>>);
    impl Resets for Told {
        fn reset(&self, _: &Topic, _: &Epoch, _: u64) {}
        fn lagged(&self, _: &Topic, cursor: &Position) {
            self.0
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(cursor.clone());
        }
    }

    /// A hub holding 4 frames aside, a topic `t` of epoch `e`, and a live
    /// subscriber (conn 1) with `policy` whose queue holds 2 frames.
    fn lagging_rig(policy: OnLag) -> (Hub, Topic, Epoch, Outbound, Told) {
        use crate::config::Limits;
        let hub = Hub::new(Arc::new(Metrics::new()), 4, 1 << 20);
        let topic = Topic::parse("t").unwrap_or_else(|e| panic!("{e}"));
        let epoch: Epoch = Arc::from("e");
        let out = Outbound::new(Limits {
            frames: 2,
            bytes: 1 << 20,
            overflow: Overflow::Disconnect,
        });
        let told = Told::default();
        hub.join_as(&topic, 1, out.clone(), told.clone(), Some(policy), false);
        let at = Position {
            epoch: epoch.clone(),
            seq: 0,
        };
        assert!(hub.go_live(&topic, 1, &at));
        (hub, topic, epoch, out, told)
    }

    fn publish(hub: &Hub, topic: &Topic, epoch: &Epoch, seq: u64) {
        hub.deliver(
            &Publication {
                topic: topic.clone(),
                epoch: epoch.clone(),
                seq,
                data: Bytes::from_static(b"1"),
            },
            None,
        )
    }

    /// Frames queued since the last look, taken as the writer would.
    fn drained(out: &Outbound) -> u64 {
        match out.take(&mut Vec::new()) {
            Some(taken) => {
                out.written(taken.bytes);
                taken.frames
            }
            None => 0,
        }
    }

    #[test]
    fn a_live_subscriber_without_room_lags_and_goes_live_again_after_its_catch_up() {
        let (hub, topic, epoch, out, told) = lagging_rig(OnLag::CatchUp);
        let at = |seq| Position {
            epoch: epoch.clone(),
            seq,
        };
        for seq in 1..=3 {
            publish(&hub, &topic, &epoch, seq);
        }
        // 3 found no room: the subscriber lags from 2, the last it was given.
        let lags = told.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        assert_eq!(lags, vec![at(2)]);
        assert!(!out.is_closing(), "a lagging client stays connected");
        assert_eq!(drained(&out), 2);
        // Nothing more of the topic goes to it: history has it.
        publish(&hub, &topic, &epoch, 4);
        assert_eq!(drained(&out), 0);
        // Its catch-up sent 3 and 4 from history: it holds aside from now,
        // reads once more, and goes live past what it sent.
        assert_eq!(hub.caught_up(&topic, 1, &at(4)), CaughtUp::Overrun);
        publish(&hub, &topic, &epoch, 5);
        publish(&hub, &topic, &epoch, 6);
        // The last read went to 5: 6 only is released, once.
        assert_eq!(hub.caught_up(&topic, 1, &at(5)), CaughtUp::Live);
        assert_eq!(drained(&out), 1);
        publish(&hub, &topic, &epoch, 7);
        assert_eq!(drained(&out), 1, "live again");
        assert_eq!(told.0.lock().unwrap_or_else(|e| e.into_inner()).len(), 1);
        assert_eq!(
            hub.caught_up(&topic, 1, &at(7)),
            CaughtUp::Gone,
            "not lagging"
        );
    }

    #[test]
    fn a_catch_up_whose_held_frames_find_no_room_reads_on_from_the_last_one_queued() {
        let (hub, topic, epoch, out, _told) = lagging_rig(OnLag::CatchUp);
        let at = |seq| Position {
            epoch: epoch.clone(),
            seq,
        };
        for seq in 1..=3 {
            publish(&hub, &topic, &epoch, seq);
        }
        assert_eq!(hub.caught_up(&topic, 1, &at(3)), CaughtUp::Overrun);
        for seq in 4..=6 {
            publish(&hub, &topic, &epoch, seq);
        }
        // Two frames (1, 2) still queued: none of 4..=6 fits.
        assert_eq!(hub.caught_up(&topic, 1, &at(3)), CaughtUp::Lagged(at(3)));
        assert_eq!(drained(&out), 2);
        assert_eq!(hub.caught_up(&topic, 1, &at(6)), CaughtUp::Overrun);
        assert_eq!(hub.caught_up(&topic, 1, &at(6)), CaughtUp::Live);
    }

    #[test]
    fn drop_newest_drops_and_disconnect_closes_as_before() {
        let (hub, topic, epoch, out, told) = lagging_rig(OnLag::DropNewest);
        for seq in 1..=3 {
            publish(&hub, &topic, &epoch, seq);
        }
        assert_eq!(hub.metrics.dropped_queue_full.get(), 1);
        assert!(!out.is_closing());
        assert_eq!(drained(&out), 2);
        publish(&hub, &topic, &epoch, 4);
        assert_eq!(drained(&out), 1, "the next one goes, past a gap");

        let (hub, topic, epoch, out, _) = lagging_rig(OnLag::Disconnect);
        for seq in 1..=3 {
            publish(&hub, &topic, &epoch, seq);
        }
        assert!(out.is_closing(), "closed with 4000");
        assert!(told.0.lock().unwrap_or_else(|e| e.into_inner()).is_empty());
    }
}
