//! A session's subscriptions and how far the client got in each: owned by
//! the session, shared with the pod's flusher, which saves changed sessions
//! periodically so that a pod that dies without warning loses little.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use router::{
    BrokerError, Epoch, Position, SessionSnapshot, SessionStore, SessionUser, Stored,
    SubscriptionState, Topic,
};
use tokio::sync::Notify;
use tokio::task::{AbortHandle, Id};
use tokio::time::Instant;

use crate::hub::Resets;
use crate::signal::Signal;

#[derive(Clone, Default)]
pub struct Subscriptions(Arc<Shared>);

/// One allocation per session, with the signals between its connection and
/// the registry.
#[derive(Default)]
struct Shared {
    inner: Mutex<Inner>,
    /// Another connection resumes the session: this one stops.
    taken_over: Signal,
    /// The connection saved the session and is gone: a takeover goes on.
    ended: Signal,
    /// Held by a save from its snapshot until the store answered: one save
    /// of the session at a time, so that the store keeps the newest snapshot
    /// taken. Two in flight could reach the store in the other order: a
    /// flush's snapshot taken before a `sub`, written after the `sub`'s own
    /// save, left the stored session without the topic while the flush, its
    /// change count the older, took the store for up to date; a resume then
    /// restored the session without it, and its client, told `resumed`,
    /// waited for messages that never came.
    saving: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct Inner {
    /// Whose session this is; set once, by `hello`.
    user: Option<SessionUser>,
    by_topic: HashMap<Topic, Subscription>,
    /// Counts changes. A flush takes the count with its snapshot and records
    /// it once the store kept it: a change made meanwhile, or a save that
    /// failed, leaves the session to save again.
    changes: u64,
    /// The count the store's copy was taken at; `None` while it has none of
    /// this connection's.
    saved: Option<u64>,
    /// When the store last kept the session (saved or extended).
    kept_at: Option<Instant>,
    /// A newer connection owns the session in the store (a save was
    /// refused): nothing is saved from here any more.
    superseded: bool,
    /// Wakes the pod's flusher (a shared store's): see [`Inner::moved`].
    flush_soon: Option<Arc<Notify>>,
    /// Topics the client lags in: `None` while it lags in none (allocated
    /// only while it does).
    lag: Option<Box<Lag>>,
}

/// A session's lagging topics (issue #25, [`super::catch_up`]).
#[derive(Default)]
struct Lag {
    /// Marked lagging by the hub, where the client stands in each; not yet
    /// taken by the connection.
    waiting: Vec<(Topic, Position)>,
    /// The catch-ups under way, by topic.
    running: Vec<(Topic, AbortHandle)>,
}

impl Inner {
    fn touch(&mut self) {
        self.changes += 1;
    }

    /// A subscription moved to another epoch (the client was told `reset`):
    /// saved at once, not at the next flush, since a resume that found the
    /// old epoch stored would reset the client a second time, to a later
    /// seq, skipping what it had not read yet.
    fn moved(&mut self) {
        self.touch();
        if let Some(flush) = &self.flush_soon {
            flush.notify_one();
        }
    }
}

struct Subscription {
    epoch: Epoch,
    /// The newest seq acked, or the seq the subscription started after.
    acked: u64,
    /// The client was sent a `reset` to `epoch` after `acked` and has not
    /// acked in that epoch since. Until it does, it may not have read the
    /// reset (its connection dying meanwhile), so a resume sends the reset
    /// again; and an ack without an epoch may be of the old one, so only
    /// acks that name the epoch count.
    told: bool,
    /// Made by the server (a backend, the token's `topics`): kept across a
    /// resume and a `refresh` whatever the token grants.
    server: bool,
    /// Sent deltas (the client's `sub` asked, its namespace has them): a
    /// resume keeps them.
    delta: bool,
}

/// What a flush owes the store for a session.
pub struct Due {
    /// The session as it is now; `None` when the store has it as it is, and
    /// only its expiry is to be pushed back.
    pub snapshot: Option<SessionSnapshot>,
    /// The change count it was taken at, for [`Subscriptions::stored`].
    pub changes: u64,
}

impl Subscriptions {
    /// Subscriptions whose move to another epoch wakes `flush_soon` (the
    /// flusher of a shared store; `None` for a pod-local one).
    pub fn new(flush_soon: Option<Arc<Notify>>) -> Self {
        Self(Arc::new(Shared {
            inner: Mutex::new(Inner {
                flush_soon,
                ..Inner::default()
            }),
            ..Shared::default()
        }))
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.0.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the connection serving the session to stop between commands:
    /// another connection resumes it.
    pub fn take_over(&self) {
        self.0.taken_over.set();
    }

    /// Resolves once [`take_over`](Self::take_over) was called.
    pub async fn taken_over(&self) {
        self.0.taken_over.wait().await;
    }

    /// Marks the connection gone, its session saved; stops its catch-ups.
    pub fn end(&self) {
        if let Some(lag) = self.inner().lag.take() {
            for (_, task) in lag.running {
                task.abort();
            }
        }
        self.0.ended.set();
    }

    /// The topics the hub marked lagging since the last call, with where
    /// the client stands in each.
    pub fn take_lagging(&self) -> Vec<(Topic, Position)> {
        let mut inner = self.inner();
        let Some(lag) = inner.lag.as_mut() else {
            return Vec::new();
        };
        let waiting = std::mem::take(&mut lag.waiting);
        if lag.running.is_empty() {
            inner.lag = None;
        }
        waiting
    }

    /// A catch-up of `topic` runs as the task `start` spawns, until
    /// [`Self::caught_up`] (or the topic is left, or the connection ends:
    /// then it is stopped). Spawned under the lock, so that a task over at
    /// once finds itself recorded.
    pub fn catching_up(&self, topic: Topic, start: impl FnOnce() -> AbortHandle) {
        let mut inner = self.inner();
        let lag = inner.lag.get_or_insert_with(Box::default);
        lag.running.push((topic, start()));
    }

    /// The catch-up task `id` is over.
    pub fn caught_up(&self, id: Id) {
        let mut inner = self.inner();
        let Some(lag) = inner.lag.as_mut() else {
            return;
        };
        lag.running.retain(|(_, task)| task.id() != id);
        if lag.running.is_empty() && lag.waiting.is_empty() {
            inner.lag = None;
        }
    }

    /// Resolves once [`end`](Self::end) was called.
    pub async fn ended(&self) {
        self.0.ended.wait().await;
    }

    /// Records whose session this is (from the token at `hello`, or as the
    /// resumed session was stored).
    pub fn set_user(&self, user: Option<SessionUser>) {
        let mut inner = self.inner();
        inner.user = user;
        inner.touch();
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

    /// A new subscription, after `acked` in `epoch`; `server` when the
    /// server made it, not the client; `delta` when it is sent deltas.
    pub fn insert(&self, topic: Topic, epoch: Epoch, acked: u64, server: bool, delta: bool) {
        let mut inner = self.inner();
        let subscription = Subscription {
            epoch,
            acked,
            told: false,
            server,
            delta,
        };
        inner.by_topic.insert(topic, subscription);
        inner.touch();
    }

    /// A subscription as a resumed session stored it.
    pub fn restore(&self, state: &SubscriptionState) {
        let mut inner = self.inner();
        let subscription = Subscription {
            epoch: state.epoch.clone(),
            acked: state.acked,
            told: state.told,
            server: state.server,
            delta: state.delta,
        };
        inner.by_topic.insert(state.topic.clone(), subscription);
        inner.touch();
    }

    /// The client was sent `reset` for `topic`: its stream goes on in
    /// `epoch` after `seq`, where a resume continues too, telling it again
    /// until it acks in that epoch.
    pub fn told(&self, topic: &Topic, epoch: &Epoch, seq: u64) {
        let mut inner = self.inner();
        if let Some(subscription) = inner.by_topic.get_mut(topic) {
            *subscription = Subscription {
                epoch: epoch.clone(),
                acked: seq,
                told: true,
                server: subscription.server,
                delta: subscription.delta,
            };
            inner.moved();
        }
    }

    /// Whether the client may not know of the topic's epoch yet (see
    /// [`Self::told`]).
    pub fn is_told(&self, topic: &Topic) -> bool {
        self.inner().by_topic.get(topic).is_some_and(|s| s.told)
    }

    /// Whether the server made the topic's subscription (see
    /// [`Self::insert`]).
    pub fn is_server(&self, topic: &Topic) -> bool {
        self.inner().by_topic.get(topic).is_some_and(|s| s.server)
    }

    /// Whether the topic was subscribed. A catch-up of it stops.
    pub fn remove(&self, topic: &Topic) -> bool {
        let mut inner = self.inner();
        if let Some(lag) = inner.lag.as_mut() {
            lag.waiting.retain(|(t, _)| t != topic);
            lag.running.retain(|(t, task)| {
                if t == topic {
                    task.abort();
                }
                t != topic
            });
            if lag.running.is_empty() && lag.waiting.is_empty() {
                inner.lag = None;
            }
        }
        let removed = inner.by_topic.remove(topic).is_some();
        if removed {
            inner.touch();
        }
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
            None => !subscription.told,
        };
        // An ack naming the epoch it was told of: the client has the reset.
        let confirms = counts && subscription.told;
        if counts && (seq > subscription.acked || confirms) {
            subscription.acked = subscription.acked.max(seq);
            subscription.told = false;
            inner.touch();
        }
        true
    }

    pub fn topics(&self) -> Vec<Topic> {
        self.inner().by_topic.keys().cloned().collect()
    }

    /// The session as it is now.
    pub fn snapshot(&self) -> SessionSnapshot {
        Self::snapshot_of(&self.inner())
    }

    fn snapshot_of(inner: &Inner) -> SessionSnapshot {
        SessionSnapshot {
            user: inner.user.clone(),
            subscriptions: inner
                .by_topic
                .iter()
                .map(|(topic, s)| SubscriptionState {
                    topic: topic.clone(),
                    epoch: s.epoch.clone(),
                    acked: s.acked,
                    told: s.told,
                    server: s.server,
                    delta: s.delta,
                })
                .collect(),
        }
    }

    /// Saves the session as it is now as `id`, for `owner`, recording what
    /// the store did with it as a flush would (so the flusher does not save
    /// it again, and a refusal marks the connection superseded). Waits for a
    /// flush of it under way to be answered first (see [`Shared::saving`]).
    /// Whether it was kept.
    pub async fn save(
        &self,
        store: &dyn SessionStore,
        id: &str,
        owner: &str,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let _saving = self.0.saving.lock().await;
        let (snapshot, changes) = {
            let inner = self.inner();
            (Self::snapshot_of(&inner), inner.changes)
        };
        let kept = store.save(id, owner, snapshot, ttl).await?;
        let stored = if kept { Stored::Kept } else { Stored::Refused };
        self.stored(changes, stored, Instant::now());
        Ok(kept)
    }

    /// The session's turn to be saved, unless a save of it is under way:
    /// held until the store answered what [`Self::due`] gives.
    pub fn try_saving(&self) -> Option<tokio::sync::MutexGuard<'_, ()>> {
        self.0.saving.try_lock().ok()
    }

    /// What the store lacks of this session at `now`: the snapshot, if it
    /// changed since it was last saved, or else an extend, if the store last
    /// kept it `refresh` ago or more (its copy must outlive the connection,
    /// however quiet the client). Taken with [`Self::try_saving`] held.
    pub fn due(&self, now: Instant, refresh: Duration) -> Option<Due> {
        let inner = self.inner();
        let whole = Self::owed(&inner, now, refresh)?;
        Some(Due {
            snapshot: whole.then(|| Self::snapshot_of(&inner)),
            changes: inner.changes,
        })
    }

    /// Whether [`Self::due`] has anything at `now`, without its snapshot.
    pub fn is_due(&self, now: Instant, refresh: Duration) -> bool {
        Self::owed(&self.inner(), now, refresh).is_some()
    }

    /// What the store lacks: the whole session (`true`), an extend
    /// (`false`), or nothing.
    fn owed(inner: &Inner, now: Instant, refresh: Duration) -> Option<bool> {
        if inner.superseded {
            return None;
        }
        if inner.saved != Some(inner.changes) {
            return Some(true);
        }
        let fresh = inner
            .kept_at
            .is_some_and(|at| now.saturating_duration_since(at) < refresh);
        (!fresh).then_some(false)
    }

    /// Records how the store took what [`Self::due`] gave at `at` (taken at
    /// change count `changes`).
    pub fn stored(&self, changes: u64, stored: Stored, at: Instant) {
        let mut inner = self.inner();
        match stored {
            Stored::Kept => {
                inner.saved = Some(inner.saved.map_or(changes, |saved| saved.max(changes)));
                inner.kept_at = Some(at);
            }
            Stored::Refused => inner.superseded = true,
            Stored::Gone => inner.saved = None,
        }
    }

    /// A newer connection took the session over: nothing of this one is
    /// to be saved any more.
    pub fn supersede(&self) {
        self.inner().superseded = true;
    }

    /// Whether a newer connection owns the session in the store.
    pub fn superseded(&self) -> bool {
        self.inner().superseded
    }
}

impl Resets for Subscriptions {
    fn reset(&self, topic: &Topic, epoch: &Epoch, seq: u64) {
        self.told(topic, epoch, seq);
    }

    fn lagged(&self, topic: &Topic, cursor: &Position) {
        let mut inner = self.inner();
        let lag = inner.lag.get_or_insert_with(Box::default);
        lag.waiting.push((topic.clone(), cursor.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const REFRESH: Duration = Duration::from_secs(60);

    fn news() -> Topic {
        Topic::parse("news").unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn only_what_the_store_kept_counts_as_saved() {
        let now = Instant::now();
        let s = Subscriptions::default();
        s.insert(news(), Arc::from("e"), 0, false, false);
        let due = s.due(now, REFRESH).expect("due");
        s.ack(&news(), 3, None);
        // A save of the snapshot before the ack: the ack is still due.
        s.stored(due.changes, Stored::Kept, now);
        let due = s.due(now, REFRESH).expect("the ack is due");
        let acked = due.snapshot.as_ref().map(|s| s.subscriptions[0].acked);
        assert_eq!(acked, Some(3));
        // A save that failed is not recorded: the ack stays due.
        assert!(s.due(now, REFRESH).is_some());
        s.stored(due.changes, Stored::Kept, now);
        assert!(s.due(now, REFRESH).is_none());
    }

    #[test]
    fn a_kept_session_is_extended_when_its_copy_ages_and_saved_whole_when_it_is_gone() {
        let now = Instant::now();
        let s = Subscriptions::default();
        s.insert(news(), Arc::from("e"), 0, false, false);
        let due = s.due(now, REFRESH).expect("due");
        s.stored(due.changes, Stored::Kept, now);
        let later = now + REFRESH;
        let due = s.due(later, REFRESH).expect("an extend");
        assert!(due.snapshot.is_none());
        s.stored(due.changes, Stored::Gone, later);
        let due = s.due(later, REFRESH).expect("a save");
        assert!(due.snapshot.is_some());
        s.stored(due.changes, Stored::Refused, later);
        assert!(s.due(later + REFRESH, REFRESH).is_none(), "superseded");
        assert!(s.superseded());
    }

    #[test]
    fn a_server_subscription_keeps_its_origin_through_a_reset_and_a_snapshot() {
        let s = Subscriptions::default();
        s.insert(news(), Arc::from("e"), 0, true, false);
        s.told(&news(), &Arc::from("f"), 7);
        assert!(s.is_server(&news()));
        let state = s.snapshot().subscriptions[0].clone();
        assert!(state.server && state.told);
        let restored = Subscriptions::default();
        restored.restore(&state);
        assert!(restored.is_server(&news()));
    }

    #[tokio::test]
    async fn a_lagging_topics_catch_up_is_recorded_and_stopped_when_the_topic_is_left() {
        let s = Subscriptions::default();
        s.insert(news(), Arc::from("e"), 0, false, false);
        let at = Position {
            epoch: Arc::from("e"),
            seq: 4,
        };
        s.lagged(&news(), &at);
        assert_eq!(s.take_lagging(), vec![(news(), at)]);
        assert!(s.take_lagging().is_empty(), "taken once");
        let task = tokio::spawn(std::future::pending::<()>());
        s.catching_up(news(), || task.abort_handle());
        assert!(s.remove(&news()));
        let stopped = task.await.expect_err("aborted");
        assert!(stopped.is_cancelled());
        assert!(s.inner().lag.is_none(), "nothing held once it is over");
        // One that ends by itself gives its place back.
        let task = tokio::spawn(async { tokio::task::id() });
        s.catching_up(news(), || task.abort_handle());
        let id = task.await.expect("ran");
        s.caught_up(id);
        assert!(s.inner().lag.is_none());
    }

    #[tokio::test]
    async fn a_move_to_another_epoch_wakes_the_flusher_and_an_ack_does_not() {
        let soon = Arc::new(Notify::new());
        let s = Subscriptions::new(Some(soon.clone()));
        let woken = || {
            let notified = soon.notified();
            tokio::pin!(notified);
            // A stored permit completes it at once.
            notified.as_mut().enable()
        };
        s.insert(news(), Arc::from("e"), 0, false, false);
        s.ack(&news(), 3, None);
        s.insert(news(), Arc::from("e"), 3, false, false);
        assert!(!woken(), "nothing moved");
        s.reset(&news(), &Arc::from("f"), 7);
        assert!(woken(), "a reset");
        // Acks without an epoch do not count until one names it.
        s.ack(&news(), 9, None);
        assert!(s.is_told(&news()));
        s.ack(&news(), 8, Some("f"));
        assert!(!s.is_told(&news()), "confirmed");
        assert!(!woken(), "a confirmation is no move");
        let acked = s.snapshot().subscriptions[0].acked;
        assert_eq!(acked, 8);
    }
}
