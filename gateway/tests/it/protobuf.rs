//! The `herald.v1.protobuf` subprotocol on `/ws`: negotiated on the upgrade
//! (`Sec-WebSocket-Protocol`, answered in the 101), then every command and
//! every server message one protobuf message in one binary WebSocket
//! message, with the JSON protocol's semantics, error codes and limits
//! (replies, replays, presence diffs, resets, resumes, posted commands).
//! Seen from a library client (tokio-tungstenite) speaking prost messages
//! of the proto crate, from a raw client for the bytes on the wire (the
//! subprotocol with permessage-deflate, a `msg`'s envelope), and from
//! Python's `websockets` against the real binary
//! (`tests/python/protobuf.py`).

use std::path::Path;
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use proto::v1::{self, client_command::Op as C, server_message::Op as S};
use router::{NamespaceSettings, Publish};
use serde_json::{Value, json};
use testkit::raw::{BINARY, FIN, RSV1, RawClient, TEXT, encode};
use testkit::{Client, Gateway, Herald, WAIT, process};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

use crate::pod::HERALD;
use crate::presence::{SECRET, token};

const PROTOBUF: &str = "herald.v1.protobuf";

/// Tokens checked; `room` keeps presence (with diffs) and lets users
/// publish, as `chat` does.
fn config() -> gateway::Config {
    let mut config = Gateway::config();
    config.auth.hmac_secret = SECRET.to_owned();
    config.auth.allow_anonymous = true;
    config.presence.diff_interval = Duration::from_millis(100);
    config.namespaces.insert(
        "room".into(),
        NamespaceSettings {
            publish: Publish::Authenticated,
            presence: true,
            join_leave: true,
            ..Default::default()
        },
    );
    config
}

/// A client that offered `herald.v1.protobuf`: prost messages in binary
/// WebSocket messages. The presence diffs it reads on the way to another
/// message are kept for [`Pb::diff`].
struct Pb {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The subprotocol the 101 named.
    protocol: Option<String>,
    diffs: Vec<v1::PresenceDiff>,
}

impl Pb {
    async fn connect(gw: &Gateway) -> Self {
        Self::offering(&gw.ws_url(), PROTOBUF).await
    }

    async fn offering(url: &str, offer: &str) -> Self {
        let mut request = url.into_client_request().expect("a request");
        request.headers_mut().insert(
            "sec-websocket-protocol",
            offer.parse().expect("a header value"),
        );
        let (ws, response) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("connect in time")
            .expect("connect");
        let protocol = response
            .headers()
            .get("sec-websocket-protocol")
            .map(|v| v.to_str().expect("ASCII").to_owned());
        Self {
            ws,
            protocol,
            diffs: Vec::new(),
        }
    }

    async fn send(&mut self, op: C) {
        let bytes = v1::ClientCommand { op: Some(op) }.encode_to_vec();
        self.send_bytes(bytes).await;
    }

    async fn send_bytes(&mut self, bytes: Vec<u8>) {
        self.ws.send(Message::binary(bytes)).await.expect("send");
    }

    /// The next server message but a presence diff.
    async fn recv(&mut self) -> S {
        loop {
            match self.next().await {
                S::PresenceDiff(diff) => self.diffs.push(diff),
                other => return other,
            }
        }
    }

    /// The next server message: a binary message holding one
    /// `ServerMessage` (pings are answered by the library).
    async fn next(&mut self) -> S {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("a message in time")
                .expect("connection open")
                .expect("a frame");
            match message {
                Message::Binary(bytes) => {
                    return v1::ServerMessage::decode(&*bytes)
                        .expect("a ServerMessage")
                        .op
                        .expect("an op");
                }
                Message::Ping(_) | Message::Pong(_) => {}
                other => panic!("expected a binary message, got {other:?}"),
            }
        }
    }

    async fn ok(&mut self) -> v1::Ok {
        match self.recv().await {
            S::Ok(ok) => ok,
            other => panic!("expected ok, got {other:?}"),
        }
    }

    async fn err(&mut self) -> v1::Err {
        match self.recv().await {
            S::Err(err) => err,
            other => panic!("expected err, got {other:?}"),
        }
    }

    async fn msg(&mut self) -> v1::Msg {
        match self.recv().await {
            S::Msg(msg) => msg,
            other => panic!("expected msg, got {other:?}"),
        }
    }

    async fn hello(&mut self, token: Option<String>) -> v1::Welcome {
        self.send(C::Hello(v1::Hello {
            token,
            ..Default::default()
        }))
        .await;
        match self.recv().await {
            S::Welcome(welcome) => welcome,
            other => panic!("expected welcome, got {other:?}"),
        }
    }

    async fn sub(&mut self, id: u64, topic: &str, since: Option<u64>) -> v1::Ok {
        self.send(C::Sub(v1::Sub {
            id,
            topic: topic.into(),
            since,
            ..Default::default()
        }))
        .await;
        self.ok().await
    }

    /// The next presence diff of `topic`, kept or to come.
    async fn diff(&mut self, topic: &str) -> v1::PresenceDiff {
        loop {
            if let Some(at) = self.diffs.iter().position(|d| d.topic == topic) {
                return self.diffs.remove(at);
            }
            let next = self.next().await;
            match next {
                S::PresenceDiff(diff) => self.diffs.push(diff),
                other => panic!("expected a presence diff, got {other:?}"),
            }
        }
    }

    /// Reads until the server closes; its close code.
    async fn closed(&mut self) -> Option<u16> {
        loop {
            let message = tokio::time::timeout(WAIT, self.ws.next())
                .await
                .expect("close in time");
            match message {
                Some(Ok(Message::Close(frame))) => return frame.map(|f| u16::from(f.code)),
                Some(Ok(_)) => {}
                None | Some(Err(_)) => return None,
            }
        }
    }
}

#[tokio::test]
async fn every_command_goes_in_binary_with_the_json_protocols_answers() {
    let gw = Gateway::with(config()).await;
    let mut pb = Pb::connect(&gw).await;
    assert_eq!(pb.protocol.as_deref(), Some(PROTOBUF));
    let welcome = pb.hello(Some(token("alice", None))).await;
    assert!(!welcome.resumed && welcome.session.len() == 32 && welcome.expires.is_some());

    // Two before the sub: replayed after `since` 1.
    gw.publish("room:p", json!({"n": 1})).await;
    gw.publish("room:p", json!({"n": 2})).await;
    let ok = pb.sub(1, "room:p", Some(1)).await;
    assert_eq!(
        (ok.id, ok.topic.as_deref(), ok.seq, ok.recovered),
        (1, Some("room:p"), Some(2), Some(true))
    );
    let epoch = ok.epoch.expect("an epoch");
    let replayed = pb.msg().await;
    assert_eq!((replayed.seq, &replayed.data[..]), (2, &br#"{"n":2}"#[..]));

    // A pub of JSON text: its ok, and the msg, in either order.
    pb.send(C::Pub(v1::Pub {
        id: 2,
        topic: "room:p".into(),
        data: br#"{"from": "pb"}"#.to_vec(),
    }))
    .await;
    let (mut ok, mut msg) = (None, None);
    for _ in 0..2 {
        match pb.recv().await {
            S::Ok(o) => ok = Some(o),
            S::Msg(m) => msg = Some(m),
            other => panic!("expected ok and msg, got {other:?}"),
        }
    }
    let (ok, msg) = (ok.expect("the pub's ok"), msg.expect("its msg"));
    assert_eq!((ok.id, ok.seq), (2, Some(3)));
    assert_eq!(
        (msg.topic.as_str(), msg.seq, &msg.data[..]),
        ("room:p", 3, &br#"{"from": "pb"}"#[..])
    );

    // Acks count (one newer than anything sent is refused, as in JSON).
    pb.send(C::Ack(v1::Ack {
        topic: "room:p".into(),
        seq: 3,
        epoch: Some(epoch.clone()),
    }))
    .await;
    pb.send(C::Ack(v1::Ack {
        topic: "room:p".into(),
        seq: 99,
        epoch: Some(epoch.clone()),
    }))
    .await;
    let err = pb.err().await;
    assert_eq!(
        (err.id, err.code.as_str(), err.topic.as_deref()),
        (None, "malformed", Some("room:p"))
    );

    pb.send(C::History(v1::History {
        id: 3,
        topic: "room:p".into(),
        limit: Some(10),
        ..Default::default()
    }))
    .await;
    let page = pb.ok().await;
    assert_eq!(
        (page.id, page.seq, page.epoch.as_deref()),
        (3, Some(3), Some(&*epoch))
    );
    let seqs: Vec<u64> = page.publications.iter().map(|p| p.seq).collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert_eq!(page.publications[0].data, br#"{"n":1}"#);

    // Presence: the page, and the diff of alice's join.
    pb.send(C::Presence(v1::Presence {
        id: 4,
        topic: "room:p".into(),
        ..Default::default()
    }))
    .await;
    let presence = pb.ok().await;
    assert_eq!((presence.id, presence.users), (4, Some(1)));
    let members: Vec<&str> = presence.members.iter().map(|m| m.user.as_str()).collect();
    assert_eq!(members, ["alice"]);
    // Bob joins while alice is live: she is told (her own join's diff may
    // have come, or have passed while she was in her handshake).
    let mut bob = Pb::connect(&gw).await;
    bob.hello(Some(token("bob", None))).await;
    bob.sub(1, "room:p", None).await;
    loop {
        let diff = pb.diff("room:p").await;
        if diff.joins.iter().any(|m| m.user == "bob") {
            assert_eq!(diff.users, 2);
            break;
        }
    }

    pb.send(C::Ping(v1::Ping { id: 5 })).await;
    let pong = pb.ok().await;
    assert_eq!((pong.id, pong.topic, pong.seq), (5, None, None));

    // No rpc proxy: the JSON protocol's code.
    pb.send(C::Rpc(v1::Rpc {
        id: 6,
        method: "rooms/create".into(),
        data: Some(b"{}".to_vec()),
    }))
    .await;
    let err = pb.err().await;
    assert_eq!((err.id, err.code.as_str()), (Some(6), "disabled"));

    pb.send(C::Refresh(v1::Refresh {
        id: 7,
        token: token("alice", None),
    }))
    .await;
    let refreshed = pb.ok().await;
    assert!(refreshed.id == 7 && refreshed.expires.is_some());

    // Live, then unsubscribed.
    gw.publish("room:p", json!({"n": 4})).await;
    assert_eq!(pb.msg().await.seq, 4);
    pb.send(C::Unsub(v1::Unsub {
        id: 8,
        topic: "room:p".into(),
    }))
    .await;
    let left = pb.ok().await;
    assert_eq!((left.id, left.topic.as_deref()), (8, Some("room:p")));
    gw.shutdown().await;
}

#[tokio::test]
async fn what_does_not_decode_is_malformed_and_a_text_message_closes_with_1003() {
    let gw = Gateway::start().await;
    let mut pb = Pb::connect(&gw).await;
    let bad_before = gw.metric("herald_bad_commands_total").await;
    // A field 2 (`sub`) that declares 64 bytes and has 1: refused as JSON
    // that does not parse is (before any hello, so no welcome yet).
    pb.send_bytes(vec![0x12, 0x40, 0x01]).await;
    let err = pb.err().await;
    assert_eq!((err.id, err.code.as_str()), (None, "malformed"));
    assert!(err.message.contains("ClientCommand"), "{}", err.message);
    // Decodes, but no op this server knows.
    pb.send_bytes(Vec::new()).await;
    assert_eq!(pb.err().await.code, "unknown_op");
    // Missing fields and data that is not JSON text: the JSON protocol's codes.
    pb.send(C::Sub(v1::Sub {
        id: 3,
        ..Default::default()
    }))
    .await;
    let err = pb.err().await;
    assert_eq!((err.id, err.code.as_str()), (Some(3), "missing_field"));
    pb.send(C::Pub(v1::Pub {
        id: 4,
        topic: "chat:a".into(),
        data: b"{not json".to_vec(),
    }))
    .await;
    let err = pb.err().await;
    assert_eq!((err.id, err.code.as_str()), (Some(4), "malformed"));
    assert_eq!(
        gw.metric("herald_bad_commands_total").await - bad_before,
        4.0
    );
    // The connection is still good: an implied hello, and the answer.
    pb.send(C::Ping(v1::Ping { id: 5 })).await;
    assert!(matches!(pb.recv().await, S::Welcome(_)));
    assert_eq!(pb.ok().await.id, 5);

    // A text message: not this subprotocol's.
    pb.ws
        .send(Message::text(r#"{"op":"ping","id":6}"#))
        .await
        .expect("send");
    assert_eq!(pb.closed().await, Some(1003));
    gw.await_metric(
        "herald_connections_closed_total{reason=\"unsupported_data\"}",
        1.0,
    )
    .await;
    gw.shutdown().await;
}

/// The 101's `Sec-WebSocket-Protocol`, if any.
fn answered(head: &str) -> Option<String> {
    head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("sec-websocket-protocol")
            .then(|| value.trim().to_owned())
    })
}

/// A ping command (binary: protobuf; else JSON text), and the answer's
/// opcode and payload.
async fn ping(client: &mut RawClient, binary: bool) -> (u8, Vec<u8>) {
    if binary {
        let ping = v1::ClientCommand {
            op: Some(C::Ping(v1::Ping { id: 9 })),
        };
        assert_eq!(ping.encode_to_vec(), [0x3a, 0x02, 0x08, 0x09]);
        client
            .send_bytes(&encode(FIN | BINARY, &ping.encode_to_vec(), true))
            .await;
    } else {
        client.send_text(r#"{"op":"ping","id":9}"#).await;
    }
    // The implied hello's welcome, then the ok.
    let _welcome = client.read_frame().await;
    let ok = client.read_frame().await;
    (ok.opcode, ok.payload)
}

#[tokio::test]
async fn the_upgrade_answers_the_first_offered_subprotocol_it_speaks() {
    let gw = Gateway::start().await;
    // Among others, in two headers: selected and named.
    let (mut client, head) = RawClient::connect_with(
        gw.addr,
        &[
            ("Sec-WebSocket-Protocol", "chat"),
            ("Sec-WebSocket-Protocol", "mqtt, herald.v1.protobuf"),
        ],
    )
    .await;
    assert_eq!(answered(&head).as_deref(), Some(PROTOBUF));
    let (opcode, payload) = ping(&mut client, true).await;
    assert_eq!(opcode, BINARY);
    let ok = v1::ServerMessage::decode(&payload[..]).expect("a ServerMessage");
    assert!(matches!(ok.op, Some(S::Ok(v1::Ok { id: 9, .. }))), "{ok:?}");
    // The bytes docs/protocol.md shows (there with id 5).
    assert_eq!(payload, [0x12, 0x02, 0x08, 0x09]);

    // JSON by name: named, and JSON it is.
    let (mut client, head) = RawClient::connect_with(
        gw.addr,
        &[(
            "Sec-WebSocket-Protocol",
            "herald.v1.json, herald.v1.protobuf",
        )],
    )
    .await;
    assert_eq!(answered(&head).as_deref(), Some("herald.v1.json"));
    let (opcode, payload) = ping(&mut client, false).await;
    let ok: Value = serde_json::from_slice(&payload).expect("JSON");
    assert_eq!((opcode, &ok), (TEXT, &json!({"op": "ok", "id": 9})));

    // Neither, or nothing offered: JSON, and no header (a client that
    // offered something else must not be answered what it did not offer).
    for offer in [Some("chat, superchat"), None] {
        let headers: Vec<_> = offer
            .map(|o| ("Sec-WebSocket-Protocol", o))
            .into_iter()
            .collect();
        let (mut client, head) = RawClient::connect_with(gw.addr, &headers).await;
        assert_eq!(answered(&head), None, "{offer:?}");
        assert_eq!(ping(&mut client, false).await.0, TEXT);
    }
    // A library client offering only other subprotocols connects too.
    let mut json_client = Client::connect(&gw).await;
    json_client.hello(None).await;
    assert_eq!(
        gw.metric("herald_connections_protocol_total{protocol=\"protobuf\"}")
            .await,
        1.0
    );
    assert_eq!(
        gw.metric("herald_connections_protocol_total{protocol=\"json\"}")
            .await,
        4.0
    );
    gw.shutdown().await;
}

/// `data` as a client compresses it (RFC 7692): raw deflate, sync flush,
/// its tail removed.
fn compress(data: &[u8]) -> Vec<u8> {
    use flate2::{Compress, Compression, FlushCompress};
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(data.len() + 1024);
    c.compress_vec(data, &mut out, FlushCompress::Sync)
        .expect("deflate");
    assert_eq!(c.total_in() as usize, data.len(), "room for all of it");
    out.truncate(out.len() - 4);
    out
}

fn inflate(payload: &[u8]) -> Vec<u8> {
    use flate2::{Decompress, FlushDecompress};
    let mut input = payload.to_vec();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut out = Vec::with_capacity(1 << 20);
    Decompress::new(false)
        .decompress_vec(&input, &mut out, FlushDecompress::Sync)
        .expect("the server's frame inflates");
    out
}

#[tokio::test]
async fn the_subprotocol_and_permessage_deflate_go_together() {
    let gw = Gateway::start().await;
    let (mut client, head) = RawClient::connect_with(
        gw.addr,
        &[
            ("Sec-WebSocket-Protocol", PROTOBUF),
            (
                "Sec-WebSocket-Extensions",
                "permessage-deflate; client_max_window_bits",
            ),
        ],
    )
    .await;
    assert_eq!(answered(&head).as_deref(), Some(PROTOBUF));
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-extensions: permessage-deflate"),
        "{head}"
    );
    // A compressed binary command (RSV1 on a binary message).
    let sub = v1::ClientCommand {
        op: Some(C::Sub(v1::Sub {
            id: 1,
            topic: "chat:zip".into(),
            ..Default::default()
        })),
    };
    client
        .send_bytes(&encode(
            FIN | RSV1 | BINARY,
            &compress(&sub.encode_to_vec()),
            true,
        ))
        .await;
    let welcome = client.read_frame().await;
    assert_eq!((welcome.opcode, welcome.rsv), (BINARY, 0), "small: plain");
    let ok = client.read_frame().await;
    let ok = v1::ServerMessage::decode(&ok.payload[..]).expect("a ServerMessage");
    assert!(matches!(ok.op, Some(S::Ok(v1::Ok { id: 1, .. }))), "{ok:?}");

    // A large publication: binary, compressed, a ServerMessage once inflated.
    let large = json!({"players": (0..60).map(|i| json!({"name": format!("player {i}"), "score": i * 37})).collect::<Vec<_>>()});
    gw.publish("chat:zip", large.clone()).await;
    let frame = client.read_frame().await;
    assert_eq!((frame.opcode, frame.rsv), (BINARY, RSV1));
    let inflated = inflate(&frame.payload);
    assert!(frame.payload.len() < inflated.len() / 2);
    let Some(S::Msg(msg)) = v1::ServerMessage::decode(&inflated[..])
        .expect("a ServerMessage")
        .op
    else {
        panic!("a msg")
    };
    let data: Value = serde_json::from_slice(&msg.data).expect("JSON text");
    assert_eq!((msg.seq, data), (1, large));
    gw.shutdown().await;
}

#[tokio::test]
async fn a_msg_costs_at_most_12_bytes_beside_its_topic_and_data() {
    let gw = Gateway::start().await;
    let topic = "chat:envelope";
    let (mut pb, head) =
        RawClient::connect_with(gw.addr, &[("Sec-WebSocket-Protocol", PROTOBUF)]).await;
    assert_eq!(answered(&head).as_deref(), Some(PROTOBUF));
    let sub = v1::ClientCommand {
        op: Some(C::Sub(v1::Sub {
            id: 1,
            topic: topic.into(),
            ..Default::default()
        })),
    };
    pb.send_bytes(&encode(FIN | BINARY, &sub.encode_to_vec(), true))
        .await;
    let _welcome = pb.read_frame().await;
    let _ok = pb.read_frame().await;
    let mut json_client = Client::subscriber(&gw.ws_url(), topic).await;

    // From a few bytes to just under 16 KiB of data.
    let big = "x".repeat(16 * 1024 - 64);
    for data in [json!(1), json!({"n": 1}), json!(big)] {
        let text = data.to_string();
        let seq = gw.publish(topic, data).await;
        let frame = pb.read_frame().await;
        assert_eq!((frame.opcode, frame.rsv), (BINARY, 0));
        let Some(S::Msg(msg)) = v1::ServerMessage::decode(&frame.payload[..])
            .expect("a ServerMessage")
            .op
        else {
            panic!("a msg")
        };
        assert_eq!((msg.seq, msg.data), (seq, text.as_bytes().to_vec()));
        let envelope = frame.payload.len() - topic.len() - text.len();
        let (_, _, json_data) = json_client.msg().await;
        let json_envelope = json!({"op":"msg","topic":topic,"seq":seq,"data":json_data})
            .to_string()
            .len()
            - topic.len()
            - text.len();
        println!(
            "{} bytes of data: protobuf envelope {envelope} B, JSON {json_envelope} B (+ topic {} B)",
            text.len(),
            topic.len()
        );
        assert!(envelope <= 12, "{envelope} bytes of envelope");
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_json_client_and_a_protobuf_client_get_the_same_publications() {
    let gw = Gateway::start().await;
    let topic = "chat:both";
    let mut json_client = Client::subscriber(&gw.ws_url(), topic).await;
    let mut pb = Pb::connect(&gw).await;
    pb.hello(None).await;
    pb.sub(1, topic, None).await;

    // From a backend: the publisher's JSON text, byte for byte, in both.
    let body = r#"{"topic":"chat:both","data":{ "score" : [1, 2.50], "who": "\u00e9" }}"#;
    let (status, _) = testkit::http(gw.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200);
    let msg = pb.msg().await;
    assert_eq!(msg.data, br#"{ "score" : [1, 2.50], "who": "\u00e9" }"#);
    let (_, seq, data) = json_client.msg().await;
    assert_eq!(seq, msg.seq);
    assert_eq!(data, json!({"score": [1, 2.5], "who": "é"}));

    // From the protobuf client's `pub`: the JSON client gets it as JSON.
    pb.send(C::Pub(v1::Pub {
        id: 2,
        topic: topic.into(),
        data: br#"["from", "protobuf"]"#.to_vec(),
    }))
    .await;
    let (_, seq, data) = json_client.msg().await;
    assert_eq!((seq, data), (msg.seq + 1, json!(["from", "protobuf"])));
    // And its own copy, with its ok.
    let mut seqs = Vec::new();
    for _ in 0..2 {
        match pb.recv().await {
            S::Ok(ok) => seqs.push(ok.seq.expect("seq")),
            S::Msg(m) => seqs.push(m.seq),
            other => panic!("expected ok and msg, got {other:?}"),
        }
    }
    assert_eq!(seqs, [msg.seq + 1; 2]);
    gw.shutdown().await;
}

#[tokio::test]
async fn commands_posted_over_http_to_a_protobuf_session_are_answered_on_its_socket() {
    let gw = Gateway::start().await;
    let mut pb = Pb::connect(&gw).await;
    let session = pb.hello(None).await.session;
    // Posted commands are JSON whatever the session speaks; their replies
    // come in the session's own protocol.
    let body = "{\"op\":\"sub\",\"id\":1,\"topic\":\"chat:posted\"}\n{\"op\":\"ping\",\"id\":2}\n";
    let path = format!("/stream/{session}");
    let (status, answer) = testkit::http(gw.addr, "POST", &path, &[], body.as_bytes()).await;
    assert_eq!(status, 202, "{answer}");
    let ok = pb.ok().await;
    assert_eq!((ok.id, ok.topic.as_deref()), (1, Some("chat:posted")));
    assert_eq!(pb.ok().await.id, 2);
    gw.publish("chat:posted", json!("hi")).await;
    assert_eq!(pb.msg().await.data, br#""hi""#);
    gw.shutdown().await;
}

#[tokio::test]
async fn the_json_protocols_limits_hold_its_size_and_rate() {
    let mut config = Gateway::config();
    config.websocket.max_message_bytes = 1024;
    config.websocket.commands_per_second = 1;
    config.websocket.commands_burst = 3;
    let gw = Gateway::with(config).await;
    // Over the command rate (a burst of 3, the hello one of them): pings
    // past it are refused, each with its id.
    let mut pb = Pb::connect(&gw).await;
    pb.hello(None).await;
    for id in 1..=6 {
        pb.send(C::Ping(v1::Ping { id })).await;
    }
    let mut limited = Vec::new();
    for id in 1..=6 {
        match pb.recv().await {
            S::Ok(ok) => assert_eq!(ok.id, id),
            S::Err(err) => {
                assert_eq!((err.id, err.code.as_str()), (Some(id), "rate_limited"));
                limited.push(id);
            }
            other => panic!("expected ok or err, got {other:?}"),
        }
    }
    assert!(!limited.is_empty() && !limited.contains(&1), "{limited:?}");
    // Over the size limit: 1009.
    let mut pb = Pb::connect(&gw).await;
    pb.send(C::Pub(v1::Pub {
        id: 1,
        topic: "chat:big".into(),
        data: json!("x".repeat(1024)).to_string().into_bytes(),
    }))
    .await;
    assert_eq!(pb.closed().await, Some(1009));
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_clients_acks_after_a_reconnect_advice_still_count() {
    let redis = testkit::Redis::start().await;
    let url = redis.url();
    let pod = || Herald::pod(HERALD, &url, &[("HERALD_LOG__LEVEL", "info")]);
    let (mut a, b) = (pod().await, pod().await);
    let mut pb = Pb::offering(&a.ws_url(), PROTOBUF).await;
    let session = pb.hello(None).await.session;
    pb.sub(1, "news", None).await;
    for n in 1..=3 {
        assert_eq!(
            crate::pod::publish(a.addr, "news", json!(n), None).await.0,
            200
        );
        assert_eq!(pb.msg().await.seq, n);
    }
    // Pod a drains; the client acks what it has only after the advice,
    // while the connection closes (read by the closing session's late ack).
    a.sigterm();
    match pb.recv().await {
        S::Reconnect(advice) => assert_eq!(advice.reason, "draining"),
        other => panic!("expected reconnect, got {other:?}"),
    }
    pb.send(C::Ack(v1::Ack {
        topic: "news".into(),
        seq: 3,
        epoch: None,
    }))
    .await;
    assert_eq!(pb.closed().await, Some(1012));
    assert!(a.wait_exit(WAIT).await.is_some_and(|s| s.success()));

    let mut pb = Pb::offering(&b.ws_url(), PROTOBUF).await;
    pb.send(C::Hello(v1::Hello {
        resume: Some(session),
        ..Default::default()
    }))
    .await;
    match pb.recv().await {
        S::Welcome(welcome) => assert!(welcome.resumed),
        other => panic!("expected welcome, got {other:?}"),
    }
    assert_eq!(
        crate::pod::publish(b.addr, "news", json!(4), None).await.0,
        200
    );
    assert_eq!(pb.msg().await.seq, 4, "nothing acked is replayed");
}

#[tokio::test]
async fn a_resumed_protobuf_session_past_its_history_gets_a_reset() {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "short".into(),
        NamespaceSettings {
            history_size: 1,
            ..Default::default()
        },
    );
    let gw = Gateway::with(config).await;
    let mut pb = Pb::connect(&gw).await;
    let session = pb.hello(None).await.session;
    let epoch = pb.sub(1, "short:t", None).await.epoch.expect("an epoch");
    gw.publish("short:t", json!(1)).await;
    assert_eq!(pb.msg().await.seq, 1);
    pb.send(C::Ack(v1::Ack {
        topic: "short:t".into(),
        seq: 1,
        epoch: Some(epoch.clone()),
    }))
    .await;
    // Ping, so that the ack is in before the connection goes.
    pb.send(C::Ping(v1::Ping { id: 2 })).await;
    assert_eq!(pb.ok().await.id, 2);
    drop(pb);
    // Three more, of which history keeps the last: 2 and 3 are gone.
    for n in 2..=4 {
        gw.publish("short:t", json!(n)).await;
    }
    let mut pb = Pb::connect(&gw).await;
    pb.send(C::Hello(v1::Hello {
        resume: Some(session),
        ..Default::default()
    }))
    .await;
    match pb.recv().await {
        S::Welcome(welcome) => assert!(welcome.resumed),
        other => panic!("expected welcome, got {other:?}"),
    }
    match pb.recv().await {
        S::Reset(reset) => assert_eq!(
            (reset.topic.as_str(), reset.epoch.as_str(), reset.seq),
            ("short:t", epoch.as_str(), 4)
        ),
        other => panic!("expected reset, got {other:?}"),
    }
    gw.publish("short:t", json!(5)).await;
    assert_eq!(pb.msg().await.seq, 5);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_json_connection_refuses_binary_messages() {
    let gw = Gateway::start().await;
    // JSON by name: binary is not its protocol (1003), as without a name.
    let mut client = Pb::offering(&gw.ws_url(), "herald.v1.json").await;
    assert_eq!(client.protocol.as_deref(), Some("herald.v1.json"));
    client.send(C::Ping(v1::Ping { id: 1 })).await;
    assert_eq!(client.closed().await, Some(1003));
    gw.shutdown().await;
}

#[tokio::test]
async fn a_python_websockets_client_speaks_protobuf_with_the_binary() {
    let herald = Herald::start(
        HERALD,
        &[("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated")],
        &[],
    )
    .await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/protobuf.py");
    let script = script.to_str().expect("a UTF-8 path").to_owned();
    let (ws_url, http_url) = (herald.ws_url(), herald.http_url());
    let output = tokio::task::spawn_blocking(move || {
        process::run(
            "python3",
            &[&script, &ws_url, &http_url],
            // Its own waits are 10 s each.
            Duration::from_secs(60),
            "the protobuf test needs python3 with the `websockets` package; run the project's test script (scripts/test.sh), which installs them",
        )
    })
    .await
    .expect("script");
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("protobuf: ok"),
        "protobuf.py failed\n{}",
        process::show(&output)
    );
}
