//! Just enough of a WebSocket client to break the rules on purpose: it writes
//! and parses frames by hand over a raw TCP stream, so that a test can send
//! what a library client never would (unmasked frames, bad UTF-8, reserved
//! bits, stray continuations, a client that never answers a ping) and check
//! the server's answer to the byte. Every wait is bounded by [`STEP`].

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// Longest the server may take for any one answer.
pub const STEP: Duration = Duration::from_secs(5);

pub const CONTINUATION: u8 = 0x0;
pub const TEXT: u8 = 0x1;
pub const BINARY: u8 = 0x2;
pub const CLOSE: u8 = 0x8;
pub const PING: u8 = 0x9;
pub const PONG: u8 = 0xA;

pub const FIN: u8 = 0x80;
pub const RSV1: u8 = 0x40;

/// A frame as the server put it on the wire.
#[derive(Debug)]
pub struct Frame {
    pub fin: bool,
    /// The three reserved bits, in place (0x70 mask).
    pub rsv: u8,
    pub opcode: u8,
    pub masked: bool,
    /// Bytes of extended payload length: 0, 2 (16-bit form) or 8 (64-bit form).
    pub extended_len: usize,
    pub payload: Vec<u8>,
}

impl Frame {
    /// The status code of a close frame (first two bytes, big-endian).
    pub fn close_code(&self) -> u16 {
        assert_eq!(self.opcode, CLOSE, "expected a close frame, got {self:?}");
        assert!(
            self.payload.len() >= 2,
            "close frame without a code: {self:?}"
        );
        u16::from_be_bytes([self.payload[0], self.payload[1]])
    }

    /// A text frame's payload as JSON.
    pub fn json(&self) -> Value {
        assert_eq!(
            self.opcode, TEXT,
            "expected a text frame, got opcode {:#x}",
            self.opcode
        );
        serde_json::from_slice(&self.payload).expect("a text frame holds JSON")
    }

    /// Server frames are never masked, never fragmented, never use RSV bits.
    pub fn assert_plain(&self) {
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
/// payload is masked with a fixed key, as RFC 6455 5.3 describes. The load
/// generator's encoder ([`loadtest::raw::encode`]): one encoder for all.
pub fn encode(first: u8, payload: &[u8], masked: bool) -> Vec<u8> {
    const KEY: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
    loadtest::raw::encode(first, payload, masked.then_some(KEY))
}

/// A WebSocket client that writes and parses frames by hand.
pub struct RawClient {
    stream: TcpStream,
    /// Bytes read and not yet parsed.
    buf: Vec<u8>,
}

impl RawClient {
    /// Opens TCP and performs the opening handshake (RFC 6455 4.1), checking
    /// the 101 and its `Sec-WebSocket-Accept`.
    pub async fn connect(addr: SocketAddr) -> Self {
        Self::connect_offering(addr, None).await.0
    }

    /// [`connect`](Self::connect), offering `extensions` (a
    /// `Sec-WebSocket-Extensions` value) where given; also the 101's head.
    pub async fn connect_offering(addr: SocketAddr, extensions: Option<&str>) -> (Self, String) {
        let headers: Vec<_> = extensions
            .map(|e| ("Sec-WebSocket-Extensions", e))
            .into_iter()
            .collect();
        Self::connect_with(addr, &headers).await
    }

    /// [`connect`](Self::connect) with the extra request `headers` (each
    /// on a line of its own, in order: a name given twice is sent twice);
    /// also the 101's head.
    pub async fn connect_with(addr: SocketAddr, headers: &[(&str, &str)]) -> (Self, String) {
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
             {}\r\n",
            headers
                .iter()
                .map(|(name, value)| format!("{name}: {value}\r\n"))
                .collect::<String>()
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
        (client, head)
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        timeout(STEP, self.stream.write_all(bytes))
            .await
            .expect("write in time")
            .expect("write");
    }

    /// Writes `bytes`, or says why not: for a client that may write after
    /// the server has closed (a peer that closed answers with a reset).
    pub async fn try_send_bytes(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        timeout(STEP, self.stream.write_all(bytes))
            .await
            .expect("write in time")
    }

    pub async fn send_frame(&mut self, fin: bool, opcode: u8, payload: &[u8], masked: bool) {
        let first = if fin { FIN | opcode } else { opcode };
        self.send_bytes(&encode(first, payload, masked)).await;
    }

    /// A whole, masked text message in one frame.
    pub async fn send_text(&mut self, text: &str) {
        self.send_frame(true, TEXT, text.as_bytes(), true).await;
    }

    /// Reads until `buf` holds at least `n` bytes; `Err` once the connection
    /// has ended (EOF or reset).
    pub async fn fill(&mut self, n: usize) -> Result<(), String> {
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
    pub async fn next_frame(&mut self) -> Option<Frame> {
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

    pub async fn read_frame(&mut self) -> Frame {
        self.next_frame()
            .await
            .expect("a frame, not the end of the connection")
    }

    /// The server closes: a close frame with `code` comes next, then TCP ends.
    pub async fn expect_close(&mut self, code: u16) {
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
    pub async fn expect_tcp_end(&mut self) {
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
