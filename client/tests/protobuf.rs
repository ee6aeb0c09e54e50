#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! The client speaking `herald.v1.protobuf` to a gateway (in this process,
//! on port 0): the application sees what a JSON client sees (the same
//! messages, publish answers and typed refusals, history, presence), and the
//! delivery contract holds across a cut connection (resume, no duplicate,
//! no gap).

mod common;
#[path = "common/rooms.rs"]
mod rooms;

use std::time::Duration;

use common::{Gate, messages, seqs, until};
use herald_client::{Acks, Client, Cut, Error, ErrorCode, Event, HistoryQuery, Protocol, State};
use serde_json::json;
use testkit::Gateway;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_client_sees_what_a_json_client_sees() {
    let gateway = Gateway::start().await;
    let mut clients = Vec::new();
    for protocol in [Protocol::Json, Protocol::Protobuf] {
        let (client, mut events) = Client::builder([gateway.ws_url()])
            .protocol(protocol)
            .build()
            .unwrap();
        client.subscribe("chat:room", None).unwrap();
        until(&mut events, |e| {
            matches!(e, Event::Subscribed { .. }).then_some(())
        })
        .await;
        clients.push((client, events));
    }
    for i in 1..=20 {
        gateway
            .publish("chat:room", json!({"i": i, "text": "héllo"}))
            .await;
    }
    let (json_client, json_events) = &mut clients[0];
    let by_json = messages(json_events, 20, &mut Vec::new()).await;
    let history_json = json_client
        .history("chat:room", HistoryQuery::default())
        .await
        .unwrap();
    let (_, proto_events) = &mut clients[1];
    let by_proto = messages(proto_events, 20, &mut Vec::new()).await;
    assert_eq!(seqs(&by_proto), (1..=20).collect::<Vec<_>>());
    for (p, j) in by_proto.iter().zip(&by_json) {
        assert_eq!((&p.topic, &p.epoch, p.seq), (&j.topic, &j.epoch, j.seq));
        assert_eq!(p.data, j.data, "seq {}", p.seq);
    }
    assert_eq!(
        by_proto[0].data.json().map(|d| d.get()),
        Some(r#"{"i":1,"text":"héllo"}"#)
    );

    // Publishing over the socket: the seq, or a typed refusal.
    let reader = {
        let (client, mut events) = clients.pop().unwrap();
        let reader = tokio::spawn(async move { while events.next().await.is_some() {} });
        (client, reader)
    };
    let published = reader
        .0
        .publish("chat:room", &json!({"i": 21}))
        .await
        .unwrap();
    assert_eq!(published.seq, 21);
    let refused = reader.0.publish("news", &json!(1)).await.unwrap_err();
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
    let history = reader
        .0
        .history("chat:room", HistoryQuery::default())
        .await
        .unwrap();
    assert_eq!(
        (
            history.epoch.as_str(),
            history.seq,
            history.publications.len()
        ),
        (history_json.epoch.as_str(), 21, 21)
    );
    for (p, j) in history.publications.iter().zip(&history_json.publications) {
        assert_eq!((p.seq, &p.data), (j.seq, &j.data));
    }
    let lost = reader
        .0
        .history(
            "chat:room",
            HistoryQuery {
                since: Some(1),
                epoch: Some("not-this-epoch".to_owned()),
                ..HistoryQuery::default()
            },
        )
        .await
        .unwrap_err();
    assert!(
        matches!(
            &lost,
            Error::Server {
                code: ErrorCode::HistoryLost,
                ..
            }
        ),
        "{lost:?}"
    );
    reader.0.close();
    tokio::time::timeout(testkit::WAIT, reader.1)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_protobuf_connection_resumes_with_no_duplicate_and_no_gap() {
    let gateway = Gateway::start().await;
    let gate = Gate::open(&gateway.ws_url());
    // Acks only every second: what was delivered but not acked comes
    // again after the resume, and the client must drop it.
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .protocol(Protocol::Protobuf)
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
    until(&mut events, |e| {
        matches!(e, Event::State(State::Disconnected { .. })).then_some(())
    })
    .await;
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
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_over_protobuf_names_the_members_and_their_info() {
    let gateway = rooms::with_users().await;
    let (alice, mut events) = common::user(&gateway, "alice", json!({"info": {"name": "Alice"}}));
    alice.subscribe("quiet:1", None).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    let token = common::token("bob", json!({}));
    let (bob, mut bob_events) = Client::builder([gateway.ws_url()])
        .protocol(Protocol::Protobuf)
        .token(move || {
            let token = token.clone();
            async move { Ok::<_, String>(token) }
        })
        .build()
        .unwrap();
    let reader = tokio::spawn(async move { while bob_events.next().await.is_some() {} });
    let room = bob.presence_all("quiet:1").await.unwrap();
    let members: Vec<(String, Option<String>)> = room
        .members()
        .map(|m| (m.user.to_string(), m.info.as_deref().map(str::to_owned)))
        .collect();
    assert_eq!(
        members,
        [("alice".to_owned(), Some(r#"{"name":"Alice"}"#.to_owned()))]
    );
    bob.close();
    tokio::time::timeout(testkit::WAIT, reader)
        .await
        .unwrap()
        .unwrap();
}
