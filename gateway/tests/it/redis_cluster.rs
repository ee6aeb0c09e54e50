//! Herald on a Redis Cluster (six `redis-server`s, three masters), as a
//! deployment runs it: `herald` pods given `redis.cluster`, clients on one
//! pod, publishers on another, topics on every master; a session that moves
//! pods; a master that fails over under a subscribed client.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{Value, json};
use testkit::{Client, Herald, RedisCluster};

use crate::pod::HERALD;

async fn pod(cluster: &RedisCluster) -> Herald {
    let nodes = cluster.urls().join(",");
    Herald::pod(
        HERALD,
        // Only its user, password and TLS would count: there are none.
        "redis://127.0.0.1",
        &[
            ("HERALD_REDIS__CLUSTER", &nodes),
            ("HERALD_REDIS__COMMAND_TIMEOUT", "1s"),
            ("HERALD_LOG__LEVEL", "info"),
        ],
    )
    .await
}

async fn publish_batch(pod: &Herald, items: Vec<Value>) -> Value {
    let body = json!({ "items": items }).to_string();
    let (status, answer) =
        testkit::http(pod.addr, "POST", "/v1/publish/batch", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    serde_json::from_str(&answer).expect("JSON")
}

/// Topic names whose keys are on every master.
fn spread(cluster: &RedisCluster, n: usize) -> Vec<String> {
    let topics: Vec<String> = (0..n).map(|i| format!("room{i}")).collect();
    let masters: BTreeSet<u16> = topics
        .iter()
        .map(|t| cluster.master_of_slot(RedisCluster::slot_of(t)))
        .collect();
    assert_eq!(masters.len(), 3);
    topics
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_one_pod_get_what_another_publishes_on_every_master_and_resume_anywhere() {
    let cluster = RedisCluster::start().await;
    let (a, mut b) = (pod(&cluster).await, pod(&cluster).await);
    let topics = spread(&cluster, 9);

    // One client on b subscribed to all of them, with a session.
    let mut client = Client::connect_url(&b.ws_url()).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("a session")
        .to_owned();
    for (id, topic) in (1..).zip(&topics) {
        client.sub(id, topic).await;
    }
    // Batches on a, each with items for every topic.
    for round in 1..=3u64 {
        let items = topics
            .iter()
            .map(|t| json!({"topic": t, "data": {"round": round}}))
            .collect();
        let answer = publish_batch(&a, items).await;
        assert!(
            answer["results"]
                .as_array()
                .expect("results")
                .iter()
                .all(|r| r["seq"] == round),
            "{answer}"
        );
    }
    let mut got: Vec<(String, u64)> = Vec::new();
    for _ in 0..topics.len() * 3 {
        let (topic, seq, data) = client.msg().await;
        assert_eq!(data, json!({"round": seq}));
        got.push((topic, seq));
    }
    for topic in &topics {
        let seqs: Vec<u64> = got
            .iter()
            .filter(|(t, _)| t == topic)
            .map(|(_, s)| *s)
            .collect();
        assert_eq!(seqs, [1, 2, 3], "{topic}");
    }
    for topic in &topics {
        client
            .send(json!({"op": "ack", "topic": topic, "seq": 3}))
            .await;
    }

    // b dies; what is published meanwhile reaches the client at a, after
    // what it acked, from each master's history.
    // Saved with every ack (`<acked> <epoch> <topic>` lines), on the master
    // of the session key's slot.
    let key = format!("herald:session:{session}");
    let seed = cluster.masters()[0];
    testkit::eventually(testkit::WAIT, || async {
        let value = cluster.cli(seed, &["-c", "GET", &key]);
        let acked = value.lines().filter(|line| line.starts_with("3 ")).count();
        if acked == topics.len() {
            Ok(())
        } else {
            Err(format!("{key}: {value:?}"))
        }
    })
    .await;
    b.kill9();
    let items = topics
        .iter()
        .map(|t| json!({"topic": t, "data": {"round": 4}}))
        .collect();
    publish_batch(&a, items).await;
    let mut client = Client::connect_url(&a.ws_url()).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    let mut resumed: Vec<(String, u64)> = Vec::new();
    for _ in 0..topics.len() {
        let (topic, seq, _) = client.msg().await;
        resumed.push((topic, seq));
    }
    resumed.sort();
    let expected: Vec<(String, u64)> = {
        let mut e: Vec<(String, u64)> = topics.iter().map(|t| (t.clone(), 4)).collect();
        e.sort();
        e
    };
    assert_eq!(resumed, expected, "exactly what was missed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribed_client_keeps_its_stream_whole_through_a_master_failover() {
    let mut cluster = RedisCluster::start().await;
    let (a, b) = (pod(&cluster).await, pod(&cluster).await);
    let topic = "failing";
    let master = cluster.master_of_slot(RedisCluster::slot_of(topic));
    let mut client = Client::subscriber(&b.ws_url(), topic).await;
    let publish = |n: u64| {
        let addr = a.addr;
        async move {
            let body = json!({"topic": topic, "data": n}).to_string();
            testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await
        }
    };
    for n in 1..=5 {
        assert_eq!(publish(n).await.0, 200);
        assert_eq!(client.msg().await.1, n);
    }
    // Replicated before the kill: the promoted replica has all five.
    assert_eq!(
        cluster.cli(master, &["WAIT", "1", "1000"]).trim(),
        "1",
        "the replica has every write"
    );
    cluster.kill_master(master);
    cluster
        .wait_for_failover(master, Duration::from_secs(20))
        .await;
    // Publishes are refused (503) until the pods find the new master, then
    // go on; the client sees 6, 7, ... with nothing lost, twice or reset.
    let mut n = 6;
    while n <= 10 {
        match publish(n).await {
            (200, _) => n += 1,
            (503, _) => tokio::time::sleep(Duration::from_millis(100)).await,
            (status, body) => panic!("{status} {body}"),
        }
    }
    for expected in 6..=10 {
        let message = client.recv().await;
        assert_eq!(message["op"], "msg", "no reset: {message}");
        assert_eq!(message["seq"], expected, "{message}");
    }
}

/// Issue #23 on a cluster: history read on every master, both ways, and a
/// server-side subscription (the control channel reaches pods whichever
/// node they listen on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages_on_every_master_and_a_server_subscription_reaches_another_pod() {
    let cluster = RedisCluster::start().await;
    let (a, b) = (pod(&cluster).await, pod(&cluster).await);
    let topics = spread(&cluster, 9);
    let items = (1..=3)
        .flat_map(|i| topics.iter().map(move |t| json!({"topic": t, "data": i})))
        .collect();
    publish_batch(&a, items).await;
    for topic in &topics {
        for (query, seqs) in [
            (format!("topic={topic}&since=1"), vec![2, 3]),
            (format!("topic={topic}&reverse=true&limit=2"), vec![3, 2]),
        ] {
            let path = format!("/v1/history?{query}");
            let (status, body) = testkit::http(b.addr, "GET", &path, &[], b"").await;
            assert_eq!(status, 200, "{query}: {body}");
            let page: Value = serde_json::from_str(&body).expect("JSON");
            let got: Vec<u64> = page["publications"]
                .as_array()
                .expect("publications")
                .iter()
                .map(|p| p["seq"].as_u64().expect("seq"))
                .collect();
            assert_eq!(got, seqs, "{query}");
        }
        let path = format!("/v1/history?topic={topic}&since=9");
        let (status, body) = testkit::http(b.addr, "GET", &path, &[], b"").await;
        assert_eq!(status, 410, "{body}");
    }

    // A server-side subscription reaches a user (a token's `sub`): pods
    // that check tokens, on the same cluster.
    drop((a, b));
    let secret = "herald-cluster-subscription-secret-0123456789";
    let nodes = cluster.urls().join(",");
    let env = [
        ("HERALD_REDIS__CLUSTER", nodes.as_str()),
        ("HERALD_REDIS__COMMAND_TIMEOUT", "1s"),
        ("HERALD_AUTH__HMAC_SECRET", secret),
    ];
    let a = Herald::pod(HERALD, "redis://127.0.0.1", &env).await;
    let b = Herald::pod(HERALD, "redis://127.0.0.1", &env).await;
    let token = crate::server_subscriptions::token_signed(secret, "alice", json!({}));
    let mut client = Client::connect_url(&b.ws_url()).await;
    client.send(json!({"op": "hello", "token": token})).await;
    client.expect("welcome").await;
    let topic = &topics[4];
    let body = json!({"user": "alice", "topic": topic, "since": 1}).to_string();
    let (status, answer) =
        testkit::http(a.addr, "POST", "/v1/subscribe", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    let ok = client.expect("ok").await;
    assert_eq!(
        (ok["reason"].as_str(), ok["recovered"].as_bool()),
        (Some("server"), Some(true))
    );
    assert_eq!(client.msg().await.1, 2);
    assert_eq!(client.msg().await.1, 3);
}
