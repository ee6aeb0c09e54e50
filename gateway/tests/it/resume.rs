//! Sessions: a client that comes back within the resume window gets every
//! subscription back and everything it did not ack; after the window it starts
//! afresh.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::json;
use testkit::{Client, Gateway, WAIT, eventually, metric_sum};

#[tokio::test]
async fn resume_within_the_window_replays_what_was_not_acked() {
    let gw = Gateway::start().await;
    gw.publish("b", json!("before")).await; // b is at seq 1 when the client subscribes
    let mut client = Client::connect(&gw).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    client.sub(1, "a").await;
    client.sub(2, "b").await;
    for i in 1..=5 {
        gw.publish("a", json!(i)).await;
    }
    for seq in 1..=5 {
        assert_eq!(client.msg().await.1, seq);
    }
    client
        .send(json!({"op": "ack", "topic": "a", "seq": 3}))
        .await;
    drop(client);

    // While the client is away: a gets 6..8, b gets 2..3.
    for i in 6..=8 {
        gw.publish("a", json!(i)).await;
    }
    for i in 2..=3 {
        gw.publish("b", json!(i)).await;
    }

    let mut back = Client::connect(&gw).await;
    let welcome = back.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true);
    assert_eq!(welcome["session"], session.as_str());
    // a: everything after the ack (4..8); b: everything after the subscription point (2..3).
    let mut got: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for _ in 0..(5 + 2) {
        let (topic, seq, _) = back.msg().await;
        got.entry(topic).or_default().push(seq);
    }
    assert_eq!(got["a"], vec![4, 5, 6, 7, 8]);
    assert_eq!(got["b"], vec![2, 3]);

    // And both subscriptions are live again without a new `sub`.
    gw.publish("a", json!(9)).await;
    assert_eq!(back.msg().await.1, 9);
    gw.publish("b", json!(4)).await;
    assert_eq!(back.msg().await.1, 4);
    assert_eq!(
        gw.metric("herald_resumes_total{resumed=\"true\"}").await,
        1.0
    );
    gw.shutdown().await;
}

/// The resume window of [`after_the_window_the_session_is_fresh`].
const WINDOW: Duration = Duration::from_millis(300);

#[tokio::test]
async fn after_the_window_the_session_is_fresh() {
    let mut config = Gateway::config();
    config.session.resume_window = WINDOW;
    let gw = Gateway::with(config).await;
    let mut client = Client::connect(&gw).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    client.sub(1, "a").await;
    drop(client);
    // The window starts when the connection has ended and saved the
    // session, just before the close is counted: wait for that, then let the
    // window pass (expiry is a matter of time passing: this is a lower bound).
    eventually(WAIT, || async {
        metric_sum(gw.addr, "herald_connections_closed_total").await == 1.0
    })
    .await;
    tokio::time::sleep(WINDOW + Duration::from_millis(50)).await;

    let mut back = Client::connect(&gw).await;
    let welcome = back.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], false);
    assert_ne!(welcome["session"], session.as_str());
    // No subscription came back: a publish to `a` does not arrive, but a reply does.
    gw.publish("a", json!(1)).await;
    back.send(json!({"op": "unsub", "id": 5, "topic": "a"}))
        .await;
    let err = back.expect("err").await;
    assert_eq!(err["code"], "not_subscribed");
    gw.shutdown().await;
}

#[tokio::test]
async fn an_unknown_session_starts_fresh() {
    let gw = Gateway::start().await;
    let mut client = Client::connect(&gw).await;
    let welcome = client.hello(Some("0123456789abcdef0123456789abcdef")).await;
    assert_eq!(welcome["resumed"], false);
    assert_eq!(
        gw.metric("herald_resumes_total{resumed=\"false\"}").await,
        1.0
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn resuming_a_session_that_is_still_connected_takes_it_over() {
    let gw = Gateway::start().await;
    let mut first = Client::connect(&gw).await;
    let session = first.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    first.sub(1, "a").await;
    gw.publish("a", json!(1)).await;
    assert_eq!(first.msg().await.1, 1);
    first
        .send(json!({"op": "ack", "topic": "a", "seq": 1}))
        .await;

    // The first connection looks alive to the server, but the client moved on.
    let mut second = Client::connect(&gw).await;
    let welcome = second.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true);
    assert_eq!(first.closed().await, Some(4501));
    gw.publish("a", json!(2)).await;
    assert_eq!(second.msg().await.1, 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn an_ack_beyond_anything_sent_is_refused_and_the_resume_still_replays() {
    let gw = Gateway::start().await;
    let mut client = Client::connect(&gw).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    client.sub(1, "a").await;
    gw.publish("a", json!(1)).await;
    assert_eq!(client.msg().await.1, 1);
    for seq in [2, u64::MAX] {
        client
            .send(json!({"op": "ack", "topic": "a", "seq": seq}))
            .await;
        let err = client.expect("err").await;
        assert_eq!(err["code"], "malformed", "{err}");
    }
    // The connection is fine, and what it really got can be acked.
    client
        .send(json!({"op": "ack", "topic": "a", "seq": 1}))
        .await;
    gw.publish("a", json!(2)).await;
    assert_eq!(client.msg().await.1, 2);
    drop(client);

    gw.publish("a", json!(3)).await;
    let mut back = Client::connect(&gw).await;
    let welcome = back.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    assert_eq!(back.msg().await.1, 2, "replayed from the last real ack");
    assert_eq!(back.msg().await.1, 3);
}
