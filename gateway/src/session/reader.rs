//! Reads client frames: RFC 6455 checks fastwebsockets leaves to us, and
//! reassembly of fragmented messages under a byte cap.
//!
//! fastwebsockets 0.10.0 caps single frames but not reassembled messages, does
//! not reject unmasked client frames, and checks UTF-8 of a fragmented text
//! only in its own collector (which has no cap). So this reader collects
//! fragments itself: at most `max` bytes, UTF-8 checked as they arrive.

use std::convert::Infallible;

use bytes::{Bytes, BytesMut};
use fastwebsockets::{Frame, OpCode, Payload, Role, WebSocketRead};
use tokio::io::AsyncRead;

use crate::disconnect::CloseReason;
use crate::frame;
use crate::outbound::Outbound;

/// One event from the client.
#[derive(Debug)]
pub enum Incoming {
    /// A whole text message, valid UTF-8.
    Text(Bytes),
    Ping(Bytes),
    Pong(Bytes),
    /// The client's close frame; the echo is already on its way out.
    Close,
}

pub struct Reader<R> {
    ws: WebSocketRead<R>,
    max: usize,
    partial: Option<Partial>,
}

struct Partial {
    buf: BytesMut,
    /// Bytes at the front of `buf` known to be valid UTF-8.
    valid: usize,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    /// Reads from `read`, a stream past the handshake; messages over `max`
    /// bytes close the connection.
    pub fn new(read: R, max: usize) -> Self {
        let (mut ws, _) =
            fastwebsockets::after_handshake_split(read, tokio::io::sink(), Role::Server);
        // Pings come to us, so that they count as a sign of life.
        ws.set_auto_pong(false);
        // The library checks the close frame and hands us the echo.
        ws.set_auto_close(true);
        // The library refuses frames of at least this size before reading them.
        ws.set_max_message_size(max.saturating_add(1));
        Self {
            ws,
            max,
            partial: None,
        }
    }

    /// The next event. Not cancel-safe: drop the future only to end the connection.
    pub async fn next(&mut self, out: &Outbound) -> Result<Incoming, CloseReason> {
        loop {
            // The library hands over the close echo before we have checked the
            // frame: hold it until the frame has passed our own checks. On a
            // read error (an invalid close code among them) the session sends
            // the close for the error instead.
            let mut echo = None;
            let mut obligation = |frame: Frame<'_>| {
                echo = Some(frame::encode(frame::OP_CLOSE, &[&frame.payload]));
                std::future::ready(Ok::<(), Infallible>(()))
            };
            let mut frame = self
                .ws
                .read_frame(&mut obligation)
                .await
                .map_err(|e| CloseReason::from_read_error(&e))?;
            if !is_masked(&mut frame) {
                return Err(CloseReason::ProtocolError);
            }
            if let Some(echo) = echo {
                out.echo_close(echo);
            }
            let fin = frame.fin;
            let opcode = frame.opcode;
            let payload = into_bytes(frame.payload);
            match opcode {
                OpCode::Ping => return Ok(Incoming::Ping(payload.freeze())),
                OpCode::Pong => return Ok(Incoming::Pong(payload.freeze())),
                OpCode::Close => return Ok(Incoming::Close),
                OpCode::Binary => return Err(CloseReason::UnsupportedData),
                OpCode::Text if self.partial.is_some() => return Err(CloseReason::ProtocolError),
                // Single-frame text was UTF-8 checked by the library.
                OpCode::Text if fin => return Ok(Incoming::Text(payload.freeze())),
                OpCode::Text => {
                    let mut partial = Partial {
                        buf: payload,
                        valid: 0,
                    };
                    partial.check(false)?;
                    self.partial = Some(partial);
                }
                OpCode::Continuation => {
                    let Some(partial) = self.partial.as_mut() else {
                        return Err(CloseReason::ProtocolError);
                    };
                    if partial.buf.len() + payload.len() > self.max {
                        return Err(CloseReason::MessageTooBig);
                    }
                    partial.buf.extend_from_slice(&payload);
                    partial.check(fin)?;
                    if fin && let Some(partial) = self.partial.take() {
                        return Ok(Incoming::Text(partial.buf.freeze()));
                    }
                }
            }
        }
    }
}

impl Partial {
    /// Checks the bytes not yet known valid; an incomplete character at the
    /// end is fine unless the message is `complete`.
    fn check(&mut self, complete: bool) -> Result<(), CloseReason> {
        match std::str::from_utf8(&self.buf[self.valid..]) {
            Ok(_) => {
                self.valid = self.buf.len();
                Ok(())
            }
            Err(e) if e.error_len().is_none() && !complete => {
                self.valid += e.valid_up_to();
                Ok(())
            }
            Err(_) => Err(CloseReason::InvalidUtf8),
        }
    }
}

/// Whether the client masked the frame, as RFC 6455 5.1 requires. The
/// library keeps the mask private but writes it into a formatted header.
fn is_masked(frame: &mut Frame<'_>) -> bool {
    let mut head = [0u8; 14];
    frame.fmt_head(&mut head);
    head[1] & 0x80 != 0
}

fn into_bytes(payload: Payload<'_>) -> BytesMut {
    match payload {
        Payload::Bytes(b) => b,
        other => BytesMut::from(&other[..]),
    }
}
