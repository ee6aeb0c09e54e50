//! Replay with `since`: the missed messages, then live ones, with no gap and no
//! duplicate even while publishers keep publishing; `recovered: false` when
//! history cannot bridge the gap.

use serde_json::json;
use testkit::{Client, Gateway, WAIT};
use tokio::sync::{mpsc, watch};

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
    // The publisher goes past this seq only once every subscriber has
    // joined: each joins while messages are still being published.
    const JOINED_BY: u64 = 1500;
    const SINCES: [u64; 5] = [0, 17, 250, 499, 500];

    // Publish the first part, then keep publishing while clients subscribe with since.
    for i in 1..=500 {
        gw.publish("ticks", json!(i)).await;
    }
    let (published_tx, published) = watch::channel(500u64);
    let (joined_tx, mut joined) = mpsc::channel::<()>(SINCES.len());
    let publisher = {
        let addr = gw.addr;
        tokio::spawn(async move {
            for i in 501..=TOTAL {
                if i == JOINED_BY + 1 {
                    for _ in SINCES {
                        joined.recv().await.expect("every subscriber joins");
                    }
                }
                let body = json!({"topic": "ticks", "data": i}).to_string();
                let (status, _) =
                    testkit::http(addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
                assert_eq!(status, 200);
                published_tx.send_replace(i);
            }
        })
    };

    // The subscribers join one after another, each once the publisher has
    // gone 200 further, with different `since`.
    let mut joins = Vec::new();
    for (k, since) in SINCES.into_iter().enumerate() {
        let url = gw.ws_url();
        let mut published = published.clone();
        let joined = joined_tx.clone();
        let from = 500 + 200 * k as u64;
        joins.push(tokio::spawn(async move {
            tokio::time::timeout(WAIT, published.wait_for(|&n| n >= from))
                .await
                .expect("the publisher goes on")
                .expect("the publisher");
            let mut client = Client::connect_url(&url).await;
            client.hello(None).await;
            client
                .send(json!({"op": "sub", "id": 1, "topic": "ticks", "since": since}))
                .await;
            let ok = client.expect("ok").await;
            assert_eq!(ok["recovered"], true, "{ok}");
            // Mid-stream: after `from` was published, before the publisher
            // went on past JOINED_BY (so the rest of the stream came live).
            let at = ok["seq"].as_u64().expect("seq");
            assert!(
                (from..=JOINED_BY).contains(&at),
                "since {since}: joined at seq {at}, not mid-stream"
            );
            joined.send(()).await.expect("the publisher waits for us");
            let mut expected = since + 1;
            while expected <= TOTAL {
                let (_, seq, data) = client.msg().await;
                assert_eq!(seq, expected, "since {since}: gap or duplicate");
                assert_eq!(data, json!(seq));
                expected += 1;
            }
        }));
    }
    drop(joined_tx);
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
