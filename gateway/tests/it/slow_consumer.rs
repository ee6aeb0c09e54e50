//! A client that stops reading must not delay anyone else: its queue fills,
//! the overflow rule closes it (where its namespace says so: by default a
//! namespace with history catches it up instead, `it/lag.rs`), and the
//! others keep getting every message.
//! Its memory is bounded by its queue (`queue.bytes`).

use std::time::Duration;

use serde_json::json;
use testkit::{Client, Gateway, WAIT, eventually};
use tokio::net::TcpSocket;
use tokio_tungstenite::MaybeTlsStream;

/// A subscriber with a tiny receive buffer, so that the gateway's writes to
/// it block as soon as it stops reading.
async fn slow_subscriber(gw: &Gateway, topic: &str) -> Client {
    let socket = TcpSocket::new_v4().expect("socket");
    socket.set_recv_buffer_size(4096).expect("SO_RCVBUF");
    let stream = socket.connect(gw.addr).await.expect("connect");
    let (ws, _) = tokio_tungstenite::client_async(gw.ws_url(), MaybeTlsStream::Plain(stream))
        .await
        .expect("handshake");
    let mut client = Client { ws };
    client.hello(None).await;
    client.sub(1, topic).await;
    client
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_is_closed_and_delays_nobody() {
    const HEALTHY: usize = 100;
    // 6 MB in all: more than the kernel buffers on loopback (tcp_wmem max 4 MB)
    // plus the queue.
    const MESSAGES: u64 = 120;
    let mut config = Gateway::config();
    config.queue.bytes = 256 * 1024;
    // Where history is kept, a lagging client is caught up from it by
    // default (`it/lag.rs`): this namespace closes it instead.
    config.namespaces.insert(
        "default".to_owned(),
        router::NamespaceSettings {
            on_lag: Some(router::OnLag::Disconnect),
            ..Default::default()
        },
    );
    // Far longer than any wait of this test: a fan-out that waited on the
    // slow client's socket would hold every healthy client past its [`WAIT`]
    // for a message, and fail the test, whatever the machine's speed. No
    // clock is read: the healthy clients getting everything is the proof.
    config.websocket.write_timeout = Duration::from_secs(300);
    let gw = Gateway::with(config).await;

    // The slow client never reads after subscribing.
    let slow = slow_subscriber(&gw, "firehose").await;

    let mut healthy = Vec::new();
    for _ in 0..HEALTHY {
        let mut client = Client::connect(&gw).await;
        client.hello(None).await;
        client.sub(1, "firehose").await;
        healthy.push(client);
    }
    let readers: Vec<_> = healthy
        .into_iter()
        .map(|mut client| {
            tokio::spawn(async move {
                for seq in 1..=MESSAGES {
                    assert_eq!(
                        client.msg().await.1,
                        seq,
                        "a healthy client missed a message"
                    );
                }
                client
            })
        })
        .collect();

    let pad = "x".repeat(48 * 1024);
    for n in 1..=MESSAGES {
        gw.publish("firehose", json!({"n": n, "pad": pad})).await;
    }
    let mut healthy = Vec::new();
    for reader in readers {
        healthy.push(reader.await.expect("healthy client got everything"));
    }

    // The overflow rule condemned the slow connection when its queue
    // overflowed; its writer still waits on a socket nobody reads (for the
    // write timeout, set out of reach above). Once the client goes, the
    // close is counted with the reason that came first, and the pod forgets
    // the client.
    drop(slow);
    gw.await_metric(
        r#"herald_connections_closed_total{reason="slow_consumer"}"#,
        1.0,
    )
    .await;
    let topic = router::Topic::parse("firehose").expect("topic");
    assert_eq!(gw.node.hub.subscribers(&topic), HEALTHY);
    assert_eq!(gw.metric("herald_messages_dropped_total").await, 0.0);
    drop(healthy);
    gw.shutdown().await;
}

#[tokio::test]
async fn with_drop_newest_a_slow_client_sees_a_gap_instead() {
    let mut config = Gateway::config();
    config.queue.frames = 4;
    config.queue.overflow = gateway::session::Overflow::DropNewest;
    // Without history, and without an `on_lag` of its own, a namespace
    // follows the connection's overflow rule.
    config.namespaces.insert(
        "default".to_owned(),
        router::NamespaceSettings {
            history_size: 0,
            ..Default::default()
        },
    );
    let gw = Gateway::with(config).await;
    let mut slow = slow_subscriber(&gw, "firehose").await;
    let pad = "x".repeat(16 * 1024);
    for _ in 0..200 {
        gw.publish("firehose", json!({"pad": pad})).await;
    }
    assert!(gw.metric("herald_messages_dropped_total").await > 0.0);
    // Reading again, the client gets a series with gaps, and stays connected:
    // it reads until a message published after the flood arrives.
    let reader = tokio::spawn(async move {
        let (mut last, mut gaps) = (0, 0);
        while last <= 200 {
            let (_, seq, _) = slow.msg().await;
            gaps += u32::from(seq != last + 1);
            last = seq;
        }
        gaps
    });
    eventually(WAIT, || async {
        if reader.is_finished() {
            return Ok(());
        }
        gw.publish("firehose", json!("after the flood")).await;
        Err("no message after the flood arrived")
    })
    .await;
    assert!(reader.await.expect("reader") > 0, "drops must show as gaps");
    gw.shutdown().await;
}
