//! The gRPC publish API a backend sees (`herald.v1.Publisher`, through the
//! generated client): `Publish` answers a seq and an epoch and subscribers get
//! the data byte for byte; `PublishBatch` answers each item, a bad item
//! failing alone; `TopicInfo` tells where a topic stands and how many
//! subscribers it has here. Refusals mirror HTTP: no or a wrong API key is
//! `UNAUTHENTICATED`, a bad request `INVALID_ARGUMENT`, data over
//! `http.max_body_bytes` `RESOURCE_EXHAUSTED`. A retry with the same
//! idempotency key publishes nothing. The server stops with the drain.
//!
//! And what a caller can make the pod spend: a call without a valid key is
//! refused on its headers, its body never read (a flood of them, each
//! declaring 4 MiB, leaves the pod's memory as it was); a message larger
//! than its method takes is refused on its 5-byte prefix; calls in flight
//! are capped across connections (a busy pod answers at once), streams per
//! connection by HTTP/2, connections in total and per address; a silent
//! connection is closed, an idle one that answers pings is kept.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use h2::SendStream;
use h2::client::{ResponseFuture, SendRequest};
use prost::Message as _;
use proto::v1::publisher_client::PublisherClient;
use proto::v1::{
    PublishBatchRequest, PublishError, PublishRequest, PublishResponse, TopicInfoRequest,
    TopicInfoResponse, publish_result,
};
use serde_json::{Value, json};
use testkit::{Client, Gateway, Herald, WAIT, eventually, grpc_client, metric};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_tungstenite::tungstenite::Message;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

use crate::pod::{HERALD, rss};

const LIMIT: usize = 1024;

/// `message` with `authorization: Bearer <key>` when a key is given.
fn with_key<T>(message: T, key: Option<&str>) -> Request<T> {
    let mut request = Request::new(message);
    if let Some(key) = key {
        request.metadata_mut().insert(
            "authorization",
            format!("Bearer {key}").parse().expect("ASCII metadata"),
        );
    }
    request
}

fn item(topic: &str, data: &[u8]) -> PublishRequest {
    PublishRequest {
        topic: topic.to_owned(),
        data: data.to_vec(),
        idempotency_key: None,
        binary: false,
    }
}

fn keyed(topic: &str, data: &[u8], key: &str) -> PublishRequest {
    PublishRequest {
        idempotency_key: Some(key.to_owned()),
        binary: false,
        ..item(topic, data)
    }
}

async fn publish(
    client: &mut PublisherClient<Channel>,
    request: PublishRequest,
) -> Result<PublishResponse, Status> {
    client.publish(request).await.map(|r| r.into_inner())
}

async fn topic_info(client: &mut PublisherClient<Channel>, topic: &str) -> TopicInfoResponse {
    client
        .topic_info(TopicInfoRequest {
            topic: topic.to_owned(),
        })
        .await
        .expect("TopicInfo")
        .into_inner()
}

/// Asserts that `result` is a refusal with `code` and, from the error table,
/// `herald_code` (in the `herald-error-code` metadata).
#[track_caller]
fn assert_refused<T: std::fmt::Debug>(result: Result<T, Status>, code: Code, herald_code: &str) {
    let status = result.expect_err("a refusal");
    assert_eq!(status.code(), code, "{status:?}");
    assert_eq!(
        status
            .metadata()
            .get("herald-error-code")
            .and_then(|v| v.to_str().ok()),
        Some(herald_code),
        "{status:?}"
    );
    assert!(
        status.message().starts_with(herald_code),
        "the message starts with the code: {status:?}"
    );
}

/// A client subscribed to `topic`; returns it and the topic's epoch.
async fn subscriber(gw: &Gateway, topic: &str) -> (Client, String) {
    let mut client = Client::connect(gw).await;
    client.hello(None).await;
    let ok = client.sub(1, topic).await;
    let epoch = ok["epoch"].as_str().expect("epoch").to_owned();
    (client, epoch)
}

/// The next text frame, as sent (pings skipped).
async fn next_text(client: &mut Client) -> String {
    loop {
        let message = tokio::time::timeout(WAIT, client.ws.next())
            .await
            .expect("a message in time")
            .expect("connection open")
            .expect("a frame");
        match message {
            Message::Text(text) => return text.as_str().to_owned(),
            Message::Ping(_) | Message::Pong(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn publish_answers_the_seq_and_epoch_and_the_data_arrives_byte_for_byte() {
    let gw = Gateway::start().await;
    let (mut sub, epoch) = subscriber(&gw, "news").await;
    let mut client = grpc_client(gw.grpc_addr).await;

    // Odd spacing, escapes and number forms: nothing may normalise them.
    let data = r#"{ "b" : 1.50, "a":"\u00e9", "c": [1e3 ,null] }"#;
    let answer = publish(&mut client, item("news", data.as_bytes()))
        .await
        .expect("Publish");
    assert_eq!(answer.seq, 1);
    assert_eq!(answer.epoch, epoch, "the epoch the subscriber was told");
    assert_eq!(
        next_text(&mut sub).await,
        format!(r#"{{"op":"msg","topic":"news","seq":1,"data":{data}}}"#)
    );

    let answer = publish(&mut client, item("news", b"42"))
        .await
        .expect("Publish");
    assert_eq!((answer.seq, answer.epoch.as_str()), (2, epoch.as_str()));
    assert_eq!(sub.msg().await, ("news".to_owned(), 2, json!(42)));

    assert_eq!(gw.metric("herald_messages_published_total").await, 2.0);
    assert_eq!(
        gw.metric(r#"herald_grpc_requests_total{code="OK",method="Publish"}"#)
            .await,
        2.0
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_batch_answers_each_item_and_a_bad_item_fails_alone() {
    let gw = Gateway::start().await;
    let (mut sub, _) = subscriber(&gw, "news").await;
    let mut client = grpc_client(gw.grpc_addr).await;

    let items = vec![
        item("news", br#"{"n":1}"#),
        item("chat:room-1", br#"{"n":2}"#),
        item("bad topic!", b"1"),
        item("nope:x", b"1"),
        item("news", b"not JSON"),
        item("news", br#"{"n":3}"#),
    ];
    let results = client
        .publish_batch(PublishBatchRequest { items })
        .await
        .expect("PublishBatch")
        .into_inner()
        .results;
    let results: Vec<Result<u64, String>> = results
        .into_iter()
        .map(|r| match r.result.expect("a result") {
            publish_result::Result::Published(PublishResponse { seq, epoch }) => {
                assert!(!epoch.is_empty());
                Ok(seq)
            }
            publish_result::Result::Error(PublishError { code, message }) => {
                assert!(!message.is_empty(), "a message for {code}");
                Err(code)
            }
        })
        .collect();
    assert_eq!(
        results,
        [
            Ok(1),
            Ok(1),
            Err("bad_topic".to_owned()),
            Err("unknown_namespace".to_owned()),
            Err("malformed".to_owned()),
            Ok(2),
        ]
    );
    // In the order of the batch, and nothing from the bad items.
    assert_eq!(sub.msg().await, ("news".to_owned(), 1, json!({"n": 1})));
    assert_eq!(sub.msg().await, ("news".to_owned(), 2, json!({"n": 3})));

    // An empty batch is an empty answer.
    let empty = client
        .publish_batch(PublishBatchRequest { items: Vec::new() })
        .await
        .expect("an empty PublishBatch");
    assert!(empty.into_inner().results.is_empty());

    assert_eq!(gw.metric("herald_messages_published_total").await, 3.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn topic_info_tells_the_position_and_the_local_subscribers() {
    let gw = Gateway::start().await;
    let mut client = grpc_client(gw.grpc_addr).await;

    let fresh = topic_info(&mut client, "news").await;
    assert_eq!((fresh.seq, fresh.subscribers), (0, 0));
    assert!(!fresh.epoch.is_empty());

    let (_first, _) = subscriber(&gw, "news").await;
    let (_second, _) = subscriber(&gw, "news").await;
    let (_elsewhere, _) = subscriber(&gw, "chat:room-1").await;
    for n in 0..3 {
        publish(&mut client, item("news", json!(n).to_string().as_bytes()))
            .await
            .expect("Publish");
    }
    let info = topic_info(&mut client, "news").await;
    assert_eq!(
        info,
        TopicInfoResponse {
            seq: 3,
            epoch: fresh.epoch,
            subscribers: 2
        }
    );
    assert_eq!(topic_info(&mut client, "chat:room-1").await.subscribers, 1);

    let bad = client
        .topic_info(TopicInfoRequest {
            topic: "bad topic!".into(),
        })
        .await;
    assert_refused(bad, Code::InvalidArgument, "bad_topic");
    let unknown = client
        .topic_info(TopicInfoRequest {
            topic: "nope:x".into(),
        })
        .await;
    assert_refused(unknown, Code::InvalidArgument, "unknown_namespace");
    gw.shutdown().await;
}

#[tokio::test]
async fn calls_need_a_valid_api_key_when_keys_are_configured() {
    let mut config = Gateway::config();
    config.http.api_keys = vec!["secret".into(), "other".into()];
    let gw = Gateway::with(config).await;
    let mut client = grpc_client(gw.grpc_addr).await;

    for key in [None, Some("wrong"), Some("secretsecret"), Some("")] {
        let refused = client.publish(with_key(item("news", b"1"), key)).await;
        assert_refused(refused, Code::Unauthenticated, "forbidden");
    }
    for authorization in ["Basic secret", "secret"] {
        let mut request = Request::new(item("news", b"1"));
        request
            .metadata_mut()
            .insert("authorization", authorization.parse().expect("ASCII"));
        assert_refused(
            client.publish(request).await,
            Code::Unauthenticated,
            "forbidden",
        );
    }
    let batch = client
        .publish_batch(with_key(
            PublishBatchRequest {
                items: vec![item("news", b"1")],
            },
            Some("wrong"),
        ))
        .await;
    assert_refused(batch, Code::Unauthenticated, "forbidden");
    let info = client
        .topic_info(TopicInfoRequest {
            topic: "news".into(),
        })
        .await;
    assert_refused(info, Code::Unauthenticated, "forbidden");

    // Either key, the scheme in any case.
    let answer = client
        .publish(with_key(item("news", b"1"), Some("secret")))
        .await
        .expect("the right key")
        .into_inner();
    assert_eq!(answer.seq, 1);
    let mut request = Request::new(item("news", b"2"));
    request
        .metadata_mut()
        .insert("authorization", "bearer other".parse().expect("ASCII"));
    assert_eq!(
        client
            .publish(request)
            .await
            .expect("bearer")
            .into_inner()
            .seq,
        2
    );
    let info = client
        .topic_info(with_key(
            TopicInfoRequest {
                topic: "news".into(),
            },
            Some("other"),
        ))
        .await
        .expect("TopicInfo with a key");
    assert_eq!(info.into_inner().seq, 2);

    assert_eq!(
        gw.metric(r#"herald_grpc_requests_total{code="UNAUTHENTICATED",method="Publish"}"#)
            .await,
        6.0
    );
    assert_eq!(gw.metric("herald_messages_published_total").await, 2.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_bad_publish_is_invalid_argument_with_a_code() {
    let gw = Gateway::start().await;
    let mut client = grpc_client(gw.grpc_addr).await;
    let cases: [(PublishRequest, &str); 10] = [
        (item("bad topic!", b"1"), "bad_topic"),
        (item("", b"1"), "bad_topic"),
        (item("nope:x", b"1"), "unknown_namespace"),
        (item("news", b"not JSON"), "malformed"),
        (item("news", b""), "malformed"),
        (item("news", br#"{"a":"#), "malformed"),
        (item("news", br#"{"a":1} {"b":2}"#), "malformed"),
        (item("news", b"\"\xff\""), "malformed"),
        (keyed("news", b"1", ""), "malformed"),
        (keyed("news", b"1", &"k".repeat(257)), "malformed"),
    ];
    for (request, code) in cases {
        assert_refused(
            publish(&mut client, request).await,
            Code::InvalidArgument,
            code,
        );
    }
    // Whitespace around a value is JSON text too; a 256-byte key is fine.
    publish(&mut client, keyed("news", b" [1] ", &"k".repeat(256)))
        .await
        .expect("valid JSON with whitespace");

    assert_eq!(
        gw.metric(r#"herald_grpc_requests_total{code="INVALID_ARGUMENT",method="Publish"}"#)
            .await,
        10.0
    );
    assert_eq!(gw.metric("herald_messages_published_total").await, 1.0);
    gw.shutdown().await;
}

/// JSON text of exactly `len` bytes: a string.
fn json_of_len(len: usize) -> Vec<u8> {
    Value::String("x".repeat(len - 2)).to_string().into_bytes()
}

#[tokio::test]
async fn data_over_the_limit_is_resource_exhausted() {
    let mut config = Gateway::config();
    config.http.max_body_bytes = LIMIT;
    let gw = Gateway::with(config).await;
    let mut client = grpc_client(gw.grpc_addr).await;

    let at_limit = publish(&mut client, item("news", &json_of_len(LIMIT))).await;
    assert_eq!(at_limit.expect("data at the limit").seq, 1);
    let over = publish(&mut client, item("news", &json_of_len(LIMIT + 1))).await;
    assert_refused(over, Code::ResourceExhausted, "malformed");

    // In a batch, the item alone fails.
    let results = client
        .publish_batch(PublishBatchRequest {
            items: vec![
                item("news", &json_of_len(LIMIT + 1)),
                item("news", &json_of_len(LIMIT)),
            ],
        })
        .await
        .expect("PublishBatch")
        .into_inner()
        .results;
    assert!(
        matches!(&results[0].result, Some(publish_result::Result::Error(e)) if e.code == "malformed"),
        "{results:?}"
    );
    assert!(
        matches!(
            &results[1].result,
            Some(publish_result::Result::Published(p)) if p.seq == 2
        ),
        "{results:?}"
    );

    // And a batch has a bounded number of items.
    let items = (0..=gateway::publish::MAX_BATCH_ITEMS)
        .map(|_| item("news", b"1"))
        .collect();
    let refused = client.publish_batch(PublishBatchRequest { items }).await;
    assert_refused(refused, Code::ResourceExhausted, "malformed");
    assert_eq!(topic_info(&mut client, "news").await.seq, 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn the_same_idempotency_key_publishes_once() {
    let gw = Gateway::start().await;
    let (mut sub, _) = subscriber(&gw, "news").await;
    let mut client = grpc_client(gw.grpc_addr).await;

    let first = publish(&mut client, keyed("news", br#"{"order":17}"#, "order-17"))
        .await
        .expect("Publish");
    // A retry, say after a timeout: the first publish's position, nothing new.
    let retry = publish(&mut client, keyed("news", br#"{"order":17}"#, "order-17"))
        .await
        .expect("the retry");
    assert_eq!(retry, first);
    assert_eq!(first.seq, 1);
    let next = publish(&mut client, item("news", br#"{"after":true}"#))
        .await
        .expect("Publish");
    assert_eq!(next.seq, 2);

    // The subscriber gets the keyed message once: the next frame is the next
    // message.
    assert_eq!(sub.msg().await, ("news".into(), 1, json!({"order": 17})));
    assert_eq!(sub.msg().await, ("news".into(), 2, json!({"after": true})));

    // Keys are per topic.
    let other = publish(&mut client, keyed("chat:room-1", b"1", "order-17"))
        .await
        .expect("Publish");
    assert_eq!(other.seq, 1);
    assert_eq!(topic_info(&mut client, "chat:room-1").await.seq, 1);

    // Within a batch too.
    let results = client
        .publish_batch(PublishBatchRequest {
            items: vec![
                keyed("news", b"3", "order-18"),
                keyed("news", b"3", "order-18"),
                keyed("news", b"4", "order-17"),
            ],
        })
        .await
        .expect("PublishBatch")
        .into_inner()
        .results;
    let seqs: Vec<u64> = results
        .iter()
        .map(|r| match &r.result {
            Some(publish_result::Result::Published(p)) => p.seq,
            other => panic!("published: {other:?}"),
        })
        .collect();
    assert_eq!(seqs, [3, 3, 1]);
    assert_eq!(sub.msg().await, ("news".into(), 3, json!(3)));
    assert_eq!(topic_info(&mut client, "news").await.seq, 3);
    gw.shutdown().await;
}

#[tokio::test]
async fn the_grpc_server_stops_with_the_drain() {
    let gw = Gateway::start().await;
    let grpc_addr = gw.grpc_addr;
    let mut client = grpc_client(gw.grpc_addr).await;
    publish(&mut client, item("news", b"1"))
        .await
        .expect("Publish");

    // An open client connection does not hold the drain up to its timeout
    // (10 s by default).
    let started = Instant::now();
    gw.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the drain took {:?}",
        started.elapsed()
    );
    // And the listener is closed.
    let connected = tokio::time::timeout(WAIT, tokio::net::TcpStream::connect(grpc_addr))
        .await
        .expect("an answer in time");
    assert!(connected.is_err(), "the gRPC listener is closed");
}

// The limits: what a caller without a key, or with one, can make the pod
// spend. These speak HTTP/2 with the h2 crate, or frame by frame, to send
// what a well-behaved gRPC client never would: messages whose bodies never
// end, more streams than the pod allows.

const PUBLISH: &str = "/herald.v1.Publisher/Publish";
const TOPIC_INFO: &str = "/herald.v1.Publisher/TopicInfo";
const KEY: &str = "secret";

/// A gateway that takes the API key [`KEY`], with `tune` applied.
async fn keyed_gateway(tune: impl FnOnce(&mut gateway::Config)) -> Gateway {
    let mut config = Gateway::config();
    config.http.api_keys = vec![KEY.into()];
    tune(&mut config);
    Gateway::with(config).await
}

/// The 5-byte gRPC message prefix: not compressed, `len` bytes.
fn prefix(len: u32) -> Bytes {
    let mut prefix = vec![0];
    prefix.extend_from_slice(&len.to_be_bytes());
    Bytes::from(prefix)
}

/// An HTTP/2 connection (the h2 crate) to `addr`, driven by a task of its
/// own (which answers the server's pings).
async fn h2_connect(addr: SocketAddr) -> SendRequest<Bytes> {
    let tcp = tokio::time::timeout(WAIT, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let (send, connection) = tokio::time::timeout(WAIT, h2::client::handshake(tcp))
        .await
        .expect("an HTTP/2 handshake in time")
        .expect("an HTTP/2 handshake");
    tokio::spawn(async move {
        let _ = connection.await;
    });
    send
}

/// Opens a call to `path` (with `key`) and sends `body`, leaving the
/// request open: the server has what it has, and waits for the rest.
async fn open_call(
    send: SendRequest<Bytes>,
    path: &str,
    key: Option<&str>,
    body: &[Bytes],
) -> (SendRequest<Bytes>, ResponseFuture, SendStream<Bytes>) {
    let mut send = tokio::time::timeout(WAIT, send.ready())
        .await
        .expect("a stream free in time")
        .expect("the connection is open");
    let mut request = hyper::Request::post(format!("http://herald{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(key) = key {
        request = request.header("authorization", format!("Bearer {key}"));
    }
    let (response, mut stream) = send
        .send_request(request.body(()).expect("a request"), false)
        .expect("a stream");
    for chunk in body {
        stream.send_data(chunk.clone(), false).expect("data queued");
    }
    (send, response, stream)
}

/// The `grpc-status` (and `herald-error-code`) of a call answered at once,
/// trailers-only, while its request is still open.
async fn refused_at_once(response: ResponseFuture) -> (String, Option<String>) {
    let response = tokio::time::timeout(WAIT, response)
        .await
        .expect("an answer without the rest of the body")
        .expect("a response");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .map(|v| v.to_str().expect("ASCII").to_owned())
    };
    (
        header("grpc-status").expect("the status in the headers"),
        header("herald-error-code"),
    )
}

#[tokio::test]
async fn keyless_calls_declaring_large_messages_are_refused_on_their_headers_and_buffer_nothing() {
    // The review's attack, against the binary: connections full of streams,
    // each declaring a 4 MiB message and sending all of it but its last byte.
    // Without the key check on the headers, each stream holds its 4 MiB
    // until the request timeout (4 x 64 streams: 1 GiB).
    const CONNECTIONS: usize = 4;
    const STREAMS: usize = 64; // grpc.max_concurrent_streams
    const DECLARED: u32 = 4 * 1024 * 1024;
    let herald = Herald::start(HERALD, &[("HERALD_HTTP__API_KEYS", KEY)], &[]).await;
    let before = rss(herald.pid());

    // One message, shared by every stream (clones of a `Bytes` share it).
    let almost = Bytes::from(vec![b'x'; DECLARED as usize - 1]);
    let body = [prefix(DECLARED), almost];
    let mut calls = Vec::new();
    for _ in 0..CONNECTIONS {
        let mut send = h2_connect(herald.grpc_addr).await;
        for n in 0..STREAMS {
            let key = (n % 2 == 0).then_some("wrong");
            let (next, response, stream) = open_call(send, PUBLISH, key, &body).await;
            send = next;
            calls.push((response, stream));
        }
    }
    for (response, _open) in calls {
        assert_eq!(
            refused_at_once(response).await,
            ("16".to_owned(), Some("forbidden".to_owned())),
            "UNAUTHENTICATED"
        );
    }
    let grown = rss(herald.pid()).saturating_sub(before);
    assert!(
        grown < 50 * 1024 * 1024,
        "the pod grew by {} MiB",
        grown / 1024 / 1024
    );
    let refused = metric(
        herald.addr,
        r#"herald_grpc_refused_total{reason="unauthenticated"}"#,
    )
    .await;
    assert_eq!(refused, (CONNECTIONS * STREAMS) as f64);

    // A caller with the key is served as before.
    let mut client = grpc_client(herald.grpc_addr).await;
    let published = client
        .publish(with_key(item("news", b"1"), Some(KEY)))
        .await
        .expect("a keyed publish");
    assert_eq!(published.into_inner().seq, 1);
}

/// HTTP/2 frame by frame, as no library would send it: streams past the
/// limit the server announced.
struct RawH2 {
    tcp: TcpStream,
}

/// HTTP/2 frame types and flags (RFC 9113 6).
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const REFUSED_STREAM: u32 = 0x7;

impl RawH2 {
    /// Connects, sends the preface and empty settings, and acknowledges the
    /// server's; the server's settings.
    async fn connect(addr: SocketAddr) -> (Self, Vec<(u16, u32)>) {
        let tcp = tokio::time::timeout(WAIT, TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let mut raw = Self { tcp };
        raw.write(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await;
        raw.send(SETTINGS, 0, 0, &[]).await;
        loop {
            let (kind, flags, _, payload) = raw.frame().await.expect("the server's settings");
            if kind == SETTINGS && flags & ACK == 0 {
                raw.send(SETTINGS, ACK, 0, &[]).await;
                let settings = payload
                    .chunks(6)
                    .map(|s| {
                        (
                            u16::from_be_bytes([s[0], s[1]]),
                            u32::from_be_bytes([s[2], s[3], s[4], s[5]]),
                        )
                    })
                    .collect();
                return (raw, settings);
            }
        }
    }

    async fn write(&mut self, bytes: &[u8]) {
        tokio::time::timeout(WAIT, self.tcp.write_all(bytes))
            .await
            .expect("written in time")
            .expect("written");
    }

    async fn send(&mut self, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
        let len = u32::try_from(payload.len()).expect("a small frame");
        let mut frame = len.to_be_bytes()[1..].to_vec();
        frame.extend([kind, flags]);
        frame.extend(stream.to_be_bytes());
        frame.extend(payload);
        self.write(&frame).await;
    }

    /// Opens stream `id` with `headers` (HPACK literals, never indexed, no
    /// Huffman coding), its body left open.
    async fn open(&mut self, id: u32, headers: &[(&str, &str)]) {
        let mut block = Vec::new();
        for (name, value) in headers {
            block.push(0x00);
            for text in [name, value] {
                block.push(u8::try_from(text.len()).expect("a short header") & 0x7f);
                block.extend(text.as_bytes());
            }
        }
        self.send(HEADERS, END_HEADERS, id, &block).await;
    }

    /// The next frame: (type, flags, stream, payload); `None` at the end of
    /// the connection.
    async fn frame(&mut self) -> Option<(u8, u8, u32, Vec<u8>)> {
        let mut head = [0u8; 9];
        let read = tokio::time::timeout(WAIT, self.tcp.read_exact(&mut head))
            .await
            .expect("a frame or the end in time");
        if read.is_err() {
            return None;
        }
        let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
        let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
        let mut payload = vec![0; len];
        tokio::time::timeout(WAIT, self.tcp.read_exact(&mut payload))
            .await
            .expect("a frame's payload in time")
            .expect("a frame's payload");
        Some((head[3], head[4], stream, payload))
    }
}

#[tokio::test]
async fn streams_past_the_per_connection_limit_are_refused_not_queued() {
    let gw = keyed_gateway(|c| c.grpc.max_concurrent_streams = 4).await;
    let (mut raw, settings) = RawH2::connect(gw.grpc_addr).await;
    assert!(
        settings.contains(&(SETTINGS_MAX_CONCURRENT_STREAMS, 4)),
        "the limit is announced: {settings:?}"
    );
    // Six keyed calls whose bodies never come: the first four are served
    // (they wait for their message), the other two are over the limit.
    let authorization = format!("Bearer {KEY}");
    let headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":authority", "herald"),
        (":path", PUBLISH),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("authorization", authorization.as_str()),
    ];
    for id in [1, 3, 5, 7, 9, 11] {
        raw.open(id, &headers).await;
    }
    let mut refused = Vec::new();
    while refused.len() < 2 {
        let (kind, _, stream, payload) = raw.frame().await.expect("the connection stays open");
        match kind {
            RST_STREAM => {
                let code = u32::from_be_bytes(payload[..4].try_into().expect("an error code"));
                assert_eq!(code, REFUSED_STREAM, "stream {stream}");
                refused.push(stream);
            }
            HEADERS => panic!("stream {stream} answered before its message arrived"),
            _ => {}
        }
    }
    assert_eq!(refused, [9, 11]);
    drop(raw);
    gw.shutdown().await;
}

#[tokio::test]
async fn calls_in_flight_are_capped_across_connections_and_a_busy_pod_answers_at_once() {
    let gw = keyed_gateway(|c| c.http.max_concurrent_requests = 2).await;
    // Two keyed calls, on two connections, whose messages never end: each
    // holds a slot while it waits.
    let mut held = Vec::new();
    for _ in 0..2 {
        let send = h2_connect(gw.grpc_addr).await;
        let (send, response, stream) = open_call(
            send,
            PUBLISH,
            Some(KEY),
            &[prefix(10), Bytes::from_static(b"{")],
        )
        .await;
        held.push((send, response, stream));
    }
    let mut client = grpc_client(gw.grpc_addr).await;
    let started = Instant::now();
    let busy = client
        .publish(with_key(item("news", b"1"), Some(KEY)))
        .await;
    let status = busy.expect_err("no slot left");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "refused at once, not queued: {:?}",
        started.elapsed()
    );
    // A caller without a key is refused for that first: it cannot tell the
    // pod is busy, nor take a slot.
    let keyless = client.publish(item("news", b"1")).await;
    assert_refused(keyless, Code::Unauthenticated, "forbidden");
    // (Read in place: `/metrics` needs a slot too.)
    let refused = |reason| {
        gw.node
            .metrics
            .grpc_refused
            .with_label_values(&[reason])
            .get()
    };
    assert_eq!((refused("busy"), refused("unauthenticated")), (1, 1));

    // The held calls end (their streams are reset): their slots come back.
    drop(held);
    let answer = eventually(WAIT, || {
        let mut client = client.clone();
        async move {
            client
                .publish(with_key(item("news", b"2"), Some(KEY)))
                .await
                .map(|r| r.into_inner())
        }
    })
    .await;
    assert_eq!(answer.seq, 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_message_over_its_methods_limit_is_refused_on_its_prefix() {
    let gw = keyed_gateway(|c| c.http.max_body_bytes = LIMIT).await;
    let send = h2_connect(gw.grpc_addr).await;
    // TopicInfo names a topic: a 1 MiB message is refused as soon as it is
    // declared, before a byte of it is read (tonic would take up to 4 MiB).
    let (send, response, _topic_info) =
        open_call(send, TOPIC_INFO, Some(KEY), &[prefix(1024 * 1024)]).await;
    assert_eq!(
        refused_at_once(response).await,
        ("8".to_owned(), Some("malformed".to_owned())),
        "RESOURCE_EXHAUSTED"
    );
    // Publish takes one `data` of http.max_body_bytes, with its topic and
    // key; no more.
    let over =
        u32::try_from(LIMIT + gateway::grpc::gate::REQUEST_OVERHEAD_BYTES + 1).expect("small");
    let (_, response, _publish) = open_call(send, PUBLISH, Some(KEY), &[prefix(over)]).await;
    assert_eq!(
        refused_at_once(response).await,
        ("8".to_owned(), Some("malformed".to_owned())),
        "RESOURCE_EXHAUSTED"
    );
    assert_eq!(
        gw.metric(r#"herald_grpc_refused_total{reason="too_large"}"#)
            .await,
        2.0
    );
    assert_eq!(
        gw.metric(r#"herald_grpc_requests_total{code="RESOURCE_EXHAUSTED",method="TopicInfo"}"#)
            .await,
        1.0
    );

    // Through the generated client: a topic name as long as a small
    // method's whole message is refused as too large; a long but valid
    // publish still goes through.
    let mut client = grpc_client(gw.grpc_addr).await;
    let long = client
        .topic_info(with_key(
            TopicInfoRequest {
                topic: "x".repeat(gateway::grpc::gate::MAX_SMALL_REQUEST_BYTES),
            },
            Some(KEY),
        ))
        .await;
    assert_refused(long, Code::ResourceExhausted, "malformed");
    let at_limit = client
        .publish(with_key(
            keyed("news", &json_of_len(LIMIT), &"k".repeat(256)),
            Some(KEY),
        ))
        .await
        .expect("data at the limit with the longest key");
    assert_eq!(at_limit.into_inner().seq, 1);
    gw.shutdown().await;
}

/// Whether the server takes a connection from `from`: it sends its HTTP/2
/// settings, or closes the connection at once.
async fn admitted(to: SocketAddr, from: [u8; 4]) -> (bool, TcpStream) {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket
        .bind(SocketAddr::from((from, 0)))
        .expect("bind a loopback address");
    let mut tcp = tokio::time::timeout(WAIT, socket.connect(to))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut head = [0u8; 9];
    let read = tokio::time::timeout(WAIT, tcp.read_exact(&mut head))
        .await
        .expect("settings or the end in time");
    (read.is_ok() && head[3] == SETTINGS, tcp)
}

#[tokio::test]
async fn connections_are_capped_in_total_and_per_address() {
    let gw = keyed_gateway(|c| {
        c.grpc.max_connections = 3;
        c.grpc.max_connections_per_ip = 2;
    })
    .await;
    let to = gw.grpc_addr;
    let (first, a) = admitted(to, [127, 0, 0, 1]).await;
    let (second, b) = admitted(to, [127, 0, 0, 1]).await;
    assert!(first && second, "two from one address");
    let (third, _) = admitted(to, [127, 0, 0, 1]).await;
    assert!(!third, "a third from the address is closed");
    let (other, c) = admitted(to, [127, 0, 0, 2]).await;
    assert!(other, "another address has its own share");
    let (fourth, _) = admitted(to, [127, 0, 0, 3]).await;
    assert!(!fourth, "the pod holds its cap");
    assert_eq!(gw.metric("herald_grpc_connections").await, 3.0);
    assert_eq!(
        gw.metric(r#"herald_grpc_refused_total{reason="per_ip"}"#)
            .await,
        1.0
    );
    assert_eq!(
        gw.metric(r#"herald_grpc_refused_total{reason="at_capacity"}"#)
            .await,
        1.0
    );

    // A connection that ends gives its slot back.
    drop(b);
    eventually(WAIT, || async {
        gw.metric("herald_grpc_connections").await == 2.0
    })
    .await;
    let (again, d) = admitted(to, [127, 0, 0, 1]).await;
    assert!(again, "the address's slot is back");
    drop((a, c, d));
    gw.shutdown().await;
}

#[tokio::test]
async fn a_silent_connection_is_closed_and_a_live_idle_one_is_kept() {
    let gw = Gateway::with({
        let mut config = Gateway::config();
        // Silent for 1 s: closed. A ping's answer has 750 ms to come.
        config.grpc.keepalive_interval = Duration::from_millis(250);
        config.grpc.keepalive_timeout = Duration::from_millis(750);
        config
    })
    .await;
    // A client that speaks HTTP/2 (and so answers the pod's pings), idle.
    let live = h2_connect(gw.grpc_addr).await;
    // A socket that never sends a byte, not even the HTTP/2 preface.
    let (admitted, mut silent) = admitted(gw.grpc_addr, [127, 0, 0, 1]).await;
    assert!(admitted);
    let started = Instant::now();
    let mut rest = Vec::new();
    // The end, or a reset: closed either way.
    let _closed = tokio::time::timeout(WAIT, silent.read_to_end(&mut rest))
        .await
        .expect("the silent connection is closed");
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "closed after the silence bound, not at once: {:?}",
        started.elapsed()
    );
    // The live one has been idle as long, and is still served.
    let message = TopicInfoRequest {
        topic: "news".into(),
    }
    .encode_to_vec();
    let len = u32::try_from(message.len()).expect("small");
    let (_live, response, mut stream) = open_call(live, TOPIC_INFO, None, &[prefix(len)]).await;
    stream
        .send_data(Bytes::from(message), true)
        .expect("the message sent");
    let response = tokio::time::timeout(WAIT, response)
        .await
        .expect("an answer in time")
        .expect("the idle connection still serves");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    while let Some(chunk) = tokio::time::timeout(WAIT, body.data())
        .await
        .expect("data in time")
    {
        chunk.expect("data");
    }
    let trailers = tokio::time::timeout(WAIT, body.trailers())
        .await
        .expect("trailers in time")
        .expect("trailers")
        .expect("a status");
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"0"[..])
    );
    gw.shutdown().await;
}
