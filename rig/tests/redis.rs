//! The rig's servers as a caller sees them: started on a free port, asked,
//! frozen, restarted (empty, or back to a dump), and a Redis Cluster of
//! another shape than the tests' default.

use std::time::Duration;

use rig::cluster::{RedisCluster, Shape, scratch_dir};
use rig::process::blocking;
use rig::{Error, Redis};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_comes_back_empty_or_to_its_dump_and_its_port_is_its_own() -> Result<(), Error> {
    let mut redis = Redis::start().await?;
    let port = redis.port();
    blocking(|| redis.ok(&["SET", "saved", "1"]))?;
    blocking(|| redis.save())?;
    blocking(|| redis.ok(&["SET", "unsaved", "1"]))?;

    redis.restart_from_save().await?;
    assert_eq!(redis.port(), port, "a restart keeps the port");
    assert_eq!(blocking(|| redis.cli(&["GET", "saved"]))?.trim(), "1");
    assert_eq!(blocking(|| redis.cli(&["GET", "unsaved"]))?.trim(), "");

    redis.restart_empty().await?;
    assert_eq!(blocking(|| redis.cli(&["DBSIZE"]))?.trim(), "0");

    // Another server cannot be started on a port that is taken.
    let dir = scratch_dir("herald-rig-test");
    let taken = Redis::start_in(dir.clone(), Some(port), &[]).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert!(taken.is_err(), "a second server on {port}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_answers_nothing_until_thawed() -> Result<(), Error> {
    let redis = Redis::start().await?;
    redis.freeze()?;
    let frozen = blocking(|| {
        rig::process::run(
            "redis-cli",
            &["-p", &redis.port().to_string(), "PING"],
            None,
            Duration::from_millis(500),
        )
    });
    assert!(
        matches!(frozen, Err(Error::Timeout { .. })),
        "a frozen server answered: {frozen:?}"
    );
    redis.thaw()?;
    assert_eq!(blocking(|| redis.cli(&["PING"]))?.trim(), "PONG");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_three_masters_without_replicas_covers_every_slot() -> Result<(), Error> {
    let shape = Shape {
        masters: 3,
        replicas: 0,
    };
    let cluster =
        RedisCluster::start_shaped(scratch_dir("herald-rig-cluster"), true, shape).await?;
    assert_eq!(cluster.ports().len(), 3);
    let masters = blocking(|| cluster.masters())?;
    assert_eq!(masters, cluster.ports(), "every node a master");
    for port in masters {
        assert!(blocking(|| cluster.replicas_of(port))?.is_empty());
    }
    let slot = RedisCluster::slot_of("{user1000}.following");
    assert_eq!(slot, RedisCluster::slot_of("user1000"), "a hash tag");
    let owner = blocking(|| cluster.master_of_slot(slot))?;
    let said = blocking(|| cluster.cli(owner, &["CLUSTER", "KEYSLOT", "{user1000}.following"]))?;
    assert_eq!(said.trim(), slot.to_string());
    Ok(())
}
