//! The engine's command connection against a real `redis-server`: a reply
//! that says the node is no longer master (`READONLY`), or a command that
//! timed out, makes the next command go over a new connection, which with
//! Sentinel means asking the sentinels again (gateway/tests/it/failover.rs).
//! What cannot get better by waiting fails the start: a setting the engine
//! cannot use, and a password Redis refuses.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use router::observe::Ignore;
use router::redis::StartError;
use router::{
    Broker, Causes, Deliver, NamespaceSettings, Namespaces, Position, Publication, RedisBroker,
    RedisSettings, TlsFiles, Topic,
};
use testkit::Redis;

struct Nobody;

impl Deliver for Nobody {
    fn deliver(&self, _: &Publication, _: Option<&str>) {}
    fn reset(&self, _: &Topic, _: &Position) {}
    fn disconnect(&self, _: &str) {}
}

fn settings(url: String) -> RedisSettings {
    RedisSettings {
        url,
        password: None,
        tls: Default::default(),
        sentinel: None,
        cluster: Vec::new(),
        command_timeout: Duration::from_millis(300),
        linger: Duration::from_millis(100),
        prefix: router::redis::DEFAULT_PREFIX.to_owned(),
        presence: router::PresenceSettings::default(),
    }
}

async fn start(settings: RedisSettings) -> Result<RedisBroker, StartError> {
    let namespaces = Namespaces::new(&BTreeMap::from([(
        "default".to_owned(),
        NamespaceSettings::default(),
    )]))
    .expect("namespaces");
    RedisBroker::start(
        settings,
        Arc::new(namespaces),
        Arc::new(Nobody),
        Arc::new(Ignore),
    )
    .await
}

async fn engine(redis: &Redis) -> RedisBroker {
    start(settings(redis.url())).await.expect("connect")
}

async fn publish(broker: &RedisBroker) -> Result<u64, String> {
    let topic = Topic::parse("news").expect("topic");
    broker
        .publish(&topic, Bytes::from_static(b"1"), None, None)
        .await
        .map(|p| p.seq)
        .map_err(|e| router::Causes(&e).to_string())
}

/// The ids of the connections to `redis` that are neither pub/sub nor
/// `redis-cli` asking.
fn command_connections(redis: &Redis) -> BTreeSet<String> {
    redis
        .cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| line.contains(" sub=0 ") && !line.contains("cmd=client|list"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_demoted_master_sends_the_next_command_over_a_new_connection() {
    let (node, other) = (Redis::start().await, Redis::start().await);
    let broker = engine(&node).await;
    assert_eq!(publish(&broker).await, Ok(1));
    let before = command_connections(&node);
    assert_eq!(before.len(), 1, "{before:?}");

    let port = other.port.to_string();
    assert_eq!(node.cli(&["REPLICAOF", "127.0.0.1", &port]).trim(), "OK");
    let refused = publish(&broker)
        .await
        .expect_err("a replica refuses writes");
    assert!(refused.contains("read only replica"), "{refused}");
    assert_eq!(node.cli(&["REPLICAOF", "NO", "ONE"]).trim(), "OK");

    // (Whether it had synced `other`'s empty data set meanwhile or not.)
    let again = publish(&broker).await;
    assert!(again.is_ok(), "{again:?}");
    let after = command_connections(&node);
    assert_eq!(after.len(), 1, "{after:?}");
    assert!(after.is_disjoint(&before), "{before:?} then {after:?}");
}

#[tokio::test]
async fn a_command_that_timed_out_sends_the_next_over_a_new_connection() {
    let node = Redis::start().await;
    let broker = engine(&node).await;
    assert_eq!(publish(&broker).await, Ok(1));
    let before = command_connections(&node);

    node.freeze();
    let timed_out = publish(&broker)
        .await
        .expect_err("a frozen Redis answers nothing");
    node.thaw();
    assert!(timed_out.contains("timed out"), "{timed_out}");

    // The publish that timed out ran when Redis woke up.
    assert_eq!(publish(&broker).await, Ok(3));
    let after = command_connections(&node);
    assert!(
        after.iter().any(|id| !before.contains(id)),
        "{before:?} then {after:?}"
    );
}

#[tokio::test]
async fn settings_the_engine_cannot_use_fail_its_start_as_a_configuration_error() {
    let mut missing_ca = settings("rediss://127.0.0.1:1".into());
    missing_ca.tls = TlsFiles {
        ca: Some("/nonexistent/herald-ca.pem".into()),
        ..Default::default()
    };
    let mut bad_seed = settings("redis://127.0.0.1:1".into());
    bad_seed.cluster = vec!["redis://:s3cret@10.0.0.1:notaport".into()];
    for (settings, key) in [(missing_ca, "redis.tls_ca"), (bad_seed, "redis.cluster")] {
        match start(settings).await {
            Err(e @ StartError::Config(_)) => {
                let StartError::Config(setting) = &e else {
                    unreachable!()
                };
                assert_eq!(setting.key, key, "{}", Causes(&e));
                let shown = Causes(&e).to_string();
                assert!(shown.starts_with(&format!("redis: `{key}`: ")), "{shown}");
                assert!(!shown.contains("s3cret"), "{shown}");
            }
            Err(e) => panic!("not a configuration error: {}", Causes(&e)),
            Ok(_) => panic!("{key}: started"),
        }
    }
}

#[tokio::test]
async fn a_password_redis_refuses_fails_the_start_with_redis_s_answer_as_its_cause() {
    let redis = Redis::start().await;
    assert_eq!(
        redis.cli(&["CONFIG", "SET", "requirepass", "right"]).trim(),
        "OK"
    );
    let mut wrong = settings(redis.url());
    wrong.password = Some("wrong".into());
    match start(wrong).await {
        Err(e @ StartError::Refused { .. }) => {
            let shown = Causes(&e).to_string();
            eprintln!("{shown}");
            let target = format!(
                "broker unavailable: redis: connecting to 127.0.0.1:{}: ",
                redis.port
            );
            assert!(shown.starts_with(&target), "{shown}");
            assert!(shown.contains("Password authentication failed"), "{shown}");
            assert!(!shown.contains("wrong"), "{shown}");
        }
        Err(e) => panic!("not a refusal: {}", Causes(&e)),
        Ok(_) => panic!("started with a wrong password"),
    }
}
