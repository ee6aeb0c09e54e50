#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! The client against a scripted server (a WebSocket server in the test
//! that answers as the protocol says, frame by frame): a subscription the
//! server makes (its messages acked, `unsubscribed` ending it), a tracked
//! topic whose diffs race its pages, `history` pages and the typed
//! `history_lost` and `disabled`; `hello.data` and `rpc` (the backend
//! hooks' client side: the backend's reply, its own error code).

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;

use common::until;
use futures_util::{SinkExt, StreamExt};
use herald_client::{Client, Error, ErrorCode, Event, HistoryQuery, Origin};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;

/// Serves one connection at a time on a loopback port: `welcome`, then what
/// `script` answers to each command (every command also goes to the
/// returned channel).
async fn scripted(
    script: impl Fn(&Value) -> Vec<Value> + Send + Sync + 'static,
) -> (String, mpsc::UnboundedReceiver<Value>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let (got, commands) = mpsc::unbounded_channel();
    let script = Arc::new(script);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let Ok(mut ws) = tokio_tungstenite::accept_async(stream).await else {
                continue;
            };
            let got = got.clone();
            let script = script.clone();
            tokio::spawn(async move {
                while let Some(Ok(WsMessage::Text(text))) = ws.next().await {
                    let command: Value = serde_json::from_str(text.as_str()).unwrap();
                    let _ = got.send(command.clone());
                    let mut answers = Vec::new();
                    if command["op"] == "hello" {
                        answers.push(json!({"op": "welcome", "session": "s1", "ping_ms": 25000, "resumed": false}));
                    }
                    answers.extend(script(&command));
                    for answer in answers {
                        if ws.send(WsMessage::text(answer.to_string())).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, commands)
}

/// Reads `commands` until one `want` accepts, for at most [`testkit::WAIT`].
async fn command(
    commands: &mut mpsc::UnboundedReceiver<Value>,
    want: impl Fn(&Value) -> bool,
) -> Value {
    tokio::time::timeout(testkit::WAIT, async {
        loop {
            let c = commands.recv().await.expect("the server runs");
            if want(&c) {
                return c;
            }
        }
    })
    .await
    .expect("the command in time")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_the_server_makes_is_the_clients_until_the_server_ends_it() {
    let (url, mut commands) = scripted(|c| match c["op"].as_str() {
        Some("hello") => vec![
            json!({"op": "ok", "topic": "alerts", "seq": 10, "epoch": "e1", "reason": "server"}),
            json!({"op": "msg", "topic": "alerts", "seq": 11, "data": {"level": "high"}}),
        ],
        Some("ack") => vec![json!({"op": "unsubscribed", "topic": "alerts", "reason": "server"})],
        _ => vec![],
    })
    .await;
    let (_client, mut events) = Client::builder([url]).build().unwrap();
    let (seq, origin) = until(&mut events, |e| match e {
        Event::ServerSubscribed {
            topic, seq, origin, ..
        } if &**topic == "alerts" => Some((*seq, *origin)),
        _ => None,
    })
    .await;
    assert_eq!((seq, origin), (10, Origin::Server));
    let m = until(&mut events, |e| match e {
        Event::Message(m) => Some(m.clone()),
        _ => None,
    })
    .await;
    assert_eq!(
        (m.seq, &*m.epoch, m.data.json().unwrap().get()),
        (11, "e1", r#"{"level":"high"}"#)
    );
    let ack = command(&mut commands, |c| c["op"] == "ack").await;
    assert_eq!(
        ack,
        json!({"op": "ack", "topic": "alerts", "seq": 11, "epoch": "e1"})
    );
    let reason = until(&mut events, |e| match e {
        Event::Unsubscribed { topic, reason } if &**topic == "alerts" => Some(reason.clone()),
        _ => None,
    })
    .await;
    assert_eq!(reason, "server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracked_topic_merges_diffs_that_race_its_pages_and_tells_each_change_once() {
    // Two pages of one member each; diffs before, between and after them.
    let (url, _commands) = scripted(|c| {
        let diff = |from: u64, to: u64, joins: Value, leaves: Value, users: u64| {
            json!({"op": "presence_diff", "topic": "room:1", "from": from, "to": to,
                   "joins": joins, "leaves": leaves, "users": users, "connections": users})
        };
        match (c["op"].as_str(), c["cursor"].as_str()) {
            (Some("sub"), _) => vec![
                json!({"op": "ok", "id": c["id"], "topic": "room:1", "seq": 0, "epoch": "e"}),
                // Before any page: bob joined at 4 (the first page holds him).
                diff(3, 4, json!([{"user": "bob"}]), json!([]), 2),
            ],
            (Some("presence"), None) => vec![
                json!({"op": "ok", "id": c["id"], "topic": "room:1", "position": 4, "users": 2,
                       "connections": 2, "members": [{"user": "alice", "info": {"n": 1}}], "cursor": "alice"}),
                // Between the pages: alice left and dave joined at 5.
                diff(4, 5, json!([{"user": "dave"}]), json!(["alice"]), 2),
            ],
            (Some("presence"), Some("alice")) => vec![
                // The second page answers at 5: it holds dave (and bob).
                json!({"op": "ok", "id": c["id"], "topic": "room:1", "position": 5, "users": 2,
                       "connections": 2, "members": [{"user": "bob"}, {"user": "dave"}]}),
                diff(5, 6, json!([]), json!(["bob"]), 1),
            ],
            _ => vec![],
        }
    })
    .await;
    let (client, mut events) = Client::builder([url]).build().unwrap();
    client.track_presence("room:1").unwrap();
    client.subscribe("room:1", None).unwrap();
    let mut members: BTreeSet<Arc<str>> = BTreeSet::new();
    until(&mut events, |e| {
        if let Event::Presence {
            change, position, ..
        } = e
        {
            for m in &change.joins {
                assert!(members.insert(m.user.clone()), "joined twice: {e:?}");
            }
            for u in &change.leaves {
                assert!(members.remove(u), "left without joining: {e:?}");
            }
            return (*position == 6).then_some(());
        }
        None
    })
    .await;
    let members: Vec<&str> = members.iter().map(|u| &**u).collect();
    assert_eq!(members, ["dave"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_and_presence_answers_and_their_typed_refusals() {
    let (url, mut commands) = scripted(|c| {
        let id = c["id"].clone();
        match (c["op"].as_str(), c["topic"].as_str()) {
            (Some("history"), Some("news")) => vec![json!({
                "op": "ok", "id": id, "topic": "news", "epoch": "e", "seq": 42,
                "publications": [{"seq": 42, "data": {"n": 42}}, {"seq": 41, "data": null}]
            })],
            (Some("history"), _) => vec![json!({
                "op": "err", "id": id, "code": "history_lost", "message": "seq 3 is gone", "topic": c["topic"]
            })],
            (Some("presence"), _) => vec![json!({
                "op": "err", "id": id, "code": "disabled", "message": "no presence", "topic": c["topic"]
            })],
            _ => vec![],
        }
    })
    .await;
    let (client, _events) = Client::builder([url]).build().unwrap();
    let query = HistoryQuery {
        since: Some(43),
        limit: Some(2),
        reverse: true,
        ..HistoryQuery::default()
    };
    let page = client.history("news", query).await.unwrap();
    let sent = command(&mut commands, |c| c["op"] == "history").await;
    assert_eq!(sent["since"], 43);
    assert_eq!(sent["reverse"], true);
    assert_eq!((page.epoch.as_str(), page.seq), ("e", 42));
    let got: Vec<(u64, &str)> = page
        .publications
        .iter()
        .map(|p| (p.seq, p.data.json().unwrap().get()))
        .collect();
    assert_eq!(got, [(42, r#"{"n":42}"#), (41, "null")]);
    match client.history("old", HistoryQuery::default()).await {
        Err(Error::Server { code, topic, .. }) => {
            assert_eq!(
                (code, topic.as_deref()),
                (ErrorCode::HistoryLost, Some("old"))
            );
        }
        other => panic!("not `history_lost`: {other:?}"),
    }
    match client.presence("news", None, None).await {
        Err(Error::Server { code, .. }) => assert_eq!(code, ErrorCode::Disabled),
        other => panic!("not `disabled`: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hello_data_goes_with_every_hello_and_rpc_returns_the_backends_data_or_its_code() {
    let (url, mut commands) = scripted(|c| {
        let id = c["id"].clone();
        match (c["op"].as_str(), c["method"].as_str()) {
            (Some("rpc"), Some("cart.add")) => {
                vec![json!({"op": "ok", "id": id, "data": {"items": 1, "sku": c["data"]["sku"]}})]
            }
            (Some("rpc"), Some("ping")) => vec![json!({"op": "ok", "id": id})],
            (Some("rpc"), _) => vec![json!({
                "op": "err", "id": id, "code": "insufficient_funds", "message": "balance 0"
            })],
            _ => vec![],
        }
    })
    .await;
    let (client, _events) = Client::builder([url])
        .hello_data(&json!({"csrf": "c1"}))
        .build()
        .unwrap();
    let cart = client
        .rpc("cart.add", Some(&json!({"sku": "A-1"})))
        .await
        .unwrap();
    assert_eq!(cart.get(), r#"{"items":1,"sku":"A-1"}"#);
    let hello = command(&mut commands, |c| c["op"] == "hello").await;
    assert_eq!(hello["data"], json!({"csrf": "c1"}));
    let sent = command(&mut commands, |c| c["op"] == "rpc").await;
    assert_eq!(sent["method"], "cart.add");
    // No data asked, none sent; no data answered: JSON null.
    let pong = client.rpc::<Value>("ping", None).await.unwrap();
    assert_eq!(pong.get(), "null");
    let sent = command(&mut commands, |c| c["op"] == "rpc").await;
    assert!(sent.get("data").is_none(), "{sent}");
    match client.rpc("pay", Some(&5)).await {
        Err(Error::Server { code, message, .. }) => {
            assert_eq!(code, ErrorCode::Other("insufficient_funds".to_owned()));
            assert_eq!(message, "balance 0");
        }
        other => panic!("not the backend's code: {other:?}"),
    }
    // A new connection (the client comes back after a cut): the same data with its `hello`.
    client.cut(herald_client::Cut::Reset).unwrap();
    let again = command(&mut commands, |c| c["op"] == "hello").await;
    assert_eq!(again["data"], json!({"csrf": "c1"}));
}
