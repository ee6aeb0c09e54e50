//! Reads client frames off the socket, through our own RFC 6455 parser
//! ([`super::parser`]).
//!
//! fastwebsockets 0.10.0 only does the upgrade handshake for us (and lends
//! us its `unmask`): its reader keeps a fixed 8 KiB buffer per connection,
//! more than the rest of an idle connection together. This reader keeps no
//! buffer while the client is quiet. It reads into a buffer on the stack that
//! lives only inside one poll and hands the bytes to the parser, which
//! allocates only for a payload under way, as its bytes arrive. The rest of
//! a large payload, once a stack buffer's worth of it has come, is read from
//! the socket straight into its final buffer, which grows by at most as much
//! as it holds before each read. Bytes a read brings beyond the message it
//! completes wait in `carry`, which is freed as soon as it is used up.
//!
//! A message must arrive whole within `message_timeout` of its first byte.
//! Control frames between its fragments do not extend that, so a client
//! cannot hold a half-sent message (and its buffer) open by pinging.

use std::mem::MaybeUninit;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, ReadBuf};
use tokio::time::{Instant, timeout_at};

use super::parser::{FrameError, Parsed, Parser};
use crate::disconnect::CloseReason;
use crate::frame;
use crate::outbound::Outbound;

/// The stack buffer one read fills. The rest of a payload, once at least
/// this much of it has arrived and at least this much is still to come, is
/// read straight into its own buffer instead.
const STACK_READ: usize = 8 * 1024;

pub struct Reader<R> {
    read: R,
    parser: Parser,
    /// Bytes read past the last message, not yet parsed. Empty, and without
    /// an allocation, whenever the parser has caught up with the socket.
    carry: BytesMut,
    /// How long a message may take, from its first byte to its last.
    message_timeout: Duration,
    /// When the message under way began to arrive; `None` between messages.
    message_started: Option<Instant>,
}

impl<R: AsyncRead + Unpin> Reader<R> {
    /// Reads from `read`, a stream past the handshake; messages over `max`
    /// bytes, or that take longer than `message_timeout` to arrive, close
    /// the connection.
    pub fn new(read: R, max: usize, message_timeout: Duration) -> Self {
        Self {
            read,
            parser: Parser::new(max),
            carry: BytesMut::new(),
            message_timeout,
            message_started: None,
        }
    }

    /// Takes compressed messages, as `format` (the connection's, negotiated
    /// on the upgrade) says: inflated up to `cap` bytes.
    pub fn inflating(mut self, format: frame::Format, cap: usize) -> Self {
        if format.deflate().is_some() {
            self.parser = self.parser.inflating(cap);
        }
        self
    }

    /// Takes the messages of the subprotocol `format` speaks: binary ones
    /// for `herald.v1.protobuf` (a text message, read as any message is,
    /// is the session's to refuse: 1003), text only otherwise (a binary
    /// one closes with 1003 from its header).
    pub fn speaking(mut self, format: frame::Format) -> Self {
        if format.is_protobuf() {
            self.parser = self.parser.binary();
        }
        self
    }

    /// Takes binary messages (the echo) instead of refusing them.
    pub fn binary(mut self) -> Self {
        self.parser = self.parser.binary();
        self
    }

    /// Reads `early`, bytes that came with the handshake, before the socket.
    pub fn after_handshake(mut self, early: &[u8]) -> Self {
        if !early.is_empty() {
            self.carry = BytesMut::from(early);
        }
        self
    }

    /// The next event. Every partial frame lives in `self`, so dropping the
    /// future between polls loses no bytes; a session drops it only to end
    /// the connection anyway.
    pub async fn next(&mut self, out: &Outbound) -> Result<Parsed, CloseReason> {
        loop {
            let parsed = if !self.carry.is_empty() {
                self.parse_carry()?
            } else {
                self.read().await?
            };
            self.time_message();
            let Some(parsed) = parsed else { continue };
            if let Parsed::Close(payload) = &parsed {
                // Echo the client's code (and reason), as RFC 6455 5.5.1 asks.
                out.echo_close(frame::encode(frame::OP_CLOSE, &[payload]));
            }
            return Ok(parsed);
        }
    }

    /// Starts the message clock at a message's first byte; stops it at its
    /// last.
    fn time_message(&mut self) {
        match (self.parser.in_message(), self.message_started) {
            (true, None) => self.message_started = Some(Instant::now()),
            (false, Some(_)) => self.message_started = None,
            _ => {}
        }
    }

    /// Reads from the socket and parses what came; with a message under way,
    /// only until its deadline.
    async fn read(&mut self) -> Result<Option<Parsed>, CloseReason> {
        let deadline = self
            .message_started
            .and_then(|started| started.checked_add(self.message_timeout));
        let Some(deadline) = deadline else {
            return self.read_once().await;
        };
        // Checked before reading as well: a timer only fires while the read
        // waits, and a client that keeps bytes coming (pings between
        // fragments) would never let it.
        if Instant::now() >= deadline {
            return Err(CloseReason::MessageTimeout);
        }
        // Boxed: only a connection with a message under way carries the
        // timer; an idle one's read holds none.
        Box::pin(timeout_at(deadline, self.read_once()))
            .await
            .unwrap_or(Err(CloseReason::MessageTimeout))
    }

    /// Reads what the socket has and parses it: straight into the payload's
    /// buffer, or through the stack.
    async fn read_once(&mut self) -> Result<Option<Parsed>, CloseReason> {
        let direct = self.parser.payload_left() >= STACK_READ
            && self.parser.payload_received() >= STACK_READ;
        if direct {
            self.read_payload().await
        } else {
            self.read_some().await
        }
    }

    /// Parses bytes left over from an earlier read.
    fn parse_carry(&mut self) -> Result<Option<Parsed>, CloseReason> {
        let mut carry = std::mem::take(&mut self.carry);
        let (used, parsed) = self.parser.feed(&carry).map_err(closes)?;
        carry.advance(used);
        if !carry.is_empty() {
            self.carry = carry;
        }
        Ok(parsed)
    }

    /// Reads more of a large payload straight into its buffer, which the
    /// parser grows by at most as much as it holds: a client that declares a
    /// large frame and sends part of it pins about twice what it sent, not
    /// what it declared.
    async fn read_payload(&mut self) -> Result<Option<Parsed>, CloseReason> {
        let left = self.parser.payload_left();
        let mut room = self.parser.payload(STACK_READ).limit(left);
        let read = self
            .read
            .read_buf(&mut room)
            .await
            .map_err(|_| CloseReason::ConnectionLost)?;
        if read == 0 {
            return Err(CloseReason::ConnectionLost);
        }
        self.parser.appended(read).map_err(closes)
    }

    /// Reads what the socket has (up to [`STACK_READ`]) and parses it; what
    /// follows a complete message goes to `carry`.
    async fn read_some(&mut self) -> Result<Option<Parsed>, CloseReason> {
        std::future::poll_fn(|cx| {
            let mut stack = [MaybeUninit::<u8>::uninit(); STACK_READ];
            let mut buf = ReadBuf::uninit(&mut stack);
            match Pin::new(&mut self.read).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(_)) => return Poll::Ready(Err(CloseReason::ConnectionLost)),
                Poll::Ready(Ok(())) => {}
            }
            let filled = buf.filled();
            if filled.is_empty() {
                // EOF, between frames or inside one: no close handshake.
                return Poll::Ready(Err(CloseReason::ConnectionLost));
            }
            let (used, parsed) = self.parser.feed(filled).map_err(closes)?;
            self.carry.extend_from_slice(&filled[used..]);
            Poll::Ready(Ok(parsed))
        })
        .await
    }
}

impl<R> Reader<R> {
    /// Panics unless the parser's state is one it promises
    /// ([`Parser::check_invariants`]) and `carry` holds memory only while it
    /// holds bytes. For the fuzz targets (`session::fuzzing`).
    #[cfg(any(test, fuzzing))]
    pub(super) fn check_invariants(&self) {
        self.parser.check_invariants();
        assert!(!self.carry.is_empty() || self.carry.capacity() == 0);
    }
}

fn closes(e: FrameError) -> CloseReason {
    tracing::debug!(error = %e, "bad client frame");
    e.close_reason()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use std::future::Future;
    use std::io;
    use std::time::Duration;

    use tokio::io::AsyncWriteExt;
    use tokio::time::timeout;

    use super::super::parser::tests::masked;
    use super::*;
    use crate::session::{Limits, Overflow};

    const FIN: u8 = 0x80;
    const TEXT: u8 = 0x1;
    const CONTINUATION: u8 = 0x0;
    const CLOSE: u8 = 0x8;
    const PING: u8 = 0x9;

    /// Bounds every wait, so that a reader that hangs fails the test.
    const STEP: Duration = Duration::from_secs(10);
    /// A message timeout no test reaches.
    const NO_HURRY: Duration = Duration::from_secs(3600);

    fn outbound() -> Outbound {
        Outbound::new(Limits {
            frames: 16,
            bytes: 1 << 20,
            overflow: Overflow::Disconnect,
        })
    }

    /// Yields its bytes one per read, and then EOF.
    struct OneByte(Vec<u8>, usize);

    impl AsyncRead for OneByte {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            if let Some(&b) = self.0.get(self.1) {
                buf.put_slice(&[b]);
                self.1 += 1;
            }
            Poll::Ready(Ok(()))
        }
    }

    /// Yields its chunks, one per read (as much of one as the read takes),
    /// and then waits for ever: a client that stopped sending.
    struct Stalls(std::collections::VecDeque<Vec<u8>>);

    impl AsyncRead for Stalls {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let Some(mut chunk) = self.0.pop_front() else {
                return Poll::Pending;
            };
            let rest = chunk.split_off(chunk.len().min(buf.remaining()));
            buf.put_slice(&chunk);
            if !rest.is_empty() {
                self.0.push_front(rest);
            }
            Poll::Ready(Ok(()))
        }
    }

    /// Runs `reader.next()` until it has an event or waits for the socket.
    fn poll_next<R: AsyncRead + Unpin>(
        reader: &mut Reader<R>,
        out: &Outbound,
    ) -> Poll<Result<Parsed, CloseReason>> {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        std::pin::pin!(reader.next(out)).poll(&mut cx)
    }

    async fn next<R: AsyncRead + Unpin>(
        reader: &mut Reader<R>,
        out: &Outbound,
    ) -> Result<Parsed, CloseReason> {
        timeout(STEP, reader.next(out))
            .await
            .unwrap_or_else(|_| panic!("the reader hangs"))
    }

    async fn text<R: AsyncRead + Unpin>(reader: &mut Reader<R>, out: &Outbound) -> Bytes {
        match next(reader, out).await {
            Ok(Parsed::Text(text)) => text,
            other => panic!("expected text, got {other:?}"),
        }
    }

    /// A session's worth of frames: a 7-bit, a 16-bit and a 64-bit length, a
    /// fragmented message with a ping between its fragments, a close.
    fn conversation() -> (Vec<u8>, Vec<u8>) {
        let big = vec![b'b'; 70_000];
        let mut wire = masked(FIN | TEXT, b"{\"op\":\"hello\"}");
        wire.extend(masked(FIN | TEXT, &[b'm'; 300]));
        wire.extend(masked(FIN | TEXT, &big));
        wire.extend(masked(TEXT, b"frag"));
        wire.extend(masked(FIN | PING, b"mid"));
        wire.extend(masked(FIN | CONTINUATION, b"ment"));
        wire.extend(masked(FIN | CLOSE, &[0x03, 0xe8, b'o', b'k']));
        (wire, big)
    }

    async fn check_conversation<R: AsyncRead + Unpin>(reader: &mut Reader<R>, big: &[u8]) {
        let out = outbound();
        assert_eq!(&text(reader, &out).await[..], b"{\"op\":\"hello\"}");
        assert_eq!(&text(reader, &out).await[..], &[b'm'; 300][..]);
        assert_eq!(&text(reader, &out).await[..], big);
        match next(reader, &out).await {
            Ok(Parsed::Ping(p)) => assert_eq!(&p[..], b"mid"),
            other => panic!("expected the ping, got {other:?}"),
        }
        assert_eq!(&text(reader, &out).await[..], b"fragment");
        assert!(matches!(next(reader, &out).await, Ok(Parsed::Close(_))));
        // The echo carries the client's code and reason.
        let mut batch = Vec::new();
        let echo = out.take(&mut batch).and_then(|t| t.close?.frame);
        assert_eq!(
            echo.as_deref(),
            Some(&[0x88, 4, 0x03, 0xe8, b'o', b'k'][..])
        );
        assert!(reader.carry.is_empty());
    }

    #[tokio::test]
    async fn reads_one_byte_at_a_time() {
        let (wire, big) = conversation();
        let mut reader = Reader::new(OneByte(wire, 0), 1 << 20, NO_HURRY);
        check_conversation(&mut reader, &big).await;
        assert_eq!(
            next(&mut reader, &outbound()).await.err(),
            Some(CloseReason::ConnectionLost)
        );
    }

    #[tokio::test]
    async fn reads_from_a_pipe_in_odd_sizes() {
        let (wire, big) = conversation();
        let (mut client, server) = tokio::io::duplex(1000);
        let writer = tokio::spawn(async move {
            for chunk in wire.chunks(777) {
                client.write_all(chunk).await?;
            }
            Ok::<_, io::Error>(client)
        });
        let mut reader = Reader::new(server, 1 << 20, NO_HURRY);
        check_conversation(&mut reader, &big).await;
        let client = timeout(STEP, writer).await.map(|r| r.map(|r| r.is_ok()));
        assert!(matches!(client, Ok(Ok(true))));
    }

    #[tokio::test]
    async fn pipelined_frames_come_out_one_by_one() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let mut wire = Vec::new();
        for i in 0..100 {
            wire.extend(masked(FIN | TEXT, format!("message {i}").as_bytes()));
        }
        timeout(STEP, client.write_all(&wire))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("write"));
        let out = outbound();
        let mut reader = Reader::new(server, 1024, NO_HURRY);
        for i in 0..100 {
            assert_eq!(
                text(&mut reader, &out).await,
                format!("message {i}").as_bytes()
            );
        }
        assert!(reader.carry.is_empty() && reader.carry.capacity() == 0);
    }

    #[tokio::test]
    async fn errors_close_with_the_parsers_reason() {
        let cases: [(&[u8], CloseReason); 4] = [
            (&masked(FIN | TEXT, &[0xff]), CloseReason::InvalidUtf8),
            (&masked(FIN | 0x2, b"{}"), CloseReason::UnsupportedData),
            (
                &masked(FIN | CLOSE, &1005u16.to_be_bytes()),
                CloseReason::ProtocolError,
            ),
            (
                &masked(FIN | TEXT, &[b'x'; 2000]),
                CloseReason::MessageTooBig,
            ),
        ];
        for (wire, reason) in cases {
            let out = outbound();
            let mut reader = Reader::new(OneByte(wire.to_vec(), 0), 1024, NO_HURRY);
            assert_eq!(next(&mut reader, &out).await.err(), Some(reason));
            // Only a valid close is echoed; the session sends the error's close.
            assert!(!out.is_closing());
        }
    }

    #[tokio::test]
    async fn eof_inside_a_frame_is_a_lost_connection() {
        let wire = masked(FIN | TEXT, &[b'x'; 20_000]);
        for cut in [1, 5, 100, 19_000] {
            let mut reader = Reader::new(OneByte(wire[..cut].to_vec(), 0), 1 << 20, NO_HURRY);
            assert_eq!(
                next(&mut reader, &outbound()).await.err(),
                Some(CloseReason::ConnectionLost)
            );
        }
    }

    #[tokio::test]
    async fn a_dropped_read_loses_nothing() {
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let wire = masked(FIN | TEXT, &[b'y'; 20_000]);
        let out = outbound();
        let mut reader = Reader::new(server, 1 << 20, NO_HURRY);
        // Half a frame, then the read is given up: the rest still parses.
        let _ = client.write_all(&wire[..10_003]).await;
        assert!(
            timeout(Duration::from_millis(50), reader.next(&out))
                .await
                .is_err()
        );
        let _ = client.write_all(&wire[10_003..]).await;
        assert_eq!(text(&mut reader, &out).await.len(), 20_000);
    }

    #[test]
    fn an_idle_reader_holds_no_buffer() {
        // Its size is all it costs: the parser and carry own no heap memory.
        // (160 bytes, and 32 for the message clock.)
        let reader = Reader::new(tokio::io::empty(), 1 << 16, NO_HURRY);
        assert!(reader.carry.capacity() == 0);
        assert!(
            std::mem::size_of_val(&reader) <= 192,
            "{}",
            std::mem::size_of_val(&reader)
        );
    }

    #[tokio::test]
    async fn a_frame_that_stops_short_costs_what_arrived_not_what_it_declared() {
        let wire = masked(FIN | TEXT, &[b'd'; 65_000]);
        let out = outbound();
        // Its 8-byte header declares 65,000 bytes; 10 of them come.
        let mut reader = Reader::new(Stalls([wire[..18].to_vec()].into()), 1 << 20, NO_HURRY);
        assert!(poll_next(&mut reader, &out).is_pending());
        let held = reader.parser.buffered_capacity() + reader.carry.capacity();
        println!("a header declaring 65,000 bytes and 10 bytes: {held} bytes held");
        assert!(held <= 64, "{held} bytes held for 10 received");

        // 20,000 of them, in chunks the size of one read: they go straight
        // into the message buffer once a stack buffer's worth is in, which
        // grows by at most as much as it holds.
        let chunks = wire[..8 + 20_000].chunks(STACK_READ).map(<[u8]>::to_vec);
        let mut reader = Reader::new(Stalls(chunks.collect()), 1 << 20, NO_HURRY);
        assert!(poll_next(&mut reader, &out).is_pending());
        let held = reader.parser.buffered_capacity();
        assert_eq!(reader.parser.payload_received(), 20_000);
        assert!(held <= 2 * 20_000, "{held} bytes held for 20,000 received");
    }

    #[tokio::test]
    async fn a_large_message_read_in_pieces_still_comes_out_whole() {
        // Straight into its buffer, in every read size the growth meets.
        let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let wire = masked(FIN | TEXT, &big);
        for size in [1000, STACK_READ - 1, STACK_READ, STACK_READ + 1, 50_000] {
            let chunks = wire.chunks(size).map(<[u8]>::to_vec);
            let mut reader = Reader::new(Stalls(chunks.collect()), 1 << 20, NO_HURRY);
            match poll_next(&mut reader, &outbound()) {
                Poll::Ready(Ok(Parsed::Text(text))) => assert!(text == big, "{size}"),
                other => panic!("expected the message, got {other:?}"),
            }
        }
    }

    async fn send(client: &mut tokio::io::DuplexStream, wire: &[u8]) {
        let written = timeout(STEP, client.write_all(wire)).await;
        assert!(matches!(written, Ok(Ok(()))), "write");
    }

    #[tokio::test]
    async fn a_message_must_arrive_within_its_timeout_whatever_pings_come_between() {
        const MESSAGE_TIMEOUT: Duration = Duration::from_millis(200);
        let (mut client, server) = tokio::io::duplex(128 * 1024);
        let out = outbound();
        let mut reader = Reader::new(server, 1 << 20, MESSAGE_TIMEOUT);
        // A whole first fragment, then only pings, and never the rest.
        let pinger = tokio::spawn(async move {
            client.write_all(&masked(TEXT, &[b'f'; 60_000])).await?;
            // Past STEP, so that only the reader ends this.
            for _ in 0..1000 {
                client.write_all(&masked(FIN | PING, b"still here")).await?;
                // The pace of a client keeping a connection busy.
                tokio::time::sleep(MESSAGE_TIMEOUT / 10).await;
            }
            Ok::<_, io::Error>(())
        });
        let started = Instant::now();
        let mut pings = 0;
        let reason = loop {
            match next(&mut reader, &out).await {
                Ok(Parsed::Ping(_)) => pings += 1,
                Ok(other) => panic!("only pings, got {other:?}"),
                Err(reason) => break reason,
            }
        };
        assert_eq!(reason, CloseReason::MessageTimeout);
        assert!(
            pings > 0,
            "pings are answered while the message is under way"
        );
        assert!(started.elapsed() >= MESSAGE_TIMEOUT);
        pinger.abort();
    }

    #[tokio::test]
    async fn a_message_that_trickles_in_is_timed_from_its_first_byte() {
        const MESSAGE_TIMEOUT: Duration = Duration::from_millis(200);
        let (mut client, server) = tokio::io::duplex(1024);
        let wire = masked(FIN | TEXT, &[b't'; 1000]);
        let trickler = tokio::spawn(async move {
            for byte in wire.chunks(1) {
                client.write_all(byte).await?;
                tokio::time::sleep(MESSAGE_TIMEOUT / 10).await;
            }
            Ok::<_, io::Error>(())
        });
        let mut reader = Reader::new(server, 1 << 20, MESSAGE_TIMEOUT);
        assert_eq!(
            next(&mut reader, &outbound()).await.err(),
            Some(CloseReason::MessageTimeout)
        );
        trickler.abort();
    }

    #[tokio::test]
    async fn the_message_clock_runs_only_while_a_message_is_under_way() {
        const MESSAGE_TIMEOUT: Duration = Duration::from_millis(100);
        let (mut client, server) = tokio::io::duplex(64 * 1024);
        let out = outbound();
        let mut reader = Reader::new(server, 1 << 20, MESSAGE_TIMEOUT);
        // A ping alone starts no clock.
        send(&mut client, &masked(FIN | PING, b"p")).await;
        assert!(matches!(next(&mut reader, &out).await, Ok(Parsed::Ping(_))));
        assert!(reader.message_started.is_none());
        // A fragment starts it, a ping between fragments leaves it running,
        // the last fragment stops it.
        send(&mut client, &masked(TEXT, b"{\"op\"")).await;
        send(&mut client, &masked(FIN | PING, b"p")).await;
        assert!(matches!(next(&mut reader, &out).await, Ok(Parsed::Ping(_))));
        let started = reader.message_started;
        assert!(started.is_some());
        send(&mut client, &masked(FIN | CONTINUATION, b":1}")).await;
        assert_eq!(&text(&mut reader, &out).await[..], b"{\"op\":1}");
        assert!(reader.message_started.is_none());
        // Quiet for longer than the message timeout, between messages: no
        // close (the session's dead-peer timer is what bounds that).
        let quiet = timeout(3 * MESSAGE_TIMEOUT, reader.next(&out)).await;
        assert!(quiet.is_err(), "between messages, only silence: {quiet:?}");
        // The next message has a clock of its own.
        send(&mut client, &masked(FIN | TEXT, b"next")).await;
        assert_eq!(&text(&mut reader, &out).await[..], b"next");
        drop(client);
    }
}
