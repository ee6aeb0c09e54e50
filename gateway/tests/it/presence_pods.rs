//! Presence across pods: real `herald` processes on one real `redis-server`
//! (and on a Redis Cluster). A user connected to two pods is one member,
//! joins once and leaves once; either pod answers a page with everyone;
//! a pod killed with `kill -9` has its members removed by another, each a
//! leave, within `presence.pod_ttl` and a scan (the documented bound).
//! Through Sentinel, presence outlives a failover.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use testkit::sentinel::{MASTER_NAME, SentinelGroup};
use testkit::{Herald, Redis, RedisCluster, WAIT, eventually};

use crate::pod::HERALD;
use crate::presence::{SECRET, ask, connect, diffs_until, hello, joins, leaves, sub, users};

/// Longest the pods may take to answer again after the master died: the
/// sentinels' detection, agreement and promotion, and the pods' next
/// attempt and beat.
const FAILOVER_WAIT: Duration = Duration::from_secs(30);

/// A pod's variables: tokens checked (anonymous clients let in), presence
/// in `room` (with diffs), a short diff interval, and `extra`.
fn env<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![
        ("HERALD_AUTH__HMAC_SECRET", SECRET),
        ("HERALD_AUTH__ALLOW_ANONYMOUS", "true"),
        ("HERALD_NAMESPACES__ROOM__SUBSCRIBE", "anyone"),
        ("HERALD_NAMESPACES__ROOM__PRESENCE", "true"),
        ("HERALD_NAMESPACES__ROOM__JOIN_LEAVE", "true"),
        ("HERALD_PRESENCE__DIFF_INTERVAL", "100ms"),
        ("HERALD_REDIS__COMMAND_TIMEOUT", "1s"),
        ("HERALD_LOG__LEVEL", "info"),
    ];
    env.extend_from_slice(extra);
    env
}

async fn pod(redis: &Redis, extra: &[(&str, &str)]) -> Herald {
    Herald::pod(HERALD, &redis.url(), &env(extra)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_on_two_pods_is_one_member_that_joins_and_leaves_once() {
    let redis = Redis::start().await;
    let (a, b) = (pod(&redis, &[]).await, pod(&redis, &[]).await);
    let (mut watcher, _) = connect(&a.ws_url(), None).await;
    watcher.sub(1, "room:1").await;
    let (mut on_a, _) = connect(&a.ws_url(), Some("alice")).await;
    on_a.sub(1, "room:1").await;
    let (mut on_b, _) = connect(&b.ws_url(), Some("alice")).await;
    on_b.sub(1, "room:1").await;
    let (mut bob, _) = connect(&b.ws_url(), Some("bob")).await;
    bob.sub(1, "room:1").await;
    let mut seen = diffs_until(&mut watcher, |d| d["connections"] == 4).await;
    // Either pod answers with everyone, each user once.
    for client in [&mut watcher, &mut bob] {
        let page = ask(client, 7, json!({"topic": "room:1"})).await;
        assert_eq!(users(&page), ["alice", "bob"], "{page}");
        assert_eq!(page["connections"], 4, "{page}");
    }
    // Alice's connection on a closes: she is still on b.
    on_a.ws.close(None).await.expect("close");
    seen.extend(diffs_until(&mut watcher, |d| d["connections"] == 3).await);
    on_b.ws.close(None).await.expect("close");
    seen.extend(diffs_until(&mut watcher, |d| leaves(d, "alice")).await);
    let joined = seen.iter().filter(|d| joins(d, "alice")).count();
    let left = seen.iter().filter(|d| leaves(d, "alice")).count();
    assert_eq!((joined, left), (1, 1), "{seen:?}");
    // The backend asks pod b over HTTP.
    let (status, stats) =
        testkit::http(b.addr, "GET", "/v1/presence/stats?topic=room:1", &[], b"").await;
    let stats: Value = serde_json::from_str(&stats).unwrap_or(Value::Null);
    assert_eq!(status, 200, "{stats}");
    assert_eq!(
        (stats["users"].as_u64(), stats["connections"].as_u64()),
        (Some(1), Some(2))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_killed_without_a_goodbye_has_its_members_removed_within_the_bound() {
    // pod_ttl 2s: the bound is 2s + a scan (400ms) + the cleanup.
    let ttl = Duration::from_secs(2);
    let redis = Redis::start().await;
    let extra = [("HERALD_PRESENCE__POD_TTL", "2s")];
    let (a, mut b) = (pod(&redis, &extra).await, pod(&redis, &extra).await);
    let (mut watcher, _) = connect(&a.ws_url(), None).await;
    watcher.sub(1, "room:2").await;
    let mut clients = Vec::new();
    for user in ["alice", "bob"] {
        let (mut client, _) = connect(&b.ws_url(), Some(user)).await;
        client.sub(1, "room:2").await;
        clients.push(client);
    }
    diffs_until(&mut watcher, |d| d["users"] == 2).await;
    b.kill9();
    let killed = Instant::now();
    let seen = diffs_until(&mut watcher, |d| d["users"] == 0).await;
    let took = killed.elapsed();
    assert!(seen.iter().any(|d| leaves(d, "alice")), "{seen:?}");
    assert!(seen.iter().any(|d| leaves(d, "bob")), "{seen:?}");
    // The bound, with room for a loaded machine's scheduling.
    assert!(
        took <= ttl + ttl / 5 + Duration::from_secs(3),
        "took {took:?}"
    );
    let page = ask(&mut watcher, 2, json!({"topic": "room:2"})).await;
    assert_eq!(
        (page["users"].as_u64(), page["connections"].as_u64()),
        (Some(0), Some(1))
    );
    eventually(WAIT, || async {
        let cleaned = testkit::metric(a.addr, "herald_presence_dead_pods_total").await;
        let members = testkit::metric(a.addr, "herald_presence_dead_pod_members_total").await;
        if cleaned == 1.0 && members == 2.0 {
            Ok(())
        } else {
            Err(format!("{cleaned} dead pods, {members} members removed"))
        }
    })
    .await;
    drop(clients);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_redis_cluster_pods_share_the_presence_of_topics_on_every_master() {
    let cluster = RedisCluster::start().await;
    let nodes = cluster.urls().join(",");
    let env = env(&[("HERALD_REDIS__CLUSTER", nodes.as_str())]);
    // Only its user, password and TLS would count: there are none.
    let a = Herald::pod(HERALD, "redis://127.0.0.1", &env).await;
    let b = Herald::pod(HERALD, "redis://127.0.0.1", &env).await;
    // Topics on every master.
    let topics: Vec<String> = (0..6).map(|i| format!("room:{i}")).collect();
    let masters: std::collections::BTreeSet<u16> = topics
        .iter()
        .map(|t| cluster.master_of_slot(RedisCluster::slot_of(t)))
        .collect();
    assert!(masters.len() >= 2, "topics on one master only");
    let (mut alice, _) = connect(&a.ws_url(), Some("alice")).await;
    let (mut bob, _) = connect(&b.ws_url(), Some("bob")).await;
    for (id, topic) in (1..).zip(&topics) {
        sub(&mut alice, id, topic).await;
        sub(&mut bob, id, topic).await;
    }
    // Each pod writes its own changes within `presence.diff_interval`
    // (and at once before it answers a query of its own).
    let mut id = 100;
    for topic in &topics {
        let deadline = Instant::now() + WAIT;
        loop {
            id += 1;
            let page = ask(&mut alice, id, json!({"topic": topic})).await;
            if users(&page) == ["alice", "bob"] {
                break;
            }
            assert!(Instant::now() < deadline, "{topic}: {page}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let mut grpc = testkit::grpc_client(b.grpc_addr).await;
    for topic in &topics {
        let stats = grpc
            .presence_stats(proto::v1::PresenceStatsRequest {
                topic: topic.clone(),
            })
            .await
            .expect("PresenceStats")
            .into_inner();
        assert_eq!((stats.users, stats.connections), (2, 2), "{topic}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_on_another_pod_within_the_window_is_neither_a_leave_nor_a_join() {
    // A short window: the first pod lets the dropped connection go when it
    // ends, and the user, resumed elsewhere, must not leave then either.
    let extra = [("HERALD_SESSION__RESUME_WINDOW", "2s")];
    let redis = Redis::start().await;
    let (a, b) = (pod(&redis, &extra).await, pod(&redis, &extra).await);
    let (mut watcher, _) = connect(&b.ws_url(), None).await;
    watcher.sub(1, "room:3").await;
    let (mut alice, session) = connect(&a.ws_url(), Some("alice")).await;
    alice.sub(1, "room:3").await;
    let mut seen = diffs_until(&mut watcher, |d| joins(d, "alice")).await;
    // Her connection to a drops without a close; she resumes on b.
    drop(alice);
    let dropped = Instant::now();
    let mut alice = testkit::Client::connect_url(&b.ws_url()).await;
    hello(&mut alice, Some("alice"), Some(&session)).await;
    // Past the window (a's lingering connection gone), someone joins: every
    // change before that has been sent.
    let window = Duration::from_secs(2);
    while dropped.elapsed() < window + Duration::from_millis(500) {
        let page = ask(&mut watcher, 9, json!({"topic": "room:3"})).await;
        assert_eq!(users(&page), ["alice"], "{page}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (mut bob, _) = connect(&a.ws_url(), Some("bob")).await;
    bob.sub(1, "room:3").await;
    seen.extend(diffs_until(&mut watcher, |d| joins(d, "bob")).await);
    let joined = seen.iter().filter(|d| joins(d, "alice")).count();
    let left = seen.iter().filter(|d| leaves(d, "alice")).count();
    assert_eq!((joined, left), (1, 0), "{seen:?}");
    let page = ask(&mut watcher, 10, json!({"topic": "room:3"})).await;
    assert_eq!(users(&page), ["alice", "bob"], "{page}");
    assert_eq!(page["connections"], 3, "{page}");
}

/// A user who dropped from one pod, resumed on another and then leaves
/// there leaves at once: the pod she dropped from hears of the resume and
/// lets her lingering connection go, rather than keep her listed for the
/// rest of her window (two minutes here, far beyond the wait).
#[tokio::test]
async fn a_user_who_moved_to_another_pod_and_then_leaves_there_leaves_at_once() {
    let extra = [("HERALD_SESSION__RESUME_WINDOW", "120s")];
    let redis = Redis::start().await;
    let (a, b) = (pod(&redis, &extra).await, pod(&redis, &extra).await);
    let (mut watcher, _) = connect(&b.ws_url(), None).await;
    watcher.sub(1, "room:4").await;
    let (mut alice, session) = connect(&a.ws_url(), Some("alice")).await;
    alice.sub(1, "room:4").await;
    let mut seen = diffs_until(&mut watcher, |d| joins(d, "alice")).await;
    // Her connection to a drops without a close; she resumes on b, which
    // restores her subscription, then she unsubscribes there.
    drop(alice);
    let mut alice = testkit::Client::connect_url(&b.ws_url()).await;
    hello(&mut alice, Some("alice"), Some(&session)).await;
    alice
        .send(json!({"op": "unsub", "id": 2, "topic": "room:4"}))
        .await;
    alice.expect("ok").await;
    seen.extend(diffs_until(&mut watcher, |d| leaves(d, "alice")).await);
    let joined = seen.iter().filter(|d| joins(d, "alice")).count();
    assert_eq!(joined, 1, "no join again on the resume: {seen:?}");
    let page = ask(&mut watcher, 9, json!({"topic": "room:4"})).await;
    assert_eq!(users(&page), Vec::<String>::new(), "{page}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_sentinel_pods_share_presence_and_keep_it_over_a_failover() {
    let mut group = SentinelGroup::start().await;
    let addresses = group.addresses().join(",");
    let env = env(&[
        ("HERALD_REDIS__SENTINEL__MASTER_NAME", MASTER_NAME),
        ("HERALD_REDIS__SENTINEL__ADDRESSES", addresses.as_str()),
        // Each pod writes its presence again where the new master lacks it:
        // within a beat.
        ("HERALD_PRESENCE__POD_TTL", "2s"),
    ]);
    // Host and port are not used: the sentinels say where the master is.
    let a = Herald::pod(HERALD, "redis://127.0.0.1", &env).await;
    let b = Herald::pod(HERALD, "redis://127.0.0.1", &env).await;
    let (mut alice, _) = connect(&a.ws_url(), Some("alice")).await;
    sub(&mut alice, 1, "room:s").await;
    let (mut bob, _) = connect(&b.ws_url(), Some("bob")).await;
    sub(&mut bob, 1, "room:s").await;
    everyone(&mut alice, 10).await;
    everyone(&mut bob, 11).await;

    // The master dies; the sentinels promote its replica. Whatever the
    // replica had not received yet, each pod writes again.
    let old = group.master.port;
    group.master.stop();
    let promoted = group.wait_for_failover(old, FAILOVER_WAIT).await;
    assert_eq!(promoted, group.replica.port);
    let (mut carol, _) = connect(&b.ws_url(), None).await;
    everyone(&mut carol, 12).await;
}

/// Waits until `client`'s pod lists alice and bob in `room:s`.
async fn everyone(client: &mut testkit::Client, id: u64) {
    let deadline = Instant::now() + FAILOVER_WAIT;
    loop {
        let page = ask(client, id, json!({"topic": "room:s"})).await;
        if users(&page) == ["alice", "bob"] {
            return;
        }
        assert!(Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
