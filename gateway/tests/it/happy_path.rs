//! The basic story: a subscriber and a publisher, both ordinary WebSocket
//! clients, and a backend publishing over HTTP.

use serde_json::json;
use testkit::{Client, Gateway};

#[tokio::test]
async fn a_message_goes_from_publisher_to_subscriber() {
    let gw = Gateway::start().await;
    let mut alice = Client::connect(&gw).await;
    let mut bob = Client::connect(&gw).await;

    let welcome = alice.hello(None).await;
    assert_eq!(welcome["resumed"], false);
    assert_eq!(welcome["ping_ms"], 25_000);
    assert!(welcome["session"].as_str().is_some_and(|s| s.len() >= 32));
    let ok = alice.sub(1, "chat:lobby").await;
    assert_eq!(ok["seq"], 0);
    assert!(ok["epoch"].as_str().is_some());
    assert!(ok.get("recovered").is_none(), "no replay asked: {ok}");

    // Bob never says hello: his first command implies it, welcome first.
    bob.send(json!({"op": "pub", "id": 7, "topic": "chat:lobby", "data": {"text": "hi", "n": [1, 2.50]}}))
        .await;
    let bob_welcome = bob.expect("welcome").await;
    assert_ne!(bob_welcome["session"], welcome["session"]);
    let ok = bob.expect("ok").await;
    assert_eq!((ok["id"].as_u64(), ok["seq"].as_u64()), (Some(7), Some(1)));

    let (topic, seq, data) = alice.msg().await;
    assert_eq!((topic.as_str(), seq), ("chat:lobby", 1));
    assert_eq!(data, json!({"text": "hi", "n": [1, 2.50]}));

    // A backend publishes over HTTP to the same topic.
    assert_eq!(gw.publish("chat:lobby", json!("from the backend")).await, 2);
    assert_eq!(alice.msg().await.2, json!("from the backend"));
    gw.shutdown().await;
}

#[tokio::test]
async fn data_arrives_byte_for_byte() {
    let gw = Gateway::start().await;
    let mut sub = Client::connect(&gw).await;
    sub.hello(None).await;
    sub.sub(1, "news").await;
    // HTTP publish keeps the publisher's JSON text as it was written.
    let (status, _) = testkit::http(
        gw.addr,
        "POST",
        "/v1/publish",
        &[],
        br#"{"topic":"news","data":{ "spaced" : 1.0e3, "u":"\u00e9" }}"#,
    )
    .await;
    assert_eq!(status, 200);
    let frame = loop {
        use futures_util::StreamExt;
        match sub.ws.next().await {
            Some(Ok(tokio_tungstenite::tungstenite::Message::Text(t))) => break t.to_string(),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        frame,
        r#"{"op":"msg","topic":"news","seq":1,"data":{ "spaced" : 1.0e3, "u":"\u00e9" }}"#
    );
    gw.shutdown().await;
}
