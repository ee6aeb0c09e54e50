//! One WebSocket connection, in one task: a reader and a writer (in
//! [`crate::outbound`], with the connection's outgoing queue).
//!
//! The reader decodes commands and acts on them: subscriptions go through the
//! hub and the broker, replies and replays go to the connection's outgoing
//! queue, which the writer drains. The session keeps what a resume needs: the
//! subscriptions and, for each, how far the client acked. It also holds who
//! the client is (its token's claims), and every topic it touches is checked
//! against that (`access`).

mod access;
pub mod echo;
#[cfg(any(test, fuzzing))]
pub mod fuzzing;
pub(crate) mod parser;
mod rate;
mod reader;
mod registry;
mod replay;
mod subscriptions;
#[cfg(test)]
mod tests;

pub use crate::config::{Limits, Overflow};
pub use registry::{Arrival, LiveSession, Registry, TakeOver, Unregistered};
pub use replay::Replays;
pub use subscriptions::Subscriptions;

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use bytes::Bytes;
use futures_util::future::Either;
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use ipnet::IpNet;
use proto::{Command, CommandError, ErrorCode, ServerMessage};
use rand::RngCore;
use router::{
    Broker, BrokerError, Causes, Claim, Namespaces, SessionStore, SessionUser, Since, Stored, Topic,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::admission::{Admission, ConnId};
use crate::auth::{Claims, Refused, Verifier};
use crate::budget::{Account, Budgets, Limit, Principal};
use crate::config::{BrokerKind, Config};
use crate::disconnect::CloseReason;
use crate::frame;
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::outbound::{Outbound, Writing, writer};
use access::Access;
use parser::Parsed;
use rate::Bucket;
use reader::Reader;

/// What the pod's sessions use of it, and no more: built once by
/// [`crate::node`], which keeps the same handles for the rest of the pod.
pub struct Pod {
    pub config: Arc<Config>,
    pub hub: Arc<Hub>,
    pub broker: Arc<dyn Broker>,
    /// The session store: resumes claim from it, connections save to it.
    pub sessions: Arc<dyn SessionStore>,
    /// The sessions this pod's connections serve.
    pub live: Arc<Registry>,
    /// Checks client tokens; `None` when no key is configured (open mode).
    pub verifier: Option<Verifier>,
    pub namespaces: Arc<Namespaces>,
    pub metrics: Arc<Metrics>,
    /// The pod's replay turns and page size.
    pub replays: Replays,
    /// What every connection's writer needs of the pod.
    pub writing: Arc<Writing>,
    /// Wakes the session flusher before its interval (a shared store's:
    /// `None` with a pod-local one); see [`Subscriptions::new`].
    pub flush_soon: Option<Arc<Notify>>,
    /// What each user and anonymous address may hold and touch across its
    /// connections.
    pub budgets: Arc<Budgets>,
}

/// Serves an upgraded connection until it ends.
///
/// This and [`split`] are plain functions that return the connection's
/// future: an `async fn` keeps its arguments (the upgraded socket) in its
/// state for as long as it runs, next to what it made of them, and an idle
/// connection's task is mostly that state (issue #16).
pub fn serve_upgraded(
    upgraded: Upgraded,
    node: Arc<Pod>,
    admission: Admission,
) -> impl Future<Output = ()> {
    let limits = node.config.queue_limits();
    split(upgraded, limits, Herald { node, admission })
}

/// What runs over an upgraded connection once it is split: a Herald session,
/// or the conformance echo ([`echo`]), over the same reader and writer.
trait Serve {
    /// Serves `read` (after `early`, bytes read with the handshake), `write`
    /// and `out`.
    fn serve<R, W>(
        self,
        read: R,
        early: Bytes,
        write: W,
        out: Outbound,
    ) -> impl Future<Output = ()>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static;
}

struct Herald {
    node: Arc<Pod>,
    admission: Admission,
}

impl Serve for Herald {
    fn serve<R, W>(self, read: R, early: Bytes, write: W, out: Outbound) -> impl Future<Output = ()>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let ws = &self.node.config.websocket;
        let reader =
            Reader::new(read, ws.max_message_bytes, ws.message_timeout).after_handshake(&early);
        serve(reader, write, out, self.node, self.admission)
    }
}

/// Splits `upgraded` into the halves its reader and writer own, with its
/// outgoing queue, and serves it with `conn`.
fn split(upgraded: Upgraded, limits: Limits, conn: impl Serve) -> impl Future<Output = ()> {
    // Own the TCP stream's halves directly: no lock between reader and writer.
    match upgraded.downcast::<TokioIo<TcpStream>>() {
        Ok(parts) => {
            let (read, write) = parts.io.into_inner().into_split();
            // Shared with the fan-out, which writes to an idle socket itself.
            let (out, write) = Outbound::with_socket(limits, write);
            // Bytes the client sent right behind its handshake come first
            // (copied: hyper's read buffer, 8 KiB, is dropped here).
            Either::Left(conn.serve(read, parts.read_buf, write, out))
        }
        Err(upgraded) => {
            let (read, write) = tokio::io::split(TokioIo::new(upgraded));
            let out = Outbound::new(limits);
            Either::Right(conn.serve(read, Bytes::new(), write, out))
        }
    }
}

/// The connection's future, with its session and reader made up front: the
/// future holds them once, where an `async fn` would hold its arguments too.
fn serve<R, W>(
    mut reader: Reader<R>,
    write: W,
    out: Outbound,
    node: Arc<Pod>,
    admission: Admission,
) -> impl Future<Output = ()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let mut session = Session::new(node, &admission, out);
    async move {
        let writing = writer::run(write, session.out.clone(), session.node.writing.clone());
        // The writer in the reader's task, not a task of its own: an idle
        // connection is one task's state (issue #16). Each runs until the
        // other tells it to stop (`Outbound::stop`, or a close queued);
        // direct writes from the fan-out never wake this task.
        tokio::join!(writing, session.read(&mut reader));
        drop(reader);
        // Boxed: it runs once, at the end; carried inline, every idle
        // connection would hold its room all along.
        Box::pin(session.end()).await;
        drop(admission);
    }
}

struct Session {
    conn: ConnId,
    /// This connection's token as its session's owner in the store.
    owner: Arc<str>,
    /// Set by the first command (an explicit or implied `hello`).
    id: Option<Arc<str>>,
    resumed: bool,
    out: Outbound,
    subscriptions: Subscriptions,
    /// The client's address prefix: an anonymous client's budgets are its.
    address: IpNet,
    /// The budgets this connection draws on, from `hello` on. Boxed: an
    /// idle connection's task should stay small (issue #16).
    account: Option<Box<Account>>,
    /// What the client's token says; `None` for an anonymous client.
    /// Boxed: most of a pod's connections may be anonymous.
    claims: Option<Box<Claims>>,
    /// When the token expires: the connection closes then, unless a
    /// `refresh` moves it.
    token_expires: Option<Instant>,
    /// The first command must come by then.
    hello_by: Instant,
    commands: Bucket,
    limited_in_a_row: u32,
    bad_in_a_row: u32,
    /// The pod's parts this session uses.
    node: Arc<Pod>,
    /// [`Session::end`] has run to its end: nothing is left to release.
    ended: bool,
}

/// Whatever ends a connection's task, what it holds in the pod's shared
/// state is given back: its hub memberships (and the watches they keep),
/// its registry entry (which the flusher would keep extending in the store)
/// and, with both, the last handles on its socket's write half. Normally
/// [`Session::end`] has done it, with the session saved; this covers a panic
/// anywhere in the task, so that a bug costs one connection and leaks
/// nothing (issue #21: a token's `exp` once overflowed the clock).
impl Drop for Session {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        if std::thread::panicking() {
            self.node.metrics.connection_panics.inc();
            tracing::error!(
                conn = self.conn,
                "a connection's task panicked: its client is disconnected, what it held released, its session not saved"
            );
        }
        for topic in self.subscriptions.topics() {
            if self.node.hub.leave(&topic, self.conn) {
                let broker = self.node.broker.clone();
                // Dropped with its runtime, there is nothing to unwatch.
                if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                    runtime.spawn(async move { broker.unwatch(&topic).await });
                }
            }
        }
        if let Some(id) = &self.id {
            self.node.live.deregister(id, self.conn);
        }
        self.subscriptions.end();
        self.out.finish();
        self.out.stop();
    }
}

impl Session {
    fn new(node: Arc<Pod>, admission: &Admission, out: Outbound) -> Self {
        let ws = &node.config.websocket;
        Session {
            conn: admission.conn,
            owner: random_id(),
            id: None,
            resumed: false,
            out,
            subscriptions: Subscriptions::new(node.flush_soon.clone()),
            address: admission.address,
            account: None,
            claims: None,
            token_expires: None,
            hello_by: Instant::now() + ws.hello_timeout,
            commands: Bucket::new(ws.commands_per_second, ws.commands_burst),
            limited_in_a_row: 0,
            bad_in_a_row: 0,
            node,
            ended: false,
        }
    }

    /// Reads and acts on the client's frames until the connection ends.
    /// This loop's one timer also sends the heartbeat pings.
    async fn read<R: AsyncRead + Unpin>(&mut self, reader: &mut Reader<R>) {
        let node = self.node.clone();
        let ws = &node.config.websocket;
        let idle = ws.ping_interval + ws.pong_timeout;
        let mut ping_at = Instant::now() + ws.ping_interval;
        loop {
            // Whichever comes first of the dead-peer deadline (counted from
            // the last frame) and the session's own (its first command, its
            // token's expiry).
            let silent = Instant::now() + idle;
            let (due, expired) = match self.deadline() {
                Some((at, reason)) if at < silent => (at, reason),
                _ => (silent, CloseReason::DeadPeer),
            };
            let next = {
                // Not dropped for a ping: a read is not cancel-safe.
                let read = reader.next(&self.out);
                tokio::pin!(read);
                loop {
                    // Every branch but the read and the ping ends the
                    // connection, so dropping an unfinished read is harmless.
                    tokio::select! {
                        biased;
                        _ = self.out.stopped() => return,
                        _ = self.subscriptions.taken_over() => {
                            self.out.close(CloseReason::TakenOver, false);
                            return;
                        }
                        next = &mut read => break Ok(next),
                        _ = tokio::time::sleep_until(due.min(ping_at)) => {
                            if Instant::now() < ping_at {
                                break Err(());
                            }
                            self.ping();
                            ping_at = Instant::now() + ws.ping_interval;
                        }
                    }
                }
            };
            match next {
                Err(_) if expired == CloseReason::DeadPeer => {
                    self.out.close(CloseReason::DeadPeer, false);
                    return;
                }
                Err(_) => {
                    if expired == CloseReason::TokenExpired {
                        self.node.metrics.auth_failed("expired");
                    }
                    self.out.close(expired, true);
                    return;
                }
                Ok(Err(reason)) => {
                    if reason.code().is_some() {
                        self.out.close(reason, false);
                    } else {
                        self.out.note_reason(reason);
                        self.out.stop();
                    }
                    return;
                }
                Ok(Ok(Parsed::Close(_))) => {
                    // Our close went out before the client's came: this
                    // completes the handshake, and the writer, waiting for
                    // it, may stop. Otherwise the close still queued (the
                    // echo, or ours asked for earlier) answers the client's;
                    // stopping now would leave it unwritten.
                    if self.out.close_taken() {
                        self.out.stop();
                    }
                    return;
                }
                Ok(Ok(Parsed::Ping(payload))) => {
                    self.out.pong(frame::encode(frame::OP_PONG, &[&payload]));
                }
                Ok(Ok(Parsed::Pong(payload))) => self.observe_pong(&payload),
                Ok(Ok(Parsed::Text(text))) if self.out.is_closing() => self.late_ack(&text),
                // Boxed, as this loop is as large as the largest future it
                // awaits, for as long as the connection lives.
                Ok(Ok(Parsed::Text(text))) => Box::pin(self.command(text)).await,
            }
        }
    }

    /// The session's next deadline besides the dead-peer timer's: the first
    /// command's, then the token's expiry.
    fn deadline(&self) -> Option<(Instant, CloseReason)> {
        if self.id.is_none() {
            return Some((self.hello_by, CloseReason::HelloTimeout));
        }
        self.token_expires.map(|at| (at, CloseReason::TokenExpired))
    }

    /// While the connection closes (a drain, a move) commands are ignored,
    /// but acks still count: the resume elsewhere then replays nothing the
    /// client already has.
    fn late_ack(&self, text: &[u8]) {
        let command = std::str::from_utf8(text).ok().map(Command::decode);
        if let Some(Ok(Command::Ack { topic, seq, epoch })) = command
            && let Ok(topic) = Topic::parse(&topic)
            && self.never_sent(&topic, seq).is_none()
        {
            self.subscriptions.ack(&topic, seq, epoch.as_deref());
        }
    }

    /// The newest seq this pod sent for `topic`, when `seq` is above it: an
    /// ack of a seq nobody here was sent would make a resume skip messages
    /// the client never got.
    fn never_sent(&self, topic: &Topic, seq: u64) -> Option<u64> {
        self.node.hub.head(topic).filter(|&head| seq > head)
    }

    /// Queues a heartbeat ping, stamped with when it was sent: its pong
    /// gives the round trip.
    fn ping(&self) {
        let stamp = self.node.writing.clock.elapsed().as_micros() as u64;
        self.out
            .ping(frame::encode(frame::OP_PING, &[&stamp.to_be_bytes()]));
    }

    fn observe_pong(&self, payload: &[u8]) {
        if let Ok(stamp) = <[u8; 8]>::try_from(payload) {
            let sent = u64::from_be_bytes(stamp);
            let now = self.node.writing.clock.elapsed().as_micros() as u64;
            if let Some(rtt) = now.checked_sub(sent) {
                self.node.metrics.ping_rtt.observe(rtt as f64 / 1e6);
            }
        }
    }

    async fn command(&mut self, text: Bytes) {
        let Ok(json) = std::str::from_utf8(&text) else {
            // The reader only yields valid UTF-8.
            self.out.close(CloseReason::InvalidUtf8, false);
            return;
        };
        let command = Command::decode(json);
        // Acks are cumulative, cost no broker work and get no reply: they are
        // not counted. A `ping` is cheap too, but it is answered: counted, so
        // that a flood of them is refused like any other.
        let counted = !matches!(command, Ok(Command::Ack { .. }));
        // Boxed, here and below: a connection's read loop is as large as the
        // largest future it awaits, for as long as it lives, and an idle
        // connection's task is mostly that (issue #16). Only an ack, the one
        // command that comes with the messages, is handled inline.
        if counted && !self.commands.take() {
            Box::pin(self.rate_limited(command.as_ref().ok())).await;
            return;
        }
        self.limited_in_a_row = 0;
        let result = match command {
            Err(e) => Err(e),
            Ok(Command::Ack { topic, seq, epoch }) if self.id.is_some() => {
                self.ack(&topic, seq, epoch.as_deref())
            }
            Ok(Command::Hello { token, resume }) if self.id.is_none() => {
                Box::pin(self.hello(token.as_deref(), resume.as_deref())).await;
                self.settle_account();
                Ok(())
            }
            Ok(Command::Hello { .. }) => Err(CommandError::new(
                None,
                ErrorCode::Malformed,
                "hello must be the first command",
            )),
            Ok(command) => {
                if self.id.is_none() {
                    // Implied: an anonymous `hello`.
                    Box::pin(self.hello(None, None)).await;
                    if self.id.is_none() {
                        return;
                    }
                    self.settle_account();
                }
                Box::pin(self.act(command, &text)).await
            }
        };
        match result {
            Ok(()) => self.bad_in_a_row = 0,
            Err(e) => Box::pin(self.reject(e)).await,
        }
    }

    /// Over the command rate: an `err`, and the close when it goes on.
    async fn rate_limited(&mut self, command: Option<&Command<'_>>) {
        self.node.metrics.rate_limited.inc();
        let id = match command {
            Some(
                Command::Sub { id, .. }
                | Command::Unsub { id, .. }
                | Command::Pub { id, .. }
                | Command::Refresh { id, .. }
                | Command::Ping { id },
            ) => Some(*id),
            _ => None,
        };
        let ws = &self.node.config.websocket;
        self.reply(ServerMessage::Err {
            id,
            code: ErrorCode::RateLimited,
            message: &format!(
                "at most {} commands per second (bursts of {})",
                ws.commands_per_second, ws.commands_burst
            ),
            topic: None,
        })
        .await;
        self.limited_in_a_row += 1;
        if self.limited_in_a_row >= ws.max_bad_commands {
            tracing::info!(conn = self.conn, "closed for commands over the rate limit");
            self.out.close(CloseReason::RateLimited, true);
        }
    }

    async fn act(&mut self, command: Command<'_>, text: &Bytes) -> Result<(), CommandError> {
        match command {
            Command::Hello { .. } => Ok(()),
            Command::Ping { id } => {
                self.reply(ServerMessage::Ok {
                    id,
                    topic: None,
                    seq: None,
                    epoch: None,
                    recovered: None,
                    expires: None,
                })
                .await;
                Ok(())
            }
            Command::Refresh { id, token } => {
                let refreshed = Box::pin(self.refresh(id, &token)).await;
                // Topics the new token no longer grants were left.
                self.settle_account();
                refreshed
            }
            Command::Sub {
                id,
                topic,
                since,
                epoch,
            } => {
                let topic = self.topic(Some(id), &topic)?;
                self.may(Some(id), &topic, Access::Subscribe)?;
                if self.subscriptions.contains(&topic) {
                    return Err(CommandError::new(
                        Some(id),
                        ErrorCode::AlreadySubscribed,
                        format!("already subscribed to `{topic}`"),
                    )
                    .about(topic.as_str()));
                }
                if self.subscriptions.count() >= self.node.config.session.max_subscriptions {
                    return Err(CommandError::new(
                        Some(id),
                        ErrorCode::TooManySubscriptions,
                        format!(
                            "at most {} subscriptions per connection",
                            self.node.config.session.max_subscriptions
                        ),
                    )
                    .about(topic.as_str()));
                }
                self.draw(id, &topic, Access::Subscribe)?;
                let since = since.map(|seq| Since::claimed(seq, epoch.map(|e| e.into_owned())));
                let subscribed = self.subscribe(Some(id), topic.clone(), since).await;
                if !self.subscriptions.contains(&topic)
                    && let Some(account) = self.account.as_mut()
                {
                    account.unsubscribed(&topic);
                }
                subscribed
            }
            Command::Unsub { id, topic } => {
                let topic = self.topic(Some(id), &topic)?;
                if !self.subscriptions.remove(&topic) {
                    return Err(not_subscribed(Some(id), &topic));
                }
                if let Some(account) = self.account.as_mut() {
                    account.unsubscribed(&topic);
                }
                self.leave(&topic).await;
                self.reply(ServerMessage::Ok {
                    id,
                    topic: Some(topic.as_str()),
                    seq: None,
                    epoch: None,
                    recovered: None,
                    expires: None,
                })
                .await;
                Ok(())
            }
            Command::Pub { id, topic, data } => {
                let topic = self.topic(Some(id), &topic)?;
                self.may(Some(id), &topic, Access::Publish)?;
                self.draw(id, &topic, Access::Publish)?;
                // `data` points into the frame: publish it without a copy.
                let data = text.slice_ref(data.get().as_bytes());
                let position = self
                    .node
                    .broker
                    .publish(&topic, data, None, None)
                    .await
                    .map_err(|e| broker_error(Some(id), e).about(topic.as_str()))?;
                self.node.metrics.published.inc();
                self.reply(ServerMessage::Ok {
                    id,
                    topic: Some(topic.as_str()),
                    seq: Some(position.seq),
                    epoch: Some(&position.epoch),
                    recovered: None,
                    expires: None,
                })
                .await;
                Ok(())
            }
            Command::Ack { topic, seq, epoch } => self.ack(&topic, seq, epoch.as_deref()),
        }
    }

    /// Opens the connection's account once `hello` said who the client is
    /// (its user, or else its address), and charges it with the
    /// subscriptions as a resume or a `refresh` left them. Nothing for a
    /// client `hello` refused: it spends nothing of the pod's.
    fn settle_account(&mut self) {
        if self.id.is_none() {
            return;
        }
        let account = self.account.get_or_insert_with(|| {
            let principal = match &self.claims {
                Some(claims) => Principal::User(claims.user.clone()),
                None => Principal::Address(self.address),
            };
            Box::new(self.node.budgets.open(principal))
        });
        account.settle(&self.subscriptions.topics());
    }

    /// Draws a `sub` or a `pub` of `topic` on the budgets of the client's
    /// user or address.
    fn draw(&mut self, id: u64, topic: &Topic, access: Access) -> Result<(), CommandError> {
        let Some(account) = self.account.as_mut() else {
            return Ok(());
        };
        let drawn = match access {
            Access::Subscribe => account.subscribe(topic),
            Access::Publish => account.publish(topic),
        };
        drawn.map_err(|limit: Limit| {
            let message = limit.message(&self.node.config.session);
            CommandError::new(Some(id), limit.code(), message).about(topic.as_str())
        })
    }

    /// Records how far the client acked `topic`.
    fn ack(&self, topic: &str, seq: u64, epoch: Option<&str>) -> Result<(), CommandError> {
        let topic = self.topic(None, topic)?;
        if let Some(head) = self.never_sent(&topic, seq) {
            return Err(CommandError::new(
                None,
                ErrorCode::Malformed,
                format!("ack of seq {seq} of `{topic}`, which is newer than any sent ({head})"),
            )
            .about(topic.as_str()));
        }
        if !self.subscriptions.ack(&topic, seq, epoch) {
            return Err(not_subscribed(None, &topic));
        }
        Ok(())
    }

    /// Parses a topic and checks that its namespace exists.
    fn topic(&self, id: Option<u64>, name: &str) -> Result<Topic, CommandError> {
        let topic = Topic::parse(name)
            .map_err(|e| CommandError::new(id, ErrorCode::BadTopic, e.to_string()).about(name))?;
        if self.node.namespaces.get(&topic).is_none() {
            return Err(CommandError::new(
                id,
                ErrorCode::UnknownNamespace,
                format!("namespace `{}` is not configured", topic.namespace()),
            )
            .about(topic.as_str()));
        }
        Ok(topic)
    }

    /// The session `id` to resume, claimed for this connection, so that a
    /// connection that served it before can no longer save over it. It
    /// comes from this pod's connection serving it if that one held it last
    /// (its acks are the newest), or else as stored. Only `user`'s session
    /// is taken (an anonymous one when `None`); another user's is left alone.
    async fn claim(&self, id: &str, user: Option<&str>) -> Result<Claim, BrokerError> {
        let (owner, live) = match self.node.live.take_over(id, user).await {
            TakeOver::OtherUser => return Ok(Claim::OtherUser),
            TakeOver::None => return self.node.sessions.claim(id, &self.owner, user).await,
            TakeOver::Taken(owner, live) => (owner, live),
        };
        // Adopted, not just claimed: the store may have no copy yet (none
        // flushed, or a pod-local store), and the connection taken over may
        // not have ended (a stuck write outlasts the takeover's wait); it
        // must find this connection the owner when it saves at last.
        let window = self.node.config.session.resume_window;
        let claimed = self
            .node
            .sessions
            .adopt(id, &self.owner, user, &live, window)
            .await?;
        Ok(match claimed {
            Claim::Taken(stored) => {
                let held_it_last = stored.from.as_deref() == Some(&*owner);
                Claim::Taken(router::Claimed {
                    snapshot: if held_it_last { live } else { stored.snapshot },
                    from: None,
                    owner: stored.owner,
                })
            }
            other => other,
        })
    }

    /// Who the client is: the claims of a valid token, or anonymous where
    /// that is allowed. `Err` has closed the connection already.
    async fn authenticate(&mut self, token: Option<&str>) -> Result<Option<Claims>, ()> {
        let Some(verifier) = &self.node.verifier else {
            // Open mode: nothing to check a token against.
            return Ok(None);
        };
        let refused = match token {
            Some(token) => match verifier.verify(token).await {
                Ok(claims) => return Ok(Some(claims)),
                Err(refused) => refused,
            },
            None if self.node.config.auth.allow_anonymous => return Ok(None),
            None => {
                self.auth_failed("missing", ErrorCode::Unauthorized, "a token is required")
                    .await;
                self.out.close(CloseReason::Unauthorized, true);
                return Err(());
            }
        };
        let (code, reason) = refusal(&refused);
        self.auth_failed(refused.reason(), code, &refused.to_string())
            .await;
        self.out.close(reason, true);
        Err(())
    }

    async fn auth_failed(&self, reason: &str, code: ErrorCode, message: &str) {
        self.node.metrics.auth_failed(reason);
        tracing::debug!(conn = self.conn, reason, "token refused");
        self.reply(ServerMessage::Err {
            id: None,
            code,
            message,
            topic: None,
        })
        .await;
    }

    /// Takes the token's claims for this connection. It lives until the
    /// token expires, with the same leeway the verifier allowed.
    fn adopt(&mut self, claims: Option<Claims>) {
        let leeway = self.node.config.auth.leeway;
        self.token_expires = claims
            .as_ref()
            .and_then(|c| c.deadline(leeway, std::time::SystemTime::now(), Instant::now()));
        self.claims = claims.map(Box::new);
    }

    /// Starts (or restores) the session and sends `welcome`. A resume that
    /// cannot be completed now (store or broker unavailable) closes with
    /// 4003, leaving the stored session as it was: the client comes back
    /// and resumes, rather than losing what it missed to a fresh session.
    async fn hello(&mut self, token: Option<&str>, resume: Option<&str>) {
        // Before the store is asked: a disconnect from now on reaches this
        // connection, whether or not the claim saw it.
        let arrived = self.node.live.arrival();
        let Ok(claims) = self.authenticate(token).await else {
            return;
        };
        let user = claims.as_ref().map(|c| c.user.clone());
        self.adopt(claims);
        let mut restored = None;
        let mut not_resumed = None;
        if let Some(id) = resume {
            match self.claim(id, user.as_deref()).await {
                Ok(Claim::Taken(claimed)) => {
                    // Saves go with the owner as the store ranked it.
                    self.owner = claimed.owner;
                    restored = Some((Arc::<str>::from(id), claimed.snapshot))
                }
                Ok(Claim::NotFound) => not_resumed = Some("not_found"),
                Ok(Claim::OtherUser) => {
                    tracing::info!(conn = self.conn, session = %tag(id), "resume of another user's session refused");
                    not_resumed = Some("other_user");
                }
                Err(e) => {
                    tracing::warn!(error = %Causes(&e), "session store unavailable; the client is to come back");
                    self.out.close(CloseReason::Unavailable, true);
                    return;
                }
            }
            let label = if restored.is_some() { "true" } else { "false" };
            self.node.metrics.resumes.with_label_values(&[label]).inc();
        }
        let (id, snapshot) = match restored {
            Some((id, snapshot)) => (id, Some(snapshot)),
            None => (random_id(), None),
        };
        self.resumed = snapshot.is_some();
        self.id = Some(id.clone());
        let session_user = match &snapshot {
            Some(snapshot) => snapshot.user.clone(),
            None => user.map(|id| SessionUser {
                id,
                since_ms: router::session::unix_ms(),
            }),
        };
        self.subscriptions.set_user(session_user);
        let ping_ms = self.node.config.websocket.ping_interval.as_millis() as u64;
        self.reply(ServerMessage::Welcome {
            session: &id,
            ping_ms,
            resumed: self.resumed,
            expires: self.expires_unix(),
            reason: not_resumed,
        })
        .await;
        let states = snapshot.map(|s| s.subscriptions).unwrap_or_default();
        // In place before the session is registered, whole: a flush while
        // they are restored one by one, then a resume elsewhere, must not
        // find only part of them.
        for state in &states {
            self.subscriptions.restore(state);
        }
        // Registered after `welcome` is queued, so that a `reconnect` from
        // the rebalancer never comes before it.
        let live = LiveSession {
            conn: self.conn,
            owner: self.owner.clone(),
            out: self.out.clone(),
            subscriptions: self.subscriptions.clone(),
        };
        if let Err(refused) = self.node.live.register(id.clone(), live, arrived) {
            let reason = match refused {
                Unregistered::Disconnected => CloseReason::Disconnected,
                Unregistered::Late => CloseReason::Unavailable,
            };
            tracing::info!(
                conn = self.conn,
                reason = reason.as_str(),
                "a connection was refused its session as it registered"
            );
            self.out.close(reason, true);
            return;
        }
        for state in states {
            // The token may grant less than the one the session began with.
            if let Err(e) = self.may(None, &state.topic, Access::Subscribe) {
                self.subscriptions.remove(&state.topic);
                self.tell(e).await;
                continue;
            }
            // Acks were checked against what was sent: the pod vouches.
            let since = Since {
                seq: state.acked,
                epoch: Some(state.epoch.to_string()),
                vouched: true,
            };
            match self.subscribe(None, state.topic.clone(), Some(since)).await {
                Ok(()) => {}
                // Redis did not answer: this subscription and those not
                // restored yet stay as stored, so that the session saved
                // when this connection ends still has them; the client
                // comes back and resumes again.
                Err(e) if e.code == ErrorCode::Unavailable => {
                    tracing::warn!(message = %e.message, "a resumed subscription could not be restored");
                    self.subscriptions
                        .insert(state.topic, state.epoch, state.acked);
                    self.out.close(CloseReason::Unavailable, true);
                    return;
                }
                // For good (its namespace is no longer configured): the
                // client is told, and the session goes on without it.
                Err(e) => {
                    self.subscriptions.remove(&state.topic);
                    self.tell(e).await;
                }
            }
        }
    }

    /// The token's expiry in Unix seconds, for `welcome` and `refresh`.
    fn expires_unix(&self) -> Option<u64> {
        let expires = self.claims.as_ref()?.expires?;
        expires.duration_since(UNIX_EPOCH).ok().map(|d| d.as_secs())
    }

    /// A new token for the same user: the connection lives on to its
    /// expiry, with its grants. Topics it no longer grants are left.
    async fn refresh(&mut self, id: u64, token: &str) -> Result<(), CommandError> {
        let Some(verifier) = self.node.verifier.clone() else {
            return Err(CommandError::new(
                Some(id),
                ErrorCode::Malformed,
                "this server does not check tokens",
            ));
        };
        let claims = match verifier.verify(token).await {
            Ok(claims) => claims,
            Err(refused) => {
                self.node.metrics.auth_failed(refused.reason());
                let (code, _) = refusal(&refused);
                return Err(CommandError::new(Some(id), code, refused.to_string()));
            }
        };
        let same_user = self.claims.as_ref().map(|c| &c.user) == Some(&claims.user);
        if !same_user {
            self.node.metrics.auth_failed("other_user");
            return Err(CommandError::new(
                Some(id),
                ErrorCode::Unauthorized,
                "a refresh must be for the connection's own user",
            ));
        }
        self.adopt(Some(claims));
        for topic in self.subscriptions.topics() {
            if let Err(mut e) = self.may(None, &topic, Access::Subscribe) {
                self.subscriptions.remove(&topic);
                self.leave(&topic).await;
                e.message = format!("`{topic}` is no longer granted; unsubscribed");
                self.tell(e).await;
            }
        }
        self.reply(ServerMessage::Ok {
            id,
            topic: None,
            seq: None,
            epoch: None,
            recovered: None,
            expires: self.expires_unix(),
        })
        .await;
        Ok(())
    }

    /// Whether this client may subscribe or publish to `topic`, as its
    /// namespace says.
    fn may(&self, id: Option<u64>, topic: &Topic, access: Access) -> Result<(), CommandError> {
        let Some(ns) = self.node.namespaces.get(topic) else {
            return Err(CommandError::new(
                id,
                ErrorCode::UnknownNamespace,
                format!("namespace `{}` is not configured", topic.namespace()),
            )
            .about(topic.as_str()));
        };
        let open = self.node.verifier.is_none();
        if access.allows(ns, topic, self.claims.as_deref(), open) {
            return Ok(());
        }
        self.node.metrics.auth_failed("forbidden");
        Err(CommandError::new(
            id,
            ErrorCode::Forbidden,
            format!("you may not {} `{topic}`", access.verb()),
        )
        .about(topic.as_str()))
    }

    /// Subscribes: live delivery first (buffered), then the topic's position
    /// and history, then the buffered messages the history did not cover.
    /// With `since`, the replay waits for its turn first ([`Replays`]), and
    /// streams at the pace the client reads ([`replay`]).
    /// Without `id` this restores a resumed subscription: no `ok`, and a
    /// `reset` when history cannot bridge the gap.
    async fn subscribe(
        &mut self,
        id: Option<u64>,
        topic: Topic,
        since: Option<Since>,
    ) -> Result<(), CommandError> {
        let node = self.node.clone();
        // Before anything is held aside or read for it.
        let _turn = match since {
            Some(_) => Some(node.replays.turn(&self.out).await.map_err(|refused| {
                CommandError::new(id, ErrorCode::Unavailable, refused.to_string())
                    .about(topic.as_str())
            })?),
            None => None,
        };
        let joined = node.hub.join(
            &topic,
            self.conn,
            self.out.clone(),
            self.subscriptions.clone(),
        );
        let watched = joined
            .watched
            .get_or_try_init(|| node.broker.watch(&topic))
            .await;
        let page = node.replays.page();
        let recovery = match watched {
            Ok(()) => node.broker.recover(&topic, since.clone(), page).await,
            Err(e) => Err(e),
        };
        let recovery = match recovery {
            Ok(recovery) => recovery,
            Err(e) => {
                self.leave(&topic).await;
                return Err(broker_error(id, e).about(topic.as_str()));
            }
        };
        let position = recovery.position.clone();
        if since.is_some() {
            let label = if recovery.recovered { "true" } else { "false" };
            node.metrics.replays.with_label_values(&[label]).inc();
        }
        let start = match &since {
            Some(since) if recovery.recovered => since.seq,
            // A restored subscription not recovered starts at its `reset`,
            // which may be where the topic's new epoch began, all of that
            // epoch following; a client's own `sub` at the topic's seq, as
            // its `ok` says.
            _ if id.is_none() => recovery.restart,
            _ => position.seq,
        };
        let first = if recovery.recovered || id.is_none() {
            recovery.publications
        } else {
            Vec::new()
        };
        // A restored subscription is sent `reset` where continuity was
        // lost, and again where it was told of one before and never acked
        // in its epoch (it may not have read it): a client that had it
        // carries on (a reset at or below what it processed in its epoch).
        let tell = id.is_none() && (!recovery.recovered || self.subscriptions.is_told(&topic));
        // Before going live: a reset among the held frames moves it on.
        if tell {
            self.subscriptions.told(&topic, &position.epoch, start);
        } else {
            self.subscriptions
                .insert(topic.clone(), position.epoch.clone(), start);
        }
        match id {
            Some(id) => {
                if let Err(e) = self.store_subscriptions(id).await {
                    self.subscriptions.remove(&topic);
                    self.leave(&topic).await;
                    return Err(e.about(topic.as_str()));
                }
                self.reply(ServerMessage::Ok {
                    id,
                    topic: Some(topic.as_str()),
                    seq: Some(position.seq),
                    epoch: Some(&position.epoch),
                    recovered: since.as_ref().map(|_| recovery.recovered),
                    expires: None,
                })
                .await;
            }
            None if tell => {
                self.reply(ServerMessage::Reset {
                    topic: topic.as_str(),
                    epoch: &position.epoch,
                    seq: start,
                })
                .await;
            }
            None => {}
        }
        self.replay(&topic, first, start, &position).await;
        Ok(())
    }

    /// With a shared store, saves the session's subscriptions before the
    /// client hears `ok` for a new one: a resume elsewhere right after (the
    /// client moved, or lost its connection before the next flush) must
    /// find it, or the client would wait for messages of a topic the resumed
    /// session does not have. Not needed with the memory store: a resume on
    /// the pod takes the live session over.
    async fn store_subscriptions(&self, command: u64) -> Result<(), CommandError> {
        let Some(id) = self.id.as_deref() else {
            return Ok(());
        };
        if self.node.config.broker == BrokerKind::Memory {
            return Ok(());
        }
        match self.save_now(id).await {
            Ok(true) => Ok(()),
            Ok(false) => {
                // Resumed by another connection meanwhile: this one is over.
                self.out.close(CloseReason::TakenOver, true);
                Err(CommandError::new(
                    Some(command),
                    ErrorCode::Unavailable,
                    "the session was resumed by another connection",
                ))
            }
            Err(e) => Err(broker_error(Some(command), e)),
        }
    }

    /// Removes this connection from a topic; the last local subscriber
    /// releases the broker's watch.
    async fn leave(&self, topic: &Topic) {
        if self.node.hub.leave(topic, self.conn) {
            self.node.broker.unwatch(topic).await;
        }
    }

    async fn reply(&self, message: ServerMessage<'_>) {
        self.out.send(frame::message(&message)).await;
    }

    /// An `err` the client's own command did not cause (a subscription it
    /// lost): not counted against it.
    async fn tell(&self, e: CommandError) {
        self.reply(ServerMessage::Err {
            id: e.id,
            code: e.code,
            message: &e.message,
            topic: e.topic.as_deref(),
        })
        .await;
    }

    async fn reject(&mut self, e: CommandError) {
        self.node.metrics.bad_commands.inc();
        tracing::debug!(conn = self.conn, code = %e.code, message = %e.message, "command rejected");
        self.tell(e).await;
        self.bad_in_a_row += 1;
        if self.bad_in_a_row >= self.node.config.websocket.max_bad_commands {
            self.out.close(CloseReason::BadCommands, true);
        }
    }

    /// Leaves every topic, saves the session (unless a backend ended the
    /// user's access), logs and counts the close.
    async fn end(mut self) {
        for topic in self.subscriptions.topics() {
            self.leave(&topic).await;
        }
        let reason = self.out.reason().unwrap_or(CloseReason::ConnectionLost);
        if let Some(id) = &self.id {
            // Not when a newer connection owns it: the store would refuse it,
            // or, had the session expired meanwhile, bring back an old copy.
            if reason != CloseReason::Disconnected && !self.subscriptions.superseded() {
                self.save(id).await;
            }
            self.node.live.deregister(id, self.conn);
        }
        self.subscriptions.end();
        self.node.metrics.closed(reason);
        let session = self.id.as_deref().map_or_else(|| "-".to_owned(), tag);
        match reason {
            CloseReason::SlowConsumer | CloseReason::WriteTimeout | CloseReason::DeadPeer => {
                tracing::warn!(
                    conn = self.conn,
                    %session,
                    reason = reason.as_str(),
                    "connection closed"
                );
            }
            _ => tracing::info!(
                conn = self.conn,
                %session,
                reason = reason.as_str(),
                "connection closed"
            ),
        }
        self.ended = true;
    }

    /// Saves the session for the resume window, unless a newer connection
    /// owns it now.
    async fn save(&self, id: &str) {
        match self.save_now(id).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::debug!(session = %tag(id), "session resumed by another connection; not saved");
            }
            Err(e) => {
                tracing::warn!(error = %Causes(&e), session = %tag(id), "session not saved; it cannot be resumed");
            }
        }
    }

    /// Saves the session as it is now, recording what the store did with
    /// it as a flush would (so the flusher does not save it again, and a
    /// refusal marks the connection superseded). Whether it was kept.
    async fn save_now(&self, id: &str) -> Result<bool, BrokerError> {
        let due = self.subscriptions.now();
        let snapshot = due.snapshot.unwrap_or_default();
        let window = self.node.config.session.resume_window;
        let kept = self
            .node
            .sessions
            .save(id, &self.owner, snapshot, window)
            .await?;
        let stored = if kept { Stored::Kept } else { Stored::Refused };
        self.subscriptions
            .stored(due.changes, stored, Instant::now());
        Ok(kept)
    }
}

fn not_subscribed(id: Option<u64>, topic: &Topic) -> CommandError {
    CommandError::new(
        id,
        ErrorCode::NotSubscribed,
        format!("not subscribed to `{topic}`"),
    )
    .about(topic.as_str())
}

fn broker_error(id: Option<u64>, e: BrokerError) -> CommandError {
    let code = match e {
        BrokerError::UnknownNamespace(_) => ErrorCode::UnknownNamespace,
        BrokerError::Unavailable(_) => ErrorCode::Unavailable,
    };
    // With its causes, as the message said when it was one string.
    CommandError::new(id, code, Causes(&e).to_string())
}

/// How a token refusal is answered: the `err` code, and the close.
fn refusal(refused: &Refused) -> (ErrorCode, CloseReason) {
    if refused.is_expired() {
        (ErrorCode::TokenExpired, CloseReason::TokenExpired)
    } else {
        (ErrorCode::Unauthorized, CloseReason::Unauthorized)
    }
}

/// A session id as logs show it: a short hash, enough to follow one
/// session's lines, useless to resume it with.
fn tag(id: &str) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    id.hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}

/// 128 random bits from a CSPRNG, hex: unguessable, and safe in any header.
/// A session's id, and a connection's owner token.
fn random_id() -> Arc<str> {
    let mut bytes = [0u8; 16];
    rand::thread_rng().fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    Arc::from(hex)
}

#[cfg(test)]
mod sizes {
    use super::*;

    /// The size of what `f` returns, without calling it.
    fn returns<A, B, C, F, Fut>(_: F) -> usize
    where
        F: Fn(A, B, C) -> Fut,
    {
        std::mem::size_of::<Fut>()
    }

    /// What an idle connection's own task holds, by part (issue #16):
    /// printed with `--nocapture`.
    #[test]
    fn sizes_of_a_connections_task() {
        println!(
            "connection task future {} (Session {}, Reader {})",
            returns(serve_upgraded),
            std::mem::size_of::<Session>(),
            std::mem::size_of::<Reader<tokio::net::tcp::OwnedReadHalf>>(),
        );
    }
}
