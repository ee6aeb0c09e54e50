//! Scale-out that moves load: clients piled on one pod spread over the pods
//! added next to it, by themselves, and none of them loses a message on the
//! way (they resume their sessions wherever they land).

#[path = "common/binary.rs"]
mod binary;
mod common;
#[path = "common/redis.rs"]
mod redis;

use std::net::SocketAddr;
use std::time::Duration;

use binary::Herald;
use common::{Client, WAIT};
use futures_util::StreamExt;
use rand::seq::SliceRandom;
use redis::Redis;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

const CLIENTS: usize = 120;

async fn pod(redis: &Redis) -> Herald {
    let url = redis.url();
    Herald::start(
        &[
            ("HERALD_BROKER", "redis"),
            ("HERALD_REDIS__URL", url.as_str()),
            ("HERALD_SESSION__FLUSH_INTERVAL", "50ms"),
            ("HERALD_REBALANCE__ENABLED", "true"),
            ("HERALD_REBALANCE__INTERVAL", "300ms"),
            ("HERALD_REBALANCE__MAX_MOVE_FRACTION", "0.2"),
            ("HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE", "10000"),
        ],
        &[],
    )
    .await
}

/// A gauge of the pod's `/metrics`.
async fn metric(addr: SocketAddr, name: &str) -> u64 {
    let (_, metrics) = common::http(addr, "GET", "/metrics", &[], b"").await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} in {metrics}"))
}

async fn connections(addr: SocketAddr) -> u64 {
    metric(addr, "herald_connections").await
}

/// A client that acks what it gets and, when its pod asks it to move (or goes
/// away), waits the advised delay and resumes its session at a pod picked at
/// random, as a Kubernetes Service would. Returns the seqs it processed and
/// how many times it moved.
async fn mobile(first: String, pods: Vec<String>, total: u64) -> (Vec<u64>, usize) {
    let mut client = Client::connect_url(&first).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    let mut last = client.sub(1, "feed").await["seq"].as_u64().expect("seq");
    let (mut seqs, mut moves, mut after_ms) = (Vec::new(), 0, 0);
    let deadline = Instant::now() + Duration::from_secs(100);
    while last < total {
        assert!(Instant::now() < deadline, "stream incomplete at {last}");
        let next = tokio::time::timeout(WAIT, client.ws.next())
            .await
            .expect("a frame in time");
        let frame: Value = match next {
            Some(Ok(Message::Text(text))) => serde_json::from_str(&text).expect("json"),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => {
                tokio::time::sleep(Duration::from_millis(after_ms)).await;
                let url = pods.choose(&mut rand::thread_rng()).expect("a pod").clone();
                client = Client::connect_url(&url).await;
                let welcome = client.hello(Some(&session)).await;
                assert_eq!(welcome["resumed"], true, "{welcome}");
                moves += 1;
                continue;
            }
        };
        match frame["op"].as_str() {
            Some("reconnect") => {
                assert_eq!(frame["reason"], "rebalance", "{frame}");
                after_ms = frame["after_ms"].as_u64().expect("after_ms");
            }
            Some("msg") => {
                let seq = frame["seq"].as_u64().expect("seq");
                // The protocol's rule: a seq not above the last one was seen.
                if seq > last {
                    assert_eq!(seq, last + 1, "a gap after {last}");
                    last = seq;
                    seqs.push(seq);
                    client
                        .send(json!({"op": "ack", "topic": "feed", "seq": seq}))
                        .await;
                }
            }
            _ => panic!("unexpected {frame}"),
        }
    }
    (seqs, moves)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_spread_over_pods_added_later_and_lose_nothing() {
    const TOTAL: u64 = 400;
    let redis = Redis::start().await;
    let a = pod(&redis).await;
    let (b, c) = (pod(&redis).await, pod(&redis).await);
    let pods = vec![a.ws_url(), b.ws_url(), c.ws_url()];
    // Everyone lands on A, as if B and C had just been added.
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(tokio::spawn(mobile(a.ws_url(), pods.clone(), TOTAL)));
    }
    // All subscribed (their `ok` said seq 0) before the publisher starts.
    let deadline = Instant::now() + WAIT;
    while metric(a.addr, "herald_subscriptions").await < CLIENTS as u64 {
        assert!(Instant::now() < deadline, "clients did not subscribe");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let publisher = {
        let addr = a.addr;
        tokio::spawn(async move {
            for i in 1..=TOTAL {
                let body = json!({"topic": "feed", "data": i}).to_string();
                let (status, _) =
                    common::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
                assert_eq!(status, 200);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    // The pods even out: each within 20% of the average.
    let started = Instant::now();
    let average = CLIENTS as f64 / 3.0;
    loop {
        let counts = [
            connections(a.addr).await,
            connections(b.addr).await,
            connections(c.addr).await,
        ];
        let total: u64 = counts.iter().sum();
        let even = total == CLIENTS as u64
            && counts
                .iter()
                .all(|&n| (n as f64 - average).abs() <= 0.2 * average);
        if even {
            eprintln!("even after {:?}: {counts:?}", started.elapsed());
            break;
        }
        // Generous: on a loaded CI machine rounds and reconnects slow down.
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "pods never evened out: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    publisher.await.expect("publisher");
    let mut moved = 0;
    for client in clients {
        let (seqs, moves) = client.await.expect("a complete stream");
        assert_eq!(seqs, (1..=TOTAL).collect::<Vec<_>>());
        moved += moves;
    }
    assert!(moved >= CLIENTS / 2, "clients moved: {moved}");
}
