//! The history API (issue #23): what a topic kept, a page at a time, oldest
//! first or newest first, with the topic's position; a `since` out of the
//! window is refused whole (`history_lost`), never answered in part. The
//! same reads by the client's `history`, `GET /v1/history` and gRPC
//! `History`, on the embedded broker and on Redis.

use std::net::SocketAddr;

use gateway::Config;
use router::{NamespaceSettings, Subscribe};
use serde_json::{Value, json};
use testkit::{Client, Gateway, Herald, Redis};

use crate::pod::{HERALD, publish};

/// `GET /v1/history?<query>`: the status and the answer.
async fn get(addr: SocketAddr, query: &str) -> (u16, Value) {
    let path = format!("/v1/history?{query}");
    let (status, body) = testkit::http(addr, "GET", &path, &[], b"").await;
    let body = serde_json::from_str(&body).unwrap_or_else(|_| panic!("JSON: {body}"));
    (status, body)
}

/// The seqs of a page.
fn seqs(page: &Value) -> Vec<u64> {
    page["publications"]
        .as_array()
        .unwrap_or_else(|| panic!("publications in {page}"))
        .iter()
        .map(|p| p["seq"].as_u64().expect("seq"))
        .collect()
}

/// Defaults, and a namespace `short` that keeps 3 messages, and one
/// (`vip`) whose topics need a grant to subscribe.
fn config() -> Config {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "short".to_owned(),
        NamespaceSettings {
            history_size: 3,
            ..Default::default()
        },
    );
    config.namespaces.insert(
        "vip".to_owned(),
        NamespaceSettings {
            subscribe: Subscribe::Granted,
            ..Default::default()
        },
    );
    config
}

#[tokio::test]
async fn pages_walk_the_history_forward_and_backward_with_the_position() {
    let gw = Gateway::with(config()).await;
    for i in 1..=10 {
        gw.publish("news", json!({"i": i})).await;
    }
    let (status, first) = get(gw.addr, "topic=news&limit=3").await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(seqs(&first), vec![1, 2, 3], "from the oldest kept");
    assert_eq!(
        (first["topic"].as_str(), first["seq"].as_u64()),
        (Some("news"), Some(10))
    );
    assert_eq!(
        first["publications"][0]["data"],
        json!({"i": 1}),
        "data verbatim"
    );
    let epoch = first["epoch"].as_str().expect("epoch").to_owned();
    let (_, next) = get(
        gw.addr,
        &format!("topic=news&since=3&epoch={epoch}&limit=3"),
    )
    .await;
    assert_eq!(seqs(&next), vec![4, 5, 6]);
    let (_, last) = get(gw.addr, "topic=news&since=9").await;
    assert_eq!(
        seqs(&last),
        vec![10],
        "a page that reaches the newest ends there"
    );
    let (_, none) = get(gw.addr, "topic=news&since=10").await;
    assert_eq!(seqs(&none), Vec::<u64>::new());
    let (_, newest) = get(gw.addr, "topic=news&reverse=true&limit=3").await;
    assert_eq!(seqs(&newest), vec![10, 9, 8], "newest first");
    let (_, older) = get(gw.addr, "topic=news&reverse=true&since=8&limit=3").await;
    assert_eq!(seqs(&older), vec![7, 6, 5], "below since");
    let (_, all) = get(gw.addr, "topic=news&reverse=1&since=11").await;
    assert_eq!(seqs(&all).len(), 10, "since = seq + 1: from the newest");
    let (status, position) = get(gw.addr, "topic=news&limit=0").await;
    assert_eq!(status, 200);
    assert_eq!(seqs(&position), Vec::<u64>::new(), "the position only");
    assert_eq!(position["seq"], 10);
    assert_eq!(position["epoch"].as_str(), Some(epoch.as_str()));
    let (_, fresh) = get(gw.addr, "topic=never-published").await;
    assert_eq!((fresh["seq"].as_u64(), seqs(&fresh).len()), (Some(0), 0));
    gw.shutdown().await;
}

#[tokio::test]
async fn a_since_out_of_the_window_is_refused_whole_with_the_position() {
    let gw = Gateway::with(config()).await;
    for i in 1..=6 {
        gw.publish("short:a", json!(i)).await;
    }
    // Kept: 4, 5, 6.
    let (status, kept) = get(gw.addr, "topic=short:a&since=3").await;
    assert_eq!((status, seqs(&kept)), (200, vec![4, 5, 6]));
    let (status, oldest) = get(gw.addr, "topic=short:a&limit=2").await;
    assert_eq!((status, seqs(&oldest)), (200, vec![4, 5]));
    let epoch = kept["epoch"].as_str().expect("epoch").to_owned();
    for query in [
        "topic=short:a&since=2".to_owned(),
        "topic=short:a&since=7".to_owned(),
        "topic=short:a&since=8&reverse=true".to_owned(),
        "topic=short:a&since=4&epoch=another".to_owned(),
    ] {
        let (status, lost) = get(gw.addr, &query).await;
        assert_eq!(status, 410, "{query}: {lost}");
        assert_eq!(lost["code"], "history_lost", "{query}");
        assert_eq!(lost["seq"], 6, "{query}: the position");
        assert_eq!(lost["epoch"].as_str(), Some(epoch.as_str()), "{query}");
    }
    // Reverse needs nothing below since to be kept: it ends where history
    // does.
    let (status, down) = get(gw.addr, "topic=short:a&since=7&reverse=true").await;
    assert_eq!((status, seqs(&down)), (200, vec![6, 5, 4]));
    for (query, code) in [
        ("topic=short:a&limit=1001", "malformed"),
        ("topic=short:a&since=x", "malformed"),
        ("topic=short:a&reverse=maybe", "malformed"),
        // A repeated key is refused, as presence's are, not guessed at.
        ("topic=short:a&limit=1&limit=2", "malformed"),
        ("topic=nope:a", "unknown_namespace"),
        ("topic=bad%20topic", "bad_topic"),
        ("since=1", "missing_field"),
    ] {
        let (status, refused) = get(gw.addr, query).await;
        assert_eq!(
            (status, refused["code"].as_str()),
            (400, Some(code)),
            "{query}"
        );
    }
    let (status, max) = get(gw.addr, "topic=short:a&limit=1000").await;
    assert_eq!(
        (status, seqs(&max)),
        (200, vec![4, 5, 6]),
        "the maximum itself"
    );
    let lost = gw
        .metric(r#"herald_history_reads_total{outcome="lost"}"#)
        .await;
    assert_eq!(lost, 4.0);
    let refused = gw
        .metric(r#"herald_history_reads_total{outcome="refused"}"#)
        .await;
    assert_eq!(refused, 7.0);

    // gRPC: the same reads, the same refusals.
    let mut grpc = testkit::grpc_client(gw.grpc_addr).await;
    let request =
        |since: Option<u64>, limit: Option<u64>, reverse: bool| proto::v1::HistoryRequest {
            topic: "short:a".into(),
            since,
            epoch: None,
            limit,
            reverse,
        };
    let page = grpc
        .history(request(Some(4), None, false))
        .await
        .expect("a page")
        .into_inner();
    let got: Vec<u64> = page.publications.iter().map(|p| p.seq).collect();
    assert_eq!(
        (got, page.seq, page.epoch.as_str()),
        (vec![5, 6], 6, epoch.as_str())
    );
    assert_eq!(page.publications[0].data, b"5");
    let newest = grpc
        .history(request(None, Some(1), true))
        .await
        .expect("a page");
    assert_eq!(newest.get_ref().publications[0].seq, 6);
    let lost = grpc
        .history(request(Some(1), None, false))
        .await
        .expect_err("lost");
    assert_eq!(lost.code(), tonic::Code::OutOfRange, "{lost:?}");
    let over = grpc
        .history(request(None, Some(5000), false))
        .await
        .expect_err("over");
    assert_eq!(over.code(), tonic::Code::InvalidArgument);
    gw.shutdown().await;
}

#[tokio::test]
async fn the_client_reads_history_where_it_may_subscribe() {
    let gw = Gateway::with(config()).await;
    for i in 1..=4 {
        gw.publish("short:b", json!({"n": i, "text": "é"})).await;
    }
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    client
        .send(json!({"op": "history", "id": 1, "topic": "short:b", "limit": 2, "reverse": true}))
        .await;
    let page = client.expect("ok").await;
    assert_eq!(page["id"], 1);
    assert_eq!(seqs(&page), vec![4, 3]);
    assert_eq!(
        page["publications"][1]["data"],
        json!({"n": 3, "text": "é"})
    );
    assert_eq!(page["seq"], 4);
    client
        .send(json!({"op": "history", "id": 2, "topic": "short:b", "since": 0}))
        .await;
    let lost = client.expect("err").await;
    assert_eq!(
        (lost["id"].as_u64(), lost["code"].as_str()),
        (Some(2), Some("history_lost"))
    );
    assert_eq!(lost["topic"], "short:b");
    client
        .send(json!({"op": "history", "id": 3, "topic": "short:b", "limit": 1001}))
        .await;
    let over = client.expect("err").await;
    assert_eq!(
        (over["id"].as_u64(), over["code"].as_str()),
        (Some(3), Some("malformed"))
    );
    client
        .send(json!({"op": "history", "id": 4, "topic": "vip:x"}))
        .await;
    let forbidden = client.expect("err").await;
    assert_eq!(forbidden["code"], "forbidden", "{forbidden}");
    client
        .send(json!({"op": "history", "id": 5, "topic": "short:b", "limit": 0}))
        .await;
    let position = client.expect("ok").await;
    assert_eq!(
        (position["id"].as_u64(), position["seq"].as_u64()),
        (Some(5), Some(4))
    );
    assert_eq!(seqs(&position), Vec::<u64>::new());
    // The connection is fine: no subscription was made by any of it.
    client.sub(6, "short:b").await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_in_redis_pages_both_ways_and_refuses_what_was_trimmed() {
    let redis = Redis::start().await;
    let env = [
        ("HERALD_REDIS__COMMAND_TIMEOUT", "2s"),
        ("HERALD_NAMESPACES__SHORT__HISTORY_SIZE", "5"),
    ];
    let (a, b) = (
        Herald::pod(HERALD, &redis.url(), &env).await,
        Herald::pod(HERALD, &redis.url(), &env).await,
    );
    for i in 1..=10 {
        let (status, _) = publish(a.addr, "short:r", json!(i), None).await;
        assert_eq!(status, 200);
    }
    // Read on the other pod: Redis is what both share.
    let (status, oldest) = get(b.addr, "topic=short:r&limit=2").await;
    assert_eq!((status, seqs(&oldest)), (200, vec![6, 7]), "{oldest}");
    assert_eq!(oldest["seq"], 10);
    let epoch = oldest["epoch"].as_str().expect("epoch").to_owned();
    let (_, rest) = get(b.addr, &format!("topic=short:r&since=7&epoch={epoch}")).await;
    assert_eq!(seqs(&rest), vec![8, 9, 10]);
    let (_, newest) = get(b.addr, "topic=short:r&reverse=true&limit=2").await;
    assert_eq!(seqs(&newest), vec![10, 9]);
    let (_, down) = get(b.addr, "topic=short:r&reverse=true&since=8").await;
    assert_eq!(seqs(&down), vec![7, 6], "down to the oldest kept");
    let (_, position) = get(b.addr, "topic=short:r&limit=0").await;
    assert_eq!(
        (position["seq"].as_u64(), seqs(&position).len()),
        (Some(10), 0)
    );
    for query in [
        "topic=short:r&since=4".to_owned(),
        "topic=short:r&since=11".to_owned(),
        "topic=short:r&since=12&reverse=true".to_owned(),
        "topic=short:r&since=6&epoch=another".to_owned(),
        format!("topic=short:r&since={}", u64::MAX),
        format!("topic=short:r&since={}&reverse=true", u64::MAX),
    ] {
        let (status, lost) = get(b.addr, &query).await;
        assert_eq!(
            (status, lost["code"].as_str()),
            (410, Some("history_lost")),
            "{query}"
        );
        assert_eq!(lost["seq"], 10, "{query}");
    }
    let (_, edge) = get(b.addr, "topic=short:r&since=5").await;
    assert_eq!(
        seqs(&edge),
        vec![6, 7, 8, 9, 10],
        "since + 1 is the oldest kept"
    );
}
