//! Occupancy on the Redis engine, two pods ("pods": two brokers) on one
//! real `redis-server`: each topic's first subscriber anywhere is one
//! `occupied`, told by the pod it came to; its last one gone is one
//! `vacated`, told by the pod it left, or, for a pod that stopped beating
//! (as one killed would), by the pod that cleaned up after it. Nothing is
//! tracked (no Redis key) unless asked.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use router::observe::Ignore;
use router::{
    Broker, Deliver, NamespaceSettings, Namespaces, Position, PresenceSettings, Publication,
    RedisBroker, RedisSettings, Topic,
};
use testkit::{Redis, WAIT, eventually};

/// Every occupancy transition a pod was told of, in order.
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
}

fn settings(url: String, pod: &str, occupancy: bool) -> RedisSettings {
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
            occupancy,
        },
    }
}

async fn pod(redis: &Redis, name: &str, occupancy: bool) -> (RedisBroker, Arc<Transitions>) {
    let sink = Arc::new(Transitions::default());
    let namespaces = Namespaces::new(&BTreeMap::from([(
        "room".to_owned(),
        NamespaceSettings::default(),
    )]))
    .expect("namespaces");
    let broker = RedisBroker::start(
        settings(redis.url(), name, occupancy),
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
