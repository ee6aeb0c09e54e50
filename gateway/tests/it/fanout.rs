//! Fan-out: every message reaches every subscriber, in order.

use serde_json::json;
use testkit::{Client, Gateway};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_message_reaches_a_thousand_clients_in_order() {
    const CLIENTS: usize = 1000;
    const MESSAGES: u64 = 50;
    let gw = Gateway::start().await;
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut client = Client::connect(&gw).await;
        client.hello(None).await;
        client.sub(1, "wide").await;
        clients.push(client);
    }
    assert_eq!(
        gw.node
            .hub
            .subscribers(&router::Topic::parse("wide").expect("topic")),
        CLIENTS
    );
    for i in 1..=MESSAGES {
        gw.publish("wide", json!({"i": i, "pad": "x".repeat(100)}))
            .await;
    }
    let readers: Vec<_> = clients
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                for seq in 1..=MESSAGES {
                    let (_, got, data) = client.msg().await;
                    assert_eq!(got, seq);
                    assert_eq!(data["i"], seq);
                }
            })
        })
        .collect();
    for reader in readers {
        reader.await.expect("every message, in order");
    }
    assert_eq!(gw.metric("herald_messages_dropped_total").await, 0.0);
    // Every write of a publication is timed from the hub to the socket.
    assert!(gw.metric("herald_fanout_latency_seconds_count").await >= CLIENTS as f64);
    assert!(gw.metric("herald_write_batch_frames_count").await >= CLIENTS as f64);
    gw.shutdown().await;
}
