//! Scale-out that moves load: clients piled on one pod spread over the pods
//! added next to it, by themselves, and none of them loses a message on the
//! way (they resume their sessions wherever they land).

#[path = "common/binary.rs"]
mod binary;
mod common;
#[path = "common/follower.rs"]
mod follower;
#[path = "common/redis.rs"]
mod redis;

use std::net::SocketAddr;
use std::time::Duration;

use binary::Herald;
use common::WAIT;
use follower::{Crowd, Follow, Service};
use redis::Redis;
use serde_json::json;
use tokio::sync::watch;
use tokio::time::Instant;

const CLIENTS: usize = 120;

async fn pod(redis: &Redis) -> Herald {
    Herald::pod(
        &redis.url(),
        &[
            ("HERALD_REBALANCE__ENABLED", "true"),
            ("HERALD_REBALANCE__INTERVAL", "300ms"),
            ("HERALD_REBALANCE__MAX_MOVE_FRACTION", "0.2"),
            ("HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE", "10000"),
        ],
    )
    .await
}

async fn connections(addr: SocketAddr) -> u64 {
    common::metric(addr, "herald_connections").await as u64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_spread_over_pods_added_later_and_lose_nothing() {
    const TOTAL: u64 = 400;
    let redis = Redis::start().await;
    let a = pod(&redis).await;
    let (b, c) = (pod(&redis).await, pod(&redis).await);
    // Everyone lands on A, as if B and C had just been added: the Service
    // knows only A until every client is subscribed. Each client acks what
    // it gets and, when its pod asks it to move, waits the advised delay
    // and resumes its session at a pod picked at random.
    let service = Service::new([a.addr]);
    let (_, last) = watch::channel(Some(TOTAL));
    // All subscribed before the publisher starts (120 of them: time to spare).
    let follows = (0..CLIENTS).map(|_| Follow::new(&service, "feed", &last));
    let clients = Crowd::subscribed(follows, WAIT * 3).await;
    service.add(b.addr);
    service.add(c.addr);
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
    for seen in clients.finish(Duration::from_secs(60)).await {
        assert_eq!(seen.processed, (1..=TOTAL).collect::<Vec<_>>(), "{seen:?}");
        assert_eq!(seen.failed_resumes, 0, "{seen:?}");
        assert_eq!(seen.advised_draining, 0, "{seen:?}");
        assert!(seen.problems.is_empty(), "{seen:?}");
        moved += seen.resumes as usize;
    }
    assert!(moved >= CLIENTS / 2, "clients moved: {moved}");
}
