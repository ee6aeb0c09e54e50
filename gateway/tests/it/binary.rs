//! Binary data end to end (issue #26): a backend publishes bytes, over
//! HTTP (`Content-Type: application/octet-stream`, the topic in the query)
//! or gRPC (`binary = true`), bytes no JSON or UTF-8 check would let
//! through (0x00 first, 0xff, a broken UTF-8 sequence, and bytes that look
//! like JSON text but were sent as bytes). JSON clients (WebSocket and SSE)
//! get them base64-encoded with `"binary":true`; a resume, a `since` replay
//! and every history read (the client's `history`, `GET /v1/history`, gRPC
//! `History`) give back the same bytes, with the embedded broker and
//! through Redis across two pods. A client of the `herald.v1.protobuf`
//! subprotocol gets the bytes themselves with `binary` set, live, replayed
//! and in history. A request that is not one is refused with a status,
//! counted, and publishes nothing.

use std::net::SocketAddr;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use futures_util::{SinkExt, StreamExt};
use prost::Message as _;
use proto::v1::{self, client_command::Op as C, server_message::Op as S};
use proto::v1::{HistoryRequest, PublishBatchRequest, PublishRequest, publish_result};
use serde_json::{Value, json};
use testkit::{Client, Gateway, Herald, Redis, WAIT, grpc_client};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};
use tonic::Code;

use crate::pod::HERALD;
use crate::sse::Stream;

/// 0x00 first (the byte that marks binary data where it is kept), 0xff,
/// 0xc3 0x28 (not UTF-8), a newline (SSE and NDJSON frames are lines).
const BYTES: &[u8] = b"\x00\xff\xfe\xc3\x28 not JSON \x80\n\r\"}";
/// JSON text, sent as bytes: it stays bytes.
const LOOKS_LIKE_JSON: &[u8] = br#"{"a":1}"#;
/// What a batch of announcements on a Redis channel looks like
/// (`+<n>:<length>:<announcement>`), as data.
const LOOKS_LIKE_A_BATCH: &[u8] = b"+2:5:1:e:\x00:3:\xff";

/// What was published at a seq, as a reader must get it back.
#[derive(Debug, Clone)]
enum Sent {
    Bytes(&'static [u8]),
    Json(Value),
}

/// Publishes `bytes` to `topic` over HTTP as `application/octet-stream`,
/// with `query` after the topic and `headers`: the status and the answer.
async fn publish_bytes(
    addr: SocketAddr,
    topic: &str,
    query: &str,
    headers: &[(&str, &str)],
    bytes: &[u8],
) -> (u16, Value) {
    let mut all = vec![("content-type", "application/octet-stream")];
    all.extend_from_slice(headers);
    let path = format!("/v1/publish?topic={topic}{query}");
    let (status, body) = testkit::http(addr, "POST", &path, &all, bytes).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// [`publish_bytes`] that must succeed: the seq.
async fn published_bytes(addr: SocketAddr, topic: &str, bytes: &[u8]) -> u64 {
    let (status, answer) = publish_bytes(addr, topic, "", &[], bytes).await;
    assert_eq!(status, 200, "{answer}");
    answer["seq"].as_u64().expect("seq")
}

/// A gRPC publish request for `data`, bytes when `binary`.
fn grpc_item(topic: &str, data: &[u8], binary: bool) -> PublishRequest {
    PublishRequest {
        topic: topic.to_owned(),
        data: data.to_vec(),
        idempotency_key: None,
        binary,
    }
}

/// Asserts that a `msg` or a history item (`{"seq","data"[,"binary"]}`)
/// carries what was `sent`.
#[track_caller]
fn assert_carries(item: &Value, sent: &Sent) {
    match sent {
        Sent::Bytes(bytes) => {
            assert_eq!(item["binary"], true, "{item}");
            let text = item["data"].as_str().expect("base64 text");
            assert_eq!(text, STANDARD.encode(bytes), "standard, padded: {item}");
            assert_eq!(STANDARD.decode(text).expect("base64"), *bytes, "{item}");
        }
        Sent::Json(value) => {
            assert_eq!(item["data"], *value, "{item}");
            assert!(item.get("binary").is_none(), "no `binary` on JSON: {item}");
        }
    }
}

/// The next `msg` a WebSocket client gets, checked against `seq` and `sent`.
async fn expect_msg(client: &mut Client, topic: &str, seq: u64, sent: &Sent) {
    let msg = client.expect("msg").await;
    assert_eq!(
        (msg["topic"].as_str(), msg["seq"].as_u64()),
        (Some(topic), Some(seq))
    );
    assert_carries(&msg, sent);
}

/// An SSE stream of `topic` at `addr`, past its `ok`.
async fn sse(addr: SocketAddr, topic: &str) -> Stream {
    let mut stream = Stream::sse(addr, &format!("topic={topic}"), &[]).await;
    assert_eq!(stream.status, 200, "{}", stream.head);
    let ok = stream.event().await.expect("an ok");
    assert_eq!(ok.data["op"], "ok", "{ok:?}");
    stream
}

/// The next `msg` on an SSE stream, checked against `seq` and `sent`.
async fn expect_event(stream: &mut Stream, seq: u64, sent: &Sent) {
    let event = stream.event().await.expect("an event");
    assert_eq!(event.data["op"], "msg", "{event:?}");
    assert_eq!(event.data["seq"].as_u64(), Some(seq), "{event:?}");
    assert_carries(&event.data, sent);
}

/// Every way to read `topic` back from the pod at `addr` (`grpc` its gRPC
/// API) gives `sent` (seq 1 onwards): the client's `history`, `GET
/// /v1/history`, gRPC `History`, and a `sub` with `since: 0` replayed.
async fn assert_kept(ws_url: &str, addr: SocketAddr, grpc: SocketAddr, topic: &str, sent: &[Sent]) {
    let mut client = Client::connect_url(ws_url).await;
    client.hello(None).await;
    client
        .send(json!({"op": "history", "id": 7, "topic": topic}))
        .await;
    let page = client.expect("ok").await;
    let items = page["publications"].as_array().expect("publications");
    assert_eq!(items.len(), sent.len(), "{page}");
    for (i, (item, sent)) in items.iter().zip(sent).enumerate() {
        assert_eq!(item["seq"].as_u64(), Some(i as u64 + 1), "{page}");
        assert_carries(item, sent);
    }

    let (status, body) =
        testkit::http(addr, "GET", &format!("/v1/history?topic={topic}"), &[], b"").await;
    assert_eq!(status, 200, "{body}");
    let page: Value = serde_json::from_str(&body).expect("JSON");
    let items = page["publications"].as_array().expect("publications");
    assert_eq!(items.len(), sent.len(), "{page}");
    for (item, sent) in items.iter().zip(sent) {
        assert_carries(item, sent);
    }

    let mut grpc = grpc_client(grpc).await;
    let page = grpc
        .history(HistoryRequest {
            topic: topic.to_owned(),
            since: None,
            epoch: None,
            limit: None,
            reverse: false,
        })
        .await
        .expect("History")
        .into_inner();
    assert_eq!(page.publications.len(), sent.len(), "{page:?}");
    for (publication, sent) in page.publications.iter().zip(sent) {
        match sent {
            Sent::Bytes(bytes) => {
                assert!(publication.binary, "{publication:?}");
                assert_eq!(publication.data, *bytes);
            }
            Sent::Json(value) => {
                assert!(!publication.binary, "{publication:?}");
                let data: Value = serde_json::from_slice(&publication.data).expect("JSON");
                assert_eq!(data, *value);
            }
        }
    }

    client
        .send(json!({"op": "sub", "id": 8, "topic": topic, "since": 0}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(ok["recovered"], true, "{ok}");
    for (i, sent) in sent.iter().enumerate() {
        expect_msg(&mut client, topic, i as u64 + 1, sent).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_published_over_http_reach_websocket_and_sse_clients_as_base64() {
    let gw = Gateway::start().await;
    let mut ws = Client::subscriber(&gw.ws_url(), "news").await;
    let mut events = sse(gw.addr, "news").await;

    let sent = [
        Sent::Bytes(BYTES),
        Sent::Bytes(LOOKS_LIKE_JSON),
        Sent::Json(json!({"x": [1, "two"]})),
    ];
    assert_eq!(published_bytes(gw.addr, "news", BYTES).await, 1);
    assert_eq!(published_bytes(gw.addr, "news", LOOKS_LIKE_JSON).await, 2);
    assert_eq!(gw.publish("news", json!({"x": [1, "two"]})).await, 3);

    for (i, sent) in sent.iter().enumerate() {
        expect_msg(&mut ws, "news", i as u64 + 1, sent).await;
        expect_event(&mut events, i as u64 + 1, sent).await;
    }
    assert_kept(&gw.ws_url(), gw.addr, gw.grpc_addr, "news", &sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_session_gets_the_bytes_it_missed() {
    let gw = Gateway::start().await;
    let mut client = Client::connect(&gw).await;
    let session = crate::pod::hello(&mut client).await;
    client.sub(1, "news").await;
    drop(client);

    assert_eq!(published_bytes(gw.addr, "news", BYTES).await, 1);
    assert_eq!(published_bytes(gw.addr, "news", LOOKS_LIKE_JSON).await, 2);
    let mut back = Client::connect(&gw).await;
    let welcome = back.hello(Some(&session)).await;
    assert_eq!(welcome["resumed"], true, "{welcome}");
    expect_msg(&mut back, "news", 1, &Sent::Bytes(BYTES)).await;
    expect_msg(&mut back, "news", 2, &Sent::Bytes(LOOKS_LIKE_JSON)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_published_over_grpc_are_not_read_as_json_and_arrive_as_sent() {
    let gw = Gateway::start().await;
    let mut ws = Client::subscriber(&gw.ws_url(), "news").await;
    let mut grpc = grpc_client(gw.grpc_addr).await;

    let answer = grpc
        .publish(grpc_item("news", BYTES, true))
        .await
        .expect("binary data published")
        .into_inner();
    assert_eq!(answer.seq, 1);
    // A batch mixes the kinds; a JSON item that is not JSON fails alone.
    let batch = PublishBatchRequest {
        items: vec![
            grpc_item("news", LOOKS_LIKE_JSON, true),
            grpc_item("news", BYTES, false),
            grpc_item("news", br#"[true]"#, false),
            grpc_item("news", b"\xff", true),
        ],
    };
    let results = grpc
        .publish_batch(batch)
        .await
        .expect("batch")
        .into_inner()
        .results;
    let seqs: Vec<Option<u64>> = results
        .iter()
        .map(|r| match &r.result {
            Some(publish_result::Result::Published(p)) => Some(p.seq),
            _ => None,
        })
        .collect();
    assert_eq!(seqs, [Some(2), None, Some(3), Some(4)], "{results:?}");
    let Some(publish_result::Result::Error(refused)) = &results[1].result else {
        unreachable!()
    };
    assert_eq!(refused.code, "malformed");

    let sent = [
        Sent::Bytes(BYTES),
        Sent::Bytes(LOOKS_LIKE_JSON),
        Sent::Json(json!([true])),
        Sent::Bytes(b"\xff"),
    ];
    for (i, sent) in sent.iter().enumerate() {
        expect_msg(&mut ws, "news", i as u64 + 1, sent).await;
    }
    assert_kept(&gw.ws_url(), gw.addr, gw.grpc_addr, "news", &sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_keep_every_byte_through_redis_to_another_pod_and_its_history() {
    let redis = Redis::start().await;
    let a = Herald::pod(HERALD, &redis.url(), &[]).await;
    let b = Herald::pod(HERALD, &redis.url(), &[]).await;
    let mut on_a = Client::subscriber(&a.ws_url(), "news").await;
    let mut on_b = Client::subscriber(&b.ws_url(), "news").await;
    let mut events = sse(b.addr, "news").await;

    assert_eq!(published_bytes(a.addr, "news", BYTES).await, 1);
    // A batch: one pipeline, its announcements in one message on the
    // channel, each item's bytes within it.
    let mut grpc = grpc_client(b.grpc_addr).await;
    let batch = PublishBatchRequest {
        items: vec![
            grpc_item("news", LOOKS_LIKE_JSON, true),
            grpc_item("news", LOOKS_LIKE_A_BATCH, true),
        ],
    };
    let results = grpc
        .publish_batch(batch)
        .await
        .expect("binary data published on b")
        .into_inner()
        .results;
    assert!(
        results
            .iter()
            .all(|r| matches!(r.result, Some(publish_result::Result::Published(_)))),
        "{results:?}"
    );
    let (status, _) = crate::pod::publish(a.addr, "news", json!("text"), None).await;
    assert_eq!(status, 200);

    let sent = [
        Sent::Bytes(BYTES),
        Sent::Bytes(LOOKS_LIKE_JSON),
        Sent::Bytes(LOOKS_LIKE_A_BATCH),
        Sent::Json(json!("text")),
    ];
    for (i, sent) in sent.iter().enumerate() {
        let seq = i as u64 + 1;
        expect_msg(&mut on_a, "news", seq, sent).await;
        expect_msg(&mut on_b, "news", seq, sent).await;
        expect_event(&mut events, seq, sent).await;
    }
    // Kept in Redis: read back on either pod.
    assert_kept(&b.ws_url(), b.addr, b.grpc_addr, "news", &sent).await;
    assert_kept(&a.ws_url(), a.addr, a.grpc_addr, "news", &sent).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_publish_that_is_not_one_is_refused_counted_and_publishes_nothing() {
    let mut config = Gateway::config();
    config.http.max_body_bytes = 64;
    let gw = Gateway::with(config).await;
    let addr = gw.addr;
    let octets = [("content-type", "application/octet-stream")];

    // A type neither JSON nor octet-stream.
    let (status, body) = testkit::http(
        addr,
        "POST",
        "/v1/publish?topic=news",
        &[("content-type", "image/png")],
        BYTES,
    )
    .await;
    assert_eq!(status, 415, "{body}");
    let body: Value = serde_json::from_str(&body).expect("an error body");
    assert_eq!(body["code"], "malformed", "{body}");
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("application/octet-stream"),
        "{body}"
    );
    // No topic, a bad topic, no data, too much of it.
    let (status, body) = testkit::http(addr, "POST", "/v1/publish", &octets, BYTES).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("missing_field"), "{body}");
    let (status, answer) = publish_bytes(addr, "bad%20topic", "", &[], BYTES).await;
    assert_eq!(
        (status, &answer["code"]),
        (400, &json!("bad_topic")),
        "{answer}"
    );
    let (status, answer) = publish_bytes(addr, "news", "", &[], b"").await;
    assert_eq!(
        (status, &answer["code"]),
        (400, &json!("malformed")),
        "{answer}"
    );
    let (status, answer) = publish_bytes(addr, "news", "", &[], &[0; 65]).await;
    assert_eq!(status, 413, "{answer}");
    // Two idempotency keys that differ.
    let (status, answer) = publish_bytes(
        addr,
        "news",
        "&idempotency_key=a",
        &[("idempotency-key", "b")],
        BYTES,
    )
    .await;
    assert_eq!(
        (status, &answer["code"]),
        (400, &json!("malformed")),
        "{answer}"
    );

    // gRPC: binary data is 1 byte at least, and as large as HTTP's.
    let mut grpc = grpc_client(gw.grpc_addr).await;
    let empty = grpc.publish(grpc_item("news", b"", true)).await;
    assert_eq!(empty.expect_err("refused").code(), Code::InvalidArgument);
    let large = grpc.publish(grpc_item("news", &[1; 65], true)).await;
    assert_eq!(large.expect_err("refused").code(), Code::ResourceExhausted);

    let refused = |status: &str| format!("herald_publish_requests_total{{status=\"{status}\"}}");
    assert_eq!(gw.metric(&refused("415")).await, 1.0);
    assert_eq!(gw.metric(&refused("400")).await, 4.0);
    assert_eq!(gw.metric(&refused("413")).await, 1.0);
    let (status, body) = testkit::http(addr, "GET", "/v1/history?topic=news", &[], b"").await;
    assert_eq!(status, 200);
    assert!(
        body.contains(r#""seq":0,"publications":[]"#),
        "nothing published: {body}"
    );

    // What does publish: a JSON body under the types clients send unasked,
    // and a binary retry with the key of the first, which publishes nothing.
    for content_type in [
        "application/x-www-form-urlencoded",
        "text/plain; charset=utf-8",
    ] {
        let (status, body) = testkit::http(
            addr,
            "POST",
            "/v1/publish",
            &[("content-type", content_type)],
            br#"{"topic":"news","data":1}"#,
        )
        .await;
        assert_eq!(status, 200, "{content_type}: {body}");
    }
    let mut seqs = Vec::new();
    for headers in [&[("idempotency-key", "k")][..], &[]] {
        let (status, answer) =
            publish_bytes(addr, "news", "&idempotency_key=k", headers, BYTES).await;
        assert_eq!(status, 200, "{answer}");
        seqs.push(answer["seq"].as_u64());
    }
    assert_eq!(
        seqs,
        [Some(3), Some(3)],
        "the retry gets the first publish's seq"
    );
}

/// A client that offered `herald.v1.protobuf` (h-proto's subprotocol):
/// prost messages in binary WebSocket messages. Just what this story
/// needs; `it/protobuf.rs` has the protocol's own story.
struct Protobuf(WebSocketStream<MaybeTlsStream<TcpStream>>);

impl Protobuf {
    async fn connect(url: &str) -> Self {
        let mut request = url.into_client_request().expect("a request");
        request.headers_mut().insert(
            "sec-websocket-protocol",
            HeaderValue::from_static("herald.v1.protobuf"),
        );
        let (ws, response) = tokio::time::timeout(WAIT, tokio_tungstenite::connect_async(request))
            .await
            .expect("connect in time")
            .expect("connect");
        assert_eq!(
            response.headers().get("sec-websocket-protocol"),
            Some(&HeaderValue::from_static("herald.v1.protobuf"))
        );
        let mut client = Self(ws);
        client.send(C::Hello(v1::Hello::default())).await;
        assert!(matches!(client.recv().await, S::Welcome(_)));
        client
    }

    async fn send(&mut self, op: C) {
        let bytes = v1::ClientCommand { op: Some(op) }.encode_to_vec();
        self.0.send(Message::binary(bytes)).await.expect("send");
    }

    /// The next server message (pings are answered by the library).
    async fn recv(&mut self) -> S {
        loop {
            let message = tokio::time::timeout(WAIT, self.0.next())
                .await
                .expect("a message in time")
                .expect("connection open")
                .expect("a frame");
            match message {
                Message::Binary(bytes) => {
                    let message = v1::ServerMessage::decode(&*bytes).expect("a ServerMessage");
                    return message.op.expect("an op");
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

    /// `sub` (after `since` where given) and its `ok`.
    async fn sub(&mut self, id: u64, topic: &str, since: Option<u64>) -> v1::Ok {
        self.send(C::Sub(v1::Sub {
            id,
            topic: topic.to_owned(),
            since,
            ..Default::default()
        }))
        .await;
        self.ok().await
    }

    /// The next `msg`, checked against `seq` and `sent`.
    async fn expect_msg(&mut self, seq: u64, sent: &Sent) {
        let msg = match self.recv().await {
            S::Msg(msg) => msg,
            other => panic!("expected msg, got {other:?}"),
        };
        assert_eq!(msg.seq, seq);
        assert!(!msg.delta);
        assert_publication(&msg.data, msg.binary, sent);
    }
}

/// Protobuf data (`Msg`, `Publication`): the bytes themselves with
/// `binary`, JSON text without.
#[track_caller]
fn assert_publication(data: &[u8], binary: bool, sent: &Sent) {
    match sent {
        Sent::Bytes(bytes) => {
            assert!(binary, "binary: {data:?}");
            assert_eq!(data, *bytes);
        }
        Sent::Json(value) => {
            assert!(!binary, "not binary: {data:?}");
            let data: Value = serde_json::from_slice(data).expect("JSON text");
            assert_eq!(data, *value);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_protobuf_client_gets_the_bytes_themselves_live_replayed_and_in_history() {
    let gw = Gateway::start().await;
    let mut live = Protobuf::connect(&gw.ws_url()).await;
    live.sub(1, "news", None).await;
    let mut json = Client::subscriber(&gw.ws_url(), "news").await;

    assert_eq!(published_bytes(gw.addr, "news", BYTES).await, 1);
    let mut grpc = grpc_client(gw.grpc_addr).await;
    let answer = grpc
        .publish(grpc_item("news", LOOKS_LIKE_JSON, true))
        .await
        .expect("binary data published")
        .into_inner();
    assert_eq!(answer.seq, 2);
    assert_eq!(gw.publish("news", json!({"x": 1})).await, 3);
    let sent = [
        Sent::Bytes(BYTES),
        Sent::Bytes(LOOKS_LIKE_JSON),
        Sent::Json(json!({"x": 1})),
    ];
    for (i, sent) in sent.iter().enumerate() {
        // One publication, two protocols: the same data.
        live.expect_msg(i as u64 + 1, sent).await;
        expect_msg(&mut json, "news", i as u64 + 1, sent).await;
    }

    let mut late = Protobuf::connect(&gw.ws_url()).await;
    late.send(C::History(v1::History {
        id: 2,
        topic: "news".to_owned(),
        ..Default::default()
    }))
    .await;
    let page = late.ok().await;
    assert_eq!(page.publications.len(), sent.len(), "{page:?}");
    for (publication, sent) in page.publications.iter().zip(&sent) {
        assert_publication(&publication.data, publication.binary, sent);
    }
    let ok = late.sub(3, "news", Some(0)).await;
    assert_eq!(ok.recovered, Some(true), "{ok:?}");
    for (i, sent) in sent.iter().enumerate() {
        late.expect_msg(i as u64 + 1, sent).await;
    }
}
