//! Lagging clients caught up from history (issue #25): a subscriber that
//! reads slower than its topic goes is no longer closed (4000) where its
//! namespace keeps history (`on_lag = "catch_up"`, the default there): the
//! topic stops going to it, and once it reads again it is served from
//! history, each seq once and in order, and put back on the live stream.
//! Where history no longer reaches back to it, it gets `reset`;
//! `on_lag = "disconnect"` closes it with 4000 and `"drop_newest"` drops
//! and counts, as the connection's overflow rules did. A healthy subscriber
//! of the same topic gets everything, whatever the slow one does.
//!
//! The slow client is a real WebSocket client (tokio-tungstenite) with a
//! tiny receive buffer that stops reading; the pod's queue holds 8 frames,
//! so that it lags within a few messages once the kernel's buffers are full.
//! Against the embedded broker in-process and the real `herald` binary on a
//! real `redis-server`.

use std::net::SocketAddr;
use std::time::Duration;

use gateway::Config;
use router::{NamespaceSettings, OnLag};
use serde_json::{Value, json};
use testkit::{Client, Gateway, Herald, Redis, WAIT, eventually, metric};

use crate::pod::{HERALD, publish};

/// A receive buffer that holds next to nothing: once the client stops
/// reading, the pod's writes to it block.
const TINY: u32 = 4096;

/// The most a flood publishes before the slow client must have lagged: far
/// more than the kernel's buffers (4 MiB at most on loopback) and the queue.
const MAX_FLOOD: u64 = 1000;

/// Padding per message: the kernel's buffers fill within a few hundred.
const PAD: usize = 16 * 1024;

/// An in-process pod whose queues hold 8 frames, whose stuck writes are
/// never given up on while a test runs, with `namespaces`.
fn config(namespaces: &[(&str, NamespaceSettings)]) -> Config {
    let mut config = Gateway::config();
    config.queue.frames = 8;
    config.websocket.write_timeout = Duration::from_secs(300);
    for (name, settings) in namespaces {
        config
            .namespaces
            .insert((*name).to_owned(), settings.clone());
    }
    config
}

/// A client with a tiny receive buffer, subscribed to `topic`, that reads
/// nothing more until the test says.
async fn slow(url: &str, topic: &str) -> Client {
    let mut client = Client::with_receive_buffer(url, TINY).await;
    client.hello(None).await;
    client.sub(1, topic).await;
    client
}

/// Publishes `{"n": n, "pad": …}` to `topic` from `*n + 1` on until the
/// pod counted a lag of `policy`, then `more` messages; `n` is the last
/// one published (the topic's seq).
async fn flood(addr: SocketAddr, topic: &str, policy: &str, n: &mut u64, more: u64) {
    let pad = "x".repeat(PAD);
    let lags = format!("herald_lag_events_total{{policy=\"{policy}\"}}");
    let start = *n;
    while metric(addr, &lags).await < 1.0 {
        assert!(
            *n - start < MAX_FLOOD,
            "no lag after {} messages",
            *n - start
        );
        for _ in 0..20 {
            *n += 1;
            let (status, answer) = publish(addr, topic, json!({"n": *n, "pad": pad}), None).await;
            assert_eq!(status, 200, "{answer}");
        }
    }
    for _ in 0..more {
        *n += 1;
        let (status, answer) = publish(addr, topic, json!({"n": *n, "pad": pad}), None).await;
        assert_eq!(status, 200, "{answer}");
    }
}

/// Reads `msg`s of a topic: each seq once, in order from `from`, the data
/// its own, up to `to`.
async fn reads_in_order(client: &mut Client, from: u64, to: u64) {
    for seq in from..=to {
        let (_, got, data) = client.msg().await;
        assert_eq!(got, seq, "a gap or a duplicate");
        assert_eq!(data["n"], seq);
    }
}

/// Publishes `{"n": n + 1}` and reads it: the client is on the live stream.
async fn back_live(addr: SocketAddr, topic: &str, client: &mut Client, n: &mut u64) {
    *n += 1;
    let (status, answer) = publish(addr, topic, json!({"n": *n}), None).await;
    assert_eq!(status, 200, "{answer}");
    reads_in_order(client, *n, *n).await;
}

/// Waits until `name` (a counter or gauge of the pod at `addr`) reads `want`.
async fn metric_is(addr: SocketAddr, name: &str, want: f64) {
    eventually(WAIT, || async {
        let value = metric(addr, name).await;
        if value == want {
            Ok(())
        } else {
            Err(format!("{name} is {value}, expected {want}"))
        }
    })
    .await;
}

/// The story of a lagging reader on the pod at `addr`: caught up with every
/// seq once and in order, back live, while a healthy subscriber of the same
/// topic got everything as it came.
async fn a_lagging_reader_is_caught_up(addr: SocketAddr, url: &str) {
    let mut lagging = slow(url, "film").await;
    let mut healthy = Client::subscriber(url, "film").await;
    let (seqs, done) = tokio::sync::watch::channel(0u64);
    let reader = tokio::spawn(async move {
        let mut last = 0;
        loop {
            let (_, seq, data) = healthy.msg().await;
            assert_eq!(seq, last + 1, "the healthy client missed a message");
            assert_eq!(data["n"], seq);
            last = seq;
            seqs.send_replace(seq);
            if data.get("pad").is_none() {
                return healthy;
            }
        }
    });
    let mut n = 0;
    flood(addr, "film", "catch_up", &mut n, 100).await;
    // The healthy client has everything, the slow one still reads nothing.
    let mut done = done;
    let flooded = n;
    tokio::time::timeout(WAIT, done.wait_for(|&seq| seq == flooded))
        .await
        .expect("the healthy client kept up")
        .expect("its reader");
    assert_eq!(
        metric(
            addr,
            "herald_connections_closed_total{reason=\"slow_consumer\"}"
        )
        .await,
        0.0
    );

    // Reading again: every seq once, in order, then live.
    reads_in_order(&mut lagging, 1, n).await;
    metric_is(addr, "herald_lag_catching_up", 0.0).await;
    back_live(addr, "film", &mut lagging, &mut n).await;
    let healthy = tokio::time::timeout(WAIT, reader)
        .await
        .expect("the healthy client read the last one")
        .expect("the healthy client read everything in order");
    let reads = metric(addr, "herald_lag_history_reads_total").await;
    println!("caught up over {reads} reads of history; {n} messages in all");
    assert!(metric(addr, "herald_lag_catch_ups_total{outcome=\"live\"}").await >= 1.0);
    assert_eq!(
        metric(addr, "herald_lag_catch_ups_total{outcome=\"reset\"}").await,
        0.0
    );
    assert!(metric(addr, "herald_lag_history_reads_total").await >= 1.0);
    assert_eq!(metric(addr, "herald_messages_dropped_total").await, 0.0);
    drop((lagging, healthy));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_reader_is_caught_up_from_history_and_back_live_on_the_embedded_broker() {
    let history = NamespaceSettings {
        history_size: 5000,
        ..Default::default()
    };
    let gw = Gateway::with(config(&[("default", history)])).await;
    a_lagging_reader_is_caught_up(gw.addr, &gw.ws_url()).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_reader_is_caught_up_from_history_and_back_live_on_redis() {
    let redis = Redis::start().await;
    let herald = Herald::pod(
        HERALD,
        &redis.url(),
        &[
            ("HERALD_QUEUE__FRAMES", "8"),
            ("HERALD_NAMESPACES__DEFAULT__HISTORY_SIZE", "5000"),
            ("HERALD_WEBSOCKET__WRITE_TIMEOUT", "5m"),
        ],
    )
    .await;
    a_lagging_reader_is_caught_up(herald.addr, &herald.ws_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_so_far_behind_that_history_cannot_bridge_it_gets_reset_and_goes_on_live() {
    let short = NamespaceSettings {
        history_size: 20,
        ..Default::default()
    };
    let gw = Gateway::with(config(&[("default", short)])).await;
    let mut lagging = slow(&gw.ws_url(), "film").await;
    let mut n = 0;
    flood(gw.addr, "film", "catch_up", &mut n, 100).await;

    // What it reads: 1, 2, … without a gap, then `reset` to where the topic
    // is, then what came after, in order; never a silent gap.
    let mut last = 0;
    let reset = loop {
        let message = lagging.recv().await;
        match message["op"].as_str() {
            Some("msg") => {
                let seq = message["seq"].as_u64().expect("seq");
                assert_eq!(seq, last + 1, "a gap or a duplicate before the reset");
                last = seq;
            }
            Some("reset") => break message,
            _ => panic!("unexpected {message}"),
        }
    };
    assert_eq!(reset["topic"], "film");
    let at = reset["seq"].as_u64().expect("seq");
    assert!(
        at > last && at <= n,
        "reset to {at} after {last}, the topic at {n}"
    );
    reads_in_order(&mut lagging, at + 1, n).await;
    metric_is(gw.addr, "herald_lag_catching_up", 0.0).await;
    back_live(gw.addr, "film", &mut lagging, &mut n).await;
    assert_eq!(
        metric(gw.addr, "herald_lag_catch_ups_total{outcome=\"reset\"}").await,
        1.0
    );
    drop(lagging);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_lag_disconnect_a_lagging_reader_is_closed_with_4000() {
    let strict = NamespaceSettings {
        on_lag: Some(OnLag::Disconnect),
        ..Default::default()
    };
    let gw = Gateway::with(config(&[("strict", strict)])).await;
    let mut lagging = slow(&gw.ws_url(), "strict:film").await;
    let mut n = 0;
    flood(gw.addr, "strict:film", "disconnect", &mut n, 0).await;
    assert_eq!(lagging.closed().await, Some(4000));
    assert_eq!(metric(gw.addr, "herald_lag_catching_up").await, 0.0);
    gw.await_metric(
        "herald_connections_closed_total{reason=\"slow_consumer\"}",
        1.0,
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_on_lag_drop_newest_a_lagging_reader_sees_gaps_counted_and_stays() {
    let lossy = NamespaceSettings {
        on_lag: Some(OnLag::DropNewest),
        ..Default::default()
    };
    let gw = Gateway::with(config(&[("lossy", lossy)])).await;
    let mut lagging = slow(&gw.ws_url(), "lossy:film").await;
    let mut n = 0;
    flood(gw.addr, "lossy:film", "drop_newest", &mut n, 20).await;
    assert!(gw.metric("herald_messages_dropped_total").await > 0.0);
    // Reading again: a series with gaps, up to a message published after
    // the flood (again until one finds room); still connected.
    let reader = tokio::spawn(async move {
        let (mut last, mut gaps) = (0, 0);
        loop {
            let (_, seq, data): (String, u64, Value) = lagging.msg().await;
            assert!(seq > last, "a duplicate or a message out of order");
            gaps += u32::from(seq != last + 1);
            last = seq;
            if data.get("after").is_some() {
                return (lagging, gaps);
            }
        }
    });
    eventually(WAIT, || async {
        if reader.is_finished() {
            return Ok(());
        }
        let (status, _) = publish(gw.addr, "lossy:film", json!({"after": true}), None).await;
        assert_eq!(status, 200);
        Err("no message after the flood arrived")
    })
    .await;
    let (lagging, gaps) = reader.await.expect("the reader");
    assert!(gaps > 0, "drops show as gaps");
    assert_eq!(
        metric(gw.addr, "herald_lag_catch_ups_total{outcome=\"live\"}").await,
        0.0
    );
    drop(lagging);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lagging_reader_is_served_its_commands_and_an_unsub_ends_its_catch_up() {
    let history = NamespaceSettings {
        history_size: 5000,
        ..Default::default()
    };
    let gw = Gateway::with(config(&[("default", history)])).await;
    let mut lagging = slow(&gw.ws_url(), "film").await;
    let mut n = 0;
    flood(gw.addr, "film", "catch_up", &mut n, 20).await;
    // Still reading nothing, it leaves the topic it lags in and joins another:
    // the connection reads its commands meanwhile.
    lagging
        .send(json!({"op": "unsub", "id": 2, "topic": "film"}))
        .await;
    lagging
        .send(json!({"op": "sub", "id": 3, "topic": "news"}))
        .await;
    metric_is(
        gw.addr,
        "herald_lag_catch_ups_total{outcome=\"ended\"}",
        1.0,
    )
    .await;
    metric_is(gw.addr, "herald_lag_catching_up", 0.0).await;

    // Reading again: what it was sent of `film`, in order, then the answers.
    let mut last = 0;
    loop {
        let message = lagging.recv().await;
        match message["op"].as_str() {
            Some("msg") => {
                assert_eq!(message["topic"], "film", "{message}");
                let seq = message["seq"].as_u64().expect("seq");
                assert_eq!(seq, last + 1, "a gap or a duplicate");
                last = seq;
            }
            Some("ok") if message["id"] == 2 => {}
            Some("ok") if message["id"] == 3 => break,
            _ => panic!("unexpected {message}"),
        }
    }
    assert!(last < n, "the catch-up stopped with the unsub");
    let (status, _) = publish(gw.addr, "news", json!({"n": 1}), None).await;
    assert_eq!(status, 200);
    let (topic, seq, _) = lagging.msg().await;
    assert_eq!((topic.as_str(), seq), ("news", 1));
    gw.shutdown().await;
}
