#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! The connection's life: `reconnect` advice from a draining pod honoured
//! (the client resumes at the other pod, missing nothing), a terminal close
//! ends the client with a typed error, a silent connection is taken for
//! dead.

mod common;

use std::time::Duration;

use common::{messages, seqs, until};
use futures_util::{SinkExt, StreamExt};
use gateway::config::BrokerKind;
use herald_client::{Acks, Cause, Client, Cut, Error, Event, State};
use serde_json::json;
use testkit::{Gateway, Redis, WAIT};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

/// A pod of a cluster on `redis`, draining within half a second.
async fn pod(redis: &Redis) -> Gateway {
    let mut config = Gateway::config();
    config.broker = BrokerKind::Redis;
    config.redis.url = redis.url();
    config.session.flush_interval = Duration::from_millis(50);
    config.shutdown.drain_timeout = Duration::from_millis(500);
    Gateway::with(config).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_draining_pod_s_advice_is_honoured_and_the_client_resumes_at_the_other() {
    let redis = Redis::start().await;
    let (a, b) = (pod(&redis).await, pod(&redis).await);
    let b_url = b.ws_url();
    let (client, mut events) = Client::builder([a.ws_url(), b.ws_url()]).build().unwrap();
    client.subscribe("feed", None).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    for i in 1..=10 {
        b.publish("feed", json!(i)).await;
    }
    let mut others = Vec::new();
    let mut got = messages(&mut events, 10, &mut others).await;

    let draining = tokio::spawn(a.shutdown());
    let (advice, left) = until(&mut events, |e| match e {
        Event::State(State::Disconnected { close, advice, .. }) => {
            assert_eq!(*close, Some(1012), "{e:?}");
            Some((advice.clone().expect("reconnect advice"), Instant::now()))
        }
        _ => None,
    })
    .await;
    assert_eq!(advice.reason, "draining");
    let back = until(&mut events, |e| match e {
        Event::State(State::Connecting { url, .. }) => Some((url.clone(), Instant::now())),
        _ => None,
    })
    .await;
    assert_eq!(back.0, b_url);
    assert!(
        back.1 + Duration::from_millis(20) >= left + advice.after,
        "came back {:?} after the close, advised {:?}",
        back.1 - left,
        advice.after
    );
    for i in 11..=20 {
        b.publish("feed", json!(i)).await;
    }
    got.extend(messages(&mut events, 10, &mut others).await);
    assert_eq!(
        seqs(&got),
        (1..=20).collect::<Vec<_>>(),
        "once each, in order"
    );
    assert!(
        others
            .iter()
            .any(|e| matches!(e, Event::State(State::Resumed { url, .. }) if *url == b_url)),
        "{others:?}"
    );
    tokio::time::timeout(WAIT, draining).await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_terminal_close_stops_the_client_with_a_typed_error() {
    let gateway = Gateway::start().await;
    let (client, mut events) = Client::builder([gateway.ws_url()]).build().unwrap();
    client.subscribe("news", None).unwrap();
    let session = until(&mut events, |e| match e {
        Event::State(State::Connected { session, .. }) => Some(session.clone()),
        _ => None,
    })
    .await;
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    // Another connection takes the session over: ours is closed with 4501,
    // which says "do not come back".
    let mut other = testkit::Client::connect(&gateway).await;
    assert_eq!(other.hello(Some(&session)).await["resumed"], true);
    let e = until(&mut events, |e| match e {
        Event::Error(e) => Some(e.clone()),
        _ => None,
    })
    .await;
    assert!(matches!(e, Error::Closed { code: 4501, .. }), "{e:?}");
    assert!(e.is_terminal());
    let end = tokio::time::timeout(WAIT, events.next()).await.unwrap();
    assert!(end.is_none(), "the stream ends: {end:?}");
    assert!(matches!(client.subscribe("x", None), Err(Error::Stopped)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_whose_pings_stop_is_taken_for_dead() {
    // A server that upgrades, answers `hello` with a 200 ms ping interval,
    // then says nothing more (a path that died without a word).
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let mut kept = Vec::new();
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut ws = tokio_tungstenite::accept_async(tcp).await.unwrap();
            let _hello = ws.next().await;
            let welcome =
                json!({"op": "welcome", "session": "s", "ping_ms": 200, "resumed": false});
            ws.send(Message::text(welcome.to_string())).await.unwrap();
            kept.push(ws);
        }
    });
    let (_client, mut events) = Client::builder([url])
        .ping_grace(Duration::from_millis(300))
        .build()
        .unwrap();
    until(&mut events, |e| {
        matches!(e, Event::State(State::Connected { .. })).then_some(())
    })
    .await;
    // Within WAIT: the default (25 s pings and 5 s of grace) would be too late.
    let cause = until(&mut events, |e| match e {
        Event::State(State::Disconnected { cause, .. }) => Some(cause.clone()),
        _ => None,
    })
    .await;
    assert_eq!(cause, Cause::Silent);
    // And it comes back.
    until(&mut events, |e| {
        matches!(e, Event::State(State::Connecting { .. })).then_some(())
    })
    .await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_told_again_on_a_resume_reaches_the_application_once() {
    let mut redis = Redis::start().await;
    let pod = pod(&redis).await;
    // Acks are the application's, and it sends none: the session cannot
    // know the client read the reset, and tells it again on a resume.
    let manual = Acks::Manual {
        interval: Duration::ZERO,
    };
    let (client, mut events) = Client::builder([pod.ws_url()])
        .acks(manual)
        .build()
        .unwrap();
    client.subscribe("feed", None).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    pod.publish("feed", json!(1)).await;
    until(&mut events, |e| {
        matches!(e, Event::Message(_)).then_some(())
    })
    .await;

    redis.restart_empty().await;
    until(&mut events, |e| {
        matches!(e, Event::Reset { .. }).then_some(())
    })
    .await;
    // (The pod's first call after the restart may meet the broken connection.)
    let body = json!({"topic": "feed", "data": 2}).to_string();
    testkit::eventually(WAIT, || async {
        testkit::http(pod.addr, "POST", "/v1/publish", &[], body.as_bytes())
            .await
            .0
            == 200
    })
    .await;
    let seq = until(&mut events, |e| match e {
        Event::Message(m) => Some(m.seq),
        _ => None,
    })
    .await;

    client.cut(Cut::Reset).unwrap();
    until(&mut events, |e| match e {
        Event::State(State::Resumed { .. }) => Some(()),
        Event::Reset { .. } => panic!("the reset a second time: {e:?}"),
        _ => None,
    })
    .await;
    let next = pod.publish("feed", json!(3)).await;
    let got = until(&mut events, |e| match e {
        Event::Message(m) => Some(m.seq),
        Event::Reset { .. } => panic!("the reset a second time: {e:?}"),
        _ => None,
    })
    .await;
    assert_eq!((got, next), (next, seq + 1));
}
