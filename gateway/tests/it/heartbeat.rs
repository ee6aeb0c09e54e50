//! Heartbeat: the server pings every `ping_interval`; a client from which
//! nothing at all arrives for `ping_interval + pong_timeout` is a dead peer and
//! is closed with 4001. A client that answers pings stays, however long.
//!
//! The timing is shortened to a few hundred milliseconds. The silent client is
//! a raw TCP client (a library client would answer the pings by itself).

// A test that cannot go on should stop and say why.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::json;
use testkit::raw::{CLOSE, Frame, PING, PONG, RawClient, TEXT};
use testkit::{Client, Gateway, WAIT};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

const PING_INTERVAL: Duration = Duration::from_millis(300);
const PONG_TIMEOUT: Duration = Duration::from_millis(300);

async fn heartbeat_gateway() -> Gateway {
    let mut config = Gateway::config();
    config.websocket.ping_interval = PING_INTERVAL;
    config.websocket.pong_timeout = PONG_TIMEOUT;
    Gateway::with(config).await
}

/// The next server frame, or `None` once TCP has ended. Heartbeat frames are
/// short: their length fits the 7-bit form.
async fn next_short_frame(client: &mut RawClient) -> Option<Frame> {
    let frame = client.next_frame().await?;
    assert_eq!(
        frame.extended_len,
        0,
        "heartbeat frames are short: {} bytes",
        frame.payload.len()
    );
    Some(frame)
}

/// [`next_short_frame`], which must not find the connection ended.
async fn read_short_frame(client: &mut RawClient) -> Frame {
    next_short_frame(client)
        .await
        .expect("a frame, not the end of the connection")
}

#[tokio::test]
async fn a_silent_client_is_pinged_then_closed_as_a_dead_peer() {
    let gw = heartbeat_gateway().await;
    let mut client = RawClient::connect(gw.addr).await;
    let started = Instant::now();

    // The client says nothing and answers nothing; it just reads.
    let mut pings = 0;
    let close = loop {
        match next_short_frame(&mut client).await {
            Some(frame) if frame.opcode == PING => {
                assert!(
                    frame.fin && !frame.masked,
                    "server pings are final and unmasked"
                );
                assert_eq!(
                    frame.payload.len(),
                    8,
                    "the ping carries an 8-byte timestamp"
                );
                pings += 1;
            }
            Some(frame) if frame.opcode == CLOSE => {
                assert!(!frame.masked);
                break Some(frame);
            }
            Some(frame) => {
                panic!(
                    "unexpected opcode {:#x}: {:?}",
                    frame.opcode,
                    String::from_utf8_lossy(&frame.payload)
                )
            }
            None => break None,
        }
    };
    let elapsed = started.elapsed();
    if let Some(frame) = close {
        assert_eq!(frame.close_code(), 4001);
        // TCP ends right after the close frame.
        assert!(
            next_short_frame(&mut client).await.is_none(),
            "nothing after the close frame"
        );
    }
    assert!(pings >= 1, "the server pinged before giving up");
    // Not before the deadline; how long after it depends on the machine's
    // load, so the close and its count are what is checked, not a clock.
    let deadline = PING_INTERVAL + PONG_TIMEOUT;
    assert!(
        elapsed >= deadline - Duration::from_millis(50),
        "closed too early: {elapsed:?}"
    );
    gw.await_metric(
        r#"herald_connections_closed_total{reason="dead_peer"}"#,
        1.0,
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_that_answers_pings_stays_and_gets_messages() {
    let gw = heartbeat_gateway().await;
    let connected = Instant::now();
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    client.sub(1, "news").await;

    // Three pings, each answered by tungstenite as it reads them: the first
    // comes an interval after the connection opened, so the client has
    // outlived the dead-peer deadline (`ping_interval + pong_timeout`) by then.
    for _ in 0..3 {
        let next = tokio::time::timeout(WAIT, client.ws.next())
            .await
            .expect("a ping in time");
        match next {
            Some(Ok(Message::Ping(_))) => {}
            other => panic!("only pings while idle, got {other:?}"),
        }
    }
    assert!(connected.elapsed() >= 3 * PING_INTERVAL);

    // Still connected, still subscribed.
    gw.publish("news", json!("still here")).await;
    assert_eq!(client.msg().await.2, json!("still here"));
    assert_eq!(
        gw.metric(r#"herald_connections_closed_total{reason="dead_peer"}"#)
            .await,
        0.0
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn pings_carry_8_bytes_and_client_pings_are_answered_in_kind() {
    let gw = heartbeat_gateway().await;
    let mut client = RawClient::connect(gw.addr).await;

    let ping = read_short_frame(&mut client).await;
    assert_eq!((ping.fin, ping.opcode, ping.masked), (true, PING, false));
    assert_eq!(ping.payload.len(), 8);

    client.send_frame(true, PING, b"are you there?", true).await;
    let pong = loop {
        // A server ping may come first; look past it.
        let frame = read_short_frame(&mut client).await;
        if frame.opcode != PING {
            break frame;
        }
    };
    assert_eq!(
        (pong.fin, pong.opcode, pong.masked, pong.payload.as_slice()),
        (true, PONG, false, &b"are you there?"[..])
    );

    // And the connection still works.
    client
        .send_frame(true, TEXT, br#"{"op":"hello"}"#, true)
        .await;
    let welcome = loop {
        let frame = read_short_frame(&mut client).await;
        if frame.opcode != PING {
            break frame;
        }
    };
    assert_eq!(welcome.opcode, TEXT, "the welcome");
    gw.shutdown().await;
}
