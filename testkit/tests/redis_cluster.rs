#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is the failure report
//! The cluster harness against a real Redis Cluster: what it says about the
//! cluster is what the cluster says, and what it does (move a slot, kill a
//! master) happens.

use std::time::{Duration, Instant};

use testkit::RedisCluster;

/// `redis-cli -c` (following redirections) against the node on `port`.
fn follow(cluster: &RedisCluster, port: u16, args: &[&str]) -> String {
    let mut all = vec!["-c"];
    all.extend(args);
    cluster.cli(port, &all)
}

#[tokio::test]
async fn three_masters_each_with_a_replica_and_keys_on_their_slot_master() {
    let cluster = RedisCluster::start().await;
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");
    assert_eq!(cluster.urls().len(), 6);
    for port in cluster.ports().into_iter().filter(|p| !masters.contains(p)) {
        let info = cluster.cli(port, &["INFO", "replication"]);
        assert!(info.contains("role:slave"), "{port}: {info}");
        assert!(info.contains("master_link_status:up"), "{port}: {info}");
    }

    for key in [
        "plain",
        "123456789",
        "{user:1}:a",
        "a{}b",
        "{}{x}",
        "x{y}z{w}",
    ] {
        let asked = cluster.cli(masters[0], &["CLUSTER", "KEYSLOT", key]);
        assert_eq!(
            asked.trim(),
            RedisCluster::slot_of(key).to_string(),
            "{key}"
        );
    }
    assert_eq!(RedisCluster::slot_of("123456789"), 0x31C3);

    for key in ["{room:1}:seq", "{room:2}:seq", "{room:3}:seq", "topic:x"] {
        let owner = cluster.master_of_slot(RedisCluster::slot_of(key));
        // Written through a node that holds none of it, when there is one.
        let via = masters.iter().copied().find(|&p| p != owner).unwrap();
        assert_eq!(follow(&cluster, via, &["SET", key, "v"]).trim(), "OK");
        assert_eq!(
            cluster.cli(owner, &["GET", key]).trim(),
            "v",
            "{key} on {owner}"
        );
    }
}

#[tokio::test]
async fn a_slot_moves_with_its_keys_in_one_go_or_in_two_halves() {
    let cluster = RedisCluster::start().await;

    let key = "{user:7}:name";
    let slot = RedisCluster::slot_of(key);
    let from = cluster.master_of_slot(slot);
    let to = cluster.masters().into_iter().find(|&p| p != from).unwrap();
    assert_eq!(follow(&cluster, from, &["SET", key, "ada"]).trim(), "OK");
    cluster.migrate_slot(slot, to).await;
    assert_eq!(cluster.master_of_slot(slot), to);
    assert_eq!(cluster.cli(to, &["GET", key]).trim(), "ada");
    let moved = cluster.cli(from, &["GET", key]);
    assert_eq!(moved.trim(), format!("MOVED {slot} 127.0.0.1:{to}"));

    // Mid-migration: a key already moved is asked for at the target; a new
    // one (through `-c`) lands there; the slot is still the old master's.
    let (old, new) = ("{room:9}:old", "{room:9}:new");
    let slot = RedisCluster::slot_of(old);
    let from = cluster.master_of_slot(slot);
    let to = cluster.masters().into_iter().find(|&p| p != from).unwrap();
    assert_eq!(cluster.cli(from, &["SET", old, "1"]).trim(), "OK");
    cluster.begin_migration(slot, to);
    assert_eq!(cluster.master_of_slot(slot), from);
    let asked = cluster.cli(from, &["GET", old]);
    assert_eq!(asked.trim(), format!("ASK {slot} 127.0.0.1:{to}"));
    assert_eq!(follow(&cluster, from, &["SET", new, "2"]).trim(), "OK");
    cluster.finish_migration(slot, to).await;
    assert_eq!(cluster.master_of_slot(slot), to);
    for (key, value) in [(old, "1"), (new, "2")] {
        assert_eq!(cluster.cli(to, &["GET", key]).trim(), value, "{key}");
    }
}

#[tokio::test]
async fn a_replica_takes_over_a_killed_master_with_what_it_was_sent() {
    let mut cluster = RedisCluster::start().await;
    let key = "{room:5}:seq";
    let slot = RedisCluster::slot_of(key);
    let old = cluster.master_of_slot(slot);
    assert_eq!(cluster.cli(old, &["SET", key, "42"]).trim(), "OK");
    cluster.replicated(old).await;

    let killed = Instant::now();
    cluster.kill_master(old);
    let new = cluster
        .wait_for_failover(old, Duration::from_secs(15))
        .await;
    eprintln!("failover from {old} to {new} took {:?}", killed.elapsed());
    assert_ne!(new, old);
    assert_eq!(cluster.master_of_slot(slot), new);
    let masters = cluster.masters();
    assert_eq!(masters.len(), 3, "{masters:?}");
    assert!(!masters.contains(&old), "{masters:?}");
    assert_eq!(cluster.cli(new, &["GET", key]).trim(), "42");
}
