//! The scale-out and rolling-restart proof at full size, with pods as
//! processes: three `herald` pods sharing a real `redis-server`, 3,000
//! clients with sessions, each picking a live pod at random whenever it
//! (re)connects, as a Kubernetes Service would, and a publisher running
//! throughout. (1) A rolling restart: one pod at a time gets SIGTERM, drains
//! and is replaced by a new process. (2) A fourth pod joins and the pods even
//! out. Through both, every client ends with the complete stream, nothing
//! missing and nothing twice (after the protocol's client rule), and no
//! resume fails. Run with `--no-capture` to see the durations.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use testkit::Herald;
use testkit::Redis;
use testkit::cluster::{Even, connections, even_out};
use testkit::follower::{Crowd, Follow, Followed, Service};
use tokio::net::TcpStream;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::pod::HERALD;

const CLIENTS: usize = 3_000;
/// Each client follows one of these topics (client `i` takes `i % TOPICS`).
const TOPICS: usize = 4;
/// The publisher's pace on each topic: 3,000 clients share two cores with
/// four pods and Redis.
const PUBLISH_EVERY: Duration = Duration::from_millis(200);
/// `shutdown.drain_timeout`: the window a draining pod spreads its clients'
/// returns over.
const DRAIN: &str = "2s";
/// Longest a pod may take to exit after SIGTERM (the drain, then margin).
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// Longest the pods may take to even out (a loaded CI machine is slow).
const BALANCE_WAIT: Duration = Duration::from_secs(60);
/// Longest the clients may take to connect and subscribe.
const SUBSCRIBE_WAIT: Duration = Duration::from_secs(60);
/// Longest one publish may keep failing over to other pods.
const PUBLISH_RETRY: Duration = Duration::from_secs(20);
/// Within this fraction of their average, pods are even (the 20%).
const EVEN: f64 = 0.2;
/// Pods are judged even only while nearly every client is connected (some
/// are always on their way while pods move clients).
const CONNECTED: f64 = 0.98;
/// Longest the clients may take to get the last messages once the
/// publisher has stopped.
const CATCH_UP: Duration = Duration::from_secs(30);
/// Concurrent first connects.
const CONNECTING: usize = 64;

async fn pod(redis: &Redis) -> Herald {
    Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_SHUTDOWN__DRAIN_TIMEOUT", DRAIN),
            ("HERALD_REBALANCE__ENABLED", "true"),
            ("HERALD_REBALANCE__INTERVAL", "500ms"),
            // Every client comes from 127.0.0.1, thousands of them to a pod.
            ("HERALD_WEBSOCKET__MAX_CONNECTIONS_PER_IP", "0"),
            // Deep enough to bridge any client's time away.
            ("HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE", "10000"),
            // Not a line per connection: thousands of them come and go.
            (
                "HERALD_LOG__LEVEL",
                "warn,gateway::server=info,gateway::rebalance=info",
            ),
        ],
    )
    .await
}

/// When the pods count as even: each within [`EVEN`] of their average, with
/// nearly every client connected ([`CONNECTED`]).
const BALANCED: Even = Even {
    clients: CLIENTS,
    connected: CONNECTED,
    spread: EVEN,
};

/// The seqs the publish API answered for one topic, in order.
struct Published {
    seqs: Vec<u64>,
    /// Attempts that failed and were retried at another pod.
    retries: u64,
}

/// Publishes to `topic` every [`PUBLISH_EVERY`], each time to a live pod at
/// random, until `stop`. A failed publish (a pod that went away, a 503) is
/// retried at another pod with the same idempotency key, so that a publish
/// that did happen is answered with its seq rather than made twice.
async fn publish_until(
    service: Service,
    topic: String,
    stop: CancellationToken,
) -> Result<Published, String> {
    let mut published = Published {
        seqs: Vec::new(),
        retries: 0,
    };
    let mut tick = tokio::time::interval(PUBLISH_EVERY);
    for n in 0u64.. {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let key = format!("rollout-{n}");
        let body = json!({"topic": topic, "data": {"n": n}}).to_string();
        let given_up = Instant::now() + PUBLISH_RETRY;
        let seq = loop {
            let answer = match service.pick() {
                Some(pod) => publish(pod, &key, &body).await,
                None => Err("no live pod".to_owned()),
            };
            match answer {
                Ok(seq) => break seq,
                Err(e) if Instant::now() >= given_up => {
                    return Err(format!("publish {n} to {topic}: {e}"));
                }
                Err(_) => {
                    published.retries += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        published.seqs.push(seq);
    }
    Ok(published)
}

/// One `POST /v1/publish`: the seq, or why not.
async fn publish(pod: SocketAddr, key: &str, body: &str) -> Result<u64, String> {
    let mut stream = tokio::time::timeout(testkit::http::HTTP_WAIT, TcpStream::connect(pod))
        .await
        .map_err(|_| format!("connect to {pod} timed out"))?
        .map_err(|e| format!("connect to {pod}: {e}"))?;
    let request = format!(
        "POST /v1/publish HTTP/1.1\r\nHost: {pod}\r\nContent-Type: application/json\r\n\
         Idempotency-Key: {key}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, answer) = testkit::http::request(&mut stream, &request)
        .await
        .map_err(|e| format!("{pod}: {e}"))?;
    if status != 200 {
        return Err(format!("{pod}: {status} {answer}"));
    }
    serde_json::from_str::<Value>(&answer)
        .ok()
        .and_then(|a| a["seq"].as_u64())
        .ok_or_else(|| format!("{pod}: no seq in {answer}"))
}

/// What is wrong with one client's stream, if anything.
fn judge(client: usize, topic: &str, last: u64, seen: &Followed) -> Option<String> {
    let mut wrong = Vec::new();
    if let Some(why) = &seen.incomplete {
        wrong.push(why.clone());
    }
    if seen.started_after != 0 {
        wrong.push(format!("subscribed after seq {}", seen.started_after));
    }
    if seen.processed.iter().copied().ne(1..=last) {
        let missing = (1..=last)
            .filter(|s| seen.processed.binary_search(s).is_err())
            .count();
        wrong.push(format!(
            "processed {} seqs of 1..={last} ({missing} missing, first {:?}, last {:?})",
            seen.processed.len(),
            seen.processed.first(),
            seen.processed.last()
        ));
    }
    if seen.failed_resumes > 0 {
        wrong.push(format!("{} resumes not resumed", seen.failed_resumes));
    }
    wrong.extend(seen.problems.iter().take(3).cloned());
    (!wrong.is_empty()).then(|| format!("client {client} ({topic}): {}", wrong.join("; ")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_and_a_fourth_pod_lose_nothing() {
    let began = Instant::now();
    let redis = Redis::start().await;
    let mut pods = Vec::new();
    for _ in 0..3 {
        pods.push(pod(&redis).await);
    }
    // Replaced pods stay here until the end: their output shows if the test fails.
    let mut retired = Vec::new();
    let service = Service::new(pods.iter().map(|p| p.addr));
    let topics: Vec<String> = (0..TOPICS).map(|t| format!("rollout-{t}")).collect();
    let (lasts, last_rx): (Vec<_>, Vec<_>) = (0..TOPICS).map(|_| watch::channel(None)).unzip();

    // The clients: connected and subscribed before anything is published.
    let gate = Arc::new(Semaphore::new(CONNECTING));
    let follows = (0..CLIENTS).map(|i| Follow {
        gate: Some(gate.clone()),
        ..Follow::new(&service, &topics[i % TOPICS], &last_rx[i % TOPICS])
    });
    let connecting = Instant::now();
    let clients = Crowd::subscribed(follows, SUBSCRIBE_WAIT).await;
    let pods_now: Vec<_> = pods.iter().map(|p| p.addr).collect();
    let mut counts = Vec::new();
    for pod in &pods_now {
        counts.push(connections(*pod).await);
    }
    eprintln!(
        "{CLIENTS} clients subscribed in {:?}: {counts:?}",
        connecting.elapsed()
    );

    let stop = CancellationToken::new();
    // One publisher per topic, so that a slow answer on one does not hold
    // up the others.
    let publishers: Vec<_> = topics
        .iter()
        .map(|topic| tokio::spawn(publish_until(service.clone(), topic.clone(), stop.clone())))
        .collect();

    // (1) The rolling restart: one pod at a time, as Kubernetes does it.
    let rolling = Instant::now();
    for (k, slot) in pods.iter_mut().enumerate() {
        let signalled = Instant::now();
        // The endpoint goes as the pod starts terminating.
        service.remove(slot.addr);
        slot.sigterm();
        let status = slot
            .wait_exit(EXIT_WAIT)
            .await
            .unwrap_or_else(|| panic!("pod {k} still running {EXIT_WAIT:?} after SIGTERM"));
        assert_eq!(status.code(), Some(0), "pod {k} exit status {status}");
        let drained = signalled.elapsed();
        let starting = Instant::now();
        let new = pod(&redis).await;
        // Ready: its endpoint joins.
        service.add(new.addr);
        retired.push(std::mem::replace(slot, new));
        eprintln!(
            "pod {k}: drained and exited in {drained:?}, replacement ready in {:?}",
            starting.elapsed()
        );
    }
    let restarted = rolling.elapsed();
    let three: Vec<_> = pods.iter().map(|p| p.addr).collect();
    let (settled, counts) = even_out(&three, BALANCED, BALANCE_WAIT).await;
    eprintln!("rolling restart of 3 pods: {restarted:?}; then even in {settled:?}: {counts:?}");

    // (2) A fourth pod joins.
    let fourth = pod(&redis).await;
    service.add(fourth.addr);
    pods.push(fourth);
    let four: Vec<_> = pods.iter().map(|p| p.addr).collect();
    let (balanced, counts) = even_out(&four, BALANCED, BALANCE_WAIT).await;
    eprintln!("fourth pod: 4 pods even in {balanced:?}: {counts:?}");

    // The end: the publisher stops, every client gets to its topic's last seq.
    stop.cancel();
    let mut published = Vec::new();
    for (t, publisher) in publishers.into_iter().enumerate() {
        let topic = publisher
            .await
            .expect("a publisher task")
            .unwrap_or_else(|e| panic!("the publisher gave up: {e}"));
        let last = topic.seqs.last().copied().unwrap_or(0);
        assert!(
            topic.seqs.iter().copied().eq(1..=last),
            "topic {t}: the publish API answered seqs other than 1..={last}"
        );
        lasts[t].send_replace(Some(last));
        published.push(topic);
    }
    let ending = Instant::now();
    let mut wrong = Vec::new();
    let mut totals = Followed::default();
    for (i, seen) in clients.finish(CATCH_UP).await.into_iter().enumerate() {
        let t = i % TOPICS;
        let last = published[t].seqs.last().copied().unwrap_or(0);
        if let Some(why) = judge(i, &topics[t], last, &seen) {
            wrong.push(why);
        }
        totals.processed.extend_from_slice(&seen.processed);
        totals.wire_duplicates += seen.wire_duplicates;
        totals.resumes += seen.resumes;
        totals.failed_resumes += seen.failed_resumes;
        totals.resubscribed.extend(seen.resubscribed);
        for (why, n) in seen.refused {
            *totals.refused.entry(why).or_default() += n;
        }
        totals.advised_draining += seen.advised_draining;
        totals.advised_rebalance += seen.advised_rebalance;
        totals.closes.extend(seen.closes);
    }
    let count = |code: Option<u16>| totals.closes.iter().filter(|c| **c == code).count();
    eprintln!(
        "published {} messages ({} retried attempts); delivered {} (processed {}, \
         {} raw duplicates dropped by the client rule); caught up {:?} after the last publish",
        published.iter().map(|p| p.seqs.len()).sum::<usize>(),
        published.iter().map(|p| p.retries).sum::<u64>(),
        totals.processed.len() as u64 + totals.wire_duplicates,
        totals.processed.len(),
        totals.wire_duplicates,
        ending.elapsed(),
    );
    eprintln!(
        "moves: {} resumes ({} failed); advice: {} draining, {} rebalance; closes: \
         {} with 1012, {} with 4002, {} without a close frame; whole test {:?}",
        totals.resumes,
        totals.failed_resumes,
        totals.advised_draining,
        totals.advised_rebalance,
        count(Some(1012)),
        count(Some(4002)),
        count(None),
        began.elapsed(),
    );
    eprintln!("connect attempts that failed: {:?}", totals.refused);
    eprintln!(
        "subscriptions the clients made again after an `err`: {} {:?}",
        totals.resubscribed.len(),
        totals.resubscribed.first()
    );
    assert!(
        wrong.is_empty(),
        "{} of {CLIENTS} clients did not get a complete, duplicate-free stream:\n{}",
        wrong.len(),
        wrong
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    drop(retired);
}
