#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! Deltas and binary data as the client reads them, in both encodings,
//! from a scripted server (a WebSocket server in the test that writes each
//! frame as docs/protocol.md and spec26 spell it, JSON text or
//! `herald.v1.protobuf`): a state topic's chain of Fossil deltas reaches the
//! application whole; a delta the client cannot apply (its base is not the
//! previous seq) makes it drop the connection and resume, and the replay
//! brings the message whole, with nothing lost or repeated.

mod common;

use std::sync::Arc;

use base64::Engine as _;
use common::until;
use futures_util::{SinkExt, StreamExt};
use herald_client::{Client, Data, Error, Event, Protocol, State, SubscribeOptions};
use prost::Message as _;
use proto::v1;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tokio_tungstenite::tungstenite::handshake::server::{Request, Response};
use tokio_tungstenite::tungstenite::http::HeaderValue;

/// What the scripted server sends, written in the connection's encoding.
enum Out {
    Welcome {
        resumed: bool,
    },
    /// The `ok` of a `sub`, granting deltas or not.
    SubOk {
        id: u64,
        seq: u64,
        delta: bool,
    },
    /// The plain `msg` (a replay, a subscription without deltas).
    Data {
        seq: u64,
        json: String,
    },
    /// Binary data: base64 with `binary` in JSON, bytes in protobuf.
    Binary {
        seq: u64,
        bytes: Vec<u8>,
    },
    /// The full data in a delta subscription (JSON: `full`, a string).
    Full {
        seq: u64,
        json: String,
    },
    /// A delta (JSON: one char per byte; protobuf: `Msg.delta`), of JSON
    /// text or (protobuf only) binary data.
    Delta {
        seq: u64,
        bytes: Vec<u8>,
        binary: bool,
    },
}

const TOPIC: &str = "game:1";
const EPOCH: &str = "e1";

impl Out {
    fn encode(&self, protocol: Protocol) -> WsMessage {
        match protocol {
            // The publisher's JSON as it is (a `Value` would reorder it).
            Protocol::Json => match self {
                Out::Data { seq, json } => WsMessage::text(format!(
                    r#"{{"op":"msg","topic":"{TOPIC}","seq":{seq},"data":{json}}}"#
                )),
                _ => WsMessage::text(self.json().to_string()),
            },
            _ => WsMessage::binary(
                v1::ServerMessage {
                    op: Some(self.proto()),
                }
                .encode_to_vec(),
            ),
        }
    }

    fn json(&self) -> Value {
        let msg = |seq: u64| json!({"op": "msg", "topic": TOPIC, "seq": seq});
        let with = |mut v: Value, key: &str, value: Value| {
            v[key] = value;
            v
        };
        match self {
            Out::Welcome { resumed } => {
                json!({"op": "welcome", "session": "s1", "ping_ms": 25000, "resumed": resumed})
            }
            Out::SubOk { id, seq, delta } => {
                let ok = json!({"op": "ok", "id": id, "topic": TOPIC, "seq": seq, "epoch": EPOCH});
                if *delta {
                    with(ok, "delta", json!(true))
                } else {
                    ok
                }
            }
            Out::Data { .. } => unreachable!("written as text"),
            Out::Binary { seq, bytes } => {
                let b64 = base64::engine::general_purpose::STANDARD.encode(bytes);
                with(with(msg(*seq), "data", json!(b64)), "binary", json!(true))
            }
            Out::Full { seq, json } => with(msg(*seq), "full", json!(json)),
            Out::Delta { seq, bytes, binary } => {
                assert!(!binary, "binary deltas go to protobuf clients only");
                let chars: String = bytes.iter().map(|&b| char::from(b)).collect();
                with(msg(*seq), "delta", json!(chars))
            }
        }
    }

    fn proto(&self) -> v1::server_message::Op {
        use v1::server_message::Op;
        let msg = |seq: u64, data: &[u8], delta: bool, binary: bool| {
            Op::Msg(v1::Msg {
                topic: TOPIC.into(),
                seq,
                data: data.to_vec(),
                delta,
                binary,
            })
        };
        match self {
            Out::Welcome { resumed } => Op::Welcome(v1::Welcome {
                session: "s1".into(),
                ping_ms: 25_000,
                resumed: *resumed,
                ..v1::Welcome::default()
            }),
            Out::SubOk { id, seq, delta } => Op::Ok(v1::Ok {
                id: *id,
                topic: Some(TOPIC.into()),
                seq: Some(*seq),
                epoch: Some(EPOCH.into()),
                delta: delta.then_some(true),
                ..v1::Ok::default()
            }),
            Out::Data { seq, json } | Out::Full { seq, json } => {
                msg(*seq, json.as_bytes(), false, false)
            }
            Out::Binary { seq, bytes } => msg(*seq, bytes, false, true),
            Out::Delta { seq, bytes, binary } => msg(*seq, bytes, true, *binary),
        }
    }
}

/// A command the client sent, as JSON whichever the encoding (the keys
/// these stories read).
fn command_json(protocol: Protocol, message: WsMessage) -> Option<Value> {
    use v1::client_command::Op;
    match (protocol, message) {
        (Protocol::Json, WsMessage::Text(text)) => serde_json::from_str(text.as_str()).ok(),
        (Protocol::Protobuf, WsMessage::Binary(bytes)) => {
            Some(match v1::ClientCommand::decode(bytes).unwrap().op? {
                Op::Hello(h) => json!({"op": "hello", "resume": h.resume}),
                Op::Sub(s) => {
                    json!({"op": "sub", "id": s.id, "topic": s.topic, "since": s.since, "delta": s.delta})
                }
                Op::Ack(a) => json!({"op": "ack", "topic": a.topic, "seq": a.seq}),
                other => json!({"op": format!("{other:?}")}),
            })
        }
        (_, WsMessage::Close(_) | WsMessage::Ping(_) | WsMessage::Pong(_)) => None,
        (protocol, message) => panic!("{message:?} on a {protocol:?} connection"),
    }
}

/// Serves connections on a loopback port in `protocol` (selecting
/// `herald.v1.protobuf` on the upgrade when the client offers it): what
/// `script` answers to each command of the connection (numbered from 0);
/// every command also goes to the returned channel.
async fn scripted(
    protocol: Protocol,
    script: impl Fn(usize, &Value) -> Vec<Out> + Send + Sync + 'static,
) -> (String, mpsc::UnboundedReceiver<(usize, Value)>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("ws://{}/ws", listener.local_addr().unwrap());
    let (got, commands) = mpsc::unbounded_channel();
    let script = Arc::new(script);
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((stream, _)) = listener.accept().await {
            // The `Err` type is tungstenite's, as its callback wants it.
            #[allow(clippy::result_large_err)]
            let select = |request: &Request, mut response: Response| {
                let offered = request
                    .headers()
                    .get("sec-websocket-protocol")
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.split(',').any(|p| p.trim() == "herald.v1.protobuf"));
                assert_eq!(offered, protocol == Protocol::Protobuf, "the offer");
                if offered {
                    response.headers_mut().insert(
                        "sec-websocket-protocol",
                        HeaderValue::from_static("herald.v1.protobuf"),
                    );
                }
                Ok(response)
            };
            let Ok(mut ws) = tokio_tungstenite::accept_hdr_async(stream, select).await else {
                continue;
            };
            let (conn, got, script) = (n, got.clone(), script.clone());
            n += 1;
            tokio::spawn(async move {
                while let Some(Ok(message)) = ws.next().await {
                    let Some(command) = command_json(protocol, message) else {
                        continue;
                    };
                    let _ = got.send((conn, command.clone()));
                    for out in script(conn, &command) {
                        if ws.send(out.encode(protocol)).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (url, commands)
}

/// A scoreboard of a few KiB (names with accents: their UTF-8 bytes land
/// in the deltas' literals) where one score changes per round.
fn board(round: u64) -> String {
    let teams: Vec<String> = (0..40)
        .map(|t| {
            let score = if t == round % 40 { round * 7 } else { t * 3 };
            format!(r#"{{"team":"t{t:02}","name":"Équipe Zoë {t}","score":{score}}}"#)
        })
        .collect();
    format!(r#"{{"round":{round},"teams":[{}]}}"#, teams.join(","))
}

/// The Fossil delta from `from` to `to` (the crate takes the target first).
fn delta(from: impl AsRef<[u8]>, to: impl AsRef<[u8]>) -> Vec<u8> {
    fossil_delta::delta(to, from)
}

fn json_data(text: &str) -> Data {
    Data::Json(serde_json::value::RawValue::from_string(text.to_owned()).unwrap())
}

/// The next `n` messages' (seq, data), whatever else comes between them
/// (kept in `others`).
async fn messages(
    events: &mut herald_client::Events,
    n: usize,
    others: &mut Vec<Event>,
) -> Vec<(u64, Data)> {
    common::messages(events, n, others)
        .await
        .into_iter()
        .map(|m| (m.seq, m.data))
        .collect()
}

async fn a_delta_chain_reaches_the_application_whole(protocol: Protocol) {
    let (url, mut commands) = scripted(protocol, move |_, c| {
        match c["op"].as_str() {
            Some("hello") => vec![Out::Welcome { resumed: false }],
            Some("sub") => {
                let mut out = vec![
                    Out::SubOk {
                        id: c["id"].as_u64().unwrap(),
                        seq: 0,
                        delta: true,
                    },
                    Out::Full {
                        seq: 1,
                        json: board(1),
                    },
                ];
                for seq in 2..=12 {
                    out.push(Out::Delta {
                        seq,
                        bytes: delta(board(seq - 1), board(seq)),
                        binary: false,
                    });
                }
                // Binary data: in JSON plain base64 (no base), then full
                // again; in protobuf a base, then a binary delta.
                let (a, b) = (binary(13), binary(14));
                out.push(Out::Binary {
                    seq: 13,
                    bytes: a.clone(),
                });
                out.push(match protocol {
                    Protocol::Json => Out::Full {
                        seq: 14,
                        json: board(14),
                    },
                    _ => Out::Delta {
                        seq: 14,
                        bytes: delta(&a, &b),
                        binary: true,
                    },
                });
                out
            }
            _ => vec![],
        }
    })
    .await;
    let (client, mut events) = Client::builder([url]).protocol(protocol).build().unwrap();
    let options = SubscribeOptions {
        delta: true,
        ..SubscribeOptions::default()
    };
    client.subscribe_with(TOPIC, options).unwrap();
    let (_, sub) = tokio::time::timeout(testkit::WAIT, async {
        loop {
            let (conn, c) = commands.recv().await.unwrap();
            if c["op"] == "sub" {
                return (conn, c);
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(sub["delta"], json!(true), "{sub}");
    let granted = until(&mut events, |e| match e {
        Event::Subscribed { delta, .. } => Some(*delta),
        _ => None,
    })
    .await;
    assert!(granted);
    let mut others = Vec::new();
    let got = messages(&mut events, 14, &mut others).await;
    let mut want: Vec<(u64, Data)> = (1..=12).map(|seq| (seq, json_data(&board(seq)))).collect();
    want.push((13, Data::Binary(binary(13).into())));
    want.push((
        14,
        match protocol {
            Protocol::Json => json_data(&board(14)),
            _ => Data::Binary(binary(14).into()),
        },
    ));
    for ((seq, data), (want_seq, want_data)) in got.iter().zip(&want) {
        assert_eq!((seq, data), (want_seq, want_data), "seq {seq}");
    }
    assert!(
        !others.iter().any(|e| matches!(e, Event::Error(_))),
        "{others:?}"
    );
}

/// Binary data with bytes no text has (0x00, 0xff, invalid UTF-8), a few
/// changed per `n`.
fn binary(n: u64) -> Vec<u8> {
    let mut bytes: Vec<u8> = (0..=255u8).cycle().take(1500).collect();
    bytes[usize::try_from(n).unwrap() * 10] = 0xff;
    bytes
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_chain_reaches_the_application_whole_in_json() {
    a_delta_chain_reaches_the_application_whole(Protocol::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_chain_reaches_the_application_whole_in_protobuf() {
    a_delta_chain_reaches_the_application_whole(Protocol::Protobuf).await;
}

async fn a_delta_without_its_base_brings_the_client_back_and_the_replay_whole(protocol: Protocol) {
    let (url, mut commands) = scripted(protocol, |conn, c| match (conn, c["op"].as_str()) {
        (0, Some("hello")) => vec![Out::Welcome { resumed: false }],
        (0, Some("sub")) => vec![
            Out::SubOk {
                id: c["id"].as_u64().unwrap(),
                seq: 0,
                delta: true,
            },
            Out::Full {
                seq: 1,
                json: board(1),
            },
            Out::Delta {
                seq: 2,
                bytes: delta(board(1), board(2)),
                binary: false,
            },
            // Seq 3 never came: this delta's base is not the client's.
            Out::Delta {
                seq: 4,
                bytes: delta(board(3), board(4)),
                binary: false,
            },
            Out::Delta {
                seq: 5,
                bytes: delta(board(4), board(5)),
                binary: false,
            },
        ],
        // The resume: the session replays what was not acked, plain; then
        // live, full first.
        (1, Some("hello")) => vec![
            Out::Welcome { resumed: true },
            Out::Data {
                seq: 2,
                json: board(2),
            },
            Out::Data {
                seq: 3,
                json: board(3),
            },
            Out::Data {
                seq: 4,
                json: board(4),
            },
            Out::Full {
                seq: 5,
                json: board(5),
            },
            Out::Delta {
                seq: 6,
                bytes: delta(board(5), board(6)),
                binary: false,
            },
        ],
        _ => vec![],
    })
    .await;
    let (client, mut events) = Client::builder([url]).protocol(protocol).build().unwrap();
    let options = SubscribeOptions {
        delta: true,
        ..SubscribeOptions::default()
    };
    client.subscribe_with(TOPIC, options).unwrap();
    let mut others = Vec::new();
    let got = messages(&mut events, 6, &mut others).await;
    let seqs: Vec<u64> = got.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, [1, 2, 3, 4, 5, 6], "once each, in order: {others:?}");
    for (seq, data) in &got {
        assert_eq!(data, &json_data(&board(*seq)), "seq {seq}");
    }
    assert!(
        others.iter().any(|e| matches!(
            e,
            Event::Error(Error::Protocol { reason, .. }) if reason.contains("seq 4")
        )),
        "the bad delta is told: {others:?}"
    );
    assert!(
        others
            .iter()
            .any(|e| matches!(e, Event::State(State::Resumed { .. }))),
        "resumed: {others:?}"
    );
    let hello = tokio::time::timeout(testkit::WAIT, async {
        loop {
            let (conn, c) = commands.recv().await.unwrap();
            if conn == 1 && c["op"] == "hello" {
                return c;
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(hello["resume"], "s1", "{hello}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_without_its_base_brings_the_client_back_and_the_replay_whole_in_json() {
    a_delta_without_its_base_brings_the_client_back_and_the_replay_whole(Protocol::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_without_its_base_brings_the_client_back_and_the_replay_whole_in_protobuf() {
    a_delta_without_its_base_brings_the_client_back_and_the_replay_whole(Protocol::Protobuf).await;
}

/// A gateway whose namespace `game` has deltas (`delta = true`).
async fn delta_gateway() -> testkit::Gateway {
    let mut config = testkit::Gateway::config();
    config.namespaces.insert(
        "game".to_owned(),
        router::NamespaceSettings {
            delta: true,
            ..Default::default()
        },
    );
    testkit::Gateway::with(config).await
}

/// A client of `gateway` in `protocol`, subscribed to `topic` (asking for
/// deltas or not): whether they were granted.
async fn subscribed(
    gateway: &testkit::Gateway,
    protocol: Protocol,
    topic: &str,
    delta: bool,
) -> (Client, herald_client::Events, bool) {
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .protocol(protocol)
        .build()
        .unwrap();
    let options = SubscribeOptions {
        delta,
        ..SubscribeOptions::default()
    };
    client.subscribe_with(topic, options).unwrap();
    let granted = until(&mut events, |e| match e {
        Event::Subscribed { delta, .. } => Some(*delta),
        _ => None,
    })
    .await;
    (client, events, granted)
}

/// Against a gateway: the state topic's subscribers that asked for deltas,
/// in JSON and in protobuf, see every state whole, as a subscriber without
/// deltas sees it; deltas were sent (the hit-rate metric); a namespace
/// without deltas grants none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_topic_reaches_delta_subscribers_whole_in_both_encodings() {
    let gateway = delta_gateway().await;
    let (_plain, mut plain_events, granted) =
        subscribed(&gateway, Protocol::Json, "game:1", false).await;
    assert!(!granted);
    let (_json, mut json_events, granted) =
        subscribed(&gateway, Protocol::Json, "game:1", true).await;
    assert!(granted, "granted in JSON");
    let (_proto, mut proto_events, granted) =
        subscribed(&gateway, Protocol::Protobuf, "game:1", true).await;
    assert!(granted, "granted in protobuf");
    let (_elsewhere, _, granted) = subscribed(&gateway, Protocol::Json, "news", true).await;
    assert!(!granted, "a namespace without deltas grants none");

    const STATES: u64 = 40;
    for round in 1..=STATES {
        let state: Value = serde_json::from_str(&board(round)).unwrap();
        gateway.publish("game:1", state).await;
    }
    let n = usize::try_from(STATES).unwrap();
    let plain = messages(&mut plain_events, n, &mut Vec::new()).await;
    let mut others = Vec::new();
    let by_json = messages(&mut json_events, n, &mut others).await;
    let by_proto = messages(&mut proto_events, n, &mut others).await;
    assert!(
        !others.iter().any(|e| matches!(e, Event::Error(_))),
        "{others:?}"
    );
    for ((p, j), b) in plain.iter().zip(&by_json).zip(&by_proto) {
        assert_eq!((j, b), (p, p), "seq {}", p.0);
    }
    let deltas = gateway
        .metric("herald_delta_deliveries_total{sent=\"delta\"}")
        .await;
    assert!(
        deltas >= f64::from(2 * (u32::try_from(STATES).unwrap() - 1)),
        "deltas sent to both: {deltas}"
    );
}

/// Against a gateway: a delta subscriber whose connection is cut resumes
/// (replayed plain, then a full state, then deltas again) and sees every
/// state whole, once, in order.
async fn a_cut_delta_subscriber_resumes_and_sees_every_state_whole(protocol: Protocol) {
    let gateway = delta_gateway().await;
    let gate = common::Gate::open(&gateway.ws_url());
    let (client, mut events) = Client::builder([gateway.ws_url()])
        .protocol(protocol)
        .endpoints(gate.clone())
        .build()
        .unwrap();
    let options = SubscribeOptions {
        delta: true,
        ..SubscribeOptions::default()
    };
    client.subscribe_with("game:2", options).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::Subscribed { delta: true, .. }).then_some(())
    })
    .await;
    let publish = |from: u64, to: u64| {
        let gateway = &gateway;
        async move {
            for round in from..=to {
                let state: Value = serde_json::from_str(&board(round)).unwrap();
                assert_eq!(gateway.publish("game:2", state).await, round);
            }
        }
    };
    publish(1, 10).await;
    let mut others = Vec::new();
    let mut got = messages(&mut events, 10, &mut others).await;
    let sent = "herald_delta_deliveries_total{sent=\"delta\"}";
    let before = gateway.metric(sent).await;
    assert!(before >= 9.0, "deltas before the cut: {before}");
    gate.set(None);
    client.cut(herald_client::Cut::Reset).unwrap();
    until(&mut events, |e| {
        matches!(e, Event::State(State::Disconnected { .. })).then_some(())
    })
    .await;
    publish(11, 20).await;
    gate.set(Some(&gateway.ws_url()));
    got.extend(messages(&mut events, 10, &mut others).await);
    publish(21, 30).await;
    got.extend(messages(&mut events, 10, &mut others).await);
    let after = gateway.metric(sent).await - before;
    assert!(after >= 8.0, "deltas again after the resume: {after}");
    let seqs: Vec<u64> = got.iter().map(|(seq, _)| *seq).collect();
    assert_eq!(seqs, (1..=30).collect::<Vec<_>>(), "once each, in order");
    for (seq, data) in &got {
        let want: Value = serde_json::from_str(&board(*seq)).unwrap();
        let data: Value = serde_json::from_str(data.json().unwrap().get()).unwrap();
        assert_eq!(data, want, "seq {seq}");
    }
    assert!(
        !others.iter().any(|e| matches!(e, Event::Error(_))),
        "{others:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_delta_subscriber_resumes_and_sees_every_state_whole_in_json() {
    a_cut_delta_subscriber_resumes_and_sees_every_state_whole(Protocol::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_delta_subscriber_resumes_and_sees_every_state_whole_in_protobuf() {
    a_cut_delta_subscriber_resumes_and_sees_every_state_whole(Protocol::Protobuf).await;
}
