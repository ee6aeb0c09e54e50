//! Bad commands get an `err` with a documented code and leave the connection
//! usable; a client that sends nothing but garbage is closed with 4500.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use serde_json::json;
use testkit::{Client, Gateway};

async fn ready_client(gw: &Gateway) -> Client {
    let mut client = Client::connect(gw).await;
    client.hello(None).await;
    client
}

#[tokio::test]
async fn each_bad_command_gets_its_code_and_the_connection_keeps_working() {
    let gw = Gateway::start().await;
    let mut client = ready_client(&gw).await;
    let cases = [
        ("{not json", None, "malformed"),
        (r#"[1,2,3]"#, None, "malformed"),
        (r#"{"op":"sub","id":"one","topic":"x"}"#, None, "malformed"),
        (r#"{"id":4}"#, Some(4), "missing_field"),
        (r#"{"op":"dance","id":5}"#, Some(5), "unknown_op"),
        (r#"{"op":"sub","topic":"news"}"#, None, "missing_field"),
        (r#"{"op":"sub","id":6}"#, Some(6), "missing_field"),
        (
            r#"{"op":"sub","id":7,"topic":"bad topic!"}"#,
            Some(7),
            "bad_topic",
        ),
        (
            r#"{"op":"sub","id":8,"topic":"nowhere:x"}"#,
            Some(8),
            "unknown_namespace",
        ),
        (
            r#"{"op":"pub","id":9,"topic":"news","data":1}"#,
            Some(9),
            "forbidden",
        ),
        (
            r#"{"op":"pub","id":10,"topic":"chat:x"}"#,
            Some(10),
            "missing_field",
        ),
        (
            r#"{"op":"unsub","id":11,"topic":"news"}"#,
            Some(11),
            "not_subscribed",
        ),
        (
            r#"{"op":"ack","topic":"news","seq":1}"#,
            None,
            "not_subscribed",
        ),
        (r#"{"op":"hello"}"#, None, "malformed"),
    ];
    for (text, id, code) in cases {
        client.send_text(text).await;
        let err = client.expect("err").await;
        assert_eq!(err["code"], code, "for {text}: {err}");
        assert_eq!(err["id"].as_u64(), id, "for {text}: {err}");
        assert!(err["message"].as_str().is_some_and(|m| !m.is_empty()));
        // Still usable after every one of them: a good command resets the count.
        client
            .send(json!({"op": "sub", "id": 100, "topic": "chat:ok"}))
            .await;
        client.expect("ok").await;
        client
            .send(json!({"op": "unsub", "id": 101, "topic": "chat:ok"}))
            .await;
        client.expect("ok").await;
    }
    client.sub(1, "chat:x").await;
    client
        .send(json!({"op": "sub", "id": 2, "topic": "chat:x"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "already_subscribed");
    assert!(gw.metric("herald_bad_commands_total").await >= 15.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_that_keeps_sending_garbage_is_closed() {
    let gw = Gateway::start().await;
    let mut client = ready_client(&gw).await;
    for _ in 0..10 {
        client.send_text("garbage").await;
    }
    for _ in 0..10 {
        assert_eq!(client.expect("err").await["code"], "malformed");
    }
    assert_eq!(client.closed().await, Some(4500));
    gw.shutdown().await;
}

#[tokio::test]
async fn subscriptions_per_connection_are_capped() {
    let mut config = Gateway::config();
    config.session.max_subscriptions = 2;
    let gw = Gateway::with(config).await;
    let mut client = ready_client(&gw).await;
    client.sub(1, "a").await;
    client.sub(2, "b").await;
    client
        .send(json!({"op": "sub", "id": 3, "topic": "c"}))
        .await;
    assert_eq!(client.expect("err").await["code"], "too_many_subscriptions");
    gw.shutdown().await;
}

#[tokio::test]
async fn unsub_stops_delivery() {
    let gw = Gateway::start().await;
    let mut client = ready_client(&gw).await;
    client.sub(1, "chat:a").await;
    client
        .send(json!({"op": "unsub", "id": 2, "topic": "chat:a"}))
        .await;
    assert_eq!(client.expect("ok").await["id"], 2);
    gw.publish("chat:a", json!("not for you")).await;
    // A reply to a later command is the next frame: the publish was not delivered.
    client
        .send(json!({"op": "pub", "id": 3, "topic": "chat:b", "data": 1}))
        .await;
    assert_eq!(client.expect("ok").await["id"], 3);
    gw.shutdown().await;
}
