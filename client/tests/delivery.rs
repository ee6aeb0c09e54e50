#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! The client's stream against a real gateway (in this process, on port 0):
//! in order, from `since`, once across a resume, a `reset` surfaced, and
//! publishing over the socket with typed errors.

mod common;

use std::time::Duration;

use common::{Gate, messages, seqs, until};
use herald_client::{
    Acks, Cause, Client, Cut, DEFAULT_BACKOFF, Error, ErrorCode, Event, Since, State,
};
use serde_json::json;
use testkit::Gateway;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_receives_every_message_in_order() {
    let gateway = Gateway::start().await;
    let (client, mut events) = Client::builder([gateway.ws_url()]).build().unwrap();
    client.subscribe("news", None).unwrap();
    let (seq, recovered) = until(&mut events, |e| match e {
        Event::Subscribed { seq, recovered, .. } => Some((*seq, *recovered)),
        _ => None,
    })
    .await;
    assert_eq!((seq, recovered), (0, None));
    for i in 1..=50 {
        gateway.publish("news", json!({ "i": i })).await;
    }
    let got = messages(&mut events, 50, &mut Vec::new()).await;
    assert_eq!(seqs(&got), (1..=50).collect::<Vec<_>>());
    assert_eq!(got[6].data.json().unwrap().get(), r#"{"i":7}"#);
    assert!(
        got.iter()
            .all(|m| &*m.topic == "news" && m.epoch == got[0].epoch)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn since_replays_what_came_after_it() {
    let gateway = Gateway::start().await;
    for i in 1..=5 {
        gateway.publish("news", json!(i)).await;
    }
    let (client, mut events) = Client::builder([gateway.ws_url()]).build().unwrap();
    client.subscribe("news", Some(Since::from(2))).unwrap();
    let (seq, recovered) = until(&mut events, |e| match e {
        Event::Subscribed { seq, recovered, .. } => Some((*seq, *recovered)),
        _ => None,
    })
    .await;
    assert_eq!((seq, recovered), (2, Some(true)));
    assert_eq!(
        seqs(&messages(&mut events, 3, &mut Vec::new()).await),
        [3, 4, 5]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_resumes_and_the_stream_has_no_duplicate_and_no_gap() {
    let gateway = Gateway::start().await;
    let gate = Gate::open(&gateway.ws_url());
    // Acks only every second: what was delivered but not acked comes
    // again after the resume, and the client must drop it.
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .endpoints(gate.clone())
        .acks(Acks::Auto {
            interval: Duration::from_secs(1),
        })
        .report_dropped(true)
        .build()
        .unwrap();
    client.subscribe("news", None).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    for i in 1..=10 {
        gateway.publish("news", json!(i)).await;
    }
    let mut others = Vec::new();
    let first = messages(&mut events, 10, &mut others).await;
    gate.set(None);
    client.cut(Cut::Reset).unwrap();
    let cause = until(&mut events, |e| match e {
        Event::State(State::Disconnected { cause, .. }) => Some(cause.clone()),
        _ => None,
    })
    .await;
    assert_eq!(cause, Cause::Cut);
    // Published while the client is away.
    for i in 11..=20 {
        gateway.publish("news", json!(i)).await;
    }
    gate.set(Some(&gateway.ws_url()));
    let rest = messages(&mut events, 10, &mut others).await;
    let all: Vec<u64> = seqs(&first).into_iter().chain(seqs(&rest)).collect();
    assert_eq!(all, (1..=20).collect::<Vec<_>>(), "once each, in order");
    assert!(
        others
            .iter()
            .any(|e| matches!(e, Event::State(State::Resumed { .. }))),
        "resumed: {others:?}"
    );
    let dropped = others
        .iter()
        .filter(|e| matches!(e, Event::Dropped { .. }))
        .count();
    assert!(
        dropped > 0,
        "the unacked messages came again and were dropped: {others:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_that_cannot_bridge_the_gap_surfaces_as_a_reset() {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "short".to_owned(),
        router::NamespaceSettings {
            history_size: 2,
            ..Default::default()
        },
    );
    let gateway = Gateway::with(config).await;
    let gate = Gate::open(&gateway.ws_url());
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .endpoints(gate.clone())
        .acks(Acks::Auto {
            interval: Duration::ZERO,
        })
        .build()
        .unwrap();
    client.subscribe("short:ticker", None).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    gateway.publish("short:ticker", json!(1)).await;
    assert_eq!(seqs(&messages(&mut events, 1, &mut Vec::new()).await), [1]);
    // Acked or not, the history (5 and 6 only) cannot bridge the gap.
    gate.set(None);
    client.cut(Cut::Reset).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::State(State::Disconnected { .. })).then_some(())
    })
    .await;
    for i in 2..=6 {
        gateway.publish("short:ticker", json!(i)).await;
    }
    gate.set(Some(&gateway.ws_url()));
    let (topic, seq) = until(&mut events, |e| match e {
        Event::Reset { topic, seq, .. } => Some((topic.to_string(), *seq)),
        Event::Message(m) => panic!("a message before the reset: {m:?}"),
        _ => None,
    })
    .await;
    assert_eq!((topic.as_str(), seq), ("short:ticker", 6));
    gateway.publish("short:ticker", json!(7)).await;
    assert_eq!(seqs(&messages(&mut events, 1, &mut Vec::new()).await), [7]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_over_the_socket_answers_the_seq_or_a_typed_error() {
    let gateway = Gateway::start().await;
    let (client, mut events) = Client::builder([gateway.ws_url()]).build().unwrap();
    // Someone must read the stream for replies to come through.
    let reader = tokio::spawn(async move { while events.next().await.is_some() {} });
    // `chat` lets any client publish on a gateway without keys.
    let published = client
        .publish("chat:room", &json!({"hi": 1}))
        .await
        .unwrap();
    assert_eq!(published.seq, 1);
    let refused = client.publish("news", &json!(1)).await.unwrap_err();
    assert!(
        matches!(
            &refused,
            Error::Server {
                code: ErrorCode::Forbidden,
                ..
            }
        ),
        "{refused:?}"
    );
    let refused = client.publish("nowhere:x", &json!(1)).await.unwrap_err();
    assert!(
        matches!(
            &refused,
            Error::Server {
                code: ErrorCode::UnknownNamespace,
                ..
            }
        ),
        "{refused:?}"
    );
    client.close();
    tokio::time::timeout(testkit::WAIT, reader)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_subscription_is_an_error_naming_its_topic() {
    let gateway = Gateway::start().await;
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .backoff(DEFAULT_BACKOFF)
        .build()
        .unwrap();
    client.subscribe("nowhere:x", None).unwrap();
    let e = until(&mut events, |e| match e {
        Event::Error(e) => Some(e.clone()),
        _ => None,
    })
    .await;
    match e {
        Error::Server { code, topic, .. } => {
            assert_eq!(
                (code, topic.as_deref()),
                (ErrorCode::UnknownNamespace, Some("nowhere:x"))
            );
        }
        other => panic!("{other:?}"),
    }
}
