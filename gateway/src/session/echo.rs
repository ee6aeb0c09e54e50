//! A plain WebSocket echo server over Herald's own connection code, so that
//! a conformance suite (Autobahn|Testsuite's fuzzingclient) can be pointed at
//! Herald's frame reader and writer: `examples/echo.rs`, and
//! `docs/conformance.md` for how to run the suite.
//!
//! It is a session without the protocol: the same split of the upgraded
//! socket, [`Reader`] (and its parser), outgoing queue ([`Outbound`]) and
//! writer ([`writer::run`]) as [`super::serve_upgraded`]; each text
//! message goes back as it came (text as text, binary as binary), pings are
//! answered, closes are echoed (by the reader, as in a session). It
//! negotiates permessage-deflate as `/ws` does (`websocket.compression`):
//! compressed messages are inflated under the same cap, and the echo goes
//! back compressed in the connection's format. (Herald's sessions refuse
//! binary messages with 1003; the echo takes them, through the same parser.)

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fastwebsockets::WebSocket;
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::upgrade::Upgraded;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::parser::Parsed;
use super::reader::Reader;
use super::{Limits, Serve, split};
use crate::config::Config;
use crate::deflate::negotiation::{self, Settings};
use crate::disconnect::CloseReason;
use crate::frame::{self, Format};
use crate::metrics::Metrics;
use crate::outbound::{Outbound, Writing, writer};

/// The echo's settings, shared by its connections.
pub struct Echo {
    max_message_bytes: usize,
    message_timeout: Duration,
    limits: Limits,
    /// permessage-deflate, where allowed; and the inflated cap.
    compression: Option<Settings>,
    inflate_cap: usize,
    writing: Arc<Writing>,
}

impl Echo {
    /// An echo with `config`'s WebSocket limits, queue bounds and timers.
    pub fn new(config: &Config) -> Arc<Self> {
        let metrics = Arc::new(Metrics::new());
        Arc::new(Self {
            max_message_bytes: config.websocket.max_message_bytes,
            message_timeout: config.websocket.message_timeout,
            limits: config.queue_limits(),
            compression: config.websocket.compression.settings(),
            inflate_cap: config
                .websocket
                .compression
                .inflated_cap(config.websocket.max_message_bytes),
            writing: Arc::new(Writing::new(config, metrics, Instant::now())),
        })
    }

    /// Accepts connections on `listener` and echoes each (any path
    /// upgrades), until the task is dropped or accepting fails.
    pub async fn run(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            let echo = self.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| echo.clone().upgrade(req));
                let connection = http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades();
                let _ = connection.await;
            });
        }
    }

    /// Answers the handshake and echoes the connection in a task of its own
    /// (the 101 must go out before the upgrade completes).
    async fn upgrade(
        self: Arc<Self>,
        mut req: Request<Incoming>,
    ) -> Result<Response<Empty<Bytes>>, Infallible> {
        match fastwebsockets::upgrade::upgrade(&mut req) {
            Ok((mut response, upgrading)) => {
                let format =
                    negotiation::answer(req.headers(), response.headers_mut(), self.compression)
                        .map_or(Format::WebSocket, Format::WebSocketDeflate);
                tokio::spawn(async move {
                    if let Ok(ws) = upgrading.await {
                        self.serve_upgraded(ws, format).await;
                    }
                });
                Ok(response)
            }
            Err(_) => {
                let mut response = Response::new(Empty::new());
                *response.status_mut() = StatusCode::BAD_REQUEST;
                Ok(response)
            }
        }
    }

    /// Echoes an upgraded connection, its frames in `format`, until it ends.
    pub async fn serve_upgraded(self: Arc<Self>, ws: WebSocket<TokioIo<Upgraded>>, format: Format) {
        let limits = self.limits;
        split(ws.into_inner().into_inner(), limits, format, self).await;
    }
}

impl Serve for Arc<Echo> {
    fn serve<R, W>(self, read: R, early: Bytes, write: W, out: Outbound) -> impl Future<Output = ()>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let writing = writer::run(write, out.clone(), self.writing.clone());
        // Made here, so that `early` (a slice of hyper's read buffer) is not
        // kept for as long as the connection lives.
        let mut reader = Reader::new(read, self.max_message_bytes, self.message_timeout)
            .inflating(out.format(), self.inflate_cap)
            .binary()
            .after_handshake(&early);
        async move {
            tokio::join!(writing, echo(&mut reader, &out));
        }
    }
}

/// The read loop: what a session's does with each event, with commands
/// replaced by their echo.
async fn echo<R: AsyncRead + Unpin>(reader: &mut Reader<R>, out: &Outbound) {
    loop {
        // Dropping an unfinished read (not cancel-safe) only when the
        // connection ends anyway.
        let next = tokio::select! {
            biased;
            _ = out.stopped() => return,
            next = reader.next(out) => next,
        };
        match next {
            Ok(Parsed::Text(text)) => {
                let echo = frame::encode_as(out.format(), frame::OP_TEXT, &[&text]);
                if !out.send(echo).await {
                    return;
                }
            }
            Ok(Parsed::Binary(data)) => {
                let echo = frame::encode_as(out.format(), frame::OP_BINARY, &[&data]);
                if !out.send(echo).await {
                    return;
                }
            }
            Ok(Parsed::Ping(payload)) => out.pong(frame::encode(frame::OP_PONG, &[&payload])),
            Ok(Parsed::Pong(_)) => {}
            Ok(Parsed::Close(_)) => {
                // The reader queued the echo of the client's close; if ours
                // went first, this completes the handshake.
                if out.reason() != Some(CloseReason::ClientClosed) {
                    out.stop();
                }
                return;
            }
            Err(reason) => {
                if reason.code().is_some() {
                    out.close(reason, false);
                } else {
                    out.note_reason(reason);
                    out.stop();
                }
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::parser::tests::masked;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// Bounds every wait.
    const STEP: Duration = Duration::from_secs(10);

    /// The echo over a pipe: what the client reads back for `wire`, to the
    /// end of the stream.
    async fn exchange(wire: &[u8]) -> Vec<u8> {
        exchange_as(Format::WebSocket, wire).await
    }

    /// [`exchange`] on a connection whose frames are in `format`.
    async fn exchange_as(format: Format, wire: &[u8]) -> Vec<u8> {
        let (client, server) = tokio::io::duplex(1 << 20);
        let (read, write) = tokio::io::split(server);
        let echo = Echo::new(&Config::default());
        let out = Outbound::formatted(echo.limits, format);
        let served = tokio::spawn(echo.serve(read, Bytes::new(), write, out));
        let (mut from, mut to) = tokio::io::split(client);
        to.write_all(wire).await.expect("write");
        let mut got = Vec::new();
        tokio::time::timeout(STEP, from.read_to_end(&mut got))
            .await
            .expect("the echo ends the stream")
            .expect("read");
        tokio::time::timeout(STEP, served)
            .await
            .expect("the echo ends")
            .expect("no panic");
        got
    }

    #[tokio::test]
    async fn texts_come_back_pings_are_answered_and_the_close_is_echoed() {
        let mut wire = masked(0x1, b"frag");
        wire.extend(masked(0x89, b"p"));
        wire.extend(masked(0x80, b"ment"));
        wire.extend(masked(0x88, &[0x03, 0xe8, b'o', b'k']));
        let mut expected = frame::encode(frame::OP_PONG, &[b"p"]).to_vec();
        expected.extend_from_slice(&frame::encode(frame::OP_TEXT, &[b"fragment"]));
        expected.extend_from_slice(&[0x88, 4, 0x03, 0xe8, b'o', b'k']);
        assert_eq!(exchange(&wire).await, expected);
    }

    #[tokio::test]
    async fn with_deflate_messages_come_back_compressed_and_binary_stays_binary() {
        use crate::session::parser::tests::compressed;
        let deflate = crate::deflate::Deflate {
            window_bits: 15,
            level: 1,
            min_bytes: 0,
        };
        let data: Vec<u8> = b"0123456789".repeat(100);
        let mut wire = masked(0xC2, &compressed(&data));
        wire.extend(masked(0x88, &[0x03, 0xe8]));
        let got = exchange_as(Format::WebSocketDeflate(deflate), &wire).await;
        // FIN, RSV1, binary; a 16-bit length or less; the payload inflates back.
        assert_eq!(got[0], 0xC2);
        let (len, head) = match got[1] {
            126 => (usize::from(u16::from_be_bytes([got[2], got[3]])), 4),
            n => (usize::from(n), 2),
        };
        let inflated = crate::deflate::inflate::inflate(&got[head..head + len], 1 << 20);
        assert_eq!(inflated, Ok(data));
        assert_eq!(&got[head + len..], &[0x88, 2, 0x03, 0xe8]);
    }

    #[tokio::test]
    async fn a_bad_frame_closes_with_its_code() {
        let got = exchange(&masked(0x81, &[0xff])).await;
        assert_eq!(got, frame::close(1007, "invalid utf-8").to_vec());
    }
}
