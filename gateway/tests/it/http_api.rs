//! The HTTP API a backend and an operator see: `POST /v1/publish` answers a
//! seq and an epoch, refuses with a status and a JSON error body (401 with
//! `WWW-Authenticate` without a valid API key, 400 for a bad request, 413 for
//! a body over `http.max_body_bytes`, however it is sent); `/healthz`,
//! `/readyz` and `/metrics` answer; anything else is 404 or 405.

use std::net::SocketAddr;

use gateway::Config;
use hyper::HeaderMap;
use serde_json::{Value, json};
use testkit::{Gateway, WAIT};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const LIMIT: usize = 1024;

async fn publish(
    addr: SocketAddr,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, HeaderMap, String) {
    testkit::http_with_headers(addr, "POST", "/v1/publish", headers, body).await
}

/// Writes `raw` and reads the whole response (the request says
/// `Connection: close`): (status, body).
async fn raw(addr: SocketAddr, raw: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let exchange = async {
        stream.write_all(raw).await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        Ok::<_, std::io::Error>(response)
    };
    let response = tokio::time::timeout(WAIT, exchange)
        .await
        .expect("answer in time")
        .expect("answer");
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP response: {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// The error body: `{"code": .., "message": ..}`; returns the code.
fn error_code(body: &str) -> String {
    let error: Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("a JSON error body ({e}): {body}"));
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "a message: {error}"
    );
    error["code"]
        .as_str()
        .unwrap_or_else(|| panic!("a code: {error}"))
        .to_owned()
}

fn small_body_config() -> Config {
    let mut config = Gateway::config();
    config.http.max_body_bytes = LIMIT;
    config
}

#[tokio::test]
async fn publish_answers_the_seq_and_epoch_and_the_seq_grows() {
    let gw = Gateway::with(Gateway::config()).await;
    let body = json!({"topic": "news", "data": {"n": 1}}).to_string();
    let (status, headers, first) = publish(gw.addr, &[], body.as_bytes()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(headers["content-type"], "application/json");
    let first: Value = serde_json::from_str(&first).expect("JSON");
    assert_eq!(first["seq"], 1, "{first}");
    let epoch = first["epoch"].as_str().expect("epoch");
    assert!(!epoch.is_empty());

    let (_, _, second) = publish(gw.addr, &[], body.as_bytes()).await;
    let second: Value = serde_json::from_str(&second).expect("JSON");
    assert_eq!(second["seq"], 2, "{second}");
    assert_eq!(second["epoch"], epoch, "same series");

    // Seqs are per topic.
    assert_eq!(gw.publish("chat:other", json!(null)).await, 1);
    assert_eq!(gw.metric("herald_messages_published_total").await, 3.0);
    assert_eq!(
        gw.metric("herald_publish_requests_total{status=\"200\"}")
            .await,
        3.0
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn publish_needs_a_valid_api_key_when_keys_are_configured() {
    let mut config = Gateway::config();
    config.http.api_keys = vec!["secret".into()];
    let gw = Gateway::with(config).await;
    let body = json!({"topic": "news", "data": 1}).to_string();
    let refused: [&[(&str, &str)]; 5] = [
        &[],
        &[("authorization", "Bearer wrong")],
        &[("authorization", "Bearer secretsecret")],
        &[("authorization", "Basic secret")],
        &[("authorization", "secret")],
    ];
    for headers in refused {
        let (status, response_headers, error) = publish(gw.addr, headers, body.as_bytes()).await;
        assert_eq!(status, 401, "with {headers:?}: {error}");
        assert_eq!(
            response_headers
                .get("www-authenticate")
                .map(|v| v.as_bytes()),
            Some(&b"Bearer"[..]),
            "with {headers:?}"
        );
        assert_eq!(response_headers["content-type"], "application/json");
        error_code(&error);
    }
    let (status, _, answer) = publish(
        gw.addr,
        &[("authorization", "Bearer secret")],
        body.as_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).expect("JSON")["seq"],
        1
    );

    assert_eq!(
        gw.metric("herald_publish_requests_total{status=\"401\"}")
            .await,
        5.0
    );
    assert_eq!(
        gw.metric("herald_publish_requests_total{status=\"200\"}")
            .await,
        1.0
    );
    assert_eq!(gw.metric("herald_messages_published_total").await, 1.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_bad_publish_gets_400_and_a_code() {
    let gw = Gateway::with(Gateway::config()).await;
    let cases: [(&str, Option<&str>); 8] = [
        ("this is not JSON", Some("malformed")),
        ("", Some("malformed")),
        ("42", Some("malformed")),
        (r#"{"topic":"news","data":}"#, Some("malformed")),
        (r#"{"topic":"news"}"#, None),
        (r#"{"data":1}"#, None),
        (r#"{"topic":"bad topic!","data":1}"#, Some("bad_topic")),
        (r#"{"topic":"nope:x","data":1}"#, Some("unknown_namespace")),
    ];
    for (body, expected) in cases {
        let (status, headers, error) = publish(gw.addr, &[], body.as_bytes()).await;
        assert_eq!(status, 400, "for {body}: {error}");
        assert_eq!(headers["content-type"], "application/json");
        let code = error_code(&error);
        if let Some(expected) = expected {
            assert_eq!(code, expected, "for {body}");
        }
    }
    assert_eq!(
        gw.metric("herald_publish_requests_total{status=\"400\"}")
            .await,
        8.0
    );
    assert_eq!(gw.metric("herald_messages_published_total").await, 0.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_publish_body_must_be_an_object() {
    // The documented body is `{"topic":..,"data":..}`; a JSON array in the
    // same order is not that (WebSocket commands refuse arrays too).
    let gw = Gateway::with(Gateway::config()).await;
    let (status, _, error) = publish(gw.addr, &[], br#"["news", 1]"#).await;
    assert_eq!(status, 400, "{error}");
    assert_eq!(error_code(&error), "malformed");
    assert_eq!(gw.metric("herald_messages_published_total").await, 0.0);
    gw.shutdown().await;
}

/// A publish body of exactly `len` bytes.
fn body_of_len(len: usize) -> String {
    let empty = json!({"topic": "news", "data": ""}).to_string();
    let body = json!({"topic": "news", "data": "x".repeat(len - empty.len())}).to_string();
    assert_eq!(body.len(), len);
    body
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_with_or_without_a_length() {
    let gw = Gateway::with(small_body_config()).await;

    // At the limit: accepted.
    let (status, _, answer) = publish(gw.addr, &[], body_of_len(LIMIT).as_bytes()).await;
    assert_eq!(status, 200, "{answer}");

    // One byte over, with a Content-Length.
    let (status, headers, error) = publish(gw.addr, &[], body_of_len(LIMIT + 1).as_bytes()).await;
    assert_eq!(status, 413, "{error}");
    assert_eq!(headers["content-type"], "application/json");
    error_code(&error);

    // A declared length over the limit is refused before the body is sent.
    let (status, error) = raw(
        gw.addr,
        b"POST /v1/publish HTTP/1.1\r\nHost: herald\r\nContent-Length: 10000000\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 413, "{error}");
    error_code(&error);

    // Chunked, without a Content-Length: the limit applies to what arrives.
    let body = body_of_len(LIMIT + 100);
    let (first, second) = body.split_at(600);
    let request = format!(
        "POST /v1/publish HTTP/1.1\r\nHost: herald\r\nTransfer-Encoding: chunked\r\n\
         Content-Type: application/json\r\nConnection: close\r\n\r\n\
         {:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
        first.len(),
        second.len()
    );
    let (status, error) = raw(gw.addr, request.as_bytes()).await;
    assert_eq!(status, 413, "{error}");
    error_code(&error);

    // The same way, within the limit: accepted.
    let body = body_of_len(LIMIT);
    let (first, second) = body.split_at(600);
    let request = format!(
        "POST /v1/publish HTTP/1.1\r\nHost: herald\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n\
         {:x}\r\n{first}\r\n{:x}\r\n{second}\r\n0\r\n\r\n",
        first.len(),
        second.len()
    );
    let (status, answer) = raw(gw.addr, request.as_bytes()).await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(
        serde_json::from_str::<Value>(&answer).expect("JSON")["seq"],
        2
    );

    assert_eq!(
        gw.metric("herald_publish_requests_total{status=\"413\"}")
            .await,
        3.0
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn health_readiness_and_metrics_answer() {
    let gw = Gateway::with(Gateway::config()).await;
    let (status, _, body) = testkit::http_with_headers(gw.addr, "GET", "/healthz", &[], b"").await;
    assert_eq!((status, body.as_str()), (200, "ok\n"));
    let (status, _, body) = testkit::http_with_headers(gw.addr, "GET", "/readyz", &[], b"").await;
    assert_eq!((status, body.as_str()), (200, "ready\n"));

    let (status, headers, metrics) =
        testkit::http_with_headers(gw.addr, "GET", "/metrics", &[], b"").await;
    assert_eq!(status, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .is_ok_and(|t| t.starts_with("text/plain")),
        "{headers:?}"
    );
    for name in [
        "herald_connections ",
        "herald_messages_published_total ",
        "herald_messages_delivered_total ",
        "herald_messages_dropped_total{",
        "herald_connections_closed_total{reason=\"slow_consumer\"} ",
        "herald_connections_closed_total{reason=\"dead_peer\"} ",
        "herald_subscriptions ",
    ] {
        assert!(
            metrics.lines().any(|line| line.starts_with(name)),
            "/metrics has a sample of `{}`:\n{metrics}",
            name.trim_end()
        );
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn unknown_paths_are_404_and_wrong_methods_405() {
    let gw = Gateway::with(Gateway::config()).await;
    for path in [
        "/",
        "/nope",
        "/v1/publish/extra",
        "/v2/publish",
        "/metricsx",
    ] {
        let (status, _, _) = testkit::http_with_headers(gw.addr, "GET", path, &[], b"").await;
        assert_eq!(status, 404, "GET {path}");
    }
    for (method, path) in [
        ("GET", "/v1/publish"),
        ("PUT", "/v1/publish"),
        ("POST", "/healthz"),
        ("POST", "/readyz"),
        ("DELETE", "/metrics"),
        ("POST", "/ws"),
    ] {
        let (status, _, _) = testkit::http_with_headers(gw.addr, method, path, &[], b"").await;
        assert_eq!(status, 405, "{method} {path}");
    }
    // Not a publish request: nothing counted (every status still reads 0).
    let (_, _, metrics) = testkit::http_with_headers(gw.addr, "GET", "/metrics", &[], b"").await;
    let counted: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("herald_publish_requests_total{") && !l.ends_with(" 0"))
        .collect();
    assert!(counted.is_empty(), "{counted:?}");
    gw.shutdown().await;
}

#[tokio::test]
async fn the_same_idempotency_key_publishes_once() {
    let gw = Gateway::with(Gateway::config()).await;
    let mut sub = testkit::Client::connect(&gw).await;
    sub.hello(None).await;
    sub.sub(1, "news").await;

    let seq = |answer: &str| {
        serde_json::from_str::<Value>(answer).expect("JSON")["seq"]
            .as_u64()
            .unwrap_or_else(|| panic!("a seq: {answer}"))
    };
    let body = json!({"topic": "news", "data": {"order": 17}}).to_string();
    let key = [("idempotency-key", "order-17")];
    let (status, _, first) = publish(gw.addr, &key, body.as_bytes()).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(seq(&first), 1);
    // A retry, by the header or by the body's field: the first answer again.
    let (status, _, retry) = publish(gw.addr, &key, body.as_bytes()).await;
    assert_eq!((status, retry.as_str()), (200, first.as_str()));
    let in_body =
        json!({"topic": "news", "data": {"order": 17}, "idempotency_key": "order-17"}).to_string();
    let (status, _, retry) = publish(gw.addr, &[], in_body.as_bytes()).await;
    assert_eq!((status, retry.as_str()), (200, first.as_str()));
    // Both, agreeing.
    let (status, _, retry) = publish(gw.addr, &key, in_body.as_bytes()).await;
    assert_eq!((status, retry.as_str()), (200, first.as_str()));

    // Both, disagreeing; or a key that is empty or too long: 400.
    let other = [("idempotency-key", "order-18")];
    let too_long = "k".repeat(257);
    for headers in [
        &other[..],
        &[("idempotency-key", "")],
        &[("idempotency-key", &too_long)],
    ] {
        let (status, _, error) = publish(gw.addr, headers, in_body.as_bytes()).await;
        assert_eq!(status, 400, "with {headers:?}: {error}");
        assert_eq!(error_code(&error), "malformed");
    }

    // Without a key, the next seq; the subscriber got the keyed message once.
    let next = json!({"topic": "news", "data": "after"}).to_string();
    let (status, _, answer) = publish(gw.addr, &[], next.as_bytes()).await;
    assert_eq!((status, seq(&answer)), (200, 2), "{answer}");
    assert_eq!(sub.msg().await, ("news".into(), 1, json!({"order": 17})));
    assert_eq!(sub.msg().await, ("news".into(), 2, json!("after")));
    assert_eq!(gw.metric("herald_messages_published_total").await, 5.0);
    gw.shutdown().await;
}

async fn publish_batch(addr: SocketAddr, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    let (status, _, body) = testkit::http_with_headers(
        addr,
        "POST",
        "/v1/publish/batch",
        headers,
        body.to_string().as_bytes(),
    )
    .await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn a_batch_answers_each_item_in_order_and_a_bad_item_fails_alone() {
    let gw = Gateway::with(small_body_config()).await;
    let mut client = testkit::Client::subscriber(&gw.ws_url(), "news").await;
    let items = json!({"items": [
        {"topic": "news", "data": 1},
        {"topic": "news"},
        {"topic": "bad topic", "data": 2},
        {"topic": "news", "data": "x".repeat(LIMIT)},
        {"topic": "news", "data": 3, "idempotency_key": "k"},
        {"topic": "other", "data": 4},
        {"topic": "news", "data": 5},
    ]});
    let (status, answer) = publish_batch(gw.addr, &[], &items).await;
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    let codes: Vec<Value> = results
        .iter()
        .map(|r| {
            r.get("seq")
                .cloned()
                .unwrap_or_else(|| r["error"]["code"].clone())
        })
        .collect();
    assert_eq!(
        codes,
        [
            json!(1),
            json!("missing_field"),
            json!("bad_topic"),
            json!("malformed"),
            json!(2),
            json!(1),
            json!(3)
        ],
        "{answer}"
    );
    assert!(
        results
            .iter()
            .all(|r| r.get("seq").is_none() || r["epoch"].is_string())
    );
    // The subscriber gets the published ones, in the batch's order.
    for (seq, data) in [(1, json!(1)), (2, json!(3)), (3, json!(5))] {
        assert_eq!(client.msg().await, ("news".to_owned(), seq, data));
    }
    // The keyed item again: the same answer, nothing published.
    let again = json!({"items": [{"topic": "news", "data": 3, "idempotency_key": "k"}]});
    let (_, answer) = publish_batch(gw.addr, &[], &again).await;
    assert_eq!(answer["results"][0]["seq"], 2, "{answer}");
    // (A retry answered from its key counts as accepted, as docs/metrics.md says.)
    assert_eq!(gw.metric("herald_messages_published_total").await, 5.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_batch_is_refused_whole_without_a_key_over_the_item_limit_or_without_items() {
    let mut config = Gateway::config();
    config.http.api_keys = vec!["secret".into()];
    let gw = Gateway::with(config).await;
    let one = json!({"items": [{"topic": "news", "data": 1}]});
    let (status, answer) = publish_batch(gw.addr, &[], &one).await;
    assert_eq!((status, answer["code"].as_str()), (401, Some("forbidden")));
    let key = [("authorization", "Bearer secret")];
    let too_many = json!({"items": vec![json!({"topic": "news", "data": 1}); gateway::publish::MAX_BATCH_ITEMS + 1]});
    let (status, answer) = publish_batch(gw.addr, &key, &too_many).await;
    assert_eq!(
        (status, answer["code"].as_str()),
        (413, Some("malformed")),
        "{answer}"
    );
    for body in [json!({}), json!({"items": 1}), json!([1])] {
        let (status, answer) = publish_batch(gw.addr, &key, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
    }
    // Nothing of them was published.
    let (status, answer) = publish_batch(gw.addr, &key, &one).await;
    assert_eq!(
        (status, &answer["results"][0]["seq"]),
        (200, &json!(1)),
        "{answer}"
    );
    gw.shutdown().await;
}
