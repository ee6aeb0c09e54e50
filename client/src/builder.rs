//! The builder: every setting a client starts with ([`Builder`]), its
//! defaults (the `DEFAULT_*` constants, [`Client::builder`]) and who acks
//! ([`Acks`]); [`Builder::build`] hands them to the driver and starts it.
//! Its own module: the settings are read once, at the start, and nothing
//! else in the crate changes them.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde_json::value::RawValue;
use tokio::sync::mpsc;

use crate::{Backoff, Client, Endpoints, Error, Events, Protocol, Shared, TokenFn, Urls, driver};

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
    ///
    /// [`Event::Dropped`]: crate::Event::Dropped
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
}
