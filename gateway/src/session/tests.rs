//! The session's own tests: what a connection's task leaves behind when it
//! panics (nothing), the registry's races, and the subscribe handshake,
//! failed at each of its steps.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

use std::net::IpAddr;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures_util::FutureExt;
use proto::ErrorCode;
use router::{
    Broker, BrokerError, BrokerStatus, Claim, Deliver, Epoch, MemoryBroker, Page, PageSize,
    Position, Publication, Recovery, RedisBroker, SessionSave, SessionSnapshot, SessionStore,
    SessionUser, Since, Stored, SubscriptionState, Topic,
};
use serde_json::Value;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::{Instant, timeout};

use super::handshake::{Origin, SubscribeError};
use super::hello::Denied;
use super::{LiveSession, Pod, Registry, Replays, Session, Subscriptions, Unregistered};
use crate::admission::Slots;
use crate::budget::Budgets;
use crate::config::{BrokerKind, Config};
use crate::hub::Hub;
use crate::metrics::Metrics;
use crate::outbound::{Outbound, Writing};

/// Publications nobody here reads.
struct Nowhere;

impl Deliver for Nowhere {
    fn deliver(&self, _: &Publication, _: Option<&str>) {}
    fn reset(&self, _: &Topic, _: &Position) {}
    fn disconnect(&self, _: &str) {}
}

/// A pod as [`crate::node`] builds it, with the embedded broker (built here:
/// the session does not depend on the node, tests included).
fn pod() -> Arc<Pod> {
    let config = Config::load(None, std::iter::empty()).unwrap();
    pod_with(config, Fault::None).0
}

/// A pod over the embedded broker failing as `fault` says (its store too),
/// and that broker.
fn pod_with(config: Config, fault: Fault) -> (Arc<Pod>, Arc<Faulty>) {
    let config = Arc::new(config);
    let metrics = Arc::new(Metrics::new());
    let namespaces = Arc::new(config.namespaces());
    let broker = Arc::new(Faulty {
        memory: MemoryBroker::new(namespaces.clone(), Arc::new(Nowhere)),
        fault,
        watches: AtomicI64::new(0),
        unwatched: Notify::new(),
    });
    let writing = Writing::new(&config, metrics.clone(), Instant::now());
    let hub = Arc::new(Hub::new(
        metrics.clone(),
        config.queue.frames,
        config.queue.bytes,
    ));
    let presence = Arc::new(crate::presence::Presence::new(
        &config,
        namespaces.clone(),
        hub.clone(),
        metrics.clone(),
    ));
    let pod = Arc::new(Pod {
        hub,
        presence,
        broker: broker.clone(),
        sessions: broker.clone(),
        live: Arc::new(Registry::default()),
        verifier: None,
        namespaces,
        replays: Replays::new(&config.replay, metrics.clone()),
        writing: Arc::new(writing),
        flush_soon: None,
        budgets: Arc::new(Budgets::new(&config.session, metrics.clone())),
        hooks: Arc::new(crate::hooks::Hooks::new(&config.proxy, metrics.clone())),
        webhooks: Arc::new(crate::webhooks::Webhooks::off()),
        metrics,
        config,
    });
    (pod, broker)
}

#[tokio::test]
async fn a_panicking_connection_task_releases_its_session_hub_memberships_and_socket() {
    let node = pod();
    let slots = Arc::new(Slots::new(&node.config.websocket, node.metrics.clone()));
    let admission = slots.admit(IpAddr::from([127, 0, 0, 1])).unwrap();
    let out = Outbound::new(node.config.queue_limits());
    let mut session = Session::new(node.clone(), &admission, out.clone());

    // As a `hello` and a `sub` leave it: registered, and a subscriber.
    let id: Arc<str> = Arc::from("s1");
    session.id = Some(id.clone());
    let arrived = node.live.arrival();
    let live = LiveSession {
        conn: session.conn,
        owner: session.owner.clone(),
        out: out.clone(),
        subscriptions: session.subscriptions.clone(),
    };
    node.live.register(id, live, arrived).unwrap();
    let topic = Topic::parse("news").unwrap();
    node.hub.join(
        &topic,
        session.conn,
        out.clone(),
        session.subscriptions.clone(),
    );
    session
        .subscriptions
        .insert(topic.clone(), Epoch::from("e"), 0, false, false);
    assert_eq!((node.live.len(), node.hub.subscribers(&topic)), (1, 1));

    let panicked = std::panic::catch_unwind(AssertUnwindSafe(move || {
        let _in_the_task = session;
        panic!("a bug in a connection's task");
    }));
    assert!(panicked.is_err());

    assert_eq!(node.live.len(), 0, "the registry entry is released");
    assert_eq!(node.hub.subscribers(&topic), 0, "the hub let go");
    assert!(out.is_stopped(), "the reader and writer are told to stop");
    assert_eq!(node.metrics.connection_panics.get(), 1);
}

/// A session of `user`'s as a connection registers it.
fn live(conn: u64, user: &str) -> (LiveSession, Outbound) {
    let out = Outbound::new(
        Config::load(None, std::iter::empty())
            .unwrap()
            .queue_limits(),
    );
    let subscriptions = Subscriptions::new(None);
    subscriptions.set_user(Some(SessionUser {
        id: Arc::from(user),
        since_ms: 0,
    }));
    let live = LiveSession {
        conn,
        owner: Arc::from(format!("owner-{conn}")),
        out: out.clone(),
        subscriptions,
    };
    (live, out)
}

#[test]
fn a_disconnect_reaches_a_connection_that_registers_after_its_sweep() {
    let registry = Registry::default();
    // Its `hello` began, then the user was disconnected (the sweep found
    // nothing to close), then it registers: refused.
    let arrived = registry.arrival();
    assert_eq!(registry.disconnect("alice"), 0);
    let (alice, _) = live(1, "alice");
    assert_eq!(
        registry.register(Arc::from("s1"), alice, arrived),
        Err(Unregistered::Disconnected)
    );
    // Another user's connection, and the user's next one, register.
    let (bob, _) = live(2, "bob");
    assert_eq!(registry.register(Arc::from("s2"), bob, arrived), Ok(()));
    let (again, _) = live(3, "alice");
    let later = registry.arrival();
    assert_eq!(registry.register(Arc::from("s3"), again, later), Ok(()));
    assert_eq!(registry.len(), 2);
}

#[tokio::test]
async fn of_two_racing_registrations_of_a_session_the_later_serves_it_and_the_first_is_taken_over()
{
    let registry = Registry::default();
    let (first, _) = live(1, "alice");
    let first_subscriptions = first.subscriptions.clone();
    let (second, second_out) = live(2, "alice");
    let arrived = registry.arrival();
    registry.register(Arc::from("s1"), first, arrived).unwrap();
    registry.register(Arc::from("s1"), second, arrived).unwrap();
    // The first is told to stop, and will not save over the second.
    tokio::time::timeout(Duration::from_secs(5), first_subscriptions.taken_over())
        .await
        .expect("the first connection is taken over");
    assert!(first_subscriptions.superseded());
    // One connection listed, and a disconnect reaches it.
    assert_eq!(registry.len(), 1);
    assert_eq!(registry.disconnect("alice"), 1);
    assert!(second_out.is_closing());
}

/// Where the broker under a pod fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    /// No replay turn is ever free (not the broker's doing, but a step).
    Turn,
    Watch,
    Recover,
    /// A session's save does not reach the store.
    Save,
    /// A session's save is refused: another connection owns it.
    TakenOver,
    /// A replay's read of history, after the first page.
    History,
}

/// The embedded broker and store, failing at one step, and counting the
/// watches it holds.
struct Faulty {
    memory: MemoryBroker,
    fault: Fault,
    watches: AtomicI64,
    unwatched: Notify,
}

impl Faulty {
    fn fails(&self, step: Fault) -> Result<(), BrokerError> {
        if self.fault == step {
            return Err(BrokerError::unavailable(format!("{step:?} failed")));
        }
        Ok(())
    }

    /// Once every watch made was released (within a bound: a failed
    /// handshake releases it in a task of its own).
    async fn released(&self) {
        let all = async {
            loop {
                let unwatched = self.unwatched.notified();
                if self.watches.load(Ordering::SeqCst) == 0 {
                    return;
                }
                unwatched.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), all)
            .await
            .expect("every watch is released");
    }
}

#[tonic::async_trait]
impl Broker for Faulty {
    fn status(&self) -> BrokerStatus {
        self.memory.status()
    }

    async fn publish(
        &self,
        topic: &Topic,
        data: Bytes,
        idempotency_key: Option<&str>,
        traceparent: Option<&str>,
    ) -> Result<Position, BrokerError> {
        let published = self
            .memory
            .publish(topic, data, idempotency_key, traceparent);
        published.await
    }

    async fn watch(&self, topic: &Topic) -> Result<(), BrokerError> {
        self.fails(Fault::Watch)?;
        self.memory.watch(topic).await?;
        self.watches.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    async fn unwatch(&self, topic: &Topic) {
        self.memory.unwatch(topic).await;
        self.watches.fetch_sub(1, Ordering::SeqCst);
        self.unwatched.notify_one();
    }

    async fn recover(
        &self,
        topic: &Topic,
        since: Option<Since>,
        page: PageSize,
    ) -> Result<Recovery, BrokerError> {
        self.fails(Fault::Recover)?;
        self.memory.recover(topic, since, page).await
    }

    async fn history(
        &self,
        topic: &Topic,
        epoch: &Epoch,
        after: u64,
        page: PageSize,
    ) -> Result<Page, BrokerError> {
        self.fails(Fault::History)?;
        self.memory.history(topic, epoch, after, page).await
    }

    async fn read_history(
        &self,
        topic: &Topic,
        query: &router::HistoryQuery,
    ) -> Result<router::HistoryPage, BrokerError> {
        self.fails(Fault::History)?;
        self.memory.read_history(topic, query).await
    }

    async fn subscription(
        &self,
        user: &str,
        command: router::ServerSubscription,
    ) -> Result<(), BrokerError> {
        self.memory.subscription(user, command).await
    }
}

#[tonic::async_trait]
impl SessionStore for Faulty {
    async fn save(
        &self,
        id: &str,
        owner: &str,
        snapshot: SessionSnapshot,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        self.fails(Fault::Save)?;
        if self.fault == Fault::TakenOver {
            return Ok(false);
        }
        self.memory.save(id, owner, snapshot, ttl).await
    }

    async fn extend(&self, id: &str, owner: &str, ttl: Duration) -> Result<Stored, BrokerError> {
        self.memory.extend(id, owner, ttl).await
    }

    async fn claim(&self, id: &str, owner: &str, user: Option<&str>) -> Result<Claim, BrokerError> {
        self.memory.claim(id, owner, user).await
    }

    async fn adopt(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        snapshot: &SessionSnapshot,
        ttl: Duration,
    ) -> Result<Claim, BrokerError> {
        self.memory.adopt(id, owner, user, snapshot, ttl).await
    }

    async fn revoke(&self, user: &str, ttl: Duration) -> Result<(), BrokerError> {
        self.memory.revoke(user, ttl).await
    }
}

/// A session of the pod's, as a new connection starts it, with its queue.
fn connect(node: &Arc<Pod>) -> (Session, Outbound) {
    let slots = Arc::new(Slots::new(&node.config.websocket, node.metrics.clone()));
    let admission = slots.admit(IpAddr::from([127, 0, 0, 1])).unwrap();
    let out = Outbound::new(node.config.queue_limits());
    (Session::new(node.clone(), &admission, out.clone()), out)
}

/// What the session queued for its client, as JSON.
fn sent(out: &Outbound) -> Vec<Value> {
    let mut batch = Vec::new();
    out.take(&mut batch);
    batch
        .iter()
        .filter(|frame| frame[0] == 0x81) // text, whole: not the close
        .map(|frame| {
            let payload = match frame[1] {
                126 => &frame[4..],
                127 => &frame[10..],
                _ => &frame[2..],
            };
            serde_json::from_slice(payload).unwrap()
        })
        .collect()
}

fn topic(name: &str) -> Topic {
    Topic::parse(name).unwrap()
}

#[tokio::test]
async fn a_subscribe_that_fails_at_any_step_leaves_the_topic_and_keeps_nothing_of_it() {
    for fault in [
        Fault::Turn,
        Fault::Watch,
        Fault::Recover,
        Fault::Save,
        Fault::TakenOver,
    ] {
        let mut config = Config::load(None, std::iter::empty()).unwrap();
        // A shared store, so that a client's `sub` is saved before its `ok`.
        config.broker = BrokerKind::Redis;
        if fault == Fault::Turn {
            config.replay.max_concurrent = 0;
        }
        let (node, broker) = pod_with(config, fault);
        let (mut session, out) = connect(&node);
        session.id = Some(Arc::from("s1"));
        if fault == Fault::Turn {
            // A turn is waited for until the connection ends: now.
            out.stop();
        }
        let news = topic("news");
        let since = Some(Since::claimed(0, None));
        let failed = session
            .subscribe(Origin::Command(1), news.clone(), since)
            .await
            .expect_err("the step fails");
        let step = match failed {
            SubscribeError::NoTurn(_) => Fault::Turn,
            SubscribeError::Watch(_) => Fault::Watch,
            SubscribeError::Recover(_) => Fault::Recover,
            SubscribeError::Save(_) => Fault::Save,
            SubscribeError::TakenOver => Fault::TakenOver,
        };
        assert_eq!(step, fault, "the error names the step");
        assert_eq!(node.hub.subscribers(&news), 0, "{fault:?}: the hub let go");
        assert!(!session.subscriptions.contains(&news), "{fault:?}");
        broker.released().await;
        let told = failed.to_command(Origin::Command(1), &news);
        assert_eq!((told.id, told.code), (Some(1), ErrorCode::Unavailable));
        assert_eq!(told.topic.as_deref(), Some("news"));
        assert_eq!(out.is_closing(), fault == Fault::TakenOver, "{fault:?}");
    }
}

#[tokio::test]
async fn a_replay_that_fails_keeps_its_subscription_joined_until_the_session_ends() {
    let mut config = Config::load(None, std::iter::empty()).unwrap();
    config.replay.page_messages = 1;
    let (node, broker) = pod_with(config, Fault::History);
    let news = topic("news");
    let mut epoch = None;
    for data in ["1", "2", "3"] {
        let at = node.broker.publish(&news, Bytes::from(data), None, None);
        epoch = Some(at.await.unwrap().epoch.to_string());
    }
    let (mut session, out) = connect(&node);
    let since = Some(Since::claimed(0, epoch));
    session
        .subscribe(Origin::Command(1), news.clone(), since)
        .await
        .expect("answered before the replay");
    // The first page went out, the second could not be read: the client
    // is to come back, and resume from its acks.
    assert!(out.is_closing());
    assert!(session.subscriptions.contains(&news));
    assert_eq!(node.hub.subscribers(&news), 1, "kept until the end");
    let sent = sent(&out);
    assert_eq!(sent[0]["op"], "ok");
    assert_eq!(
        (&sent[1]["op"], &sent[1]["seq"]),
        (&"msg".into(), &1.into())
    );
    assert_eq!(sent.len(), 2);
    session.end().await;
    assert_eq!(node.hub.subscribers(&news), 0);
    broker.released().await;
}

#[tokio::test]
async fn a_resumed_subscription_is_restored_without_an_ok_and_a_clients_own_sub_gets_one() {
    let (node, _) = pod_with(Config::load(None, std::iter::empty()).unwrap(), Fault::None);
    let news = topic("news");
    let at = node.broker.publish(&news, Bytes::from("1"), None, None);
    let epoch = at.await.unwrap().epoch;
    // Stored at an epoch the topic has since left: continuity is lost.
    let stored = SessionSnapshot {
        user: None,
        subscriptions: vec![SubscriptionState {
            topic: news.clone(),
            epoch: Epoch::from("gone"),
            acked: 5,
            told: false,
            server: false,
            delta: false,
        }],
    };
    let window = node.config.session.resume_window;
    let saved = node.sessions.save("s1", "before", stored, window).await;
    assert!(matches!(saved, Ok(true)), "{saved:?}");
    let (mut session, out) = connect(&node);
    session.hello(None, Some("s1"), None).await;
    let chat = topic("chat");
    session
        .subscribe(Origin::Command(7), chat.clone(), None)
        .await
        .unwrap();

    let sent = sent(&out);
    let ops: Vec<&str> = sent.iter().filter_map(|m| m["op"].as_str()).collect();
    assert_eq!(ops, ["welcome", "reset", "ok"], "{sent:?}");
    assert_eq!(sent[0]["resumed"], true);
    // The restored one is told where its stream goes on, and marked told
    // until the client acks in that epoch; the client's own is answered.
    assert_eq!(sent[1]["topic"], "news");
    assert_eq!(sent[1]["epoch"], &*epoch);
    assert!(session.subscriptions.is_told(&news));
    assert_eq!(
        (&sent[2]["id"], &sent[2]["topic"]),
        (&7.into(), &"chat".into())
    );
    assert!(!session.subscriptions.is_told(&chat));
    assert_eq!(node.hub.subscribers(&news), 1);
    assert_eq!(node.hub.subscribers(&chat), 1);
}

#[test]
fn a_denied_client_hears_why_and_only_an_expired_token_is_told_to_fetch_another() {
    use crate::auth::Refused;
    use crate::disconnect::CloseReason;
    let cases = [
        (Denied::Missing, "a token is required", "missing"),
        (
            Denied::OtherUser,
            "a refresh must be for the connection's own user",
            "other_user",
        ),
        (Refused::Expired.into(), "token has expired", "expired"),
        (
            Refused::Signature.into(),
            "token signature does not verify",
            "signature",
        ),
    ];
    for (denied, message, reason) in cases {
        assert_eq!(
            (denied.to_string().as_str(), denied.reason()),
            (message, reason)
        );
        let expected = match denied {
            Denied::Refused(Refused::Expired) => {
                (ErrorCode::TokenExpired, CloseReason::TokenExpired)
            }
            _ => (ErrorCode::Unauthorized, CloseReason::Unauthorized),
        };
        assert_eq!(denied.answer(), expected, "{denied:?}");
    }
}

#[tokio::test]
async fn a_hello_without_a_token_where_one_is_required_is_told_and_closed() {
    use crate::auth::Verifier;
    use crate::disconnect::CloseReason;
    let mut config = Config::load(None, std::iter::empty()).unwrap();
    config.auth.hmac_secret = "a secret of at least thirty-two bytes".into();
    let verifier = Verifier::new(&config.auth).await.unwrap();
    let (mut node, _) = pod_with(config, Fault::None);
    Arc::get_mut(&mut node).unwrap().verifier = verifier;
    for (token, message) in [
        (None, "a token is required"),
        (Some("not a token"), "token is not a well-formed JWT"),
    ] {
        let (mut session, out) = connect(&node);
        session.hello(token, None, None).await;
        assert!(session.id.is_none(), "no session for {token:?}");
        assert_eq!(out.reason(), Some(CloseReason::Unauthorized));
        let sent = sent(&out);
        assert_eq!(sent.len(), 1);
        assert_eq!(
            (&sent[0]["op"], &sent[0]["code"]),
            (&"err".into(), &"unauthorized".into())
        );
        assert_eq!(sent[0]["message"], message);
    }
}

#[tokio::test]
async fn a_resume_that_redis_interrupts_keeps_a_reset_the_client_may_not_have_read() {
    let (node, _) = pod_with(
        Config::load(None, std::iter::empty()).unwrap(),
        Fault::Recover,
    );
    let news = topic("news");
    // Told of a reset to epoch `e` after 3, and no ack in `e` since.
    let stored = SessionSnapshot {
        user: None,
        subscriptions: vec![SubscriptionState {
            topic: news.clone(),
            epoch: Epoch::from("e"),
            acked: 3,
            told: true,
            server: false,
            delta: false,
        }],
    };
    let window = node.config.session.resume_window;
    let saved = node.sessions.save("s1", "before", stored, window).await;
    assert!(matches!(saved, Ok(true)), "{saved:?}");
    let (mut session, out) = connect(&node);
    session.hello(None, Some("s1"), None).await;
    // The client is to come back; the session it comes back to must send
    // that reset again.
    assert_eq!(
        out.reason(),
        Some(crate::disconnect::CloseReason::Unavailable)
    );
    let kept = session.subscriptions.snapshot().subscriptions;
    assert_eq!(kept.len(), 1);
    assert_eq!(
        (&*kept[0].epoch, kept[0].acked, kept[0].told),
        ("e", 3, true)
    );
    assert_eq!(node.hub.subscribers(&news), 0);
}

/// A session store whose batches (the flusher's) are held, their snapshots
/// taken, until the test lets each go on: through `batches`, which gets
/// the sender that does.
struct Held {
    store: RedisBroker,
    batches: mpsc::UnboundedSender<oneshot::Sender<()>>,
}

#[tonic::async_trait]
impl SessionStore for Held {
    async fn save(
        &self,
        id: &str,
        owner: &str,
        snapshot: SessionSnapshot,
        ttl: Duration,
    ) -> Result<bool, BrokerError> {
        self.store.save(id, owner, snapshot, ttl).await
    }

    async fn extend(&self, id: &str, owner: &str, ttl: Duration) -> Result<Stored, BrokerError> {
        self.store.extend(id, owner, ttl).await
    }

    async fn save_many(
        &self,
        batch: Vec<SessionSave>,
        ttl: Duration,
    ) -> Vec<Result<Stored, BrokerError>> {
        let (go, held) = oneshot::channel();
        if self.batches.send(go).is_ok() {
            let _ = held.await;
        }
        self.store.save_many(batch, ttl).await
    }

    async fn claim(&self, id: &str, owner: &str, user: Option<&str>) -> Result<Claim, BrokerError> {
        self.store.claim(id, owner, user).await
    }

    async fn adopt(
        &self,
        id: &str,
        owner: &str,
        user: Option<&str>,
        snapshot: &SessionSnapshot,
        ttl: Duration,
    ) -> Result<Claim, BrokerError> {
        self.store.adopt(id, owner, user, snapshot, ttl).await
    }

    async fn revoke(&self, user: &str, ttl: Duration) -> Result<(), BrokerError> {
        self.store.revoke(user, ttl).await
    }
}

/// The rollout test's clients that got nothing (issue #22's flaky
/// `rollout.rs`): a flush took a new session's snapshot before its `sub`,
/// and reached Redis after the `sub` had saved the session with the topic.
/// The store kept the session without it, the flush's answer made the
/// session look saved, and a resume elsewhere (a drain, a rebalance) then
/// restored it without the topic: `resumed: true`, and silence. Here a
/// flush is held between its snapshot and its write while the `sub` saves;
/// the store must end with the topic.
#[tokio::test]
async fn a_flush_under_way_does_not_write_an_older_snapshot_over_a_subs_save() {
    const WAIT: Duration = Duration::from_secs(10);
    let redis = testkit::Redis::start().await;
    let env = [
        ("HERALD_BROKER".to_owned(), "redis".to_owned()),
        ("HERALD_REDIS__URL".to_owned(), redis.url()),
    ];
    let config = Config::load(None, env).unwrap();
    let store = RedisBroker::start(
        config.redis.settings(),
        Arc::new(config.namespaces()),
        Arc::new(Nowhere),
        Arc::new(Metrics::new()),
    )
    .await
    .unwrap();
    let (batches, mut held) = mpsc::unbounded_channel();
    let flushed = Held {
        store: store.clone(),
        batches,
    };
    let window = Duration::from_secs(60);

    // As `hello` leaves a new session: registered, no topic yet.
    let registry = Arc::new(Registry::default());
    let (session, _out) = live(1, "alice");
    let (subscriptions, owner) = (session.subscriptions.clone(), session.owner.clone());
    registry
        .register(Arc::from("s1"), session, registry.arrival())
        .unwrap();
    // A flush takes it as it is, and is held before it writes.
    let flush = tokio::spawn({
        let registry = registry.clone();
        async move { registry.flush(&flushed, window).await }
    });
    let go = timeout(WAIT, held.recv()).await.unwrap().unwrap();

    // The `sub`: the topic, saved before its `ok`. Polled once, it has
    // taken its snapshot and queued its write, unless it waits its turn.
    let topic = Topic::parse("news").unwrap();
    subscriptions.insert(topic.clone(), Epoch::from("e"), 0, false, false);
    let mut save = Box::pin(subscriptions.save(&store, "s1", &owner, window));
    let answered = (&mut save).now_or_never();
    // The flush goes on; then the `sub`'s save, if it waited.
    go.send(()).unwrap();
    timeout(WAIT, flush).await.unwrap().unwrap();
    let kept = match answered {
        Some(kept) => kept,
        None => timeout(WAIT, save).await.unwrap(),
    };
    assert!(kept.unwrap(), "the sub's save was kept");

    // What a resume on another pod finds.
    let claimed = store.claim("s1", "elsewhere", Some("alice")).await.unwrap();
    let Claim::Taken(claimed) = claimed else {
        panic!("the session is stored: {claimed:?}");
    };
    let topics: Vec<_> = claimed
        .snapshot
        .subscriptions
        .iter()
        .map(|s| s.topic.clone())
        .collect();
    assert_eq!(topics, [topic], "the stored session has the topic");
}
