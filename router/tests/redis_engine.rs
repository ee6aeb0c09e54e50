//! The Redis engine against a real `redis-server`: seqs, history trimmed by
//! size and by age, recovery, idempotency, and ordered delivery to a pod.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use router::observe::Ignore;
use router::{
    Broker, BrokerError, Claim, Claimed, Deliver, Epoch, Forward, NamespaceSettings, Namespaces,
    Outgoing, Page, PageSize, Position, Publication, RedisBroker, RedisSettings, SessionSave,
    SessionSnapshot, SessionStore, SessionUser, Since, Stored, SubscriptionState, Topic, Whose,
};
use testkit::{Redis, WAIT, eventually};

/// What was delivered, with which `traceparent`, and whom to disconnect;
/// in order, every delivery and reset as `(epoch, seq, is a reset)`; and
/// the commands forwarded.
#[derive(Default)]
struct Collect(
    Mutex<Vec<(u64, Bytes)>>,
    Mutex<Vec<(u64, Option<String>)>>,
    Mutex<Vec<String>>,
    Mutex<Vec<(String, u64, bool)>>,
    Mutex<Vec<Forward>>,
);

impl Collect {
    fn record(&self, p: &Publication, traceparent: Option<String>) {
        self.0.lock().expect("lock").push((p.seq, p.data.clone()));
        self.1.lock().expect("lock").push((p.seq, traceparent));
        self.3
            .lock()
            .expect("lock")
            .push((p.epoch.to_string(), p.seq, false));
    }

    fn stream(&self) -> Vec<(String, u64, bool)> {
        self.3.lock().expect("lock").clone()
    }

    /// Waits, at most [`WAIT`], until `n` publications have been delivered.
    async fn wait_for(&self, n: usize) {
        eventually(WAIT, || async {
            let got = self.0.lock().expect("lock").len();
            if got >= n {
                Ok(())
            } else {
                Err(format!("{got} of {n} deliveries"))
            }
        })
        .await;
    }
}

impl Deliver for Collect {
    fn deliver(&self, p: &Publication, traceparent: Option<&str>) {
        self.record(p, traceparent.map(str::to_owned));
    }
    fn reset(&self, _: &Topic, position: &Position) {
        self.3
            .lock()
            .expect("lock")
            .push((position.epoch.to_string(), position.seq, true));
    }
    fn disconnect(&self, user: &str) {
        self.2.lock().expect("lock").push(user.to_owned());
    }
    fn forward(&self, forward: &Forward) {
        self.4.lock().expect("lock").push(forward.clone());
    }
}

async fn engine(
    redis: &Redis,
    history_size: usize,
    history_ttl: Duration,
) -> (RedisBroker, Arc<Collect>) {
    let namespaces = Namespaces::new(&BTreeMap::from([(
        "default".to_owned(),
        NamespaceSettings {
            history_size,
            history_ttl,
            ..NamespaceSettings::default()
        },
    )]))
    .expect("namespaces");
    let sink = Arc::new(Collect::default());
    let settings = RedisSettings {
        url: redis.url(),
        password: None,
        tls: Default::default(),
        sentinel: None,
        cluster: Vec::new(),
        command_timeout: Duration::from_secs(1),
        linger: Duration::from_millis(100),
        prefix: router::redis::DEFAULT_PREFIX.to_owned(),
        presence: router::PresenceSettings::default(),
    };
    let broker = RedisBroker::start(
        settings,
        Arc::new(namespaces),
        sink.clone(),
        Arc::new(Ignore),
    )
    .await
    .expect("connect");
    (broker, sink)
}

/// A pod watching `news` (kept alive by the caller), what it is delivered,
/// and another pod to publish from.
async fn watcher_and_publisher(redis: &Redis) -> (RedisBroker, Arc<Collect>, RedisBroker, Topic) {
    let (broker, sink) = engine(redis, 100, Duration::from_secs(60)).await;
    let (other, _) = engine(redis, 100, Duration::from_secs(60)).await;
    let topic = Topic::parse("news").expect("topic");
    broker.watch(&topic).await.expect("watch");
    (broker, sink, other, topic)
}

fn since(seq: u64, epoch: Option<&str>) -> Option<Since> {
    Some(Since::claimed(seq, epoch.map(str::to_owned)))
}

#[tokio::test]
async fn history_is_trimmed_to_its_size_and_recovery_says_so() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 5, Duration::from_secs(60)).await;
    let topic = Topic::parse("news").expect("topic");
    for i in 1..=8u64 {
        let position = broker
            .publish(&topic, Bytes::from(i.to_string()), None, None)
            .await
            .expect("publish");
        assert_eq!(position.seq, i);
    }
    let r = broker
        .recover(&topic, since(5, None), PageSize::UNBOUNDED)
        .await
        .expect("recover");
    assert!(r.recovered);
    assert_eq!(
        r.publications.iter().map(|p| p.seq).collect::<Vec<_>>(),
        vec![6, 7, 8]
    );
    let epoch = r.position.epoch.to_string();
    // 4..=8 are kept: since 3 is the oldest that can be served.
    assert!(
        broker
            .recover(&topic, since(3, Some(&epoch)), PageSize::UNBOUNDED)
            .await
            .expect("recover")
            .recovered
    );
    assert!(
        !broker
            .recover(&topic, since(2, None), PageSize::UNBOUNDED)
            .await
            .expect("recover")
            .recovered
    );
    assert!(
        !broker
            .recover(&topic, since(7, Some("elsewhere")), PageSize::UNBOUNDED)
            .await
            .expect("recover")
            .recovered
    );
    assert!(
        !broker
            .recover(&topic, since(9, None), PageSize::UNBOUNDED)
            .await
            .expect("recover")
            .recovered
    );
    assert_eq!(redis.cli(&["XLEN", "herald:{news}:hist"]).trim(), "5");
}

/// The seqs of a page, `None` for [`Page::Lost`], and the topic's seq.
fn page_seqs(page: Page) -> Option<(Vec<u64>, u64)> {
    match page {
        Page::Read { publications, seq } => {
            Some((publications.iter().map(|p| p.seq).collect(), seq))
        }
        Page::Lost => None,
    }
}

#[tokio::test]
async fn a_replay_reads_history_a_page_at_a_time_and_a_page_trimmed_away_is_lost() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 20, Duration::from_secs(60)).await;
    let topic = Topic::parse("news").expect("topic");
    let publish = |n: u64| {
        let broker = broker.clone();
        let topic = topic.clone();
        async move {
            for _ in 0..n {
                let data = Bytes::from(format!("\"{}\"", "x".repeat(998)));
                broker
                    .publish(&topic, data, None, None)
                    .await
                    .expect("publish");
            }
        }
    };
    publish(12).await;
    // Bounded by bytes: the third message reaches 2500.
    let size = PageSize {
        messages: 5,
        bytes: 2500,
    };
    let r = broker
        .recover(&topic, since(0, None), size)
        .await
        .expect("recover");
    assert!(r.recovered);
    assert_eq!(r.position.seq, 12);
    assert_eq!(
        r.publications.iter().map(|p| p.seq).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    let epoch = r.position.epoch.clone();
    let read = |after: u64, size: PageSize| {
        let (broker, topic, epoch) = (broker.clone(), topic.clone(), epoch.clone());
        async move {
            page_seqs(
                broker
                    .history(&topic, &epoch, after, size)
                    .await
                    .expect("history"),
            )
        }
    };
    assert_eq!(read(3, size).await, Some((vec![4, 5, 6], 12)));
    assert_eq!(read(12, size).await, Some((vec![], 12)), "caught up");
    // Twenty more: history holds 13..=32, and 7 is gone.
    publish(20).await;
    assert_eq!(read(6, size).await, None, "trimmed while paging");
    let by_count = PageSize {
        messages: 2,
        bytes: usize::MAX,
    };
    assert_eq!(read(12, by_count).await, Some((vec![13, 14], 32)));
    let other = Epoch::from("not-this-one");
    assert!(matches!(
        broker.history(&topic, &other, 12, size).await,
        Ok(Page::Lost)
    ));
    // The topic's keys lost: a new epoch, whose seqs are not the old ones.
    redis.cli(&["DEL", "herald:{news}:meta"]);
    publish(14).await;
    assert_eq!(read(12, size).await, None, "another epoch now");
}

#[tokio::test]
async fn history_older_than_its_age_is_not_replayed_and_is_trimmed() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 100, Duration::from_millis(300)).await;
    let topic = Topic::parse("news").expect("topic");
    for _ in 0..3 {
        broker
            .publish(&topic, Bytes::from_static(b"1"), None, None)
            .await
            .expect("publish");
    }
    // The history's age is a matter of time passing.
    tokio::time::sleep(Duration::from_millis(400)).await;
    broker
        .publish(&topic, Bytes::from_static(b"1"), None, None)
        .await
        .expect("publish");
    assert!(
        !broker
            .recover(&topic, since(0, None), PageSize::UNBOUNDED)
            .await
            .expect("recover")
            .recovered
    );
    let r = broker
        .recover(&topic, since(3, None), PageSize::UNBOUNDED)
        .await
        .expect("recover");
    assert!(r.recovered);
    assert_eq!(r.publications.len(), 1);
    assert_eq!(
        redis.cli(&["XLEN", "herald:{news}:hist"]).trim(),
        "1",
        "old entries were removed"
    );
}

#[tokio::test]
async fn a_batch_gives_seqs_in_its_order_and_each_item_succeeds_or_fails_alone() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 100, Duration::from_secs(60)).await;
    let item = |topic: &str, data: &'static str, key: Option<&str>| Outgoing {
        topic: Topic::parse(topic).expect("topic"),
        data: Bytes::from_static(data.as_bytes()),
        idempotency_key: key.map(str::to_owned),
        traceparent: None,
        span: tracing::Span::none(),
    };
    let seqs = |answers: Vec<Result<Position, BrokerError>>| {
        answers
            .into_iter()
            .map(|a| a.map(|p| p.seq).map_err(|e| router::Causes(&e).to_string()))
            .collect::<Vec<_>>()
    };
    let first = broker
        .publish_many(vec![
            item("a", "1", None),
            item("b", "1", None),
            item("a", "2", None),
            item("b", "2", Some("k")),
            item("nowhere:x", "1", None),
            item("a", "3", None),
        ])
        .await;
    let first = seqs(first);
    assert_eq!(first[..4], [Ok(1), Ok(1), Ok(2), Ok(2)]);
    assert!(
        first[4].as_ref().is_err_and(|e| e.contains("nowhere")),
        "{first:?}"
    );
    assert_eq!(first[5], Ok(3));
    // The retry of the keyed item publishes nothing; the rest go on.
    let again = seqs(
        broker
            .publish_many(vec![item("b", "2", Some("k")), item("b", "3", None)])
            .await,
    );
    assert_eq!(again, [Ok(2), Ok(3)]);
    // An item Redis fails (its key holds something else) fails alone, in
    // the middle of a script call that publishes the others.
    redis.cli(&["SET", "herald:{broken}:meta", "x"]);
    let mixed = seqs(
        broker
            .publish_many(vec![
                item("a", "4", None),
                item("broken", "1", None),
                item("a", "5", None),
            ])
            .await,
    );
    assert_eq!((&mixed[0], &mixed[2]), (&Ok(4), &Ok(5)));
    assert!(
        mixed[1].as_ref().is_err_and(|e| e.contains("WRONGTYPE")),
        "{mixed:?}"
    );
    let history = broker
        .recover(
            &Topic::parse("a").expect("topic"),
            since(0, None),
            PageSize::UNBOUNDED,
        )
        .await
        .expect("recover");
    let data: Vec<&[u8]> = history.publications.iter().map(|p| &p.data[..]).collect();
    assert_eq!(data, [b"1", b"2", b"3", b"4", b"5"]);
}

/// `PUBLISH` commands Redis ran so far (scripts' included).
fn publishes(redis: &Redis) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_publish:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().expect("a count"))
}

#[tokio::test]
async fn several_publishes_of_a_topic_at_once_are_one_announcement() {
    let redis = Redis::start().await;
    let (_watcher, sink, other, topic) = watcher_and_publisher(&redis).await;
    let before = publishes(&redis);
    let items = (1..=10)
        .map(|n: u64| Outgoing {
            topic: topic.clone(),
            data: Bytes::from(n.to_string()),
            idempotency_key: None,
            traceparent: None,
            span: tracing::Span::none(),
        })
        .collect();
    for (n, published) in (1..).zip(other.publish_many(items).await) {
        assert_eq!(published.expect("published").seq, n);
    }
    sink.wait_for(10).await;
    let delivered = sink.0.lock().expect("lock").clone();
    let expected: Vec<(u64, Bytes)> = (1..=10).map(|n| (n, Bytes::from(n.to_string()))).collect();
    assert_eq!(delivered, expected);
    assert_eq!(
        publishes(&redis) - before,
        1,
        "one announcement for the ten"
    );
}

#[tokio::test]
async fn a_busy_topic_drops_history_past_its_age_every_few_publishes() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 100, Duration::from_millis(500)).await;
    let topic = Topic::parse("busy").expect("topic");
    let publish = |n| {
        let broker = broker.clone();
        let topic = topic.clone();
        async move {
            for _ in 0..n {
                broker
                    .publish(&topic, Bytes::from_static(b"1"), None, None)
                    .await
                    .expect("publish");
            }
        }
    };
    let xlen = || redis.cli(&["XLEN", "herald:{busy}:hist"]).trim().to_owned();
    // 1..=10, then 11..=20 while they are young (each publish keeps the
    // history key alive), then 21..=32 once 1..=10 are past the age.
    publish(10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish(10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    publish(11).await;
    assert_eq!(
        xlen(),
        "31",
        "nothing trimmed before the 16th publish after"
    );
    publish(1).await;
    assert_eq!(xlen(), "22", "seq 32 dropped the ten past the age");
}

#[tokio::test]
async fn a_watching_pod_gets_every_publication_in_order_and_a_retry_once() {
    let redis = Redis::start().await;
    let (broker, sink, other, topic) = watcher_and_publisher(&redis).await;
    let first = other
        .publish(&topic, Bytes::from_static(b"\"a\""), Some("k"), None)
        .await
        .expect("publish");
    let again = broker
        .publish(&topic, Bytes::from_static(b"\"a\""), Some("k"), None)
        .await
        .expect("publish");
    assert_eq!(first, again);
    for i in 0..50u64 {
        other
            .publish(&topic, Bytes::from(i.to_string()), None, None)
            .await
            .expect("publish");
    }
    sink.wait_for(51).await;
    let seqs: Vec<u64> = sink
        .0
        .lock()
        .expect("lock")
        .iter()
        .map(|(seq, _)| *seq)
        .collect();
    assert_eq!(seqs, (1..=51).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_traced_publish_carries_its_traceparent_to_the_watching_pod() {
    const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let redis = Redis::start().await;
    let (_watcher, sink, other, topic) = watcher_and_publisher(&redis).await;
    let data = Bytes::from_static(br#"{"a":"b:c;d"}"#);
    other
        .publish(&topic, data.clone(), None, Some(TRACEPARENT))
        .await
        .expect("traced publish");
    other
        .publish(&topic, data.clone(), None, None)
        .await
        .expect("publish");
    // Not a traceparent (a `:` would break the announcement): not carried.
    other
        .publish(&topic, data.clone(), None, Some("00:x"))
        .await
        .expect("publish with a bad traceparent");
    sink.wait_for(3).await;
    assert_eq!(
        *sink.1.lock().expect("lock"),
        vec![(1, Some(TRACEPARENT.to_owned())), (2, None), (3, None)]
    );
    assert!(
        sink.0.lock().expect("lock").iter().all(|(_, d)| *d == data),
        "the data arrives intact, traced or not"
    );
}

fn snapshot(topic: &str, position: u64) -> SessionSnapshot {
    SessionSnapshot {
        user: None,
        subscriptions: vec![SubscriptionState {
            topic: Topic::parse(topic).expect("topic"),
            epoch: Arc::from("e1"),
            acked: position,
            told: false,
            server: false,
            delta: false,
        }],
    }
}

/// Whether `store` saves session `id` for `owner`, at `news` seq `position`.
async fn saves(store: &RedisBroker, id: &str, owner: &str, position: u64) -> bool {
    let ttl = Duration::from_secs(60);
    store
        .save(id, owner, snapshot("news", position), ttl)
        .await
        .expect("save")
}

/// What `claim` took: its snapshot and previous owner, and the owner the
/// claimant saves with, which must be `token` ranked (`@<rank>`).
fn taken(claim: Claim, token: &str) -> (SessionSnapshot, Option<String>, Arc<str>) {
    let Claim::Taken(Claimed {
        snapshot,
        from,
        owner,
    }) = claim
    else {
        panic!("not taken: {claim:?}");
    };
    assert!(owner.starts_with(&format!("{token}@")), "{owner}");
    (snapshot, from, owner)
}

/// The rank of an owner token, `<token>@<rank>`.
fn rank(owner: &str) -> u64 {
    owner
        .rsplit_once('@')
        .map_or(0, |(_, r)| r.parse().expect("rank"))
}

#[tokio::test]
async fn a_session_claimed_by_a_resume_refuses_saves_from_its_former_owner() {
    let redis = Redis::start().await;
    let (pod_a, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    let (pod_b, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    assert!(saves(&pod_a, "s1", "conn-a", 2).await);
    // The client resumes on pod b while its connection to pod a lives on.
    let claimed = pod_b.claim("s1", "conn-b", None).await.expect("claim");
    let (taken_snapshot, from, conn_b) = taken(claimed, "conn-b");
    assert_eq!(taken_snapshot, snapshot("news", 2));
    assert_eq!(from.as_deref(), Some("conn-a"));
    assert!(saves(&pod_b, "s1", &conn_b, 9).await);
    // Pod a's connection ends at last: its older acks are not written.
    assert!(!saves(&pod_a, "s1", "conn-a", 2).await);
    let claimed = pod_a.claim("s1", "conn-c", None).await.expect("claim");
    assert!(matches!(claimed, Claim::Taken(c) if c.snapshot == snapshot("news", 9)));
    // The claim keeps the session's expiry.
    let ttl_ms: i64 = redis
        .cli(&["PTTL", "herald:session:s1"])
        .trim()
        .parse()
        .expect("pttl");
    assert!(ttl_ms > 0, "expiry kept: {ttl_ms}");
}

#[tokio::test]
async fn a_session_taken_over_before_it_was_ever_saved_is_adopted_by_the_new_connection() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    let ttl = Duration::from_secs(60);
    // The store has no copy: the pod's copy is kept, owned by the new
    // connection, and the connection taken over cannot save over it.
    let live = snapshot("news", 2);
    let adopted = broker
        .adopt("s1", "conn-b", None, &live, ttl)
        .await
        .expect("adopt");
    let (taken_snapshot, from, conn_b) = taken(adopted, "conn-b");
    assert_eq!((taken_snapshot, from), (live, None));
    assert!(!saves(&broker, "s1", "conn-a", 1).await);
    assert!(saves(&broker, "s1", &conn_b, 3).await);
    // With a copy, adopting is claiming it.
    let adopted = broker
        .adopt("s1", "conn-c", None, &snapshot("news", 0), ttl)
        .await
        .expect("adopt");
    let (taken_snapshot, from, conn_c) = taken(adopted, "conn-c");
    assert_eq!(taken_snapshot, snapshot("news", 3));
    assert_eq!(from.as_deref(), Some(&*conn_b));
    assert!(rank(&conn_c) > rank(&conn_b));
    // A revoked user's session is not kept.
    let mut alices = snapshot("news", 1);
    alices.user = Some(SessionUser {
        id: Arc::from("alice"),
        since_ms: router::session::unix_ms() - 1,
    });
    broker.revoke("alice", ttl).await.expect("revoke");
    let adopted = broker
        .adopt("s2", "conn-b", Some("alice"), &alices, ttl)
        .await
        .expect("adopt");
    assert_eq!(adopted, Claim::NotFound);
    assert_eq!(redis.cli(&["EXISTS", "herald:session:s2"]).trim(), "0");
}

#[tokio::test]
async fn only_its_owner_extends_a_session_and_a_lost_one_is_said_to_be_gone() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    let ttl = Duration::from_secs(60);
    assert!(saves(&broker, "s1", "conn-a", 2).await);
    redis.cli(&["PEXPIRE", "herald:session:s1", "1000"]);
    let batch = [("s1", "conn-b"), ("s1", "conn-a"), ("gone", "conn-a")]
        .map(|(id, owner)| SessionSave {
            id: Arc::from(id),
            owner: Arc::from(owner),
            snapshot: None,
        })
        .to_vec();
    let answers: Vec<_> = broker
        .save_many(batch, ttl)
        .await
        .into_iter()
        .map(|answer| answer.expect("extend"))
        .collect();
    assert_eq!(answers, [Stored::Refused, Stored::Kept, Stored::Gone]);
    let ttl_ms: i64 = redis
        .cli(&["PTTL", "herald:session:s1"])
        .trim()
        .parse()
        .expect("pttl");
    assert!(ttl_ms > 50_000, "extended: {ttl_ms}");
    let claimed = broker.claim("s1", "conn-c", None).await.expect("claim");
    assert!(matches!(claimed, Claim::Taken(c) if c.snapshot == snapshot("news", 2)));
}

#[tokio::test]
async fn sessions_saved_before_owners_and_after_a_script_flush_still_work() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    // As an earlier version stored it: no owner line.
    redis.cli(&["SET", "herald:session:old", "3 e1 news\n", "PX", "60000"]);
    redis.cli(&["SCRIPT", "FLUSH"]);
    let claimed = broker.claim("old", "conn-x", None).await.expect("claim");
    let (taken_snapshot, from, conn_x) = taken(claimed, "conn-x");
    assert_eq!((taken_snapshot, from), (snapshot("news", 3), None));
    assert!(saves(&broker, "old", &conn_x, 4).await);
    assert!(!saves(&broker, "old", "conn-y", 1).await);
    assert_eq!(
        broker
            .claim("missing", "conn-x", None)
            .await
            .expect("claim"),
        Claim::NotFound
    );
}

#[tokio::test]
async fn a_session_belongs_to_its_user_and_a_revoke_reaches_every_pod() {
    let redis = Redis::start().await;
    let (pod_a, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    let (pod_b, sink_b) = engine(&redis, 10, Duration::from_secs(60)).await;
    // Pod b listens on the control channel once its pub/sub is up: a watch
    // answers after its subscriptions are in place.
    pod_b
        .watch(&Topic::parse("news").expect("topic"))
        .await
        .expect("watch");
    let ttl = Duration::from_secs(60);
    let mut alices = snapshot("news", 4);
    alices.user = Some(SessionUser {
        id: Arc::from("alice w."),
        since_ms: router::session::unix_ms(),
    });
    assert!(
        pod_a
            .save("s1", "conn-a", alices.clone(), ttl)
            .await
            .expect("save")
    );
    assert!(
        pod_a
            .save("s2", "conn-a", snapshot("news", 1), ttl)
            .await
            .expect("save")
    );
    // Someone else's claim takes nothing: alice's connection still owns it.
    for thief in [Some("mallory"), None] {
        let claimed = pod_b.claim("s1", "conn-m", thief).await.expect("claim");
        assert_eq!(claimed, Claim::OtherUser);
    }
    assert!(
        pod_a
            .save("s1", "conn-a", alices.clone(), ttl)
            .await
            .expect("save")
    );
    let claimed = pod_b
        .claim("s1", "conn-b", Some("alice w."))
        .await
        .expect("claim");
    let (taken_snapshot, from, _) = taken(claimed, "conn-b");
    assert_eq!(taken_snapshot, alices);
    assert_eq!(from.as_deref(), Some("conn-a"));
    // A backend ends alice's access through pod a: pod b is told, and her
    // session is gone for good; anonymous sessions are not touched.
    pod_a.revoke("alice w.", ttl).await.expect("revoke");
    eventually(WAIT, || async {
        !sink_b.2.lock().expect("lock").is_empty()
    })
    .await;
    assert_eq!(*sink_b.2.lock().expect("lock"), ["alice w."]);
    let claimed = pod_b
        .claim("s1", "conn-c", Some("alice w."))
        .await
        .expect("claim");
    assert_eq!(claimed, Claim::NotFound);
    let claimed = pod_b.claim("s2", "conn-c", None).await.expect("claim");
    assert!(matches!(claimed, Claim::Taken(_)));
}

#[tokio::test]
async fn any_pod_reads_whose_a_stored_session_is_and_forwarded_commands_reach_every_pod() {
    let redis = Redis::start().await;
    let (pod_a, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    let (pod_b, sink_b) = engine(&redis, 10, Duration::from_secs(60)).await;
    // Pod b listens on the control channel once a watch has answered.
    pod_b
        .watch(&Topic::parse("news").expect("topic"))
        .await
        .expect("watch");
    let ttl = Duration::from_secs(60);
    let mut alices = snapshot("news", 4);
    alices.user = Some(SessionUser {
        id: Arc::from("alice w."),
        since_ms: router::session::unix_ms(),
    });
    assert!(pod_a.save("s1", "conn-a", alices, ttl).await.expect("save"));
    let anonymous = snapshot("news", 1);
    assert!(
        pod_a
            .save("s2", "conn-a", anonymous, ttl)
            .await
            .expect("save")
    );
    let whose = |id: &'static str| {
        let pod_b = &pod_b;
        async move { pod_b.whose(id).await.expect("whose") }
    };
    assert_eq!(whose("s1").await, Whose::User(Arc::from("alice w.")));
    assert!(whose("s1").await.belongs(Some("alice w.")));
    assert!(!whose("s1").await.belongs(None));
    assert_eq!(whose("s2").await, Whose::Anonymous);
    assert_eq!(whose("missing").await, Whose::Nobody);
    // Read, not claimed: its owner saves on.
    assert!(
        pod_a
            .save("s2", "conn-a", snapshot("news", 2), ttl)
            .await
            .expect("save")
    );
    // A revoked session is nobody's, as a claim would find it.
    pod_a.revoke("alice w.", ttl).await.expect("revoke");
    assert_eq!(whose("s1").await, Whose::Nobody);

    let posted = Forward {
        session: "9f3c".to_owned(),
        user: Some("alice w.".to_owned()),
        commands: vec![
            Bytes::from_static(br#"{"op":"sub","id":1,"topic":"a"}"#),
            Bytes::from_static(br#"{"op":"pub","id":2,"topic":"a","data":"x y"}"#),
        ],
    };
    pod_a.forward(posted.clone()).await.expect("forward");
    eventually(WAIT, || async {
        !sink_b.4.lock().expect("lock").is_empty()
    })
    .await;
    assert_eq!(*sink_b.4.lock().expect("lock"), [posted]);
}

#[tokio::test]
async fn subscribing_to_a_topic_nobody_published_to_leaves_nothing_long_lived() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 10, Duration::from_secs(30)).await;
    let topic = Topic::parse("quiet").expect("topic");
    broker.watch(&topic).await.expect("watch");
    broker
        .recover(&topic, None, PageSize::UNBOUNDED)
        .await
        .expect("recover");
    let ttl_ms: i64 = redis
        .cli(&["PTTL", "herald:{quiet}:meta"])
        .trim()
        .parse()
        .expect("pttl");
    assert!(
        (1..=30_000).contains(&ttl_ms),
        "a topic's bookkeeping lives no longer than its history would: {ttl_ms} ms"
    );
}

/// Publishes `data` (retrying while the engine reconnects after a Redis
/// restart) and returns its position.
async fn publish_retrying(broker: &RedisBroker, topic: &Topic, data: &str) -> Position {
    eventually(WAIT, || async {
        broker
            .publish(topic, Bytes::from(data.to_owned()), None, None)
            .await
    })
    .await
}

#[tokio::test]
async fn redis_restarted_from_an_older_dump_moves_topics_to_a_new_epoch_and_resets_watchers() {
    let mut redis = Redis::start().await;
    let (watcher, sink, publisher, topic) = watcher_and_publisher(&redis).await;
    for i in 1..=3 {
        publisher
            .publish(&topic, Bytes::from(i.to_string()), None, None)
            .await
            .expect("publish");
    }
    redis.save();
    let mut before = None;
    for i in 4..=6 {
        before = Some(
            publisher
                .publish(&topic, Bytes::from(i.to_string()), None, None)
                .await
                .expect("publish"),
        );
    }
    let before = before.expect("published");
    sink.wait_for(6).await;
    // Back to seq 3: seqs 4 to 6 would be issued again in the same epoch.
    redis.restart_from_save().await;
    let after = publish_retrying(&publisher, &topic, "new 4").await;
    assert_ne!(
        after.epoch, before.epoch,
        "a new epoch after going back in time"
    );
    assert_eq!(after.seq, 4, "seqs go on from what Redis kept");
    // The watcher is told (a reset into the new epoch, at 3, or at 4 if
    // its reconnect came after the publish), then goes on from there.
    eventually(WAIT, || async {
        let stream = sink.stream();
        let tail = &stream[6..];
        let told = match tail.first() {
            Some((epoch, at, true)) if *epoch == *after.epoch => *at,
            _ => return Err(format!("no reset first after the first six: {tail:?}")),
        };
        let rest: Vec<_> = (told + 1..=4)
            .map(|seq| (after.epoch.to_string(), seq, false))
            .collect();
        if tail[1..] == rest[..] {
            Ok(())
        } else {
            Err(format!("the watcher saw {tail:?} after the first six"))
        }
    })
    .await;
    // A client that saw seq 6 of the old epoch is told it cannot recover.
    let r = watcher
        .recover(&topic, since(6, Some(&before.epoch)), PageSize::UNBOUNDED)
        .await
        .expect("recover");
    assert!(!r.recovered);
    assert_eq!(r.position, after);
}

#[tokio::test]
async fn a_since_the_pod_vouches_for_above_the_topic_starts_a_new_epoch_and_a_clients_does_not() {
    let redis = Redis::start().await;
    let (broker, _) = engine(&redis, 100, Duration::from_secs(60)).await;
    let topic = Topic::parse("news").expect("topic");
    let mut position = None;
    for i in 1..=3 {
        position = Some(
            broker
                .publish(&topic, Bytes::from(i.to_string()), None, None)
                .await
                .expect("publish"),
        );
    }
    let position = position.expect("published");
    // A client may claim anything: not recovered, and nothing changes.
    let r = broker
        .recover(&topic, since(9, Some(&position.epoch)), PageSize::UNBOUNDED)
        .await
        .expect("recover");
    assert!(!r.recovered);
    assert_eq!(r.position, position);
    // A stored session's ack (checked against what was sent when it was
    // made) above the topic's seq: the topic went back in time.
    let vouched = Since {
        seq: 9,
        epoch: Some(position.epoch.to_string()),
        vouched: true,
    };
    let r = broker
        .recover(&topic, Some(vouched.clone()), PageSize::UNBOUNDED)
        .await
        .expect("recover");
    assert!(!r.recovered);
    assert_ne!(r.position.epoch, position.epoch);
    assert_eq!(r.position.seq, 3);
    let next = broker
        .publish(&topic, Bytes::from_static(b"4"), None, None)
        .await
        .expect("publish");
    assert_eq!(
        (next.epoch.clone(), next.seq),
        (r.position.epoch.clone(), 4)
    );
    // Once: the same claim again changes nothing more.
    let again = broker
        .recover(&topic, Some(vouched), PageSize::UNBOUNDED)
        .await
        .expect("recover");
    assert_eq!(again.position, next);
}

/// The stored session's owner line.
fn stored_owner(redis: &Redis, id: &str) -> String {
    let value = redis.cli(&["GET", &format!("herald:session:{id}")]);
    value.lines().next().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn a_connection_whose_claim_redis_forgot_by_going_back_in_time_still_saves() {
    let mut redis = Redis::start().await;
    let (pod_a, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    let ttl = Duration::from_secs(60);
    assert!(saves(&pod_a, "s1", "conn-a", 2).await);
    redis.save();
    let Claim::Taken(claimed) = pod_a.claim("s1", "conn-b", None).await.expect("claim") else {
        panic!("not claimed");
    };
    assert!(saves(&pod_a, "s1", &claimed.owner, 5).await);
    // Redis comes back from the dump: conn-a owns the session there, and
    // conn-b's claim never happened. conn-b, which serves the session, wins.
    redis.restart_from_save().await;
    assert_eq!(stored_owner(&redis, "s1"), "owner conn-a");
    // The first call after the restart may find the old connection broken.
    let saved = eventually(WAIT, || async {
        pod_a
            .save("s1", &claimed.owner, snapshot("news", 6), ttl)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    assert!(saved, "conn-b's save wins");
    assert!(!saves(&pod_a, "s1", "conn-a", 2).await, "conn-a is older");
    // An extend of a session Redis lost the claim of asks for it whole.
    redis.restart_from_save().await;
    let extend = |owner: &str| SessionSave {
        id: Arc::from("s1"),
        owner: Arc::from(owner),
        snapshot: None,
    };
    let answers = eventually(WAIT, || async {
        let answers = pod_a
            .save_many(vec![extend("conn-a"), extend(&claimed.owner)], ttl)
            .await;
        answers
            .into_iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())
    })
    .await;
    assert_eq!(answers, [Stored::Kept, Stored::Gone]);
    assert!(saves(&pod_a, "s1", &claimed.owner, 7).await);
    let Claim::Taken(next) = pod_a.claim("s1", "conn-c", None).await.expect("claim") else {
        panic!("not claimed");
    };
    assert_eq!(next.snapshot, snapshot("news", 7));
    assert!(
        rank(&next.owner) > rank(&claimed.owner),
        "{} above {}",
        next.owner,
        claimed.owner
    );
}

#[tokio::test]
async fn a_claim_that_reaches_redis_after_its_pod_gave_up_takes_nothing() {
    let redis = Redis::start().await;
    let (pod_a, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    assert!(saves(&pod_a, "s1", "conn-a", 2).await);
    // The claim script is loaded, so that the late claim is one call.
    let missing = pod_a.claim("none", "conn-x", None).await.expect("claim");
    assert_eq!(missing, Claim::NotFound);
    let calls = || {
        let stats = redis.cli(&["INFO", "commandstats"]);
        stats
            .lines()
            .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = calls();
    // Redis freezes with a claim on its way: the pod gives up on it (its
    // client would resume elsewhere meanwhile).
    redis.freeze();
    let late = pod_a.claim("s1", "conn-late", None).await;
    assert!(late.is_err(), "timed out: {late:?}");
    redis.thaw();
    eventually(WAIT, || async {
        let now = calls();
        if now > before {
            Ok(())
        } else {
            Err(format!("{now} evalsha calls, the late claim not run yet"))
        }
    })
    .await;
    assert_eq!(
        stored_owner(&redis, "s1"),
        "owner conn-a",
        "the late claim took nothing"
    );
    let Claim::Taken(claimed) = pod_a.claim("s1", "conn-b", None).await.expect("claim") else {
        panic!("not claimed");
    };
    assert_eq!(claimed.from.as_deref(), Some("conn-a"));
}

#[tokio::test]
async fn a_resume_after_redis_went_back_in_time_outranks_the_connection_whose_claim_it_lost() {
    let mut redis = Redis::start().await;
    let (pod_a, _) = engine(&redis, 10, Duration::from_secs(60)).await;
    assert!(saves(&pod_a, "s1", "conn-a", 2).await);
    redis.save();
    let (_, _, conn_b) = taken(
        pod_a.claim("s1", "conn-b", None).await.expect("claim"),
        "conn-b",
    );
    redis.restart_from_save().await;
    // The client, its connection to conn-b cut, resumes: conn-c's claim
    // must outrank conn-b's, which Redis no longer has.
    let claimed = eventually(WAIT, || async {
        pod_a
            .claim("s1", "conn-c", None)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let (_, _, conn_c) = taken(claimed, "conn-c");
    assert!(rank(&conn_c) > rank(&conn_b), "{conn_c} above {conn_b}");
    // conn-b's end, saved late, does not overwrite the resumed session.
    assert!(!saves(&pod_a, "s1", &conn_b, 9).await);
    assert!(saves(&pod_a, "s1", &conn_c, 3).await);
}
