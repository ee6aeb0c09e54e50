//! The `compressed` fuzz target: client streams under permessage-deflate;
//! and the `inflate` target: one compressed message inflated under a cap.

use bytes::Bytes;
use flate2::{Decompress, FlushDecompress, Status};

use super::script::{Form, client_frame};
use super::{FIN, OP_CONTINUATION, Outcome, Rng};
use crate::deflate::inflate::{InflateError, last_work};
use crate::deflate::{Deflate, RSV1, TAIL};
use crate::frame;
use crate::session::parser::{Parsed, Parser};

/// The message limits (on the wire) and inflated caps a stream is parsed
/// under, picked by its first byte.
const MAXES: [usize; 4] = [16, 1000, 65_536, 1 << 20];
const CAPS: [usize; 4] = [1, 200, 4096, 1 << 20];

/// Checks `data` as a client's stream with permessage-deflate negotiated:
/// its first byte picks the limit, the cap and the read size; the rest is
/// the stream. Compressed data is hard to hit by chance, so the target also
/// compresses the rest itself and sends it as one message, then cut into
/// fragments.
pub fn compressed(data: &[u8]) {
    let [pick, rest @ ..] = data else {
        return;
    };
    let max = MAXES[usize::from(pick & 3)];
    let cap = CAPS[usize::from(pick >> 2 & 3)];
    let read = 1 + usize::from(pick >> 4) * 37;
    check(max, cap, read, rest);
    // The rest as a compressed message's payload, whole and in fragments.
    let deflate = Deflate {
        window_bits: 9 + pick % 7,
        level: 1 + pick % 9,
        min_bytes: 0,
    };
    let Some((payload, _)) = deflate.compress(&[rest], 0) else {
        return;
    };
    let mut rng = Rng(u32::from(*pick) | 0x100);
    let wire = fragments(&payload, true, &mut rng);
    let outcome = check(max, cap, read, &wire);
    if payload.len() <= max && rest.len() <= cap {
        let expected = if std::str::from_utf8(rest).is_ok() {
            Parsed::Text(Bytes::copy_from_slice(rest))
        } else {
            Parsed::Binary(Bytes::copy_from_slice(rest))
        };
        // Text that is not UTF-8 is an error; binary is anything.
        if let Parsed::Text(_) = expected {
            assert_eq!(outcome, (vec![expected], None));
        }
    }
}

/// One message's `payload` as a client's frames: RSV1 on the first, up to
/// four fragments cut anywhere, text where the inflated message is UTF-8.
fn fragments(payload: &[u8], compressed: bool, rng: &mut Rng) -> Vec<u8> {
    let mask = rng.next().to_be_bytes();
    let mut cuts: Vec<usize> = (0..rng.next() % 4)
        .map(|_| rng.next() as usize % (payload.len() + 1))
        .collect();
    cuts.sort_unstable();
    cuts.push(payload.len());
    let mut wire = Vec::new();
    let mut start = 0;
    for (i, &cut) in cuts.iter().enumerate() {
        let mut first = if i == 0 {
            frame::OP_TEXT
        } else {
            OP_CONTINUATION
        };
        if i == 0 && compressed {
            first |= RSV1;
        }
        if i + 1 == cuts.len() {
            first |= FIN;
        }
        wire.extend(client_frame(
            first,
            &payload[start..cut],
            mask,
            Form::Shortest,
        ));
        start = cut;
    }
    wire
}

/// The stream parsed whole and in reads of `read` bytes: the same outcome,
/// the parser's promises kept after each read, nothing past the cap.
fn check(max: usize, cap: usize, read: usize, wire: &[u8]) -> Outcome {
    let whole = feed(max, cap, wire, usize::MAX);
    assert_eq!(feed(max, cap, wire, read), whole, "reads of {read}");
    for event in &whole.0 {
        match event {
            Parsed::Text(text) => {
                assert!(text.len() <= cap.max(max), "a {}-byte message", text.len());
                assert!(std::str::from_utf8(text).is_ok(), "text not UTF-8");
            }
            Parsed::Binary(data) => assert!(data.len() <= cap.max(max)),
            Parsed::Ping(p) | Parsed::Pong(p) | Parsed::Close(p) => assert!(p.len() <= 125),
        }
    }
    whole
}

fn feed(max: usize, cap: usize, wire: &[u8], read: usize) -> Outcome {
    let mut parser = Parser::new(max).inflating(cap).binary();
    let mut events = Vec::new();
    let (mut at, mut end) = (0, 0);
    while at < wire.len() {
        if at == end {
            end = end.saturating_add(read).min(wire.len());
        }
        match parser.feed(&wire[at..end]) {
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

/// Checks `data` as one compressed message's payload: its first byte picks
/// the cap, the rest is the payload. Inflated under the cap it must agree
/// with inflating it the plain way (the same data, or too big exactly when
/// that passes the cap, or corrupt where that fails first), and cost no
/// more than the cap: no more room than the cap (and a byte) taken, no
/// more bytes inflated.
pub fn inflate(data: &[u8]) {
    let [pick, payload @ ..] = data else {
        return;
    };
    let cap = INFLATE_CAPS[usize::from(pick & 7)];
    let capped = crate::deflate::inflate::inflate(payload, cap);
    let (_, out) = last_work();
    assert!(
        out <= cap as u64 + 1,
        "{out} bytes inflated under a cap of {cap}"
    );
    match (plain_inflate(payload, cap), &capped) {
        (Plain::Data(plain), Ok(inflated)) => {
            assert_eq!(&plain, inflated);
            assert!(
                inflated.capacity() <= cap + 1,
                "room for {}",
                inflated.capacity()
            );
        }
        (Plain::Data(plain), Err(e)) => {
            assert!(plain.len() > cap, "{e} for {} bytes", plain.len());
            assert_eq!(*e, InflateError::TooBig);
        }
        (Plain::Cut, Err(_)) => {}
        // Past the cap it may be either: the inflater may meet the bad code
        // before it runs out of room.
        (Plain::Corrupt(produced), Err(e)) => assert!(
            produced > cap || *e == InflateError::Corrupt,
            "{e} for data corrupt after {produced} bytes"
        ),
        (plain, Ok(inflated)) => {
            panic!("{plain:?}, yet inflated to {} bytes", inflated.len())
        }
    }
}

/// What inflating a payload the plain way gives.
#[derive(Debug)]
enum Plain {
    Data(Vec<u8>),
    /// Past the cap by a lot; stopped there.
    Cut,
    /// Not deflate data, found after this many bytes came out.
    Corrupt(usize),
}

/// The caps an inflate is checked under: the edges, a typical limit.
const INFLATE_CAPS: [usize; 8] = [1, 2, 63, 64, 65, 1000, 65_536, 1 << 20];

/// `payload` inflated into one buffer, as large as needed or the cap and a
/// lot more. A final block ends it; what follows that is ignored, as RFC
/// 7692 7.2.3.3 has it.
fn plain_inflate(payload: &[u8], cap: usize) -> Plain {
    let mut input = payload.to_vec();
    input.extend_from_slice(&TAIL);
    let mut inflater = Decompress::new(false);
    // Deflate expands 1032 times at most.
    let room = cap.saturating_add(1 << 16).min(input.len() * 1032 + 64);
    let mut out = Vec::with_capacity(room);
    let mut input = input.as_slice();
    loop {
        let (before, written) = (inflater.total_in(), out.len());
        let status = match inflater.decompress_vec(input, &mut out, FlushDecompress::Sync) {
            Ok(status) => status,
            Err(_) => return Plain::Corrupt(out.len()),
        };
        input = &input[(inflater.total_in() - before) as usize..];
        match status {
            Status::StreamEnd => return Plain::Data(out),
            _ if out.len() == out.capacity() => return Plain::Cut,
            _ if input.is_empty() => return Plain::Data(out),
            _ if inflater.total_in() == before && out.len() == written => {
                return Plain::Corrupt(out.len());
            }
            _ => {}
        }
    }
}
