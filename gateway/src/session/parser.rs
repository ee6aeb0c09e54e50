//! RFC 6455 client frames, parsed from whatever bytes have arrived.
//!
//! The parser does no I/O: [`Parser::feed`] takes the bytes one read
//! returned, keeps what it needs and says how much it used. It holds a
//! 14-byte header in place and allocates only for a payload: a control
//! frame's (at most 125 bytes) or the text message being assembled, handed
//! over whole. A payload's buffer grows with the bytes that have arrived,
//! never from the length a header declares: a header is a promise the client
//! need not keep, and 10 bytes sent under a header that declares 65,000 cost
//! about 10 bytes, not 65,000. Between messages it owns no heap memory, so an
//! idle connection costs only this struct.
//!
//! Every rule a server must enforce on client frames is checked here, as early
//! as the bytes allow: a frame is refused from its header, before its payload
//! is read, when its bits, opcode, mask, length or place in a fragmented
//! message are wrong.
//!
//! Where permessage-deflate was negotiated ([`Parser::inflating`]), RSV1 on
//! a message's first frame marks it compressed: its compressed bytes are
//! assembled as any message's (under the same size limit), then inflated
//! whole under a cap of their own ([`crate::deflate::inflate`]): no
//! inflater outlives the message, and a bomb stops at the cap.

use crate::deflate::RSV1;
use crate::deflate::inflate::{InflateError, inflate};
use crate::disconnect::CloseReason;
use bytes::Bytes;

const FIN: u8 = 0x80;
const RSV: u8 = 0x70;
const MASKED: u8 = 0x80;

const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_BINARY: u8 = 0x2;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// Longest frame header: 2 bytes, a 64-bit length and the mask.
const MAX_HEADER: usize = 14;
/// Largest control frame payload (RFC 6455 5.5).
const MAX_CONTROL: usize = 125;
/// The most a payload buffer grows ahead of the bytes that have arrived, in
/// bytes. Below it a buffer doubles (amortised growth); above it, it grows
/// in steps of this size, so that a client that stops half-way through a
/// large message pins at most this much beyond what it sent.
const MAX_AHEAD: usize = 64 * 1024;

/// A client frame that breaks RFC 6455 or our limits. Each ends the
/// connection; [`FrameError::close_reason`] picks the close code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("reserved bits set where no extension allows them")]
    ReservedBits,
    #[error("opcode {0:#x} is reserved")]
    ReservedOpcode(u8),
    #[error("client frame not masked")]
    Unmasked,
    #[error("control frame without FIN")]
    FragmentedControl,
    #[error("control frame payload over 125 bytes")]
    LongControl,
    #[error("64-bit payload length with the most significant bit set")]
    LengthTopBit,
    #[error("message over the size limit")]
    TooBig,
    #[error("continuation frame without a message to continue")]
    StrayContinuation,
    #[error("new message started inside a fragmented one")]
    Interleaved,
    #[error("binary message")]
    Binary,
    #[error("text that is not UTF-8")]
    InvalidUtf8,
    #[error("close frame with a 1-byte payload")]
    ShortClose,
    #[error("close code {0} is not allowed on the wire")]
    CloseCode(u16),
    #[error("close reason that is not UTF-8")]
    CloseReasonUtf8,
    #[error("compressed message inflates past the cap")]
    InflatedTooBig,
    #[error("compressed message that is not deflate data")]
    Corrupt,
}

impl FrameError {
    /// The reason a bad client frame closes the connection with. (A read
    /// that fails or ends is [`CloseReason::ConnectionLost`]: no close frame.)
    pub fn close_reason(&self) -> CloseReason {
        match self {
            Self::InvalidUtf8 | Self::CloseReasonUtf8 => CloseReason::InvalidUtf8,
            Self::TooBig | Self::InflatedTooBig => CloseReason::MessageTooBig,
            Self::Binary => CloseReason::UnsupportedData,
            Self::ReservedBits
            | Self::ReservedOpcode(_)
            | Self::Unmasked
            | Self::FragmentedControl
            | Self::LongControl
            | Self::LengthTopBit
            | Self::StrayContinuation
            | Self::Interleaved
            | Self::ShortClose
            | Self::Corrupt
            | Self::CloseCode(_) => CloseReason::ProtocolError,
        }
    }
}

/// A whole message or control frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A text message, valid UTF-8, reassembled if it came in fragments
    /// (and inflated if it came compressed).
    Text(Bytes),
    /// A binary message, where the parser takes them ([`Parser::binary`]).
    Binary(Bytes),
    Ping(Bytes),
    Pong(Bytes),
    /// A valid close frame's payload (code and reason), to be echoed.
    Close(Bytes),
}

/// The frame parser of one connection.
#[derive(Debug)]
pub struct Parser {
    /// Largest message, whole or reassembled.
    max: usize,
    /// The header of the next frame, as far as it has arrived.
    head: [u8; MAX_HEADER],
    /// (A byte, and the flags and cap below in 32 bits: the parser is part
    /// of every idle connection, and stays the size it had without them.)
    head_len: u8,
    /// The frame whose payload is being read.
    frame: Option<Frame>,
    /// The text message being assembled: set by a text frame, taken when a
    /// frame with FIN completes it.
    message: Option<Message>,
    /// The payload of the control frame being read.
    control: Vec<u8>,
    /// The most a compressed message may inflate to; 0: permessage-deflate
    /// was not negotiated, and RSV1 is a protocol error.
    inflate_cap: u32,
    /// Binary messages are taken (the echo), not refused with 1003.
    binary: bool,
    /// The message under way came with RSV1: `message` holds deflate data.
    compressed: bool,
    /// The message under way is binary.
    binary_message: bool,
}

#[derive(Debug)]
struct Frame {
    fin: bool,
    opcode: u8,
    mask: [u8; 4],
    /// Payload bytes still to come.
    left: usize,
    /// Payload bytes read (and unmasked) so far.
    got: usize,
}

#[derive(Debug)]
struct Message {
    buf: Vec<u8>,
    /// Bytes at the front of `buf` known to be valid UTF-8.
    valid: usize,
}

impl Parser {
    /// A parser that refuses messages over `max` bytes.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            head: [0; MAX_HEADER],
            head_len: 0,
            frame: None,
            message: None,
            control: Vec::new(),
            inflate_cap: 0,
            binary: false,
            compressed: false,
            binary_message: false,
        }
    }

    /// Takes compressed messages (permessage-deflate negotiated), refused
    /// once they inflate past `cap` bytes.
    pub fn inflating(mut self, cap: usize) -> Self {
        // At most 4 GiB.
        self.inflate_cap = u32::try_from(cap).unwrap_or(u32::MAX).max(1);
        self
    }

    /// Takes binary messages ([`Parsed::Binary`]) instead of refusing them.
    pub fn binary(mut self) -> Self {
        self.binary = true;
        self
    }

    /// Parses from `input` until it runs out or a message (or control frame)
    /// is complete. Returns the bytes used: all of `input` unless a message
    /// came out, in which case the rest belongs to the frames that follow.
    pub fn feed(&mut self, input: &[u8]) -> Result<(usize, Option<Parsed>), FrameError> {
        let mut used = 0;
        loop {
            if let Some(frame) = &self.frame {
                let take = frame.left.min(input.len() - used);
                if frame.left > 0 && take == 0 {
                    return Ok((used, None));
                }
                self.payload(take)
                    .extend_from_slice(&input[used..used + take]);
                used += take;
                let parsed = self.appended(take)?;
                if parsed.is_some() || self.frame.is_some() {
                    return Ok((used, parsed));
                }
                // A fragment that completes no message: on to the next header.
                continue;
            }
            let need = self.header_len()?;
            let held = usize::from(self.head_len);
            let take = (need - held).min(input.len() - used);
            self.head[held..held + take].copy_from_slice(&input[used..used + take]);
            // At most MAX_HEADER (14).
            self.head_len += take as u8;
            used += take;
            // With two bytes in, the header's full length is known: go round
            // again for the rest.
            if usize::from(self.head_len) < self.header_len()? {
                if used == input.len() {
                    return Ok((used, None));
                }
                continue;
            }
            self.start_frame()?;
        }
    }

    /// Payload bytes of the current frame still to come; 0 while reading a
    /// header.
    pub fn payload_left(&self) -> usize {
        self.frame.as_ref().map_or(0, |f| f.left)
    }

    /// Bytes of the message (or control frame) under way that have arrived:
    /// what its buffer holds. 0 between messages.
    pub fn payload_received(&self) -> usize {
        match (&self.frame, &self.message) {
            (Some(frame), Some(message)) if !is_control(frame.opcode) => message.buf.len(),
            _ => self.control.len(),
        }
    }

    /// Whether a message is under way: from the first byte of the data frame
    /// that starts it to the last byte of the frame that completes it.
    /// Control frames between its fragments do not end it.
    pub fn in_message(&self) -> bool {
        self.message.is_some() || (self.head_len > 0 && !is_control(self.head[0] & 0x0F))
    }

    /// Where the current frame's payload goes, with room for at least `n`
    /// more bytes (`n` at most [`payload_left`](Self::payload_left)). A
    /// reader may append that many straight from the socket, then call
    /// [`appended`](Self::appended).
    ///
    /// The buffer grows only when it is out of room, by as much as it holds
    /// (at least `n`, at most `MAX_AHEAD`): with what has arrived, never
    /// with what a header declares. It never grows past the end of the
    /// message as far as the headers tell it: the end of this frame if it is
    /// the last, else the size limit.
    pub fn payload(&mut self, n: usize) -> &mut Vec<u8> {
        let end = self.frame.as_ref().map(|frame| {
            let last = frame.fin || is_control(frame.opcode);
            (last, frame.left)
        });
        let max = self.max;
        let buf = self.buffer();
        if let Some((last, left)) = end
            && buf.capacity() - buf.len() < n
        {
            let held = buf.len();
            let end = if last {
                held + left
            } else {
                max.max(held + left)
            };
            buf.reserve_exact(n.max(held.min(MAX_AHEAD)).min(end - held));
        }
        buf
    }

    /// The buffer the current frame's payload goes to.
    fn buffer(&mut self) -> &mut Vec<u8> {
        match (&self.frame, &mut self.message) {
            (Some(frame), Some(message)) if !is_control(frame.opcode) => &mut message.buf,
            _ => &mut self.control,
        }
    }

    /// Takes note of `n` raw payload bytes appended to [`payload`](Self::payload):
    /// unmasks them and, if they end the frame, checks it.
    pub fn appended(&mut self, n: usize) -> Result<Option<Parsed>, FrameError> {
        let Some(frame) = self.frame.as_mut() else {
            return Ok(None);
        };
        // The mask runs on from where the previous chunk stopped.
        let mut mask = frame.mask;
        mask.rotate_left(frame.got % 4);
        frame.got += n;
        frame.left -= n;
        let done = frame.left == 0;
        let payload = self.buffer();
        let start = payload.len() - n;
        fastwebsockets::unmask(&mut payload[start..], mask);
        if !done {
            return Ok(None);
        }
        match self.frame.take() {
            Some(frame) => self.finish_frame(&frame),
            None => Ok(None),
        }
    }

    /// The full length of the header being read, once its first two bytes
    /// are in and have passed the checks they allow.
    fn header_len(&self) -> Result<usize, FrameError> {
        if self.head_len < 2 {
            return Ok(2);
        }
        let [b0, b1] = [self.head[0], self.head[1]];
        let opcode = b0 & 0x0F;
        // RSV1 only where permessage-deflate was negotiated, and there
        // only on a message's first frame (RFC 7692 6): never on a
        // continuation or a control frame. RSV2 and RSV3 never.
        let rsv1_allowed = self.inflate_cap > 0 && matches!(opcode, OP_TEXT | OP_BINARY);
        if b0 & RSV != 0 && (b0 & RSV != RSV1 || !rsv1_allowed) {
            if b0 & RSV1 != 0 {
                crate::deflate::METRICS
                    .refused
                    .with_label_values(&["rsv1"])
                    .inc();
            }
            return Err(FrameError::ReservedBits);
        }
        if !matches!(
            opcode,
            OP_CONTINUATION | OP_TEXT | OP_BINARY | OP_CLOSE | OP_PING | OP_PONG
        ) {
            return Err(FrameError::ReservedOpcode(opcode));
        }
        if b1 & MASKED == 0 {
            // RFC 6455 5.1: every client frame is masked.
            return Err(FrameError::Unmasked);
        }
        let short = usize::from(b1 & 0x7F);
        if is_control(opcode) && b0 & FIN == 0 {
            return Err(FrameError::FragmentedControl);
        }
        if is_control(opcode) && short > MAX_CONTROL {
            return Err(FrameError::LongControl);
        }
        let extended = match short {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        Ok(2 + extended + 4)
    }

    /// Checks a complete header against the limits and the message in
    /// progress. Room for the payload is made as it arrives.
    fn start_frame(&mut self) -> Result<(), FrameError> {
        let head = &self.head[..usize::from(self.head_len)];
        self.head_len = 0;
        let fin = head[0] & FIN != 0;
        let opcode = head[0] & 0x0F;
        let (len, rest) = match head[1] & 0x7F {
            126 => (
                u64::from(u16::from_be_bytes([head[2], head[3]])),
                &head[4..],
            ),
            127 => {
                let mut len = [0; 8];
                len.copy_from_slice(&head[2..10]);
                let len = u64::from_be_bytes(len);
                if len >> 63 != 0 {
                    // RFC 6455 5.2: the most significant bit must be 0.
                    return Err(FrameError::LengthTopBit);
                }
                (len, &head[10..])
            }
            short => (u64::from(short), &head[2..]),
        };
        let mask = [rest[0], rest[1], rest[2], rest[3]];
        let len = usize::try_from(len).map_err(|_| FrameError::TooBig)?;
        // Control frames are short by now; `max` bounds messages.
        if len > self.max && !is_control(opcode) {
            return Err(FrameError::TooBig);
        }
        match opcode {
            // Into `control`, empty since the previous control frame was taken.
            OP_CLOSE | OP_PING | OP_PONG => {}
            OP_CONTINUATION => {
                let Some(message) = self.message.as_mut() else {
                    return Err(FrameError::StrayContinuation);
                };
                if message.buf.len() + len > self.max {
                    return Err(FrameError::TooBig);
                }
            }
            _ if self.message.is_some() => return Err(FrameError::Interleaved),
            OP_BINARY if !self.binary => return Err(FrameError::Binary),
            _ => {
                self.compressed = head[0] & RSV1 != 0;
                self.binary_message = opcode == OP_BINARY;
                self.message = Some(Message {
                    buf: Vec::new(),
                    valid: 0,
                })
            }
        }
        self.frame = Some(Frame {
            fin,
            opcode,
            mask,
            left: len,
            got: 0,
        });
        Ok(())
    }

    /// Checks a frame whose payload is complete and unmasked.
    fn finish_frame(&mut self, frame: &Frame) -> Result<Option<Parsed>, FrameError> {
        match frame.opcode {
            OP_PING => Ok(Some(Parsed::Ping(self.take_control()))),
            OP_PONG => Ok(Some(Parsed::Pong(self.take_control()))),
            OP_CLOSE => {
                let payload = self.take_control();
                check_close(&payload)?;
                Ok(Some(Parsed::Close(payload)))
            }
            _ => {
                let Some(message) = self.message.as_mut() else {
                    return Ok(None);
                };
                // Text is checked as it arrives; compressed text once
                // inflated.
                if !self.binary_message && !self.compressed {
                    message.check(frame.fin)?;
                }
                if !frame.fin {
                    return Ok(None);
                }
                let Some(mut message) = self.message.take() else {
                    return Ok(None);
                };
                if self.compressed {
                    let cap = self.inflate_cap as usize;
                    let inflated = inflate(&message.buf, cap).map_err(|e| match e {
                        InflateError::TooBig => FrameError::InflatedTooBig,
                        InflateError::Corrupt => FrameError::Corrupt,
                    })?;
                    message.buf = inflated;
                    if !self.binary_message {
                        message.check(true)?;
                    }
                }
                let binary = self.binary_message;
                let mut buf = message.buf;
                // Fragments may have left spare room; the message may live on
                // in history, so it should not carry that.
                buf.shrink_to_fit();
                let payload = Bytes::from(buf);
                Ok(Some(if binary {
                    Parsed::Binary(payload)
                } else {
                    Parsed::Text(payload)
                }))
            }
        }
    }

    /// Heap bytes held for payloads under way.
    #[cfg(any(test, fuzzing))]
    pub fn buffered_capacity(&self) -> usize {
        self.control.capacity() + self.message.as_ref().map_or(0, |m| m.buf.capacity())
    }

    /// Panics unless the state between two successful calls is one the
    /// module docs promise: nothing held between messages, a payload buffer
    /// never past the message's end nor more than `MAX_AHEAD` (or as much
    /// again) ahead of what arrived, no message over `max`. For the fuzz
    /// targets (`session::fuzzing`).
    #[cfg(any(test, fuzzing))]
    pub fn check_invariants(&self) {
        assert!(
            usize::from(self.head_len) < MAX_HEADER,
            "a whole header left unparsed"
        );
        let control = self.control.len();
        assert!(control <= MAX_CONTROL && self.control.capacity() <= MAX_CONTROL);
        if let Some(message) = &self.message {
            let (len, capacity) = (message.buf.len(), message.buf.capacity());
            assert!(message.valid <= len, "UTF-8 checked beyond the message");
            assert!(
                len <= self.max,
                "{len} bytes held, over the {} limit",
                self.max
            );
            assert!(capacity <= self.max, "room for {capacity}, over the limit");
            assert!(
                capacity <= len + len.min(MAX_AHEAD),
                "room for {capacity} with {len} bytes in"
            );
        }
        match &self.frame {
            Some(frame) if is_control(frame.opcode) => {
                assert_eq!(frame.got, control, "control bytes read and held differ");
                assert!(frame.got + frame.left <= MAX_CONTROL);
            }
            Some(frame) => {
                let Some(message) = &self.message else {
                    panic!("a data frame outside a message");
                };
                assert!(message.buf.len() + frame.left <= self.max);
            }
            // Between frames the control buffer was handed over (or never used).
            None => assert_eq!(self.control.capacity(), 0, "control buffer kept"),
        }
        if self.message.is_none() && self.frame.is_none() {
            assert_eq!(self.buffered_capacity(), 0, "memory held between messages");
        }
    }

    fn take_control(&mut self) -> Bytes {
        Bytes::from(std::mem::take(&mut self.control))
    }
}

impl Message {
    /// Checks the bytes not yet known valid; an incomplete character at the
    /// end is fine unless the message is `complete`.
    fn check(&mut self, complete: bool) -> Result<(), FrameError> {
        let unchecked = &self.buf[self.valid..];
        if simdutf8::basic::from_utf8(unchecked).is_ok() {
            self.valid = self.buf.len();
            return Ok(());
        }
        // Rare: find out whether the text is bad or only cut short.
        match simdutf8::compat::from_utf8(unchecked) {
            Ok(_) => {
                self.valid = self.buf.len();
                Ok(())
            }
            Err(e) if e.error_len().is_none() && !complete => {
                self.valid += e.valid_up_to();
                Ok(())
            }
            Err(_) => Err(FrameError::InvalidUtf8),
        }
    }
}

fn is_control(opcode: u8) -> bool {
    opcode & 0x8 != 0
}

/// RFC 6455 5.5.1 and 7.4: a close payload is empty or a code the wire
/// allows, then UTF-8 text.
fn check_close(payload: &[u8]) -> Result<(), FrameError> {
    match payload {
        [] => Ok(()),
        [_] => Err(FrameError::ShortClose),
        [hi, lo, reason @ ..] => {
            let code = u16::from_be_bytes([*hi, *lo]);
            if !close_code_allowed(code) {
                return Err(FrameError::CloseCode(code));
            }
            if simdutf8::basic::from_utf8(reason).is_err() {
                return Err(FrameError::CloseReasonUtf8);
            }
            Ok(())
        }
    }
}

/// Codes a peer may send (RFC 6455 7.4.1, 7.4.2). 1004, 1005, 1006 and 1015
/// are reserved or local-only; 1016-2999 are for future standards; 3000-4999
/// belong to libraries and applications.
fn close_code_allowed(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A masked client frame: `first` is FIN, RSV and opcode.
    pub(crate) fn masked(first: u8, payload: &[u8]) -> Vec<u8> {
        let mask = [0x37, 0xfa, 0x21, 0x3d];
        let mut out = vec![first];
        let len = payload.len();
        if len < 126 {
            out.push(MASKED | len as u8);
        } else if let Ok(len) = u16::try_from(len) {
            out.push(MASKED | 126);
            out.extend_from_slice(&len.to_be_bytes());
        } else {
            out.push(MASKED | 127);
            out.extend_from_slice(&(len as u64).to_be_bytes());
        }
        out.extend_from_slice(&mask);
        out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        out
    }

    /// Feeds `input` in chunks of `step` bytes; every event, then the error
    /// that stopped the parse, if any.
    fn parse_in(max: usize, input: &[u8], step: usize) -> (Vec<Parsed>, Option<FrameError>) {
        let mut parser = Parser::new(max);
        let mut events = Vec::new();
        let mut chunks = input.chunks(step);
        let mut carry: Vec<u8> = Vec::new();
        loop {
            let chunk: Vec<u8> = if carry.is_empty() {
                match chunks.next() {
                    Some(c) => c.to_vec(),
                    None => return (events, None),
                }
            } else {
                std::mem::take(&mut carry)
            };
            match parser.feed(&chunk) {
                Ok((used, parsed)) => {
                    if parsed.is_none() {
                        assert_eq!(used, chunk.len(), "all input used when nothing came out");
                    }
                    carry = chunk[used..].to_vec();
                    events.extend(parsed);
                }
                Err(reason) => return (events, Some(reason)),
            }
        }
    }

    /// The same bytes one at a time, all at once and in 7-byte chunks must
    /// give the same result; returns it.
    fn parse(max: usize, input: &[u8]) -> (Vec<Parsed>, Option<FrameError>) {
        let bytewise = parse_in(max, input, 1);
        assert_eq!(parse_in(max, input, input.len().max(1)), bytewise);
        assert_eq!(parse_in(max, input, 7), bytewise);
        bytewise
    }

    fn fails(max: usize, input: &[u8]) -> FrameError {
        match parse(max, input) {
            (_, Some(reason)) => reason,
            (events, None) => panic!("expected an error, got {events:?}"),
        }
    }

    fn text(s: &str) -> Parsed {
        Parsed::Text(Bytes::copy_from_slice(s.as_bytes()))
    }

    #[test]
    fn a_text_frame_of_each_length_form() {
        for len in [0usize, 1, 125, 126, 65535, 65536, 200_000] {
            let payload = "é".repeat(len / 2) + &"x".repeat(len % 2);
            let (events, error) = parse_in(1 << 20, &masked(FIN | OP_TEXT, payload.as_bytes()), 1);
            assert_eq!(error, None, "len {len}");
            assert_eq!(events, vec![text(&payload)], "len {len}");
        }
    }

    #[test]
    fn length_forms_on_the_wire() {
        // The second byte (without the mask bit) and the extended length.
        assert_eq!(masked(FIN | OP_TEXT, &[b'a'; 125])[1], MASKED | 125);
        assert_eq!(
            &masked(FIN | OP_TEXT, &[b'a'; 126])[1..4],
            &[MASKED | 126, 0, 126]
        );
        assert_eq!(
            &masked(FIN | OP_TEXT, &[b'a'; 65536])[1..10],
            &[MASKED | 127, 0, 0, 0, 0, 0, 1, 0, 0]
        );
    }

    #[test]
    fn several_frames_in_one_read() {
        let mut input = masked(FIN | OP_TEXT, b"one");
        input.extend(masked(FIN | OP_PING, b"p"));
        input.extend(masked(FIN | OP_TEXT, b""));
        input.extend(masked(FIN | OP_PONG, b""));
        input.extend(masked(FIN | OP_CLOSE, &[0x03, 0xe8, b'o', b'k']));
        assert_eq!(
            parse(64, &input),
            (
                vec![
                    text("one"),
                    Parsed::Ping(Bytes::from_static(b"p")),
                    text(""),
                    Parsed::Pong(Bytes::new()),
                    Parsed::Close(Bytes::from_static(&[0x03, 0xe8, b'o', b'k'])),
                ],
                None
            )
        );
    }

    #[test]
    fn fragments_are_reassembled_around_control_frames() {
        let mut input = masked(OP_TEXT, b"{\"op\"");
        input.extend(masked(FIN | OP_PING, b"mid"));
        input.extend(masked(OP_CONTINUATION, b""));
        input.extend(masked(OP_CONTINUATION, b":\"hel"));
        input.extend(masked(FIN | OP_PONG, b"x"));
        input.extend(masked(FIN | OP_CONTINUATION, b"lo\"}"));
        assert_eq!(
            parse(64, &input),
            (
                vec![
                    Parsed::Ping(Bytes::from_static(b"mid")),
                    Parsed::Pong(Bytes::from_static(b"x")),
                    text("{\"op\":\"hello\"}"),
                ],
                None
            )
        );
    }

    #[test]
    fn a_character_may_straddle_fragments() {
        let euro = "€".as_bytes();
        let mut input = masked(OP_TEXT, &euro[..1]);
        input.extend(masked(OP_CONTINUATION, &euro[1..2]));
        input.extend(masked(FIN | OP_CONTINUATION, &euro[2..]));
        assert_eq!(parse(64, &input), (vec![text("€")], None));
    }

    #[test]
    fn a_message_cut_inside_a_character_is_invalid() {
        let euro = "€".as_bytes();
        let mut input = masked(OP_TEXT, &euro[..1]);
        input.extend(masked(FIN | OP_CONTINUATION, &euro[1..2]));
        assert_eq!(fails(64, &input), FrameError::InvalidUtf8);
        assert_eq!(
            fails(64, &masked(FIN | OP_TEXT, &euro[..2])),
            FrameError::InvalidUtf8
        );
    }

    #[test]
    fn bad_utf8_is_refused_in_the_fragment_that_has_it() {
        assert_eq!(
            fails(64, &masked(FIN | OP_TEXT, &[0xff, 0xfe])),
            FrameError::InvalidUtf8
        );
        let mut input = masked(OP_TEXT, b"ok");
        input.extend(masked(OP_CONTINUATION, b"\"h\xff"));
        // No final fragment: the error comes as the bad one arrives.
        assert_eq!(parse(64, &input), (vec![], Some(FrameError::InvalidUtf8)));
    }

    #[test]
    fn reserved_bits_unknown_opcodes_and_unmasked_frames_are_protocol_errors() {
        for rsv in [0x40, 0x20, 0x10] {
            assert_eq!(
                fails(64, &masked(FIN | rsv | OP_TEXT, b"x")),
                FrameError::ReservedBits
            );
        }
        for opcode in [0x3, 0x4, 0x5, 0x6, 0x7, 0xB, 0xC, 0xD, 0xE, 0xF] {
            assert_eq!(
                fails(64, &masked(FIN | opcode, b"")),
                FrameError::ReservedOpcode(opcode)
            );
        }
        let mut unmasked = masked(FIN | OP_TEXT, b"hi");
        unmasked[1] &= !MASKED;
        // Refused from the first two bytes, before the rest arrives.
        assert_eq!(fails(64, &unmasked[..2]), FrameError::Unmasked);
    }

    #[test]
    fn control_frames_are_final_and_short() {
        for opcode in [OP_PING, OP_PONG, OP_CLOSE] {
            assert_eq!(
                fails(300, &masked(opcode, b"")),
                FrameError::FragmentedControl
            );
            assert_eq!(
                fails(300, &masked(FIN | opcode, &[b'a'; 126])[..2]),
                FrameError::LongControl
            );
        }
        let (events, error) = parse(300, &masked(FIN | OP_PING, &[b'a'; 125]));
        assert_eq!((events.len(), error), (1, None));
    }

    #[test]
    fn a_64_bit_length_with_the_top_bit_is_a_protocol_error() {
        let mut input = vec![FIN | OP_TEXT, MASKED | 127];
        input.extend_from_slice(&(1u64 << 63).to_be_bytes());
        input.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(fails(64, &input), FrameError::LengthTopBit);
    }

    #[test]
    fn size_is_refused_from_the_header() {
        // At the limit is fine; one byte over is refused with the header
        // alone, payload unsent.
        assert_eq!(parse(10, &masked(FIN | OP_TEXT, b"0123456789")).1, None);
        let over = masked(FIN | OP_TEXT, b"0123456789a");
        assert_eq!(fails(10, &over[..6]), FrameError::TooBig);
        let mut huge = vec![FIN | OP_TEXT, MASKED | 127];
        huge.extend_from_slice(&(u64::MAX >> 1).to_be_bytes());
        huge.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(fails(10, &huge), FrameError::TooBig);
        // A binary frame over the limit is too big before it is binary.
        let binary = masked(FIN | OP_BINARY, b"0123456789a");
        assert_eq!(fails(10, &binary[..6]), FrameError::TooBig);
        // Control frames are bounded by 125 bytes, not by the message limit.
        assert_eq!(parse(10, &masked(FIN | OP_PING, &[b'p'; 125])).1, None);
    }

    #[test]
    fn a_reassembled_message_over_the_limit_is_refused_from_the_header() {
        let mut input = masked(OP_TEXT, b"01234");
        input.extend(masked(OP_CONTINUATION, b"56789"));
        let over = masked(FIN | OP_CONTINUATION, b"a");
        input.extend_from_slice(&over[..6]);
        assert_eq!(fails(10, &input), FrameError::TooBig);
    }

    #[test]
    fn fragments_out_of_order_are_protocol_errors() {
        assert_eq!(
            fails(64, &masked(FIN | OP_CONTINUATION, b"x")),
            FrameError::StrayContinuation
        );
        let mut input = masked(OP_TEXT, b"a");
        input.extend(masked(FIN | OP_TEXT, b"b"));
        assert_eq!(fails(64, &input), FrameError::Interleaved);
        let mut input = masked(OP_TEXT, b"a");
        input.extend(masked(FIN | OP_BINARY, b"b"));
        assert_eq!(fails(64, &input), FrameError::Interleaved);
        // A finished message leaves nothing to continue.
        let mut input = masked(FIN | OP_TEXT, b"a");
        input.extend(masked(FIN | OP_CONTINUATION, b"b"));
        assert_eq!(
            parse(64, &input),
            (vec![text("a")], Some(FrameError::StrayContinuation))
        );
    }

    #[test]
    fn binary_is_unsupported_data() {
        assert_eq!(
            fails(64, &masked(FIN | OP_BINARY, b"{}")),
            FrameError::Binary
        );
        assert_eq!(fails(64, &masked(OP_BINARY, b"{")), FrameError::Binary);
    }

    #[test]
    fn close_frames_are_checked() {
        let close = |payload: &[u8]| parse(200, &masked(FIN | OP_CLOSE, payload));
        assert_eq!(close(&[]), (vec![Parsed::Close(Bytes::new())], None));
        assert_eq!(close(&[0x03]).1, Some(FrameError::ShortClose));
        for code in [
            0u16,
            999,
            1004,
            1005,
            1006,
            1015,
            1016,
            2000,
            2999,
            5000,
            u16::MAX,
        ] {
            assert_eq!(
                close(&code.to_be_bytes()).1,
                Some(FrameError::CloseCode(code)),
                "{code}"
            );
        }
        for code in [
            1000u16, 1001, 1002, 1003, 1007, 1008, 1011, 1014, 3000, 4000, 4999,
        ] {
            let mut payload = code.to_be_bytes().to_vec();
            payload.extend_from_slice("bye €".as_bytes());
            assert_eq!(
                close(&payload),
                (vec![Parsed::Close(Bytes::from(payload.clone()))], None),
                "{code}"
            );
        }
        assert_eq!(
            close(&[0x03, 0xe8, 0xff]).1,
            Some(FrameError::CloseReasonUtf8)
        );
    }

    /// Feeds `input` whole; it must complete nothing.
    fn feed_part(parser: &mut Parser, input: &[u8]) {
        let fed = parser.feed(input).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(fed, (input.len(), None));
    }

    #[test]
    fn a_header_is_not_a_promise() {
        // A header declaring 60,000 bytes, then 10 of them: the parser holds
        // the 10, not room for the 60,000.
        let declared = masked(FIN | OP_TEXT, &[b'x'; 60_000]);
        let mut parser = Parser::new(1 << 20);
        feed_part(&mut parser, &declared[..8 + 10]);
        assert_eq!(parser.payload_received(), 10);
        let held = parser.buffered_capacity();
        println!("a header declaring 60,000 bytes and 10 bytes: {held} bytes held");
        assert!(held < 100, "{held} bytes held for 10 received");

        // The same for a fragment that continues a message,
        let mut parser = Parser::new(1 << 20);
        feed_part(&mut parser, &masked(OP_TEXT, b"0123456789"));
        let declared = masked(FIN | OP_CONTINUATION, &[b'x'; 60_000]);
        feed_part(&mut parser, &declared[..8 + 10]);
        assert!(parser.buffered_capacity() < 100);
        // and for a control frame.
        let mut parser = Parser::new(1 << 20);
        feed_part(&mut parser, &masked(FIN | OP_PING, &[b'p'; 125])[..6 + 1]);
        assert!(parser.buffered_capacity() < 10);
    }

    #[test]
    fn a_payload_buffer_grows_with_what_arrives() {
        for len in [70_000, 300_000] {
            let payload: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
            let wire = masked(FIN | OP_TEXT, &payload);
            let mut parser = Parser::new(1 << 20);
            let mut capacities = std::collections::BTreeSet::new();
            let (last, head) = wire.split_last().unwrap_or_else(|| unreachable!());
            for byte in head {
                feed_part(&mut parser, std::slice::from_ref(byte));
                let (received, held) = (parser.payload_received(), parser.buffered_capacity());
                // Amortised: at most as much again as has arrived, at most
                // MAX_AHEAD beyond it, never past the frame.
                assert!(held >= received && held - received <= received.min(MAX_AHEAD));
                assert!(held <= len, "{held} for a {len}-byte frame");
                capacities.insert(held);
            }
            assert!(capacities.len() < 40, "{} reallocations", capacities.len());
            let (_, parsed) = parser
                .feed(std::slice::from_ref(last))
                .unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(parsed, Some(Parsed::Text(Bytes::from(payload))));
        }
    }

    #[test]
    fn many_small_fragments_grow_the_message_amortised() {
        let mut parser = Parser::new(1 << 20);
        let mut capacities = std::collections::BTreeSet::new();
        feed_part(&mut parser, &masked(OP_TEXT, b"a"));
        for _ in 0..20_000 {
            feed_part(&mut parser, &masked(OP_CONTINUATION, b"b"));
            capacities.insert(parser.buffered_capacity());
        }
        assert!(capacities.len() < 40, "{} reallocations", capacities.len());
        let (_, parsed) = parser
            .feed(&masked(FIN | OP_CONTINUATION, b"c"))
            .unwrap_or_else(|e| panic!("{e:?}"));
        let whole = format!("a{}c", "b".repeat(20_000));
        assert_eq!(parsed, Some(text(&whole)));
    }

    #[test]
    fn a_message_is_under_way_from_its_first_byte_to_its_last() {
        let mut parser = Parser::new(64);
        assert!(!parser.in_message());
        // A control frame is no message, even half-read.
        feed_part(&mut parser, &masked(FIN | OP_PING, b"p")[..1]);
        assert!(!parser.in_message());
        let mut input = masked(FIN | OP_PING, b"p")[1..].to_vec();
        input.extend(masked(OP_TEXT, b"ab"));
        assert!(matches!(
            parser.feed(&input),
            Ok((6, Some(Parsed::Ping(_))))
        ));
        // The first byte of a data frame starts one,
        feed_part(&mut parser, &input[6..7]);
        assert!(parser.in_message());
        feed_part(&mut parser, &input[7..]);
        // a control frame between fragments leaves it under way,
        let ping = masked(FIN | OP_PING, b"");
        assert!(matches!(parser.feed(&ping), Ok((6, Some(Parsed::Ping(_))))));
        assert!(parser.in_message());
        // and its last fragment ends it.
        let last = masked(FIN | OP_CONTINUATION, b"c");
        assert_eq!(parser.feed(&last), Ok((last.len(), Some(text("abc")))));
        assert!(!parser.in_message());
    }

    #[test]
    fn nothing_is_held_between_messages() {
        let mut parser = Parser::new(1 << 20);
        let mut input = masked(OP_TEXT, &[b'a'; 70_000]);
        input.extend(masked(FIN | OP_PING, b"p"));
        input.extend(masked(FIN | OP_CONTINUATION, b"b"));
        let mut used = 0;
        let mut events = 0;
        while used < input.len() {
            let (n, parsed) = parser
                .feed(&input[used..])
                .unwrap_or_else(|e| panic!("{e:?}"));
            used += n;
            events += usize::from(parsed.is_some());
        }
        assert_eq!(events, 2);
        assert!(parser.message.is_none() && parser.frame.is_none());
        assert_eq!(parser.control.capacity(), 0);
    }

    // permessage-deflate.

    const RSV1_BIT: u8 = 0x40;

    /// `data` as a client compresses it: raw deflate, sync flush, tail off.
    pub(crate) fn compressed(data: &[u8]) -> Vec<u8> {
        let mut c = flate2::Compress::new(flate2::Compression::default(), false);
        let mut out = Vec::with_capacity(data.len() + 1024);
        let mut input = data;
        loop {
            let before = c.total_in();
            c.compress_vec(input, &mut out, flate2::FlushCompress::Sync)
                .unwrap_or_else(|e| panic!("{e}"));
            input = &input[(c.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            out.reserve(out.capacity());
        }
        out.truncate(out.len() - 4);
        out
    }

    fn parse_with(parser: impl Fn() -> Parser, input: &[u8]) -> (Vec<Parsed>, Option<FrameError>) {
        let mut results = Vec::new();
        for step in [1, 7, input.len().max(1)] {
            let mut p = parser();
            let mut events = Vec::new();
            let mut used = 0;
            let mut error = None;
            while used < input.len() {
                let end = (used + step).min(input.len());
                match p.feed(&input[used..end]) {
                    Ok((n, parsed)) => {
                        used += n;
                        events.extend(parsed);
                        p.check_invariants();
                    }
                    Err(e) => {
                        error = Some(e);
                        break;
                    }
                }
            }
            results.push((events, error));
        }
        assert!(results.windows(2).all(|w| w[0] == w[1]), "{results:?}");
        results.remove(0)
    }

    #[test]
    fn compressed_messages_whole_and_fragmented_inflate() {
        let message = "{\"op\":\"pub\",\"data\":\"".to_owned() + &"abc".repeat(500) + "\"}";
        let wire = compressed(message.as_bytes());
        let inflating = || Parser::new(1 << 16).inflating(1 << 16);
        // One frame.
        let input = masked(FIN | RSV1_BIT | OP_TEXT, &wire);
        assert_eq!(parse_with(inflating, &input), (vec![text(&message)], None));
        // Fragments, RSV1 on the first only, a ping between them.
        let (a, rest) = wire.split_at(wire.len() / 3);
        let (b, c) = rest.split_at(rest.len() / 2);
        let mut input = masked(RSV1_BIT | OP_TEXT, a);
        input.extend(masked(OP_CONTINUATION, b));
        input.extend(masked(FIN | OP_PING, b"p"));
        input.extend(masked(FIN | OP_CONTINUATION, c));
        // Then an uncompressed message on the same connection.
        input.extend(masked(FIN | OP_TEXT, b"plain"));
        assert_eq!(
            parse_with(inflating, &input),
            (
                vec![
                    Parsed::Ping(Bytes::from_static(b"p")),
                    text(&message),
                    text("plain")
                ],
                None
            )
        );
        // Binary, where the parser takes it, keeps its opcode.
        let binary = || Parser::new(1 << 16).inflating(1 << 16).binary();
        let input = masked(FIN | RSV1_BIT | OP_BINARY, &compressed(&[0xff; 3000]));
        assert_eq!(
            parse_with(binary, &input),
            (vec![Parsed::Binary(Bytes::from(vec![0xff; 3000]))], None)
        );
    }

    #[test]
    fn rsv1_only_on_a_first_frame_and_only_where_negotiated() {
        let wire = compressed(b"hello");
        let inflating = || Parser::new(1 << 16).inflating(1 << 16);
        // Not negotiated.
        let input = masked(FIN | RSV1_BIT | OP_TEXT, &wire);
        assert_eq!(fails(64, &input), FrameError::ReservedBits);
        // On a continuation.
        let mut input = masked(OP_TEXT, b"a");
        input.extend(masked(FIN | RSV1_BIT | OP_CONTINUATION, &wire));
        assert_eq!(
            parse_with(inflating, &input).1,
            Some(FrameError::ReservedBits)
        );
        // On control frames.
        for opcode in [OP_PING, OP_PONG, OP_CLOSE] {
            let input = masked(FIN | RSV1_BIT | opcode, b"");
            assert_eq!(
                parse_with(inflating, &input).1,
                Some(FrameError::ReservedBits)
            );
        }
        // RSV2 and RSV3 never.
        for rsv in [0x20, 0x10, 0x60] {
            let input = masked(FIN | rsv | OP_TEXT, &wire);
            assert_eq!(
                parse_with(inflating, &input).1,
                Some(FrameError::ReservedBits)
            );
        }
        // Not deflate data, or not UTF-8 once inflated.
        let input = masked(FIN | RSV1_BIT | OP_TEXT, &[0xff; 8]);
        assert_eq!(parse_with(inflating, &input).1, Some(FrameError::Corrupt));
        let input = masked(FIN | RSV1_BIT | OP_TEXT, &compressed(&[0xc3, 0x28]));
        assert_eq!(
            parse_with(inflating, &input).1,
            Some(FrameError::InvalidUtf8)
        );
        assert_eq!(
            FrameError::Corrupt.close_reason(),
            CloseReason::ProtocolError
        );
        assert_eq!(
            FrameError::InflatedTooBig.close_reason(),
            CloseReason::MessageTooBig
        );
    }

    #[test]
    fn bombs_stop_at_the_cap() {
        const CAP: usize = 64 * 1024;
        let inflating = || Parser::new(CAP).inflating(CAP);
        // One frame: 16 MiB of zeros in about 16 KiB.
        let bomb = compressed(&vec![0u8; 16 << 20]);
        assert!(bomb.len() < CAP);
        let input = masked(FIN | RSV1_BIT | OP_TEXT, &bomb);
        assert_eq!(
            parse_with(inflating, &input).1,
            Some(FrameError::InflatedTooBig)
        );
        // Fragmented, in many small frames.
        let mut input = Vec::new();
        let chunks: Vec<&[u8]> = bomb.chunks(100).collect();
        for (i, chunk) in chunks.iter().enumerate() {
            let first = if i == 0 {
                RSV1_BIT | OP_TEXT
            } else {
                OP_CONTINUATION
            };
            let fin = if i == chunks.len() - 1 { FIN } else { 0 };
            input.extend(masked(fin | first, chunk));
        }
        assert_eq!(
            parse_with(inflating, &input).1,
            Some(FrameError::InflatedTooBig)
        );
        // Many small messages, each under the cap, each inflated alone:
        // all come out, none holds more than its own.
        let small = compressed(&vec![b'a'; CAP]);
        let mut input = Vec::new();
        for _ in 0..50 {
            input.extend(masked(FIN | RSV1_BIT | OP_TEXT, &small));
        }
        let (events, error) = parse_with(inflating, &input);
        assert_eq!((events.len(), error), (50, None));
        // One byte more than the cap in each: the first one closes.
        let over = compressed(&vec![b'a'; CAP + 1]);
        let mut input = masked(FIN | RSV1_BIT | OP_TEXT, &over);
        input.extend(masked(FIN | RSV1_BIT | OP_TEXT, &over));
        assert_eq!(
            parse_with(inflating, &input),
            (vec![], Some(FrameError::InflatedTooBig))
        );
    }

    // permessage-deflate, as properties: what clients and the server send,
    // at every window size.

    /// `data` as a client compresses a message with a window of
    /// `window_bits` (its `client_max_window_bits`) at `level`: raw deflate,
    /// a sync flush, its tail removed.
    fn client_compressed(data: &[u8], window_bits: u8, level: u32) -> Vec<u8> {
        let level = flate2::Compression::new(level);
        let mut c = flate2::Compress::new_with_window_bits(level, false, window_bits);
        let mut out = Vec::with_capacity(data.len() + 64);
        let mut input = data;
        loop {
            let before = c.total_in();
            c.compress_vec(input, &mut out, flate2::FlushCompress::Sync)
                .unwrap_or_else(|e| panic!("{e}"));
            input = &input[(c.total_in() - before) as usize..];
            if input.is_empty() && out.len() < out.capacity() {
                break;
            }
            out.reserve(out.capacity().max(64));
        }
        assert!(out.ends_with(&crate::deflate::TAIL));
        out.truncate(out.len() - 4);
        out
    }

    /// A bomb of each kind, compressed with each window a client may use:
    /// one frame, one message in many small frames, many small messages
    /// (each within the cap, then one past it). Each closes with 1009 at
    /// the message that passes the cap, having cost at most the cap's worth
    /// of inflating (by a byte: how a message that passes the cap is told
    /// from one that reaches it) and the message limit's worth of buffer.
    #[test]
    fn a_bomb_of_each_kind_costs_at_most_the_cap() {
        const CAP: usize = 64 * 1024;
        let zeros = vec![0u8; 8 << 20];
        for window_bits in crate::deflate::MIN_WINDOW_BITS..=crate::deflate::MAX_WINDOW_BITS {
            let bomb = client_compressed(&zeros, window_bits, 9);
            assert!(bomb.len() < CAP / 4, "{window_bits}: {}", bomb.len());
            let one_frame = masked(FIN | RSV1 | OP_TEXT, &bomb);
            let mut small_frames = Vec::new();
            let chunks: Vec<&[u8]> = bomb.chunks(7).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                let first = if i == 0 {
                    RSV1 | OP_TEXT
                } else {
                    OP_CONTINUATION
                };
                let fin = if i + 1 == chunks.len() { FIN } else { 0 };
                small_frames.extend(masked(fin | first, chunk));
            }
            let mut small_messages = Vec::new();
            let full = client_compressed(&zeros[..CAP], window_bits, 9);
            for _ in 0..64 {
                small_messages.extend(masked(FIN | RSV1 | OP_TEXT, &full));
            }
            let over = client_compressed(&zeros[..CAP + 1], window_bits, 9);
            small_messages.extend(masked(FIN | RSV1 | OP_TEXT, &over));
            for (kind, wire, messages) in [
                ("one frame", &one_frame, 0),
                ("small frames", &small_frames, 0),
                ("small messages", &small_messages, 64),
            ] {
                let mut parser = Parser::new(CAP).inflating(CAP);
                let (mut used, mut events) = (0, 0);
                let error = loop {
                    let end = (used + 1000).min(wire.len());
                    let result = parser.feed(&wire[used..end]);
                    let (_, inflated) = crate::deflate::inflate::last_work();
                    assert!(
                        inflated <= CAP as u64 + 1,
                        "{kind}, {window_bits}: {inflated}"
                    );
                    assert!(parser.buffered_capacity() <= CAP, "{kind}, {window_bits}");
                    match result {
                        Ok((n, parsed)) => {
                            used += n;
                            events += usize::from(parsed.is_some());
                        }
                        Err(e) => break e,
                    }
                    assert!(used < wire.len(), "{kind}, {window_bits}: no error");
                };
                assert_eq!(
                    (events, error, error.close_reason()),
                    (
                        messages,
                        FrameError::InflatedTooBig,
                        CloseReason::MessageTooBig
                    ),
                    "{kind}, {window_bits}"
                );
            }
        }
    }

    /// `payload` as a client sends it: cut where `cuts` say (a fraction of
    /// it each, sorted), RSV1 on the first frame only where `compressed`, a
    /// ping after the first frame where `ping`.
    fn client_message(
        opcode: u8,
        payload: &[u8],
        compressed: bool,
        cuts: &[prop::sample::Index],
        ping: bool,
    ) -> Vec<u8> {
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(payload.len() + 1)).collect();
        at.sort_unstable();
        at.push(payload.len());
        let mut wire = Vec::new();
        let mut start = 0;
        for (i, &end) in at.iter().enumerate() {
            let mut first = if i == 0 { opcode } else { OP_CONTINUATION };
            if i == 0 && compressed {
                first |= RSV1;
            }
            if i + 1 == at.len() {
                first |= FIN;
            }
            wire.extend(masked(first, &payload[start..end]));
            if i == 0 && ping {
                wire.extend(masked(FIN | OP_PING, b"p"));
            }
            start = end;
        }
        wire
    }

    /// A message's data: JSON-like text that compresses, or any bytes.
    fn message_data() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            "[a-z{}\":,0-9 ]{0,3000}".prop_map(String::into_bytes),
            proptest::collection::vec(any::<u8>(), 0..1500),
            (1usize..20_000).prop_map(|n| b"{\"n\":1}".repeat(n / 7)),
        ]
    }

    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]

        /// Messages compressed by a client with any window (9 to 15 bits)
        /// and level, or not compressed, text or binary, cut into fragments
        /// anywhere (RSV1 on the first only), a ping between two: each
        /// comes out as it was sent, in any reads.
        #[test]
        fn compressed_and_fragmented_messages_round_trip(
            messages in proptest::collection::vec((
                any::<bool>(),
                any::<bool>(),
                message_data(),
                crate::deflate::MIN_WINDOW_BITS..=crate::deflate::MAX_WINDOW_BITS,
                1u32..=9,
                proptest::collection::vec(any::<prop::sample::Index>(), 0..4),
                any::<bool>(),
            ), 1..5),
        ) {
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            for (compressed, binary, data, window_bits, level, cuts, ping) in messages {
                let data = if binary {
                    data
                } else {
                    String::from_utf8_lossy(&data).into_owned().into_bytes()
                };
                let payload = if compressed {
                    client_compressed(&data, window_bits, level)
                } else {
                    data.clone()
                };
                let opcode = if binary { OP_BINARY } else { OP_TEXT };
                wire.extend(client_message(opcode, &payload, compressed, &cuts, ping));
                if ping && !cuts.is_empty() {
                    expected.push(Parsed::Ping(Bytes::from_static(b"p")));
                }
                let data = Bytes::from(data);
                expected.push(if binary { Parsed::Binary(data) } else { Parsed::Text(data) });
                if ping && cuts.is_empty() {
                    expected.push(Parsed::Ping(Bytes::from_static(b"p")));
                }
            }
            let parser = || Parser::new(1 << 20).inflating(1 << 20).binary();
            prop_assert_eq!(parse_with(parser, &wire), (expected, None));
        }

        /// RSV1 on any frame but a message's first (a continuation, a
        /// control frame) is refused (1002) at that frame: what came before
        /// it still comes out. So is RSV1 where nothing was negotiated.
        #[test]
        fn rsv1_only_on_a_messages_first_frame(
            words in "[a-z]{0,300}",
            window_bits in crate::deflate::MIN_WINDOW_BITS..=crate::deflate::MAX_WINDOW_BITS,
            fragments in 2usize..5,
            bad in any::<prop::sample::Index>(),
            control in prop::sample::select(vec![OP_PING, OP_PONG, OP_CLOSE]),
        ) {
            let payload = client_compressed(words.as_bytes(), window_bits, 6);
            let good = masked(FIN | RSV1 | OP_TEXT, &payload);
            let inflating = || Parser::new(1 << 16).inflating(1 << 16);
            // A continuation with RSV1, compressed message or not.
            let bad = 1 + bad.index(fragments - 1);
            for compressed in [true, false] {
                let mut wire = good.clone();
                let body = if compressed { &payload[..] } else { words.as_bytes() };
                let mut chunks: Vec<&[u8]> = body.chunks(body.len().div_ceil(fragments).max(1)).collect();
                chunks.resize(fragments, &[]);
                for (i, chunk) in chunks.iter().enumerate() {
                    let mut first = if i == 0 { OP_TEXT } else { OP_CONTINUATION };
                    if (i == 0 && compressed) || i == bad {
                        first |= RSV1;
                    }
                    if i + 1 == fragments {
                        first |= FIN;
                    }
                    wire.extend(masked(first, chunk));
                }
                prop_assert_eq!(
                    parse_with(inflating, &wire),
                    (vec![text(&words)], Some(FrameError::ReservedBits))
                );
            }
            // A control frame with RSV1.
            let mut wire = good.clone();
            wire.extend(masked(FIN | RSV1 | control, b""));
            prop_assert_eq!(
                parse_with(inflating, &wire),
                (vec![text(&words)], Some(FrameError::ReservedBits))
            );
            // Not negotiated: the compressed message itself.
            prop_assert_eq!(parse(1 << 16, &good), (vec![], Some(FrameError::ReservedBits)));
        }

        /// What the server sends under any deflate format (window 9 to 15
        /// bits, any level and threshold; JSON or protobuf), read by a
        /// client's rules (here the parser's, masked as a client's would
        /// be): one frame, RSV1 exactly when it is compressed, the data
        /// back; and what a client that asked for that window inflates with
        /// that window. Control frames never carry RSV1 (the parser would
        /// refuse it).
        #[test]
        fn server_frames_read_back_in_every_format(
            data in message_data(),
            window_bits in crate::deflate::MIN_WINDOW_BITS..=crate::deflate::MAX_WINDOW_BITS,
            level in 1u8..=9,
            min_bytes in prop::sample::select(vec![0u32, 1, 64, 256, 4096]),
            binary in any::<bool>(),
        ) {
            let deflate = crate::deflate::Deflate { window_bits, level, min_bytes };
            // Binary frames are the protobuf subprotocol's.
            let format = if binary {
                crate::frame::Format::Protobuf(Some(deflate))
            } else {
                crate::frame::Format::WebSocketDeflate(deflate)
            };
            let data = if binary { data } else { String::from_utf8_lossy(&data).into_owned().into_bytes() };
            let opcode = if binary { OP_BINARY } else { OP_TEXT };
            let frame = crate::frame::encode_as(format, opcode, &[&data]);
            let (first, payload) = server_frame(&frame);
            prop_assert_eq!(first & !RSV1, FIN | opcode);
            let compressed = first & RSV1 != 0;
            prop_assert_eq!(compressed, deflate.compress(&[&data], 0).is_some());
            if compressed {
                // A client with the window it asked for.
                let mut d = flate2::Decompress::new_with_window_bits(false, window_bits);
                let mut input = payload.to_vec();
                input.extend_from_slice(&crate::deflate::TAIL);
                let mut out = Vec::with_capacity(data.len() + 64);
                let status = d.decompress_vec(&input, &mut out, flate2::FlushDecompress::Sync);
                prop_assert!(status.is_ok(), "{:?}", status);
                prop_assert_eq!(&out, &data);
            }
            let wire = masked(first, payload);
            let parser = || Parser::new(1 << 20).inflating(1 << 20).binary();
            let data = Bytes::from(data);
            let expected = if binary { Parsed::Binary(data.clone()) } else { Parsed::Text(data.clone()) };
            prop_assert_eq!(parse_with(parser, &wire), (vec![expected], None));
            // A message of the protocol, in the format's own form.
            let reason = String::from_utf8_lossy(&data);
            let message = proto::ServerMessage::Reconnect { after_ms: 1, reason: &reason };
            let (first, payload) = {
                let frame = crate::frame::message(format, &message);
                let (first, payload) = server_frame(&frame);
                (first, masked(first, payload))
            };
            let expected = if binary {
                Parsed::Binary(Bytes::from(prost::Message::encode_to_vec(&message.to_proto())))
            } else {
                Parsed::Text(Bytes::from(message.to_json()))
            };
            prop_assert_eq!(first & !RSV1, FIN | opcode);
            prop_assert_eq!(parse_with(parser, &payload), (vec![expected], None));
            for control in [
                crate::frame::close(1000, "bye"),
                crate::frame::encode(OP_PING, &[b"p"]),
                crate::frame::encode(OP_PONG, &[b""]),
            ] {
                let (first, payload) = server_frame(&control);
                prop_assert_eq!(first & RSV, 0);
                prop_assert_eq!(parse_with(parser, &masked(first, payload)).1, None);
            }
        }
    }

    /// A server frame's first byte and payload (unmasked, one frame).
    fn server_frame(frame: &[u8]) -> (u8, &[u8]) {
        assert_eq!(frame[1] & MASKED, 0, "a server frame is not masked");
        let (len, at) = match frame[1] {
            126 => (usize::from(u16::from_be_bytes([frame[2], frame[3]])), 4),
            127 => {
                let mut len = [0; 8];
                len.copy_from_slice(&frame[2..10]);
                (u64::from_be_bytes(len) as usize, 10)
            }
            n => (usize::from(n), 2),
        };
        assert_eq!(frame.len(), at + len, "one frame");
        (frame[0], &frame[at..])
    }
}
