//! Heartbeat: the server pings every `ping_interval`; a client from which
//! nothing at all arrives for `ping_interval + pong_timeout` is a dead peer and
//! is closed with 4001. A client that answers pings stays, however long.
//!
//! The timing is shortened to a few hundred milliseconds. The silent client is
//! a raw TCP client (a library client would answer the pings by itself).
// A test that cannot go on should stop and say why.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{Client, Gateway};
use futures_util::StreamExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, timeout};
use tokio_tungstenite::tungstenite::Message;

const PING_INTERVAL: Duration = Duration::from_millis(300);
const PONG_TIMEOUT: Duration = Duration::from_millis(300);
/// Longest the server may take for any one answer.
const STEP: Duration = Duration::from_secs(5);

const TEXT: u8 = 0x1;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

async fn heartbeat_gateway() -> Gateway {
    let mut config = Gateway::config();
    config.websocket.ping_interval = PING_INTERVAL;
    config.websocket.pong_timeout = PONG_TIMEOUT;
    Gateway::with(config).await
}

/// A frame from the server: (fin, opcode, masked, payload).
type Frame = (bool, u8, bool, Vec<u8>);

/// Just enough of a WebSocket client to stay silent on purpose.
struct RawClient {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawClient {
    async fn connect(addr: SocketAddr) -> Self {
        let stream = timeout(STEP, TcpStream::connect(addr))
            .await
            .expect("connect in time")
            .expect("connect");
        let mut client = Self {
            stream,
            buf: Vec::new(),
        };
        let request = format!(
            "GET /ws HTTP/1.1\r\nHost: {addr}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        );
        timeout(STEP, client.stream.write_all(request.as_bytes()))
            .await
            .expect("write in time")
            .expect("write the handshake");
        let end = loop {
            if let Some(at) = client.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            assert!(
                client.fill(client.buf.len() + 1).await,
                "the handshake response"
            );
        };
        let head: Vec<u8> = client.buf.drain(..end).collect();
        assert!(
            head.starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        client
    }

    /// A masked frame.
    async fn send_frame(&mut self, fin: bool, opcode: u8, payload: &[u8]) {
        const KEY: [u8; 4] = [0x11, 0x22, 0x33, 0x44];
        assert!(payload.len() < 126, "short frames only");
        let mut bytes = vec![u8::from(fin) << 7 | opcode, 0x80 | payload.len() as u8];
        bytes.extend_from_slice(&KEY);
        bytes.extend(payload.iter().enumerate().map(|(i, b)| b ^ KEY[i % 4]));
        timeout(STEP, self.stream.write_all(&bytes))
            .await
            .expect("write in time")
            .expect("write a frame");
    }

    /// Reads until `buf` holds `n` bytes; false once the connection ended.
    async fn fill(&mut self, n: usize) -> bool {
        let mut chunk = [0u8; 4096];
        while self.buf.len() < n {
            match timeout(STEP, self.stream.read(&mut chunk))
                .await
                .expect("bytes in time")
            {
                Ok(0) | Err(_) => return false,
                Ok(read) => self.buf.extend_from_slice(&chunk[..read]),
            }
        }
        true
    }

    /// The next server frame (unmasked, short), or `None` once TCP has ended.
    async fn next_frame(&mut self) -> Option<Frame> {
        if !self.fill(2).await {
            return None;
        }
        let (b0, b1) = (self.buf[0], self.buf[1]);
        let len = usize::from(b1 & 0x7f);
        assert!(len < 126, "heartbeat frames are short: {len}");
        let masked = b1 & 0x80 != 0;
        let start = if masked { 6 } else { 2 };
        if !self.fill(start + len).await {
            return None;
        }
        let payload = self.buf.drain(..start + len).skip(start).collect();
        Some((b0 & 0x80 != 0, b0 & 0x0f, masked, payload))
    }

    async fn read_frame(&mut self) -> Frame {
        self.next_frame()
            .await
            .expect("a frame, not the end of the connection")
    }
}

/// Polls a metric until it reads `want`; the count is updated once the
/// connection's task has finished, just after the TCP connection ends.
async fn await_metric(gw: &Gateway, name: &str, want: f64) {
    let deadline = Instant::now() + STEP;
    loop {
        let value = gw.metric(name).await;
        if value == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} is {value}, expected {want}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_silent_client_is_pinged_then_closed_as_a_dead_peer() {
    let gw = heartbeat_gateway().await;
    let mut client = RawClient::connect(gw.addr).await;
    let started = Instant::now();

    // The client says nothing and answers nothing; it just reads.
    let mut pings = 0;
    let close = loop {
        match client.next_frame().await {
            Some((fin, PING, masked, payload)) => {
                assert!(fin && !masked, "server pings are final and unmasked");
                assert_eq!(payload.len(), 8, "the ping carries an 8-byte timestamp");
                pings += 1;
            }
            Some((_, CLOSE, masked, payload)) => {
                assert!(!masked);
                break Some(payload);
            }
            Some((_, opcode, _, payload)) => {
                panic!(
                    "unexpected opcode {opcode:#x}: {:?}",
                    String::from_utf8_lossy(&payload)
                )
            }
            None => break None,
        }
    };
    let elapsed = started.elapsed();
    if let Some(payload) = close {
        assert!(payload.len() >= 2, "close frame without a code");
        assert_eq!(u16::from_be_bytes([payload[0], payload[1]]), 4001);
        // TCP ends right after the close frame.
        assert!(
            client.next_frame().await.is_none(),
            "nothing after the close frame"
        );
    }
    assert!(pings >= 1, "the server pinged before giving up");
    let deadline = PING_INTERVAL + PONG_TIMEOUT;
    assert!(
        elapsed >= deadline - Duration::from_millis(50),
        "closed too early: {elapsed:?}"
    );
    assert!(
        elapsed <= deadline + Duration::from_millis(1500),
        "closed too late: {elapsed:?}"
    );

    await_metric(
        &gw,
        r#"herald_connections_closed_total{reason="dead_peer"}"#,
        1.0,
    )
    .await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_client_that_answers_pings_stays_and_gets_messages() {
    let gw = heartbeat_gateway().await;
    let mut client = Client::connect(&gw).await;
    client.hello(None).await;
    client.sub(1, "news").await;

    // Read for four intervals: tungstenite answers each ping as it reads.
    let until = Instant::now() + 4 * PING_INTERVAL + PONG_TIMEOUT;
    let mut pings = 0;
    while let Ok(next) = tokio::time::timeout_at(until, client.ws.next()).await {
        match next {
            Some(Ok(Message::Ping(_))) => pings += 1,
            other => panic!("only pings while idle, got {other:?}"),
        }
    }
    assert!(
        pings >= 3,
        "pings every interval: {pings} in {:?}",
        4 * PING_INTERVAL
    );

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

    let (fin, opcode, masked, payload) = client.read_frame().await;
    assert_eq!((fin, opcode, masked), (true, PING, false));
    assert_eq!(payload.len(), 8);

    client.send_frame(true, PING, b"are you there?").await;
    let pong = loop {
        // A server ping may come first; look past it.
        match client.read_frame().await {
            (_, PING, _, _) => continue,
            frame => break frame,
        }
    };
    assert_eq!(pong, (true, PONG, false, b"are you there?".to_vec()));

    // And the connection still works.
    client.send_frame(true, TEXT, br#"{"op":"hello"}"#).await;
    let (_, opcode, _, _) = loop {
        match client.read_frame().await {
            (_, PING, _, _) => continue,
            frame => break frame,
        }
    };
    assert_eq!(opcode, TEXT, "the welcome");
    gw.shutdown().await;
}
