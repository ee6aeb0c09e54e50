//! A session over a plain HTTP response (issue #25): an SSE stream
//! (`GET /sse`, read-only, its topics named by the request, resumed by
//! event id) or an HTTP-streaming one (`POST /stream`, a whole session:
//! `welcome`, resume by `hello.session`, server-side subscriptions, and
//! commands posted beside it that reach it through the registry).
//!
//! The same [`Session`] as a WebSocket's, the same handshake, replay, hub,
//! presence, registry and drain; only its frames are written in the
//! stream's [`Format`], and its read side has no client frames: it notices
//! the client going away and otherwise waits. The request was read and
//! checked (auth, origin, admission, limits) by [`crate::streams`] before
//! the response began.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use proto::{Command, ErrorCode, ServerMessage};
use router::{Position, Since, Topic};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::{Handshake, Pod, Session, writer};
use crate::admission::Admission;
use crate::auth::Claims;
use crate::disconnect::CloseReason;
use crate::frame::Format;
use crate::outbound::{Mark, Outbound, Place};

/// What a stream's request asked for, checked.
pub struct Opening {
    pub format: Format,
    /// The token's claims, verified before the response began; `None` for
    /// an anonymous client, or one the connect proxy is to name.
    pub claims: Option<Claims>,
    /// No token: the connect proxy says who the client is (`data` for it).
    pub by_proxy: bool,
    pub data: Option<Box<serde_json::value::RawValue>>,
    /// HTTP-streaming: the session to resume (`hello.session`).
    pub resume: Option<String>,
    /// SSE: its topics in the request's order, each from where the client
    /// stands (`Last-Event-ID`, or `since.<topic>`).
    pub topics: Vec<(Topic, Option<Since>)>,
    /// For the connect proxy: the request's allow-listed headers.
    pub handshake: Option<Box<Handshake>>,
}

/// Serves a stream whose response head was written, until it ends.
pub fn serve_stream(
    stream: TcpStream,
    node: Arc<Pod>,
    admission: Admission,
    opening: Opening,
) -> impl Future<Output = ()> {
    let limits = node.config.queue_limits();
    let (read, write) = stream.into_split();
    // The raw socket, shared with the fan-out as a WebSocket's is: its
    // direct writes reach an idle stream without a wake-up.
    let (out, write) = Outbound::with_socket_as(limits, write, opening.format);
    serve(read, write, out, node, admission, opening)
}

/// [`serve_stream`] over a pipe whose other end is an HTTP response's body
/// (a stream request that came on a kept-alive connection hyper serves):
/// the writer writes every frame, the fan-out none directly. The pipe's
/// other end dropped (the client gone) ends the stream as an EOF would.
pub fn serve_piped(
    pipe: tokio::io::DuplexStream,
    node: Arc<Pod>,
    admission: Admission,
    opening: Opening,
) -> impl Future<Output = ()> {
    let out = Outbound::formatted(node.config.queue_limits(), opening.format);
    let (read, write) = tokio::io::split(pipe);
    serve(read, write, out, node, admission, opening)
}

fn serve<R, W>(
    read: R,
    write: W,
    out: Outbound,
    node: Arc<Pod>,
    admission: Admission,
    opening: Opening,
) -> impl Future<Output = ()>
where
    R: AsyncRead + Unpin + Send + 'static,
    W: tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    if opening.format == Format::Sse {
        out.track_events(places(&opening.topics));
    }
    let mut session = Session::new(node, &admission, out);
    async move {
        let writing = writer::run(write, session.out.clone(), session.node.writing.clone());
        let reading = async {
            Box::pin(session.open(opening)).await;
            session.watch(read).await;
        };
        tokio::join!(writing, reading);
        Box::pin(session.end()).await;
        drop(admission);
    }
}

/// Where an SSE stream starts in each topic: its ids until the topic's
/// `ok` places it.
fn places(topics: &[(Topic, Option<Since>)]) -> Vec<Place> {
    topics
        .iter()
        .map(|(topic, since)| {
            let (epoch, seq) = match since {
                Some(since) => (since.epoch.as_deref().map(Box::from), since.seq),
                None => (None, 0),
            };
            Place {
                topic: topic.as_str().into(),
                epoch,
                seq,
            }
        })
        .collect()
}

impl Session {
    /// The stream's `hello`, then (SSE) its topics, each a client's `sub`
    /// in all but its answer: a topic refused ends the stream after its
    /// `err`.
    async fn open(&mut self, opening: Opening) {
        self.handshake = opening.handshake;
        if opening.by_proxy {
            let data = opening.data.as_deref();
            Box::pin(self.hello(None, opening.resume.as_deref(), data)).await;
        } else {
            let arrived = self.node.live.arrival();
            let resume = opening.resume.as_deref();
            Box::pin(self.begin(arrived, false, opening.claims, resume)).await;
        }
        if self.id.is_none() {
            return;
        }
        self.settle_account();
        for (topic, since) in opening.topics {
            if self.out.is_closing() {
                return;
            }
            let command = Command::Sub {
                id: 0,
                topic: Cow::Borrowed(topic.as_str()),
                since: since.as_ref().map(|s| s.seq),
                epoch: since
                    .as_ref()
                    .and_then(|s| s.epoch.as_deref().map(Cow::Borrowed)),
                data: None,
                delta: false,
            };
            if let Err(mut e) = Box::pin(self.act(command, &Bytes::new())).await {
                e.id = None;
                self.node.metrics.bad_commands.inc();
                tracing::debug!(conn = self.conn, code = %e.code, "an SSE topic refused");
                let reason = match e.code {
                    ErrorCode::Unavailable => CloseReason::Unavailable,
                    ErrorCode::Forbidden | ErrorCode::Unauthorized => CloseReason::Unauthorized,
                    _ => CloseReason::BadCommands,
                };
                self.tell(e).await;
                self.out.close(reason, true);
                return;
            }
        }
    }

    /// An SSE topic's `ok` (no `id`, `reason: "sse"`), which places the
    /// stream at `start` in it; a `reset` too where the client's place
    /// (`since`) could not be continued from history.
    pub(super) async fn sse_subscribed(
        &self,
        topic: &Topic,
        position: &Position,
        start: u64,
        since: bool,
        recovered: bool,
    ) {
        let message = ServerMessage::Subscribed {
            topic: topic.as_str(),
            seq: position.seq,
            epoch: &position.epoch,
            recovered: since.then_some(recovered),
            reason: "sse",
        };
        let mark = Mark {
            topic: topic.as_str(),
            epoch: &position.epoch,
            seq: start,
        };
        let frame = crate::frame::message(self.out.format(), &message);
        self.out.send_marked(frame, Some(mark)).await;
        if since && !recovered {
            self.reply(ServerMessage::Reset {
                topic: topic.as_str(),
                epoch: &position.epoch,
                seq: start,
            })
            .await;
        }
    }

    /// The stream's loop: no client frames, only its going away (EOF, an
    /// error), the heartbeat, the token's expiry, a takeover, and the
    /// commands that reach the session through the registry.
    async fn watch(&mut self, mut read: impl AsyncRead + Unpin) {
        let node = self.node.clone();
        let ws = &node.config.websocket;
        let heartbeat = self.out.format().heartbeat();
        let mut beat_at = Instant::now() + ws.ping_interval;
        loop {
            if self.id.is_none() {
                // `hello` failed: its `err` is queued, the close asked for.
                self.out.stopped().await;
                return;
            }
            let due = self.deadline().map(|(at, _)| at);
            let wake = due.map_or(beat_at, |due| due.min(beat_at));
            tokio::select! {
                biased;
                stopped = self.out.stopped_or_poked() => {
                    if stopped {
                        return;
                    }
                    // The hook for posted commands (`POST /stream/<session>`)
                    // and a backend's server-side subscriptions: run between
                    // two waits, as a WebSocket's loop runs them.
                    if self.out.format() == Format::Sse {
                        self.drop_server_commands();
                    } else {
                        Box::pin(self.server_commands()).await;
                        Box::pin(self.posted_commands()).await;
                    }
                    // Or for a topic the client lags in.
                    self.catch_up_lagging();
                }
                _ = self.subscriptions.taken_over() => {
                    self.out.close(CloseReason::TakenOver, false);
                    return;
                }
                gone = gone(&mut read) => {
                    self.out.note_reason(if gone { CloseReason::ClientClosed } else { CloseReason::ConnectionLost });
                    self.out.stop();
                    return;
                }
                _ = tokio::time::sleep_until(wake) => {
                    if due.is_some_and(|due| Instant::now() >= due) {
                        if self.proxied {
                            if !Box::pin(self.refresh_by_proxy()).await {
                                return;
                            }
                            continue;
                        }
                        self.node.metrics.auth_failed("expired");
                        self.out.close(CloseReason::TokenExpired, true);
                        return;
                    }
                    if let Some(beat) = &heartbeat {
                        self.out.ping(beat.clone());
                    }
                    beat_at = Instant::now() + ws.ping_interval;
                }
            }
        }
    }

    /// An SSE stream holds the topics its request named, no others: a
    /// backend's server-side subscription of its user does not reach it
    /// (its event ids could not place it), and is counted as unchanged.
    fn drop_server_commands(&self) {
        let Some(id) = self.id.clone() else { return };
        while self.node.live.next_command(&id).is_some() {
            self.node
                .metrics
                .server_subscriptions_applied
                .with_label_values(&["subscribe", "unchanged"])
                .inc();
        }
    }
}

/// Resolves when the client is gone: `true` at EOF (it closed), `false`
/// on an error. Whatever it sends meanwhile is read and dropped, so that
/// its bytes cannot fill the socket's buffer; the buffer lives in the poll
/// alone, not in the connection's state.
async fn gone(read: &mut (impl AsyncRead + Unpin)) -> bool {
    std::future::poll_fn(|cx| {
        loop {
            let mut buf = [0u8; 256];
            let mut buf = ReadBuf::new(&mut buf);
            match Pin::new(&mut *read).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(true),
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(_)) => return Poll::Ready(false),
                Poll::Pending => return Poll::Pending,
            }
        }
    })
    .await
}
