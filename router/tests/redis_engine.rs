//! The Redis engine against a real `redis-server`: seqs, history trimmed by
//! size and by age, recovery, idempotency, and ordered delivery to a pod.

#[path = "../../gateway/tests/common/redis.rs"]
mod redis;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use router::observe::Ignore;
use router::{
    Broker, Deliver, NamespaceSettings, Namespaces, Position, Publication, RedisBroker,
    RedisSettings, Since, Topic,
};

#[derive(Default)]
struct Collect(Mutex<Vec<(u64, Bytes)>>);

impl Deliver for Collect {
    fn deliver(&self, p: &Publication) {
        self.0.lock().expect("lock").push((p.seq, p.data.clone()));
    }
    fn reset(&self, _: &Topic, _: &Position) {}
}

async fn engine(
    redis: &redis::Redis,
    history_size: usize,
    history_ttl: Duration,
) -> (RedisBroker, Arc<Collect>) {
    let namespaces = Namespaces::new(&BTreeMap::from([(
        "default".to_owned(),
        NamespaceSettings {
            history_size,
            history_ttl,
            client_publish: false,
        },
    )]))
    .expect("namespaces");
    let sink = Arc::new(Collect::default());
    let settings = RedisSettings {
        url: redis.url(),
        command_timeout: Duration::from_secs(1),
        linger: Duration::from_millis(100),
    };
    let broker = RedisBroker::connect(
        settings,
        Arc::new(namespaces),
        sink.clone(),
        Arc::new(Ignore),
    )
    .await
    .expect("connect");
    (broker, sink)
}

fn since(seq: u64, epoch: Option<&str>) -> Option<Since> {
    Some(Since {
        seq,
        epoch: epoch.map(str::to_owned),
    })
}

#[tokio::test]
async fn history_is_trimmed_to_its_size_and_recovery_says_so() {
    let redis = redis::Redis::start().await;
    let (broker, _) = engine(&redis, 5, Duration::from_secs(60)).await;
    let topic = Topic::parse("news").expect("topic");
    for i in 1..=8u64 {
        let position = broker
            .publish(&topic, Bytes::from(i.to_string()), None)
            .await
            .expect("publish");
        assert_eq!(position.seq, i);
    }
    let r = broker
        .recover(&topic, since(5, None))
        .await
        .expect("recover");
    assert!(r.recovered);
    assert_eq!(
        r.publications.iter().map(|p| p.seq).collect::<Vec<_>>(),
        vec![6, 7, 8]
    );
    let epoch = r.position.epoch.to_string();
    // 4..=8 are kept: since 3 is the oldest that can be served.
    assert!(
        broker
            .recover(&topic, since(3, Some(&epoch)))
            .await
            .expect("recover")
            .recovered
    );
    assert!(
        !broker
            .recover(&topic, since(2, None))
            .await
            .expect("recover")
            .recovered
    );
    assert!(
        !broker
            .recover(&topic, since(7, Some("elsewhere")))
            .await
            .expect("recover")
            .recovered
    );
    assert!(
        !broker
            .recover(&topic, since(9, None))
            .await
            .expect("recover")
            .recovered
    );
    assert_eq!(redis.cli(&["XLEN", "herald:{news}:hist"]).trim(), "5");
}

#[tokio::test]
async fn history_older_than_its_age_is_not_replayed_and_is_trimmed() {
    let redis = redis::Redis::start().await;
    let (broker, _) = engine(&redis, 100, Duration::from_millis(300)).await;
    let topic = Topic::parse("news").expect("topic");
    for _ in 0..3 {
        broker
            .publish(&topic, Bytes::from_static(b"1"), None)
            .await
            .expect("publish");
    }
    // The history's age is a matter of time passing.
    tokio::time::sleep(Duration::from_millis(400)).await;
    broker
        .publish(&topic, Bytes::from_static(b"1"), None)
        .await
        .expect("publish");
    assert!(
        !broker
            .recover(&topic, since(0, None))
            .await
            .expect("recover")
            .recovered
    );
    let r = broker
        .recover(&topic, since(3, None))
        .await
        .expect("recover");
    assert!(r.recovered);
    assert_eq!(r.publications.len(), 1);
    assert_eq!(
        redis.cli(&["XLEN", "herald:{news}:hist"]).trim(),
        "1",
        "old entries were removed"
    );
}

#[tokio::test]
async fn a_watching_pod_gets_every_publication_in_order_and_a_retry_once() {
    let redis = redis::Redis::start().await;
    let (broker, sink) = engine(&redis, 100, Duration::from_secs(60)).await;
    let (other, _) = engine(&redis, 100, Duration::from_secs(60)).await;
    let topic = Topic::parse("news").expect("topic");
    broker.watch(&topic).await.expect("watch");
    let first = other
        .publish(&topic, Bytes::from_static(b"\"a\""), Some("k"))
        .await
        .expect("publish");
    let again = broker
        .publish(&topic, Bytes::from_static(b"\"a\""), Some("k"))
        .await
        .expect("publish");
    assert_eq!(first, again);
    for i in 0..50u64 {
        other
            .publish(&topic, Bytes::from(i.to_string()), None)
            .await
            .expect("publish");
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while sink.0.lock().expect("lock").len() < 51 {
        assert!(tokio::time::Instant::now() < deadline, "deliveries missing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let seqs: Vec<u64> = sink
        .0
        .lock()
        .expect("lock")
        .iter()
        .map(|(seq, _)| *seq)
        .collect();
    assert_eq!(seqs, (1..=51).collect::<Vec<_>>());
}
