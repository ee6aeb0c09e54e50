//! The `compressed_script` fuzz target: a client's messages, compressed as
//! real clients compress them, against a model of what the parser must make
//! of them.
//!
//! Raw bytes seldom make deflate data, so the script describes messages
//! (text or binary, compressed or not, their data, fragments, a ping between
//! them) and the target compresses them itself, the way a client would:
//! with any `client_max_window_bits` (9 to 15), any level, ending each
//! message with a sync flush (its tail removed, or kept), a final block
//! (RFC 7692 7.2.3.3), or with a flush in the middle too. With or without
//! context takeover: the server always asks `client_no_context_takeover`, so
//! a client that keeps its window breaks the agreement, and the parser must
//! then give each message's exact data or refuse it (1002), never other
//! bytes. The model says which messages come out and which error ends the
//! stream: over the message limit on the wire (1009), past the inflate cap
//! (1009), not deflate data (1002), text not UTF-8 once inflated (1007),
//! binary where the parser refuses it (1003).

use bytes::Bytes;
use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::script::{Form, client_frame};
use super::{FIN, OP_CONTINUATION, OP_PING, OP_TEXT, Outcome, Rng};
use crate::deflate::inflate::last_work;
use crate::deflate::{MIN_WINDOW_BITS, RSV1, TAIL};
use crate::frame::OP_BINARY;
use crate::session::parser::{FrameError, Parsed, Parser};

/// Message limits on the wire and inflate caps, picked by the first byte.
const MAXES: [usize; 4] = [16, 1000, 65_536, 1 << 20];
const CAPS: [usize; 4] = [1, 200, 4096, 1 << 20];
/// The largest read of a chunking, picked by the first byte too.
const READS: [usize; 4] = [3, 64, 1000, usize::MAX];
/// Most messages a script holds: more adds little a run could not find with
/// fewer.
const MAX_MESSAGES: usize = 16;
/// Above this many bytes on the wire, no read is shorter than 1000 bytes.
const SMALL_READS_MAX: usize = 16 * 1024;

/// How a client ends a compressed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// A sync flush, its `00 00 ff ff` removed (RFC 7692 7.2.1).
    Sync,
    /// A sync flush with its tail left on: an empty stored block more.
    SyncTailKept,
    /// A final block (BFINAL), which RFC 7692 7.2.3.3 allows.
    Final,
    /// A sync flush halfway through the data too, then as `Sync`.
    TwoFlushes,
}

/// One message of a script.
#[derive(Debug)]
struct ScriptMessage {
    compressed: bool,
    binary: bool,
    /// The data as sent: text messages sent uncompressed are made UTF-8
    /// (their checks as they arrive are the `frames` target's); compressed
    /// text may be anything, and is checked once inflated.
    data: Vec<u8>,
    window_bits: u8,
    level: u32,
    ending: Ending,
    /// 1 to 4 fragments, cut at positions drawn from this seed.
    fragments: u32,
    cut_seed: u32,
    /// A ping after the first fragment (after the message if it has one).
    ping: bool,
}

/// A stream of messages and how it is parsed.
struct CompressedScript {
    max: usize,
    cap: usize,
    /// The client keeps its compressor's window from message to message.
    takeover: bool,
    /// The parser takes binary messages (the echo, the protobuf
    /// subprotocol) or refuses them.
    binary: bool,
    largest_read: usize,
    messages: Vec<ScriptMessage>,
}

/// Checks the messages `data` describes: its first byte picks the limit,
/// the cap, context takeover, binary and the reads (bits 0-1, 2-3, 4, 5,
/// 6-7); then each message is a kind byte (compressed, binary, fragments,
/// ping, ending: bits 0, 1, 2-3, 4, 5-6; bit 7 a high level), a byte whose
/// value picks the window (9 + b % 7) and seeds the cuts, a length byte and
/// that many bytes of data, then a byte that says how many times the data
/// repeats (1 + b).
pub fn compressed_script(data: &[u8]) {
    let Some(script) = CompressedScript::decode(data) else {
        return;
    };
    let (wire, model) = script.build();
    let whole = script.feed(&wire, 1, usize::MAX);
    let (events, error) = &whole;
    assert_eq!(events, &model.events, "the parser disagrees with the model");
    // A message that inflates past the cap before it proves corrupt may be
    // either: the inflater may see the bad code before it runs out of room.
    let either = model.error == Some(FrameError::InflatedTooBig)
        && model.corrupt_past_cap
        && *error == Some(FrameError::Corrupt);
    if !either {
        assert_eq!(*error, model.error, "the parser disagrees with the model");
    }
    let smallest = if wire.len() > SMALL_READS_MAX {
        1000
    } else {
        1
    };
    let largest = script.largest_read.max(smallest);
    let chunked = script.feed(&wire, smallest, largest);
    assert_eq!(chunked, whole, "reads of {smallest} to {largest} bytes");
}

impl CompressedScript {
    fn decode(data: &[u8]) -> Option<Self> {
        let (&pick, mut rest) = data.split_first()?;
        let mut messages = Vec::new();
        while let [kind, window, len, tail @ ..] = rest {
            if messages.len() == MAX_MESSAGES {
                break;
            }
            let len = usize::from(*len).min(tail.len());
            let (bytes, tail) = tail.split_at(len);
            let (times, tail) = match tail.split_first() {
                Some((&times, tail)) => (1 + usize::from(times), tail),
                None => (1, tail),
            };
            rest = tail;
            let compressed = kind & 1 != 0;
            let binary = kind & 2 != 0;
            let mut data = bytes.repeat(times);
            if !compressed && !binary {
                data = String::from_utf8_lossy(&data).into_owned().into_bytes();
            }
            messages.push(ScriptMessage {
                compressed,
                binary,
                data,
                window_bits: MIN_WINDOW_BITS + window % 7,
                level: if kind & 0x80 != 0 { 9 } else { 1 },
                ending: match kind >> 5 & 3 {
                    0 => Ending::Sync,
                    1 => Ending::SyncTailKept,
                    2 => Ending::Final,
                    _ => Ending::TwoFlushes,
                },
                fragments: 1 + u32::from(kind >> 2 & 3),
                cut_seed: u32::from(*window) | 0x100,
                ping: kind & 0x10 != 0,
            });
        }
        Some(Self {
            max: MAXES[usize::from(pick & 3)],
            cap: CAPS[usize::from(pick >> 2 & 3)],
            takeover: pick & 0x10 != 0,
            binary: pick & 0x20 != 0,
            largest_read: READS[usize::from(pick >> 6)],
            messages,
        })
    }

    /// The stream on the wire, and what the parser must make of it.
    fn build(&self) -> (Vec<u8>, Model) {
        let mut wire = Vec::new();
        let mut model = Model {
            events: Vec::new(),
            error: None,
            corrupt_past_cap: false,
        };
        // With context takeover, one compressor for the whole stream (a
        // final block ends its stream: it starts again after one).
        let mut kept: Option<(u8, u32, Compress)> = None;
        for m in &self.messages {
            if model.error.is_some() {
                // The parser stops there: what follows is never read.
                break;
            }
            let payload = if m.compressed {
                let mut own = None;
                let slot = if self.takeover { &mut kept } else { &mut own };
                let (_, _, compress) =
                    slot.get_or_insert_with(|| client_compressor(m.window_bits, m.level));
                let payload = client_deflate(compress, &m.data, m.ending);
                if m.ending == Ending::Final {
                    compress.reset();
                }
                if let Some(own) = own {
                    give_back(own);
                }
                payload
            } else {
                m.data.clone()
            };
            let frames = fragments(&payload, m.fragments, m.cut_seed);
            let opcode = if m.binary { OP_BINARY } else { OP_TEXT };
            let mut rng = Rng(m.cut_seed);
            for (i, fragment) in frames.iter().enumerate() {
                let mut first = if i == 0 { opcode } else { OP_CONTINUATION };
                if i == 0 && m.compressed {
                    first |= RSV1;
                }
                if i + 1 == frames.len() {
                    first |= FIN;
                }
                let mask = rng.next().to_be_bytes();
                wire.extend(client_frame(first, fragment, mask, Form::Shortest));
                if m.ping && i == 0 {
                    wire.extend(client_frame(FIN | OP_PING, b"p", mask, Form::Shortest));
                }
            }
            model.message(self, m, &frames, &payload);
        }
        if let Some(kept) = kept {
            give_back(kept);
        }
        (wire, model)
    }

    /// `wire` parsed in reads of `smallest` to `largest` bytes, the
    /// parser's promises checked after each, and no message inflated past
    /// the cap (by a byte: how it tells one that passes it).
    fn feed(&self, wire: &[u8], smallest: usize, largest: usize) -> Outcome {
        let mut parser = Parser::new(self.max).inflating(self.cap);
        if self.binary {
            parser = parser.binary();
        }
        // The inflater's count is this thread's last message's, maybe an
        // earlier input's under another cap: an empty message resets it.
        let _ = crate::deflate::inflate::inflate(&[], 0);
        let mut rng = Rng(largest as u32 | 0x1_0000);
        let mut events = Vec::new();
        let (mut at, mut end) = (0, 0);
        while at < wire.len() {
            if at == end {
                let step = match largest {
                    usize::MAX => largest,
                    _ => (1 + rng.next() as usize % largest).max(smallest),
                };
                end = end.saturating_add(step).min(wire.len());
            }
            let result = parser.feed(&wire[at..end]);
            let (_, out) = last_work();
            assert!(
                out <= self.cap as u64 + 1,
                "{out} bytes inflated, cap {}",
                self.cap
            );
            match result {
                Ok((used, parsed)) => {
                    at += used;
                    events.extend(parsed);
                }
                Err(e) => return (events, Some(e)),
            }
            parser.check_invariants();
        }
        (events, None)
    }
}

/// What the parser must give: the events so far, and the error that ended
/// the stream.
struct Model {
    events: Vec<Parsed>,
    error: Option<FrameError>,
    /// The error is `InflatedTooBig` for a message that is corrupt further
    /// on: `Corrupt` will do as well.
    corrupt_past_cap: bool,
}

impl Model {
    /// The message `m`, sent as `frames` (`payload` cut up), parsed.
    fn message(
        &mut self,
        s: &CompressedScript,
        m: &ScriptMessage,
        frames: &[&[u8]],
        payload: &[u8],
    ) {
        let mut held = 0;
        for (i, fragment) in frames.iter().enumerate() {
            // Refused from each header: past the limit with what came
            // before, then binary where it is not taken.
            held += fragment.len();
            if held > s.max {
                self.error = Some(FrameError::TooBig);
                return;
            }
            if i == 0 && m.binary && !s.binary {
                self.error = Some(FrameError::Binary);
                return;
            }
            if m.ping && i == 0 && frames.len() > 1 {
                self.events.push(Parsed::Ping(Bytes::from_static(b"p")));
            }
        }
        let data = if m.compressed {
            match reference_inflate(payload) {
                Ok(data) => {
                    // The data as sent, or (a client keeping its window)
                    // refused: never other bytes.
                    if !s.takeover || data != m.data {
                        assert_eq!(data, m.data, "deflate data that inflates to other bytes");
                    }
                    if data.len() > s.cap {
                        self.error = Some(FrameError::InflatedTooBig);
                        return;
                    }
                    data
                }
                Err(produced) => {
                    assert!(s.takeover, "a fresh client's message does not inflate");
                    self.corrupt_past_cap = produced > s.cap;
                    self.error = Some(if produced > s.cap {
                        FrameError::InflatedTooBig
                    } else {
                        FrameError::Corrupt
                    });
                    return;
                }
            }
        } else {
            m.data.clone()
        };
        if !m.binary && std::str::from_utf8(&data).is_err() {
            self.error = Some(FrameError::InvalidUtf8);
            return;
        }
        let data = Bytes::from(data);
        self.events.push(if m.binary {
            Parsed::Binary(data)
        } else {
            Parsed::Text(data)
        });
        if m.ping && frames.len() == 1 {
            self.events.push(Parsed::Ping(Bytes::from_static(b"p")));
        }
    }
}

thread_local! {
    /// The clients' compressors, by window and level, kept from one input
    /// to the next: a new one costs more than most inputs' checks.
    static COMPRESSORS: std::cell::RefCell<Vec<(u8, u32, Compress)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// A client's compressor at the start of its stream.
fn client_compressor(window_bits: u8, level: u32) -> (u8, u32, Compress) {
    let found = COMPRESSORS.with(|cell| {
        let mut pool = cell.borrow_mut();
        let at = pool
            .iter()
            .position(|(w, l, _)| (*w, *l) == (window_bits, level))?;
        Some(pool.swap_remove(at))
    });
    match found {
        Some((w, l, mut compress)) => {
            compress.reset();
            (w, l, compress)
        }
        None => {
            let compress =
                Compress::new_with_window_bits(Compression::new(level), false, window_bits);
            (window_bits, level, compress)
        }
    }
}

fn give_back(compressor: (u8, u32, Compress)) {
    COMPRESSORS.with(|cell| cell.borrow_mut().push(compressor));
}

/// `data` compressed as a client compresses a message, ending as `ending`
/// says.
fn client_deflate(compress: &mut Compress, data: &[u8], ending: Ending) -> Vec<u8> {
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    match ending {
        Ending::Sync | Ending::SyncTailKept => {
            deflate_into(compress, data, FlushCompress::Sync, &mut out)
        }
        Ending::Final => deflate_into(compress, data, FlushCompress::Finish, &mut out),
        Ending::TwoFlushes => {
            let (a, b) = data.split_at(data.len() / 2);
            deflate_into(compress, a, FlushCompress::Sync, &mut out);
            deflate_into(compress, b, FlushCompress::Sync, &mut out);
        }
    }
    // (A sync flush with nothing new since the last one writes nothing:
    // an empty message of a client that keeps its window is empty.)
    if matches!(ending, Ending::Sync | Ending::TwoFlushes) && out.ends_with(&TAIL) {
        out.truncate(out.len() - TAIL.len());
    }
    out
}

fn deflate_into(compress: &mut Compress, data: &[u8], flush: FlushCompress, out: &mut Vec<u8>) {
    let mut input = data;
    loop {
        if out.capacity() - out.len() < 64 {
            out.reserve(out.len().max(256));
        }
        let before = compress.total_in();
        let status = compress
            .compress_vec(input, out, flush)
            .unwrap_or_else(|e| panic!("the client's deflate failed: {e}"));
        input = &input[(compress.total_in() - before) as usize..];
        let done = match flush {
            FlushCompress::Finish => status == Status::StreamEnd,
            _ => input.is_empty() && out.len() < out.capacity(),
        };
        if done {
            return;
        }
    }
}

/// A message's payload cut into `count` fragments at positions drawn from
/// `seed` (empty fragments too).
fn fragments(payload: &[u8], count: u32, seed: u32) -> Vec<&[u8]> {
    let mut rng = Rng(seed ^ 0x5bd1_e995);
    let mut cuts: Vec<usize> = (1..count)
        .map(|_| rng.next() as usize % (payload.len() + 1))
        .collect();
    cuts.sort_unstable();
    cuts.push(payload.len());
    let mut start = 0;
    cuts.into_iter()
        .map(|cut| {
            let fragment = &payload[start..cut];
            start = cut;
            fragment
        })
        .collect()
}

/// A message's payload inflated the plain way, with no cap (the script's
/// data is at most 64 KiB): its data, or how many bytes came out
/// before it proved not to be deflate data. A final block ends it; what
/// follows that is ignored, as RFC 7692 7.2.3.3 has it.
fn reference_inflate(payload: &[u8]) -> Result<Vec<u8>, usize> {
    let mut input = payload.to_vec();
    input.extend_from_slice(&TAIL);
    let mut inflater = Decompress::new(false);
    let mut out = Vec::with_capacity(input.len() * 4 + 64);
    let mut input = input.as_slice();
    loop {
        if out.len() == out.capacity() {
            out.reserve(out.len());
        }
        let (before, written) = (inflater.total_in(), out.len());
        let status = inflater
            .decompress_vec(input, &mut out, FlushDecompress::Sync)
            .map_err(|_| out.len())?;
        input = &input[(inflater.total_in() - before) as usize..];
        match status {
            Status::StreamEnd => return Ok(out),
            _ if input.is_empty() && out.len() < out.capacity() => return Ok(out),
            _ if out.len() == written
                && inflater.total_in() == before
                && out.len() < out.capacity() =>
            {
                return Err(out.len());
            }
            _ => {}
        }
    }
}
