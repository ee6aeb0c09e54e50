//! Limits at the door: what the server refuses before a WebSocket exists.
//!
//! A full pod answers 503 with `Retry-After` and takes clients again as soon
//! as a slot frees; a client too slow to finish its handshake is dropped; a
//! request that is not a proper RFC 6455 upgrade gets 400 at once; and only
//! the configured origins may open a WebSocket.
// A test that cannot go on should stop and say why.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Client, Gateway};
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
    let deadline = Instant::now() + STEP;
    let mut third = loop {
        match try_connect(&gw).await {
            Ok(client) => break client,
            Err(503) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(status) => panic!("a freed slot is reused; got {status}"),
        }
    };
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
    let (status, body) = common::http(gw.addr, "GET", "/ws", &[], b"").await;
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
