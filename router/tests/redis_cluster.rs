//! The Redis engine on a real Redis Cluster (six `redis-server`s: three
//! masters, three replicas): topics spread over every master's slots, pods
//! watching them over sharded pub/sub, and the cluster changing under them:
//! a master killed while publishing, a slot migrated while subscribed.
//! Presence on rooms over every master, and a dead pod's members removed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is the failure report

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use router::observe::Ignore;
use router::{
    Broker, Deliver, Member, NamespaceSettings, Namespaces, Outgoing, Page, PageSize, Position,
    PresenceChange, PresenceSettings, PresenceUpdate, Publication, RedisBroker, RedisSettings,
    Since, Topic,
};
use testkit::{RedisCluster, WAIT, eventually};

/// Per topic, in order: `(epoch, seq, data)` delivered, or a reset to
/// `(epoch, seq)`.
#[derive(Default)]
struct Streams(
    Mutex<BTreeMap<String, Vec<Event>>>,
    Mutex<Vec<(String, PresenceChange)>>,
);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    Delivered(String, u64, Bytes),
    Reset(String, u64),
}

impl Deliver for Streams {
    fn deliver(&self, p: &Publication, _: Option<&str>) {
        let event = Event::Delivered(p.epoch.to_string(), p.seq, p.data.clone());
        self.0
            .lock()
            .expect("lock")
            .entry(p.topic.to_string())
            .or_default()
            .push(event);
    }
    fn reset(&self, topic: &Topic, position: &Position) {
        let event = Event::Reset(position.epoch.to_string(), position.seq);
        self.0
            .lock()
            .expect("lock")
            .entry(topic.to_string())
            .or_default()
            .push(event);
    }
    fn disconnect(&self, _: &str) {}
    fn presence(&self, topic: &Topic, change: &PresenceChange) {
        self.1
            .lock()
            .expect("lock")
            .push((topic.to_string(), change.clone()));
    }
}

impl Streams {
    fn deliveries(&self) -> usize {
        let streams = self.0.lock().expect("lock");
        streams
            .values()
            .flatten()
            .filter(|e| matches!(e, Event::Delivered(..)))
            .count()
    }

    fn of(&self, topic: &str) -> Vec<Event> {
        self.0
            .lock()
            .expect("lock")
            .get(topic)
            .cloned()
            .unwrap_or_default()
    }

    async fn wait_for(&self, n: usize) {
        eventually(WAIT, || async {
            let got = self.deliveries();
            if got >= n {
                Ok(())
            } else {
                Err(format!("{got} of {n} deliveries"))
            }
        })
        .await;
    }
}

/// The pods' liveness: short, so that a dead pod is found soon.
const PRESENCE_TTL: Duration = Duration::from_secs(1);

async fn pod(cluster: &RedisCluster) -> (RedisBroker, Arc<Streams>) {
    let namespaces = Namespaces::new(&BTreeMap::from([
        (
            "default".to_owned(),
            NamespaceSettings {
                history_size: 10_000,
                history_ttl: Duration::from_secs(600),
                ..NamespaceSettings::default()
            },
        ),
        (
            "room".to_owned(),
            NamespaceSettings {
                presence: true,
                join_leave: true,
                ..NamespaceSettings::default()
            },
        ),
    ]))
    .expect("namespaces");
    let sink = Arc::new(Streams::default());
    let settings = RedisSettings {
        url: "redis://127.0.0.1".into(),
        password: None,
        tls: Default::default(),
        sentinel: None,
        cluster: cluster.urls(),
        command_timeout: Duration::from_secs(1),
        linger: Duration::from_millis(100),
        prefix: router::redis::DEFAULT_PREFIX.to_owned(),
        presence: PresenceSettings {
            pod_ttl: PRESENCE_TTL,
            pod: "pod".to_owned(),
            ..PresenceSettings::default()
        },
    };
    let broker = RedisBroker::start(
        settings,
        Arc::new(namespaces),
        sink.clone(),
        Arc::new(Ignore),
    )
    .await
    .expect("start on the cluster");
    (broker, sink)
}

/// `n` topics whose keys are spread over every master.
fn topics(cluster: &RedisCluster, n: usize) -> Vec<Topic> {
    let topics: Vec<Topic> = (0..n)
        .map(|i| Topic::parse(&format!("t{i}")).expect("topic"))
        .collect();
    let masters: BTreeSet<u16> = topics
        .iter()
        .map(|t| cluster.master_of_slot(RedisCluster::slot_of(t.as_str())))
        .collect();
    assert_eq!(masters.len(), 3, "the topics cover every master");
    topics
}

fn item(topic: &Topic, data: String) -> Outgoing {
    Outgoing {
        topic: topic.clone(),
        data: Bytes::from(data),
        idempotency_key: None,
        traceparent: None,
        span: tracing::Span::none(),
    }
}

async fn watch_all(broker: &RedisBroker, topics: &[Topic]) {
    for topic in topics {
        broker.watch(topic).await.expect("watch");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_on_every_master_reach_the_pods_that_watch_them_in_order() {
    const EACH: u64 = 20;
    let cluster = RedisCluster::start().await;
    let topics = topics(&cluster, 30);
    let (a, a_got) = pod(&cluster).await;
    let (b, b_got) = pod(&cluster).await;
    // a watches all of them, b the first half: a publication reaches a pod
    // only through the shard its topic is on, and only if it watches it.
    watch_all(&a, &topics).await;
    watch_all(&b, &topics[..15]).await;
    for n in 1..=EACH {
        // Half single publishes from a, half one batch from b.
        if n % 2 == 1 {
            for topic in &topics {
                a.publish(topic, Bytes::from(n.to_string()), None, None)
                    .await
                    .expect("publish");
            }
        } else {
            let items = topics.iter().map(|t| item(t, n.to_string())).collect();
            for published in b.publish_many(items).await {
                assert_eq!(published.expect("publish").seq, n);
            }
        }
    }
    a_got.wait_for(topics.len() * EACH as usize).await;
    b_got.wait_for(15 * EACH as usize).await;
    for (i, topic) in topics.iter().enumerate() {
        let expected: Vec<(u64, Bytes)> = (1..=EACH)
            .map(|n| (n, Bytes::from(n.to_string())))
            .collect();
        for (got, watching) in [(&a_got, true), (&b_got, i < 15)] {
            let stream: Vec<(u64, Bytes)> = got
                .of(topic.as_str())
                .into_iter()
                .map(|e| match e {
                    Event::Delivered(_, seq, data) => (seq, data),
                    reset => panic!("{topic}: {reset:?}"),
                })
                .collect();
            if watching {
                assert_eq!(stream, expected, "{topic}");
            } else {
                assert!(stream.is_empty(), "{topic} is not watched");
            }
        }
    }
    // Each topic's history is on its slot's master, and a recovery reads it.
    let recovered = a
        .recover(
            &topics[7],
            Some(Since::claimed(5, None)),
            PageSize::UNBOUNDED,
        )
        .await
        .expect("recover");
    assert!(recovered.recovered);
    assert_eq!(recovered.publications.len(), (EACH - 5) as usize);
    // And a replay's pages, read over the replay connections, two at a time
    // from each topic's own master, come back whole and in order.
    let two = PageSize {
        messages: 2,
        bytes: usize::MAX,
    };
    for topic in [&topics[0], &topics[7]] {
        let first = a
            .recover(topic, Some(Since::claimed(0, None)), two)
            .await
            .expect("recover");
        let epoch = first.position.epoch.clone();
        let mut seqs: Vec<u64> = first.publications.iter().map(|p| p.seq).collect();
        while seqs.last().copied().unwrap_or(0) < first.position.seq {
            let after = seqs.last().copied().unwrap_or(0);
            match a.history(topic, &epoch, after, two).await.expect("a page") {
                Page::Read { publications, .. } => {
                    assert!(!publications.is_empty() && publications.len() <= 2);
                    seqs.extend(publications.iter().map(|p| p.seq));
                }
                Page::Lost => panic!("{topic}: history lost after {after}"),
            }
        }
        assert_eq!(seqs, (1..=EACH).collect::<Vec<_>>(), "{topic}");
    }
    let master = cluster.master_of_slot(RedisCluster::slot_of("t7"));
    assert_eq!(
        cluster.cli(master, &["XLEN", "herald:{t7}:hist"]).trim(),
        EACH.to_string()
    );
}

/// Per topic, `(epoch, seq, data)` of each publish acknowledged.
type Acknowledged = BTreeMap<String, Vec<(String, u64, Bytes)>>;

/// Checks every topic's stream: within an epoch, seqs contiguous from the
/// reset (or the start) and never twice. Returns the resets.
fn check_streams(streams: &Streams, topics: &[Topic]) -> usize {
    let mut resets = 0;
    for topic in topics {
        let mut at: Option<(String, u64)> = None;
        for event in streams.of(topic.as_str()) {
            match event {
                Event::Reset(epoch, seq) => {
                    resets += 1;
                    at = Some((epoch, seq));
                }
                Event::Delivered(epoch, seq, _) => {
                    if let Some((e, s)) = &at
                        && *e == epoch
                    {
                        assert_eq!(seq, s + 1, "{topic}: {seq} after {s}");
                    }
                    at = Some((epoch, seq));
                }
            }
        }
    }
    resets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_while_publishing_loses_nothing_it_acknowledged_and_nothing_comes_twice() {
    let mut cluster = RedisCluster::start().await;
    let topics = topics(&cluster, 24);
    let (watcher, got) = pod(&cluster).await;
    let (publisher, _) = pod(&cluster).await;
    watch_all(&watcher, &topics).await;
    let victim = cluster.master_of_slot(RedisCluster::slot_of(topics[0].as_str()));

    // Publish round after round until the kill is over; keep what each
    // publish was acknowledged with.
    let acknowledged: Arc<Mutex<Acknowledged>> = Arc::default();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let publishing = {
        let (publisher, topics, acknowledged) =
            (publisher.clone(), topics.clone(), acknowledged.clone());
        tokio::spawn(async move {
            let mut failed = 0;
            for round in 0u64.. {
                if *stopped.borrow() {
                    break;
                }
                for topic in &topics {
                    let data = Bytes::from(format!("{round}"));
                    match publisher.publish(topic, data.clone(), None, None).await {
                        Ok(p) => acknowledged
                            .lock()
                            .expect("lock")
                            .entry(topic.to_string())
                            .or_default()
                            .push((p.epoch.to_string(), p.seq, data)),
                        Err(_) => failed += 1,
                    }
                }
            }
            failed
        })
    };
    let count = || {
        acknowledged
            .lock()
            .expect("lock")
            .values()
            .map(Vec::len)
            .sum::<usize>()
    };
    eventually(WAIT, || async {
        (count() >= 500).then_some(()).ok_or("500 published")
    })
    .await;
    cluster.kill_master(victim);
    let promoted = cluster
        .wait_for_failover(victim, Duration::from_secs(20))
        .await;
    // Publishes go on through the new master.
    let before = count();
    eventually(Duration::from_secs(20), || async {
        (count() >= before + 500)
            .then_some(())
            .ok_or("500 more after the failover")
    })
    .await;
    stop.send(true).expect("stop");
    let failed = publishing.await.expect("publisher");

    // Every acknowledged publish is delivered (in its epoch) unless the
    // failover lost it (then the topic's stream has a reset past it).
    let acknowledged = acknowledged.lock().expect("lock").clone();
    let total: usize = acknowledged.values().map(Vec::len).sum();
    eventually(WAIT, || async {
        let missing: usize = acknowledged
            .iter()
            .map(|(topic, acked)| {
                let stream = got.of(topic);
                acked
                    .iter()
                    .filter(|(epoch, seq, data)| {
                        let delivered =
                            stream.contains(&Event::Delivered(epoch.clone(), *seq, data.clone()));
                        let reset_past = stream.iter().any(|e| matches!(e, Event::Reset(..)));
                        !delivered && !reset_past
                    })
                    .count()
            })
            .sum();
        if missing == 0 {
            Ok(())
        } else {
            Err(format!("{missing} of {total} acknowledged not delivered"))
        }
    })
    .await;
    let resets = check_streams(&got, &topics);
    // Only topics on the killed master's slots may have lost anything.
    for topic in &topics {
        let on_victim = cluster.master_of_slot(RedisCluster::slot_of(topic.as_str())) == promoted;
        let reset = got
            .of(topic.as_str())
            .iter()
            .any(|e| matches!(e, Event::Reset(..)));
        assert!(
            on_victim || !reset,
            "{topic} was reset, but its master was not killed"
        );
    }
    eprintln!(
        "failover: {total} acknowledged publishes checked, {failed} refused during it, {resets} resets, 0 lost, 0 duplicated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_while_subscribed_keeps_its_topic_flowing_without_a_reset() {
    let cluster = RedisCluster::start().await;
    let topic = Topic::parse("moving").expect("topic");
    let slot = RedisCluster::slot_of("moving");
    let from = cluster.master_of_slot(slot);
    let to = *cluster
        .masters()
        .iter()
        .find(|&&m| m != from)
        .expect("another master");
    let (watcher, got) = pod(&cluster).await;
    let (publisher, _) = pod(&cluster).await;
    watcher.watch(&topic).await.expect("watch");
    let mut n = 0u64;
    let mut publish = async |count: u64| {
        for _ in 0..count {
            n += 1;
            let p = publisher
                .publish(&topic, Bytes::from(n.to_string()), None, None)
                .await
                .expect("publish");
            assert_eq!(p.seq, n);
        }
    };
    publish(10).await;
    got.wait_for(10).await;
    // Half-way: the keys have moved, the slot is still the old master's.
    cluster.begin_migration(slot, to);
    publish(10).await;
    cluster.finish_migration(slot, to).await;
    publish(10).await;
    got.wait_for(30).await;
    let stream = got.of("moving");
    let seqs: Vec<u64> = stream
        .iter()
        .map(|e| match e {
            Event::Delivered(_, seq, _) => *seq,
            reset => panic!("a reset: {reset:?}"),
        })
        .collect();
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>());
    assert_eq!(
        cluster.cli(to, &["XLEN", "herald:{moving}:hist"]).trim(),
        "30"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_that_lost_writes_resets_only_that_masters_topics() {
    let mut cluster = RedisCluster::start().await;
    let lost = Topic::parse("lost").expect("topic");
    let master = cluster.master_of_slot(RedisCluster::slot_of("lost"));
    let kept = (0..)
        .map(|i| format!("kept{i}"))
        .find(|t| cluster.master_of_slot(RedisCluster::slot_of(t)) != master)
        .map(|t| Topic::parse(&t).expect("topic"))
        .expect("a topic on another master");
    let (watcher, got) = pod(&cluster).await;
    let (publisher, _) = pod(&cluster).await;
    watch_all(&watcher, &[lost.clone(), kept.clone()]).await;
    let publish = async |topic: &Topic, data: &str| {
        publisher
            .publish(topic, Bytes::from(data.to_owned()), None, None)
            .await
    };
    for n in 1..=5 {
        publish(&lost, &n.to_string()).await.expect("publish");
        publish(&kept, &n.to_string()).await.expect("publish");
    }
    cluster.replicated(master).await;
    // Its replica frozen, the master takes 6..=8 that the replica never
    // gets; then the master dies, and the replica that lacks them takes over.
    let replica = cluster.replicas_of(master)[0];
    cluster.freeze(replica);
    // Cut while frozen, the replica cannot take the link up again: what
    // follows stays on the master (a frozen replica's socket would still
    // buffer it).
    cluster.cli(master, &["CLIENT", "KILL", "TYPE", "replica"]);
    for n in 6..=8 {
        publish(&lost, &n.to_string()).await.expect("publish");
    }
    got.wait_for(13).await;
    cluster.kill_master(master);
    cluster.thaw(replica);
    let promoted = cluster
        .wait_for_failover(master, Duration::from_secs(20))
        .await;
    assert_eq!(promoted, replica);
    eventually(WAIT, || async {
        publish(&lost, "after")
            .await
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await;
    publish(&kept, "6").await.expect("publish");

    // `lost`: 1..=8, then a reset (Redis went back to 5), then the new
    // publish, in the new epoch; each once.
    eventually(WAIT, || async {
        let stream = got.of("lost");
        match stream.last() {
            Some(Event::Delivered(_, _, data)) if data == "after" => Ok(()),
            _ => Err(format!("{stream:?}")),
        }
    })
    .await;
    let stream = got.of("lost");
    let resets = stream
        .iter()
        .filter(|e| matches!(e, Event::Reset(..)))
        .count();
    assert_eq!(resets, 1, "{stream:?}");
    let seqs: Vec<u64> = stream
        .iter()
        .take(8)
        .map(|e| match e {
            Event::Delivered(_, seq, _) => *seq,
            reset => panic!("{reset:?} before the failover"),
        })
        .collect();
    assert_eq!(seqs, (1..=8).collect::<Vec<_>>());
    // The promoted replica had 5: the new publish is 6 again, in a new epoch.
    match (stream.first(), stream.last()) {
        (Some(Event::Delivered(old, ..)), Some(Event::Delivered(new, 6, _))) => {
            assert_ne!(old, new, "{stream:?}")
        }
        _ => panic!("{stream:?}"),
    }
    check_streams(&got, &[lost.clone(), kept.clone()]);
    // `kept`'s master lost nothing: no reset, 1..=6.
    eventually(WAIT, || async {
        let seqs: Vec<u64> = got
            .of(kept.as_str())
            .iter()
            .map(|e| match e {
                Event::Delivered(_, seq, _) => *seq,
                reset => panic!("{kept}: {reset:?}"),
            })
            .collect();
        if seqs == (1..=6).collect::<Vec<_>>() {
            Ok(())
        } else {
            Err(format!("{kept}: {seqs:?}"))
        }
    })
    .await;
}

/// The members each room's changes leave, from none, and how often each
/// user joined and left there.
fn rooms_after(
    changes: &[(String, PresenceChange)],
) -> BTreeMap<String, (BTreeSet<String>, usize)> {
    let mut rooms: BTreeMap<String, (BTreeSet<String>, usize)> = BTreeMap::new();
    for (topic, change) in changes {
        let (members, told) = rooms.entry(topic.clone()).or_default();
        for join in &change.joins {
            members.insert(join.user.to_string());
            *told += 1;
        }
        for leave in &change.leaves {
            members.remove(&**leave);
            *told += 1;
        }
    }
    rooms
}

fn present(users: &[&str]) -> PresenceUpdate {
    PresenceUpdate {
        set: users
            .iter()
            .map(|user| {
                let member = Member {
                    user: Arc::from(*user),
                    info: None,
                };
                (member, 1)
            })
            .collect(),
        removed: Vec::new(),
        anonymous: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_on_every_master_counts_a_user_once_and_a_dead_pods_members_leave() {
    let cluster = RedisCluster::start().await;
    let rooms: Vec<Topic> = (0..12)
        .map(|i| Topic::parse(&format!("room:r{i}")).expect("topic"))
        .collect();
    let masters: BTreeSet<u16> = rooms
        .iter()
        .map(|t| cluster.master_of_slot(RedisCluster::slot_of(t.as_str())))
        .collect();
    assert_eq!(masters.len(), 3, "the rooms cover every master");
    let (a, a_got) = pod(&cluster).await;
    let (b, _) = pod(&cluster).await;
    watch_all(&a, &rooms).await;
    for room in &rooms {
        a.presence_update(room, present(&["alice"]))
            .await
            .expect("update");
        b.presence_update(room, present(&["alice", "bob"]))
            .await
            .expect("update");
    }
    for room in &rooms {
        let page = a.presence(room, None, 10).await.expect("page");
        let users: Vec<&str> = page.members.iter().map(|m| &*m.user).collect();
        assert_eq!(users, ["alice", "bob"], "{room}");
        assert_eq!((page.counts.users, page.counts.connections), (2, 3));
        // A pod that does not watch reads it from the room's master.
        let counts = b.presence_counts(room).await.expect("counts");
        assert_eq!((counts.users, counts.connections), (2, 3));
    }
    let both = BTreeSet::from(["alice".to_owned(), "bob".to_owned()]);
    eventually(WAIT, || async {
        let seen = rooms_after(&a_got.1.lock().expect("lock"));
        let all_in = rooms
            .iter()
            .all(|r| seen.get(r.as_str()) == Some(&(both.clone(), 2)));
        if all_in {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    // Pod b dies: bob leaves every room, once; alice stays.
    b.stop_presence_beat();
    let alone = BTreeSet::from(["alice".to_owned()]);
    eventually(WAIT, || async {
        let seen = rooms_after(&a_got.1.lock().expect("lock"));
        let left = rooms
            .iter()
            .all(|r| seen.get(r.as_str()) == Some(&(alone.clone(), 3)));
        if left {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    })
    .await;
    for room in &rooms {
        let counts = a.presence_counts(room).await.expect("counts");
        assert_eq!((counts.users, counts.connections), (1, 1), "{room}");
    }
}
