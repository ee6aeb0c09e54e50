//! The client's own task: it owns the connection and the subscriptions'
//! positions, and keeps the contract. One loop per connection; between
//! connections it waits (the advice's delay or a backoff) while still taking
//! commands.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::{SinkExt, StreamExt};
use serde_json::value::RawValue;
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep, sleep_until, timeout};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::error::{Error as WsError, ProtocolError};
use tokio_tungstenite::tungstenite::handshake::client::Request;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use crate::delta::{self, Base, Body, Unusable};
use crate::presence::{Loaded, Told, Tracker};
use crate::wire::{self, Frame, Incoming};
use crate::{
    Advice, Backoff, Cause, Cut, Endpoints, Error, ErrorCode, Event, HistoryPage, HistoryQuery,
    HistoryReply, Message, Origin, PresenceReply, Protocol, Publication, Published, Reply,
    RpcReply, Shared, Since, State, TokenFn, reconnects_after,
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

    /// A command while there is no connection: noted for the next one.
    fn take_offline(&mut self, command: Command) {
        match command {
            Command::Subscribe {
                topic,
                since,
                delta,
            } => {
                self.add_sub(topic, since, delta);
            }
            Command::Unsubscribe { topic } => {
                self.trackers.remove(&topic);
                if self.subs.remove(&topic).is_some_and(|s| s.held) {
                    self.left.push(topic);
                }
            }
            Command::Publish { topic, data, reply } => self.outbox.push((topic, data, reply)),
            Command::Track { topic } => {
                self.trackers.entry(topic).or_default();
            }
            request
            @ (Command::Presence { .. } | Command::History { .. } | Command::Rpc { .. }) => {
                self.requests.push(request);
            }
            Command::Cut(_) | Command::Close => {}
        }
    }

    /// A new subscription (none if the topic has one already).
    fn add_sub(&mut self, topic: Arc<str>, since: Option<Since>, delta: bool) -> bool {
        if self.subs.contains_key(&topic) {
            return false;
        }
        self.left.retain(|t| *t != topic);
        let (last, epoch) = match since {
            Some(Since { seq, epoch }) => (Some(seq), epoch.map(Arc::from)),
            None => (None, None),
        };
        self.subs.insert(
            topic.clone(),
            Sub {
                topic,
                epoch,
                last,
                confirmed: false,
                held: false,
                pending: None,
                pending_since: false,
                retry_at: None,
                retries: 0,
                delivered: 0,
                acked: 0,
                delta,
                granted: false,
                base: None,
            },
        );
        true
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

    // ------------------------------------------------------------ connect

    /// TCP, the upgrade, `hello` (resuming when it may) and `welcome`.
    async fn connect(&mut self, url: &str) -> Result<(Ws, Welcome), Failed> {
        let retry = |reason: String, refused: bool| {
            Failed::Retry(Error::Connect {
                url: url.to_owned(),
                reason,
                refused,
            })
        };
        let token = match &self.s.token {
            Some(provider) => match timeout(self.s.connect_timeout, provider()).await {
                Ok(Ok(token)) => Some(token),
                Ok(Err(e)) => return Err(Failed::Retry(Error::Token(e))),
                Err(_) => return Err(Failed::Retry(Error::Token("timed out".to_owned()))),
            },
            None => None,
        };
        let host = wire::host_port(url).map_err(Failed::Terminal)?;
        let connecting = timeout(self.s.connect_timeout, self.tcp(&host)).await;
        let stream = match connecting {
            Err(_) => return Err(retry("TCP connect timed out".to_owned(), false)),
            Ok(Err(e)) => {
                let refused = e.kind() == std::io::ErrorKind::ConnectionRefused;
                if refused {
                    self.s.endpoints.refused(url);
                }
                return Err(retry(e.to_string(), refused));
            }
            Ok(Ok(stream)) => stream,
        };
        let config = WebSocketConfig::default().read_buffer_size(self.s.read_buffer);
        let request = self.upgrade_request(url).map_err(Failed::Terminal)?;
        let upgrade = tokio_tungstenite::client_async_with_config(request, stream, Some(config));
        let mut ws = match timeout(self.s.connect_timeout, upgrade).await {
            Err(_) => return Err(retry("WebSocket upgrade timed out".to_owned(), false)),
            Ok(Err(WsError::Protocol(ProtocolError::SecWebSocketSubProtocolError(e)))) => {
                return Err(retry(
                    format!(
                        "WebSocket upgrade: the server did not select {} ({e})",
                        wire::PROTOBUF
                    ),
                    false,
                ));
            }
            Ok(Err(e)) => return Err(retry(format!("WebSocket upgrade: {e}"), false)),
            Ok(Ok((ws, _))) => ws,
        };
        // A session whose subscription was sent but never confirmed may or
        // may not hold it, from an unknown position: start afresh.
        let unsure = self
            .subs
            .values()
            .any(|s| !s.confirmed && s.pending.is_some());
        let resume = match &self.session {
            Some(session) if self.s.resume && !unsure => Some(session.as_str()),
            _ => None,
        };
        let hello = wire::Command::Hello {
            token: token.as_deref(),
            resume,
            data: self.s.hello_data.as_deref(),
        };
        let asked = resume.is_some();
        if let Err(e) = ws.send(hello.encode(self.s.protocol)).await {
            return Err(retry(format!("sending hello: {e}"), false));
        }
        match timeout(self.s.connect_timeout, welcome(&mut ws, self.s.protocol)).await {
            Err(_) => Err(retry("no welcome in time".to_owned(), false)),
            Ok(Err(failed)) => Err(match failed {
                Failed::Retry(Error::Connect { reason, .. }) => retry(reason, false),
                other => other,
            }),
            Ok(Ok(mut welcome)) => {
                welcome.resumed &= asked;
                if asked && !welcome.resumed && welcome.reason.is_none() {
                    welcome.reason = Some("resumed: false".to_owned());
                }
                if !asked {
                    welcome.reason = None;
                }
                Ok((ws, welcome))
            }
        }
    }

    /// The upgrade request for `url`: offering `herald.v1.protobuf` in
    /// protobuf mode (JSON offers nothing, as before the subprotocols).
    fn upgrade_request(&self, url: &str) -> Result<Request, Error> {
        let bad = |reason: String| Error::Url {
            url: url.to_owned(),
            reason,
        };
        let mut request = url.into_client_request().map_err(|e| bad(e.to_string()))?;
        if self.s.protocol == Protocol::Protobuf {
            request.headers_mut().insert(
                "sec-websocket-protocol",
                HeaderValue::from_static(wire::PROTOBUF),
            );
        }
        Ok(request)
    }

    async fn tcp(&self, host: &str) -> std::io::Result<TcpStream> {
        let mut last = None;
        for addr in tokio::net::lookup_host(host).await? {
            let socket = if addr.is_ipv4() {
                TcpSocket::new_v4()?
            } else {
                TcpSocket::new_v6()?
            };
            if let Some(ip) = self.s.local_ip
                && ip.is_ipv4() == addr.is_ipv4()
            {
                socket.bind((ip, 0).into())?;
            }
            match socket.connect(addr).await {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    return Ok(stream);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("the host has no address")))
    }

    // ------------------------------------------------------------ connected

    /// Sets the session up on a new connection, then reads, acks and
    /// refreshes until it ends.
    async fn connected(&mut self, mut ws: Ws, url: &str, welcome: Welcome) -> Result<End, Stop> {
        let resumed = welcome.resumed;
        self.session = Some(welcome.session.clone());
        let state = if resumed {
            State::Resumed {
                url: url.to_owned(),
                session: welcome.session,
            }
        } else {
            State::Connected {
                url: url.to_owned(),
                session: welcome.session,
                resume_refused: welcome.reason,
            }
        };
        self.emit(Event::State(state)).await?;
        for sub in self.subs.values_mut() {
            sub.pending = None;
            sub.retry_at = None;
            sub.delivered = 0;
            sub.acked = 0;
            // Deltas are per connection: the first message on this one is
            // full (a resume's `ok`s are not sent again: granted stays).
            sub.base = None;
            if !resumed {
                sub.held = false;
                sub.granted = false;
            }
        }
        let left = std::mem::take(&mut self.left);
        let mut setup = Vec::new();
        let p = self.s.protocol;
        if resumed {
            for topic in left {
                let id = self.id(Pending::Unsub);
                setup.push(wire::Command::Unsub { id, topic: &topic }.encode(p));
            }
        }
        let topics: Vec<Arc<str>> = self
            .subs
            .values()
            .filter(|s| !s.held)
            .map(|s| s.topic.clone())
            .collect();
        for topic in topics {
            setup.extend(self.sub_command(&topic));
        }
        for (topic, data, reply) in std::mem::take(&mut self.outbox) {
            let id = self.id(Pending::Pub(reply));
            setup.push(
                wire::Command::Pub {
                    id,
                    topic: &topic,
                    data: &data,
                }
                .encode(p),
            );
        }
        for request in std::mem::take(&mut self.requests) {
            if let Some(text) = self.request(request) {
                setup.push(text);
            }
        }
        if resumed {
            let held: Vec<Arc<str>> = self
                .subs
                .values()
                .filter(|s| s.held)
                .map(|s| s.topic.clone())
                .collect();
            for topic in held {
                self.load_presence(&topic);
            }
            setup.append(&mut self.outgoing);
        }
        let mut conn = Connection {
            url: url.to_owned(),
            silence: Duration::from_millis(welcome.ping_ms.max(1)) + self.s.ping_grace,
            last_frame: Instant::now(),
            advice: None,
            refresh_at: welcome.expires.map(|e| self.refresh_at(e)),
            last_err: None,
            broken: None,
        };
        for message in setup {
            if let Err(e) = ws.send(message).await {
                return self.lost(ws, &mut conn, Cause::Lost(e.to_string())).await;
            }
        }
        self.read(ws, conn).await
    }

    /// The message of a `presence`, `history` or `rpc` the application
    /// asked for (`None` for any other command).
    fn request(&mut self, command: Command) -> Option<WsMessage> {
        let p = self.s.protocol;
        Some(match command {
            Command::Presence {
                topic,
                cursor,
                limit,
                reply,
            } => {
                let id = self.id(Pending::Presence(reply));
                wire::Command::Presence {
                    id,
                    topic: &topic,
                    cursor: cursor.as_deref(),
                    limit,
                }
                .encode(p)
            }
            Command::History {
                topic,
                query,
                reply,
            } => {
                let id = self.id(Pending::History(reply));
                wire::Command::History {
                    id,
                    topic: &topic,
                    since: query.since,
                    epoch: query.epoch.as_deref(),
                    limit: query.limit,
                    reverse: query.reverse,
                }
                .encode(p)
            }
            Command::Rpc {
                method,
                data,
                reply,
            } => {
                let id = self.id(Pending::Rpc(reply));
                wire::Command::Rpc {
                    id,
                    method: &method,
                    data: data.as_deref(),
                }
                .encode(p)
            }
            _ => return None,
        })
    }

    /// Loads a tracked topic's presence anew (it is subscribed on this
    /// connection now): the first page goes out with the next frames.
    fn load_presence(&mut self, topic: &Arc<str>) {
        let Some(tracker) = self.trackers.get_mut(topic) else {
            return;
        };
        let load = tracker.restart();
        self.presence_page(topic, load, None);
    }

    fn presence_page(&mut self, topic: &Arc<str>, load: u64, cursor: Option<&str>) {
        let id = self.id(Pending::Load {
            topic: topic.clone(),
            load,
        });
        let message = wire::Command::Presence {
            id,
            topic,
            cursor,
            limit: None,
        }
        .encode(self.s.protocol);
        self.outgoing.push(message);
    }

    fn id(&mut self, pending: Pending) -> u64 {
        self.next_id += 1;
        self.pending.insert(self.next_id, pending);
        self.next_id
    }

    /// The `sub` for `topic`: with `since` where the client has a
    /// position, and `delta` where it asks for deltas. `None` for a topic
    /// without a subscription.
    fn sub_command(&mut self, topic: &Arc<str>) -> Option<WsMessage> {
        self.next_id += 1;
        let id = self.next_id;
        let sub = self.subs.get_mut(topic)?;
        sub.pending = Some(id);
        sub.pending_since = sub.last.is_some();
        let message = wire::Command::Sub {
            id,
            topic,
            since: sub.last,
            epoch: sub.epoch.as_deref(),
            delta: sub.delta,
        }
        .encode(self.s.protocol);
        self.pending.insert(id, Pending::Sub(topic.clone()));
        Some(message)
    }

    /// When to refresh a token that expires at `expires` (Unix seconds).
    fn refresh_at(&self, expires: u64) -> Instant {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let left = Duration::from_secs(expires).saturating_sub(now);
        let lead = self.s.refresh_before.min(left / 2);
        Instant::now() + left.saturating_sub(lead)
    }

    async fn read(&mut self, mut ws: Ws, mut conn: Connection) -> Result<End, Stop> {
        let ack_interval = self.s.ack_interval;
        let mut ack_timer: Pin<Box<Sleep>> = Box::pin(sleep_until(Instant::now() + FAR));
        let mut ack_armed = false;
        let mut quiet: Pin<Box<Sleep>> = Box::pin(sleep_until(conn.last_frame + conn.silence));
        loop {
            let retry_at = self.subs.values().filter_map(|s| s.retry_at).min();
            // Every branch is cancel-safe: `closed`, `recv`, `notified`,
            // sleeps, and the stream's `next` (a frame half read stays in
            // the stream).
            tokio::select! {
                biased;
                _ = self.events.closed() => {
                    let _ = timeout(CLOSE_DRAIN, ws.close(None)).await;
                    return Err(Stop);
                }
                command = self.commands.recv(), if self.commands_open => match command {
                    None => self.commands_open = false,
                    Some(Command::Close) => {
                        let _ = timeout(CLOSE_DRAIN, ws.close(None)).await;
                        let _ = timeout(CLOSE_DRAIN, async { while ws.next().await.is_some() {} }).await;
                        return Err(Stop);
                    }
                    Some(Command::Cut(how)) => {
                        match how {
                            Cut::Reset => {
                                let _ = ws.get_ref().set_zero_linger();
                                drop(ws);
                            }
                            Cut::HalfOpen => self.abandoned.push(ws),
                        }
                        return self.gone(&mut conn, None, Cause::Cut).await;
                    }
                    Some(command) => {
                        if let Err(e) = self.take_online(command, &mut ws).await {
                            return self.lost(ws, &mut conn, Cause::Lost(e)).await;
                        }
                    }
                },
                _ = self.shared.wake.notified() => {
                    self.merge_taken();
                    if ack_interval.is_zero() {
                        if let Err(e) = self.flush_acks(&mut ws).await {
                            return self.lost(ws, &mut conn, Cause::Lost(e)).await;
                        }
                    } else if !ack_armed {
                        ack_armed = true;
                        ack_timer.as_mut().reset(Instant::now() + ack_interval);
                    }
                }
                frame = ws.next() => {
                    conn.last_frame = Instant::now();
                    let message = match frame {
                        Some(Ok(message @ (WsMessage::Text(_) | WsMessage::Binary(_)))) => message,
                        Some(Ok(WsMessage::Close(close))) => {
                            let code = close.as_ref().map(|c| u16::from(c.code));
                            let reason = close.map(|c| c.reason.as_str().to_owned()).unwrap_or_default();
                            // Read on so that the answer to the close goes out.
                            let _ = timeout(CLOSE_DRAIN, async { while ws.next().await.is_some() {} }).await;
                            drop(ws);
                            return self.closed(&mut conn, code, reason).await;
                        }
                        Some(Ok(_)) => continue,
                        Some(Err(e)) => return self.lost(ws, &mut conn, Cause::Lost(e.to_string())).await,
                        None => return self.lost(ws, &mut conn, Cause::Lost("connection ended".to_owned())).await,
                    };
                    if let Some(e) = self.frame(message, &mut conn).await? {
                        let _ = timeout(CLOSE_DRAIN, ws.close(None)).await;
                        return Ok(End::Stop(Some(e)));
                    }
                    if let Some(reason) = conn.broken.take() {
                        // Nothing after the message it could not read was
                        // delivered (so none of it acked): the resume
                        // replays it, whole. In a row, the waits grow as
                        // failed connects' do: a server that keeps sending
                        // such deltas is not hammered.
                        let _ = ws.get_ref().set_zero_linger();
                        drop(ws);
                        let wait = self.s.backoff.delay(self.bad_deltas);
                        self.bad_deltas = self.bad_deltas.saturating_add(1);
                        self.gone_quietly(&mut conn, None, Cause::Lost(reason)).await?;
                        return Ok(End::Again(wait));
                    }
                    for message in std::mem::take(&mut self.outgoing) {
                        if let Err(e) = ws.send(message).await {
                            return self.lost(ws, &mut conn, Cause::Lost(e.to_string())).await;
                        }
                    }
                    if !self.wanted.is_empty() && !ack_armed {
                        ack_armed = true;
                        ack_timer.as_mut().reset(Instant::now() + ack_interval);
                    }
                }
                _ = &mut ack_timer, if ack_armed => {
                    ack_armed = false;
                    self.merge_taken();
                    if let Err(e) = self.flush_acks(&mut ws).await {
                        return self.lost(ws, &mut conn, Cause::Lost(e)).await;
                    }
                }
                _ = sleep_until(conn.refresh_at.unwrap_or(conn.last_frame + FAR)), if conn.refresh_at.is_some() => {
                    conn.refresh_at = None;
                    if let Err(e) = self.refresh(&mut ws, &mut conn).await {
                        return self.lost(ws, &mut conn, Cause::Lost(e)).await;
                    }
                }
                _ = sleep_until(retry_at.unwrap_or(conn.last_frame + FAR)), if retry_at.is_some() => {
                    let now = Instant::now();
                    let due: Vec<Arc<str>> = self.subs.values()
                        .filter(|s| s.retry_at.is_some_and(|t| t <= now))
                        .map(|s| s.topic.clone())
                        .collect();
                    for topic in due {
                        if let Some(sub) = self.subs.get_mut(&topic) {
                            sub.retry_at = None;
                        }
                        let Some(message) = self.sub_command(&topic) else { continue };
                        if let Err(e) = ws.send(message).await {
                            return self.lost(ws, &mut conn, Cause::Lost(e.to_string())).await;
                        }
                    }
                }
                _ = &mut quiet => {
                    let deadline = conn.last_frame + conn.silence;
                    if Instant::now() >= deadline {
                        drop(ws);
                        return self.gone(&mut conn, None, Cause::Silent).await;
                    }
                    // Frames came since it was set: look again then.
                    quiet.as_mut().reset(deadline);
                }
            }
        }
    }

    /// A command while connected.
    async fn take_online(&mut self, command: Command, ws: &mut Ws) -> Result<(), String> {
        let p = self.s.protocol;
        let message = match command {
            Command::Subscribe {
                topic,
                since,
                delta,
            } => {
                if !self.add_sub(topic.clone(), since, delta) {
                    return Ok(());
                }
                match self.sub_command(&topic) {
                    Some(message) => message,
                    None => return Ok(()),
                }
            }
            Command::Unsubscribe { topic } => {
                self.trackers.remove(&topic);
                if self.subs.remove(&topic).is_none() {
                    return Ok(());
                }
                self.wanted.remove(&topic);
                let id = self.id(Pending::Unsub);
                wire::Command::Unsub { id, topic: &topic }.encode(p)
            }
            Command::Publish { topic, data, reply } => {
                let id = self.id(Pending::Pub(reply));
                wire::Command::Pub {
                    id,
                    topic: &topic,
                    data: &data,
                }
                .encode(p)
            }
            Command::Track { topic } => {
                if self.trackers.contains_key(&topic) {
                    return Ok(());
                }
                self.trackers.insert(topic.clone(), Tracker::default());
                if self.subs.get(&topic).is_some_and(|s| s.held) {
                    self.load_presence(&topic);
                }
                for message in std::mem::take(&mut self.outgoing) {
                    ws.send(message).await.map_err(|e| e.to_string())?;
                }
                return Ok(());
            }
            request
            @ (Command::Presence { .. } | Command::History { .. } | Command::Rpc { .. }) => {
                match self.request(request) {
                    Some(message) => message,
                    None => return Ok(()),
                }
            }
            Command::Cut(_) | Command::Close => return Ok(()),
        };
        ws.send(message).await.map_err(|e| e.to_string())
    }

    async fn refresh(&mut self, ws: &mut Ws, conn: &mut Connection) -> Result<(), String> {
        let Some(provider) = self.s.token.clone() else {
            return Ok(());
        };
        let token = match timeout(self.s.connect_timeout, provider()).await {
            Ok(Ok(token)) => token,
            Ok(Err(e)) => {
                conn.refresh_at = Some(Instant::now() + REFRESH_RETRY);
                let _ = self.events.try_send(Event::Error(Error::Token(e)));
                return Ok(());
            }
            Err(_) => {
                conn.refresh_at = Some(Instant::now() + REFRESH_RETRY);
                return Ok(());
            }
        };
        let id = self.id(Pending::Refresh);
        let message = wire::Command::Refresh { id, token: &token }.encode(self.s.protocol);
        ws.send(message).await.map_err(|e| e.to_string())
    }

    /// Moves what the application took into `wanted`.
    fn merge_taken(&mut self) {
        for (topic, (epoch, seq)) in self.shared.drain() {
            match self.wanted.get_mut(&topic) {
                Some((e, s)) if *e == epoch => *s = (*s).max(seq),
                _ => {
                    self.wanted.insert(topic, (epoch, seq));
                }
            }
        }
    }

    /// Sends the acks this connection may send: never beyond what it
    /// delivered (the server refuses those), always with the epoch.
    async fn flush_acks(&mut self, ws: &mut Ws) -> Result<(), String> {
        let p = self.s.protocol;
        let mut acks = Vec::new();
        self.wanted.retain(|topic, (epoch, seq)| {
            let Some(sub) = self.subs.get_mut(topic) else {
                return false;
            };
            if sub.epoch.as_deref() != Some(&**epoch) || epoch.is_empty() {
                // Taken before a reset: the old epoch's acks do not count.
                return false;
            }
            let can = (*seq).min(sub.delivered);
            if can > sub.acked {
                sub.acked = can;
                acks.push(
                    wire::Command::Ack {
                        topic,
                        seq: can,
                        epoch: Some(epoch),
                    }
                    .encode(p),
                );
            }
            *seq > sub.delivered
        });
        for ack in acks {
            ws.send(ack).await.map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    // ------------------------------------------------------------ frames

    /// Acts on one server frame; `Some` error: stop with it.
    async fn frame(
        &mut self,
        message: WsMessage,
        conn: &mut Connection,
    ) -> Result<Option<Error>, Stop> {
        let incoming = match Incoming::decode(self.s.protocol, message) {
            Ok(incoming) => incoming,
            Err(e) => {
                self.emit(Event::Error(e)).await?;
                return Ok(None);
            }
        };
        let frame = match incoming.frame() {
            Ok(frame) => frame,
            Err(e) => {
                self.emit(Event::Error(e)).await?;
                return Ok(None);
            }
        };
        let text = &incoming;
        match frame.op.as_ref() {
            "msg" => self.msg(&frame, conn).await,
            "ok" => self.ok(&frame, conn).await,
            "err" => self.err(&frame, conn).await,
            "reset" => {
                let (Some(topic), Some(epoch), Some(seq)) = (&frame.topic, &frame.epoch, frame.seq)
                else {
                    return self
                        .unreadable(text, "reset without topic, epoch or seq")
                        .await;
                };
                let Some(sub) = self.subs.get_mut(&**topic) else {
                    return Ok(None);
                };
                let epoch: Arc<str> = Arc::from(&**epoch);
                if sub.epoch.as_deref() == Some(&*epoch) && sub.last.is_some_and(|last| seq <= last)
                {
                    // Told again of the epoch it is in (a resume repeats a
                    // reset the client may not have read): nothing skipped.
                    return Ok(None);
                }
                sub.move_to(&epoch, seq);
                let event = Event::Reset {
                    topic: sub.topic.clone(),
                    epoch,
                    seq: sub.last.unwrap_or(seq),
                };
                self.emit(event).await?;
                Ok(None)
            }
            "presence_diff" => self.presence_diff(&frame).await,
            "unsubscribed" => {
                let Some(topic) = frame.topic.as_deref() else {
                    return self.unreadable(text, "unsubscribed without topic").await;
                };
                let Some(sub) = self.subs.remove(topic) else {
                    return Ok(None);
                };
                self.wanted.remove(topic);
                self.trackers.remove(topic);
                let event = Event::Unsubscribed {
                    topic: sub.topic,
                    reason: frame.reason.as_deref().unwrap_or("server").to_owned(),
                };
                self.emit(event).await?;
                Ok(None)
            }
            "reconnect" => {
                conn.advice = Some(Advice {
                    after: Duration::from_millis(frame.after_ms.unwrap_or(0)),
                    reason: frame.reason.as_deref().unwrap_or_default().to_owned(),
                });
                Ok(None)
            }
            // Newer servers may say more: ignored, as the protocol asks.
            _ => Ok(None),
        }
    }

    async fn unreadable(&self, message: &Incoming, reason: &str) -> Result<Option<Error>, Stop> {
        let e = Error::Protocol {
            reason: reason.to_owned(),
            frame: message.show(),
        };
        self.emit(Event::Error(e)).await?;
        Ok(None)
    }

    async fn msg(
        &mut self,
        frame: &Frame<'_>,
        conn: &mut Connection,
    ) -> Result<Option<Error>, Stop> {
        let (Some(topic), Some(seq)) = (&frame.topic, frame.seq) else {
            return Ok(None);
        };
        // Left, or never asked for: not the application's business.
        let Some(sub) = self.subs.get_mut(&**topic) else {
            return Ok(None);
        };
        // Read whole before the seq rule: a redelivery the rule drops is
        // still the base of the delta after it.
        let opened = frame.body().map_err(Unusable::Data).and_then(|body| {
            let applied = matches!(body, Body::Delta { .. });
            delta::open(&mut sub.base, sub.granted, seq, body).map(|data| (data, applied))
        });
        let data = match opened {
            Ok((data, applied)) => {
                if applied {
                    self.bad_deltas = 0;
                }
                data
            }
            Err(unusable) => {
                let (reason, broken) = match unusable {
                    Unusable::Delta(reason) => (reason, true),
                    Unusable::Data(reason) => (reason, false),
                };
                let topic = sub.topic.clone();
                if broken {
                    sub.base = None;
                    conn.broken = Some(reason.clone());
                }
                let e = Error::Protocol {
                    reason: format!("{topic} seq {seq}: {reason}"),
                    frame: String::new(),
                };
                self.emit(Event::Error(e)).await?;
                return Ok(None);
            }
        };
        sub.delivered = sub.delivered.max(seq);
        let epoch = sub.epoch.clone().unwrap_or_else(|| Arc::from(""));
        // The protocol's rule: a seq not above the last one handed out was
        // handed out already.
        if sub.last.is_some_and(|last| seq <= last) {
            if self.s.report_dropped {
                let event = Event::Dropped {
                    topic: sub.topic.clone(),
                    epoch,
                    seq,
                };
                self.emit(event).await?;
            }
            return Ok(None);
        }
        sub.last = Some(seq);
        let event = Event::Message(Message {
            topic: sub.topic.clone(),
            epoch,
            seq,
            data,
        });
        self.emit(event).await?;
        Ok(None)
    }

    async fn ok(
        &mut self,
        frame: &Frame<'_>,
        conn: &mut Connection,
    ) -> Result<Option<Error>, Stop> {
        if frame.id.is_none() && frame.reason.is_some() {
            return self.server_subscribed(frame).await;
        }
        let Some(pending) = frame.id.and_then(|id| self.pending.remove(&id)) else {
            return Ok(None);
        };
        match pending {
            Pending::Sub(topic) => {
                let Some(sub) = self.subs.get_mut(&topic) else {
                    return Ok(None);
                };
                if sub.pending != frame.id {
                    return Ok(None);
                }
                sub.pending = None;
                sub.held = true;
                sub.retries = 0;
                sub.granted = sub.delta && frame.granted;
                let epoch: Arc<str> = Arc::from(frame.epoch.as_deref().unwrap_or_default());
                let seq = frame.seq.unwrap_or(0);
                let recovered = sub.pending_since.then_some(frame.recovered == Some(true));
                sub.confirmed = true;
                if recovered == Some(true) {
                    sub.epoch = Some(epoch.clone());
                } else {
                    sub.move_to(&epoch, seq);
                }
                let event = Event::Subscribed {
                    topic: sub.topic.clone(),
                    epoch,
                    seq: sub.last.unwrap_or(seq),
                    recovered,
                    delta: sub.granted,
                };
                self.emit(event).await?;
                self.load_presence(&topic);
            }
            Pending::Presence(reply) => {
                let _ = reply.send(Ok(frame.presence_page()));
            }
            Pending::History(reply) => {
                let publications = frame
                    .publications
                    .as_deref()
                    .unwrap_or_default()
                    .iter()
                    .map(|p| {
                        p.data()
                            .map(|data| Publication { seq: p.seq, data })
                            .map_err(|reason| Error::Protocol {
                                reason: format!("history of {:?}: {reason}", frame.topic),
                                frame: String::new(),
                            })
                    })
                    .collect::<Result<Vec<_>, Error>>();
                let publications = match publications {
                    Ok(publications) => publications,
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        return Ok(None);
                    }
                };
                let _ = reply.send(Ok(HistoryPage {
                    topic: frame.topic.as_deref().unwrap_or_default().to_owned(),
                    epoch: frame.epoch.as_deref().unwrap_or_default().to_owned(),
                    seq: frame.seq.unwrap_or(0),
                    publications,
                }));
            }
            Pending::Rpc(reply) => {
                let data = frame
                    .data
                    .map_or_else(|| RawValue::NULL.to_owned(), |d| d.to_owned());
                let _ = reply.send(Ok(data));
            }
            Pending::Load { topic, load } => return self.presence_loaded(topic, load, frame).await,
            Pending::Pub(reply) => {
                let published = Published {
                    seq: frame.seq.unwrap_or(0),
                    epoch: frame.epoch.as_deref().unwrap_or_default().to_owned(),
                };
                let _ = reply.send(Ok(published));
            }
            Pending::Refresh => conn.refresh_at = frame.expires.map(|e| self.refresh_at(e)),
            Pending::Unsub => {}
        }
        Ok(None)
    }

    async fn err(
        &mut self,
        frame: &Frame<'_>,
        conn: &mut Connection,
    ) -> Result<Option<Error>, Stop> {
        let code = ErrorCode::parse(frame.code.as_deref().unwrap_or_default());
        let message = frame.message.as_deref().unwrap_or_default().to_owned();
        let pending = frame.id.and_then(|id| self.pending.remove(&id));
        let server = |topic: Option<String>| Error::Server {
            code: code.clone(),
            message: message.clone(),
            topic,
        };
        match pending {
            Some(Pending::Sub(topic)) => {
                let Some(sub) = self.subs.get_mut(&topic) else {
                    return Ok(None);
                };
                sub.pending = None;
                if code == ErrorCode::AlreadySubscribed {
                    // The resumed session had it (its `ok` was lost with the
                    // connection before), or the server subscribed it.
                    sub.held = true;
                    sub.confirmed = true;
                    self.load_presence(&topic);
                    return Ok(None);
                }
                if code.is_transient() {
                    sub.retry_at = Some(Instant::now() + self.s.backoff.delay(sub.retries));
                    sub.retries = sub.retries.saturating_add(1);
                } else {
                    self.subs.remove(&topic);
                    self.wanted.remove(&topic);
                }
                self.emit(Event::Error(server(Some(topic.to_string()))))
                    .await?;
            }
            Some(Pending::Pub(reply)) => {
                let _ = reply.send(Err(server(None)));
            }
            Some(Pending::Presence(reply)) => {
                let _ = reply.send(Err(server(frame.topic.as_deref().map(str::to_owned))));
            }
            Some(Pending::History(reply)) => {
                let _ = reply.send(Err(server(frame.topic.as_deref().map(str::to_owned))));
            }
            Some(Pending::Rpc(reply)) => {
                let _ = reply.send(Err(server(None)));
            }
            Some(Pending::Load { topic, .. }) => {
                self.emit(Event::Error(server(Some(topic.to_string()))))
                    .await?;
            }
            Some(Pending::Refresh) if code == ErrorCode::Unauthorized => {
                return Ok(Some(Error::Unauthorized(message)));
            }
            Some(Pending::Refresh) => {
                conn.refresh_at = Some(Instant::now() + REFRESH_RETRY);
                self.emit(Event::Error(server(None))).await?;
            }
            Some(Pending::Unsub) => {}
            None => {
                conn.last_err = Some(message.clone());
                let topic = frame.topic.as_deref();
                // A restored subscription the token no longer grants: the
                // server dropped it, and so does the client.
                if code == ErrorCode::Forbidden
                    && let Some(topic) = topic
                {
                    self.subs.remove(topic);
                    self.wanted.remove(topic);
                }
                self.emit(Event::Error(server(topic.map(str::to_owned))))
                    .await?;
            }
        }
        Ok(None)
    }

    /// An `ok` without `id`: the server subscribed this connection (a
    /// backend, the token's `topics`). A topic the client has already is
    /// left as it is (its own `sub` settles it).
    async fn server_subscribed(&mut self, frame: &Frame<'_>) -> Result<Option<Error>, Stop> {
        let Some(topic) = frame.topic.as_deref() else {
            return Ok(None);
        };
        let topic: Arc<str> = Arc::from(topic);
        if !self.add_sub(topic.clone(), None, false) {
            return Ok(None);
        }
        let Some(sub) = self.subs.get_mut(&topic) else {
            return Ok(None);
        };
        sub.held = true;
        sub.confirmed = true;
        let epoch: Arc<str> = Arc::from(frame.epoch.as_deref().unwrap_or_default());
        let seq = frame.seq.unwrap_or(0);
        if frame.recovered == Some(true) {
            // Replayed from the backend's `since`, which the frame does not
            // name: every seq that comes is new.
            sub.epoch = Some(epoch.clone());
        } else {
            sub.move_to(&epoch, seq);
        }
        let origin = match frame.reason.as_deref() {
            Some("token") => Origin::Token,
            _ => Origin::Server,
        };
        // Server-side subscriptions never get deltas.
        let event = Event::ServerSubscribed {
            topic: topic.clone(),
            epoch,
            seq,
            recovered: frame.recovered,
            origin,
        };
        self.emit(event).await?;
        self.load_presence(&topic);
        Ok(None)
    }

    /// A page of a tracked topic's load: merged; the next one asked for,
    /// or, with the last, the application told what changed.
    async fn presence_loaded(
        &mut self,
        topic: Arc<str>,
        load: u64,
        frame: &Frame<'_>,
    ) -> Result<Option<Error>, Stop> {
        let Some(tracker) = self.trackers.get_mut(&topic) else {
            return Ok(None);
        };
        match tracker.page(load, &frame.presence_page()) {
            Loaded::Stale => Ok(None),
            Loaded::Next(cursor) => {
                self.presence_page(&topic, load, Some(&cursor));
                Ok(None)
            }
            Loaded::Done(change) => {
                let event = tracker.event(topic, change, true);
                self.emit(event).await?;
                Ok(None)
            }
        }
    }

    async fn presence_diff(&mut self, frame: &Frame<'_>) -> Result<Option<Error>, Stop> {
        let Some(diff) = frame.presence_diff() else {
            return Ok(None);
        };
        let Some(tracker) = self.trackers.get_mut(&diff.topic) else {
            return Ok(None);
        };
        match tracker.diff(&diff) {
            Told::Quiet => Ok(None),
            Told::Reload => {
                self.load_presence(&diff.topic);
                Ok(None)
            }
            Told::Changed(change) => {
                let event = tracker.event(diff.topic, change, false);
                self.emit(event).await?;
                Ok(None)
            }
        }
    }

    // ------------------------------------------------------------ ends

    /// The server closed with `code`: come back, or stop for good.
    async fn closed(
        &mut self,
        conn: &mut Connection,
        code: Option<u16>,
        reason: String,
    ) -> Result<End, Stop> {
        match code {
            Some(4502) => {
                let why = conn.last_err.take().unwrap_or(reason);
                self.gone_quietly(conn, code, Cause::Closed).await?;
                Ok(End::Stop(Some(Error::Unauthorized(why))))
            }
            Some(code) if !reconnects_after(code) => {
                self.gone_quietly(conn, Some(code), Cause::Closed).await?;
                let reason = conn.last_err.take().unwrap_or(reason);
                Ok(End::Stop(Some(Error::Closed { code, reason })))
            }
            _ => self.gone(conn, code, Cause::Closed).await,
        }
    }

    async fn lost(&mut self, ws: Ws, conn: &mut Connection, cause: Cause) -> Result<End, Stop> {
        drop(ws);
        self.gone(conn, None, cause).await
    }

    /// Says the connection ended; the wait before the next one.
    async fn gone(
        &mut self,
        conn: &mut Connection,
        close: Option<u16>,
        cause: Cause,
    ) -> Result<End, Stop> {
        let advice = conn.advice.clone();
        self.gone_quietly(conn, close, cause).await?;
        Ok(End::Again(match advice {
            Some(advice) => advice.after,
            None => self.s.backoff.delay(0),
        }))
    }

    async fn gone_quietly(
        &mut self,
        conn: &mut Connection,
        close: Option<u16>,
        cause: Cause,
    ) -> Result<(), Stop> {
        for (_, pending) in self.pending.drain() {
            match pending {
                Pending::Pub(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                Pending::Presence(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                Pending::History(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                Pending::Rpc(reply) => {
                    let _ = reply.send(Err(Error::ConnectionLost));
                }
                _ => {}
            }
        }
        self.outgoing.clear();
        let state = State::Disconnected {
            url: conn.url.clone(),
            close,
            advice: conn.advice.take(),
            cause,
        };
        self.emit(Event::State(state)).await
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

/// Reads until `welcome`: an `err` and the close that follow a refused
/// `hello` say whether to come back.
async fn welcome(ws: &mut Ws, protocol: Protocol) -> Result<Welcome, Failed> {
    let retry = |reason: String| {
        Failed::Retry(Error::Connect {
            url: String::new(),
            reason,
            refused: false,
        })
    };
    let mut err: Option<(ErrorCode, String)> = None;
    loop {
        let message = match ws.next().await {
            Some(Ok(message @ (WsMessage::Text(_) | WsMessage::Binary(_)))) => message,
            Some(Ok(WsMessage::Close(close))) => {
                let code = close.as_ref().map(|c| u16::from(c.code));
                let why = err
                    .as_ref()
                    .map(|(c, m)| format!("{c}: {m}"))
                    .unwrap_or_default();
                let _ = timeout(CLOSE_DRAIN, async { while ws.next().await.is_some() {} }).await;
                return Err(match code {
                    Some(4502) => Failed::Terminal(Error::Unauthorized(why)),
                    Some(code) if !reconnects_after(code) => {
                        Failed::Terminal(Error::Closed { code, reason: why })
                    }
                    _ => retry(format!("closed with {code:?} before welcome {why}")),
                });
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(retry(e.to_string())),
            None => return Err(retry("connection ended before welcome".to_owned())),
        };
        let incoming = Incoming::decode(protocol, message).map_err(|e| retry(e.to_string()))?;
        let frame = incoming.frame().map_err(|e| retry(e.to_string()))?;
        match frame.op.as_ref() {
            "welcome" => {
                let Some(session) = frame.session else {
                    return Err(retry("welcome without a session".to_owned()));
                };
                return Ok(Welcome {
                    session: session.into_owned(),
                    resumed: frame.resumed == Some(true),
                    ping_ms: frame.ping_ms.unwrap_or(25_000),
                    expires: frame.expires,
                    reason: frame.reason.as_deref().map(str::to_owned),
                });
            }
            "err" => {
                err = Some((
                    ErrorCode::parse(frame.code.as_deref().unwrap_or_default()),
                    frame.message.as_deref().unwrap_or_default().to_owned(),
                ));
            }
            // `reconnect` before `welcome`: a draining pod; its close follows.
            _ => {}
        }
    }
}
