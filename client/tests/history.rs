#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! `history` through the client against a real gateway (in this process,
//! on port 0): pages forward and in reverse, the position alone with
//! `limit: 0`, and `history_lost` for a `since` the topic does not hold.

mod common;

use herald_client::{Client, Error, ErrorCode, HistoryPage, HistoryQuery};
use serde_json::json;
use testkit::Gateway;

fn seqs(page: &HistoryPage) -> Vec<u64> {
    page.publications.iter().map(|p| p.seq).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_pages_forward_and_in_reverse_and_limit_0_gives_the_position() {
    let gateway = Gateway::start().await;
    for i in 1..=5 {
        gateway.publish("news", json!({ "i": i })).await;
    }
    let (client, _events) = Client::builder([gateway.ws_url()]).build().unwrap();
    let all = client
        .history("news", HistoryQuery::default())
        .await
        .unwrap();
    assert_eq!(seqs(&all), [1, 2, 3, 4, 5]);
    assert_eq!(all.seq, 5);
    assert_eq!(all.publications[2].data.json().unwrap().get(), r#"{"i":3}"#);
    let forward = HistoryQuery {
        since: Some(2),
        limit: Some(2),
        ..HistoryQuery::default()
    };
    let page = client.history("news", forward).await.unwrap();
    assert_eq!(seqs(&page), [3, 4]);
    assert_eq!(page.epoch, all.epoch);
    let reverse = HistoryQuery {
        limit: Some(2),
        reverse: true,
        ..HistoryQuery::default()
    };
    let newest = client.history("news", reverse).await.unwrap();
    assert_eq!(seqs(&newest), [5, 4]);
    let on = HistoryQuery {
        since: Some(4),
        reverse: true,
        ..HistoryQuery::default()
    };
    assert_eq!(seqs(&client.history("news", on).await.unwrap()), [3, 2, 1]);
    let position = HistoryQuery {
        limit: Some(0),
        ..HistoryQuery::default()
    };
    let position = client.history("news", position).await.unwrap();
    assert_eq!((position.seq, position.publications.len()), (5, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_since_the_topic_does_not_hold_is_history_lost_not_a_partial_answer() {
    let gateway = Gateway::start().await;
    gateway.publish("news", json!(1)).await;
    let (client, _events) = Client::builder([gateway.ws_url()]).build().unwrap();
    for query in [
        HistoryQuery {
            since: Some(7),
            ..HistoryQuery::default()
        },
        HistoryQuery {
            since: Some(0),
            epoch: Some("another-epoch".to_owned()),
            ..HistoryQuery::default()
        },
    ] {
        match client.history("news", query.clone()).await {
            Err(Error::Server { code, .. }) => {
                assert_eq!(code, ErrorCode::HistoryLost, "{query:?}")
            }
            other => panic!("{query:?}: not `history_lost`: {other:?}"),
        }
    }
    let too_many = HistoryQuery {
        limit: Some(100_000),
        ..HistoryQuery::default()
    };
    match client.history("news", too_many).await {
        Err(Error::Server { code, .. }) => assert_eq!(code, ErrorCode::Malformed),
        other => panic!("not `malformed`: {other:?}"),
    }
}
