//! The reads of Redis that a topic's flow waits for: its position when it
//! starts, what came after where it stood (after a reconnect, a move to
//! another master, a seq issued twice), and a gap's publications.

use std::time::Duration;

use redis::Value;

use super::Pubsub;
use super::flow::{At, Flow};
use super::link::MIN_BACKOFF;
use super::report::Done;
use super::watch::Watched;
use crate::redis::call::timed;
use crate::redis::recover::{Recovered, Vouch, continuous, read_many};
use crate::redis::replies::parse_entries;
use crate::{BrokerError, Causes, Epoch, Position, Publication, Since, Topic, Unavailable};

/// Topics per pipeline of position reads.
pub(super) const READ_BATCH: usize = 500;

impl Pubsub {
    /// Reads the positions of `topics` on `link` (each as its flow needs: a
    /// start without `since`, a catch-up after where it stands), in one
    /// pipeline per master, after `delay`.
    pub(super) fn read(&self, link: usize, topics: Vec<Topic>, delay: Duration) {
        let Some(generation) = self.links.get(link).map(|l| l.generation) else {
            return;
        };
        if topics.is_empty() {
            return;
        }
        let reads: Vec<_> = topics
            .iter()
            .map(|topic| {
                let (since, vouch) = match self.topics.get(topic).map(|w| &w.flow) {
                    Some(Flow::Catching { at, reissued, .. }) => (
                        Some(Since {
                            seq: at.seq,
                            epoch: Some(at.epoch.to_string()),
                            vouched: true,
                        }),
                        if *reissued {
                            Vouch::Reissued
                        } else {
                            Vouch::AsGiven
                        },
                    ),
                    _ => (None, Vouch::AsGiven),
                };
                (topic.clone(), since, vouch, self.history_ttl(topic))
            })
            .collect();
        let shards = self.shards.clone();
        let observer = self.observer.clone();
        let lineage = self.lineage.clone();
        let done = self.done.clone();
        let bound = self.settings.command_timeout * 2;
        let keys = self.keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let reading = read_many(&keys, &shards, &*observer, &lineage, &reads);
            let result = tokio::time::timeout(bound, reading)
                .await
                .unwrap_or_else(|_| {
                    tracing::warn!(topics = reads.len(), "reading topics from redis timed out");
                    Err(BrokerError::Unavailable(Unavailable::TimedOut(
                        "read topics",
                    )))
                });
            let _ = done.send(Done::Read {
                link,
                generation,
                topics,
                result,
            });
        });
    }

    /// Reads `after+1 ..= upto` of `epoch` from history.
    pub(super) fn fill(
        &self,
        topic: &Topic,
        epoch: &Epoch,
        after: u64,
        upto: u64,
        delay: Duration,
    ) {
        let Some(link) = self.topics.get(topic).map(|w| w.link) else {
            return;
        };
        let Some(generation) = self.links.get(link).map(|l| l.generation) else {
            return;
        };
        let shards = self.shards.clone();
        let observer = self.observer.clone();
        let done = self.done.clone();
        let topic = topic.clone();
        let epoch = epoch.clone();
        let keys = self.keys.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let history = keys.history(&topic);
            let mut range = redis::cmd("XRANGE");
            range
                .arg(&history)
                .arg(format!("{}-0", after + 1))
                .arg(format!("{upto}-0"));
            let result = timed(
                &*observer,
                "fill",
                shards.command::<Value>(&history, &range),
            )
            .await
            .map(|reply| {
                parse_entries(&topic, &epoch, reply)
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(p, _)| p)
                    .collect()
            });
            let _ = done.send(Done::Filled {
                link,
                generation,
                topic,
                upto,
                result,
            });
        });
    }

    /// A read failed: new watches fail (their callers may try again), a
    /// catch-up is tried again.
    pub(super) fn read_failed(&mut self, link: usize, topics: Vec<Topic>, e: BrokerError) {
        let mut retry = Vec::new();
        let mut abandoned = Vec::new();
        for topic in topics {
            match self
                .topics
                .get_mut(&topic)
                .map(|w| (&mut w.count, &mut w.flow))
            {
                Some((count, Flow::Starting { waiters, .. })) => {
                    *count = 0;
                    for reply in waiters.drain(..) {
                        let _ = reply.send(Err(e.clone()));
                    }
                    abandoned.push(topic);
                }
                Some((_, Flow::Catching { .. })) => retry.push(topic),
                _ => {}
            }
        }
        if !retry.is_empty() {
            tracing::warn!(error = %Causes(&e), topics = retry.len(), "reading topics after a reconnect failed; retrying");
            self.read(link, retry, MIN_BACKOFF);
        }
        self.leave(abandoned);
        self.observer.pubsub_backlog(self.held);
    }

    /// A read of a gap failed: tried again after a pause, if the topic still
    /// waits for it.
    pub(super) fn fill_failed(&mut self, topic: &Topic, upto: u64, e: BrokerError) {
        tracing::warn!(error = %Causes(&e), %topic, "reading a gap from history failed; retrying");
        if let Some(Watched {
            flow: Flow::Catching { at, .. },
            ..
        }) = self.topics.get(topic)
        {
            let (epoch, after) = (at.epoch.clone(), at.seq);
            self.fill(topic, &epoch, after, upto, MIN_BACKOFF);
        }
    }

    /// A topic's position was read: a new watch starts from it, a catch-up
    /// delivers what history holds after where the topic stood (or resets).
    pub(super) fn positioned(&mut self, topic: &Topic, recovered: Recovered) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        if matches!(watched.flow, Flow::Leaving { .. }) {
            return;
        }
        let position = recovered.position.clone();
        tracing::debug!(%topic, ?position, clock = recovered.clock, "read");
        let read = At {
            epoch: position.epoch.clone(),
            seq: position.seq,
            read_seq: position.seq,
            read_clock: recovered.clock,
        };
        match std::mem::replace(&mut watched.flow, Flow::Live(read)) {
            Flow::Starting { waiters, held } => {
                let mut given_up = 0;
                for reply in waiters {
                    if reply.send(Ok(())).is_err() {
                        given_up += 1;
                    }
                }
                for _ in 0..given_up {
                    self.release(topic);
                }
                self.replay_held(topic, held);
            }
            Flow::Catching { at, held, .. } => {
                let ttl = self.history_ttl(topic);
                match &recovered.entries {
                    _ if at.epoch == position.epoch && at.seq == position.seq => {}
                    Some(entries)
                        if at.epoch == position.epoch
                            && continuous(entries, at.seq, position.seq, recovered.now_ms, ttl) =>
                    {
                        self.observer.gap_filled(entries.len() as u64);
                        for (publication, _) in entries {
                            self.sink.deliver(publication, None);
                        }
                    }
                    _ if at.epoch != position.epoch => {
                        // Back to where the new epoch began, and all of it
                        // after: a subscriber that is in it already (its
                        // own resume got there first) skips nothing.
                        let restarted = recovered.restart_at_epoch_start(ttl);
                        let restart = Position {
                            epoch: position.epoch.clone(),
                            seq: restarted.restart,
                        };
                        self.reset(topic, &restart);
                        for publication in &restarted.publications {
                            self.sink.deliver(publication, None);
                        }
                    }
                    _ => self.reset(topic, &position),
                }
                self.replay_held(topic, held);
            }
            // Read twice (a retry crossed a report): the first one won.
            flow @ (Flow::Live(_) | Flow::Leaving { .. } | Flow::Resubscribing { .. }) => {
                if let Some(watched) = self.topics.get_mut(topic) {
                    watched.flow = flow;
                }
            }
        }
    }

    /// A gap was read from history: delivered if it is all there, else the
    /// subscribers are reset past it.
    pub(super) fn filled(&mut self, topic: &Topic, upto: u64, publications: Vec<Publication>) {
        tracing::debug!(%topic, upto, n = publications.len(), "filled");
        let Some(Watched {
            flow: Flow::Catching { at, .. },
            ..
        }) = self.topics.get(topic)
        else {
            return;
        };
        let mut at = at.clone();
        let complete = publications.len() as u64 == upto - at.seq
            && publications
                .iter()
                .zip(at.seq + 1..)
                .all(|(p, seq)| p.seq == seq);
        if complete {
            self.observer.gap_filled(publications.len() as u64);
            for publication in &publications {
                self.sink.deliver(publication, None);
            }
        } else {
            self.reset(
                topic,
                &Position {
                    epoch: at.epoch.clone(),
                    seq: upto,
                },
            );
        }
        at.seq = upto;
        at.read_seq = at.read_seq.max(upto);
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        if let Flow::Catching { held, .. } = std::mem::replace(&mut watched.flow, Flow::Live(at)) {
            self.replay_held(topic, held);
        }
    }

    fn history_ttl(&self, topic: &Topic) -> Duration {
        self.namespaces
            .get(topic)
            .map_or(Duration::ZERO, |ns| ns.history_ttl)
    }
}
