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
//! to a task of the client's own, the driver (`driver.rs`), which owns the
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

mod delta;
mod driver;
mod endpoints;
mod error;
mod event;
mod presence;
mod wire;

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::{Notify, mpsc, oneshot};

pub use delta::Data;
pub use endpoints::{DOWN_FOR, Endpoints, Urls};
pub use error::{Error, ErrorCode, reconnects_after};
pub use event::{Advice, Cause, Event, Message, Origin, State};
pub use presence::{Applied, Member, PresenceDiff, PresencePage, PresenceRoom};

/// Events buffered between the driver and the application.
pub const DEFAULT_BUFFER: usize = 1024;
/// Auto acks go out at most this often (acks are cumulative).
pub const DEFAULT_ACK_INTERVAL: Duration = Duration::from_millis(100);
/// The first reconnect waits up to 100 ms (at random); then twice as long
/// per failed attempt, up to 5 s.
pub const DEFAULT_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
/// Longest one connection attempt may take: TCP, the upgrade, `welcome`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Silence beyond the server's ping interval after which a connection is
/// taken for dead.
pub const DEFAULT_PING_GRACE: Duration = Duration::from_secs(5);
/// A token is refreshed this long before it expires (or halfway through
/// its life, if that comes later).
pub const DEFAULT_REFRESH_BEFORE: Duration = Duration::from_secs(30);
/// The socket's read buffer: a frame is read whole whatever its size.
pub const DEFAULT_READ_BUFFER: usize = 16 * 1024;

/// Where a subscription starts: after `seq` (of `epoch`, when known).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Since {
    pub seq: u64,
    pub epoch: Option<String>,
}

impl Since {
    /// After `seq` of `epoch` (from a [`Message`] or [`Event::Subscribed`]).
    pub fn at(seq: u64, epoch: impl Into<String>) -> Self {
        Self {
            seq,
            epoch: Some(epoch.into()),
        }
    }
}

impl From<u64> for Since {
    /// After `seq` of the topic's current epoch.
    fn from(seq: u64) -> Self {
        Self { seq, epoch: None }
    }
}

/// How a subscription starts and what it asks for (all optional).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscribeOptions {
    /// Start after this position (replayed from the history if it still
    /// holds it); see [`Client::subscribe`].
    pub since: Option<Since>,
    /// Ask for deltas: on a namespace with `delta = true` the server sends
    /// a message as a Fossil delta against the previous one where it can
    /// (the client applies it: [`Message::data`] is always whole);
    /// [`Event::Subscribed`]'s `delta` says whether it granted them.
    /// Elsewhere nothing changes.
    pub delta: bool,
}

impl From<Option<Since>> for SubscribeOptions {
    fn from(since: Option<Since>) -> Self {
        Self {
            since,
            delta: false,
        }
    }
}

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

/// Who acks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acks {
    /// A message handed out by [`Events::next`] counts as processed; acks
    /// go out at most every `interval` (zero: as each message is taken).
    Auto { interval: Duration },
    /// Only what the application acks with [`Client::ack`], batched the
    /// same way.
    Manual { interval: Duration },
}

impl Acks {
    fn interval(self) -> Duration {
        match self {
            Acks::Auto { interval } | Acks::Manual { interval } => interval,
        }
    }
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

/// What [`Client::history`] asks for (all optional: the first page, oldest
/// first, of the server's default size).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistoryQuery {
    /// Forward: the messages after this seq (default: from the oldest
    /// kept). Reverse: those below it (default: from the newest).
    pub since: Option<u64>,
    /// The epoch `since` is of; another epoch's is `history_lost`.
    pub epoch: Option<String>,
    /// At most this many (default 100, at most the server's
    /// `history.max_limit`); 0: the topic's position only.
    pub limit: Option<u32>,
    /// Newest first.
    pub reverse: bool,
}

/// One kept message in a [`HistoryPage`].
#[derive(Debug, Clone)]
pub struct Publication {
    pub seq: u64,
    /// The publisher's JSON, or binary data, byte for byte.
    pub data: Data,
}

/// The answer to [`Client::history`]: kept messages and the topic's
/// position (`epoch`, `seq`).
#[derive(Debug, Clone)]
pub struct HistoryPage {
    pub topic: String,
    pub epoch: String,
    pub seq: u64,
    /// In the order asked for; page on with the last one's seq as `since`.
    pub publications: Vec<Publication>,
}

/// Where a [`Client::rpc`] waits for the backend's reply.
type RpcReply = oneshot::Sender<Result<Box<RawValue>, Error>>;
/// Where a [`Client::presence`] waits for its page.
type PresenceReply = oneshot::Sender<Result<PresencePage, Error>>;
/// Where a [`Client::history`] waits for its page.
type HistoryReply = oneshot::Sender<Result<HistoryPage, Error>>;

type TokenFuture = Pin<Box<dyn Future<Output = Result<String, String>> + Send>>;
type TokenFn = Arc<dyn Fn() -> TokenFuture + Send + Sync>;

/// The settings [`Client::builder`] collects.
pub struct Builder {
    endpoints: Result<Arc<dyn Endpoints>, Error>,
    token: Option<TokenFn>,
    hello_data: Result<Option<Box<RawValue>>, Error>,
    backoff: Backoff,
    acks: Acks,
    resume: bool,
    buffer: usize,
    connect_timeout: Duration,
    ping_grace: Duration,
    refresh_before: Duration,
    report_dropped: bool,
    local_ip: Option<IpAddr>,
    read_buffer: usize,
    protocol: Protocol,
}

impl fmt::Debug for Builder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("backoff", &self.backoff)
            .field("acks", &self.acks)
            .field("resume", &self.resume)
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl Builder {
    /// Calls `token` for a token on every connect, before the current one
    /// expires (`refresh`), and after a token-expired close. An `Err` is
    /// retried after a backoff; a token the server calls unauthorized stops
    /// the client with [`Error::Unauthorized`].
    pub fn token<F, Fut, E>(mut self, token: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<String, E>> + Send + 'static,
        E: fmt::Display,
    {
        self.token = Some(Arc::new(move || {
            let fut = token();
            Box::pin(async move { fut.await.map_err(|e| e.to_string()) })
        }));
        self
    }

    /// Sends `data` (any JSON) as `hello.data` on every connection, the
    /// resumes too: Herald gives it to the backend's connect proxy when the
    /// `hello` has no token (docs/hooks.md), and ignores it otherwise. Data
    /// that does not serialize to JSON fails [`Builder::build`].
    pub fn hello_data(mut self, data: &impl Serialize) -> Self {
        self.hello_data = serde_json::value::to_raw_value(data)
            .map(Some)
            .map_err(|e| Error::Data(e.to_string()));
        self
    }

    /// Picks the pod for each connection instead of rotating over the URLs
    /// given.
    pub fn endpoints(mut self, endpoints: impl Endpoints) -> Self {
        self.endpoints = Ok(Arc::new(endpoints));
        self
    }

    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Default: [`Acks::Auto`] every [`DEFAULT_ACK_INTERVAL`].
    pub fn acks(mut self, acks: Acks) -> Self {
        self.acks = acks;
        self
    }

    /// With `false`, every connection starts a fresh session and subscribes
    /// again with `since` (the other way the protocol offers; default: resume).
    pub fn resume(mut self, resume: bool) -> Self {
        self.resume = resume;
        self
    }

    /// Events buffered for the application (default [`DEFAULT_BUFFER`]).
    pub fn buffer(mut self, events: usize) -> Self {
        self.buffer = events.max(1);
        self
    }

    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Silence allowed beyond the server's ping interval (default
    /// [`DEFAULT_PING_GRACE`]).
    pub fn ping_grace(mut self, grace: Duration) -> Self {
        self.ping_grace = grace;
        self
    }

    pub fn refresh_before(mut self, lead: Duration) -> Self {
        self.refresh_before = lead;
        self
    }

    /// Also hand out [`Event::Dropped`] for each `msg` the seq rule drops.
    pub fn report_dropped(mut self, report: bool) -> Self {
        self.report_dropped = report;
        self
    }

    /// Connect from this local address (a load tool spreads its
    /// connections over many, to have more source ports).
    pub fn local_ip(mut self, ip: IpAddr) -> Self {
        self.local_ip = Some(ip);
        self
    }

    /// The socket's read buffer in bytes (default [`DEFAULT_READ_BUFFER`]).
    pub fn read_buffer(mut self, bytes: usize) -> Self {
        self.read_buffer = bytes.max(256);
        self
    }

    /// The encoding on the wire (default [`Protocol::Json`]); the
    /// application's API and events are the same in both.
    pub fn protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// Starts the client's driver task (on the current tokio runtime): it
    /// connects at once. Fails only on unusable URLs.
    pub fn build(self) -> Result<(Client, Events), Error> {
        let endpoints = self.endpoints?;
        let hello_data = self.hello_data?;
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let (events_tx, events) = mpsc::channel(self.buffer);
        let shared = Arc::new(Shared::default());
        let settings = driver::Settings {
            endpoints,
            token: self.token,
            hello_data,
            backoff: self.backoff,
            ack_interval: self.acks.interval(),
            resume: self.resume,
            connect_timeout: self.connect_timeout,
            ping_grace: self.ping_grace,
            refresh_before: self.refresh_before,
            report_dropped: self.report_dropped,
            local_ip: self.local_ip,
            read_buffer: self.read_buffer,
            protocol: self.protocol,
        };
        tokio::spawn(driver::Driver::new(settings, commands_rx, events_tx, shared.clone()).run());
        let auto = matches!(self.acks, Acks::Auto { .. });
        Ok((
            Client {
                commands,
                shared: shared.clone(),
            },
            Events {
                events,
                shared,
                auto,
            },
        ))
    }
}

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
    /// A client of the gateways at `urls` (`ws://host:port/ws`, any pod of
    /// one cluster): the first is tried first, the next one on each
    /// reconnect, skipping for a while one that refused a connection.
    pub fn builder<I, S>(urls: I) -> Builder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Builder {
            endpoints: Urls::new(urls).map(|u| Arc::new(u) as Arc<dyn Endpoints>),
            token: None,
            hello_data: Ok(None),
            backoff: DEFAULT_BACKOFF,
            acks: Acks::Auto {
                interval: DEFAULT_ACK_INTERVAL,
            },
            resume: true,
            buffer: DEFAULT_BUFFER,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            ping_grace: DEFAULT_PING_GRACE,
            refresh_before: DEFAULT_REFRESH_BEFORE,
            report_dropped: false,
            local_ip: None,
            read_buffer: DEFAULT_READ_BUFFER,
            protocol: Protocol::Json,
        }
    }

    /// A client whose pod for each connection `endpoints` picks (a
    /// service registry, a load tool's own choice).
    pub fn with_endpoints(endpoints: impl Endpoints) -> Builder {
        let mut builder = Self::builder(["ws://unused/ws"]);
        builder.endpoints = Ok(Arc::new(endpoints));
        builder
    }

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
