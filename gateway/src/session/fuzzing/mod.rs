//! What the fuzz targets in `gateway/fuzz/` check, kept here so that the
//! checked-in seed corpus replays through the very same checks in a plain
//! `cargo test` (the tests below), and so that the targets need nothing of the
//! session made public: this module exists only in tests and under
//! `cfg(fuzzing)`, which cargo-fuzz sets.
//!
//! - [`frames`]: arbitrary bytes as a client's stream. The parser must give
//!   the same messages and the same error however the bytes are cut into
//!   reads, keep its memory promises after every read, yield only what a
//!   server may accept (UTF-8 text within the limit, valid closes), and
//!   parse its own output, re-encoded and re-fragmented, back to the same.
//!   The socket reader over the same stream must agree with it.
//! - [`frame_script`]: the same checks on a stream built from a list of
//!   frames (any header bits, any length form, payloads of up to 128 KiB
//!   made from a few input bytes), which reaches the large-payload paths raw bytes
//!   seldom do, and against a model: the messages and error the RFC's rules,
//!   applied to the frames as written, predict. The scripts, and that model, are
//!   in [`script`].
//! - [`compressed`]: a stream under permessage-deflate (RSV1 allowed on a
//!   message's first frame, binary taken): the same outcome whatever the
//!   reads, nothing inflated past the cap, and its messages, compressed
//!   again and cut into fragments, parse back to the same.
//! - [`compressed_script`]: a client's messages, compressed as clients do
//!   (every `client_max_window_bits`, every way to end a message, with and
//!   without context takeover), cut into fragments with pings between, against a
//!   model: the same messages out, or the error the model predicts (1009 past
//!   the limit or the cap, 1002 for what does not inflate, 1007 for text that
//!   is not UTF-8), and no message inflated past the cap.
//! - [`inflate`]: one compressed message inflated under a cap, against a plain
//!   uncapped inflate: the same data, too big exactly when that passes the
//!   cap, and no more work or memory than the cap's worth.
//! - [`proto_command`]: a binary message of the `herald.v1.protobuf`
//!   subprotocol as a command: decoded or `malformed`, read into the JSON
//!   form's command (the same one the JSON form gives for the same fields,
//!   its `data` borrowed from the message) or an `err` valid in both forms.
//! - [`decoders`]: a client's text as a command, and the backend API's bodies
//!   (HTTP JSON, the gRPC request's protobuf): no panic, a command's
//!   protobuf form survives a round trip, what a subscriber would receive
//!   (`msg`) and what the client is told (`err`) is valid JSON.

mod compressed;
mod compressed_script;
mod proto_command;
mod script;

pub use compressed::{compressed, inflate};
pub use compressed_script::compressed_script;
pub use proto_command::proto_command;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use prost::Message as _;
use proto::json::{DisconnectRequest, PublishRequest};
use proto::{Command, CommandError, ServerMessage, v1};
use router::Topic;
use serde_json::Value;
use tokio::io::{AsyncRead, ReadBuf};

use super::parser::{FrameError, Parsed, Parser};
use super::reader::Reader;
use crate::config::{Limits, Overflow};
use crate::disconnect::CloseReason;
use crate::frame;
use crate::outbound::Outbound;
use crate::publish::JsonData;
use script::{Form, Script, ScriptFrame, client_frame};

/// The message size limits a stream is parsed under, picked by its first
/// byte: the edges of each length form, and the default.
const MAXES: [usize; 8] = [0, 1, 16, 125, 126, 1000, 65_536, 1 << 20];
/// The largest read of a chunking, picked by its first byte too.
const READS: [usize; 8] = [1, 2, 3, 7, 64, 1000, 8192, usize::MAX];
/// Above this many bytes a stream is not also fed one byte at a time, and no
/// read is shorter than [`MIN_READ_LARGE`]: a fuzz run's time is better spent
/// elsewhere.
const BYTEWISE_MAX: usize = 16 * 1024;
const MIN_READ_LARGE: usize = 1000;

const FIN: u8 = 0x80;
const OP_CONTINUATION: u8 = 0x0;
const OP_TEXT: u8 = 0x1;
const OP_CLOSE: u8 = 0x8;
const OP_PING: u8 = 0x9;
const OP_PONG: u8 = 0xA;

/// The messages a stream gave, then the error that ended it, if one did.
type Outcome = (Vec<Parsed>, Option<FrameError>);

/// Checks `data` as a client's stream: its first byte picks the message
/// limit and the largest read, its second seeds the read sizes; the rest is
/// the stream.
pub fn frames(data: &[u8]) {
    let (setup, wire) = match data {
        [pick, seed, wire @ ..] => (Setup::new(*pick, *seed, wire.len()), wire),
        _ => return,
    };
    check_stream(&setup, wire, None);
}

/// Checks the stream a script describes (see [`Script`]) against the model.
pub fn frame_script(data: &[u8]) {
    let (pick, seed, script) = match data {
        [pick, seed, script @ ..] => (*pick, *seed, Script::decode(script)),
        _ => return,
    };
    let wire: Vec<u8> = script.frames.iter().flat_map(ScriptFrame::encode).collect();
    let setup = Setup::new(pick, seed, wire.len());
    let expected = script.model(setup.max);
    check_stream(&setup, &wire, Some(expected));
}

/// Checks every decoder of the gateway's input paths on `data`.
pub fn decoders(data: &[u8]) {
    let body = Bytes::copy_from_slice(data);
    if let Ok(text) = std::str::from_utf8(&body) {
        command(&body, text);
    }
    publish_json(&body);
    let _ = DisconnectRequest::decode(data);
    publish_proto(data);
}

/// How a stream is parsed: under which limit, in which reads.
struct Setup {
    max: usize,
    reads: Vec<usize>,
}

impl Setup {
    fn new(pick: u8, seed: u8, len: usize) -> Self {
        let max = MAXES[usize::from(pick & 7)];
        // Large streams are read in larger pieces: byte-sized reads of
        // 100 KiB cost a run's time, and the small streams have them.
        let smallest = if len > BYTEWISE_MAX {
            MIN_READ_LARGE
        } else {
            1
        };
        let largest = READS[usize::from(pick >> 3 & 7)].max(smallest);
        // Read sizes from `smallest` to `largest`, small ones often: a
        // xorshift seeded with the byte, cycled.
        let mut rng = Rng(u32::from(seed) | 0x100);
        let reads = (0..16)
            .map(|_| {
                let r = rng.next() as usize;
                match r % 4 {
                    0 => 1,
                    1 => 1 + r / 4 % 16,
                    _ => 1 + (r / 4) % largest.min(1 << 24),
                }
                .clamp(smallest, largest)
            })
            .collect();
        Self { max, reads }
    }
}

struct Rng(u32);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 17;
        self.0 ^= self.0 << 5;
        self.0
    }
}

fn check_stream(setup: &Setup, wire: &[u8], expected: Option<Outcome>) {
    let max = setup.max;
    let whole = feed_in(max, wire, std::iter::repeat(usize::MAX));
    let chunked = feed_in(max, wire, setup.reads.iter().copied().cycle());
    assert_eq!(chunked, whole, "reads of {:?}", setup.reads);
    if wire.len() <= BYTEWISE_MAX {
        assert_eq!(feed_in(max, wire, std::iter::repeat(1)), whole, "bytewise");
    }
    if let Some(expected) = expected {
        assert_eq!(whole, expected, "the parser disagrees with the model");
    }
    check_messages(max, &whole.0);
    check_reencoded(max, &whole.0, setup.reads[0]);
    check_reader(max, wire, &setup.reads, &whole);
}

/// Feeds `wire` to a parser in reads of the given sizes, checking its state
/// after each successful call.
fn feed_in(max: usize, wire: &[u8], mut reads: impl Iterator<Item = usize>) -> Outcome {
    let mut parser = Parser::new(max);
    let mut events = Vec::new();
    let (mut at, mut end) = (0, 0);
    while at < wire.len() {
        if at == end {
            end = end
                .saturating_add(reads.next().unwrap_or(1).max(1))
                .min(wire.len());
        }
        let input = &wire[at..end];
        match parser.feed(input) {
            Ok((used, parsed)) => {
                assert!(used <= input.len(), "used {used} of {}", input.len());
                if parsed.is_none() {
                    assert_eq!(used, input.len(), "all input used when nothing came out");
                }
                at += used;
                events.extend(parsed);
            }
            Err(e) => return (events, Some(e)),
        }
        parser.check_invariants();
    }
    (events, None)
}

/// What came out is what a server may accept.
fn check_messages(max: usize, events: &[Parsed]) {
    for event in events {
        match event {
            Parsed::Text(text) => {
                assert!(text.len() <= max, "a {}-byte message", text.len());
                assert!(std::str::from_utf8(text).is_ok(), "text not UTF-8");
            }
            Parsed::Ping(payload) | Parsed::Pong(payload) => assert!(payload.len() <= 125),
            Parsed::Close(payload) => assert_eq!(close_error(payload), None),
            Parsed::Binary(_) => panic!("binary out of a parser that refuses it"),
        }
    }
}

/// RFC 6455 5.5.1 and 7.4, stated again: what a close payload may be.
fn close_error(payload: &[u8]) -> Option<FrameError> {
    let [hi, lo, reason @ ..] = payload else {
        return (payload.len() == 1).then_some(FrameError::ShortClose);
    };
    let code = u16::from_be_bytes([*hi, *lo]);
    if !matches!(code, 1000..=1003 | 1007..=1014 | 3000..=4999) {
        return Some(FrameError::CloseCode(code));
    }
    std::str::from_utf8(reason)
        .err()
        .map(|_| FrameError::CloseReasonUtf8)
}

/// The messages, encoded again as a client would (texts cut into up to four
/// fragments, anywhere, even inside a character, with a ping between the
/// first two), parse back to the same.
fn check_reencoded(max: usize, events: &[Parsed], seed: usize) {
    let mut rng = Rng(seed as u32 | 0x1_0000);
    let mut wire = Vec::new();
    let mut expected = Vec::new();
    for event in events {
        let mask = rng.next().to_be_bytes();
        let (opcode, payload) = match event {
            Parsed::Text(text) => {
                let mut cuts: Vec<usize> = (0..rng.next() % 4)
                    .map(|_| rng.next() as usize % (text.len() + 1))
                    .collect();
                cuts.sort_unstable();
                cuts.push(text.len());
                let mut start = 0;
                for (i, &cut) in cuts.iter().enumerate() {
                    let last = i + 1 == cuts.len();
                    let opcode = if i == 0 { OP_TEXT } else { OP_CONTINUATION };
                    let first = opcode | if last { FIN } else { 0 };
                    wire.extend(client_frame(first, &text[start..cut], mask, Form::Shortest));
                    start = cut;
                    if i == 0 && !last {
                        wire.extend(client_frame(
                            FIN | OP_PING,
                            b"between",
                            mask,
                            Form::Shortest,
                        ));
                        expected.push(Parsed::Ping(Bytes::from_static(b"between")));
                    }
                }
                expected.push(Parsed::Text(text.clone()));
                continue;
            }
            Parsed::Ping(p) => (OP_PING, p),
            Parsed::Pong(p) => (OP_PONG, p),
            Parsed::Close(p) => (OP_CLOSE, p),
            Parsed::Binary(_) => panic!("binary out of a parser that refuses it"),
        };
        wire.extend(client_frame(FIN | opcode, payload, mask, Form::Shortest));
        expected.push(clone(event));
    }
    let again = feed_in(max, &wire, std::iter::repeat(usize::MAX));
    assert_eq!(again, (expected, None), "the messages, re-encoded");
}

fn clone(event: &Parsed) -> Parsed {
    match event {
        Parsed::Text(b) => Parsed::Text(b.clone()),
        Parsed::Ping(b) => Parsed::Ping(b.clone()),
        Parsed::Pong(b) => Parsed::Pong(b.clone()),
        Parsed::Close(b) => Parsed::Close(b.clone()),
        Parsed::Binary(b) => Parsed::Binary(b.clone()),
    }
}

/// The socket reader, over a stream that yields `wire` in reads of the given
/// sizes and then ends, must give what the parser gave, up to and including
/// a close (where a session stops reading), and echo that close; or end
/// with the parser's error's reason, or as a lost connection at the end of
/// the stream.
fn check_reader(max: usize, wire: &[u8], reads: &[usize], parsed: &Outcome) {
    let (events, error) = parsed;
    let out = Outbound::new(Limits {
        frames: 16,
        bytes: 1 << 20,
        overflow: Overflow::Disconnect,
    });
    let stream = Chunked {
        wire,
        reads,
        next: 0,
    };
    // Nothing here waits on time; the message clock still needs a runtime.
    let mut reader = Reader::new(stream, max, Duration::from_secs(3600));
    let (got, ended) = RUNTIME.with(|rt| {
        rt.block_on(async {
            let mut got = Vec::new();
            loop {
                match reader.next(&out).await {
                    Ok(event) => {
                        reader.check_invariants();
                        let close = matches!(event, Parsed::Close(_));
                        got.push(event);
                        if close {
                            return (got, None);
                        }
                    }
                    Err(reason) => return (got, Some(reason)),
                }
            }
        })
    });
    let close = events.iter().position(|e| matches!(e, Parsed::Close(_)));
    let mut batch = Vec::new();
    let echo = out.take(&mut batch).and_then(|taken| taken.close?.frame);
    match close {
        Some(at) => {
            assert_eq!(got, events[..=at], "the reader, up to the close");
            assert_eq!(ended, None);
            let Parsed::Close(payload) = &events[at] else {
                unreachable!()
            };
            assert_eq!(echo, Some(frame::encode(frame::OP_CLOSE, &[payload])));
        }
        None => {
            assert_eq!(&got, events, "the reader");
            let reason = error.map_or(CloseReason::ConnectionLost, |e| e.close_reason());
            assert_eq!(ended, Some(reason), "the reader's end");
            assert_eq!(echo, None, "only a valid close is echoed");
        }
    }
}

thread_local! {
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap_or_else(|e| panic!("a runtime: {e}"));
}

/// A client that sends `wire` in reads of the given sizes (cycled), then
/// closes.
struct Chunked<'a> {
    wire: &'a [u8],
    reads: &'a [usize],
    next: usize,
}

impl AsyncRead for Chunked<'_> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        _: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let size = self.reads[self.next % self.reads.len()];
        self.next += 1;
        let n = size.min(buf.remaining()).min(self.wire.len());
        let (now, later) = self.wire.split_at(n);
        buf.put_slice(now);
        self.wire = later;
        Poll::Ready(Ok(()))
    }
}

/// A client's text frame, as the session decodes it.
fn command(frame: &Bytes, text: &str) {
    match Command::decode(text) {
        Ok(command) => {
            let pb = command.to_proto();
            let back = v1::ClientCommand::decode(pb.encode_to_vec().as_slice()).ok();
            assert_eq!(back.as_ref(), Some(&pb), "the protobuf form round-trips");
            if let Command::Pub { data, .. } = &command {
                // As the session publishes it: no copy, so it must lie
                // within the frame (`slice_ref` panics otherwise).
                let _ = frame.slice_ref(data.get().as_bytes());
            }
            check_command(&command);
        }
        Err(e) => check_error(&e),
    }
}

/// What a command names passes the checks of what it leads to: a `pub`'s
/// delivery, a topic's `ok`. For both forms of the protocol.
fn check_command(command: &Command<'_>) {
    match command {
        Command::Pub { topic, data, .. } => check_delivery(topic, data.get().as_bytes()),
        Command::Sub { topic, .. }
        | Command::Unsub { topic, .. }
        | Command::Ack { topic, .. }
        | Command::History { topic, .. }
        | Command::Presence { topic, .. } => check_topic(topic),
        Command::Hello { .. }
        | Command::Refresh { .. }
        | Command::Ping { .. }
        | Command::Rpc { .. } => {}
    }
}

/// The `err` the client gets is JSON that says what went wrong.
fn check_error(e: &CommandError) {
    let reply = ServerMessage::Err {
        id: e.id,
        code: e.wire_code(),
        message: &e.message,
        topic: e.topic.as_deref(),
    }
    .to_json();
    let reply: Value = serde_json::from_slice(&reply)
        .unwrap_or_else(|j| panic!("`err` for {e:?} is not JSON: {j}"));
    assert_eq!(reply["op"], "err");
    assert_eq!(reply["code"], e.code.as_str());
    assert_eq!(reply.get("id").and_then(Value::as_u64), e.id);
    assert_eq!(
        reply.get("topic").and_then(Value::as_str),
        e.topic.as_deref()
    );
}

/// The HTTP publish body, as `POST /v1/publish` decodes it.
fn publish_json(body: &Bytes) {
    let Ok(request) = PublishRequest::decode(body) else {
        return;
    };
    let _ = JsonData::within(body, request.data);
    let pb = request.to_proto();
    let back = v1::PublishRequest::decode(pb.encode_to_vec().as_slice()).ok();
    assert_eq!(back.as_ref(), Some(&pb), "the protobuf form round-trips");
    check_delivery(&request.topic, request.data.get().as_bytes());
}

/// The gRPC `Publish` request, as the Publisher service decodes it.
fn publish_proto(data: &[u8]) {
    let Ok(request) = v1::PublishRequest::decode(data) else {
        return;
    };
    if JsonData::parse(Bytes::from(request.data.clone()), usize::MAX).is_ok() {
        check_delivery(&request.topic, &request.data);
    }
}

/// A publication of `data` (accepted as JSON text) to `topic`, if it is a
/// valid topic: the `msg` every subscriber receives must be JSON text, an
/// object holding both.
///
/// JSON's grammar, not more: `data` is forwarded as the publisher wrote it,
/// and the grammar allows a string escape of a lone surrogate (`"\ude00"`,
/// which JavaScript's `JSON.stringify` writes for a broken string), which
/// serde_json reads as text but not into a `Value`. Where `data` reads into
/// one, the `msg` does too, with `data` in it unchanged.
fn check_delivery(topic: &str, data: &[u8]) {
    let Ok(topic) = Topic::parse(topic) else {
        return;
    };
    check_topic(topic.as_str());
    let mut msg = Vec::new();
    proto::json::encode_msg_prefix(&mut msg, topic.as_str(), 7);
    msg.extend_from_slice(data);
    msg.push(b'}');
    let text = || String::from_utf8_lossy(data);
    let grammar = serde_json::from_slice::<serde::de::IgnoredAny>(&msg);
    assert!(
        grammar.is_ok(),
        "`msg` is not JSON text: {grammar:?}: {}",
        text()
    );
    if let Ok(data) = serde_json::from_slice::<Value>(data) {
        let msg: Value = serde_json::from_slice(&msg)
            .unwrap_or_else(|e| panic!("`msg` is not JSON: {e}: {}", text()));
        assert_eq!(msg["topic"], topic.as_str());
        assert_eq!(msg["data"], data);
    }
}

/// A topic that parses is named the same way again, and the `ok` naming it
/// is JSON.
fn check_topic(name: &str) {
    let Ok(topic) = Topic::parse(name) else {
        return;
    };
    assert_eq!(topic.as_str(), name);
    assert!(Topic::parse(topic.as_str()).is_ok());
    let ok = ServerMessage::Ok {
        id: 1,
        topic: Some(topic.as_str()),
        seq: None,
        epoch: None,
        recovered: None,
        expires: None,
        data: None,
        delta: None,
    }
    .to_json();
    let ok: Value = serde_json::from_slice(&ok).unwrap_or_else(|e| panic!("`ok`: {e}"));
    assert_eq!(ok["topic"], name);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every checked-in seed of `target`, through its checks; how many.
    fn replay(target: &str, check: fn(&[u8])) -> usize {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/seeds")
            .join(target);
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir:?}: {e}"));
        let mut count = 0;
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{e}")).path();
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
            let run = std::panic::catch_unwind(|| check(&data));
            assert!(run.is_ok(), "{path:?} fails the `{target}` checks");
            count += 1;
        }
        count
    }

    #[test]
    fn the_frame_seeds_pass_the_fuzz_checks() {
        assert!(replay("frames", frames) >= 10);
    }

    #[test]
    fn the_frame_script_seeds_pass_the_fuzz_checks() {
        assert!(replay("frame_script", frame_script) >= 5);
    }

    #[test]
    fn the_compressed_seeds_pass_the_fuzz_checks() {
        assert!(replay("compressed", compressed) >= 10);
    }

    #[test]
    fn the_compressed_script_seeds_pass_the_fuzz_checks() {
        assert!(replay("compressed_script", compressed_script) >= 10);
    }

    #[test]
    fn the_inflate_seeds_pass_the_fuzz_checks() {
        assert!(replay("inflate", inflate) >= 5);
    }

    #[test]
    fn the_proto_command_seeds_pass_the_fuzz_checks() {
        assert!(replay("proto_command", proto_command) >= 10);
    }

    #[test]
    fn the_decoder_seeds_pass_the_fuzz_checks() {
        assert!(replay("decoders", decoders) >= 10);
    }
}
