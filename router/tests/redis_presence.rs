//! Presence on the Redis engine, two pods ("pods": two brokers) on one real
//! `redis-server`: members counted once across pods, each join and leave
//! once in position order, a page and the changes after it, a dead pod's
//! members removed by the other (and by a second cleaner when the first
//! died midway), and Redis restarted empty.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use router::observe::{Ignore, Observer};
use router::{
    Broker, Deliver, Member, NamespaceSettings, Namespaces, Position, PresenceChange,
    PresenceSettings, PresenceUpdate, Publication, RedisBroker, RedisSettings, Topic,
};
use testkit::{Redis, WAIT, eventually};

/// Every presence change a pod was handed, in order.
#[derive(Default)]
struct Changes(Mutex<Vec<(Topic, PresenceChange)>>);

impl Changes {
    fn all(&self) -> Vec<PresenceChange> {
        self.0
            .lock()
            .expect("lock")
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    }

    /// Waits until the changes handed so far satisfy `done`.
    async fn until(&self, what: &str, done: impl Fn(&[PresenceChange]) -> bool) {
        eventually(WAIT, || async {
            let all = self.all();
            if done(&all) {
                Ok(())
            } else {
                Err(format!("{what}: {all:?}"))
            }
        })
        .await;
    }
}

impl Deliver for Changes {
    fn deliver(&self, _: &Publication, _: Option<&str>) {}
    fn reset(&self, _: &Topic, _: &Position) {}
    fn disconnect(&self, _: &str) {}
    fn presence(&self, topic: &Topic, change: &PresenceChange) {
        self.0
            .lock()
            .expect("lock")
            .push((topic.clone(), change.clone()));
    }
}

fn settings(url: String, pod: &str, pod_ttl: Duration) -> RedisSettings {
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
            pod_ttl,
            pod: pod.to_owned(),
            ..PresenceSettings::default()
        },
    }
}

fn namespaces() -> Arc<Namespaces> {
    Arc::new(
        Namespaces::new(&BTreeMap::from([(
            "room".to_owned(),
            NamespaceSettings {
                presence: true,
                join_leave: true,
                ..NamespaceSettings::default()
            },
        )]))
        .expect("namespaces"),
    )
}

async fn pod(redis: &Redis, name: &str, pod_ttl: Duration) -> (RedisBroker, Arc<Changes>) {
    observed_pod(redis, name, pod_ttl, Arc::new(Ignore)).await
}

async fn observed_pod(
    redis: &Redis,
    name: &str,
    pod_ttl: Duration,
    observer: Arc<dyn Observer>,
) -> (RedisBroker, Arc<Changes>) {
    let sink = Arc::new(Changes::default());
    let broker = RedisBroker::start(
        settings(redis.url(), name, pod_ttl),
        namespaces(),
        sink.clone(),
        observer,
    )
    .await
    .expect("connect");
    (broker, sink)
}

/// What a pod reports of its cleanups: members removed, pods cleaned.
#[derive(Default)]
struct Cleanups(AtomicU64, AtomicU64);

impl Observer for Cleanups {
    fn presence_cleaned(&self, members: u64) {
        self.0.fetch_add(members, Ordering::Relaxed);
    }
    fn presence_pod_cleaned(&self) {
        self.1.fetch_add(1, Ordering::Relaxed);
    }
}

fn room() -> Topic {
    Topic::parse("room:1").expect("topic")
}

fn set(users: &[(&str, u32)], anonymous: u32) -> PresenceUpdate {
    PresenceUpdate {
        set: users
            .iter()
            .map(|(user, connections)| {
                let member = Member {
                    user: Arc::from(*user),
                    info: Some(Bytes::from(format!("{{\"name\":\"{user}\"}}"))),
                };
                (member, *connections)
            })
            .collect(),
        removed: Vec::new(),
        anonymous,
    }
}

fn removed(users: &[&str], anonymous: u32) -> PresenceUpdate {
    PresenceUpdate {
        set: Vec::new(),
        removed: users.iter().map(|u| Arc::from(*u)).collect(),
        anonymous,
    }
}

/// The members a sequence of changes leaves, starting from none.
fn replay(changes: &[PresenceChange]) -> BTreeSet<String> {
    let mut members = BTreeSet::new();
    for change in changes {
        for join in &change.joins {
            members.insert(join.user.to_string());
        }
        for leave in &change.leaves {
            members.remove(&**leave);
        }
    }
    members
}

fn names(members: &[Member]) -> Vec<String> {
    members.iter().map(|m| m.user.to_string()).collect()
}

/// Every join and every leave of `user`, in order.
fn story(changes: &[PresenceChange], user: &str) -> Vec<&'static str> {
    let mut told = Vec::new();
    for change in changes {
        if change.joins.iter().any(|m| &*m.user == user) {
            told.push("join");
        }
        if change.leaves.iter().any(|u| &**u == user) {
            told.push("leave");
        }
    }
    told
}

#[tokio::test]
async fn a_user_on_two_pods_is_one_member_and_joins_and_leaves_once() {
    let redis = Redis::start().await;
    let (a, seen_a) = pod(&redis, "a", Duration::from_secs(10)).await;
    let (b, seen_b) = pod(&redis, "b", Duration::from_secs(10)).await;
    let t = room();
    a.watch(&t).await.expect("watch");
    b.watch(&t).await.expect("watch");

    a.presence_update(&t, set(&[("alice", 1), ("bob", 1)], 1))
        .await
        .expect("update");
    b.presence_update(&t, set(&[("alice", 2), ("carol", 1)], 0))
        .await
        .expect("update");
    // Each pod sees itself at once: its own write is in its page.
    let page = b.presence(&t, None, 10).await.expect("page");
    assert_eq!(names(&page.members), ["alice", "bob", "carol"]);
    assert_eq!((page.counts.users, page.counts.connections), (3, 6));
    assert_eq!(
        page.members[0].info.as_deref(),
        Some(&b"{\"name\":\"alice\"}"[..])
    );
    // Pod a hears of b's write through Redis: then its counts are b's.
    let position = page.counts.position;
    seen_a
        .until("b's write", |all| {
            all.last().is_some_and(|c| c.position == position)
        })
        .await;
    let counts = a.presence_counts(&t).await.expect("counts");
    assert_eq!(counts, page.counts);

    // Alice leaves pod a: still a member through pod b.
    a.presence_update(&t, removed(&["alice"], 1))
        .await
        .expect("update");
    b.presence_update(&t, removed(&["alice"], 0))
        .await
        .expect("update");
    for seen in [&seen_a, &seen_b] {
        seen.until("alice gone", |all| {
            all.last()
                .is_some_and(|c| c.users == 2 && c.connections == 3)
        })
        .await;
        let all = seen.all();
        assert_eq!(story(&all, "alice"), ["join", "leave"], "{all:?}");
        assert_eq!(story(&all, "bob"), ["join"]);
        assert_eq!(story(&all, "carol"), ["join"]);
        let positions: Vec<u64> = all.iter().map(|c| c.position).collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "positions rise: {positions:?}"
        );
        assert_eq!(replay(&all), BTreeSet::from(["bob".into(), "carol".into()]));
    }
    // Both pods hand on the same changes.
    assert_eq!(seen_a.all(), seen_b.all());

    // Pages by user id after a cursor.
    let first = a.presence(&t, None, 1).await.expect("page");
    assert_eq!(
        (names(&first.members), first.more),
        (vec!["bob".into()], true)
    );
    let second = a.presence(&t, Some("bob"), 1).await.expect("page");
    assert_eq!(
        (names(&second.members), second.more),
        (vec!["carol".into()], false)
    );
}

#[tokio::test]
async fn a_pod_that_does_not_watch_reads_the_room_from_redis() {
    let redis = Redis::start().await;
    let (a, _) = pod(&redis, "a", Duration::from_secs(10)).await;
    let (b, _) = pod(&redis, "b", Duration::from_secs(10)).await;
    let t = room();
    a.presence_update(&t, set(&[("alice", 1)], 2))
        .await
        .expect("update");
    let page = b.presence(&t, None, 10).await.expect("page");
    assert_eq!(names(&page.members), ["alice"]);
    assert_eq!((page.counts.users, page.counts.connections), (1, 3));
    // A change that changes nothing writes nothing.
    let position = page.counts.position;
    a.presence_update(&t, set(&[], 2)).await.expect("update");
    let again = b.presence_counts(&t).await.expect("counts");
    assert_eq!(again.position, position);
    // An empty room reads as one.
    let empty = b
        .presence(&Topic::parse("room:none").expect("topic"), None, 10)
        .await
        .expect("page");
    assert_eq!((empty.counts.users, empty.members.len()), (0, 0));
}

#[tokio::test]
async fn a_page_and_the_changes_after_it_make_the_room() {
    let redis = Redis::start().await;
    let (a, seen_a) = pod(&redis, "a", Duration::from_secs(10)).await;
    let (b, _) = pod(&redis, "b", Duration::from_secs(10)).await;
    let t = room();
    a.watch(&t).await.expect("watch");
    // Pod b comes and goes with users while pod a is asked for a page.
    let writer = {
        let b = b.clone();
        let t = t.clone();
        tokio::spawn(async move {
            for i in 0..40u32 {
                let user = format!("u{:02}", i % 13);
                let update = if i % 3 == 2 {
                    removed(&[&user], i % 2)
                } else {
                    set(&[(&user, 1 + i % 2)], i % 2)
                };
                b.presence_update(&t, update).await.expect("update");
            }
        })
    };
    tokio::task::yield_now().await;
    let page = a.presence(&t, None, 1000).await.expect("page");
    writer.await.expect("writer");
    let last = b.presence_counts(&t).await.expect("counts").position;
    seen_a
        .until("every change", |all| {
            all.last().is_some_and(|c| c.position >= last)
        })
        .await;
    let mut members: BTreeSet<String> = names(&page.members).into_iter().collect();
    let after: Vec<PresenceChange> = seen_a
        .all()
        .into_iter()
        .filter(|c| c.position > page.counts.position)
        .collect();
    for change in &after {
        for join in &change.joins {
            assert!(
                members.insert(join.user.to_string()),
                "joined twice: {}",
                join.user
            );
        }
        for leave in &change.leaves {
            assert!(members.remove(&**leave), "left without being in: {leave}");
        }
    }
    let now = a.presence(&t, None, 1000).await.expect("page");
    assert_eq!(members, names(&now.members).into_iter().collect());
}

/// The instances whose liveness Redis keeps.
fn instances(redis: &Redis) -> String {
    redis.cli(&["ZRANGE", "herald:presence:pods", "0", "-1"])
}

#[tokio::test]
async fn a_dead_pods_members_leave_within_the_bound() {
    let redis = Redis::start().await;
    let ttl = Duration::from_millis(1000);
    let cleanups = Arc::new(Cleanups::default());
    let (a, seen_a) = observed_pod(&redis, "a", ttl, cleanups.clone()).await;
    let (b, _) = pod(&redis, "b", ttl).await;
    let t = room();
    let other = Topic::parse("room:2").expect("topic");
    a.watch(&t).await.expect("watch");
    a.watch(&other).await.expect("watch");
    a.presence_update(&t, set(&[("alice", 1)], 0))
        .await
        .expect("update");
    b.presence_update(&t, set(&[("alice", 1), ("bob", 1)], 1))
        .await
        .expect("update");
    b.presence_update(&other, set(&[("carol", 1)], 0))
        .await
        .expect("update");
    seen_a
        .until("everyone in", |all| replay(all).len() == 3)
        .await;
    let dead = b.presence_instance().to_owned();
    eventually(WAIT, || async {
        if instances(&redis).contains(&dead) {
            Ok(())
        } else {
            Err("pod b never beat")
        }
    })
    .await;
    // Pod b dies without a goodbye: it stops beating, its fields stay.
    b.stop_presence_beat();
    let died = tokio::time::Instant::now();
    seen_a
        .until("bob and carol gone", |all| {
            replay(all) == BTreeSet::from(["alice".into()])
        })
        .await;
    // The bound: pod_ttl, a beat's period, and the cleanup's round trips.
    let took = died.elapsed();
    assert!(took <= ttl + ttl / 5 + Duration::from_secs(3), "{took:?}");
    let all = seen_a.all();
    assert_eq!(story(&all, "bob"), ["join", "leave"]);
    assert_eq!(story(&all, "carol"), ["join", "leave"]);
    assert_eq!(story(&all, "alice"), ["join"], "alice is on pod a too");
    let counts = a.presence_counts(&t).await.expect("counts");
    assert_eq!((counts.users, counts.connections), (1, 1));
    eventually(WAIT, || async {
        let left = instances(&redis);
        let set = redis.cli(&["EXISTS", &format!("herald:presence:pod:{dead}")]);
        if !left.contains(&dead) && set.trim() == "0" {
            Ok(())
        } else {
            Err(format!("still there: {left} {set}"))
        }
    })
    .await;
    // Reported: bob and carol from pod b's two fields (alice was in one).
    eventually(WAIT, || async {
        let done = (
            cleanups.0.load(Ordering::Relaxed),
            cleanups.1.load(Ordering::Relaxed),
        );
        if done == (3, 1) {
            Ok(())
        } else {
            Err(format!("{done:?}"))
        }
    })
    .await;
    drop(b);
}

#[tokio::test]
async fn a_departed_pods_members_stay_for_their_linger_and_then_leave() {
    let redis = Redis::start().await;
    let ttl = Duration::from_millis(1000);
    let linger = Duration::from_secs(5);
    let (a, seen_a) = pod(&redis, "a", ttl).await;
    let (b, _) = pod(&redis, "b", ttl).await;
    let (c, _) = pod(&redis, "c", ttl).await;
    let t = room();
    a.watch(&t).await.expect("watch");
    b.presence_update(&t, set(&[("bob", 1)], 0))
        .await
        .expect("update");
    c.presence_update(&t, set(&[("carol", 1)], 0))
        .await
        .expect("update");
    seen_a
        .until("bob and carol in", |all| replay(all).len() == 2)
        .await;
    for pod in [&b, &c] {
        let instance = pod.presence_instance().to_owned();
        eventually(WAIT, || async {
            if instances(&redis).contains(&instance) {
                Ok(())
            } else {
                Err("never beat")
            }
        })
        .await;
    }
    // Pod b drains and leaves; pod c dies without a goodbye, the control:
    // once carol is gone, bob would have been too, were he not lingering.
    b.presence_depart(linger).await.expect("depart");
    let departed = tokio::time::Instant::now();
    c.stop_presence_beat();
    seen_a
        .until("carol gone", |all| {
            replay(all) == BTreeSet::from(["bob".into()])
        })
        .await;
    assert_eq!(story(&seen_a.all(), "bob"), ["join"], "bob lingers");
    seen_a
        .until("bob gone after his window", |all| replay(all).is_empty())
        .await;
    assert!(departed.elapsed() >= linger, "{:?}", departed.elapsed());
    assert_eq!(story(&seen_a.all(), "bob"), ["join", "leave"]);
    drop((b, c));
}

#[tokio::test]
async fn a_second_cleaner_finishes_what_a_dead_cleaner_began() {
    let redis = Redis::start().await;
    let ttl = Duration::from_millis(1000);
    let (a, seen_a) = pod(&redis, "a", ttl).await;
    let (b, _) = pod(&redis, "b", ttl).await;
    let rooms: Vec<Topic> = (1..=3)
        .map(|i| Topic::parse(&format!("room:{i}")).expect("topic"))
        .collect();
    for (i, t) in rooms.iter().enumerate() {
        a.watch(t).await.expect("watch");
        b.presence_update(t, set(&[(&format!("user{i}"), 1)], 0))
            .await
            .expect("update");
    }
    seen_a
        .until("everyone in", |all| replay(all).len() == 3)
        .await;
    let dead = b.presence_instance().to_owned();
    eventually(WAIT, || async {
        if instances(&redis).contains(&dead) {
            Ok(())
        } else {
            Err("pod b never beat")
        }
    })
    .await;
    b.stop_presence_beat();
    // A cleaner took the lock, cleared room:1 and died: its lock outlives
    // it for a while.
    let lock = format!("herald:presence:clean:{dead}");
    redis.cli(&["SET", &lock, "dead-cleaner", "PX", "2500"]);
    let cleared = b.presence_instance().to_owned();
    redis.cli(&["HDEL", "herald:presence:{room:1}", &cleared]);
    redis.cli(&["SREM", &format!("herald:presence:pod:{dead}"), "room:1"]);
    seen_a
        .until("the other rooms cleaned", |all| {
            replay(all) == BTreeSet::from(["user0".into()])
        })
        .await;
    // Only once the dead cleaner's lock expired.
    let holder = redis.cli(&["GET", &lock]);
    assert_ne!(
        holder.trim(),
        "dead-cleaner",
        "cleaned under another's lock"
    );
    eventually(WAIT, || async {
        if instances(&redis).contains(&dead) {
            Err("the dead instance is still listed")
        } else {
            Ok(())
        }
    })
    .await;
}

#[tokio::test]
async fn redis_restarted_empty_gets_each_pods_presence_again() {
    let mut redis = Redis::start().await;
    let ttl = Duration::from_millis(1000);
    let (a, seen_a) = pod(&redis, "a", ttl).await;
    let (b, _) = pod(&redis, "b", ttl).await;
    let t = room();
    a.watch(&t).await.expect("watch");
    a.presence_update(&t, set(&[("alice", 1)], 1))
        .await
        .expect("update");
    b.presence_update(&t, set(&[("bob", 2)], 0))
        .await
        .expect("update");
    seen_a.until("both in", |all| replay(all).len() == 2).await;
    let before = seen_a.all().last().map_or(0, |c| c.position);
    redis.restart_empty().await;
    // Each pod writes its part again; a reader that does not watch sees
    // the whole room in Redis.
    let (c, _) = pod(&redis, "c", ttl).await;
    eventually(WAIT, || async {
        let page = c.presence(&t, None, 10).await.map_err(|e| e.to_string())?;
        if names(&page.members) == ["alice", "bob"] && page.counts.connections == 4 {
            Ok(())
        } else {
            Err(format!("{page:?}"))
        }
    })
    .await;
    // The watching pod's replica never went back, and no one left.
    eventually(WAIT, || async {
        let page = a.presence(&t, None, 10).await.map_err(|e| e.to_string())?;
        if names(&page.members) == ["alice", "bob"] && page.counts.position >= before {
            Ok(())
        } else {
            Err(format!("{page:?}"))
        }
    })
    .await;
    let all = seen_a.all();
    assert_eq!(story(&all, "alice"), ["join"], "{all:?}");
    assert_eq!(story(&all, "bob"), ["join"], "{all:?}");
    let positions: Vec<u64> = all.iter().map(|c| c.position).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "positions rise: {positions:?}"
    );
}

#[tokio::test]
async fn a_10000_member_room_on_four_pods_fits_in_half_a_megabyte_and_rests_without_writes() {
    let redis = Redis::start().await;
    let t = room();
    let mut pods = Vec::new();
    for (p, name) in ["a", "b", "c", "d"].into_iter().enumerate() {
        let (broker, _) = pod(&redis, name, Duration::from_secs(10)).await;
        let users: Vec<String> = (0..2500)
            .map(|i| format!("user-{:05}", p * 2500 + i))
            .collect();
        let update = PresenceUpdate {
            set: users
                .iter()
                .map(|user| {
                    let member = Member {
                        user: Arc::from(user.as_str()),
                        // About 20 bytes: `{"name":"U 00042"}`.
                        info: Some(Bytes::from(format!("{{\"name\":\"U {}\"}}", &user[5..]))),
                    };
                    (member, 1)
                })
                .collect(),
            removed: Vec::new(),
            anonymous: 0,
        };
        broker.presence_update(&t, update).await.expect("update");
        pods.push(broker);
    }
    let counts = pods[0].presence_counts(&t).await.expect("counts");
    assert_eq!((counts.users, counts.connections), (10_000, 10_000));
    let bytes: u64 = ["herald:presence:{room:1}", "herald:presence:{room:1}:pos"]
        .iter()
        .map(|key| {
            let usage = redis.cli(&["MEMORY", "USAGE", key, "SAMPLES", "0"]);
            usage.trim().parse::<u64>().expect("a size")
        })
        .sum();
    println!("presence of a 10,000-member room on 4 pods: {bytes} bytes in redis");
    assert!(bytes <= 512 * 1024, "{bytes} bytes");
    // At rest, pods only beat: two beats of every pod later, the room's
    // position has not moved.
    let before = redis.cli(&["GET", "herald:presence:{room:1}:pos"]);
    let beats = || redis.cli(&["ZRANGE", "herald:presence:pods", "0", "-1", "WITHSCORES"]);
    for _ in 0..2 {
        let seen = beats();
        eventually(WAIT, || async {
            let now = beats();
            // Every score moved: each pod beat.
            let moved = seen
                .lines()
                .zip(now.lines())
                .skip(1)
                .step_by(2)
                .all(|(a, b)| a != b);
            if moved { Ok(()) } else { Err(now) }
        })
        .await;
    }
    assert_eq!(redis.cli(&["GET", "herald:presence:{room:1}:pos"]), before);
}

#[tokio::test]
async fn a_replica_that_missed_changes_reads_the_room_again_and_hands_the_difference() {
    let redis = Redis::start().await;
    let (a, seen_a) = pod(&redis, "a", Duration::from_secs(10)).await;
    let (b, _) = pod(&redis, "b", Duration::from_secs(10)).await;
    let t = room();
    a.watch(&t).await.expect("watch");
    b.presence_update(&t, set(&[("alice", 1)], 0))
        .await
        .expect("update");
    seen_a.until("alice in", |all| replay(all).len() == 1).await;
    // Another instance wrote dave, and the changes up to 5 never reached
    // pod a; then comes 6, dave and erin.
    let client = redis::Client::open(redis.url()).expect("client");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let part = |users: &[&str]| {
        let mut out = vec![0u8];
        for user in users {
            out.push(user.len() as u8);
            out.extend_from_slice(user.as_bytes());
            out.extend_from_slice(&[1, 0]);
        }
        out
    };
    let hash = "herald:presence:{room:1}";
    let field = [&b"5:"[..], &part(&["dave"])].concat();
    let _: () = redis::cmd("HSET")
        .arg(hash)
        .arg("ghost")
        .arg(field)
        .query_async(&mut conn)
        .await
        .expect("hset");
    let _: () = redis::cmd("SET")
        .arg("herald:presence:{room:1}:pos")
        .arg(5)
        .query_async(&mut conn)
        .await
        .expect("set");
    // Something unreadable first: read again, never a panic.
    let _: () = redis::cmd("PUBLISH")
        .arg("herald:{room:1}")
        .arg(&b"!p4:z:ghost:"[..])
        .query_async(&mut conn)
        .await
        .expect("publish");
    let message = [&b"!p6:f:ghost:"[..], &part(&["dave", "erin"])].concat();
    let _: () = redis::cmd("PUBLISH")
        .arg("herald:{room:1}")
        .arg(message)
        .query_async(&mut conn)
        .await
        .expect("publish");
    seen_a
        .until("dave and erin in", |all| {
            replay(all) == BTreeSet::from(["alice".into(), "dave".into(), "erin".into()])
        })
        .await;
    let all = seen_a.all();
    for user in ["alice", "dave", "erin"] {
        assert_eq!(story(&all, user), ["join"], "{user}: {all:?}");
    }
    let positions: Vec<u64> = all.iter().map(|c| c.position).collect();
    assert!(
        positions.windows(2).all(|w| w[0] < w[1]),
        "positions rise: {positions:?}"
    );
    let page = a.presence(&t, None, 10).await.expect("page");
    assert_eq!(names(&page.members), ["alice", "dave", "erin"]);
    assert_eq!(page.counts.position, 6);
}

#[tokio::test]
async fn a_change_redis_did_not_take_is_written_by_a_later_beat() {
    let redis = Redis::start().await;
    let ttl = Duration::from_millis(1000);
    let (a, _) = pod(&redis, "a", ttl).await;
    let (b, _) = pod(&redis, "b", ttl).await;
    let t = room();
    a.presence_update(&t, set(&[("alice", 1)], 0))
        .await
        .expect("update");
    // Redis does not answer: the change fails, and stays this pod's.
    redis.freeze();
    let failed = a.presence_update(&t, set(&[("bob", 1)], 0)).await;
    redis.thaw();
    assert!(failed.is_err(), "{failed:?}");
    eventually(WAIT, || async {
        let page = b.presence(&t, None, 10).await.map_err(|e| e.to_string())?;
        if names(&page.members) == ["alice", "bob"] {
            Ok(())
        } else {
            Err(format!("{page:?}"))
        }
    })
    .await;
}
