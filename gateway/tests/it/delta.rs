//! Deltas for state topics (issue #26): in a namespace with `delta = true`,
//! a client whose `sub` asks for them (`"delta": true`, granted in its
//! `ok`) is sent each publication as a Fossil delta against the one before
//! (`"delta"`), after a first message in full (`"full"`); a client that
//! applies them rebuilds every publication byte for byte. A subscriber of
//! the same topic that did not ask gets plain `msg`s; a `sub` asking where
//! the namespace has no deltas gets plain `msg`s and no `delta` in its
//! `ok`. A client that comes back with `since` is replayed plain messages,
//! then a full one, then deltas again.
//!
//! The clients are tokio-tungstenite's, applying deltas with the
//! `fossil-delta` crate, as any client of the protocol would.

use std::time::Duration;

use gateway::Config;
use router::NamespaceSettings;
use serde_json::{Value, json};
use testkit::{Client, Gateway, WAIT};

/// How many states a story publishes.
const STATES: u64 = 60;

/// Defaults, and a namespace `game` whose topics are state topics.
fn config() -> Config {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "game".to_owned(),
        NamespaceSettings {
            delta: true,
            ..Default::default()
        },
    );
    config
}

/// A game's scoreboard at `tick`: 24 players, 2-4 KiB of JSON, of which
/// a tick changes a few fields.
fn scoreboard(tick: u64) -> Value {
    const NAMES: [&str; 8] = [
        "aurora", "basalt", "cinder", "dune", "ember", "fjord", "glacier", "harbor",
    ];
    let players: Vec<Value> = (0..24u64)
        .map(|i| {
            // Player i scores on the ticks that are i modulo 24, and is
            // hit on those that are i modulo 7.
            let scored = (tick + 24 - i) / 24;
            let hit = (tick + 7 - i % 7) / 7;
            json!({
                "id": i,
                "name": format!("player-{i:02}-{}", NAMES[(i % 8) as usize]),
                "team": if i % 2 == 0 { "red" } else { "blue" },
                "score": scored * 10,
                "health": 100 - (hit * 3) % 100,
                "alive": hit % 5 != 4,
            })
        })
        .collect();
    json!({"game": "42", "tick": tick, "clock": format!("00:{:02}:{:02}", tick / 60, tick % 60), "players": players})
}

/// A client of the protocol's deltas: the base it holds per topic, and
/// what it made of each `msg`.
#[derive(Default)]
struct Applier {
    base: Option<Vec<u8>>,
}

/// What a `msg` was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Full,
    Delta,
    Data,
}

impl Applier {
    /// The data of `msg` (its exact JSON text) and its form, as a client
    /// makes them: the base for the next delta kept.
    fn apply(&mut self, msg: &Value) -> (Vec<u8>, Form) {
        if let Some(full) = msg.get("full") {
            let text = full
                .as_str()
                .expect("`full` is a string")
                .as_bytes()
                .to_vec();
            self.base = Some(text.clone());
            return (text, Form::Full);
        }
        if let Some(delta) = msg.get("delta") {
            let delta: Vec<u8> = delta
                .as_str()
                .expect("`delta` is a string")
                .chars()
                .map(|c| u8::try_from(u32::from(c)).expect("one char per byte"))
                .collect();
            let base = self.base.as_ref().expect("a delta only after a base");
            let target = fossil_delta::apply(base, &delta).expect("the delta applies");
            self.base = Some(target.clone());
            return (target, Form::Delta);
        }
        self.base = None;
        (msg["data"].to_string().into_bytes(), Form::Data)
    }
}

/// `sub` asking for deltas (and `since`, where given); its `ok`.
async fn sub_delta(client: &mut Client, id: u64, topic: &str, since: Option<u64>) -> Value {
    let mut sub = json!({"op": "sub", "id": id, "topic": topic, "delta": true});
    if let Some(since) = since {
        sub["since"] = json!(since);
    }
    client.send(sub).await;
    let ok = client.expect("ok").await;
    assert_eq!(ok["id"], id, "{ok}");
    ok
}

/// Reads `msg`s of `topic` up to `last`, applying them; each one's seq,
/// its data and its form.
async fn read_to(
    client: &mut Client,
    applier: &mut Applier,
    last: u64,
) -> Vec<(u64, Vec<u8>, Form)> {
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT * 3;
    while got.last().is_none_or(|(seq, _, _)| *seq < last) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} messages in time",
            last
        );
        let msg = client.expect("msg").await;
        let seq = msg["seq"].as_u64().expect("seq");
        let (data, form) = applier.apply(&msg);
        got.push((seq, data, form));
    }
    got
}

/// Publishes the scoreboards of ticks `ticks` to `topic`; the JSON text of
/// each, as the publish API keeps it (the body's `data`, compact).
async fn publish_states(
    gw: &Gateway,
    topic: &str,
    ticks: std::ops::RangeInclusive<u64>,
) -> Vec<Vec<u8>> {
    let mut published = Vec::new();
    for tick in ticks {
        let state = scoreboard(tick);
        let text = state.to_string().into_bytes();
        assert!(
            (2048..=4096).contains(&text.len()),
            "a 2-4 KiB state: {}",
            text.len()
        );
        let seq = gw.publish(topic, state).await;
        assert_eq!(seq, tick, "one topic, one publisher");
        published.push(text);
    }
    published
}

#[tokio::test]
async fn a_json_client_rebuilds_every_state_from_a_full_message_and_deltas() {
    let gw = Gateway::with(config()).await;
    let topic = "game:42";
    let mut delta = Client::connect(&gw).await;
    delta.hello(None).await;
    let ok = sub_delta(&mut delta, 1, topic, None).await;
    assert_eq!(ok["delta"], true, "granted: {ok}");
    // A second delta subscriber: the deltas are computed once for both.
    let mut other = Client::connect(&gw).await;
    other.hello(None).await;
    assert_eq!(sub_delta(&mut other, 1, topic, None).await["delta"], true);
    let mut plain = Client::subscriber(&gw.ws_url(), topic).await;
    // Asked for where the namespace has none: plain, and not an error.
    let mut elsewhere = Client::connect(&gw).await;
    elsewhere.hello(None).await;
    let ok = sub_delta(&mut elsewhere, 1, "news", None).await;
    assert!(ok.get("delta").is_none(), "not granted, not said: {ok}");

    let published = publish_states(&gw, topic, 1..=STATES).await;
    gw.publish("news", json!({"n": 1})).await;

    for client in [&mut delta, &mut other] {
        let mut applier = Applier::default();
        let got = read_to(client, &mut applier, STATES).await;
        let seqs: Vec<u64> = got.iter().map(|(seq, _, _)| *seq).collect();
        assert_eq!(
            seqs,
            (1..=STATES).collect::<Vec<_>>(),
            "each seq once, in order"
        );
        for ((seq, data, _), text) in got.iter().zip(&published) {
            assert_eq!(
                String::from_utf8_lossy(data),
                String::from_utf8_lossy(text),
                "seq {seq} rebuilt byte for byte"
            );
        }
        let forms: Vec<Form> = got.iter().map(|(_, _, form)| *form).collect();
        assert_eq!(forms[0], Form::Full, "the first is full");
        // Those that arrived while the subscription went live were held
        // aside in full; from the first delta on, nothing was missed.
        let first_delta = forms
            .iter()
            .position(|f| *f == Form::Delta)
            .expect("deltas");
        assert!(first_delta < 10, "deltas from early on: {forms:?}");
        assert!(
            forms[first_delta..].iter().all(|f| *f == Form::Delta),
            "deltas from then on: {forms:?}"
        );
    }
    for (seq, text) in (1..=STATES).zip(&published) {
        let (_, got_seq, data) = plain.msg().await;
        assert_eq!(got_seq, seq);
        assert_eq!(
            data.to_string().into_bytes(),
            *text,
            "plain `data` for a plain sub"
        );
    }
    let msg = elsewhere.expect("msg").await;
    assert_eq!(
        (msg["seq"].as_u64(), &msg["data"]),
        (Some(1), &json!({"n": 1}))
    );

    // One delta per publication at most, however many take it.
    let encodes = gw.metric("herald_delta_encodes_total").await;
    let deltas = gw
        .metric("herald_delta_deliveries_total{sent=\"delta\"}")
        .await;
    let fulls = gw
        .metric("herald_delta_deliveries_total{sent=\"full\"}")
        .await;
    assert!(encodes <= (STATES - 1) as f64, "{encodes} deltas computed");
    assert!(deltas >= 2.0 * (STATES - 10) as f64, "{deltas} sent");
    assert_eq!(
        deltas + fulls,
        2.0 * STATES as f64,
        "every delivery to a delta subscriber counted"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_back_with_since_is_replayed_plain_then_sent_a_full_state_then_deltas() {
    let gw = Gateway::with(config()).await;
    let topic = "game:7";
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    sub_delta(&mut client, 1, topic, None).await;
    let mut published = publish_states(&gw, topic, 1..=20).await;
    let mut applier = Applier::default();
    let got = read_to(&mut client, &mut applier, 20).await;
    assert_eq!(got.last().map(|(_, data, _)| data), published.last());
    // The client goes away at seq 20; the game goes on.
    client
        .send(json!({"op": "unsub", "id": 2, "topic": topic}))
        .await;
    client.expect("ok").await;
    published.extend(publish_states(&gw, topic, 21..=30).await);

    let ok = sub_delta(&mut client, 3, topic, Some(20)).await;
    assert_eq!(
        (ok["recovered"].as_bool(), ok["delta"].as_bool()),
        (Some(true), Some(true))
    );
    let replayed = read_to(&mut client, &mut applier, 30).await;
    let forms: Vec<Form> = replayed.iter().map(|(_, _, form)| *form).collect();
    assert_eq!(forms, vec![Form::Data; 10], "history is replayed plain");
    // Live again: a full state first, then deltas.
    published.extend(publish_states(&gw, topic, 31..=40).await);
    let live = read_to(&mut client, &mut applier, 40).await;
    let forms: Vec<Form> = live.iter().map(|(_, _, form)| *form).collect();
    assert_eq!(forms[0], Form::Full, "{forms:?}");
    assert!(forms[1..].iter().all(|f| *f == Form::Delta), "{forms:?}");
    for (seq, data, _) in replayed.iter().chain(&live) {
        let text = &published[(*seq - 1) as usize];
        assert_eq!(data, text, "seq {seq}");
    }
    tokio::time::timeout(Duration::from_secs(30), gw.shutdown())
        .await
        .expect("shut down");
}

#[tokio::test]
async fn a_resumed_session_keeps_its_deltas_after_a_plain_replay_and_a_full_state() {
    let gw = Gateway::with(config()).await;
    let topic = "game:9";
    let mut client = Client::connect(&gw).await;
    let session = client.hello(None).await["session"]
        .as_str()
        .expect("session")
        .to_owned();
    let ok = sub_delta(&mut client, 1, topic, None).await;
    let epoch = ok["epoch"].as_str().expect("epoch").to_owned();
    let mut published = publish_states(&gw, topic, 1..=10).await;
    let mut applier = Applier::default();
    read_to(&mut client, &mut applier, 10).await;
    client
        .send(json!({"op": "ack", "topic": topic, "seq": 10, "epoch": epoch}))
        .await;
    // Acks get no reply: a ping's `ok` says the ack before it was read.
    client.send(json!({"op": "ping", "id": 2})).await;
    client.expect("ok").await;
    drop(client);
    published.extend(publish_states(&gw, topic, 11..=15).await);

    let mut client = Client::connect(&gw).await;
    let welcome = client.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    let mut applier = Applier::default();
    let replayed = read_to(&mut client, &mut applier, 15).await;
    let forms: Vec<Form> = replayed.iter().map(|(_, _, form)| *form).collect();
    assert_eq!(forms, vec![Form::Data; 5], "what it missed, plain");
    published.extend(publish_states(&gw, topic, 16..=25).await);
    let live = read_to(&mut client, &mut applier, 25).await;
    let forms: Vec<Form> = live.iter().map(|(_, _, form)| *form).collect();
    assert_eq!(forms[0], Form::Full, "{forms:?}");
    assert!(
        forms[1..].iter().all(|f| *f == Form::Delta),
        "deltas again: {forms:?}"
    );
    for (seq, data, _) in replayed.iter().chain(&live) {
        assert_eq!(data, &published[(*seq - 1) as usize], "seq {seq}");
    }
    gw.shutdown().await;
}

/// A client of the `herald.v1.protobuf` subprotocol: prost messages of the
/// proto crate in binary WebSocket messages.
mod protobuf {
    use futures_util::{SinkExt, StreamExt};
    use prost::Message as _;
    use proto::v1::{self, client_command::Op as C, server_message::Op as S};
    use testkit::{Gateway, WAIT};
    use tokio::net::TcpStream;
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

    pub struct Pb {
        ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    }

    impl Pb {
        pub async fn connect(gw: &Gateway) -> Self {
            let mut request = gw.ws_url().into_client_request().expect("a request");
            request.headers_mut().insert(
                "sec-websocket-protocol",
                "herald.v1.protobuf".parse().expect("a header value"),
            );
            let (ws, response) =
                tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
                    .await
                    .expect("connect in time")
                    .expect("connect");
            let protocol = response.headers().get("sec-websocket-protocol");
            assert_eq!(
                protocol.and_then(|v| v.to_str().ok()),
                Some("herald.v1.protobuf")
            );
            Self { ws }
        }

        pub async fn send(&mut self, op: C) {
            let bytes = v1::ClientCommand { op: Some(op) }.encode_to_vec();
            self.ws.send(Message::binary(bytes)).await.expect("send");
        }

        /// The next server message (pings are answered by the library).
        pub async fn recv(&mut self) -> S {
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
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }
}

#[tokio::test]
async fn a_protobuf_client_rebuilds_every_state_from_a_full_message_and_deltas() {
    use proto::v1::{self, client_command::Op as C, server_message::Op as S};

    let gw = Gateway::with(config()).await;
    let topic = "game:pb";
    let mut pb = protobuf::Pb::connect(&gw).await;
    pb.send(C::Hello(v1::Hello::default())).await;
    assert!(matches!(pb.recv().await, S::Welcome(_)));
    pb.send(C::Sub(v1::Sub {
        id: 1,
        topic: topic.to_owned(),
        delta: Some(true),
        ..v1::Sub::default()
    }))
    .await;
    let S::Ok(ok) = pb.recv().await else {
        panic!("an ok")
    };
    assert_eq!((ok.id, ok.delta), (1, Some(true)), "granted");
    // A JSON client beside it, that asked for nothing.
    let mut plain = Client::subscriber(&gw.ws_url(), topic).await;

    let published = publish_states(&gw, topic, 1..=STATES).await;
    let mut base: Option<Vec<u8>> = None;
    let mut forms = Vec::new();
    for (seq, text) in (1..=STATES).zip(&published) {
        let S::Msg(msg) = pb.recv().await else {
            panic!("a msg")
        };
        assert_eq!((msg.seq, msg.binary), (seq, false));
        let data = if msg.delta {
            let base = base.as_ref().expect("a delta after a base");
            fossil_delta::apply(base, &msg.data).expect("the delta applies")
        } else {
            msg.data
        };
        assert_eq!(&data, text, "seq {seq} rebuilt byte for byte");
        forms.push(if msg.delta { Form::Delta } else { Form::Full });
        base = Some(data);
        let (_, got, data) = plain.msg().await;
        assert_eq!((got, data.to_string().into_bytes()), (seq, text.clone()));
    }
    assert_eq!(forms[0], Form::Full);
    let first_delta = forms
        .iter()
        .position(|f| *f == Form::Delta)
        .expect("deltas");
    assert!(first_delta < 10, "{forms:?}");
    assert!(
        forms[first_delta..].iter().all(|f| *f == Form::Delta),
        "{forms:?}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn binary_states_go_plain_to_json_clients_and_as_deltas_to_protobuf_ones() {
    use proto::v1::{self, client_command::Op as C, server_message::Op as S};

    let gw = Gateway::with(config()).await;
    let topic = "game:bytes";
    let mut json = Client::connect(&gw).await;
    json.hello(None).await;
    sub_delta(&mut json, 1, topic, None).await;
    let mut pb = protobuf::Pb::connect(&gw).await;
    pb.send(C::Hello(v1::Hello::default())).await;
    assert!(matches!(pb.recv().await, S::Welcome(_)));
    pb.send(C::Sub(v1::Sub {
        id: 1,
        topic: topic.to_owned(),
        delta: Some(true),
        ..v1::Sub::default()
    }))
    .await;
    assert!(matches!(pb.recv().await, S::Ok(ok) if ok.delta == Some(true)));

    // Bytes (a leading 0x00, 0xff and invalid UTF-8 among them), then JSON.
    let mut published = Vec::new();
    for tick in 1..=5 {
        let bytes = [
            &[0u8, 0xff, 0xfe][..],
            scoreboard(tick).to_string().as_bytes(),
        ]
        .concat();
        let path = format!("/v1/publish?topic={topic}");
        let octets = [("content-type", "application/octet-stream")];
        let (status, body) = testkit::http(gw.addr, "POST", &path, &octets, &bytes).await;
        assert_eq!(status, 200, "{body}");
        published.push((bytes, true));
    }
    for text in publish_states(&gw, topic, 6..=8).await {
        published.push((text, false));
    }

    // JSON: binary data plain (base64), never a delta; then JSON in full
    // first, as its base was dropped.
    let mut applier = Applier::default();
    let got = read_to(&mut json, &mut applier, 8).await;
    let forms: Vec<Form> = got.iter().map(|(_, _, form)| *form).collect();
    let want = [Form::Data; 5]
        .into_iter()
        .chain([Form::Full, Form::Delta, Form::Delta]);
    assert_eq!(forms, want.collect::<Vec<_>>());
    assert_eq!(got[7].1, published[7].0);

    // Protobuf: a delta of bytes against bytes; JSON in full after bytes.
    let mut base: Option<Vec<u8>> = None;
    let mut forms = Vec::new();
    for (seq, (sent, binary)) in (1..).zip(&published) {
        let S::Msg(msg) = pb.recv().await else {
            panic!("a msg")
        };
        assert_eq!((msg.seq, msg.binary), (seq, *binary));
        let data = match (msg.delta, &base) {
            (true, Some(base)) => fossil_delta::apply(base, &msg.data).expect("applies"),
            (true, None) => panic!("a delta without a base"),
            (false, _) => msg.data,
        };
        assert_eq!(&data, sent, "seq {seq} byte for byte");
        forms.push(if msg.delta { Form::Delta } else { Form::Full });
        base = Some(data);
    }
    assert_eq!(forms[0], Form::Full);
    // (A frame held aside while the subscription went live is full.)
    let first_delta = forms.iter().position(|f| *f == Form::Delta);
    assert!(
        first_delta.is_some_and(|at| at < 5),
        "bytes as deltas: {forms:?}"
    );
    assert!(
        forms[first_delta.unwrap_or(0)..5]
            .iter()
            .all(|f| *f == Form::Delta)
    );
    assert_eq!(
        forms[5..],
        [Form::Full, Form::Delta, Form::Delta],
        "JSON after bytes: no delta across kinds"
    );
    gw.shutdown().await;
}
