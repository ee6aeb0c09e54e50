//! Scale-out that moves load: clients piled on one pod spread over the pods
//! added next to it, by themselves, and none of them loses a message on the
//! way (they resume their sessions wherever they land).

use std::time::Duration;

use serde_json::json;
use testkit::Herald;
use testkit::Redis;
use testkit::WAIT;
use testkit::cluster::{Even, even_out};
use testkit::follower::{Crowd, Follow, Service};
use tokio::sync::watch;

use crate::pod::HERALD;

const CLIENTS: usize = 120;

async fn pod(redis: &Redis) -> Herald {
    Herald::pod(
        HERALD,
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
                    testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
                assert_eq!(status, 200);
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };

    // The pods even out: each within 20% of the average. Generous: on a
    // loaded CI machine rounds and reconnects slow down.
    let even = Even {
        clients: CLIENTS,
        connected: 1.0,
        spread: 0.2,
    };
    let (took, counts) = even_out(&[a.addr, b.addr, c.addr], even, Duration::from_secs(60)).await;
    eprintln!("even after {took:?}: {counts:?}");
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
