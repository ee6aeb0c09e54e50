#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! Binary data against a gateway (in this process, on port 0): bytes a
//! backend publishes with `Content-Type: application/octet-stream` (0x00,
//! 0xff, broken UTF-8, and bytes that look like JSON) reach the application
//! as `Data::Binary`, byte for byte, live, replayed after `since`, and from
//! `history`, beside JSON data; in either encoding (JSON carries them as
//! base64, protobuf as bytes).

mod common;

use common::{messages, until};
use herald_client::{Client, Data, Event, HistoryQuery, Protocol, Since};
use serde_json::{Value, json};
use testkit::Gateway;

/// 0x00 first (the byte that marks binary data where it is kept), 0xff,
/// 0xc3 0x28 (not UTF-8), quotes and a newline.
const BYTES: &[u8] = b"\x00\xff\xfe\xc3\x28 not JSON \x80\n\r\"}";
/// JSON text, sent as bytes: it stays bytes.
const LOOKS_LIKE_JSON: &[u8] = br#"{"a":1}"#;

/// Publishes `bytes` to `topic` over HTTP as `application/octet-stream`.
async fn publish_bytes(gateway: &Gateway, topic: &str, bytes: &[u8]) -> u64 {
    let path = format!("/v1/publish?topic={topic}");
    let headers = [("content-type", "application/octet-stream")];
    let (status, body) = testkit::http(gateway.addr, "POST", &path, &headers, bytes).await;
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    answer["seq"].as_u64().unwrap()
}

/// What was published at seqs 1, 2 and 3.
fn sent() -> Vec<Data> {
    vec![
        Data::Binary(BYTES.into()),
        Data::Json(serde_json::value::to_raw_value(&json!({"n": 2})).unwrap()),
        Data::Binary(LOOKS_LIKE_JSON.into()),
    ]
}

async fn binary_data_reaches_the_application_as_bytes(protocol: Protocol) {
    let gateway = Gateway::start().await;
    let (live, mut live_events) = Client::builder([gateway.ws_url()])
        .protocol(protocol)
        .build()
        .unwrap();
    live.subscribe("files", None).unwrap();
    until(&mut live_events, |e| {
        matches!(e, Event::Subscribed { .. }).then_some(())
    })
    .await;
    assert_eq!(publish_bytes(&gateway, "files", BYTES).await, 1);
    gateway.publish("files", json!({"n": 2})).await;
    assert_eq!(publish_bytes(&gateway, "files", LOOKS_LIKE_JSON).await, 3);

    let got = messages(&mut live_events, 3, &mut Vec::new()).await;
    let data: Vec<Data> = got.into_iter().map(|m| m.data).collect();
    assert_eq!(data, sent(), "live");

    let (late, mut late_events) = Client::builder([gateway.ws_url()])
        .protocol(protocol)
        .build()
        .unwrap();
    late.subscribe("files", Some(Since::from(0))).unwrap();
    let got = messages(&mut late_events, 3, &mut Vec::new()).await;
    let data: Vec<Data> = got.into_iter().map(|m| m.data).collect();
    assert_eq!(data, sent(), "replayed after since 0");

    let page = late
        .history("files", HistoryQuery::default())
        .await
        .unwrap();
    let data: Vec<Data> = page.publications.into_iter().map(|p| p.data).collect();
    assert_eq!(data, sent(), "from history");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_data_reaches_the_application_as_bytes_in_json() {
    binary_data_reaches_the_application_as_bytes(Protocol::Json).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_data_reaches_the_application_as_bytes_in_protobuf() {
    binary_data_reaches_the_application_as_bytes(Protocol::Protobuf).await;
}
