//! The gRPC publish API a backend sees (`herald.v1.Publisher`, through the
//! generated client): `Publish` answers a seq and an epoch and subscribers get
//! the data byte for byte; `PublishBatch` answers each item, a bad item
//! failing alone; `TopicInfo` tells where a topic stands and how many
//! subscribers it has here. Refusals mirror HTTP: no or a wrong API key is
//! `UNAUTHENTICATED`, a bad request `INVALID_ARGUMENT`, data over
//! `http.max_body_bytes` `RESOURCE_EXHAUSTED`. A retry with the same
//! idempotency key publishes nothing. The server stops with the drain.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use proto::v1::publisher_client::PublisherClient;
use proto::v1::{
    PublishBatchRequest, PublishError, PublishRequest, PublishResponse, TopicInfoRequest,
    TopicInfoResponse, publish_result,
};
use serde_json::{Value, json};
use testkit::{Client, Gateway, WAIT, grpc_client};
use tokio_tungstenite::tungstenite::Message;
use tonic::transport::Channel;
use tonic::{Code, Request, Status};

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
    }
}

fn keyed(topic: &str, data: &[u8], key: &str) -> PublishRequest {
    PublishRequest {
        idempotency_key: Some(key.to_owned()),
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
