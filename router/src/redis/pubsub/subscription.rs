//! Subscribing and unsubscribing channels on a link, and what Redis
//! answered.

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{PushKind, Value};

use super::Pubsub;
use super::flow::{Flow, Held};
use super::history::READ_BATCH;
use super::link::LinkState;
use super::report::Done;
use crate::Topic;
use crate::redis::call::failed;

/// Channels per pipeline of `SUBSCRIBE` or `UNSUBSCRIBE` commands.
const SUBSCRIBE_BATCH: usize = 500;

/// How Redis answered the subscribe of one channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Subscription {
    Confirmed,
    /// Another master serves its slot now (`MOVED`): read the map again.
    Elsewhere,
}

impl Pubsub {
    /// Subscribes the topics that wait for it on links that are up (the
    /// others are subscribed when their link comes back: see
    /// [`Pubsub::reconnect_due`]).
    pub(super) fn resubscribe_waiting(&mut self) {
        let mut by_link: HashMap<usize, Vec<Topic>> = HashMap::new();
        for (topic, watched) in &mut self.topics {
            if let Flow::Resubscribing { sent, .. } = &mut watched.flow
                && !*sent
                && matches!(
                    self.links.get(watched.link).map(|l| &l.state),
                    Some(LinkState::Up(_))
                )
            {
                *sent = true;
                by_link.entry(watched.link).or_default().push(topic.clone());
            }
        }
        for (link, topics) in by_link {
            self.subscribe(link, topics, None);
        }
    }

    /// Subscribes `topics` (and `control`, the control channel) on `link`,
    /// in the background.
    pub(super) fn subscribe(&self, link: usize, topics: Vec<Topic>, control: Option<String>) {
        let Some((mut conn, generation)) = self.up(link) else {
            return;
        };
        if topics.is_empty() && control.is_none() {
            return;
        }
        let sharded = self.shards.is_cluster();
        let channels: Vec<String> = topics.iter().map(|t| self.keys.channel(t)).collect();
        let (observer, done) = (self.observer.clone(), self.done.clone());
        let timeout = self.settings.command_timeout;
        tokio::spawn(async move {
            let start = std::time::Instant::now();
            let subscribing = async {
                if let Some(control) = &control {
                    // The control channel is not a shard channel.
                    let confirmed =
                        confirm(&mut conn, "SUBSCRIBE", std::slice::from_ref(control)).await?;
                    if confirmed.first() != Some(&Subscription::Confirmed) {
                        return Err(broken("the control channel's subscribe was not confirmed"));
                    }
                }
                let command = if sharded { "SSUBSCRIBE" } else { "SUBSCRIBE" };
                let mut outcomes = Vec::with_capacity(channels.len());
                for chunk in channels.chunks(SUBSCRIBE_BATCH) {
                    outcomes.extend(confirm(&mut conn, command, chunk).await?);
                }
                Ok(outcomes)
            };
            let result = tokio::time::timeout(timeout, subscribing)
                .await
                .unwrap_or_else(|_| Err(timed_out()));
            observer.redis_call("subscribe", start.elapsed().as_secs_f64(), result.is_ok());
            let _ = done.send(Done::Subscribed {
                link,
                generation,
                topics,
                result: result.map_err(|e| failed("subscribe", e)),
            });
        });
    }

    /// A subscribe was answered: starting topics read their position, those
    /// subscribed again catch up; a topic whose slot moved waits for the map.
    pub(super) fn subscribed(
        &mut self,
        link: usize,
        topics: Vec<Topic>,
        outcomes: Vec<Subscription>,
    ) {
        if Some(link) == self.control && !self.reach.connected() {
            self.observer.pubsub_up(true);
            self.reach.up();
        }
        tracing::debug!(?topics, "subscribed");
        let mut reads = Vec::new();
        let mut elsewhere = false;
        for (topic, outcome) in topics.into_iter().zip(outcomes) {
            let Some(watched) = self.topics.get_mut(&topic) else {
                continue;
            };
            if watched.link != link {
                continue;
            }
            if outcome == Subscription::Elsewhere {
                elsewhere = true;
                self.drop_pending(&topic, "its slot moved");
                continue;
            }
            let flow = watched.flow.take();
            let presence = self.namespaces.get(&topic).is_some_and(|ns| ns.presence);
            if presence && matches!(flow, Flow::Resubscribing { .. } | Flow::Starting { .. }) {
                // Every change from now on reaches this pod: read the room.
                self.presence.subscribed(&topic);
            }
            watched.flow = match flow {
                Flow::Resubscribing { at, held, .. } => {
                    reads.push(topic);
                    Flow::Catching {
                        at,
                        held,
                        reissued: false,
                    }
                }
                flow @ Flow::Starting { .. } => {
                    reads.push(topic);
                    flow
                }
                other => other,
            };
        }
        for batch in reads.chunks(READ_BATCH) {
            self.read(link, batch.to_vec(), Duration::ZERO);
        }
        if elsewhere {
            self.want_map();
        }
    }

    /// Unsubscribes `topics` in the background; they are `Leaving` until
    /// Redis confirms it. A topic on a link that is down is forgotten at
    /// once (there is no subscription to end).
    pub(super) fn leave(&mut self, topics: Vec<Topic>) {
        if topics.is_empty() {
            return;
        }
        tracing::debug!(?topics, "leaving");
        let mut by_link: HashMap<usize, Vec<Topic>> = HashMap::new();
        for topic in topics {
            let Some(watched) = self.topics.get_mut(&topic) else {
                continue;
            };
            let link = watched.link;
            let mut flow = std::mem::replace(
                &mut watched.flow,
                Flow::Leaving {
                    waiters: Vec::new(),
                },
            );
            if let Some(held) = flow.held() {
                self.held -= held.items.len();
            }
            if self.is_up(link) {
                by_link.entry(link).or_default().push(topic);
            } else {
                self.topics.remove(&topic);
                self.presence.forget(&topic);
            }
        }
        self.observer.pubsub_backlog(self.held);
        for (link, topics) in by_link {
            let Some((mut conn, generation)) = self.up(link) else {
                continue;
            };
            let command = self.unsubscribe_command();
            let channels: Vec<String> = topics.iter().map(|t| self.keys.channel(t)).collect();
            let (done, timeout) = (self.done.clone(), self.settings.command_timeout);
            tokio::spawn(async move {
                let mut result = Ok(());
                for chunk in channels.chunks(SUBSCRIBE_BATCH) {
                    let unsubscribing = confirm(&mut conn, command, chunk);
                    result = tokio::time::timeout(timeout, unsubscribing)
                        .await
                        .unwrap_or_else(|_| Err(timed_out()))
                        .map(drop)
                        .map_err(|e| failed("unsubscribe", e));
                    if result.is_err() {
                        break;
                    }
                }
                let _ = done.send(Done::Unsubscribed {
                    link,
                    generation,
                    topics,
                    result,
                });
            });
        }
    }

    /// An unsubscribe was confirmed: a topic that nobody watched since is
    /// forgotten; one watched meanwhile is subscribed again.
    pub(super) fn unsubscribed(&mut self, link: usize, topics: Vec<Topic>) {
        let mut again = Vec::new();
        for topic in topics {
            let Some(watched) = self.topics.get_mut(&topic) else {
                continue;
            };
            match &mut watched.flow {
                Flow::Leaving { waiters } if waiters.is_empty() => {
                    self.topics.remove(&topic);
                    self.presence.forget(&topic);
                }
                Flow::Leaving { waiters } => {
                    watched.flow = Flow::Starting {
                        waiters: std::mem::take(waiters),
                        held: Held::default(),
                    };
                    again.push(topic);
                }
                _ => {}
            }
        }
        self.subscribe(link, again, None);
    }

    /// Unsubscribes channels that moved away from `link`, in the
    /// background; how it went matters to nobody (the node may be gone).
    pub(super) fn unsubscribe_channels(&self, link: usize, channels: Vec<String>) {
        let Some((mut conn, _)) = self.up(link) else {
            return;
        };
        let command = self.unsubscribe_command();
        let timeout = self.settings.command_timeout;
        tokio::spawn(async move {
            for chunk in channels.chunks(SUBSCRIBE_BATCH) {
                let _ = tokio::time::timeout(timeout, confirm(&mut conn, command, chunk)).await;
            }
        });
    }

    fn unsubscribe_command(&self) -> &'static str {
        if self.shards.is_cluster() {
            "SUNSUBSCRIBE"
        } else {
            "UNSUBSCRIBE"
        }
    }
}

/// Sends `command` (`SUBSCRIBE`, `SSUBSCRIBE`, or their unsubscribes) for
/// each channel, one command each in one pipeline, and checks each answer.
/// A channel whose slot another master serves now is
/// [`Subscription::Elsewhere`]. Any other answer than the command's
/// confirmation (an unsubscribe Redis sent by itself, taken for an answer)
/// fails the whole: the link is then made again, which leaves no doubt
/// about what it is subscribed to.
async fn confirm(
    conn: &mut MultiplexedConnection,
    command: &'static str,
    channels: &[String],
) -> redis::RedisResult<Vec<Subscription>> {
    let kind = match command {
        "SUBSCRIBE" => PushKind::Subscribe,
        "SSUBSCRIBE" => PushKind::SSubscribe,
        "UNSUBSCRIBE" => PushKind::Unsubscribe,
        _ => PushKind::SUnsubscribe,
    };
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    for channel in channels {
        pipe.cmd(command).arg(channel);
    }
    let replies: Vec<Value> = pipe.query_async(conn).await?;
    channels
        .iter()
        .zip(replies)
        .map(|(channel, reply)| match reply {
            Value::Push { kind: k, data }
                if k == kind
                    && matches!(data.first(), Some(Value::BulkString(c)) if c == channel.as_bytes()) =>
            {
                Ok(Subscription::Confirmed)
            }
            Value::ServerError(e)
                if matches!(
                    e.kind(),
                    Some(
                        redis::ServerErrorKind::Moved
                            | redis::ServerErrorKind::Ask
                            | redis::ServerErrorKind::ClusterDown
                            | redis::ServerErrorKind::TryAgain
                    )
                ) =>
            {
                Ok(Subscription::Elsewhere)
            }
            other => Err(broken(&format!(
                "{command} {channel} was answered with {other:?}"
            ))),
        })
        .collect()
}

fn broken(what: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Client,
        "an unexpected pub/sub answer",
        what.to_owned(),
    ))
}

pub(super) fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "timed out",
    ))
}
