//! What goes out: the application's commands (noted while away, sent while
//! connected), the `sub` for a topic, `presence`, `history` and `rpc`
//! requests, the pages of a tracked topic's presence, the token's
//! `refresh`, and acks. Its own module: what the client sends, and the
//! ids in flight ([`Pending`]) by which the frames that answer are matched;
//! nothing here reads a frame.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::SinkExt;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite::Message as WsMessage;

use super::{Command, Connection, Driver, Pending, REFRESH_RETRY, Sub, Ws};
use crate::presence::Tracker;
use crate::wire;
use crate::{Error, Event, Since};

impl Driver {
    /// A command while there is no connection: noted for the next one.
    pub(super) fn take_offline(&mut self, command: Command) {
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
    pub(super) fn add_sub(&mut self, topic: Arc<str>, since: Option<Since>, delta: bool) -> bool {
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

    /// The message of a `presence`, `history` or `rpc` the application
    /// asked for (`None` for any other command).
    pub(super) fn request(&mut self, command: Command) -> Option<WsMessage> {
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
    pub(super) fn load_presence(&mut self, topic: &Arc<str>) {
        let Some(tracker) = self.trackers.get_mut(topic) else {
            return;
        };
        let load = tracker.restart();
        self.presence_page(topic, load, None);
    }

    pub(super) fn presence_page(&mut self, topic: &Arc<str>, load: u64, cursor: Option<&str>) {
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

    pub(super) fn id(&mut self, pending: Pending) -> u64 {
        self.next_id += 1;
        self.pending.insert(self.next_id, pending);
        self.next_id
    }

    /// The `sub` for `topic`: with `since` where the client has a
    /// position, and `delta` where it asks for deltas. `None` for a topic
    /// without a subscription.
    pub(super) fn sub_command(&mut self, topic: &Arc<str>) -> Option<WsMessage> {
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
    pub(super) fn refresh_at(&self, expires: u64) -> Instant {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let left = Duration::from_secs(expires).saturating_sub(now);
        let lead = self.s.refresh_before.min(left / 2);
        Instant::now() + left.saturating_sub(lead)
    }

    /// A command while connected.
    pub(super) async fn take_online(
        &mut self,
        command: Command,
        ws: &mut Ws,
    ) -> Result<(), String> {
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

    pub(super) async fn refresh(
        &mut self,
        ws: &mut Ws,
        conn: &mut Connection,
    ) -> Result<(), String> {
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
    pub(super) fn merge_taken(&mut self) {
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
    pub(super) async fn flush_acks(&mut self, ws: &mut Ws) -> Result<(), String> {
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
}
