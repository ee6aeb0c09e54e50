//! Two releases on one Redis, as staging and production (or two teams) share
//! one: each has its own `redis.prefix`, and neither sees the other's
//! messages, sessions or pods. Pub/sub ignores the database number, so the
//! prefix is all that keeps them apart.

use std::net::SocketAddr;

use serde_json::{Value, json};
use testkit::{Client, Herald, Redis, WAIT, eventually};

use crate::pod::HERALD;

/// A pod of the release whose keys start with `prefix`, rebalancing often so
/// that its pods report their loads.
async fn pod(redis: &Redis, prefix: &str) -> Herald {
    Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_REDIS__PREFIX", prefix),
            ("HERALD_REBALANCE__ENABLED", "true"),
            ("HERALD_REBALANCE__INTERVAL", "100ms"),
        ],
    )
    .await
}

async fn publish(addr: SocketAddr, topic: &str, data: Value) -> Value {
    let body = json!({"topic": topic, "data": data}).to_string();
    let (status, body) = testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_releases_on_one_redis_share_no_topic_session_or_pod() {
    let redis = Redis::start().await;
    let (a1, a2) = (pod(&redis, "a").await, pod(&redis, "a").await);
    let (b1, b2) = (pod(&redis, "b").await, pod(&redis, "b").await);

    // The same topic in both releases: each its own stream and seqs.
    let mut in_a = Client::subscriber(&a2.ws_url(), "news").await;
    let mut in_b = Client::subscriber(&b1.ws_url(), "news").await;
    assert_eq!(publish(a1.addr, "news", json!("for a")).await["seq"], 1);
    assert_eq!(in_a.msg().await, ("news".into(), 1, json!("for a")));
    assert_eq!(publish(b2.addr, "news", json!("for b")).await["seq"], 1);
    // Had a's publish reached b, it would come first.
    assert_eq!(in_b.msg().await, ("news".into(), 1, json!("for b")));
    assert_eq!(
        redis
            .cli(&["EXISTS", "a:{news}:hist", "b:{news}:hist"])
            .trim(),
        "2"
    );

    // A session of release a resumes in a, and is unknown in b.
    let mut client = Client::connect_url(&a1.ws_url()).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("a session")
        .to_owned();
    client.sub(1, "news").await;
    drop(client);
    let key = format!("a:session:{session}");
    eventually(WAIT, || async {
        redis.cli(&["EXISTS", &key]).trim() == "1"
    })
    .await;
    let mut elsewhere = Client::connect_url(&b1.ws_url()).await;
    let welcome = elsewhere.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], false, "{welcome}");
    let mut home = Client::connect_url(&a2.ws_url()).await;
    let welcome = home.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");

    // Each release counts its own two pods, not four.
    for pod in [&a1, &a2, &b1, &b2] {
        eventually(WAIT, || async {
            testkit::metric(pod.addr, "herald_cluster_pods").await == 2.0
        })
        .await;
    }
    assert_eq!(redis.cli(&["HLEN", "a:pods"]).trim(), "2");
    assert_eq!(redis.cli(&["HLEN", "b:pods"]).trim(), "2");
    // Nothing under the default prefix: every key is the release's.
    assert_eq!(redis.cli(&["KEYS", "herald:*"]).trim(), "");
}
