//! Replay with `since`: the missed messages, then live ones, with no gap and no
//! duplicate even while publishers keep publishing; `recovered: false` when
//! history cannot bridge the gap.

use std::time::Duration;

use serde_json::json;
use testkit::{Client, Gateway};

#[tokio::test]
async fn since_replays_then_goes_live_under_concurrent_publishing() {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "default".into(),
        router::NamespaceSettings {
            history_size: 10_000,
            ..Default::default()
        },
    );
    let gw = Gateway::with(config).await;
    const TOTAL: u64 = 3000;

    // Publish the first part, then keep publishing while clients subscribe with since.
    for i in 1..=500 {
        gw.publish("ticks", json!(i)).await;
    }
    let publisher = {
        let addr = gw.addr;
        tokio::spawn(async move {
            for i in 501..=TOTAL {
                let body = json!({"topic": "ticks", "data": i}).to_string();
                let (status, _) =
                    testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
                assert_eq!(status, 200);
            }
        })
    };

    // Several subscribers join at different moments with different `since`.
    let mut joins = Vec::new();
    for (k, since) in [0u64, 17, 250, 499, 500].into_iter().enumerate() {
        let url = gw.ws_url();
        joins.push(tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(k as u64 * 15)).await;
            let mut client = Client::connect_url(&url).await;
            client.hello(None).await;
            client
                .send(json!({"op": "sub", "id": 1, "topic": "ticks", "since": since}))
                .await;
            let ok = client.expect("ok").await;
            assert_eq!(ok["recovered"], true, "{ok}");
            let mut expected = since + 1;
            while expected <= TOTAL {
                let (_, seq, data) = client.msg().await;
                assert_eq!(seq, expected, "since {since}: gap or duplicate");
                assert_eq!(data, json!(seq));
                expected += 1;
            }
        }));
    }
    for join in joins {
        join.await
            .expect("subscriber saw every message once, in order");
    }
    publisher.await.expect("publisher");
    gw.shutdown().await;
}

#[tokio::test]
async fn since_and_epoch_of_the_current_series_recover() {
    let gw = Gateway::start().await;
    for i in 1..=5 {
        gw.publish("news", json!(i)).await;
    }
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    let ok = client.sub(1, "news").await;
    assert_eq!(ok["seq"], 5);
    let epoch = ok["epoch"].as_str().expect("epoch").to_owned();

    let mut again = Client::connect(&gw).await;
    again.hello(None).await;
    again
        .send(json!({"op": "sub", "id": 2, "topic": "news", "since": 3, "epoch": epoch}))
        .await;
    let ok = again.expect("ok").await;
    assert_eq!(
        (ok["recovered"].as_bool(), ok["seq"].as_u64()),
        (Some(true), Some(5))
    );
    assert_eq!(again.msg().await.1, 4);
    assert_eq!(again.msg().await.1, 5);
    gw.shutdown().await;
}

#[tokio::test]
async fn too_old_since_is_not_recovered_and_goes_live() {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "default".into(),
        router::NamespaceSettings {
            history_size: 10,
            ..Default::default()
        },
    );
    let gw = Gateway::with(config).await;
    for i in 1..=30 {
        gw.publish("news", json!(i)).await;
    }
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    client
        .send(json!({"op": "sub", "id": 1, "topic": "news", "since": 5}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(
        (ok["recovered"].as_bool(), ok["seq"].as_u64()),
        (Some(false), Some(30))
    );
    // Nothing from history: the next message is the next live one.
    gw.publish("news", json!(31)).await;
    assert_eq!(client.msg().await.1, 31);

    // Just inside the history (21..=31 held: since 20 needs 21 onwards).
    let mut inside = Client::connect(&gw).await;
    inside.hello(None).await;
    inside
        .send(json!({"op": "sub", "id": 1, "topic": "news", "since": 21}))
        .await;
    assert_eq!(inside.expect("ok").await["recovered"], true);
    for seq in 22..=31 {
        assert_eq!(inside.msg().await.1, seq);
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn a_wrong_epoch_is_not_recovered() {
    let gw = Gateway::start().await;
    gw.publish("news", json!(1)).await;
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    client
        .send(json!({"op": "sub", "id": 1, "topic": "news", "since": 0, "epoch": "not-this-one"}))
        .await;
    let ok = client.expect("ok").await;
    assert_eq!(ok["recovered"], false);
    assert_ne!(ok["epoch"], "not-this-one");
    gw.publish("news", json!(2)).await;
    assert_eq!(client.msg().await.1, 2);
    gw.shutdown().await;
}

#[tokio::test]
async fn a_since_from_the_future_is_not_recovered() {
    let gw = Gateway::start().await;
    gw.publish("news", json!(1)).await;
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    client
        .send(json!({"op": "sub", "id": 1, "topic": "news", "since": 99}))
        .await;
    assert_eq!(client.expect("ok").await["recovered"], false);
    gw.shutdown().await;
}
