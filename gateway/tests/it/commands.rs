//! Bad commands get an `err` with a documented code (and the topic, where the
//! error is about one) and leave the connection usable; a client that sends
//! nothing but garbage is closed with 4500. `ping` is answered with `ok`, and
//! counts toward the command rate like any command that gets an answer.

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use testkit::{Client, Gateway, WAIT};
use tokio::time::timeout;
use tokio_tungstenite::tungstenite::Message;

async fn ready_client(gw: &Gateway) -> Client {
    let mut client = Client::connect(gw).await;
    client.hello(None).await;
    client
}

#[tokio::test]
async fn each_bad_command_gets_its_code_and_the_connection_keeps_working() {
    let gw = Gateway::start().await;
    let mut client = ready_client(&gw).await;
    // (command, its `err`'s id, code, topic)
    let cases = [
        ("{not json", None, "malformed", None),
        (r#"[1,2,3]"#, None, "malformed", None),
        (
            r#"{"op":"sub","id":"one","topic":"x"}"#,
            None,
            "malformed",
            None,
        ),
        (r#"{"id":4}"#, Some(4), "missing_field", None),
        (r#"{"op":"dance","id":5}"#, Some(5), "unknown_op", None),
        (
            r#"{"op":"sub","topic":"news"}"#,
            None,
            "missing_field",
            None,
        ),
        (r#"{"op":"sub","id":6}"#, Some(6), "missing_field", None),
        (
            r#"{"op":"sub","id":7,"topic":"bad topic!"}"#,
            Some(7),
            "bad_topic",
            Some("bad topic!"),
        ),
        (
            r#"{"op":"sub","id":8,"topic":"nowhere:x"}"#,
            Some(8),
            "unknown_namespace",
            Some("nowhere:x"),
        ),
        (
            r#"{"op":"pub","id":9,"topic":"news","data":1}"#,
            Some(9),
            "forbidden",
            Some("news"),
        ),
        (
            r#"{"op":"pub","id":10,"topic":"chat:x"}"#,
            Some(10),
            "missing_field",
            None,
        ),
        (
            r#"{"op":"unsub","id":11,"topic":"news"}"#,
            Some(11),
            "not_subscribed",
            Some("news"),
        ),
        (
            r#"{"op":"ack","topic":"news","seq":1}"#,
            None,
            "not_subscribed",
            Some("news"),
        ),
        (r#"{"op":"ping"}"#, None, "missing_field", None),
        (r#"{"op":"hello"}"#, None, "malformed", None),
    ];
    for (text, id, code, topic) in cases {
        client.send_text(text).await;
        let err = client.expect("err").await;
        assert_eq!(err["code"], code, "for {text}: {err}");
        assert_eq!(err["id"].as_u64(), id, "for {text}: {err}");
        assert_eq!(
            err.get("topic").and_then(Value::as_str),
            topic,
            "for {text}: {err}"
        );
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
    let err = client.expect("err").await;
    assert_eq!(err["code"], "already_subscribed");
    assert_eq!(err["topic"], "chat:x", "{err}");
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
    let err = client.expect("err").await;
    assert_eq!(err["code"], "too_many_subscriptions");
    assert_eq!(err["topic"], "c", "{err}");
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

// ---------------------------------------------------------------- ping

#[tokio::test]
async fn a_ping_is_answered_with_ok_and_its_id_before_and_after_hello() {
    let gw = Gateway::start().await;
    // As the first command: an implied `hello` (`welcome`), then its answer,
    // as for any command but `hello`.
    let mut early = Client::connect(&gw).await;
    early.send(json!({"op": "ping", "id": 7})).await;
    early.expect("welcome").await;
    assert_eq!(early.expect("ok").await, json!({"op": "ok", "id": 7}));

    let mut client = ready_client(&gw).await;
    client.sub(1, "chat:a").await;
    for id in [2, 3] {
        client.send(json!({"op": "ping", "id": id})).await;
        // Nothing but the id: no new message type, nothing a client must parse.
        assert_eq!(client.expect("ok").await, json!({"op": "ok", "id": id}));
    }
    // It leaves the session as it was: still subscribed.
    let seq = gw.publish("chat:a", json!("after pings")).await;
    assert_eq!(client.msg().await.1, seq);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_ping_flood_is_rate_limited_then_closed_with_4504() {
    let mut config = Gateway::config();
    config.websocket.commands_per_second = 1;
    config.websocket.commands_burst = 5;
    config.websocket.max_bad_commands = 3;
    let gw = Gateway::with(config).await;
    let mut client = ready_client(&gw).await;
    // Far more than the burst, as fast as the socket takes them.
    for id in 1..=40u64 {
        let ping = json!({"op": "ping", "id": id}).to_string();
        client.ws.feed(Message::text(ping)).await.expect("feed");
    }
    client.ws.flush().await.expect("flush");
    let (mut oks, mut limited) = (Vec::new(), Vec::new());
    let close = loop {
        let frame = timeout(WAIT, client.ws.next())
            .await
            .expect("an answer or the close in time");
        let text = match frame {
            Some(Ok(Message::Text(text))) => text,
            Some(Ok(Message::Close(frame))) => break frame.map(|f| u16::from(f.code)),
            Some(Ok(_)) => continue,
            Some(Err(_)) | None => break None,
        };
        let m: Value = serde_json::from_str(&text).expect("JSON");
        let id = m["id"]
            .as_u64()
            .expect("every answer carries the ping's id");
        match (m["op"].as_str(), m["code"].as_str()) {
            (Some("ok"), _) => oks.push(id),
            (Some("err"), Some("rate_limited")) => limited.push(id),
            _ => panic!("unexpected {m}"),
        }
    };
    assert_eq!(close, Some(4504), "{oks:?} ok, {limited:?} limited");
    // The burst less the `hello`'s token, and perhaps a token or two refilled
    // meanwhile: no more.
    assert!((4..=6).contains(&oks.len()), "{oks:?} answered ok");
    assert!(limited.len() >= 3, "{limited:?} rate_limited");
    assert_eq!(oks[..4], [1, 2, 3, 4]);
    assert!(gw.metric("herald_commands_rate_limited_total").await >= 3.0);
    gw.shutdown().await;
}
