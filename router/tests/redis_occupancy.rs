//! Occupancy on the Redis engine, two pods ("pods": two brokers) on one
//! real `redis-server`: each topic's first subscriber anywhere is one
//! `occupied`, told by the pod it came to; its last one gone is one
//! `vacated`, told by the pod it left, or, for a pod that stopped beating
//! (as one killed would), by the pod that cleaned up after it. Nothing is
//! tracked (no Redis key) unless asked. Presence members likewise: each
//! user's first connection on any pod is one join, told by the pod whose
//! write made it, their last gone one leave (the cleaner's, for a pod that
//! stopped beating).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use router::observe::Ignore;
use router::{
    Broker, Deliver, Member, NamespaceSettings, Namespaces, Position, PresenceSettings,
    PresenceUpdate, Publication, RedisBroker, RedisSettings, Topic,
};
use testkit::{Redis, RedisCluster, WAIT, eventually};

/// Every occupancy transition a pod was told of, in order; and every
/// member's join (`true`) and leave, as `"topic user"`.
#[derive(Default)]
struct Transitions(Mutex<Vec<(String, bool)>>);

impl Transitions {
    fn all(&self) -> Vec<(String, bool)> {
        self.0.lock().expect("lock").clone()
    }
}

impl Deliver for Transitions {
    fn deliver(&self, _: &Publication, _: Option<&str>) {}
    fn reset(&self, _: &Topic, _: &Position) {}
    fn disconnect(&self, _: &str) {}
    fn occupancy(&self, topic: &Topic, occupied: bool) {
        self.0
            .lock()
            .expect("lock")
            .push((topic.as_str().to_owned(), occupied));
    }
    fn members(&self, topic: &Topic, joins: &[Member], leaves: &[Arc<str>]) {
        let mut all = self.0.lock().expect("lock");
        for member in joins {
            all.push((format!("{topic} {}", member.user), true));
        }
        for user in leaves {
            all.push((format!("{topic} {user}"), false));
        }
    }
}

/// `tracked`: occupancy and members both.
fn settings(url: String, pod: &str, tracked: bool) -> RedisSettings {
    RedisSettings {
        url,
        password: None,
        tls: Default::default(),
        sentinel: None,
        cluster: Vec::new(),
        command_timeout: Duration::from_secs(1),
        linger: Duration::from_millis(100),
        prefix: router::redis::DEFAULT_PREFIX.to_owned(),
        presence: PresenceSettings {
            pod_ttl: Duration::from_secs(1),
            pod: pod.to_owned(),
            occupancy: tracked,
            members: tracked,
        },
    }
}

async fn pod(redis: &Redis, name: &str, occupancy: bool) -> (RedisBroker, Arc<Transitions>) {
    start(settings(redis.url(), name, occupancy)).await
}

async fn start(settings: RedisSettings) -> (RedisBroker, Arc<Transitions>) {
    let sink = Arc::new(Transitions::default());
    let namespaces = Namespaces::new(&BTreeMap::from([(
        "room".to_owned(),
        NamespaceSettings {
            presence: true,
            ..NamespaceSettings::default()
        },
    )]))
    .expect("namespaces");
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

fn topic(name: &str) -> Topic {
    Topic::parse(name).expect("topic")
}

/// Both pods' transitions of `name`, told by either, once they number
/// `n`.
async fn told(pods: &[&Transitions], name: &str, n: usize) -> Vec<bool> {
    let of = || {
        pods.iter()
            .flat_map(|p| p.all())
            .filter(|(t, _)| t == name)
            .map(|(_, occupied)| occupied)
            .collect::<Vec<_>>()
    };
    eventually(WAIT, || async {
        let seen = of();
        if seen.len() >= n {
            Ok(())
        } else {
            Err(format!("{name}: {seen:?}"))
        }
    })
    .await;
    of()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_transition_is_told_once_by_the_pod_that_caused_it() {
    let redis = Redis::start().await;
    let (a, on_a) = pod(&redis, "a", true).await;
    let (b, on_b) = pod(&redis, "b", true).await;
    let room = topic("room:1");
    a.watch(&room).await.expect("watch");
    assert_eq!(told(&[&on_a, &on_b], "room:1", 1).await, [true]);
    assert_eq!(on_a.all(), [("room:1".to_owned(), true)], "a caused it");
    // A second pod, and a second watch on it: no transition.
    b.watch(&room).await.expect("watch");
    b.watch(&room).await.expect("watch");
    // A marker watched after it: each pod writes in order, so once the
    // marker is told, the pod's write of room:1 is done.
    b.watch(&topic("room:m1")).await.expect("watch");
    told(&[&on_b], "room:m1", 1).await;
    a.unwatch(&room).await;
    a.watch(&topic("room:m2")).await.expect("watch");
    told(&[&on_a], "room:m2", 1).await;
    assert_eq!(
        told(&[&on_a, &on_b], "room:1", 1).await,
        [true],
        "still occupied"
    );
    b.unwatch(&room).await;
    b.unwatch(&room).await;
    assert_eq!(told(&[&on_a, &on_b], "room:1", 2).await, [true, false]);
    assert_eq!(
        on_b.all().last(),
        Some(&("room:1".to_owned(), false)),
        "b caused it"
    );
    // Again from empty: occupied again, once.
    b.watch(&room).await.expect("watch");
    assert_eq!(
        told(&[&on_a, &on_b], "room:1", 3).await,
        [true, false, true]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_that_stops_beating_is_vacated_once_by_the_cleaner() {
    let redis = Redis::start().await;
    let (a, on_a) = pod(&redis, "a", true).await;
    let (b, on_b) = pod(&redis, "b", true).await;
    let (shared, alone) = (topic("room:shared"), topic("room:alone"));
    a.watch(&shared).await.expect("watch");
    b.watch(&shared).await.expect("watch");
    b.watch(&alone).await.expect("watch");
    told(&[&on_a, &on_b], "room:alone", 1).await;
    told(&[&on_a, &on_b], "room:shared", 1).await;
    // b dies: a cleans up after it within pod_ttl and a beat.
    b.stop_presence_beat();
    let alone_told = told(&[&on_a], "room:alone", 1).await;
    assert_eq!(
        alone_told,
        [false],
        "told by a, the cleaner: {:?}",
        on_a.all()
    );
    // room:shared still has a's subscriber; once a leaves, it is vacated.
    a.unwatch(&shared).await;
    assert_eq!(told(&[&on_a], "room:shared", 2).await, [true, false]);
    let all: Vec<(String, bool)> = on_a.all().into_iter().chain(on_b.all()).collect();
    let count = |name: &str, occupied: bool| {
        all.iter()
            .filter(|(t, o)| t == name && *o == occupied)
            .count()
    };
    assert_eq!(
        (count("room:alone", true), count("room:alone", false)),
        (1, 1),
        "{all:?}"
    );
    assert_eq!(
        (count("room:shared", true), count("room:shared", false)),
        (1, 1),
        "{all:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untracked_occupancy_writes_nothing() {
    let redis = Redis::start().await;
    let (a, on_a) = pod(&redis, "a", false).await;
    a.watch(&topic("room:1")).await.expect("watch");
    a.publish(
        &topic("room:1"),
        bytes::Bytes::from_static(b"1"),
        None,
        None,
    )
    .await
    .expect("publish");
    let keys = redis.cli(&["--scan", "--pattern", "*occupancy*"]);
    assert_eq!(keys.trim(), "", "no occupancy key");
    assert!(on_a.all().is_empty());
}

/// `user` with `connections` on the pod now (0: gone).
fn holds(user: &str, connections: u32) -> PresenceUpdate {
    let member = Member {
        user: Arc::from(user),
        info: Some(bytes::Bytes::from(format!("{{\"name\":\"{user}\"}}"))),
    };
    if connections == 0 {
        PresenceUpdate {
            removed: vec![member.user],
            ..PresenceUpdate::default()
        }
    } else {
        PresenceUpdate {
            set: vec![(member, connections)],
            ..PresenceUpdate::default()
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_joins_and_leaves_once_across_pods_and_a_dead_pods_leave_is_the_cleaners() {
    let redis = Redis::start().await;
    let (a, on_a) = pod(&redis, "a", true).await;
    let (b, on_b) = pod(&redis, "b", true).await;
    let room = topic("room:1");
    // Writes are awaited here: each update's count is done when it returns.
    a.presence_update(&room, holds("alice", 1))
        .await
        .expect("update");
    b.presence_update(&room, holds("alice", 2))
        .await
        .expect("update");
    a.presence_update(&room, holds("alice", 0))
        .await
        .expect("update");
    assert_eq!(told(&[&on_a, &on_b], "room:1 alice", 1).await, [true]);
    assert_eq!(
        on_a.all(),
        [("room:1 alice".to_owned(), true)],
        "a's write made it"
    );
    b.presence_update(&room, holds("alice", 0))
        .await
        .expect("update");
    assert_eq!(
        told(&[&on_a, &on_b], "room:1 alice", 2).await,
        [true, false]
    );
    assert!(
        on_b.all().contains(&("room:1 alice".to_owned(), false)),
        "b's write made it"
    );
    // Bob only on b, which stops beating: a cleans up after it, telling
    // his leave.
    b.presence_update(&room, holds("bob", 1))
        .await
        .expect("update");
    b.stop_presence_beat();
    assert_eq!(
        told(&[&on_a], "room:1 bob", 1).await,
        [false],
        "the cleaner's"
    );
    let bobs: Vec<bool> = on_a
        .all()
        .into_iter()
        .chain(on_b.all())
        .filter(|(t, _)| t == "room:1 bob")
        .map(|(_, joined)| joined)
        .collect();
    assert_eq!(bobs, [false, true], "one join (b), one leave (a)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_each_topics_keys_are_in_its_slot_and_transitions_are_told_once() {
    let cluster = RedisCluster::start().await;
    let on_cluster = |name: &str| RedisSettings {
        url: "redis://127.0.0.1".into(),
        cluster: cluster.urls(),
        ..settings(String::new(), name, true)
    };
    let (a, on_a) = start(on_cluster("a")).await;
    let (b, on_b) = start(on_cluster("b")).await;
    // Topics over every master.
    let names: Vec<String> = (0..12).map(|i| format!("room:{i}")).collect();
    for name in &names {
        a.watch(&topic(name)).await.expect("watch");
        b.watch(&topic(name)).await.expect("watch");
    }
    for name in &names {
        assert_eq!(told(&[&on_a, &on_b], name, 1).await, [true], "{name}");
    }
    // A member on both pods: one join.
    let room = topic("room:0");
    a.presence_update(&room, holds("ann", 1))
        .await
        .expect("update");
    b.presence_update(&room, holds("ann", 1))
        .await
        .expect("update");
    assert_eq!(told(&[&on_a, &on_b], "room:0 ann", 1).await, [true]);
    for name in &names {
        a.unwatch(&topic(name)).await;
    }
    // A marker after a's unwatches: once told, a's writes are done.
    a.watch(&topic("room:marker")).await.expect("watch");
    told(&[&on_a], "room:marker", 1).await;
    for name in &names {
        b.unwatch(&topic(name)).await;
    }
    for name in &names {
        assert_eq!(
            told(&[&on_a, &on_b], name, 2).await,
            [true, false],
            "{name}"
        );
    }
}
