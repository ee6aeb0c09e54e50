//! The links: one pub/sub connection to the one Redis (or Sentinel's
//! master), or one to each master of a Redis Cluster, made again when it
//! drops.
//!
//! One Redis (or Sentinel's master) is one connection, a [`Link`], with
//! `SUBSCRIBE`. A Redis Cluster is a link per master, each with
//! `SSUBSCRIBE` (sharded pub/sub, Redis 7) of only the topics of its slots
//! that the pod watches, so that a publication reaches only the pods that
//! watch it. Links speak RESP3: every message is a push, taken from the
//! parser without a copy. When a link drops, for whatever reason (Redis
//! restarted, failed over, `CLIENT KILL`, the output buffer limit), the task
//! reconnects it with backoff and jitter, subscribes its topics again and
//! reads what was published meanwhile, in pipelines of
//! [`READ_BATCH`](super::history::READ_BATCH) topics. A topic watched
//! meanwhile waits for that reconnect; only once an attempt has failed
//! (Redis is away) is a new watch refused at once.

use std::time::Duration;

use backoff::Backoff;
use bytes::Bytes;
use redis::aio::MultiplexedConnection;
use redis::{PushInfo, PushKind, Value};
use tokio::time::Instant;

use super::Pubsub;
use super::flow::{Flow, Held};
use super::report::Done;
use super::subscription::timed_out;
use crate::Topic;
use crate::redis::slots;

/// The waits before a link's reconnects: up to 100 ms at first, doubling
/// per failed attempt, at random (full jitter), so that pods do not
/// reconnect in lockstep. The cap is short, so that a pod that waits for
/// Redis (at start: not ready) is back within about a second of Redis: an
/// attempt a second per pod costs Redis nothing.
const RECONNECT: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
/// The pause before a failed read of history is tried again, and the task's
/// tick for due reconnects.
pub(super) const MIN_BACKOFF: Duration = RECONNECT.first;

/// One pub/sub connection: to the one Redis, or to a cluster's master.
pub(super) struct Link {
    /// `host:port` of its master; empty for the one Redis.
    pub(super) address: String,
    /// Counts its connections: which one a [`Done`] or a push belongs to.
    pub(super) generation: u64,
    pub(super) state: LinkState,
    /// Failed attempts to connect since it was last up: the next wait's
    /// attempt number for [`RECONNECT`].
    failures: u32,
    /// Why its last attempt to connect failed; `None` once it was up since.
    last_error: Option<String>,
}

impl Link {
    /// Whether a new topic may wait for this link: it is up, connecting, or
    /// down only because its connection was lost (its reconnect is due
    /// within a tick or two, and nothing says Redis is away: a resume right
    /// after Redis restarted must not be told to come back for the pod's
    /// stale socket). A link whose last attempt failed refuses at once:
    /// Redis is away, and the caller is better told now.
    pub(super) fn takes_watches(&self) -> bool {
        !matches!(self.state, LinkState::Down { .. }) || self.last_error.is_none()
    }
}

pub(super) enum LinkState {
    /// Connecting again at `retry_at` (or when a topic needs it).
    Down {
        retry_at: Instant,
    },
    Connecting,
    Up(MultiplexedConnection),
}

/// A push from a link's connection, with where it came from.
pub(super) type Push = (usize, u64, PushInfo);

impl Pubsub {
    /// The link for `channel`: the one Redis's, or its slot's master's
    /// (made, and connecting, if new); `None` while the cluster's map has no
    /// master for it.
    pub(super) fn link_for(&mut self, channel: &str) -> Option<usize> {
        let address = if self.shards.is_cluster() {
            let slot = slots::slot(channel.as_bytes());
            self.shards.map().master(slot)?.to_owned()
        } else {
            String::new()
        };
        if let Some(i) = self.links.iter().position(|l| l.address == address) {
            return Some(i);
        }
        Some(self.add_link(address))
    }

    /// A new link to `address`, connecting.
    pub(super) fn add_link(&mut self, address: String) -> usize {
        self.links.push(Link {
            address,
            generation: 0,
            state: LinkState::Down {
                retry_at: Instant::now(),
            },
            failures: 0,
            last_error: None,
        });
        let link = self.links.len() - 1;
        self.connect(link);
        link
    }

    /// Connects `link` in the background (a [`Done::Connected`] follows).
    fn connect(&mut self, link: usize) {
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        if !matches!(l.state, LinkState::Down { .. }) {
            return;
        }
        l.generation += 1;
        l.state = LinkState::Connecting;
        let generation = l.generation;
        let connector = if l.address.is_empty() {
            Some(self.client.clone())
        } else {
            self.shards.connector(&l.address)
        };
        let pushes = self.push_sender.clone();
        let done = self.done.clone();
        let timeout = self.settings.command_timeout;
        tokio::spawn(async move {
            let result = match connector {
                Some(connector) => {
                    let sender = move |info: PushInfo| pushes.send((link, generation, info));
                    tokio::time::timeout(timeout, connector.pubsub_link(sender))
                        .await
                        .unwrap_or_else(|_| Err(timed_out()))
                }
                None => Err(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "a cluster node address that is not host:port",
                ))),
            };
            let _ = done.send(Done::Connected {
                link,
                generation,
                result,
            });
        });
    }

    /// Connects again the links whose backoff has passed, and those that
    /// topics wait for.
    pub(super) fn reconnect_due(&mut self, now: Instant) {
        let map = self.shards.map();
        let due: Vec<usize> = (0..self.links.len())
            .filter(
                |&i| matches!(self.links[i].state, LinkState::Down { retry_at } if retry_at <= now),
            )
            // A link still of use: the control channel's, a master's (a
            // former master's only while topics wait on it).
            .filter(|&i| {
                Some(i) == self.control
                    || map.masters.contains(&self.links[i].address)
                    || self.topics.values().any(|w| w.link == i)
            })
            .collect();
        for link in due {
            self.connect(link);
        }
    }

    /// The connection of `link` and its generation, while it is up.
    pub(super) fn up(&self, link: usize) -> Option<(MultiplexedConnection, u64)> {
        match self.links.get(link)? {
            Link {
                state: LinkState::Up(conn),
                generation,
                ..
            } => Some((conn.clone(), *generation)),
            _ => None,
        }
    }

    pub(super) fn is_up(&self, link: usize) -> bool {
        matches!(
            self.links.get(link).map(|l| &l.state),
            Some(LinkState::Up(_))
        )
    }

    /// A link connected, or failed to.
    pub(super) fn connected(
        &mut self,
        link: usize,
        result: redis::RedisResult<MultiplexedConnection>,
    ) {
        let is_control = Some(link) == self.control;
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        let conn = match result {
            Ok(conn) => conn,
            Err(e) => {
                let error = e.to_string();
                // Once a second while Redis is away: said again only when
                // the reason changes (`/readyz` and the metrics say it meanwhile).
                let retry_in = RECONNECT.delay(l.failures);
                if !RECONNECT.capped(l.failures) || l.last_error.as_deref() != Some(error.as_str())
                {
                    tracing::warn!(%error, node = %l.address, ?retry_in, "redis pub/sub connection failed");
                } else {
                    tracing::debug!(%error, node = %l.address, ?retry_in, "redis pub/sub connection failed");
                }
                l.state = LinkState::Down {
                    retry_at: Instant::now() + retry_in,
                };
                l.failures = l.failures.saturating_add(1);
                l.last_error = Some(error.clone());
                if is_control {
                    self.reach.down(&error);
                }
                // Watches that waited for it fail (their callers may try
                // again); the link is tried again after its backoff.
                let waiting: Vec<Topic> = self
                    .topics
                    .iter()
                    .filter(|(_, w)| w.link == link && matches!(w.flow, Flow::Starting { .. }))
                    .map(|(topic, _)| topic.clone())
                    .collect();
                for topic in waiting {
                    self.drop_pending(&topic, "redis pub/sub is reconnecting");
                }
                self.want_map();
                return;
            }
        };
        l.state = LinkState::Up(conn);
        l.failures = 0;
        l.last_error = None;
        // Everything this link had: subscribed again (all batches at once),
        // then read from where it stood.
        let mut again = Vec::new();
        for (topic, watched) in &mut self.topics {
            if watched.link != link {
                continue;
            }
            let flow = watched.flow.take();
            watched.flow = match flow {
                Flow::Live(at) => Flow::Resubscribing {
                    at,
                    held: Held::default(),
                    sent: true,
                },
                Flow::Resubscribing { at, held, .. } => Flow::Resubscribing {
                    at,
                    held,
                    sent: true,
                },
                other => other,
            };
            // Starting: watched while the link was connecting.
            if matches!(
                watched.flow,
                Flow::Resubscribing { .. } | Flow::Starting { .. }
            ) {
                again.push(topic.clone());
            }
        }
        let control = is_control.then(|| self.control_channel.clone());
        self.subscribe(link, again, control);
    }

    /// A link's connection is gone (or is dropped: a subscribe or unsubscribe
    /// failed): watches still starting on it fail (their callers may try
    /// again), its other topics are subscribed and read again once it is
    /// back (or at their slot's new master).
    pub(super) fn link_lost(&mut self, link: usize, why: &str) {
        let is_control = Some(link) == self.control;
        let Some(l) = self.links.get_mut(link) else {
            return;
        };
        if !matches!(l.state, LinkState::Up(_)) {
            return;
        }
        l.generation += 1;
        l.state = LinkState::Down {
            retry_at: Instant::now() + RECONNECT.delay(0),
        };
        let node = l.address.clone();
        let on_link: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, w)| w.link == link)
            .map(|(t, _)| t.clone())
            .collect();
        tracing::warn!(
            topics = on_link.len(),
            %node,
            "redis pub/sub connection lost ({why}); reconnecting"
        );
        for topic in on_link {
            self.drop_pending(&topic, "redis pub/sub connection lost");
        }
        if is_control {
            self.observer.pubsub_up(false);
            self.reach.down("the pub/sub connection was lost");
        }
        self.observer.pubsub_backlog(self.held);
        self.want_map();
    }

    /// A push from a link: a message, an unsubscribe Redis sent by itself,
    /// the connection's end.
    pub(super) fn push(&mut self, (link, generation, push): Push) {
        if self
            .links
            .get(link)
            .is_none_or(|l| l.generation != generation)
        {
            return;
        }
        let PushInfo { kind, mut data } = push;
        match kind {
            PushKind::Message | PushKind::SMessage => {
                let (Some(Value::BulkString(payload)), Some(Value::BulkString(channel))) =
                    (data.pop(), data.pop())
                else {
                    return;
                };
                match std::str::from_utf8(&channel) {
                    Ok(channel) => self.message(channel, Bytes::from(payload)),
                    Err(_) => tracing::warn!("a message on a channel whose name is not UTF-8"),
                }
            }
            PushKind::Disconnection => self.link_lost(link, "disconnected"),
            PushKind::SUnsubscribe | PushKind::Unsubscribe => {
                // Our own unsubscribes are confirmed here too (a topic that
                // is leaving); any other is Redis's: the topic's slot moved
                // to another master.
                let Some(Value::BulkString(channel)) = data.first() else {
                    return;
                };
                let Some(topic) = std::str::from_utf8(channel)
                    .ok()
                    .and_then(|c| self.keys.topic_of_channel(c))
                else {
                    return;
                };
                if let Some(watched) = self.topics.get(&topic)
                    && watched.link == link
                    && !matches!(watched.flow, Flow::Leaving { .. } | Flow::Starting { .. })
                {
                    tracing::info!(%topic, "redis unsubscribed a topic (its slot moved); following it");
                    self.drop_pending(&topic, "its slot moved");
                    self.want_map();
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_waiting_for_redis_tries_at_least_once_a_second() {
        // So that a pod that started without Redis is ready within about a
        // second of Redis coming back, however long it waited.
        for failures in 0..50 {
            let wait = RECONNECT.delay(failures);
            assert!(wait <= Duration::from_secs(1), "{wait:?}");
        }
        assert_eq!(RECONNECT.ceiling(50), Duration::from_secs(1));
    }
}
