#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! Subscriptions the server makes, through the client against a real
//! gateway (in this process, on port 0): a backend's `POST /v1/subscribe`
//! reaches every connection of the user, whose messages then flow, and
//! survives a resume; `POST /v1/unsubscribe` ends it; the token's `topics`
//! are subscribed at `hello`.

mod common;
#[path = "common/rooms.rs"]
mod rooms;

use common::{api, until, user};
use herald_client::{Cut, Event, Origin, State};
use rooms::with_users;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backend_subscribes_every_connection_of_a_user_and_unsubscribes_them() {
    let gateway = with_users().await;
    let (_alice1, mut one) = user(&gateway, "alice", json!({}));
    let (_alice2, mut two) = user(&gateway, "alice", json!({}));
    for events in [&mut one, &mut two] {
        until(events, |e| {
            matches!(e, Event::State(State::Connected { .. })).then_some(())
        })
        .await;
    }
    let (status, body) = api(
        &gateway,
        "/v1/subscribe",
        json!({"user": "alice", "topic": "news"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for events in [&mut one, &mut two] {
        let origin = until(events, |e| match e {
            Event::ServerSubscribed { topic, origin, .. } if &**topic == "news" => Some(*origin),
            _ => None,
        })
        .await;
        assert_eq!(origin, Origin::Server);
    }
    let seq = gateway.publish("news", json!("hello")).await;
    for events in [&mut one, &mut two] {
        let got = until(events, |e| match e {
            Event::Message(m) => Some(m.seq),
            _ => None,
        })
        .await;
        assert_eq!(got, seq);
    }
    let (status, body) = api(
        &gateway,
        "/v1/unsubscribe",
        json!({"user": "alice", "topic": "news"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for events in [&mut one, &mut two] {
        let reason = until(events, |e| match e {
            Event::Unsubscribed { topic, reason } if &**topic == "news" => Some(reason.clone()),
            _ => None,
        })
        .await;
        assert_eq!(reason, "server");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_subscription_survives_a_resume() {
    let gateway = with_users().await;
    let (alice, mut events) = user(&gateway, "alice", json!({}));
    until(&mut events, |e| {
        matches!(e, Event::State(State::Connected { .. })).then_some(())
    })
    .await;
    let (status, body) = api(
        &gateway,
        "/v1/subscribe",
        json!({"user": "alice", "topic": "news"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    until(&mut events, |e| {
        matches!(e, Event::ServerSubscribed { .. }).then_some(())
    })
    .await;
    alice.cut(Cut::Reset).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::State(State::Resumed { .. })).then_some(())
    })
    .await;
    let seq = gateway.publish("news", json!("after the resume")).await;
    let got = until(&mut events, |e| match e {
        Event::Message(m) if &*m.topic == "news" => Some(m.seq),
        _ => None,
    })
    .await;
    assert_eq!(got, seq);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_topics_of_a_token_are_subscribed_at_hello() {
    let gateway = with_users().await;
    let (_alice, mut events) = user(&gateway, "alice", json!({"topics": ["news", "room:alice"]}));
    let mut topics = Vec::new();
    while topics.len() < 2 {
        let (topic, origin) = until(&mut events, |e| match e {
            Event::ServerSubscribed { topic, origin, .. } => Some((topic.to_string(), *origin)),
            _ => None,
        })
        .await;
        assert_eq!(origin, Origin::Token);
        topics.push(topic);
    }
    topics.sort();
    assert_eq!(topics, ["news", "room:alice"]);
    let seq = gateway.publish("news", json!(1)).await;
    let got = until(&mut events, |e| match e {
        Event::Message(m) => Some(m.seq),
        _ => None,
    })
    .await;
    assert_eq!(got, seq);
}
