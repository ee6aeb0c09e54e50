//! Watches: the broker's commands to the task, and how many watch each
//! topic.

use std::collections::HashMap;

use tokio::sync::oneshot;
use tokio::time::Instant;

use super::Pubsub;
use super::flow::{Flow, Held};
use crate::{BrokerError, Topic};

/// What the broker asks of the task: a topic watched (answered once its
/// flow has started, or refused), or a watch ended.
pub enum Command {
    Watch(Topic, oneshot::Sender<Result<(), BrokerError>>),
    Unwatch(Topic),
}

/// The answer to a watch.
pub(super) type Reply = oneshot::Sender<Result<(), BrokerError>>;

/// A watched topic: its watches, its link and its flow.
pub(super) struct Watched {
    /// Watches not yet unwatched.
    pub(super) count: usize,
    /// When `count` fell to 0: unsubscribed once the linger has passed.
    pub(super) idle_since: Option<Instant>,
    /// The link it is (to be) subscribed on.
    pub(super) link: usize,
    pub(super) flow: Flow,
}

impl Pubsub {
    /// Handles watches and unwatches that arrived together: new topics are
    /// subscribed in one pipeline per link, then their positions read.
    pub(super) fn command(&mut self, batch: Vec<Command>) {
        let mut new: HashMap<usize, Vec<Topic>> = HashMap::new();
        for command in batch {
            match command {
                Command::Unwatch(topic) => self.release(&topic),
                Command::Watch(topic, reply) => match self.topics.get_mut(&topic) {
                    Some(watched) => {
                        watched.count += 1;
                        watched.idle_since = None;
                        match &mut watched.flow {
                            Flow::Starting { waiters, .. } | Flow::Leaving { waiters } => {
                                waiters.push(reply)
                            }
                            // Subscribed, or being subscribed again: what is
                            // published from now on reaches the sink.
                            Flow::Live(_) | Flow::Catching { .. } | Flow::Resubscribing { .. } => {
                                if reply.send(Ok(())).is_err() {
                                    self.release(&topic);
                                }
                            }
                        }
                    }
                    None => {
                        let channel = self.keys.channel(&topic);
                        // A link that is connecting, or lost and about to
                        // reconnect, subscribes it when it is up; one that
                        // failed to connect refuses it.
                        let link = match self.link_for(&channel) {
                            Some(link) if self.links[link].takes_watches() => link,
                            _ => {
                                self.want_map();
                                let _ = reply.send(Err(BrokerError::unavailable(
                                    "redis pub/sub is reconnecting",
                                )));
                                continue;
                            }
                        };
                        self.topics.insert(
                            topic.clone(),
                            Watched {
                                count: 1,
                                idle_since: None,
                                link,
                                flow: Flow::Starting {
                                    waiters: vec![reply],
                                    held: Held::default(),
                                },
                            },
                        );
                        if self.is_up(link) {
                            new.entry(link).or_default().push(topic);
                        }
                    }
                },
            }
        }
        for (link, topics) in new {
            self.subscribe(link, topics, None);
        }
    }

    /// One watch fewer.
    pub(super) fn release(&mut self, topic: &Topic) {
        if let Some(watched) = self.topics.get_mut(topic) {
            watched.count = watched.count.saturating_sub(1);
            if watched.count == 0 {
                watched.idle_since = Some(Instant::now());
            }
        }
    }

    /// Ends the subscriptions nobody watched for the linger time.
    pub(super) fn unsubscribe_idle(&mut self) {
        let linger = self.settings.linger;
        let now = Instant::now();
        let idle: Vec<Topic> = self
            .topics
            .iter()
            .filter(|(_, w)| {
                w.count == 0
                    && !matches!(w.flow, Flow::Leaving { .. })
                    && w.idle_since
                        .is_some_and(|t| now.duration_since(t) >= linger)
            })
            .map(|(topic, _)| topic.clone())
            .collect();
        self.leave(idle);
    }
}
