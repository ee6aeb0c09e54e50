//! The embedded engine: one pod, everything in memory.
//!
//! Topics live in shards, each behind its own lock, so publishes to different
//! topics do not contend. A publish assigns the seq, appends to history and
//! delivers to the sink under the topic's shard lock: that lock is what makes
//! delivery order equal seq order.

use std::collections::hash_map::{DefaultHasher, Entry};
use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::time::Instant;

use crate::history::{self, HistoryPage, HistoryQuery};
use crate::page::{self, Page, PageSize};
use crate::presence::Ledger;
use crate::{
    Broker, BrokerError, BrokerStatus, Claim, Claimed, Deliver, Epoch, Forward, Namespaces,
    Position, PresenceCounts, PresencePage, PresenceUpdate, Publication, Recovery,
    ServerSubscription, SessionSnapshot, SessionStore, Since, Stored, Topic, Whose,
};

/// Topic shards; a power of two well above the core count.
const SHARDS: usize = 64;
/// How often expired history, idle topics and expired sessions are swept.
const SWEEP_INTERVAL: Duration = Duration::from_secs(10);

/// The in-memory [`Broker`] and [`SessionStore`].
#[derive(Clone)]
pub struct MemoryBroker {
    inner: Arc<Inner>,
}

struct Inner {
    shards: Box<[Mutex<HashMap<Topic, TopicState>>]>,
    namespaces: Arc<Namespaces>,
    sink: Arc<dyn Deliver>,
    sessions: Mutex<HashMap<String, StoredSession>>,
}

struct TopicState {
    epoch: Epoch,
    seq: u64,
    /// Oldest first, each with the time it was published.
    history: VecDeque<(Instant, Publication)>,
    /// How many `watch` calls are not yet matched by `unwatch`: a count, not
    /// a flag, so that a late `unwatch` of an earlier watch cannot cancel a
    /// newer one. A watched topic is never swept.
    watchers: usize,
    touched: Instant,
    /// Idempotency keys of recent publishes, with when they expire.
    keys: HashMap<Box<str>, (Instant, Position)>,
    /// Its presence; a topic with members is never swept.
    presence: Ledger,
}

impl TopicState {
    fn new(now: Instant) -> Self {
        Self {
            epoch: new_epoch(),
            seq: 0,
            history: VecDeque::new(),
            watchers: 0,
            touched: now,
            keys: HashMap::new(),
            presence: Ledger::default(),
        }
    }

    /// A page of the history after `after`.
    fn page_after(&self, after: u64, size: PageSize) -> Vec<Publication> {
        let from = self.history.partition_point(|(_, p)| p.seq <= after);
        size.take(self.history.range(from..).map(|(_, p)| p))
    }

    /// Drops what is older than `ttl`.
    fn expire(&mut self, now: Instant, ttl: Duration) {
        while let Some((at, _)) = self.history.front() {
            if now.saturating_duration_since(*at) <= ttl {
                break;
            }
            self.history.pop_front();
        }
    }
}

/// A fresh random epoch: 64 bits, hex.
fn new_epoch() -> Epoch {
    Arc::from(format!("{:016x}", rand::random::<u64>()))
}

impl MemoryBroker {
    /// An engine that delivers to `sink`. Inside a tokio runtime it also starts
    /// a sweeper that ends when the engine is dropped.
    pub fn new(namespaces: Arc<Namespaces>, sink: Arc<dyn Deliver>) -> Self {
        let inner = Arc::new(Inner {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            namespaces,
            sink,
            sessions: Mutex::new(HashMap::new()),
        });
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(sweep_forever(Arc::downgrade(&inner)));
        }
        Self { inner }
    }
}

impl Inner {
    fn shard(&self, topic: &Topic) -> MutexGuard<'_, HashMap<Topic, TopicState>> {
        let mut h = DefaultHasher::new();
        topic.as_str().hash(&mut h);
        let index = (h.finish() as usize) % SHARDS;
        // A poisoned shard only means a sink panicked mid-delivery; the map
        // itself is consistent, so keep serving.
        self.shards[index].lock().unwrap_or_else(|e| e.into_inner())
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, StoredSession>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn settings(&self, topic: &Topic) -> Result<(usize, Duration), BrokerError> {
        let ns = self.namespaces.require(topic)?;
        Ok((ns.history_size, ns.history_ttl))
    }

    /// Drops expired history, topics nobody watches that have nothing left to
    /// replay, and expired sessions.
    fn sweep(&self) {
        let now = Instant::now();
        for shard in self.shards.iter() {
            let mut topics = shard.lock().unwrap_or_else(|e| e.into_inner());
            topics.retain(|topic, state| {
                let ttl = self
                    .namespaces
                    .get(topic)
                    .map_or(Duration::ZERO, |ns| ns.history_ttl);
                state.expire(now, ttl);
                state.keys.retain(|_, (expires, _)| *expires > now);
                state.watchers > 0
                    || !state.keys.is_empty()
                    || !state.history.is_empty()
                    || !state.presence.is_empty()
                    || now.saturating_duration_since(state.touched) <= ttl
            });
        }
        self.sessions().retain(|_, s| s.deadline > now);
    }
}

async fn sweep_forever(inner: Weak<Inner>) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match inner.upgrade() {
            Some(inner) => inner.sweep(),
            None => return,
        }
    }
}

#[async_trait]
impl Broker for MemoryBroker {
    fn status(&self) -> BrokerStatus {
        BrokerStatus {
            kind: "memory",
            not_ready: None,
            connected: true,
            lineage_clock: None,
        }
    }

    async fn publish(
        &self,
        topic: &Topic,
        data: Bytes,
        idempotency_key: Option<&str>,
        // Not carried: delivery happens within this call, inside the
        // caller's span.
        _traceparent: Option<&str>,
    ) -> Result<Position, BrokerError> {
        let (history_size, ttl) = self.inner.settings(topic)?;
        // Kept for the history's window: bytes of its own, not a slice
        // that would pin the buffer it came in (an HTTP connection's read
        // buffer, a batch's body, many times its size) for as long as it is
        // kept. Copied before the lock.
        let data = if history_size > 0 {
            Bytes::copy_from_slice(&data)
        } else {
            data
        };
        let now = Instant::now();
        let mut shard = self.inner.shard(topic);
        let state = shard
            .entry(topic.clone())
            .or_insert_with(|| TopicState::new(now));
        if let Some(key) = idempotency_key {
            state.keys.retain(|_, (expires, _)| *expires > now);
            if let Some((_, first)) = state.keys.get(key) {
                return Ok(first.clone());
            }
        }
        state.seq += 1;
        state.touched = now;
        let publication = Publication {
            topic: topic.clone(),
            epoch: state.epoch.clone(),
            seq: state.seq,
            data,
        };
        if history_size > 0 {
            state.history.push_back((now, publication.clone()));
            while state.history.len() > history_size {
                state.history.pop_front();
            }
            state.expire(now, ttl);
        }
        if state.watchers > 0 {
            self.inner.sink.deliver(&publication, None);
        }
        let position = Position {
            epoch: state.epoch.clone(),
            seq: state.seq,
        };
        if let Some(key) = idempotency_key {
            let expires = now + crate::IDEMPOTENCY_WINDOW;
            state.keys.insert(key.into(), (expires, position.clone()));
        }
        Ok(position)
    }

    async fn watch(&self, topic: &Topic) -> Result<(), BrokerError> {
        self.inner.settings(topic)?;
        let now = Instant::now();
        let mut shard = self.inner.shard(topic);
        let state = shard
            .entry(topic.clone())
            .or_insert_with(|| TopicState::new(now));
        state.watchers += 1;
        state.touched = now;
        if state.watchers == 1 {
            // One pod: its first watch is the topic's first subscriber.
            self.inner.sink.occupancy(topic, true);
        }
        Ok(())
    }

    async fn unwatch(&self, topic: &Topic) {
        let now = Instant::now();
        if let Some(state) = self.inner.shard(topic).get_mut(topic) {
            let was = state.watchers;
            state.watchers = was.saturating_sub(1);
            state.touched = now;
            if was == 1 {
                self.inner.sink.occupancy(topic, false);
            }
        }
    }

    async fn recover(
        &self,
        topic: &Topic,
        since: Option<Since>,
        size: PageSize,
    ) -> Result<Recovery, BrokerError> {
        let (_, ttl) = self.inner.settings(topic)?;
        let now = Instant::now();
        let mut shard = self.inner.shard(topic);
        let state = match shard.entry(topic.clone()) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(TopicState::new(now)),
        };
        state.expire(now, ttl);
        let position = Position {
            epoch: state.epoch.clone(),
            seq: state.seq,
        };
        let Some(since) = since else {
            return Ok(Recovery::recovered(position, Vec::new()));
        };
        let same_epoch = since.epoch.as_deref().is_none_or(|e| *e == *state.epoch);
        if !same_epoch {
            return Ok(Recovery::lost(position));
        }
        let publications = state.page_after(since.seq, size);
        if !page::continues(&publications, since.seq, state.seq, size) {
            return Ok(Recovery::lost(position));
        }
        Ok(Recovery::recovered(position, publications))
    }

    async fn history(
        &self,
        topic: &Topic,
        epoch: &Epoch,
        after: u64,
        size: PageSize,
    ) -> Result<Page, BrokerError> {
        let (_, ttl) = self.inner.settings(topic)?;
        let mut shard = self.inner.shard(topic);
        let Some(state) = shard.get_mut(topic) else {
            return Ok(Page::Lost);
        };
        state.expire(Instant::now(), ttl);
        if *state.epoch != **epoch {
            return Ok(Page::Lost);
        }
        let publications = state.page_after(after, size);
        if !page::continues(&publications, after, state.seq, size) {
            return Ok(Page::Lost);
        }
        Ok(Page::Read {
            publications,
            seq: state.seq,
        })
    }

    // Presence: under the topic's shard lock, like a publish, so that
    // changes reach the sink in position order and a page or counts read
    // after a change was handed on.
    async fn presence_update(
        &self,
        topic: &Topic,
        update: PresenceUpdate,
    ) -> Result<(), BrokerError> {
        self.inner.settings(topic)?;
        let now = Instant::now();
        let mut shard = self.inner.shard(topic);
        let state = shard
            .entry(topic.clone())
            .or_insert_with(|| TopicState::new(now));
        state.touched = now;
        if let Some(change) = state.presence.update(&update) {
            // One pod: every join and leave is its own, watched or not (a
            // topic's last subscriber has left by the time its leave is
            // written).
            if !change.is_quiet() {
                self.inner
                    .sink
                    .members(topic, &change.joins, &change.leaves);
            }
            if state.watchers > 0 {
                self.inner.sink.presence(topic, &change);
            }
        }
        Ok(())
    }

    async fn presence(
        &self,
        topic: &Topic,
        after: Option<&str>,
        limit: usize,
    ) -> Result<PresencePage, BrokerError> {
        self.inner.settings(topic)?;
        let shard = self.inner.shard(topic);
        Ok(shard
            .get(topic)
            .map_or_else(PresencePage::default, |state| {
                state.presence.page(after, limit)
            }))
    }

    async fn presence_counts(&self, topic: &Topic) -> Result<PresenceCounts, BrokerError> {
        self.inner.settings(topic)?;
        let shard = self.inner.shard(topic);
        Ok(shard
            .get(topic)
            .map_or_else(PresenceCounts::default, |state| state.presence.counts()))
    }

    async fn read_history(
        &self,
        topic: &Topic,
        query: &HistoryQuery,
    ) -> Result<HistoryPage, BrokerError> {
        let (_, ttl) = self.inner.settings(topic)?;
        let now = Instant::now();
        let mut shard = self.inner.shard(topic);
        let state = shard
            .entry(topic.clone())
            .or_insert_with(|| TopicState::new(now));
        state.expire(now, ttl);
        let position = Position {
            epoch: state.epoch.clone(),
            seq: state.seq,
        };
        let kept = state.history.iter().map(|(_, p)| p);
        // One more than a page may hold, so that the window's rule sees
        // whether the page is whole.
        let read = query.size.messages.saturating_add(1);
        let kept: Vec<Publication> = match (query.reverse, query.since) {
            (false, Some(since)) => kept.filter(|p| p.seq > since).take(read).cloned().collect(),
            (false, None) => kept.take(read).cloned().collect(),
            (true, since) => kept
                .rev()
                .filter(|p| since.is_none_or(|since| p.seq < since))
                .take(read)
                .cloned()
                .collect(),
        };
        Ok(history::window(query, position, kept))
    }

    async fn subscription(
        &self,
        user: &str,
        command: ServerSubscription,
    ) -> Result<(), BrokerError> {
        // One pod: its sink is every pod.
        self.inner.settings(command.topic())?;
        self.inner.sink.subscription(user, &command);
        Ok(())
    }

    async fn forward(&self, forward: Forward) -> Result<(), BrokerError> {
        // One pod: its sink is every pod.
        self.inner.sink.forward(&forward);
        Ok(())
    }
}

#[async_trait]
impl SessionStore for MemoryBroker {
    async fn save(
        &self,
        id: &str,
        owner: &str,
        snapshot: SessionSnapshot,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        let now = Instant::now();
        let mut sessions = self.inner.sessions();
        let claimed_by_another = sessions
            .get(id)
            .is_some_and(|s| s.deadline > now && *s.owner != *owner);
        if claimed_by_another {
            return Ok(false);
        }
        let stored = StoredSession {
            deadline: now + ttl,
            owner: Arc::from(owner),
            snapshot,
        };
        sessions.insert(id.to_owned(), stored);
        Ok(true)
    }

    async fn extend(&self, id: &str, owner: &str, ttl: Duration) -> Result<Stored, BrokerError> {
        let now = Instant::now();
        let mut sessions = self.inner.sessions();
        Ok(match sessions.get_mut(id).filter(|s| s.deadline > now) {
            None => Stored::Gone,
            Some(stored) if *stored.owner != *owner => Stored::Refused,
            Some(stored) => {
                stored.deadline = now + ttl;
                Stored::Kept
            }
        })
    }

    async fn claim(&self, id: &str, owner: &str, user: Option<&str>) -> Result<Claim, BrokerError> {
        Ok(claim(&mut self.inner.sessions(), id, owner, user))
    }

    async fn adopt(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        snapshot: &SessionSnapshot,
        ttl: Duration,
    ) -> Result<Claim, BrokerError> {
        let now = Instant::now();
        let mut sessions = self.inner.sessions();
        let stored = sessions.get(id).is_some_and(|s| s.deadline > now);
        if !stored && Claim::belongs(snapshot.user.as_ref(), user) {
            let kept = StoredSession {
                deadline: now + ttl,
                owner: Arc::from(owner),
                snapshot: snapshot.clone(),
            };
            sessions.insert(id.to_owned(), kept);
            return Ok(Claim::Taken(Claimed {
                snapshot: snapshot.clone(),
                from: None,
                owner: Arc::from(owner),
            }));
        }
        Ok(claim(&mut sessions, id, owner, user))
    }

    async fn revoke(&self, user: &str, _ttl: Duration) -> Result<(), BrokerError> {
        // One pod: its connections close now, and none of them saves again.
        self.inner
            .sessions()
            .retain(|_, s| !Claim::belongs(s.snapshot.user.as_ref(), Some(user)));
        self.inner.sink.disconnect(user);
        Ok(())
    }

    async fn whose(&self, id: &str) -> Result<Whose, BrokerError> {
        // A revocation removes the user's sessions: what is left is theirs.
        let now = Instant::now();
        let sessions = self.inner.sessions();
        Ok(match sessions.get(id).filter(|s| s.deadline > now) {
            Some(stored) => Whose::of(stored.snapshot.user.as_ref()),
            None => Whose::Nobody,
        })
    }
}

/// [`SessionStore::claim`] under the sessions' lock.
fn claim(
    sessions: &mut HashMap<String, StoredSession>,
    id: &str,
    owner: &str,
    user: Option<&str>,
) -> Claim {
    let now = Instant::now();
    let Some(stored) = sessions.get_mut(id).filter(|s| s.deadline > now) else {
        return Claim::NotFound;
    };
    if !Claim::belongs(stored.snapshot.user.as_ref(), user) {
        return Claim::OtherUser;
    }
    // One pod's memory never goes back in time: the token is the owner.
    let from = std::mem::replace(&mut stored.owner, Arc::from(owner));
    Claim::Taken(Claimed {
        snapshot: stored.snapshot.clone(),
        from: Some(from.to_string()),
        owner: Arc::from(owner),
    })
}

/// A session as the memory store keeps it.
struct StoredSession {
    deadline: Instant,
    owner: Arc<str>,
    snapshot: SessionSnapshot,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{NamespaceSettings, SubscriptionState};

    #[derive(Default)]
    #[allow(clippy::type_complexity)]
    struct Collect(
        Mutex<Vec<u64>>,
        Mutex<Vec<String>>,
        Mutex<Vec<(u64, Vec<String>, Vec<String>)>>,
    );
    impl Deliver for Collect {
        fn deliver(&self, p: &Publication, _: Option<&str>) {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).push(p.seq);
        }
        fn reset(&self, _: &Topic, _: &Position) {}
        fn disconnect(&self, user: &str) {
            self.1
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(user.to_owned());
        }
        fn presence(&self, _: &Topic, change: &crate::PresenceChange) {
            let joins = change.joins.iter().map(|m| m.user.to_string()).collect();
            let leaves = change.leaves.iter().map(|u| u.to_string()).collect();
            self.2
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((change.position, joins, leaves));
        }
    }

    fn broker(history_size: usize) -> (MemoryBroker, Arc<Collect>) {
        let ns = BTreeMap::from([(
            "default".to_owned(),
            NamespaceSettings {
                history_size,
                ..NamespaceSettings::default()
            },
        )]);
        let sink = Arc::new(Collect::default());
        let namespaces = Arc::new(Namespaces::new(&ns).unwrap_or_default());
        (MemoryBroker::new(namespaces, sink.clone()), sink)
    }

    fn topic(s: &str) -> Topic {
        Topic::parse(s).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn history_keeps_a_copy_not_a_slice_of_the_buffer_a_publish_came_in()
    -> Result<(), BrokerError> {
        let (b, _) = broker(10);
        let t = topic("news");
        // A body read with others, as an HTTP connection's buffer holds them.
        let buffer = Bytes::from(vec![b'1'; 64 * 1024]);
        let data = buffer.slice(100..101);
        b.publish(&t, data.clone(), None, None).await?;
        let r = b
            .recover(&t, Some(Since::claimed(0, None)), PageSize::UNBOUNDED)
            .await?;
        let kept = &r.publications[0].data;
        assert_eq!(kept, &data);
        assert_ne!(kept.as_ptr(), data.as_ptr(), "a copy of its own");
        Ok(())
    }

    #[tokio::test]
    async fn seqs_history_and_recovery() -> Result<(), BrokerError> {
        let (b, sink) = broker(3);
        let t = topic("news");
        b.publish(&t, Bytes::from_static(b"1"), None, None).await?;
        b.watch(&t).await?;
        for _ in 0..4 {
            b.publish(&t, Bytes::from_static(b"1"), None, None).await?;
        }
        // Only what was published while watched reaches the sink.
        assert_eq!(
            *sink.0.lock().unwrap_or_else(|e| e.into_inner()),
            vec![2, 3, 4, 5]
        );

        let since = |seq, epoch: Option<&str>| Some(Since::claimed(seq, epoch.map(str::to_owned)));
        let r = b.recover(&t, since(2, None), PageSize::UNBOUNDED).await?;
        assert!(r.recovered);
        assert_eq!(r.position.seq, 5);
        assert_eq!(
            r.publications.iter().map(|p| p.seq).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        let epoch = r.position.epoch.to_string();
        assert!(
            b.recover(&t, since(5, Some(&epoch)), PageSize::UNBOUNDED)
                .await?
                .recovered
        );
        // History holds 3..=5 only: since 1 would need seq 2.
        assert!(
            !b.recover(&t, since(1, None), PageSize::UNBOUNDED)
                .await?
                .recovered
        );
        assert!(
            !b.recover(&t, since(3, Some("other")), PageSize::UNBOUNDED)
                .await?
                .recovered
        );
        assert!(
            !b.recover(&t, since(9, None), PageSize::UNBOUNDED)
                .await?
                .recovered
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_replay_reads_page_by_page_and_is_lost_once_trimmed() -> Result<(), BrokerError> {
        let (b, _) = broker(10);
        let t = topic("news");
        for _ in 0..8 {
            b.publish(&t, Bytes::from_static(b"1"), None, None).await?;
        }
        let two = PageSize {
            messages: 2,
            bytes: usize::MAX,
        };
        let r = b.recover(&t, Some(Since::claimed(0, None)), two).await?;
        assert!(r.recovered);
        assert_eq!(
            r.publications.iter().map(|p| p.seq).collect::<Vec<_>>(),
            [1, 2]
        );
        let epoch = r.position.epoch;
        let seqs = |page: Page| match page {
            Page::Read { publications, seq } => {
                Some((publications.iter().map(|p| p.seq).collect::<Vec<_>>(), seq))
            }
            Page::Lost => None,
        };
        assert_eq!(
            seqs(b.history(&t, &epoch, 2, two).await?),
            Some((vec![3, 4], 8))
        );
        assert_eq!(
            seqs(b.history(&t, &epoch, 8, two).await?),
            Some((vec![], 8))
        );
        assert_eq!(
            seqs(b.history(&t, &Epoch::from("other"), 4, two).await?),
            None
        );
        // Ten more: history holds 9..=18, and seq 5 is gone.
        for _ in 0..10 {
            b.publish(&t, Bytes::from_static(b"1"), None, None).await?;
        }
        assert_eq!(seqs(b.history(&t, &epoch, 4, two).await?), None);
        assert_eq!(
            seqs(b.history(&t, &epoch, 8, two).await?),
            Some((vec![9, 10], 18))
        );
        Ok(())
    }

    #[tokio::test]
    async fn watches_are_counted() -> Result<(), BrokerError> {
        let (b, sink) = broker(3);
        let t = topic("news");
        let delivered = || sink.0.lock().unwrap_or_else(|e| e.into_inner()).len();
        b.watch(&t).await?;
        b.watch(&t).await?;
        // A late unwatch of the first watch does not cancel the second.
        b.unwatch(&t).await;
        b.publish(&t, Bytes::from_static(b"1"), None, None).await?;
        assert_eq!(delivered(), 1);
        b.unwatch(&t).await;
        b.publish(&t, Bytes::from_static(b"1"), None, None).await?;
        assert_eq!(delivered(), 1);
        Ok(())
    }

    #[tokio::test]
    async fn a_retry_with_the_same_key_publishes_nothing() -> Result<(), BrokerError> {
        let (b, sink) = broker(3);
        let t = topic("news");
        b.watch(&t).await?;
        let first = b
            .publish(&t, Bytes::from_static(b"1"), Some("k"), None)
            .await?;
        let again = b
            .publish(&t, Bytes::from_static(b"1"), Some("k"), None)
            .await?;
        let other = b
            .publish(&t, Bytes::from_static(b"1"), Some("k2"), None)
            .await?;
        assert_eq!((first.seq, again.seq, other.seq), (1, 1, 2));
        assert_eq!(
            *sink.0.lock().unwrap_or_else(|e| e.into_inner()),
            vec![1, 2]
        );
        Ok(())
    }

    #[tokio::test]
    async fn a_since_at_the_end_of_all_seqs_is_not_recovered() -> Result<(), BrokerError> {
        let (b, _) = broker(3);
        let t = topic("a");
        b.publish(&t, Bytes::from_static(b"1"), None, None).await?;
        let since = Since::claimed(u64::MAX, None);
        let recovery = b.recover(&t, Some(since), PageSize::UNBOUNDED).await?;
        assert!(!recovery.recovered);
        assert!(recovery.publications.is_empty());
        Ok(())
    }

    #[tokio::test]
    async fn unknown_namespace_is_refused() {
        let (b, _) = broker(3);
        let err = b.publish(&topic("nope:x"), Bytes::new(), None, None).await;
        assert!(matches!(err, Err(BrokerError::UnknownNamespace(_))));
    }

    #[tokio::test(start_paused = true)]
    async fn sessions_expire() -> Result<(), BrokerError> {
        let (b, _) = broker(3);
        let ttl = Duration::from_secs(5);
        assert!(b.save("s", "a", SessionSnapshot::default(), ttl).await?);
        assert!(matches!(b.claim("s", "a", None).await?, Claim::Taken(_)));
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(b.claim("s", "a", None).await?, Claim::NotFound);
        Ok(())
    }

    #[tokio::test]
    async fn a_claimed_session_refuses_its_former_owner() -> Result<(), BrokerError> {
        let (b, _) = broker(3);
        let ttl = Duration::from_secs(60);
        let old = SessionSnapshot {
            user: None,
            subscriptions: vec![SubscriptionState {
                topic: topic("chat:x"),
                epoch: Arc::from("e"),
                acked: 1,
                told: false,
                server: false,
                delta: false,
            }],
        };
        assert!(b.save("s", "a", old.clone(), ttl).await?);
        let claimed = b.claim("s", "b", None).await?;
        assert_eq!(
            claimed,
            Claim::Taken(Claimed {
                snapshot: old,
                from: Some("a".to_owned()),
                owner: Arc::from("b"),
            })
        );
        let newer = SessionSnapshot::default();
        assert!(b.save("s", "b", newer.clone(), ttl).await?);
        assert!(!b.save("s", "a", SessionSnapshot::default(), ttl).await?);
        let claimed = b.claim("s", "c", None).await?;
        assert_eq!(
            claimed,
            Claim::Taken(Claimed {
                snapshot: newer,
                from: Some("b".to_owned()),
                owner: Arc::from("c"),
            })
        );
        Ok(())
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_not_stored_yet_is_adopted_and_only_its_owner_extends_it()
    -> Result<(), BrokerError> {
        let (b, _) = broker(3);
        let ttl = Duration::from_secs(5);
        let live = SessionSnapshot::default();
        let adopted = b.adopt("s", "b", None, &live, ttl).await?;
        assert_eq!(
            adopted,
            Claim::Taken(Claimed {
                snapshot: live,
                from: None,
                owner: Arc::from("b"),
            })
        );
        // The connection taken over ends at last: refused.
        assert!(!b.save("s", "a", SessionSnapshot::default(), ttl).await?);
        assert_eq!(b.extend("s", "a", ttl).await?, Stored::Refused);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(b.extend("s", "b", ttl).await?, Stored::Kept);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(
            matches!(b.claim("s", "c", None).await?, Claim::Taken(c) if c.from.as_deref() == Some("b"))
        );
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(b.extend("s", "c", ttl).await?, Stored::Gone);
        Ok(())
    }

    #[tokio::test]
    async fn a_session_is_claimed_only_by_its_user_and_not_after_a_revoke()
    -> Result<(), BrokerError> {
        let (b, sink) = broker(3);
        let ttl = Duration::from_secs(60);
        let alices = SessionSnapshot {
            user: Some(crate::SessionUser {
                id: Arc::from("alice"),
                since_ms: 1,
            }),
            subscriptions: Vec::new(),
        };
        assert!(b.save("s", "a", alices, ttl).await?);
        assert!(b.save("t", "a", SessionSnapshot::default(), ttl).await?);
        assert_eq!(b.claim("s", "m", Some("mallory")).await?, Claim::OtherUser);
        assert_eq!(b.claim("s", "m", None).await?, Claim::OtherUser);
        // The refused claims took nothing: alice's connection still owns it.
        assert!(
            matches!(b.claim("s", "a2", Some("alice")).await?, Claim::Taken(c) if c.from.as_deref() == Some("a"))
        );
        b.revoke("alice", ttl).await?;
        assert_eq!(b.claim("s", "a3", Some("alice")).await?, Claim::NotFound);
        assert_eq!(*sink.1.lock().unwrap_or_else(|e| e.into_inner()), ["alice"]);
        // Anonymous sessions are anyone's who knows the id.
        assert!(matches!(b.claim("t", "b", None).await?, Claim::Taken(_)));
        Ok(())
    }

    fn members(users: &[(&str, u32)]) -> Vec<(crate::Member, u32)> {
        users
            .iter()
            .map(|(user, connections)| {
                let member = crate::Member {
                    user: Arc::from(*user),
                    info: Some(Bytes::from(format!("{{\"name\":\"{user}\"}}"))),
                };
                (member, *connections)
            })
            .collect()
    }

    #[tokio::test]
    async fn presence_changes_reach_a_watching_pod_in_position_order() -> Result<(), BrokerError> {
        let (b, sink) = broker(3);
        let t = topic("room");
        let changes = || sink.2.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // Not watched yet: the room moves, the sink hears nothing.
        let update = PresenceUpdate {
            set: members(&[("bob", 1)]),
            removed: Vec::new(),
            anonymous: 1,
        };
        b.presence_update(&t, update).await?;
        assert!(changes().is_empty());
        b.watch(&t).await?;
        let update = PresenceUpdate {
            set: members(&[("alice", 2), ("bob", 2)]),
            removed: Vec::new(),
            anonymous: 1,
        };
        b.presence_update(&t, update).await?;
        // Nothing changed: no position.
        let update = PresenceUpdate {
            anonymous: 1,
            ..PresenceUpdate::default()
        };
        b.presence_update(&t, update).await?;
        let update = PresenceUpdate {
            set: Vec::new(),
            removed: vec![Arc::from("bob")],
            anonymous: 0,
        };
        b.presence_update(&t, update).await?;
        assert_eq!(
            changes(),
            vec![(2, s(&["alice"]), s(&[])), (3, s(&[]), s(&["bob"]))]
        );
        let counts = b.presence_counts(&t).await?;
        assert_eq!(
            counts,
            PresenceCounts {
                position: 3,
                users: 1,
                connections: 2
            }
        );
        let page = b.presence(&t, None, 10).await?;
        assert_eq!(page.counts, counts);
        assert!(!page.more);
        assert_eq!(page.members.len(), 1);
        assert_eq!(&*page.members[0].user, "alice");
        assert_eq!(
            page.members[0].info.as_deref(),
            Some(&b"{\"name\":\"alice\"}"[..])
        );
        Ok(())
    }

    #[tokio::test]
    async fn presence_pages_and_an_unknown_topic() -> Result<(), BrokerError> {
        let (b, _) = broker(3);
        let t = topic("room");
        let users: Vec<String> = (0..5).map(|i| format!("u{i}")).collect();
        let pairs: Vec<(&str, u32)> = users.iter().map(|u| (u.as_str(), 1)).collect();
        let update = PresenceUpdate {
            set: members(&pairs),
            ..PresenceUpdate::default()
        };
        b.presence_update(&t, update).await?;
        let first = b.presence(&t, None, 2).await?;
        assert!(first.more);
        let last = first.members.last().map(|m| m.user.to_string());
        let second = b.presence(&t, last.as_deref(), 3).await?;
        assert!(!second.more);
        let got: Vec<String> = first
            .members
            .iter()
            .chain(&second.members)
            .map(|m| m.user.to_string())
            .collect();
        assert_eq!(got, users);
        assert_eq!(
            b.presence(&topic("other"), None, 2).await?,
            PresencePage::default()
        );
        let refused = b.presence_counts(&topic("nope:x")).await;
        assert!(matches!(refused, Err(BrokerError::UnknownNamespace(_))));
        Ok(())
    }

    #[tokio::test]
    async fn whose_reads_a_stored_sessions_user_and_a_forward_goes_to_the_sink() {
        #[derive(Default)]
        struct Forwards(Mutex<Vec<Forward>>);
        impl Deliver for Forwards {
            fn deliver(&self, _: &Publication, _: Option<&str>) {}
            fn reset(&self, _: &Topic, _: &Position) {}
            fn disconnect(&self, _: &str) {}
            fn forward(&self, forward: &Forward) {
                self.0
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(forward.clone());
            }
        }
        let namespaces = Namespaces::new(&BTreeMap::from([(
            "default".to_owned(),
            NamespaceSettings::default(),
        )]))
        .unwrap_or_else(|e| panic!("{e}"));
        let sink = Arc::new(Forwards::default());
        let broker = MemoryBroker::new(Arc::new(namespaces), sink.clone());
        let ttl = Duration::from_secs(60);
        let alices = SessionSnapshot {
            user: Some(crate::SessionUser {
                id: Arc::from("alice"),
                since_ms: 0,
            }),
            subscriptions: Vec::new(),
        };
        let saved = broker.save("s1", "conn", alices, ttl).await;
        assert!(matches!(saved, Ok(true)));
        let saved = broker
            .save("s2", "conn", SessionSnapshot::default(), ttl)
            .await;
        assert!(matches!(saved, Ok(true)));
        assert_eq!(
            broker.whose("s1").await.ok(),
            Some(Whose::User(Arc::from("alice")))
        );
        assert_eq!(broker.whose("s2").await.ok(), Some(Whose::Anonymous));
        assert_eq!(broker.whose("s3").await.ok(), Some(Whose::Nobody));
        assert!(broker.revoke("alice", ttl).await.is_ok());
        assert_eq!(broker.whose("s1").await.ok(), Some(Whose::Nobody));
        let posted = Forward {
            session: "k".to_owned(),
            user: None,
            commands: vec![Bytes::from_static(br#"{"op":"ping","id":1}"#)],
        };
        assert!(broker.forward(posted.clone()).await.is_ok());
        assert_eq!(*sink.0.lock().unwrap_or_else(|e| e.into_inner()), [posted]);
    }
}
