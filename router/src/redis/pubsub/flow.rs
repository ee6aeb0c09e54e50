//! Ordering each topic's flow: where its delivery stands ([`Flow`]), and
//! what an announcement does to it.
//!
//! A publication arrives in seq order; one already delivered is dropped; a
//! jump is filled from history (or, where history cannot, the topic's
//! subscribers get `reset`); a seq issued a second time in its epoch proves
//! that Redis went back in time, and moves the topic to a new epoch.

use std::time::Duration;

use bytes::Bytes;

use super::Pubsub;
use super::watch::Reply;
use crate::{BrokerError, Epoch, Position, Publication, Topic};

/// Announcements one topic holds aside while its history is read.
pub const MAX_HELD: usize = 1024;

/// Where a topic's delivery stands.
pub(super) enum Flow {
    /// Subscribing, then reading the position; the watches wait for it.
    Starting { waiters: Vec<Reply>, held: Held },
    /// Delivered up to `at`: announcements go straight to the sink.
    Live(At),
    /// Subscribing again (its link came back, or it moved to another
    /// master's), then reading what came after `at`; `sent` while the
    /// subscribe is under way.
    Resubscribing { at: At, held: Held, sent: bool },
    /// Reading history after `at` (a gap, a reconnect, a seq issued twice:
    /// `reissued`, and the read tells Redis that it went back in time).
    Catching { at: At, held: Held, reissued: bool },
    /// Unsubscribing after the linger. A watch that comes meanwhile waits
    /// for the unsubscribe to be confirmed before it subscribes again:
    /// sent in the other order, the two would leave the topic unsubscribed.
    Leaving { waiters: Vec<Reply> },
}

impl Flow {
    /// The flow, leaving a stand-in (that allocates nothing) to be replaced.
    pub(super) fn take(&mut self) -> Self {
        std::mem::replace(
            self,
            Self::Leaving {
                waiters: Vec::new(),
            },
        )
    }

    pub(super) fn held(&mut self) -> Option<&mut Held> {
        match self {
            Self::Starting { held, .. }
            | Self::Resubscribing { held, .. }
            | Self::Catching { held, .. } => Some(held),
            Self::Live(_) | Self::Leaving { .. } => None,
        }
    }
}

/// How far a topic was delivered on this pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct At {
    pub epoch: Epoch,
    pub seq: u64,
    /// The newest seq known from a read of Redis rather than from the
    /// channel, and the lineage clock of that read: an announcement at or
    /// below it that was issued before the read is a duplicate; any other
    /// announcement at or below `seq` is a seq issued twice.
    pub read_seq: u64,
    pub read_clock: u64,
}

/// One announcement from a topic's channel.
#[derive(Debug, Clone)]
pub struct Announced {
    pub epoch: Epoch,
    pub seq: u64,
    /// The lineage clock of its publish; `None` from a pod of an older
    /// version.
    pub clock: Option<u64>,
    pub traceparent: Option<Box<str>>,
    pub data: Bytes,
}
/// What to do with an announcement, given where the topic stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The next seq: deliver it.
    Deliver,
    /// Delivered already, or of an epoch that was already left behind.
    Drop,
    /// The first of a new epoch: reset the subscribers, then deliver.
    NewEpoch,
    /// Seqs are missing before it: fill them from history first.
    Gap,
    /// A seq at or below one delivered, issued after it: Redis went back in
    /// time.
    Reissued,
}

/// The merge rule of the channel: seq order within an epoch, each seq once.
pub fn decide(at: &At, a: &Announced) -> Decision {
    if a.epoch != at.epoch {
        // Issued before the read that moved us to `at.epoch`: a straggler.
        return match a.clock {
            Some(clock) if clock <= at.read_clock => Decision::Drop,
            _ => Decision::NewEpoch,
        };
    }
    if a.seq <= at.seq {
        let duplicate = a.seq <= at.read_seq && a.clock.is_none_or(|clock| clock <= at.read_clock);
        return if duplicate {
            Decision::Drop
        } else {
            Decision::Reissued
        };
    }
    if a.seq == at.seq + 1 {
        Decision::Deliver
    } else {
        Decision::Gap
    }
}

/// Announcements held aside while a topic's history is read.
#[derive(Default)]
pub(super) struct Held {
    pub(super) items: Vec<Announced>,
    /// The newest announcement dropped for want of room (without its data):
    /// what follows the held ones is read from history up to it.
    pub(super) overflow: Option<Announced>,
}

impl Pubsub {
    /// A topic whose link went away (or whose slot moved): a start or a
    /// leave fails (the topic is forgotten), anything else waits to be
    /// subscribed again and to catch up from where it stood.
    pub(super) fn drop_pending(&mut self, topic: &Topic, why: &str) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        let mut flow = watched.flow.take();
        if let Some(held) = flow.held() {
            self.held -= held.items.len();
        }
        match flow {
            Flow::Live(at) | Flow::Resubscribing { at, .. } | Flow::Catching { at, .. } => {
                watched.flow = Flow::Resubscribing {
                    at,
                    held: Held::default(),
                    sent: false,
                };
            }
            Flow::Starting { waiters, .. } | Flow::Leaving { waiters } => {
                self.topics.remove(topic);
                self.presence.forget(topic);
                for reply in waiters {
                    let _ = reply.send(Err(BrokerError::unavailable(why)));
                }
            }
        }
    }

    /// Runs what a topic held aside through the merge rule, now that it is
    /// live again (it may catch up again on the way: the rest is held anew).
    pub(super) fn replay_held(&mut self, topic: &Topic, held: Held) {
        self.held -= held.items.len();
        for announced in held.items {
            self.arrive(topic, announced);
        }
        if let Some(last) = held.overflow {
            self.overflowed(topic, last);
        }
        self.observer.pubsub_backlog(self.held);
    }

    /// After the held announcements: the newest one dropped for want of
    /// room, whose data is only in history.
    fn overflowed(&mut self, topic: &Topic, last: Announced) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        match &mut watched.flow {
            // Catching up again: whatever it reads next covers it, or the
            // next announcement shows the gap.
            Flow::Starting { held, .. }
            | Flow::Resubscribing { held, .. }
            | Flow::Catching { held, .. } => {
                held.overflow = Some(last);
            }
            Flow::Leaving { .. } => {}
            Flow::Live(at) => match decide(at, &last) {
                Decision::Drop => {}
                Decision::Deliver | Decision::Gap => {
                    let (epoch, after) = (at.epoch.clone(), at.seq);
                    watched.flow = Flow::Catching {
                        at: at.clone(),
                        held: Held::default(),
                        reissued: false,
                    };
                    self.fill(topic, &epoch, after, last.seq, Duration::ZERO);
                }
                Decision::NewEpoch | Decision::Reissued => {
                    let position = Position {
                        epoch: last.epoch.clone(),
                        seq: last.seq,
                    };
                    *at = At {
                        epoch: last.epoch,
                        seq: last.seq,
                        read_seq: last.seq,
                        read_clock: last.clock.unwrap_or(0),
                    };
                    self.reset(topic, &position);
                }
            },
        }
    }

    /// An announcement for a watched topic: delivered, held, or the start of
    /// a catch-up.
    pub(super) fn arrive(&mut self, topic: &Topic, a: Announced) {
        let Some(watched) = self.topics.get_mut(topic) else {
            return;
        };
        let at = match &mut watched.flow {
            Flow::Starting { held, .. }
            | Flow::Resubscribing { held, .. }
            | Flow::Catching { held, .. } => {
                if held.items.len() < MAX_HELD {
                    held.items.push(a);
                    self.held += 1;
                    self.observer.pubsub_backlog(self.held);
                } else {
                    held.overflow = Some(Announced {
                        data: Bytes::new(),
                        ..a
                    });
                }
                return;
            }
            Flow::Leaving { .. } => return,
            Flow::Live(at) => at,
        };
        match decide(at, &a) {
            Decision::Drop => {}
            Decision::Deliver => {
                at.seq = a.seq;
                self.deliver(topic, &a);
            }
            Decision::NewEpoch => {
                // Nothing of the new epoch before `a` was announced here.
                *at = At {
                    epoch: a.epoch.clone(),
                    seq: a.seq,
                    read_seq: a.seq - 1,
                    read_clock: 0,
                };
                self.reset(
                    topic,
                    &Position {
                        epoch: a.epoch.clone(),
                        seq: a.seq - 1,
                    },
                );
                self.deliver(topic, &a);
            }
            Decision::Gap => {
                tracing::debug!(%topic, ?at, seq = a.seq, "gap");
                let (epoch, after) = (at.epoch.clone(), at.seq);
                watched.flow = Flow::Catching {
                    at: at.clone(),
                    held: Held::default(),
                    reissued: false,
                };
                let upto = a.seq - 1;
                self.arrive(topic, a);
                self.fill(topic, &epoch, after, upto, Duration::ZERO);
            }
            Decision::Reissued => {
                tracing::warn!(%topic, epoch = %at.epoch, seq = a.seq, delivered = at.seq, "a seq was issued twice: redis went back in time");
                // Read again, vouching that Redis went back: the topic
                // moves to a new epoch, and its subscribers are reset.
                let link = watched.link;
                watched.flow = Flow::Catching {
                    at: at.clone(),
                    held: Held::default(),
                    reissued: true,
                };
                self.read(link, vec![topic.clone()], Duration::ZERO);
            }
        }
    }

    pub(super) fn deliver(&self, topic: &Topic, a: &Announced) {
        let publication = Publication {
            topic: topic.clone(),
            epoch: a.epoch.clone(),
            seq: a.seq,
            data: a.data.clone(),
        };
        self.sink.deliver(&publication, a.traceparent.as_deref());
    }

    pub(super) fn reset(&self, topic: &Topic, position: &Position) {
        tracing::warn!(%topic, epoch = %position.epoch, seq = position.seq, "topic lost continuity; subscribers reset");
        self.observer.topic_reset();
        self.sink.reset(topic, position);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use proptest::prelude::*;

    fn announced(epoch: &Epoch, seq: u64, clock: u64) -> Announced {
        Announced {
            epoch: epoch.clone(),
            seq,
            clock: Some(clock),
            traceparent: None,
            data: Bytes::new(),
        }
    }

    /// Runs announcements through the merge rule as the task does, a gap
    /// filled from `history` (seq `n` has clock `n` there); the seqs
    /// delivered, and whether anything was taken for a rewind.
    fn merge(mut at: At, stream: &[Announced]) -> (Vec<u64>, bool) {
        let mut delivered = Vec::new();
        let mut rewound = false;
        for a in stream {
            match decide(&at, a) {
                Decision::Drop => {}
                Decision::Deliver => {}
                Decision::Gap => delivered.extend(at.seq + 1..a.seq),
                Decision::NewEpoch | Decision::Reissued => {
                    rewound = true;
                    continue;
                }
            }
            if a.seq > at.seq {
                delivered.push(a.seq);
                at.seq = a.seq;
            }
        }
        (delivered, rewound)
    }

    proptest! {
        /// Whatever arrives from before the read (duplicates, in any order
        /// among the live ones' start) and whichever live announcements go
        /// missing, delivery is `read+1 ..= last`, each once, in order.
        #[test]
        fn duplicates_and_gaps_merge_into_one_ordered_stream(
            read in 0u64..50,
            early in proptest::collection::vec(0u64..50, 0..20),
            live in proptest::collection::vec(any::<bool>(), 1..60),
        ) {
            let epoch: Epoch = Arc::from("e1");
            let at = At { epoch: epoch.clone(), seq: read, read_seq: read, read_clock: read };
            let mut stream: Vec<Announced> = early
                .iter()
                .filter(|&&s| s >= 1 && s <= read)
                .map(|&s| announced(&epoch, s, s))
                .collect();
            // Live ones in seq order, some lost on the way (the last kept).
            let last = read + live.len() as u64;
            for (i, kept) in live.iter().enumerate() {
                let seq = read + 1 + i as u64;
                if *kept || seq == last {
                    stream.push(announced(&epoch, seq, seq));
                }
            }
            let (delivered, rewound) = merge(at, &stream);
            prop_assert!(!rewound);
            prop_assert_eq!(delivered, (read + 1..=last).collect::<Vec<_>>());
        }

        /// After Redis went back, a seq at or below what was delivered that
        /// comes again is never delivered, and is taken for what it is when
        /// the channel delivered the first one or it was issued after the
        /// read.
        #[test]
        fn a_seq_issued_again_is_never_delivered_twice(
            read in 0u64..20,
            streamed in 1u64..20,
            back_to in 0u64..40,
            clock_after in any::<bool>(),
        ) {
            let epoch: Epoch = Arc::from("e1");
            let delivered_up_to = read + streamed;
            let at = At {
                epoch: epoch.clone(),
                seq: delivered_up_to,
                read_seq: read,
                read_clock: read,
            };
            let seq = back_to.min(delivered_up_to).max(1);
            let clock = if clock_after { delivered_up_to + 1 } else { seq.min(read) };
            let decision = decide(&at, &announced(&epoch, seq, clock));
            prop_assert!(!matches!(decision, Decision::Deliver | Decision::Gap | Decision::NewEpoch));
            if seq > read || clock_after {
                prop_assert_eq!(decision, Decision::Reissued);
            }
        }
    }

    #[test]
    fn a_straggler_of_a_left_epoch_is_dropped_and_a_newer_epoch_resets() {
        let (old, new): (Epoch, Epoch) = (Arc::from("old"), Arc::from("new"));
        let at = At {
            epoch: new.clone(),
            seq: 5,
            read_seq: 5,
            read_clock: 100,
        };
        assert_eq!(decide(&at, &announced(&old, 9, 90)), Decision::Drop);
        assert_eq!(decide(&at, &announced(&old, 1, 101)), Decision::NewEpoch);
        let unknown_clock = Announced {
            clock: None,
            ..announced(&old, 9, 0)
        };
        assert_eq!(decide(&at, &unknown_clock), Decision::NewEpoch);
    }
}
