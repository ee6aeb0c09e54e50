//! The connection's loop: it reads the client's frames and acts on them,
//! keeps the heartbeat and the session's deadlines, and, once the
//! connection is over, gives back what the session held and saves it.

use prost::Message;
use proto::{Command, CommandError, v1};
use router::Topic;
use tokio::io::AsyncRead;
use tokio::time::Instant;

use super::parser::Parsed;
use super::reader::Reader;
use super::{Session, tag};
use crate::disconnect::CloseReason;
use crate::frame;

impl Session {
    /// Reads and acts on the client's frames until the connection ends.
    /// This loop's one timer also sends the heartbeat pings.
    pub(super) async fn read<R: AsyncRead + Unpin>(&mut self, reader: &mut Reader<R>) {
        let node = self.node.clone();
        let ws = &node.config.websocket;
        let idle = ws.ping_interval + ws.pong_timeout;
        let mut ping_at = Instant::now() + ws.ping_interval;
        loop {
            // Whichever comes first of the dead-peer deadline (counted from
            // the last frame) and the session's own (its first command, its
            // token's expiry).
            let silent = Instant::now() + idle;
            let (mut due, mut expired) = self.next_deadline(silent);
            // The read borrows a handle of its own: the session stays free
            // for a server-side command between two polls of the read.
            let out = self.out.clone();
            let next = {
                // Not dropped for a ping or a server-side command: a read is
                // not cancel-safe.
                let read = reader.next(&out);
                tokio::pin!(read);
                loop {
                    // Every branch but the read, the ping and a server-side
                    // command ends the connection, so dropping an unfinished
                    // read is harmless.
                    tokio::select! {
                        biased;
                        // Also woken for a server-side command (a poke): the
                        // one waiter serves both, an idle connection pays
                        // for one.
                        stopped = self.out.stopped_or_poked() => {
                            if stopped {
                                return;
                            }
                            // Boxed, as a command is: the loop would carry
                            // the handshake's future all along.
                            Box::pin(self.server_commands()).await;
                            Box::pin(self.posted_commands()).await;
                            // Or for a topic the client lags in.
                            self.catch_up_lagging();
                        }
                        _ = self.subscriptions.taken_over() => {
                            self.out.close(CloseReason::TakenOver, false);
                            return;
                        }
                        next = &mut read => break Ok(next),
                        _ = tokio::time::sleep_until(due.min(ping_at)) => {
                            if Instant::now() < ping_at {
                                if expired != CloseReason::TokenExpired || !self.proxied {
                                    break Err(());
                                }
                                // A proxy-authenticated connection's
                                // deadline is its refresh, with the read
                                // left as it was. Boxed, as a command is.
                                if !Box::pin(self.refresh_by_proxy()).await {
                                    return;
                                }
                                (due, expired) = self.next_deadline(silent);
                                continue;
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
                // Each subprotocol's own kind of message: the other is not
                // this connection's (1003). A JSON session's parser refuses
                // binary before it gets here; were one to come, the same.
                Ok(Ok(Parsed::Text(_))) if self.speaks_protobuf() => {
                    self.out.close(CloseReason::UnsupportedData, false);
                    return;
                }
                Ok(Ok(Parsed::Binary(_))) if !self.speaks_protobuf() => {
                    self.out.close(CloseReason::UnsupportedData, false);
                    return;
                }
                Ok(Ok(Parsed::Text(message) | Parsed::Binary(message)))
                    if self.out.is_closing() =>
                {
                    self.late_ack(&message);
                }
                // Boxed, as this loop is as large as the largest future it
                // awaits, for as long as the connection lives.
                Ok(Ok(Parsed::Text(message) | Parsed::Binary(message))) => {
                    Box::pin(self.command(message)).await;
                }
            }
        }
    }

    /// Whether the connection negotiated `herald.v1.protobuf`: its
    /// commands come in binary messages.
    fn speaks_protobuf(&self) -> bool {
        self.out.format().is_protobuf()
    }

    /// Whichever comes first of the session's deadline and `silent`, the
    /// dead peer's.
    fn next_deadline(&self, silent: Instant) -> (Instant, CloseReason) {
        match self.deadline() {
            Some((at, reason)) if at < silent => (at, reason),
            _ => (silent, CloseReason::DeadPeer),
        }
    }

    /// The session's next deadline besides the dead-peer timer's: the first
    /// command's, then the token's expiry (for a client the connect proxy
    /// let in: its refresh, [`Session::refresh_by_proxy`]).
    pub(super) fn deadline(&self) -> Option<(Instant, CloseReason)> {
        let at = self.due?;
        if self.id.is_none() {
            return Some((at, CloseReason::HelloTimeout));
        }
        Some((at, CloseReason::TokenExpired))
    }

    /// While the connection closes (a drain, a move) commands are ignored,
    /// but acks still count: the resume elsewhere then replays nothing the
    /// client already has.
    pub(super) fn late_ack(&self, message: &[u8]) {
        if self.speaks_protobuf() {
            if let Ok(command) = v1::ClientCommand::decode(message) {
                self.late_acked(Command::from_proto(&command));
            }
        } else if let Ok(json) = std::str::from_utf8(message) {
            self.late_acked(Command::decode(json));
        }
    }

    fn late_acked(&self, command: Result<Command<'_>, CommandError>) {
        if let Ok(Command::Ack { topic, seq, epoch }) = command
            && let Ok(topic) = Topic::parse(&topic)
            && self.never_sent(&topic, seq).is_none()
        {
            self.subscriptions.ack(&topic, seq, epoch.as_deref());
        }
    }

    /// The newest seq this pod sent for `topic`, when `seq` is above it: an
    /// ack of a seq nobody here was sent would make a resume skip messages
    /// the client never got.
    pub(super) fn never_sent(&self, topic: &Topic, seq: u64) -> Option<u64> {
        self.node.hub.head(topic).filter(|&head| seq > head)
    }

    /// Queues a heartbeat ping, stamped with when it was sent: its pong
    /// gives the round trip.
    pub(super) fn ping(&self) {
        let stamp = self.node.writing.clock.elapsed().as_micros() as u64;
        self.out
            .ping(frame::encode(frame::OP_PING, &[&stamp.to_be_bytes()]));
    }

    pub(super) fn observe_pong(&self, payload: &[u8]) {
        if let Ok(stamp) = <[u8; 8]>::try_from(payload) {
            let sent = u64::from_be_bytes(stamp);
            let now = self.node.writing.clock.elapsed().as_micros() as u64;
            if let Some(rtt) = now.checked_sub(sent) {
                self.node.metrics.ping_rtt.observe(rtt as f64 / 1e6);
            }
        }
    }

    /// Leaves every topic, saves the session (unless a backend ended the
    /// user's access), logs and counts the close.
    pub(super) async fn end(mut self) {
        let reason = self.out.reason().unwrap_or(CloseReason::ConnectionLost);
        // A client expected to come back (resume) stays a member meanwhile.
        // Not an SSE stream: it comes back as a new session, by event id.
        if let Some(id) = &self.id
            && reason.stays_present()
            && self.out.format() != crate::frame::Format::Sse
        {
            self.node.presence.linger(self.conn, id);
        }
        for topic in self.subscriptions.topics() {
            self.leave(&topic).await;
        }
        if let Some(id) = &self.id {
            // Not when a newer connection owns it: the store would refuse it,
            // or, had the session expired meanwhile, bring back an old copy.
            // Nor for an SSE stream, which resumes by event id, never by
            // session.
            if reason != CloseReason::Disconnected
                && !self.subscriptions.superseded()
                && self.out.format() != crate::frame::Format::Sse
            {
                self.save(id).await;
            }
            self.node.live.deregister(id, self.conn);
        }
        self.subscriptions.end();
        self.node.metrics.closed(reason);
        if self.id.is_some() {
            let user = self.claims.as_ref().map(|c| &c.user);
            self.node.webhooks.closed(self.conn, user, reason);
        }
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
}
