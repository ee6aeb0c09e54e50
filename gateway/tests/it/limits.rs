//! Limits at the door: what the server refuses before a WebSocket exists,
//! and how long a client may take over a message once it does.
//!
//! A full pod answers 503 with `Retry-After` and takes clients again as soon
//! as a slot frees; a client too slow to finish its handshake is dropped; a
//! request that is not a proper RFC 6455 upgrade gets 400 at once; and only
//! the configured origins may open a WebSocket. Once connected, a message
//! must arrive whole within `websocket.message_timeout`, pings or not (else
//! close 1008), and bytes of a frame that never ends are no sign of life
//! (close 4001), while the other clients carry on.

// A test that cannot go on should stop and say why.

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::json;
use testkit::raw::{CLOSE, FIN, PING, PONG, RawClient, TEXT, encode};
use testkit::{Client, Gateway, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite;

/// Longest the server may take for any one answer.
const STEP: Duration = Duration::from_secs(5);

/// An HTTP response head, read off the wire.
struct Head {
    status: u16,
    text: String,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.text.lines().skip(1).find_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }
}

/// Sends a WebSocket upgrade request by hand, with `version` and the extra
/// headers, and reads the response head.
async fn upgrade_request(addr: SocketAddr, version: &str, extra: &[(&str, &str)]) -> Head {
    let mut stream = timeout(STEP, TcpStream::connect(addr))
        .await
        .expect("connect in time")
        .expect("connect");
    let mut request = format!(
        "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: {version}\r\n"
    );
    for (name, value) in extra {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    timeout(STEP, stream.write_all(request.as_bytes()))
        .await
        .expect("write in time")
        .expect("write the request");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = timeout(STEP, stream.read(&mut chunk))
            .await
            .expect("a response in time, not a hang")
            .expect("read the response");
        assert!(
            read > 0,
            "connection closed without a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..read]);
    }
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {text}"));
    Head { status, text }
}

/// Tries a WebSocket connection; the HTTP status of a refusal.
async fn try_connect(gw: &Gateway) -> Result<Client, u16> {
    let attempt = timeout(STEP, tokio_tungstenite::connect_async(gw.ws_url()))
        .await
        .expect("an answer in time");
    match attempt {
        Ok((ws, _)) => Ok(Client { ws }),
        Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
        Err(e) => panic!("connect failed without an HTTP answer: {e}"),
    }
}

#[tokio::test]
async fn a_full_pod_answers_503_until_a_slot_frees() {
    let mut config = Gateway::config();
    config.websocket.max_connections = 2;
    let gw = Gateway::with(config).await;
    let mut first = Client::connect(&gw).await;
    let mut second = Client::connect(&gw).await;
    first.hello(None).await;
    second.hello(None).await;

    // The third is refused before the upgrade, with advice on when to retry.
    let third = timeout(STEP, tokio_tungstenite::connect_async(gw.ws_url()))
        .await
        .expect("an answer in time");
    let response = match third {
        Ok(_) => panic!("a third connection must be refused"),
        Err(tungstenite::Error::Http(response)) => response,
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
    };
    assert_eq!(response.status(), 503);
    let retry_after = response
        .headers()
        .get("retry-after")
        .expect("Retry-After on the 503");
    assert!(
        retry_after.to_str().is_ok_and(|v| v.parse::<u64>().is_ok()),
        "Retry-After in seconds: {retry_after:?}"
    );
    assert_eq!(
        gw.metric(r#"herald_upgrades_rejected_total{reason="at_capacity"}"#)
            .await,
        1.0
    );

    // One leaves; the slot frees once its session has ended, so poll briefly.
    first.ws.close(None).await.expect("send close");
    first.closed().await;
    let mut third = eventually(STEP, || async {
        match try_connect(&gw).await {
            Ok(client) => Ok(client),
            Err(503) => Err("the freed slot is still taken (503)"),
            Err(status) => panic!("a freed slot is reused; got {status}"),
        }
    })
    .await;
    third.hello(None).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_handshake_that_never_finishes_is_dropped() {
    const HANDSHAKE_TIMEOUT: Duration = Duration::from_millis(300);
    let mut config = Gateway::config();
    config.websocket.handshake_timeout = HANDSHAKE_TIMEOUT;
    let gw = Gateway::with(config).await;

    let started = Instant::now();
    let mut stream = timeout(STEP, TcpStream::connect(gw.addr))
        .await
        .expect("connect in time")
        .expect("connect");
    // The head of an upgrade request, without the blank line that ends it.
    let half = format!(
        "GET /ws HTTP/1.1\r\nHost: {}\r\nUpgrade: websocket\r\n",
        gw.addr
    );
    stream
        .write_all(half.as_bytes())
        .await
        .expect("write half a request");

    // The server may say 408 first; then it must end the connection.
    let mut answer = Vec::new();
    let mut chunk = [0u8; 1024];
    loop {
        match timeout(
            HANDSHAKE_TIMEOUT + Duration::from_secs(2),
            stream.read(&mut chunk),
        )
        .await
        {
            Err(_) => panic!(
                "the server kept a half handshake for {:?}",
                started.elapsed()
            ),
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&chunk[..n]),
        }
    }
    let elapsed = started.elapsed();
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "unexpected answer: {answer}"
    );
    assert!(
        elapsed >= HANDSHAKE_TIMEOUT / 2,
        "dropped before the timeout: {elapsed:?}"
    );
    assert!(
        elapsed <= HANDSHAKE_TIMEOUT + Duration::from_secs(1),
        "dropped late: {elapsed:?}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_get_without_upgrade_is_400() {
    let gw = Gateway::start().await;
    let (status, body) = testkit::http(gw.addr, "GET", "/ws", &[], b"").await;
    assert_eq!(status, 400, "{body}");
    gw.shutdown().await;
}

#[tokio::test]
async fn an_unsupported_websocket_version_is_400() {
    let gw = Gateway::start().await;
    let head = upgrade_request(gw.addr, "8", &[]).await;
    assert_eq!(head.status, 400, "{}", head.text);
    gw.shutdown().await;
}

#[tokio::test]
async fn an_unsupported_version_answer_names_version_13() {
    let gw = Gateway::start().await;
    let head = upgrade_request(gw.addr, "8", &[]).await;
    // RFC 6455 4.2.2 and 4.4: the refusal MUST carry a Sec-WebSocket-Version
    // header listing the versions the server speaks.
    assert_eq!(
        head.header("sec-websocket-version"),
        Some("13"),
        "{}",
        head.text
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn only_allowed_origins_may_connect() {
    let mut config = Gateway::config();
    config.websocket.allowed_origins = vec!["https://good.example".to_owned()];
    let gw = Gateway::with(config).await;

    let evil = upgrade_request(gw.addr, "13", &[("Origin", "https://evil.example")]).await;
    assert_eq!(evil.status, 403, "{}", evil.text);
    let good = upgrade_request(gw.addr, "13", &[("Origin", "https://good.example")]).await;
    assert_eq!(good.status, 101, "{}", good.text);
    assert_eq!(
        gw.metric(r#"herald_upgrades_rejected_total{reason="origin"}"#)
            .await,
        1.0
    );
    gw.shutdown().await;
}

/// The message timeout the slow-message tests configure.
const MESSAGE_TIMEOUT: Duration = Duration::from_millis(300);

/// A client on `gw` with a session, subscribed to `chat:room`.
async fn good_client(gw: &Gateway) -> Client {
    let mut client = Client::connect(gw).await;
    client.hello(None).await;
    client.sub(1, "chat:room").await;
    client
}

/// The well-behaved client still publishes a large message and gets it back.
async fn still_works(client: &mut Client, id: u64) {
    let data = "x".repeat(50_000);
    client
        .send(json!({"op": "pub", "id": id, "topic": "chat:room", "data": data}))
        .await;
    // Its `ok` and the `msg` it published, in either order.
    let mut answers = [client.recv().await, client.recv().await];
    answers.sort_by_key(|m| m["op"].as_str().map(str::to_owned));
    assert_eq!(answers[0]["op"], "msg", "{}", answers[0]);
    assert_eq!(answers[0]["data"], json!(data));
    assert_eq!(
        (&answers[1]["op"], &answers[1]["id"]),
        (&json!("ok"), &json!(id))
    );
}

#[tokio::test]
async fn a_message_never_finished_is_closed_with_1008_however_often_the_client_pings() {
    let mut config = Gateway::config();
    config.websocket.message_timeout = MESSAGE_TIMEOUT;
    let gw = Gateway::with(config).await;
    let mut good = good_client(&gw).await;

    // A whole first fragment, 60,000 bytes of a message that never ends,
    // then only pings, each answered: the connection is alive, but the
    // message gets no more time.
    let mut slow = RawClient::connect(gw.addr).await;
    // Before the first byte goes: the server's clock starts later.
    let started = Instant::now();
    slow.send_frame(false, TEXT, &[b' '; 60_000], true).await;
    let mut pongs = 0;
    let pinging = timeout(testkit::WAIT, async {
        loop {
            // A write may meet a server that closed already; the close
            // frame is in the socket all the same.
            let _ = slow
                .try_send_bytes(&encode(FIN | PING, b"still here", true))
                .await;
            let frame = slow.read_frame().await;
            match frame.opcode {
                PONG => pongs += 1,
                CLOSE => return frame,
                other => panic!("only pongs and the close, got opcode {other:#x}"),
            }
            // The pace of a client that keeps the connection busy.
            tokio::time::sleep(MESSAGE_TIMEOUT / 10).await;
        }
    });
    // Meanwhile the well-behaved client works as ever.
    let (close, ()) = tokio::join!(pinging, still_works(&mut good, 2));
    let close = close.expect("the close, not pongs for ever");
    close.assert_plain();
    assert_eq!(
        close.close_code(),
        1008,
        "{:?}",
        String::from_utf8_lossy(&close.payload[2..])
    );
    slow.expect_tcp_end().await;
    assert!(
        pongs > 0,
        "pings are answered while the message is under way"
    );
    assert!(
        started.elapsed() >= MESSAGE_TIMEOUT,
        "closed before the timeout: {:?}",
        started.elapsed()
    );
    gw.await_metric(
        r#"herald_connections_closed_total{reason="message_timeout"}"#,
        1.0,
    )
    .await;

    // The well-behaved client was never at risk.
    still_works(&mut good, 3).await;
    assert_eq!(
        gw.metric(r#"herald_connections_closed_total{reason="dead_peer"}"#)
            .await,
        0.0
    );
    gw.shutdown().await;
}

/// Trickles a text frame into `gw`, one byte per `pace`, and never ends it;
/// returns the close code the server ends the connection with. Server pings
/// go unanswered: a trickling client is not expected to be polite.
async fn trickle_until_closed(gw: &Gateway, pace: Duration) -> u16 {
    let mut client = RawClient::connect(gw.addr).await;
    let frame = encode(FIN | TEXT, &[b' '; 1000], true);
    let close = timeout(testkit::WAIT, async {
        for byte in frame.chunks(1) {
            let _ = client.try_send_bytes(byte).await;
            // The pace, unless the server says something first.
            if let Ok(frame) = timeout(pace, client.next_frame()).await {
                match frame {
                    Some(frame) if frame.opcode == PING => {}
                    Some(frame) if frame.opcode == CLOSE => return frame,
                    other => panic!("only pings and the close, got {other:?}"),
                }
            }
        }
        panic!("the whole frame went in a byte at a time: pace too fast")
    })
    .await
    .expect("the close, while the frame trickles in");
    close.assert_plain();
    client.expect_tcp_end().await;
    close.close_code()
}

#[tokio::test]
async fn a_frame_that_trickles_in_is_no_sign_of_life() {
    // The dead-peer timer is the shorter: bytes that complete no frame do
    // not reset it.
    let mut config = Gateway::config();
    config.websocket.ping_interval = Duration::from_millis(200);
    config.websocket.pong_timeout = Duration::from_millis(200);
    let gw = Gateway::with(config).await;
    assert_eq!(
        trickle_until_closed(&gw, Duration::from_millis(50)).await,
        4001
    );
    gw.await_metric(
        r#"herald_connections_closed_total{reason="dead_peer"}"#,
        1.0,
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_frame_that_trickles_in_is_a_message_too_slow() {
    // The message timeout is the shorter: it runs from the frame's first
    // byte, and the server is polite to everyone else meanwhile.
    let mut config = Gateway::config();
    config.websocket.message_timeout = MESSAGE_TIMEOUT;
    let gw = Gateway::with(config).await;
    let mut good = good_client(&gw).await;
    let trickler = trickle_until_closed(&gw, Duration::from_millis(50));
    let (code, ()) = tokio::join!(trickler, still_works(&mut good, 2));
    assert_eq!(code, 1008);
    gw.await_metric(
        r#"herald_connections_closed_total{reason="message_timeout"}"#,
        1.0,
    )
    .await;
    still_works(&mut good, 3).await;
    gw.shutdown().await;
}
