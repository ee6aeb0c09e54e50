//! A session's subscriptions and how far the client got in each: owned by
//! the session, shared with the pod's flusher, which saves changed sessions
//! periodically so that a pod that dies without warning loses little.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use router::{Epoch, SessionSnapshot, SessionUser, SubscriptionState, Topic};

#[derive(Clone, Default)]
pub struct Subscriptions(Arc<Mutex<Inner>>);

#[derive(Default)]
struct Inner {
    /// Whose session this is; set once, by `hello`.
    user: Option<SessionUser>,
    by_topic: HashMap<Topic, Subscription>,
    /// Changed since the last snapshot.
    dirty: bool,
}

struct Subscription {
    epoch: Epoch,
    /// The newest seq acked, or the seq the subscription started after.
    acked: u64,
    /// A `reset` moved it to `epoch` while the connection lived: an ack
    /// without an epoch may be of the old one (sent before the client read
    /// the reset), so only acks that name the epoch count.
    reset: bool,
}

impl Subscriptions {
    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records whose session this is (from the token at `hello`, or as the
    /// resumed session was stored).
    pub fn set_user(&self, user: Option<SessionUser>) {
        let mut inner = self.inner();
        inner.user = user;
        inner.dirty = true;
    }

    pub fn user(&self) -> Option<SessionUser> {
        self.inner().user.clone()
    }

    pub fn contains(&self, topic: &Topic) -> bool {
        self.inner().by_topic.contains_key(topic)
    }

    /// How many topics; the session caps it.
    pub fn count(&self) -> usize {
        self.inner().by_topic.len()
    }

    pub fn insert(&self, topic: Topic, epoch: Epoch, acked: u64) {
        let mut inner = self.inner();
        inner.by_topic.insert(
            topic,
            Subscription {
                epoch,
                acked,
                reset: false,
            },
        );
        inner.dirty = true;
    }

    /// Whether the topic was subscribed.
    pub fn remove(&self, topic: &Topic) -> bool {
        let mut inner = self.inner();
        let removed = inner.by_topic.remove(topic).is_some();
        inner.dirty |= removed;
        removed
    }

    /// Records a cumulative ack of `seq` in `epoch` (the subscription's own
    /// when `None`); false when the topic is not subscribed. An ack of
    /// another epoch than the subscription's is not counted.
    pub fn ack(&self, topic: &Topic, seq: u64, epoch: Option<&str>) -> bool {
        let mut inner = self.inner();
        let Some(subscription) = inner.by_topic.get_mut(topic) else {
            return false;
        };
        let counts = match epoch {
            Some(epoch) => *subscription.epoch == *epoch,
            None => !subscription.reset,
        };
        if counts && seq > subscription.acked {
            subscription.acked = seq;
            inner.dirty = true;
        }
        true
    }

    /// The client was sent `reset` for `topic`: its stream goes on in
    /// `epoch` after `seq`, where a resume must continue too.
    pub fn reset(&self, topic: &Topic, epoch: &Epoch, seq: u64) {
        let mut inner = self.inner();
        if let Some(subscription) = inner.by_topic.get_mut(topic) {
            *subscription = Subscription {
                epoch: epoch.clone(),
                acked: seq,
                reset: true,
            };
            inner.dirty = true;
        }
    }

    pub fn topics(&self) -> Vec<Topic> {
        self.inner().by_topic.keys().cloned().collect()
    }

    /// The snapshot to save, and the session is clean again.
    pub fn snapshot(&self) -> SessionSnapshot {
        let mut inner = self.inner();
        inner.dirty = false;
        SessionSnapshot {
            user: inner.user.clone(),
            subscriptions: inner
                .by_topic
                .iter()
                .map(|(topic, s)| SubscriptionState {
                    topic: topic.clone(),
                    epoch: s.epoch.clone(),
                    acked: s.acked,
                })
                .collect(),
        }
    }

    /// The snapshot, if anything changed since the last one.
    pub fn changed(&self) -> Option<SessionSnapshot> {
        if !self.inner().dirty {
            return None;
        }
        Some(self.snapshot())
    }
}
