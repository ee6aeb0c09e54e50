//! The broker seam: where topics get their sequence numbers and history, and
//! where publications come from.
//!
//! - [`topic`]: topic names and their namespaces.
//! - [`namespace`]: per-namespace settings (history size and age, client publish).
//! - [`Broker`]: publish, watch a topic for this pod, recover history.
//! - [`page`]: history read a page at a time.
//! - [`presence`]: who is subscribed to a topic, merged across pods.
//! - [`history`]: the history API's pages, forward and reverse, and their
//!   window rule.
//! - [`server_subscription`]: a backend's subscribe and unsubscribe of a
//!   user's connections, carried to every pod.
//! - [`forward`]: commands posted for a session on a pod that does not hold
//!   it, carried to the one that does.
//! - [`SessionStore`]: what a disconnected session needs to resume.
//! - [`memory`]: the embedded engine for a single pod, implementing both.
//! - [`redis`]: the engine that spreads topics across pods through Redis.
//! - [`observe`]: what an engine reports, for the gateway's metrics.
//! - [`error`]: what fails, with its cause kept for the log.
//!
//! A publication flows: `Broker::publish` assigns the topic's next seq, keeps
//! it in history, and hands it to the pod's [`Deliver`] sink (the gateway's
//! hub) in seq order. An engine calls the sink for every topic this pod
//! watches, and for no other.

pub mod error;
pub mod forward;
pub mod history;
pub mod memory;
pub mod namespace;
pub mod observe;
pub mod page;
pub mod presence;
pub mod redis;
pub mod server_subscription;
pub mod session;
pub mod topic;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tracing::Instrument;

pub use error::{BrokerError, Causes, Unavailable};
pub use forward::Forward;
pub use history::{HistoryPage, HistoryQuery};
pub use memory::MemoryBroker;
pub use namespace::{NamespaceSettings, Namespaces, OnLag, Publish, Subscribe};
pub use observe::Observer;
pub use page::{Page, PageSize};
pub use presence::{
    DEFAULT_POD_TTL, Member, PresenceChange, PresenceCounts, PresencePage, PresenceSettings,
    PresenceUpdate,
};
pub use redis::{InvalidSetting, RedisBroker, RedisSettings, SentinelSettings, TlsFiles};
pub use server_subscription::ServerSubscription;
pub use session::{
    Claim, Claimed, SessionSave, SessionSnapshot, SessionStore, SessionUser, Stored,
    SubscriptionState, Whose,
};
pub use topic::{Topic, TopicError};

/// How long a publish's idempotency key is remembered.
pub const IDEMPOTENCY_WINDOW: std::time::Duration = std::time::Duration::from_secs(300);

/// An epoch: an opaque id for one unbroken series of a topic's seqs. It changes
/// when the topic's history is lost, so that seq 1 of a new series is never
/// mistaken for seq 1 of the old one.
pub type Epoch = Arc<str>;

/// One published message.
#[derive(Debug, Clone)]
pub struct Publication {
    pub topic: Topic,
    pub epoch: Epoch,
    pub seq: u64,
    /// The publisher's JSON text, verbatim.
    pub data: Bytes,
}

/// Where a topic stands: the seq of its newest message in its epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub epoch: Epoch,
    pub seq: u64,
}

/// A subscriber's claim: "I have everything up to `seq`" (in `epoch`, or the
/// topic's current epoch when `None`).
#[derive(Debug, Clone)]
pub struct Since {
    pub seq: u64,
    pub epoch: Option<String>,
    /// Whether the pod itself vouches for it (a stored session's ack, which
    /// was checked against what was sent), not only the client: then a
    /// `seq` above the topic's proves that the broker went back in time, and
    /// the topic moves to a new epoch.
    pub vouched: bool,
}

impl Since {
    /// A client's own claim.
    pub fn claimed(seq: u64, epoch: Option<String>) -> Self {
        Self {
            seq,
            epoch,
            vouched: false,
        }
    }
}

/// The answer to [`Broker::recover`].
#[derive(Debug, Clone)]
pub struct Recovery {
    /// The topic's position when history was read.
    pub position: Position,
    /// Whether `publications` continue the subscriber's `since` without a gap.
    /// Always true when no `since` was given.
    pub recovered: bool,
    /// The publications after `since`, oldest first; when not recovered,
    /// those after `restart`. At most one page ([`PageSize`]): the rest, up
    /// to `position`, is read with [`Broker::history`].
    pub publications: Vec<Publication>,
    /// Not recovered: the seq of `position.epoch` the subscriber's stream
    /// starts again after (its `reset`). Where the epoch began, when `since`
    /// was of an epoch left behind and history holds all of this one; the
    /// topic's seq otherwise.
    pub restart: u64,
}

impl Recovery {
    /// Continuity kept: `publications` follow `since` (none without one).
    pub fn recovered(position: Position, publications: Vec<Publication>) -> Self {
        let restart = position.seq;
        Self {
            position,
            recovered: true,
            publications,
            restart,
        }
    }

    /// Continuity lost: the stream starts again at the topic's seq.
    pub fn lost(position: Position) -> Self {
        let restart = position.seq;
        Self {
            position,
            recovered: false,
            publications: Vec::new(),
            restart,
        }
    }
}

/// Where an engine hands publications for the topics this pod watches.
///
/// Called in seq order per topic, possibly while the engine holds a lock of
/// its own: an implementation must not call back into the broker.
pub trait Deliver: Send + Sync + 'static {
    /// `traceparent`: the W3C trace context of the publish that made the
    /// publication, when that publish was traced (another pod's, with
    /// Redis): the sink may trace its fan-out as part of that trace.
    fn deliver(&self, publication: &Publication, traceparent: Option<&str>);

    /// The topic lost continuity on this pod (its history could not bridge a
    /// gap, or its keys were lost and a new epoch began): subscribers must
    /// resync; live delivery goes on after `position`.
    fn reset(&self, topic: &Topic, position: &Position);

    /// A backend ended `user`'s access ([`SessionStore::revoke`], on any
    /// pod): close every connection of theirs on this pod.
    fn disconnect(&self, user: &str);

    /// What changed in the presence of a topic this pod watches, in
    /// position order (a presence namespace's topics only).
    fn presence(&self, topic: &Topic, change: &PresenceChange) {
        let _ = (topic, change);
    }

    /// A backend subscribed or unsubscribed `user`
    /// ([`Broker::subscription`], on any pod): every live connection of
    /// theirs on this pod follows it.
    fn subscription(&self, user: &str, command: &ServerSubscription) {
        let _ = (user, command);
    }

    /// Commands posted for a session on some pod ([`Broker::forward`]):
    /// the pod that holds the session runs them on it, if it is
    /// `forward.user`'s; every other pod ignores them.
    fn forward(&self, forward: &Forward) {
        let _ = forward;
    }

    /// A session was resumed on some pod ([`Broker::resumed`]): a
    /// connection of it this pod keeps present while it waits for its
    /// client (presence's linger) may let go. `session` is the session's
    /// presence key, not its id (which is a credential).
    fn resumed(&self, session: &str) {
        let _ = session;
    }

    /// A topic's occupancy changed (issue #24's webhooks): `true`, its
    /// first subscriber on any pod came (on this pod); `false`, its last
    /// one anywhere left (on this pod, or on a dead pod this one cleaned up
    /// after). Exactly one pod is told of each transition. The embedded
    /// engine always tells; Redis only when
    /// [`PresenceSettings::occupancy`] asks it to track occupancy.
    fn occupancy(&self, topic: &Topic, occupied: bool) {
        let _ = (topic, occupied);
    }

    /// Users who became members of a topic's presence (on no pod before)
    /// or stopped being one (on no pod now), told once across pods: by the
    /// pod whose write made the change, or the one that cleaned up after a
    /// dead pod (Redis, when [`PresenceSettings::members`] asks for it).
    /// The embedded engine tells its one pod of every change's.
    fn members(&self, topic: &Topic, joins: &[Member], leaves: &[Arc<str>]) {
        let _ = (topic, joins, leaves);
    }
}

/// What an engine says of its state: for `/readyz` and the admin status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerStatus {
    /// `memory` or `redis`.
    pub kind: &'static str,
    /// Why the pod cannot serve yet (Redis not reached since the start);
    /// `None` once it can. A later outage does not make it `Some` again:
    /// then clients are refused one by one (4003, 503), and the pod stays in
    /// its Service, so that one Redis blink does not empty every Service.
    pub not_ready: Option<String>,
    /// Whether the connection that delivers publications is up now.
    pub connected: bool,
    /// The highest lineage clock this pod has seen (Redis): how far the
    /// dataset's history has advanced, as far as it knows.
    pub lineage_clock: Option<u64>,
}

/// One publication of a [`Broker::publish_many`], as [`Broker::publish`]
/// takes it.
#[derive(Debug, Clone)]
pub struct Outgoing {
    pub topic: Topic,
    pub data: Bytes,
    pub idempotency_key: Option<String>,
    pub traceparent: Option<String>,
    /// The span the publish is traced in: a broker that delivers on this
    /// pod (the embedded one) delivers within it.
    pub span: tracing::Span,
}

/// Topics, sequence numbers, history and fan-out across pods.
#[async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Whether it can serve, and how its connection stands.
    fn status(&self) -> BrokerStatus;

    /// Gives `data` the topic's next seq, keeps it in history as the namespace
    /// says, and delivers it to every pod that watches the topic. A retry with
    /// the same `idempotency_key` within [`IDEMPOTENCY_WINDOW`] returns the
    /// first publish's position and publishes nothing. A W3C `traceparent`
    /// travels with the publication to every [`Deliver::deliver`]; given only
    /// for a sampled trace, so an untraced publish pays nothing.
    async fn publish(
        &self,
        topic: &Topic,
        data: Bytes,
        idempotency_key: Option<&str>,
        traceparent: Option<&str>,
    ) -> Result<Position, BrokerError>;

    /// [`Broker::publish`] for several at once, answered in their order: each
    /// succeeds or fails alone, and items for one topic get their seqs in
    /// the order given. Redis sends them in one pipeline.
    async fn publish_many(&self, items: Vec<Outgoing>) -> Vec<Result<Position, BrokerError>> {
        let mut answers = Vec::with_capacity(items.len());
        for item in items {
            let published = self
                .publish(
                    &item.topic,
                    item.data,
                    item.idempotency_key.as_deref(),
                    item.traceparent.as_deref(),
                )
                .instrument(item.span)
                .await;
            answers.push(published);
        }
        answers
    }

    /// Starts delivering the topic's publications to this pod's sink. The
    /// gateway calls this once per topic, when its first local subscriber comes.
    async fn watch(&self, topic: &Topic) -> Result<(), BrokerError>;

    /// Stops delivering the topic to this pod.
    async fn unwatch(&self, topic: &Topic);

    /// Reports this pod's connection count and returns the counts of every
    /// pod that reported within `ttl`, this one included. With a pod-local
    /// engine, this pod is the cluster.
    async fn pod_loads(
        &self,
        pod: &str,
        connections: u64,
        ttl: std::time::Duration,
    ) -> Result<Vec<u64>, BrokerError> {
        let _ = (pod, ttl);
        Ok(vec![connections])
    }

    /// The topic's position and, given `since`, the first page (at most
    /// `page`) of the publications after it. Call after `watch`, so that
    /// nothing published meanwhile is missed: the caller merges what it
    /// receives live by seq.
    async fn recover(
        &self,
        topic: &Topic,
        since: Option<Since>,
        page: PageSize,
    ) -> Result<Recovery, BrokerError>;

    /// The next page of a replay: the topic's publications in `epoch` after
    /// `after`, at most `page`, or [`Page::Lost`] when history no longer
    /// continues `after` (trimmed or expired since, or the topic moved to
    /// another epoch). With Redis, read on connections of their own, so that
    /// publishes and claims never wait behind a replay's pages.
    async fn history(
        &self,
        topic: &Topic,
        epoch: &Epoch,
        after: u64,
        page: PageSize,
    ) -> Result<Page, BrokerError>;

    /// Hands this pod's changes to a topic's presence (coalesced by the
    /// caller: the changes since its previous update of the topic). Every
    /// pod watching the topic is told what changed for the room
    /// ([`Deliver::presence`]), with the next position, when the members or
    /// counts moved. Whether the namespace has presence is the caller's
    /// check.
    async fn presence_update(
        &self,
        topic: &Topic,
        update: PresenceUpdate,
    ) -> Result<(), BrokerError> {
        let _ = (topic, update);
        Err(BrokerError::unavailable("this broker keeps no presence"))
    }

    /// Up to `limit` members of the topic after the user id `after`, by user
    /// id, with the counts. Answered at a position only once every change up
    /// to it was handed to [`Deliver::presence`] on this pod (when this pod
    /// watches the topic), so that a page and the changes after it neither
    /// miss nor double a member.
    async fn presence(
        &self,
        topic: &Topic,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        let _ = (topic, after, limit);
        Err(BrokerError::unavailable("this broker keeps no presence"))
    }

    /// The topic's presence counts, in O(1), under the same rule as
    /// [`Broker::presence`].
    async fn presence_counts(&self, topic: &Topic) -> Result<PresenceCounts, BrokerError> {
        let _ = topic;
        Err(BrokerError::unavailable("this broker keeps no presence"))
    }

    /// This pod is leaving (its drain is over; its last changes were
    /// handed over): its members stay listed for `linger` more (the time
    /// its clients take to come back), as if it were still there, and then
    /// go as a dead pod's do. A client that resumes on another pod
    /// meanwhile is neither a leave nor a join; one that does not come back
    /// leaves then. A pod-local engine leaves with its pod: nothing to do.
    async fn presence_depart(&self, linger: std::time::Duration) -> Result<(), BrokerError> {
        let _ = linger;
        Ok(())
    }

    /// Tells every other pod's [`Deliver::resumed`] that the session keyed
    /// `session` was resumed here, at most once (over the control channel,
    /// with Redis). A pod-local engine has no other pod: nothing to do.
    async fn resumed(&self, session: &str) -> Result<(), BrokerError> {
        let _ = session;
        Ok(())
    }

    /// A page of the topic's kept history for the history API: forward
    /// (after `since`, or from the oldest kept) or reverse (below `since`,
    /// or from the newest), whole or [`HistoryPage::Lost`]
    /// ([`history::window`]). With Redis, read on the replay connections.
    async fn read_history(
        &self,
        topic: &Topic,
        query: &HistoryQuery,
    ) -> Result<HistoryPage, BrokerError>;

    /// Hands `command` to every pod's [`Deliver::subscription`], this one's
    /// included: with Redis, over the control channel that carries
    /// disconnects (at most once: a pod not subscribed to it then misses
    /// it).
    async fn subscription(
        &self,
        user: &str,
        command: ServerSubscription,
    ) -> Result<(), BrokerError>;

    /// Hands commands posted for a session to every pod's
    /// [`Deliver::forward`], this one's included: the pod that holds the
    /// session runs them. With Redis, over the control channel that carries
    /// disconnects (at most once, as [`Broker::subscription`]'s commands).
    async fn forward(&self, forward: Forward) -> Result<(), BrokerError> {
        let _ = forward;
        Err(BrokerError::unavailable("this broker forwards no commands"))
    }
}
