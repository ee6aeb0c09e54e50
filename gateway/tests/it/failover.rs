//! Redis under Sentinel: the master dies (`kill -9`) while a publisher
//! publishes without pause, the sentinels promote the replica, and the pods
//! follow them there, their command connections and their pub/sub
//! connections alike. Subscribers stay connected and see no duplicate and
//! no silent gap: within an epoch their seqs run on by one, and only a
//! `reset` may jump.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{Value, json};
use testkit::sentinel::{MASTER_NAME, SentinelGroup};
use testkit::{Client, Herald, WAIT, eventually, metric};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::pod::HERALD;

/// Longest the pods may take to publish again after the master died: the
/// sentinels' detection ([`testkit::sentinel::DOWN_AFTER`]), agreement and
/// promotion, and the pod's next attempt.
const FAILOVER_WAIT: Duration = Duration::from_secs(20);

/// A pod that finds the master through the group's sentinels.
async fn pod(group: &SentinelGroup) -> Herald {
    let addresses = group.addresses().join(",");
    Herald::pod(
        HERALD,
        // Host and port are not used: the sentinels say where the master is.
        "redis://127.0.0.1",
        &[
            ("HERALD_REDIS__SENTINEL__MASTER_NAME", MASTER_NAME),
            ("HERALD_REDIS__SENTINEL__ADDRESSES", &addresses),
            ("HERALD_REDIS__COMMAND_TIMEOUT", "500ms"),
            // History reaches over the seconds the pub/sub connection is
            // away: what was published meanwhile is filled, not reset.
            ("HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE", "2000"),
        ],
    )
    .await
}

/// Publishes over HTTP: the status and the answer.
async fn publish(addr: SocketAddr, topic: &str, data: Value) -> (u16, Value) {
    let body = json!({"topic": topic, "data": data}).to_string();
    let (status, body) = testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// What a subscriber was told, in order.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Msg(u64, Value),
    Reset(String, u64),
}

/// A subscriber of `topic` whose messages a task records: where its
/// subscription started (epoch, seq) and what came since.
struct Recorder {
    start: Position,
    events: Arc<Mutex<Vec<Event>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Recorder {
    async fn new(url: &str, topic: &str) -> Self {
        let mut client = Client::connect_url(url).await;
        client.hello(None).await;
        let ok = client.sub(1, topic).await;
        let start = (
            ok["epoch"].as_str().expect("epoch").to_owned(),
            ok["seq"].as_u64().expect("seq"),
        );
        let events = Arc::new(Mutex::new(Vec::new()));
        let recorded = events.clone();
        let task = tokio::spawn(async move {
            // No timeout per message: during the failover nothing comes for
            // seconds. The test bounds its own waits.
            while let Some(Ok(frame)) = client.ws.next().await {
                let Message::Text(text) = frame else { continue };
                let m: Value = serde_json::from_str(&text).expect("JSON");
                let event = match m["op"].as_str() {
                    Some("msg") => Event::Msg(m["seq"].as_u64().expect("seq"), m["data"].clone()),
                    Some("reset") => Event::Reset(
                        m["epoch"].as_str().expect("epoch").to_owned(),
                        m["seq"].as_u64().expect("seq"),
                    ),
                    _ => panic!("unexpected {m}"),
                };
                recorded.lock().expect("lock").push(event);
            }
        });
        Self {
            start,
            events,
            task,
        }
    }

    fn events(&self) -> Vec<Event> {
        self.events.lock().expect("lock").clone()
    }

    /// Checks the stream so far against what the publisher was answered
    /// (`published`: data by epoch and seq): every message is the next seq
    /// of its epoch, or the first after a `reset`; it carries what was
    /// published at that seq; none comes twice. Where the stream stands.
    #[track_caller]
    fn check(&self, published: &HashMap<Position, Value>) -> (Position, usize) {
        let (mut epoch, mut last) = self.start.clone();
        let mut seen = HashSet::new();
        let mut resets = 0;
        for event in self.events() {
            match event {
                Event::Msg(seq, data) => {
                    assert_eq!(
                        seq,
                        last + 1,
                        "after {last} in {epoch}, {seq} without a reset: {:?}",
                        self.events()
                    );
                    if let Some(expected) = published.get(&(epoch.clone(), seq)) {
                        assert_eq!(&data, expected, "seq {seq} of {epoch}");
                    }
                    assert!(seen.insert(data.to_string()), "{data} twice");
                    last = seq;
                }
                Event::Reset(new_epoch, seq) => {
                    (epoch, last) = (new_epoch, seq);
                    resets += 1;
                }
            }
        }
        ((epoch, last), resets)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What the publisher was answered, attempt by attempt.
#[derive(Default)]
struct Published {
    attempts: Vec<Attempt>,
}

struct Attempt {
    at: Instant,
    /// Where the publish landed (and what it was); `None` if refused.
    landed: Option<(Position, Value)>,
}

/// (epoch, seq).
type Position = (String, u64);

impl Published {
    fn successes_since(&self, since: Instant) -> usize {
        self.attempts
            .iter()
            .filter(|a| a.at >= since && a.landed.is_some())
            .count()
    }

    fn by_position(&self) -> HashMap<Position, Value> {
        let mut map = HashMap::new();
        for (position, data) in self.attempts.iter().filter_map(|a| a.landed.as_ref()) {
            let earlier = map.insert(position.clone(), data.clone());
            assert!(
                earlier.is_none(),
                "two publishes were answered {position:?}: {earlier:?} and {data}"
            );
        }
        map
    }
}

/// Publishes `{"n": i}` to `topic` at `addr`, one after the other, until
/// told to stop.
fn publisher(
    addr: SocketAddr,
    topic: &'static str,
    log: Arc<Mutex<Published>>,
    mut stop: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for n in 0u64.. {
            if *stop.borrow_and_update() {
                return;
            }
            let data = json!({"n": n});
            let (status, answer) = publish(addr, topic, data.clone()).await;
            let landed = (status == 200).then(|| {
                let epoch = answer["epoch"].as_str().expect("epoch").to_owned();
                ((epoch, answer["seq"].as_u64().expect("seq")), data)
            });
            assert!(status == 200 || status == 503, "{status} {answer}");
            log.lock().expect("lock").attempts.push(Attempt {
                at: Instant::now(),
                landed,
            });
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_follow_the_sentinels_to_the_promoted_replica_and_subscribers_lose_nothing_silently() {
    let mut group = SentinelGroup::start().await;
    let (a, b) = (pod(&group).await, pod(&group).await);
    let mut recorders = Vec::new();
    for url in [a.ws_url(), b.ws_url()] {
        for _ in 0..2 {
            recorders.push(Recorder::new(&url, "live").await);
        }
    }
    let log = Arc::new(Mutex::new(Published::default()));
    let (stop, stopped) = watch::channel(false);
    let publishing = publisher(a.addr, "live", log.clone(), stopped);
    let start = Instant::now();
    eventually(WAIT, || async {
        log.lock().expect("lock").successes_since(start) >= 20
    })
    .await;

    let old = group.master.port;
    group.master.stop(); // SIGKILL
    let killed = Instant::now();
    let promoted = group.wait_for_failover(old, FAILOVER_WAIT).await;
    assert_eq!(promoted, group.replica.port);
    eventually(FAILOVER_WAIT, || async {
        log.lock().expect("lock").successes_since(killed) >= 1
    })
    .await;
    let first_after = log
        .lock()
        .expect("lock")
        .attempts
        .iter()
        .find(|a| a.at >= killed && a.landed.is_some())
        .map(|a| a.at - killed);
    eprintln!("publishing again {first_after:?} after the kill");
    // It goes on: the command connections are at the new master.
    let again = Instant::now();
    eventually(WAIT, || async {
        log.lock().expect("lock").successes_since(again) >= 20
    })
    .await;

    // A topic nobody watched before the failover: its subscription is made
    // on the pub/sub connection that moved (once it is up: a `sub` while it
    // reconnects is refused with `unavailable`).
    eventually(FAILOVER_WAIT, || async {
        metric(b.addr, "herald_redis_pubsub_up").await == 1.0
    })
    .await;
    let mut late = Client::subscriber(&b.ws_url(), "after").await;
    assert_eq!(publish(a.addr, "after", json!("late")).await.0, 200);
    assert_eq!(late.msg().await, ("after".into(), 1, json!("late")));

    stop.send(true).expect("the publisher runs");
    publishing.await.expect("the publisher");
    let (status, last) = publish(a.addr, "live", json!("last")).await;
    assert_eq!(status, 200, "{last}");
    let target = (
        last["epoch"].as_str().expect("epoch").to_owned(),
        last["seq"].as_u64().expect("seq"),
    );
    let published = log.lock().expect("lock").by_position();
    for (i, recorder) in recorders.iter().enumerate() {
        eventually(WAIT, || async {
            let (at, _) = recorder.check(&published);
            (at == target)
                .then_some(())
                .ok_or(format!("subscriber {i} at {at:?}, not {target:?}"))
        })
        .await;
        let (_, resets) = recorder.check(&published);
        let events = recorder.events();
        let around: Vec<_> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e, Event::Reset(..)))
            .flat_map(|(j, _)| events[j.saturating_sub(2)..(j + 3).min(events.len())].to_vec())
            .collect();
        eprintln!(
            "subscriber {i}: {resets} resets {around:?} start {:?}",
            recorder.start
        );
    }
    for pod in [&a, &b] {
        assert_eq!(metric(pod.addr, "herald_redis_pubsub_up").await, 1.0);
    }
    let attempts = log.lock().expect("lock").attempts.len();
    let failed = log
        .lock()
        .expect("lock")
        .attempts
        .iter()
        .filter(|a| a.landed.is_none())
        .count();
    eprintln!("{attempts} publishes, {failed} refused with 503");
}

/// The replica is cut off from the master (its resync refused), the master
/// acknowledges publishes the replica never gets, and dies: the promoted
/// replica has the topic at an older seq. Its next publishes must not pass
/// for the ones subscribers already have: a `reset` to a new epoch says the
/// history went back, and what follows arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_promoted_replica_that_missed_acknowledged_publishes_resets_subscribers() {
    let mut group = SentinelGroup::start().await;
    let herald = pod(&group).await;
    let recorder = Recorder::new(&herald.ws_url(), "live").await;
    for n in 1..=5 {
        assert_eq!(publish(herald.addr, "live", json!(n)).await.0, 200);
    }
    let replicated = || async {
        let seq = group.replica.cli(&["HGET", "herald:{live}:meta", "seq"]);
        (seq.trim() == "5")
            .then_some(())
            .ok_or(format!("the replica has seq {seq:?}"))
    };
    eventually(WAIT, replicated).await;

    // The replica's link is cut and cannot come back: its user may not sync.
    let master = &group.master;
    assert_eq!(
        master
            .cli(&["ACL", "SETUSER", "default", "-psync", "-sync"])
            .trim(),
        "OK"
    );
    master.cli(&["CLIENT", "KILL", "TYPE", "replica"]);
    eventually(WAIT, || async {
        group
            .replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:down")
    })
    .await;
    let mut old_epoch = None;
    for n in 6..=8 {
        let (status, answer) = publish(herald.addr, "live", json!(n)).await;
        assert_eq!((status, &answer["seq"]), (200, &json!(n)));
        old_epoch = answer["epoch"].as_str().map(str::to_owned);
    }
    eventually(WAIT, || async { recorder.events().len() == 8 }).await;

    let old = group.master.port;
    group.master.stop();
    group.wait_for_failover(old, FAILOVER_WAIT).await;
    // The replica holds 5: the next publishes get seqs the subscriber has.
    let mut after = Vec::new();
    eventually(FAILOVER_WAIT, || async {
        publish(herald.addr, "live", json!("after-0")).await.0 == 200
    })
    .await;
    for n in 1..=4 {
        let (status, answer) = publish(herald.addr, "live", json!(format!("after-{n}"))).await;
        assert_eq!(status, 200, "{answer}");
        after.push(answer);
    }
    let new_epoch = after[0]["epoch"].as_str().expect("epoch").to_owned();
    assert_ne!(
        Some(new_epoch.clone()),
        old_epoch,
        "a new epoch after going back"
    );
    // The subscriber is told (the pod's pub/sub may follow the failover after
    // those publishes: the reset then says it goes on after them), and what
    // is published from then on arrives.
    eventually(WAIT, || async {
        let events = recorder.events();
        let reset = events
            .iter()
            .any(|e| matches!(e, Event::Reset(epoch, _) if *epoch == new_epoch));
        reset
            .then_some(())
            .ok_or(format!("no reset into the new epoch: {events:?}"))
    })
    .await;
    let (status, answer) = publish(herald.addr, "live", json!("after-5")).await;
    assert_eq!(status, 200, "{answer}");
    let last = Event::Msg(answer["seq"].as_u64().expect("seq"), json!("after-5"));
    eventually(WAIT, || async {
        let events = recorder.events();
        if events.contains(&last) {
            Ok(())
        } else {
            Err(format!("the subscriber has {events:?}"))
        }
    })
    .await;
    let (_, resets) = recorder.check(&HashMap::new());
    assert!(resets >= 1, "{:?}", recorder.events());
}
