//! A Rust client for Herald that keeps the delivery contract for the
//! application (docs/protocol.md): it resumes its session on any pod, falls
//! back to `sub` with `since` per topic when the session is gone, acks what
//! the application has taken, drops what the seq rule says was seen
//! already, honours `reconnect` advice and the close codes, takes a
//! connection for dead when the server's pings stop, and refreshes its
//! token before it expires.
//!
//! ```no_run
//! # async fn run() -> Result<(), herald_client::Error> {
//! use herald_client::{Client, Event};
//!
//! let (client, mut events) = Client::builder(["ws://127.0.0.1:8080/ws"]).build()?;
//! client.subscribe("news", None)?;
//! while let Some(event) = events.next().await {
//!     match event {
//!         Event::Message(m) => println!("{} #{}: {}", m.topic, m.seq, m.data),
//!         Event::Reset { topic, .. } => println!("resync {topic}"),
//!         Event::Error(e) if e.is_terminal() => return Err(e),
//!         _ => {}
//!     }
//! }
//! # Ok(()) }
//! ```
//!
//! The layout: [`Client`] is a handle (clone it freely) that sends commands
//! to a task of the client's own, the driver (`driver/`), which owns the
//! connection: connect → `hello` (resume) → `welcome` → `sub`s → frames →
//! [`Events`], the application's stream, bounded so that a slow application
//! slows the reading (the server then closes with 4000 and the client
//! resumes: nothing is lost). [`Event`] and [`State`] are what it reads,
//! [`Error`] what can go wrong; [`Endpoints`] picks the pod to connect to.
//! Beside the stream: [`Client::presence`] and [`Client::history`] ask and
//! wait for their answer; [`PresenceRoom`] (`presence.rs`) merges presence
//! pages and diffs by the protocol's rule, for [`Client::track_presence`]
//! and [`Client::presence_all`]. Subscriptions the server makes (a backend,
//! the token's `topics`) are the client's like its own
//! ([`Event::ServerSubscribed`], [`Event::Unsubscribed`]).
//!
//! Guarantees: within an epoch a topic's messages come in seq order, each at
//! most once; a gap is never silent (a [`Event::Reset`], or
//! [`Event::Subscribed`] with `recovered: Some(false)`). Acks go out with the
//! epoch, never for a seq the current connection has not delivered (the
//! server refuses those). `ws://` only (no TLS yet).
//!
//! Two encodings, one API: JSON text (the default) or, with
//! [`Builder::protocol`]`(`[`Protocol::Protobuf`]`)`, the
//! `herald.v1.protobuf` subprotocol (binary frames, each one protobuf
//! message of the `proto` crate). A subscription may ask for deltas
//! ([`SubscribeOptions::delta`], `delta.rs`): on a namespace that has them,
//! the server sends most messages of a state topic as a Fossil delta
//! against the previous one; the client applies them, so the application
//! always sees whole [`Data`]: the publisher's JSON, or the bytes of a
//! binary publication, in either encoding.
//!
//! ```no_run
//! # async fn run() -> Result<(), herald_client::Error> {
//! use herald_client::{Client, Event, Protocol, SubscribeOptions};
//!
//! let (client, mut events) = Client::builder(["ws://127.0.0.1:8080/ws"])
//!     .protocol(Protocol::Protobuf)
//!     .build()?;
//! client.subscribe_with("game:7", SubscribeOptions { delta: true, ..Default::default() })?;
//! while let Some(event) = events.next().await {
//!     if let Event::Message(m) = event {
//!         println!("#{}: {}", m.seq, m.data); // whole, however it travelled
//!     }
//! }
//! # Ok(()) }
//! ```

mod builder;
mod delta;
mod driver;
mod endpoints;
mod error;
mod event;
mod history;
mod presence;
mod subscribe;
mod wire;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};

use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::{Notify, mpsc, oneshot};

pub use builder::{
    Acks, Builder, DEFAULT_ACK_INTERVAL, DEFAULT_BACKOFF, DEFAULT_BUFFER, DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_PING_GRACE, DEFAULT_READ_BUFFER, DEFAULT_REFRESH_BEFORE,
};
pub use delta::Data;
pub use endpoints::{DOWN_FOR, Endpoints, Urls};
pub use error::{Error, ErrorCode, reconnects_after};
pub use event::{Advice, Cause, Event, Message, Origin, State};
pub use history::{HistoryPage, HistoryQuery, Publication};
pub use presence::{Applied, Member, PresenceDiff, PresencePage, PresenceRoom};
pub use subscribe::{Since, SubscribeOptions};

/// How the client and the server write their messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    /// JSON text frames (no subprotocol offered): the default.
    #[default]
    Json,
    /// The `herald.v1.protobuf` subprotocol: each command and each server
    /// message one protobuf message (`proto/herald/v1/herald.proto`) in a
    /// binary frame; smaller envelopes, binary data as bytes. A server that
    /// does not select it fails the upgrade (retried as any failed connect).
    Protobuf,
}

/// Exponential backoff with full jitter: attempt `n` (from 0) waits a random
/// time up to `first × 2^n`, at most `cap`, so that a crowd that lost its
/// pod at the same instant does not come back in step. The router's Redis
/// connections wait by the same rule.
pub use backoff::Backoff;

/// How [`Client::cut`] drops the connection, as a network failure would
/// (fault injection for tests and load tools; the client then resumes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cut {
    /// SO_LINGER 0, then close: the server gets a TCP reset at once.
    Reset,
    /// Leave the connection open and silent (until the client stops) and
    /// come back on a new one: the server learns of it only from the resume.
    HalfOpen,
}

/// The reply to a [`Client::publish`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    pub seq: u64,
    pub epoch: String,
}

/// Where a [`Client::publish`] waits for its reply.
type Reply = oneshot::Sender<Result<Published, Error>>;
/// Where a [`Client::rpc`] waits for the backend's reply.
type RpcReply = oneshot::Sender<Result<Box<RawValue>, Error>>;
/// Where a [`Client::presence`] waits for its page.
type PresenceReply = oneshot::Sender<Result<PresencePage, Error>>;
/// Where a [`Client::history`] waits for its page.
type HistoryReply = oneshot::Sender<Result<HistoryPage, Error>>;

type TokenFuture = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;
type TokenFn = Arc<dyn Fn() -> TokenFuture + Send + Sync>;

/// A handle on a client: subscribe, publish, ack, close. Cheap to clone;
/// the client stops when [`Client::close`] is called or its [`Events`] is
/// dropped.
#[derive(Clone)]
pub struct Client {
    commands: mpsc::UnboundedSender<driver::Command>,
    shared: Arc<Shared>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client").finish_non_exhaustive()
    }
}

impl Client {
    fn send(&self, command: driver::Command) -> Result<(), Error> {
        self.commands.send(command).map_err(|_| Error::Stopped)
    }

    /// Subscribes to `topic` (now, or as soon as connected), from `since`
    /// if given; [`Event::Subscribed`] says where it starts. A refusal comes
    /// as [`Event::Error`] with the topic; `unavailable` is retried.
    pub fn subscribe(&self, topic: impl Into<String>, since: Option<Since>) -> Result<(), Error> {
        self.subscribe_with(topic, SubscribeOptions::from(since))
    }

    /// [`Client::subscribe`] with options: `since`, and `delta` to ask for
    /// deltas (kept across reconnects and resumes).
    pub fn subscribe_with(
        &self,
        topic: impl Into<String>,
        options: SubscribeOptions,
    ) -> Result<(), Error> {
        self.send(driver::Command::Subscribe {
            topic: Arc::from(topic.into()),
            since: options.since,
            delta: options.delta,
        })
    }

    pub fn unsubscribe(&self, topic: impl Into<String>) -> Result<(), Error> {
        self.send(driver::Command::Unsubscribe {
            topic: Arc::from(topic.into()),
        })
    }

    /// Publishes `data` over the socket, where the topic's namespace lets
    /// clients publish; waits for the reply (while someone reads
    /// [`Events`]). Not retried: [`Error::ConnectionLost`] means it may or
    /// may not have been published.
    pub async fn publish(
        &self,
        topic: impl Into<String>,
        data: &impl Serialize,
    ) -> Result<Published, Error> {
        let data = serde_json::value::to_raw_value(data).map_err(|e| Error::Data(e.to_string()))?;
        let (reply, answer) = oneshot::channel();
        self.send(driver::Command::Publish {
            topic: Arc::from(topic.into()),
            data,
            reply,
        })?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// Calls `method` (1..128 bytes of `[A-Za-z0-9_.:/-]`) on the
    /// application's backend through Herald's rpc proxy, as this
    /// connection's user, with `data` (any JSON, `None` for none), and
    /// waits for the backend's reply `data` (JSON `null` if it gave none).
    /// Sent on the next connection if there is none now; never retried (the
    /// backend could run it twice): [`Error::ConnectionLost`] means it may
    /// or may not have run. A refusal is [`Error::Server`] with the
    /// backend's own code ([`ErrorCode::Other`]), [`ErrorCode::Disabled`]
    /// where Herald has no rpc proxy, [`ErrorCode::Unavailable`] when the
    /// backend did not answer in time.
    ///
    /// ```no_run
    /// # async fn run(client: herald_client::Client) -> Result<(), herald_client::Error> {
    /// let cart = client.rpc("cart.add", Some(&serde_json::json!({"sku": "A-1"}))).await?;
    /// println!("{}", cart.get());
    /// # Ok(()) }
    /// ```
    pub async fn rpc<D: Serialize>(
        &self,
        method: impl Into<String>,
        data: Option<&D>,
    ) -> Result<Box<RawValue>, Error> {
        let data = data
            .map(serde_json::value::to_raw_value)
            .transpose()
            .map_err(|e| Error::Data(e.to_string()))?;
        let (reply, answer) = oneshot::channel();
        self.send(driver::Command::Rpc {
            method: method.into(),
            data,
            reply,
        })?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// One page of `topic`'s presence (members ordered by user id, counts,
    /// the position it answers at), where the namespace lets this client
    /// subscribe; `cursor` from the previous page, `limit` at most the
    /// server's `presence.page_size` (its default). Waits for a connection
    /// if there is none. A namespace without presence: [`Error::Server`]
    /// with [`ErrorCode::Disabled`].
    pub async fn presence(
        &self,
        topic: impl Into<String>,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<PresencePage, Error> {
        let (reply, answer) = oneshot::channel();
        self.send(driver::Command::Presence {
            topic: Arc::from(topic.into()),
            cursor: cursor.map(str::to_owned),
            limit,
            reply,
        })?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// Every page of `topic`'s presence, merged into one room (the counts
    /// of the newest page).
    pub async fn presence_all(&self, topic: impl Into<String>) -> Result<PresenceRoom, Error> {
        let topic = topic.into();
        let mut room = PresenceRoom::new();
        let mut cursor: Option<String> = None;
        loop {
            let page = self
                .presence(topic.clone(), cursor.as_deref(), None)
                .await?;
            room.page(&page);
            match page.cursor {
                Some(next) => cursor = Some(next),
                None => return Ok(room),
            }
        }
    }

    /// Keeps `topic`'s members for the application: once the topic is
    /// subscribed (and again after each re-subscribe or resume) every page
    /// is loaded, then the topic's `presence_diff`s (a `join_leave`
    /// namespace) merged by the protocol's rule; each change is an
    /// [`Event::Presence`]. Ends with the subscription.
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), herald_client::Error> {
    /// use std::collections::BTreeMap;
    /// use herald_client::{Client, Event};
    ///
    /// let (client, mut events) = Client::builder(["ws://127.0.0.1:8080/ws"]).build()?;
    /// client.track_presence("room:1")?;
    /// client.subscribe("room:1", None)?;
    /// let mut members = BTreeMap::new();
    /// while let Some(event) = events.next().await {
    ///     if let Event::Presence { change, users, .. } = event {
    ///         for m in change.joins {
    ///             members.insert(m.user.clone(), m.info);
    ///         }
    ///         for user in change.leaves {
    ///             members.remove(&user);
    ///         }
    ///         println!("{users} here: {:?}", members.keys().collect::<Vec<_>>());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn track_presence(&self, topic: impl Into<String>) -> Result<(), Error> {
        self.send(driver::Command::Track {
            topic: Arc::from(topic.into()),
        })
    }

    /// Kept messages of `topic` (where the namespace lets this client
    /// subscribe) and its position. A `since` the history no longer holds
    /// is [`Error::Server`] with [`ErrorCode::HistoryLost`], never a
    /// partial answer. Waits for a connection if there is none.
    ///
    /// ```no_run
    /// # async fn run(client: herald_client::Client) -> Result<(), herald_client::Error> {
    /// use herald_client::HistoryQuery;
    ///
    /// // The 50 newest messages, newest first; then the 50 before them.
    /// let query = HistoryQuery { limit: Some(50), reverse: true, ..HistoryQuery::default() };
    /// let newest = client.history("news", query.clone()).await?;
    /// if let Some(last) = newest.publications.last() {
    ///     let older = HistoryQuery { since: Some(last.seq), ..query };
    ///     let _before = client.history("news", older).await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn history(
        &self,
        topic: impl Into<String>,
        query: HistoryQuery,
    ) -> Result<HistoryPage, Error> {
        let (reply, answer) = oneshot::channel();
        self.send(driver::Command::History {
            topic: Arc::from(topic.into()),
            query,
            reply,
        })?;
        answer.await.map_err(|_| Error::Stopped)?
    }

    /// Acks `message` and every earlier one of its topic ([`Acks::Manual`];
    /// harmless with auto acks).
    pub fn ack(&self, message: &Message) {
        self.shared
            .take(&message.topic, &message.epoch, message.seq);
    }

    /// Drops the connection as a network failure would; the client comes
    /// back and resumes (for tests and load tools).
    pub fn cut(&self, how: Cut) -> Result<(), Error> {
        self.send(driver::Command::Cut(how))
    }

    /// Closes the connection (1000) and stops: the stream ends. The session
    /// stays resumable on the server for its resume window.
    pub fn close(&self) {
        let _ = self.send(driver::Command::Close);
    }
}

/// The application's stream of [`Event`]s; `None` once the client has
/// stopped. Dropping it stops the client.
pub struct Events {
    events: mpsc::Receiver<Event>,
    shared: Arc<Shared>,
    auto: bool,
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

impl Events {
    /// The next event. Cancel-safe (a `select!` branch may drop it): an
    /// event is taken, and with auto acks counted as processed, only when
    /// returned.
    pub async fn next(&mut self) -> Option<Event> {
        let event = self.events.recv().await?;
        if self.auto
            && let Event::Message(m) = &event
        {
            self.shared.take(&m.topic, &m.epoch, m.seq);
        }
        Some(event)
    }
}

/// Per topic, the newest (epoch, seq) the application has processed.
type Taken = HashMap<Arc<str>, (Arc<str>, u64)>;

/// What the application has processed: the driver acks it.
#[derive(Default)]
struct Shared {
    taken: Mutex<Taken>,
    wake: Notify,
}

impl Shared {
    fn take(&self, topic: &Arc<str>, epoch: &Arc<str>, seq: u64) {
        let mut taken = self.taken.lock().unwrap_or_else(PoisonError::into_inner);
        let first = taken.is_empty();
        match taken.get_mut(topic) {
            Some((e, s)) if e == epoch => *s = (*s).max(seq),
            Some(entry) => *entry = (epoch.clone(), seq),
            None => {
                taken.insert(topic.clone(), (epoch.clone(), seq));
            }
        }
        drop(taken);
        if first {
            self.wake.notify_one();
        }
    }

    fn drain(&self) -> Taken {
        std::mem::take(&mut *self.taken.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taken_keeps_the_newest_seq_of_the_newest_epoch() {
        let shared = Shared::default();
        let (t, a, b): (Arc<str>, Arc<str>, Arc<str>) = ("news".into(), "a".into(), "b".into());
        shared.take(&t, &a, 5);
        shared.take(&t, &a, 3);
        assert_eq!(shared.drain()[&t], (a.clone(), 5));
        shared.take(&t, &a, 9);
        shared.take(&t, &b, 2);
        assert_eq!(shared.drain()[&t], (b, 2));
        assert!(shared.drain().is_empty());
    }
}
