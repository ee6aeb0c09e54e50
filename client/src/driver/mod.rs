//! The client's own task: it owns the connection and the subscriptions'
//! positions, and keeps the contract. One loop per connection; between
//! connections it waits (the advice's delay or a backoff) while still taking
//! commands.
//!
//! This module holds the task ([`Driver`]), the state it keeps (per
//! subscription, per id in flight, per connection) and its outer loop
//! (connect, live, wait, again). Its one `impl` is spread over child
//! modules by concern, each a further `impl Driver` block: `dial` (TCP, the
//! upgrade, `hello` and `welcome`), `connected` (a session set up on a new
//! connection, and the loop that reads it), `commands` (what goes out: the
//! application's commands, `sub`s, presence pages, acks, `refresh`),
//! `frames` (what comes in: `msg`, `ok`, `err`, `reset`, presence) and
//! `ends` (how a connection ends, and what is owed then).

mod commands;
mod connected;
mod dial;
mod ends;
mod frames;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use crate::delta::Base;
use crate::presence::Tracker;
use crate::{
    Advice, Backoff, Cut, Endpoints, Error, Event, HistoryQuery, HistoryReply, PresenceReply,
    Protocol, Reply, RpcReply, Shared, Since, State, TokenFn,
};

type Ws = WebSocketStream<TcpStream>;

/// After a close frame, how long the client reads on so that its answer to
/// the close goes out before it drops the connection.
const CLOSE_DRAIN: Duration = Duration::from_millis(500);
/// A `refresh` that failed (the provider, or the server) is tried again
/// this much later; the server closes with 4004 if none succeeds in time.
const REFRESH_RETRY: Duration = Duration::from_secs(5);
/// Far enough to mean "not armed".
const FAR: Duration = Duration::from_secs(86_400);

/// What the builder settled.
pub(crate) struct Settings {
    pub endpoints: Arc<dyn Endpoints>,
    pub token: Option<TokenFn>,
    /// `hello.data`, on every connection.
    pub hello_data: Option<Box<RawValue>>,
    pub backoff: Backoff,
    pub ack_interval: Duration,
    pub resume: bool,
    pub connect_timeout: Duration,
    pub ping_grace: Duration,
    pub refresh_before: Duration,
    pub report_dropped: bool,
    pub local_ip: Option<IpAddr>,
    pub read_buffer: usize,
    pub protocol: Protocol,
}

/// From a [`crate::Client`] handle.
pub(crate) enum Command {
    Subscribe {
        topic: Arc<str>,
        since: Option<Since>,
        delta: bool,
    },
    Unsubscribe {
        topic: Arc<str>,
    },
    Publish {
        topic: Arc<str>,
        data: Box<RawValue>,
        reply: Reply,
    },
    Presence {
        topic: Arc<str>,
        cursor: Option<String>,
        limit: Option<u32>,
        reply: PresenceReply,
    },
    History {
        topic: Arc<str>,
        query: HistoryQuery,
        reply: HistoryReply,
    },
    Rpc {
        method: String,
        data: Option<Box<RawValue>>,
        reply: RpcReply,
    },
    Track {
        topic: Arc<str>,
    },
    Cut(Cut),
    Close,
}

/// The application went away (dropped [`crate::Events`], or closed).
struct Stop;

/// One subscription and where the application is in it.
struct Sub {
    topic: Arc<str>,
    /// Unknown only before the first `ok` of a `sub` without `since` epoch.
    epoch: Option<Arc<str>>,
    /// The newest seq handed to the application, or where it starts.
    last: Option<u64>,
    /// An `ok` came for it once: the position is the server's too.
    confirmed: bool,
    /// The current session holds it.
    held: bool,
    /// A `sub` in flight on this connection (its id).
    pending: Option<u64>,
    /// Whether that `sub` asked for `since`.
    pending_since: bool,
    /// After an `unavailable`: send the `sub` again then.
    retry_at: Option<Instant>,
    retries: u32,
    /// The newest seq this connection delivered (what it may ack), and the
    /// newest it acked.
    delivered: u64,
    acked: u64,
    /// Deltas asked for; granted by the last `ok` (this connection's).
    delta: bool,
    granted: bool,
    /// The payload the next delta applies to (this connection's).
    base: Option<Base>,
}

/// What an id in flight was.
enum Pending {
    Sub(Arc<str>),
    Unsub,
    Pub(Reply),
    Refresh,
    Presence(PresenceReply),
    History(HistoryReply),
    Rpc(RpcReply),
    /// A page of a tracked topic's load.
    Load {
        topic: Arc<str>,
        load: u64,
    },
}

/// How a connection (or an attempt) ended.
enum End {
    /// Come back after this wait.
    Again(Duration),
    /// Stop, with this error first (if any).
    Stop(Option<Error>),
}

/// The parts of `welcome` the client keeps.
struct Welcome {
    session: String,
    resumed: bool,
    ping_ms: u64,
    expires: Option<u64>,
    reason: Option<String>,
}

/// Why an attempt failed.
enum Failed {
    Retry(Error),
    Terminal(Error),
}

pub(crate) struct Driver {
    s: Settings,
    commands: mpsc::UnboundedReceiver<Command>,
    commands_open: bool,
    events: mpsc::Sender<Event>,
    shared: Arc<Shared>,
    subs: HashMap<Arc<str>, Sub>,
    session: Option<String>,
    /// Topics left while away, to `unsub` once the session is resumed.
    left: Vec<Arc<str>>,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    /// Publishes waiting for a connection.
    outbox: Vec<(Arc<str>, Box<RawValue>, Reply)>,
    /// Acks the application asked for that this connection cannot send yet
    /// (it has not delivered that far).
    wanted: HashMap<Arc<str>, (Arc<str>, u64)>,
    /// Half-open connections left behind by [`Cut::HalfOpen`].
    abandoned: Vec<Ws>,
    url: Option<String>,
    /// `presence` and `history` asked while away, for the next connection.
    requests: Vec<Command>,
    trackers: HashMap<Arc<str>, Tracker>,
    /// Commands a frame's handling made (a presence page asks for the
    /// next), sent once it is handled.
    outgoing: Vec<WsMessage>,
    /// Connections dropped in a row for a delta the client could not
    /// apply (reset by one it could).
    bad_deltas: u32,
}

impl Driver {
    pub fn new(
        s: Settings,
        commands: mpsc::UnboundedReceiver<Command>,
        events: mpsc::Sender<Event>,
        shared: Arc<Shared>,
    ) -> Self {
        Self {
            s,
            commands,
            commands_open: true,
            events,
            shared,
            subs: HashMap::new(),
            session: None,
            left: Vec::new(),
            next_id: 0,
            pending: HashMap::new(),
            outbox: Vec::new(),
            wanted: HashMap::new(),
            abandoned: Vec::new(),
            url: None,
            requests: Vec::new(),
            trackers: HashMap::new(),
            outgoing: Vec::new(),
            bad_deltas: 0,
        }
    }

    pub async fn run(mut self) {
        let mut failures = 0u32;
        let mut wait = Duration::ZERO;
        loop {
            if self.pause(wait).await.is_err() {
                return;
            }
            let Some(url) = self.s.endpoints.pick(self.url.as_deref()) else {
                wait = self.s.backoff.delay(failures);
                failures = failures.saturating_add(1);
                continue;
            };
            let state = State::Connecting {
                url: url.clone(),
                attempt: failures + 1,
            };
            if self.emit(Event::State(state)).await.is_err() {
                return;
            }
            let attempt = self.connect(&url).await;
            let end = match attempt {
                Ok((ws, welcome)) => {
                    failures = 0;
                    self.url = Some(url.clone());
                    match self.connected(ws, &url, welcome).await {
                        Ok(end) => end,
                        Err(Stop) => return,
                    }
                }
                Err(Failed::Terminal(e)) => End::Stop(Some(e)),
                Err(Failed::Retry(e)) => {
                    if self.emit(Event::Error(e)).await.is_err() {
                        return;
                    }
                    let wait = self.s.backoff.delay(failures);
                    failures = failures.saturating_add(1);
                    End::Again(wait)
                }
            };
            match end {
                End::Again(after) => wait = after,
                End::Stop(error) => {
                    if let Some(e) = error {
                        let _ = self.emit(Event::Error(e)).await;
                    }
                    self.fail_publishes(Error::Stopped);
                    return;
                }
            }
        }
    }

    async fn emit(&self, event: Event) -> Result<(), Stop> {
        self.events.send(event).await.map_err(|_| Stop)
    }

    /// Waits `wait` while taking commands.
    async fn pause(&mut self, wait: Duration) -> Result<(), Stop> {
        let until = Instant::now() + wait;
        loop {
            tokio::select! {
                biased;
                _ = self.events.closed() => return Err(Stop),
                command = self.commands.recv(), if self.commands_open => match command {
                    None => self.commands_open = false,
                    Some(Command::Close) => return Err(Stop),
                    Some(Command::Cut(_)) => {}
                    Some(command) => self.take_offline(command),
                },
                _ = sleep_until(until) => return Ok(()),
            }
        }
    }

    fn fail_publishes(&mut self, e: Error) {
        for (_, _, reply) in self.outbox.drain(..) {
            let _ = reply.send(Err(e.clone()));
        }
        for (_, pending) in self.pending.drain() {
            if let Pending::Pub(reply) = pending {
                let _ = reply.send(Err(e.clone()));
            }
        }
    }
}

/// What one connection knows.
struct Connection {
    url: String,
    /// Longer than this without a frame: dead.
    silence: Duration,
    last_frame: Instant,
    advice: Option<Advice>,
    refresh_at: Option<Instant>,
    /// The last `err` without an id (the reason for the close that follows).
    last_err: Option<String>,
    /// A delta this connection could not apply: drop it and resume.
    broken: Option<String>,
}

impl Sub {
    /// Live again after `seq` in `epoch` (a `reset`, an unrecovered `ok`).
    /// Within the same epoch the position never goes back: no seq is handed
    /// out twice in an epoch.
    fn move_to(&mut self, epoch: &Arc<str>, seq: u64) {
        let same = self.epoch.as_deref() == Some(&**epoch);
        self.last = Some(match self.last {
            Some(last) if same => last.max(seq),
            _ => seq,
        });
        if !same {
            // What this connection delivered and acked was of the old epoch.
            self.delivered = 0;
            self.acked = 0;
        }
        self.epoch = Some(epoch.clone());
    }
}
