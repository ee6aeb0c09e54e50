//! What a task that talked to Redis reports back ([`Done`]), and where each
//! report goes (if it still applies).

use redis::aio::MultiplexedConnection;

use super::Pubsub;
use super::subscription::Subscription;
use crate::redis::recover::Recovered;
use crate::{BrokerError, Causes, Publication, Topic};

/// What a task that talked to Redis reports back. `link` and `generation`
/// name the connection it was started on: a report about an earlier one (or
/// about a topic that has moved to another link) is ignored.
pub(super) enum Done {
    Connected {
        link: usize,
        generation: u64,
        result: redis::RedisResult<MultiplexedConnection>,
    },
    Subscribed {
        link: usize,
        generation: u64,
        topics: Vec<Topic>,
        result: Result<Vec<Subscription>, BrokerError>,
    },
    Read {
        link: usize,
        generation: u64,
        topics: Vec<Topic>,
        result: Result<Vec<Recovered>, BrokerError>,
    },
    Filled {
        link: usize,
        generation: u64,
        topic: Topic,
        upto: u64,
        result: Result<Vec<Publication>, BrokerError>,
    },
    Unsubscribed {
        link: usize,
        generation: u64,
        topics: Vec<Topic>,
        result: Result<(), BrokerError>,
    },
    /// The cluster's slot map was read.
    Mapped(Result<(), BrokerError>),
}

impl Pubsub {
    /// Whether `generation` is no longer `link`'s connection.
    fn stale(&self, link: usize, generation: u64) -> bool {
        self.links
            .get(link)
            .is_none_or(|l| l.generation != generation)
    }

    /// Whether a report from `link`'s connection `generation` about `topic`
    /// still applies: the link has not reconnected since, and the topic is
    /// still on it.
    fn current(&self, link: usize, generation: u64, topic: &Topic) -> bool {
        self.links
            .get(link)
            .is_some_and(|l| l.generation == generation)
            && self.topics.get(topic).is_some_and(|w| w.link == link)
    }

    /// A report from Redis work.
    pub(super) fn done(&mut self, done: Done) {
        match done {
            Done::Connected {
                link,
                generation,
                result,
            } => {
                if self
                    .links
                    .get(link)
                    .is_some_and(|l| l.generation == generation)
                {
                    self.connected(link, result);
                }
            }
            Done::Mapped(result) => {
                self.mapping = false;
                match result {
                    Ok(()) => self.mapped(),
                    Err(e) => {
                        tracing::warn!(error = %Causes(&e), "reading the redis cluster's slot map failed");
                        if self.control.is_none() {
                            // Not even the map yet: `/readyz` says why.
                            self.reach.down(&e.to_string());
                        }
                    }
                }
                if self.map_wanted {
                    self.read_map();
                }
            }
            Done::Subscribed {
                link,
                generation,
                topics,
                result,
            } => {
                if self.stale(link, generation) {
                    return;
                }
                match result {
                    Ok(outcomes) => self.subscribed(link, topics, outcomes),
                    Err(e) => {
                        tracing::warn!(error = %Causes(&e), "redis subscribe failed");
                        self.link_lost(link, "a subscribe failed");
                    }
                }
            }
            Done::Unsubscribed {
                link,
                generation,
                topics,
                result,
            } => {
                if self.stale(link, generation) {
                    return;
                }
                tracing::debug!(?topics, ?result, "unsubscribed");
                match result {
                    Ok(()) => self.unsubscribed(link, topics),
                    Err(e) => {
                        tracing::warn!(error = %Causes(&e), "redis unsubscribe failed");
                        self.link_lost(link, "an unsubscribe failed");
                    }
                }
            }
            Done::Read {
                link,
                generation,
                topics,
                result,
            } => {
                match result {
                    // Each read paired with its topic before those that no
                    // longer apply are left out: the reads are in the order
                    // of all the topics.
                    Ok(reads) => {
                        for (topic, recovered) in topics.into_iter().zip(reads) {
                            if self.current(link, generation, &topic) {
                                self.positioned(&topic, recovered);
                            }
                        }
                    }
                    Err(e) => {
                        let topics: Vec<Topic> = topics
                            .into_iter()
                            .filter(|t| self.current(link, generation, t))
                            .collect();
                        self.read_failed(link, topics, e);
                    }
                }
            }
            Done::Filled {
                link,
                generation,
                topic,
                upto,
                result,
            } => {
                if !self.current(link, generation, &topic) {
                    return;
                }
                match result {
                    Ok(publications) => self.filled(&topic, upto, publications),
                    Err(e) => self.fill_failed(&topic, upto, e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;
    use crate::observe::Ignore;
    use crate::redis::connection::Commands;
    use crate::redis::lineage::Lineage;
    use crate::redis::pubsub::flow::{Flow, Held};
    use crate::redis::pubsub::watch::Watched;
    use crate::redis::reach::Reach;
    use crate::redis::shards::Shards;
    use crate::redis::{DEFAULT_PREFIX, RedisSettings, TlsFiles};
    use crate::{Deliver, Epoch, Namespaces, Position};

    /// A sink for what nobody here looks at.
    struct Sink;

    impl Deliver for Sink {
        fn deliver(&self, _: &Publication, _: Option<&str>) {}

        fn reset(&self, _: &Topic, _: &Position) {}

        fn disconnect(&self, _: &str) {}
    }

    /// The task's state for one Redis at an address nobody listens on:
    /// nothing here talks to it.
    fn pubsub() -> Pubsub {
        let settings = RedisSettings {
            url: "redis://127.0.0.1:1".into(),
            password: None,
            tls: TlsFiles::default(),
            sentinel: None,
            cluster: Vec::new(),
            command_timeout: Duration::from_secs(1),
            linger: Duration::from_secs(1),
            prefix: DEFAULT_PREFIX.into(),
            presence: crate::PresenceSettings::default(),
        };
        let connector = settings.connector().expect("a valid URL");
        let shards = Shards::one(Commands::lazy(connector.clone()));
        let presence = crate::redis::presence::Presence::start(
            shards.clone(),
            shards.clone(),
            DEFAULT_PREFIX,
            Arc::new(Sink),
            Arc::new(Ignore),
            settings.presence.clone(),
            Duration::from_secs(1),
            false,
        );
        Pubsub::new(
            connector,
            shards,
            Arc::new(Sink),
            Arc::new(Ignore),
            Arc::new(Lineage::new(Arc::new(Ignore), false)),
            Arc::new(Namespaces::default()),
            settings,
            Reach::new("redis".into()),
            presence.replicas(),
        )
    }

    fn recovered(epoch: &Epoch, seq: u64) -> Recovered {
        Recovered {
            position: Position {
                epoch: epoch.clone(),
                seq,
            },
            now_ms: 0,
            clock: 0,
            entries: None,
            base: None,
        }
    }

    #[tokio::test]
    async fn each_topic_of_a_read_starts_from_its_own_position_when_another_left_meanwhile() {
        let mut ps = pubsub();
        let link = ps.add_link(String::new());
        let generation = ps.links[link].generation;
        let (left, staying) = (
            Topic::parse("left").unwrap(),
            Topic::parse("staying").unwrap(),
        );
        let (reply, answer) = oneshot::channel();
        ps.topics.insert(
            staying.clone(),
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
        // `left` was read beside it, and was let go before the read came
        // back (unsubscribed after the linger, or moved to another master).
        let epoch: Epoch = Arc::from("e1");
        ps.done(Done::Read {
            link,
            generation,
            topics: vec![left, staying.clone()],
            result: Ok(vec![recovered(&epoch, 7), recovered(&epoch, 42)]),
        });
        assert!(matches!(answer.await, Ok(Ok(()))));
        let Some(Watched {
            flow: Flow::Live(at),
            ..
        }) = ps.topics.get(&staying)
        else {
            panic!("the topic did not go live");
        };
        assert_eq!((&*at.epoch, at.seq), ("e1", 42));
    }
}
