//! One live connection: the session set up on it (`unsub`s owed, `sub`s,
//! the publishes and requests that waited), then the loop that reads its
//! frames while taking commands, acking, refreshing the token and watching
//! for silence, until it ends. Its own module: the loop that dispatches
//! to the others (commands out, frames in, the ends), holding none of their
//! rules itself.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use tokio::time::{Instant, Sleep, sleep_until, timeout};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{CLOSE_DRAIN, Command, Connection, Driver, End, FAR, Pending, Stop, Welcome, Ws};
use crate::wire;
use crate::{Cause, Cut, Event, State};

impl Driver {
    /// Sets the session up on a new connection, then reads, acks and
    /// refreshes until it ends.
    pub(super) async fn connected(
        &mut self,
        mut ws: Ws,
        url: &str,
        welcome: Welcome,
    ) -> Result<End, Stop> {
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
}
