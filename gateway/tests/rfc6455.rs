//! RFC 6455 conformance, seen from the wire.
//!
//! A hand-written client speaks raw bytes over TCP, so that it can do what a
//! library client never would: send unmasked frames, bad UTF-8, reserved
//! bits, stray continuations, oversized and endless fragmented messages. Each
//! test tells one rule of the protocol and checks the server's answer to the
//! byte: the close code it sends, and that it then really ends the TCP
//! connection. Every wait is bounded, so a server that hangs fails fast.
// A test that cannot go on should stop and say why.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::Gateway;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Longest the server may take for any one answer.
const STEP: Duration = Duration::from_secs(5);

const CONTINUATION: u8 = 0x0;
const TEXT: u8 = 0x1;
const BINARY: u8 = 0x2;
const CLOSE: u8 = 0x8;
const PING: u8 = 0x9;
const PONG: u8 = 0xA;

const FIN: u8 = 0x80;
const RSV1: u8 = 0x40;

/// The message size limit the size tests configure.
const LIMIT: usize = 1024;

/// A frame as the server put it on the wire.
#[derive(Debug)]
struct Frame {
    fin: bool,
    /// The three reserved bits, in place (0x70 mask).
    rsv: u8,
    opcode: u8,
    masked: bool,
    /// Bytes of extended payload length: 0, 2 (16-bit form) or 8 (64-bit form).
    extended_len: usize,
    payload: Vec<u8>,
}

impl Frame {
    /// The status code of a close frame (first two bytes, big-endian).
    fn close_code(&self) -> u16 {
        assert_eq!(self.opcode, CLOSE, "expected a close frame, got {self:?}");
        assert!(
            self.payload.len() >= 2,
            "close frame without a code: {self:?}"
        );
        u16::from_be_bytes([self.payload[0], self.payload[1]])
    }

    /// A text frame's payload as JSON.
    fn json(&self) -> Value {
        assert_eq!(
            self.opcode, TEXT,
            "expected a text frame, got opcode {:#x}",
            self.opcode
        );
        serde_json::from_slice(&self.payload).expect("a text frame holds JSON")
    }

    /// Server frames are never masked, never fragmented, never use RSV bits.
    fn assert_plain(&self) {
        assert!(
            self.fin,
            "server frame not final: opcode {:#x}",
            self.opcode
        );
        assert!(
            !self.masked,
            "server frame masked: opcode {:#x}",
            self.opcode
        );
        assert_eq!(
            self.rsv, 0,
            "server frame with reserved bits: opcode {:#x}",
            self.opcode
        );
    }
}

/// One frame's bytes: `first` is the FIN/RSV/opcode byte; with `masked`, the
/// payload is masked with a fixed key, as RFC 6455 5.3 describes.
fn encode(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
    let mask_bit = if masked { 0x80 } else { 0 };
    let mut out = vec![first];
    match payload.len() {
        len @ 0..=125 => out.push(mask_bit | len as u8),
        len @ 126..=0xffff => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(len as u16).to_be_bytes());
        }
        len => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
    }
    if masked {
        out.extend_from_slice(&KEY);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ KEY[i % 4]));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

/// A WebSocket client that writes and parses frames by hand.
struct RawClient {
    stream: TcpStream,
    /// Bytes read and not yet parsed.
    buf: Vec<u8>,
}

impl RawClient {
    /// Opens TCP and performs the opening handshake (RFC 6455 4.1), checking
    /// the 101 and its `Sec-WebSocket-Accept`.
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
            "GET /ws HTTP/1.1\r\n\
             Host: {addr}\r\n\
             Upgrade: websocket\r\n\
             Connection: Upgrade\r\n\
             Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Sec-WebSocket-Version: 13\r\n\
             \r\n"
        );
        client.send_bytes(request.as_bytes()).await;
        let end = loop {
            if let Some(at) = client.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            client
                .fill(client.buf.len() + 1)
                .await
                .expect("the handshake response");
        };
        let head =
            String::from_utf8(client.buf.drain(..end).collect()).expect("an ASCII response head");
        assert!(
            head.starts_with("HTTP/1.1 101"),
            "expected 101, got:\n{head}"
        );
        // The RFC's own example key and its accept value (RFC 6455 1.3).
        let accept = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("sec-websocket-accept")
                    .then(|| value.trim())
            })
            .expect("Sec-WebSocket-Accept in the 101");
        assert_eq!(accept, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
        client
    }

    async fn send_bytes(&mut self, bytes: &[u8]) {
        timeout(STEP, self.stream.write_all(bytes))
            .await
            .expect("write in time")
            .expect("write");
    }

    async fn send_frame(&mut self, fin: bool, opcode: u8, payload: &[u8], masked: bool) {
        let first = if fin { FIN | opcode } else { opcode };
        self.send_bytes(&encode(first, payload, masked)).await;
    }

    /// A whole, masked text message in one frame.
    async fn send_text(&mut self, text: &str) {
        self.send_frame(true, TEXT, text.as_bytes(), true).await;
    }

    /// Reads until `buf` holds at least `n` bytes; `Err` once the connection
    /// has ended (EOF or reset).
    async fn fill(&mut self, n: usize) -> Result<(), String> {
        let mut chunk = [0u8; 16 * 1024];
        while self.buf.len() < n {
            match timeout(STEP, self.stream.read(&mut chunk))
                .await
                .expect("bytes in time")
            {
                Ok(0) => return Err("EOF".to_owned()),
                Ok(read) => self.buf.extend_from_slice(&chunk[..read]),
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    }

    /// The next frame, or `None` if the connection ended first.
    async fn next_frame(&mut self) -> Option<Frame> {
        self.fill(2).await.ok()?;
        let (b0, b1) = (self.buf[0], self.buf[1]);
        let masked = b1 & 0x80 != 0;
        let extended_len = match b1 & 0x7f {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let mask_len = if masked { 4 } else { 0 };
        self.fill(2 + extended_len + mask_len).await.ok()?;
        let len = match extended_len {
            0 => usize::from(b1 & 0x7f),
            2 => usize::from(u16::from_be_bytes([self.buf[2], self.buf[3]])),
            _ => {
                let bytes: [u8; 8] = self.buf[2..10].try_into().expect("8 length bytes");
                usize::try_from(u64::from_be_bytes(bytes)).expect("a length that fits")
            }
        };
        let start = 2 + extended_len + mask_len;
        self.fill(start + len).await.ok()?;
        let key: Vec<u8> = self.buf[2 + extended_len..start].to_vec();
        let mut payload: Vec<u8> = self.buf.drain(..start + len).skip(start).collect();
        if masked {
            payload
                .iter_mut()
                .enumerate()
                .for_each(|(i, b)| *b ^= key[i % 4]);
        }
        Some(Frame {
            fin: b0 & FIN != 0,
            rsv: b0 & 0x70,
            opcode: b0 & 0x0f,
            masked,
            extended_len,
            payload,
        })
    }

    async fn read_frame(&mut self) -> Frame {
        self.next_frame()
            .await
            .expect("a frame, not the end of the connection")
    }

    /// The server closes: a close frame with `code` comes next, then TCP ends.
    async fn expect_close(&mut self, code: u16) {
        let frame = self.read_frame().await;
        frame.assert_plain();
        assert_eq!(
            frame.close_code(),
            code,
            "close reason: {:?}",
            String::from_utf8_lossy(&frame.payload[2..])
        );
        self.expect_tcp_end().await;
    }

    /// Nothing follows; the server ends the TCP connection (EOF or reset).
    async fn expect_tcp_end(&mut self) {
        assert!(
            self.buf.is_empty(),
            "bytes after the close frame: {:?}",
            self.buf
        );
        let mut chunk = [0u8; 1024];
        match timeout(STEP, self.stream.read(&mut chunk)).await {
            Err(_) => panic!("the server kept the TCP connection open"),
            Ok(Ok(0) | Err(_)) => {}
            Ok(Ok(n)) => panic!("bytes after the close frame: {:?}", &chunk[..n]),
        }
    }
}

/// A gateway whose messages are limited to [`LIMIT`] bytes.
async fn small_gateway() -> Gateway {
    let mut config = Gateway::config();
    config.websocket.max_message_bytes = LIMIT;
    Gateway::with(config).await
}

#[tokio::test]
async fn an_unmasked_client_frame_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // RFC 6455 5.1: a server MUST close the connection on an unmasked frame.
    client
        .send_frame(true, TEXT, br#"{"op":"hello"}"#, false)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn an_unmasked_close_frame_is_a_protocol_error_too() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // Not a clean close: the frame breaks 5.1 like any other unmasked frame.
    client
        .send_frame(true, CLOSE, &1000u16.to_be_bytes(), false)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn text_that_is_not_utf8_closes_with_1007() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(true, TEXT, &[0xff, 0xfe], true).await;
    client.expect_close(1007).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn bad_utf8_in_a_fragment_closes_with_1007_before_the_message_ends() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(false, TEXT, br#"{"op":"#, true).await;
    client
        .send_frame(false, CONTINUATION, b"\"h\xff", true)
        .await;
    // No final fragment: the server checks UTF-8 as fragments arrive.
    client.expect_close(1007).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_character_split_across_fragments_is_accepted() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_text(r#"{"op":"hello"}"#).await;
    assert_eq!(client.read_frame().await.json()["op"], "welcome");
    client
        .send_text(r#"{"op":"sub","id":1,"topic":"chat:lobby"}"#)
        .await;
    assert_eq!(client.read_frame().await.json()["op"], "ok");

    // "€" is E2 82 AC: the first fragment ends inside it.
    let command = r#"{"op":"pub","id":2,"topic":"chat:lobby","data":"5 €"}"#.as_bytes();
    let split = command
        .iter()
        .position(|&b| b == 0xe2)
        .expect("the euro sign")
        + 1;
    client
        .send_frame(false, TEXT, &command[..split], true)
        .await;
    client
        .send_frame(true, CONTINUATION, &command[split..], true)
        .await;

    // The publisher is subscribed too: its `ok` and the `msg`, in either order.
    let (mut ok, mut msg) = (None, None);
    for _ in 0..2 {
        let frame = client.read_frame().await;
        frame.assert_plain();
        let message = frame.json();
        match message["op"].as_str() {
            Some("ok") => ok = Some(message),
            Some("msg") => msg = Some(message),
            _ => panic!("unexpected {message}"),
        }
    }
    assert_eq!(ok.expect("the pub's ok")["id"], 2);
    assert_eq!(msg.expect("the msg")["data"], "5 €");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_frame_over_the_size_limit_closes_with_1009() {
    let gw = small_gateway().await;
    let mut client = RawClient::connect(gw.addr).await;

    // A command of exactly LIMIT bytes is fine.
    let head = r#"{"op":"pub","id":1,"topic":"chat:lobby","data":""#;
    let tail = r#""}"#;
    let at_limit = format!(
        "{head}{}{tail}",
        "x".repeat(LIMIT - head.len() - tail.len())
    );
    assert_eq!(at_limit.len(), LIMIT);
    client.send_text(&at_limit).await;
    assert_eq!(client.read_frame().await.json()["op"], "welcome");
    let ok = client.read_frame().await.json();
    assert_eq!(
        (ok["op"].as_str(), ok["id"].as_u64()),
        (Some("ok"), Some(1)),
        "{ok}"
    );

    // One byte more is not.
    client
        .send_frame(true, TEXT, &[b' '; LIMIT + 1], true)
        .await;
    client.expect_close(1009).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn many_small_fragments_over_the_size_limit_close_with_1009() {
    let gw = small_gateway().await;
    let mut client = RawClient::connect(gw.addr).await;
    // A message meant to be 100 fragments of 100 bytes (10x the limit). Each
    // fragment is small; only their sum is too big.
    let fragment = [b' '; 100];
    client.send_frame(false, TEXT, &fragment, true).await;
    let mut sent = fragment.len();
    while sent <= LIMIT {
        client
            .send_frame(false, CONTINUATION, &fragment, true)
            .await;
        sent += fragment.len();
    }
    assert!(sent < 100 * fragment.len());
    // The server counts as the fragments come: it closes while the message is
    // still open, without waiting for the other ~90 fragments.
    client.expect_close(1009).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_ping_between_fragments_is_answered_at_once() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(false, TEXT, br#"{"op""#, true).await;
    // RFC 6455 5.4: control frames may be injected in the middle of a message.
    client.send_frame(true, PING, b"mid-message", true).await;
    let pong = client.read_frame().await;
    pong.assert_plain();
    assert_eq!(pong.opcode, PONG);
    assert_eq!(pong.payload, b"mid-message");

    client
        .send_frame(false, CONTINUATION, br#":"hel"#, true)
        .await;
    client
        .send_frame(true, CONTINUATION, br#"lo"}"#, true)
        .await;
    let welcome = client.read_frame().await;
    welcome.assert_plain();
    assert_eq!(welcome.json()["op"], "welcome");
    gw.shutdown().await;
}

#[tokio::test]
async fn the_close_handshake_is_echoed_then_tcp_ends() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_text(r#"{"op":"hello"}"#).await;
    assert_eq!(client.read_frame().await.json()["op"], "welcome");

    let mut close = 1000u16.to_be_bytes().to_vec();
    close.extend_from_slice(b"bye");
    client.send_frame(true, CLOSE, &close, true).await;
    // RFC 6455 5.5.1: the server answers with a close frame, then (7.1.1) the
    // server is the one to close TCP.
    client.expect_close(1000).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_close_code_reserved_for_local_use_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // 1005 "no status" must never appear on the wire (RFC 6455 7.4.1).
    client
        .send_frame(true, CLOSE, &1005u16.to_be_bytes(), true)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_binary_frame_closes_with_1003() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client
        .send_frame(true, BINARY, br#"{"op":"hello"}"#, true)
        .await;
    client.expect_close(1003).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_continuation_without_a_start_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client
        .send_frame(true, CONTINUATION, br#"{"op":"hello"}"#, true)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_new_message_inside_a_fragmented_one_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(false, TEXT, br#"{"op":"#, true).await;
    client
        .send_frame(true, TEXT, br#"{"op":"hello"}"#, true)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_reserved_bit_without_an_extension_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // No extension was negotiated, so RSV1 must be 0 (RFC 6455 5.2).
    client
        .send_bytes(&encode(FIN | RSV1 | TEXT, br#"{"op":"hello"}"#, true))
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_fragmented_control_frame_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // RFC 6455 5.5: control frames MUST NOT be fragmented.
    client.send_frame(false, PING, b"half", true).await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn server_frames_are_final_and_unmasked() {
    const BIG: usize = 100_000;
    let mut config = Gateway::config();
    config.websocket.max_message_bytes = 2 * BIG;
    config.http.max_body_bytes = 2 * BIG;
    config.queue.bytes = 8 * BIG;
    let gw = Gateway::with(config).await;
    let mut client = RawClient::connect(gw.addr).await;

    client.send_text(r#"{"op":"hello"}"#).await;
    let welcome = client.read_frame().await;
    welcome.assert_plain();
    assert_eq!(welcome.json()["op"], "welcome");

    client
        .send_text(r#"{"op":"sub","id":1,"topic":"news"}"#)
        .await;
    let ok = client.read_frame().await;
    ok.assert_plain();
    assert_eq!(ok.json()["op"], "ok");

    // Over 65535 bytes: the 64-bit length form, still one frame.
    let data = "y".repeat(BIG);
    let body = json!({"topic": "news", "data": data}).to_string();
    let (status, answer) = common::http(gw.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "publish: {answer}");
    let msg = client.read_frame().await;
    msg.assert_plain();
    assert_eq!(
        msg.extended_len,
        8,
        "a {}-byte payload needs the 64-bit length",
        msg.payload.len()
    );
    assert!(msg.payload.len() > BIG);
    let msg = msg.json();
    assert_eq!(msg["op"], "msg");
    assert_eq!(msg["data"].as_str().map(str::len), Some(BIG));

    client.send_frame(true, PING, b"p", true).await;
    let pong = client.read_frame().await;
    pong.assert_plain();
    assert_eq!((pong.opcode, pong.payload.as_slice()), (PONG, &b"p"[..]));

    client
        .send_frame(true, CLOSE, &1000u16.to_be_bytes(), true)
        .await;
    // expect_close checks that the close frame is plain too.
    client.expect_close(1000).await;
    gw.shutdown().await;
}
