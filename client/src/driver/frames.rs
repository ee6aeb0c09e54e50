//! What comes in: each server frame read and acted on (`msg` by the seq
//! rule and deltas, `ok` and `err` by the id in flight they answer,
//! `reset`, `unsubscribed`, `reconnect` advice, the server's own
//! subscriptions, presence pages and diffs). Its own module: the
//! protocol's rules for what the server says, apart from what the client
//! sends.

use std::sync::Arc;
use std::time::Duration;

use serde_json::value::RawValue;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{Connection, Driver, Pending, REFRESH_RETRY, Stop};
use crate::delta::{self, Body, Unusable};
use crate::presence::{Loaded, Told};
use crate::wire::{Frame, Incoming};
use crate::{
    Advice, Error, ErrorCode, Event, HistoryPage, Message, Origin, Publication, Published,
};

impl Driver {
    /// Acts on one server frame; `Some` error: stop with it.
    pub(super) async fn frame(
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
}
