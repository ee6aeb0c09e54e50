//! Replay at the socket's pace, bounded (issue #21, finding 6): a `sub`
//! with `since` streams history a page at a time as its client's queue
//! takes it, so that clients that replay a long history and read nothing
//! cost the pod their queues, not the history each; a pod runs at most
//! `replay.max_concurrent` replays, and refuses more with `unavailable`
//! (a resume: 4003) once `replay.wait` is up; replays read Redis on
//! connections of their own, so a backend's publish never waits behind
//! them; live messages that outgrow the queue during a replay are read
//! from history instead; and history trimmed while a replay pages gives
//! `reset`, never a silent gap.
//!
//! Against the real `herald` binary and a real `redis-server`; the
//! replay-longer-than-the-queue story runs on the embedded broker too.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use testkit::{Client, Gateway, Herald, Redis, WAIT, eventually, metric};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::{Instant, timeout};

use crate::pod::{HERALD, rss};

/// A receive buffer that holds next to nothing: once the client stops
/// reading, the pod's writes to it block.
const TINY: u32 = 4096;

/// A pod on `redis` whose default namespace keeps `history` messages, and
/// whose stuck writes are never given up on while a test runs; plus `env`.
async fn pod(redis: &Redis, history: &str, env: &[(&str, &str)]) -> Herald {
    let mut all = vec![
        ("HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE", history),
        ("HERALD_WEBSOCKET__WRITE_TIMEOUT", "5m"),
    ];
    all.extend_from_slice(env);
    Herald::pod(HERALD, &redis.url(), &all).await
}

/// Publishes `seqs` to `topic` at `addr`, each `{"n": seq, "pad": ...}` of
/// about `bytes`.
async fn publish(addr: SocketAddr, topic: &str, seqs: std::ops::RangeInclusive<u64>, bytes: usize) {
    let pad = "x".repeat(bytes);
    for n in seqs {
        let body = json!({"topic": topic, "data": {"n": n, "pad": pad}}).to_string();
        let (status, answer) =
            testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
        assert_eq!(status, 200, "publish {n}: {answer}");
        let seq = serde_json::from_str::<Value>(&answer).expect("JSON")["seq"].as_u64();
        assert_eq!(seq, Some(n), "the topic's seqs are the test's");
    }
}

/// A client that subscribed to `topic` with `since` and had its `ok`,
/// reading nothing more.
async fn replaying(url: &str, topic: &str, since: u64) -> Client {
    let mut client = Client::with_receive_buffer(url, TINY).await;
    client.hello(None).await;
    client
        .send(json!({"op": "sub", "id": 1, "topic": topic, "since": since}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(ok["recovered"], true, "{ok}");
    client
}

/// Reads `seqs` of a replay: each once, in order, the data its own.
async fn reads_in_order(client: &mut Client, seqs: std::ops::RangeInclusive<u64>) {
    for seq in seqs {
        let (_, got, data) = client.msg().await;
        assert_eq!(got, seq, "a gap or a duplicate");
        assert_eq!(data["n"], seq);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_replay_a_long_history_and_read_nothing_cost_the_pod_their_queues_not_the_history()
 {
    const CLIENTS: u64 = 40;
    const MESSAGES: u64 = 100;
    const BYTES: usize = 60_000;
    let redis = Redis::start().await;
    let herald = pod(&redis, "200", &[]).await;
    publish(herald.addr, "film", 1..=MESSAGES, BYTES).await;
    let before = rss(herald.pid());

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(replaying(&herald.ws_url(), "film", 0).await);
    }
    // Watched for a while: whatever the replays hold, they hold it now,
    // and, paced by clients that read nothing, they take no more later.
    let mut peak = rss(herald.pid());
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    for _ in 0..20 {
        tick.tick().await;
        peak = peak.max(rss(herald.pid()));
    }
    let grown = peak.saturating_sub(before);
    // Each replay holds its queue (half of queue.bytes, 1 MiB, for a
    // replay) and a page (replay.page_bytes, 256 KiB): about 0.8 MiB, where
    // the history is 5.7 MiB. A quarter of the history each is well above
    // the first and well below the second.
    let history = MESSAGES * BYTES as u64;
    let bound = CLIENTS * history / 4;
    println!(
        "rss {} MiB before, {} MiB at peak: {} MiB for {CLIENTS} replays of {} MiB (bound {} MiB)",
        before >> 20,
        peak >> 20,
        grown >> 20,
        history >> 20,
        bound >> 20
    );
    assert!(
        grown < bound,
        "the pod grew {} MiB for {CLIENTS} stalled replays (bound {} MiB)",
        grown >> 20,
        bound >> 20
    );
    assert_eq!(
        metric(herald.addr, "herald_replays_running").await,
        CLIENTS as f64,
        "every replay still runs, at its client's pace"
    );

    // A client that reads now gets its replay whole: once each, in order.
    reads_in_order(&mut clients[0], 1..=MESSAGES).await;
    eventually(WAIT, || async {
        metric(herald.addr, "herald_replays_running").await == (CLIENTS - 1) as f64
    })
    .await;
}

/// A client that subscribes to `topic` with `since` 0 and reads whatever
/// comes as fast as it comes, without parsing it, adding to `drained`.
async fn drain(addr: SocketAddr, topic: &str, drained: Arc<AtomicU64>, sent: mpsc::Sender<()>) {
    let mut stream = timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let upgrade = format!(
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    );
    let sub = json!({"op": "sub", "id": 1, "topic": topic, "since": 0}).to_string();
    let mut request = upgrade.into_bytes();
    for command in [r#"{"op":"hello"}"#, sub.as_str()] {
        request.extend(testkit::raw::encode(0x81, command.as_bytes(), true));
    }
    stream.write_all(&request).await.expect("write");
    sent.send(()).await.expect("the test waits");
    let mut chunk = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = stream.read(&mut chunk).await {
        drained.fetch_add(n as u64, Ordering::Relaxed);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_publish_stays_prompt_while_many_replays_read_history() {
    const CLIENTS: usize = 150;
    const PUBLISHES: u64 = 20;
    let redis = Redis::start().await;
    let herald = pod(&redis, "200", &[]).await;
    publish(herald.addr, "film", 1..=100, 60_000).await;

    let drained = Arc::new(AtomicU64::new(0));
    let (sent, mut all_sent) = mpsc::channel(CLIENTS);
    let clients: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(drain(herald.addr, "film", drained.clone(), sent.clone())))
        .collect();
    for _ in 0..CLIENTS {
        timeout(WAIT, all_sent.recv())
            .await
            .expect("every client subscribes in time");
    }

    // Every replay is asked for at once, each of the whole history: a
    // backend publishes meanwhile, to another topic.
    let at_start = drained.load(Ordering::Relaxed);
    let mut slowest = Duration::ZERO;
    for n in 1..=PUBLISHES {
        let body = json!({"topic": "news", "data": n}).to_string();
        let started = Instant::now();
        let (status, answer) = timeout(
            WAIT,
            testkit::http(herald.addr, "POST", "/v1/publish", &[], body.as_bytes()),
        )
        .await
        .expect("an answer in time");
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, 200, "publish {n} while replays read: {answer}");
    }
    let during = drained.load(Ordering::Relaxed) - at_start;
    println!(
        "{PUBLISHES} publishes, the slowest {slowest:?}, while replays sent {} MiB",
        during >> 20
    );
    assert!(
        during > 0,
        "replays were under way while the backend published"
    );
    // Well within the command timeout (1 s), after which a publish is 503.
    assert!(
        slowest < Duration::from_millis(500),
        "a publish waited {slowest:?} behind the replays"
    );
    for client in clients {
        client.abort();
    }
}

/// Live messages arrive while a replay longer than the queue streams:
/// more than the queue holds, so that what is held aside is dropped and
/// read from history instead. The client gets every seq once, in order.
async fn a_long_replay_with_live_messages_during_it(addr: SocketAddr, url: &str) {
    const HISTORY: u64 = 300;
    const LIVE: u64 = 30;
    const BYTES: usize = 20_000;
    publish(addr, "ticks", 1..=HISTORY, BYTES).await;
    // 6 MB: more than the socket buffers and the queue hold while the
    // client does not read, so the replay is still under way after this.
    let mut client = replaying(url, "ticks", 0).await;
    publish(addr, "ticks", HISTORY + 1..=HISTORY + LIVE, BYTES).await;
    reads_in_order(&mut client, 1..=HISTORY + LIVE).await;
    assert_eq!(
        metric(addr, "herald_replays_overrun_total").await,
        1.0,
        "what was held aside outgrew the queue and was read from history"
    );
    // Live from there.
    publish(addr, "ticks", HISTORY + LIVE + 1..=HISTORY + LIVE + 1, 10).await;
    reads_in_order(&mut client, HISTORY + LIVE + 1..=HISTORY + LIVE + 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_longer_than_the_queue_delivers_everything_in_order_with_live_messages_during_it()
{
    let redis = Redis::start().await;
    // A queue of 8 frames: 30 live messages are more than it holds.
    let herald = pod(&redis, "1000", &[("HERALD_QUEUE__FRAMES", "8")]).await;
    a_long_replay_with_live_messages_during_it(herald.addr, &herald.ws_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_embedded_broker_a_replay_longer_than_the_queue_delivers_everything_in_order() {
    let mut config = Gateway::config();
    config.queue.frames = 8;
    config.websocket.write_timeout = Duration::from_secs(300);
    config.namespaces.insert(
        "default".into(),
        router::NamespaceSettings {
            history_size: 1000,
            ..Default::default()
        },
    );
    let gw = Gateway::with(config).await;
    a_long_replay_with_live_messages_during_it(gw.addr, &gw.ws_url()).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_past_the_cap_is_refused_with_unavailable_and_succeeds_when_retried() {
    let redis = Redis::start().await;
    let cap = [
        ("HERALD_REPLAY__MAX_CONCURRENT", "1"),
        ("HERALD_REPLAY__WAIT", "300ms"),
    ];
    let herald = pod(&redis, "200", &cap).await;
    publish(herald.addr, "film", 1..=100, 60_000).await;
    // Its client reads nothing: the replay keeps the pod's one turn.
    let mut holder = replaying(&herald.ws_url(), "film", 0).await;

    let mut other = Client::connect_url(&herald.ws_url()).await;
    other.hello(None).await;
    let asked = Instant::now();
    other
        .send(json!({"op": "sub", "id": 7, "topic": "film", "since": 0}))
        .await;
    let err = other.expect("err").await;
    assert_eq!(
        (&err["id"], &err["code"], &err["topic"]),
        (&json!(7), &json!("unavailable"), &json!("film")),
        "{err}"
    );
    assert!(asked.elapsed() < WAIT, "refused once replay.wait was up");
    assert_eq!(
        metric(herald.addr, "herald_replays_refused_total").await,
        1.0
    );
    // Without `since` there is nothing to replay, and no turn to wait for.
    other
        .send(json!({"op": "sub", "id": 8, "topic": "news"}))
        .await;
    assert_eq!(other.expect("ok").await["id"], 8);

    // The holder reads its replay to the end, which frees the turn: the
    // retry replays the history whole.
    reads_in_order(&mut holder, 1..=100).await;
    other
        .send(json!({"op": "sub", "id": 9, "topic": "film", "since": 0}))
        .await;
    let ok = other.expect("ok").await;
    assert_eq!((&ok["id"], &ok["recovered"]), (&json!(9), &json!(true)));
    reads_in_order(&mut other, 1..=100).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_that_gets_no_replay_turn_is_told_to_come_back_and_loses_nothing() {
    let redis = Redis::start().await;
    let cap = [
        ("HERALD_REPLAY__MAX_CONCURRENT", "1"),
        ("HERALD_REPLAY__WAIT", "300ms"),
    ];
    let herald = pod(&redis, "200", &cap).await;
    // A session that read 1..=3 of `feed` and acked 1.
    let mut client = Client::connect_url(&herald.ws_url()).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    let epoch = client.sub(1, "feed").await["epoch"].clone();
    publish(herald.addr, "feed", 1..=3, 10).await;
    reads_in_order(&mut client, 1..=3).await;
    client
        .send(json!({"op": "ack", "topic": "feed", "seq": 1, "epoch": epoch}))
        .await;
    drop(client);

    publish(herald.addr, "film", 1..=100, 60_000).await;
    let mut holder = replaying(&herald.ws_url(), "film", 0).await;
    // The resume needs a replay of `feed`, and the one turn is taken.
    let mut back = Client::connect_url(&herald.ws_url()).await;
    assert_eq!(back.hello(Some(&session)).await["resumed"], true);
    assert_eq!(back.closed().await, Some(4003), "come back later");

    reads_in_order(&mut holder, 1..=100).await;
    let mut again = Client::connect_url(&herald.ws_url()).await;
    assert_eq!(again.hello(Some(&session)).await["resumed"], true);
    reads_in_order(&mut again, 2..=3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_trimmed_while_a_replay_pages_gives_a_reset_not_a_gap() {
    const HISTORY: u64 = 200;
    const MORE: u64 = 250;
    let redis = Redis::start().await;
    let herald = pod(&redis, "200", &[("HERALD_QUEUE__FRAMES", "8")]).await;
    publish(herald.addr, "ticks", 1..=HISTORY, 20_000).await;
    let mut client = replaying(&herald.ws_url(), "ticks", 0).await;
    // History keeps the newest 200 only: what the replay had not read
    // yet (beyond the socket buffers, the queue and a page) is gone.
    publish(herald.addr, "ticks", HISTORY + 1..=HISTORY + MORE, 20_000).await;

    let (mut last, mut resets) = (0, Vec::new());
    while last < HISTORY + MORE {
        let message = client.recv().await;
        let seq = message["seq"].as_u64().expect("seq");
        match message["op"].as_str() {
            Some("msg") => assert_eq!(seq, last + 1, "a gap or a duplicate after {last}"),
            Some("reset") => {
                assert!(seq > last, "{message}");
                resets.push(last);
            }
            _ => panic!("unexpected {message}"),
        }
        last = seq;
    }
    assert_eq!(resets.len(), 1, "one reset, after seq {resets:?}");
    assert!(
        resets[0] < HISTORY,
        "the reset came mid-replay, at {resets:?}"
    );
    assert_eq!(metric(herald.addr, "herald_replays_lost_total").await, 1.0);
    // Live after the reset's seq.
    publish(
        herald.addr,
        "ticks",
        HISTORY + MORE + 1..=HISTORY + MORE + 1,
        10,
    )
    .await;
    reads_in_order(&mut client, HISTORY + MORE + 1..=HISTORY + MORE + 1).await;
}
