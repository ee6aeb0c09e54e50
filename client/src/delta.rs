//! Deltas and binary data: what a `msg` carries, turned into the full
//! [`Data`] the application sees (docs/protocol.md, "Deltas").
//!
//! A subscription that asked for deltas (on a namespace with `delta = true`)
//! gets, from the live fan-out, either a full payload or a Fossil delta
//! against the previous message's payload; each connection keeps the last
//! payload it read per topic (its [`Base`]) to apply the next delta to. The
//! server sends a delta only when the last frame it queued to this
//! connection on the topic was seq - 1 (full or delta); the client checks the
//! same, and a delta it cannot apply (no base, another seq's base, a bad
//! delta or checksum) is [`Unusable::Delta`]: the driver drops the
//! connection and resumes, the server replays from the acks (full), and
//! nothing is lost.

use std::borrow::Cow;

use bytes::Bytes;
use serde::Serialize;
use serde_json::value::RawValue;

/// The most a delta may rebuild: far above any payload a gateway accepts,
/// so that a delta claiming more is refused before anything is allocated.
pub const MAX_TARGET: usize = 64 * 1024 * 1024;

/// A message's data, always whole: the publisher's JSON, or the bytes of a
/// binary publication (`application/octet-stream`, gRPC `binary`), in
/// either protocol (JSON carries them base64-encoded; the client decodes).
#[derive(Debug, Clone)]
pub enum Data {
    /// The publisher's JSON, byte for byte.
    Json(Box<RawValue>),
    /// Opaque bytes, byte for byte.
    Binary(Bytes),
}

impl Data {
    /// The JSON, unless the data is binary.
    pub fn json(&self) -> Option<&RawValue> {
        match self {
            Data::Json(raw) => Some(raw),
            Data::Binary(_) => None,
        }
    }

    /// The bytes, if the data is binary.
    pub fn binary(&self) -> Option<&[u8]> {
        match self {
            Data::Json(_) => None,
            Data::Binary(bytes) => Some(bytes),
        }
    }

    /// The data's bytes: the JSON text, or the binary data.
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            Data::Json(raw) => raw.get().as_bytes(),
            Data::Binary(bytes) => bytes,
        }
    }

    pub fn is_binary(&self) -> bool {
        matches!(self, Data::Binary(_))
    }
}

impl PartialEq for Data {
    /// The same kind and the same bytes (JSON compared as text).
    fn eq(&self, other: &Self) -> bool {
        self.is_binary() == other.is_binary() && self.as_bytes() == other.as_bytes()
    }
}

impl Eq for Data {}

impl std::fmt::Display for Data {
    /// The JSON text; binary data as the JSON protocol writes it (a
    /// base64 string, standard alphabet, padded).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Data::Json(raw) => f.write_str(raw.get()),
            Data::Binary(bytes) => write!(f, "\"{}\"", base64_encode(bytes)),
        }
    }
}

impl Serialize for Data {
    /// The JSON as it is; binary data as a base64 string.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Data::Json(raw) => raw.serialize(s),
            Data::Binary(bytes) => s.serialize_str(&base64_encode(bytes)),
        }
    }
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// Binary data as the JSON protocol writes it.
pub(crate) fn base64_decode(text: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| format!("binary data that is not base64: {e}"))
}

/// What a `msg` carries, as the wire says it.
#[derive(Debug)]
pub(crate) enum Body<'a> {
    /// JSON in the plain `data` form (JSON protocol): the server checked
    /// it; not a base (a replay, or a subscription without deltas).
    Json(&'a RawValue),
    /// The payload's bytes (JSON text, or `binary`); `base`: a delta may
    /// follow it (the `full` form in JSON; every protobuf `msg`).
    Full {
        bytes: Cow<'a, [u8]>,
        binary: bool,
        base: bool,
    },
    /// A Fossil delta against the previous message's payload, rebuilding a
    /// payload that is binary or JSON text.
    Delta { bytes: Cow<'a, [u8]>, binary: bool },
}

/// The payload the next delta applies to.
#[derive(Debug, Clone)]
pub(crate) struct Base {
    seq: u64,
    bytes: Vec<u8>,
}

/// Why a `msg`'s data could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unusable {
    /// A delta this connection cannot apply: come back and resume.
    Delta(String),
    /// Data that is not what it says it is (JSON that does not parse,
    /// base64 that does not decode).
    Data(String),
}

/// The full data of message `seq` from `body`, with `base` moved on: kept
/// (when `keep`: the subscription gets deltas) where a delta may follow,
/// dropped where none may.
pub(crate) fn open(
    base: &mut Option<Base>,
    keep: bool,
    seq: u64,
    body: Body<'_>,
) -> Result<Data, Unusable> {
    match body {
        Body::Json(raw) => {
            *base = None;
            Ok(Data::Json(raw.to_owned()))
        }
        Body::Full {
            bytes,
            binary,
            base: may,
        } => {
            *base = None;
            let data = data_of(&bytes, binary).map_err(Unusable::Data)?;
            if keep && may {
                *base = Some(Base {
                    seq,
                    bytes: bytes.into_owned(),
                });
            }
            Ok(data)
        }
        Body::Delta { bytes, binary } => {
            let Some(from) = base.take() else {
                return Err(Unusable::Delta(format!(
                    "a delta for seq {seq} without a full message before it"
                )));
            };
            if from.seq.checked_add(1) != Some(seq) {
                return Err(Unusable::Delta(format!(
                    "a delta for seq {seq} against seq {}",
                    from.seq
                )));
            }
            let target = apply(&from.bytes, &bytes)
                .map_err(|e| Unusable::Delta(format!("the delta for seq {seq}: {e}")))?;
            let data = data_of(&target, binary).map_err(Unusable::Data)?;
            if keep {
                *base = Some(Base { seq, bytes: target });
            }
            Ok(data)
        }
    }
}

/// A payload's bytes as [`Data`]: binary as they are, JSON checked.
fn data_of(bytes: &[u8], binary: bool) -> Result<Data, String> {
    if binary {
        return Ok(Data::Binary(Bytes::copy_from_slice(bytes)));
    }
    let text = std::str::from_utf8(bytes).map_err(|e| format!("data that is not UTF-8: {e}"))?;
    RawValue::from_string(text.to_owned())
        .map(Data::Json)
        .map_err(|e| format!("data that is not JSON: {e}"))
}

/// The JSON protocol's delta string (byte b written as U+00b) as bytes.
pub(crate) fn delta_bytes(text: &str) -> Result<Vec<u8>, String> {
    text.chars()
        .map(|c| {
            u8::try_from(u32::from(c)).map_err(|_| format!("a delta with {c:?}, above U+00FF"))
        })
        .collect()
}

/// `delta` applied to `base` (the Fossil delta format, the `fossil-delta`
/// crate), after [`check`] proves that the crate's apply will not index
/// out of bounds, overflow or allocate more than [`MAX_TARGET`] (it trusts
/// its input: it was written for deltas a program made itself).
pub(crate) fn apply(base: &[u8], delta: &[u8]) -> Result<Vec<u8>, String> {
    check(base.len(), delta)?;
    fossil_delta::apply(base, delta).map_err(|e| format!("{e:?}"))
}

/// Walks `delta` as the Fossil format reads (`SIZE\n`, then `N@OFFSET,`
/// copies, `N:TEXT` literals, `CHECKSUM;` last) and refuses anything the
/// decoder would stumble on.
fn check(base_len: usize, delta: &[u8]) -> Result<(), String> {
    let (size, mut rest) = number(delta)?;
    let size = usize::try_from(size).map_err(|_| "a delta too large".to_owned())?;
    if size > MAX_TARGET {
        return Err(format!(
            "a delta rebuilding {size} bytes, over {MAX_TARGET}"
        ));
    }
    rest = expect(rest, b'\n')?;
    let mut total = 0usize;
    loop {
        let (n, after) = number(rest)?;
        let n = usize::try_from(n).map_err(|_| "a delta too large".to_owned())?;
        match after.first() {
            Some(b'@') => {
                let (offset, after) = number(&after[1..])?;
                let offset =
                    usize::try_from(offset).map_err(|_| "an offset too large".to_owned())?;
                total = total.saturating_add(n);
                if total > size || offset.saturating_add(n) > base_len {
                    return Err("a copy out of bounds".to_owned());
                }
                rest = expect(after, b',')?;
            }
            Some(b':') => {
                total = total.saturating_add(n);
                let text = &after[1..];
                if total > size || n > text.len() {
                    return Err("a literal out of bounds".to_owned());
                }
                rest = &text[n..];
            }
            Some(b';') => {
                return if after.len() == 1 && total == size {
                    Ok(())
                } else {
                    Err("a delta that does not end with its checksum".to_owned())
                };
            }
            _ => return Err("a delta with an unknown command".to_owned()),
        }
    }
}

/// A base-64 number (Fossil's digits, at most 32 bits) at the start of
/// `bytes`, and what follows it.
fn number(bytes: &[u8]) -> Result<(u32, &[u8]), String> {
    let mut value: u32 = 0;
    let mut digits = 0;
    for &b in bytes {
        let Some(d) = digit(b) else { break };
        value = value
            .checked_mul(64)
            .and_then(|v| v.checked_add(d))
            .ok_or_else(|| "a number in a delta over 32 bits".to_owned())?;
        digits += 1;
    }
    if digits == 0 {
        return Err("a delta missing a number".to_owned());
    }
    Ok((value, &bytes[digits..]))
}

/// A byte after `expect`ed `b`: what follows it.
fn expect(bytes: &[u8], b: u8) -> Result<&[u8], String> {
    match bytes.split_first() {
        Some((&first, rest)) if first == b => Ok(rest),
        _ => Err(format!("a delta missing {:?}", char::from(b))),
    }
}

/// Fossil's base-64 digits: `0-9A-Z_a-z~`.
fn digit(b: u8) -> Option<u32> {
    Some(u32::from(match b {
        b'0'..=b'9' => b - b'0',
        b'A'..=b'Z' => b - b'A' + 10,
        b'_' => 36,
        b'a'..=b'z' => b - b'a' + 37,
        b'~' => 63,
        _ => return None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The delta from `from` to `to`, as the gateway makes it: note the
    /// crate's order, target first (`delta(target, source)`).
    fn make(from: impl AsRef<[u8]>, to: impl AsRef<[u8]>) -> Vec<u8> {
        fossil_delta::delta(to, from)
    }

    fn raw(text: &str) -> Box<RawValue> {
        RawValue::from_string(text.to_owned()).unwrap_or_else(|e| panic!("{e}"))
    }

    fn full(text: &str) -> Body<'_> {
        Body::Full {
            bytes: Cow::Borrowed(text.as_bytes()),
            binary: false,
            base: true,
        }
    }

    fn delta(bytes: Vec<u8>) -> Body<'static> {
        Body::Delta {
            bytes: Cow::Owned(bytes),
            binary: false,
        }
    }

    /// A scoreboard of a few KiB where one score changes per update.
    fn board(round: u32) -> String {
        let teams: Vec<String> = (0..60)
            .map(|t| {
                let score = if t == round % 60 { round * 7 } else { t * 3 };
                format!(r#"{{"team":"team-{t:02}","name":"Équipe {t}","score":{score}}}"#)
            })
            .collect();
        format!(r#"{{"round":{round},"teams":[{}]}}"#, teams.join(","))
    }

    #[test]
    fn a_delta_chain_rebuilds_every_payload() {
        let mut base = None;
        let first = board(0);
        let data = open(&mut base, true, 1, full(&first)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(data, Data::Json(raw(&first)));
        let mut previous = first;
        for seq in 2..=20u32 {
            let next = board(seq);
            let d = make(&previous, &next);
            assert!(d.len() < next.len() / 4, "{} of {}", d.len(), next.len());
            let data =
                open(&mut base, true, u64::from(seq), delta(d)).unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(data, Data::Json(raw(&next)), "seq {seq}");
            previous = next;
        }
    }

    #[test]
    fn the_json_delta_string_is_one_char_per_byte() {
        // Non-ASCII text in the literal part: its UTF-8 bytes travel as
        // chars U+0080..U+00FF, which JSON writes as two UTF-8 bytes each.
        let (a, b) = (r#"{"name":"Zoë","n":1}"#, r#"{"name":"Zoë Ünal","n":2}"#);
        let d = make(a, b);
        let text: String = d.iter().map(|&b| char::from(b)).collect();
        let json = serde_json::to_string(&text).unwrap_or_else(|e| panic!("{e}"));
        let back: String = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}"));
        let bytes = delta_bytes(&back).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bytes, d);
        let mut base = None;
        open(&mut base, true, 7, full(a)).unwrap_or_else(|e| panic!("{e:?}"));
        let data = open(&mut base, true, 8, delta(bytes)).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(data.json().map(RawValue::get), Some(b));
        assert!(delta_bytes("\u{100}").is_err());
    }

    #[test]
    fn a_delta_needs_the_previous_seq_as_its_base() {
        let (a, b) = (board(1), board(2));
        let d = make(&a, &b);
        let mut base = None;
        let no_base = open(&mut base, true, 2, delta(d.clone()));
        assert!(matches!(no_base, Err(Unusable::Delta(_))), "{no_base:?}");
        open(&mut base, true, 1, full(&a)).unwrap_or_else(|e| panic!("{e:?}"));
        let skipped = open(&mut base, true, 3, delta(d.clone()));
        assert!(matches!(skipped, Err(Unusable::Delta(_))), "{skipped:?}");
        // A plain `data` (a replay) drops the base too.
        open(&mut base, true, 1, full(&a)).unwrap_or_else(|e| panic!("{e:?}"));
        let replayed = raw(&a);
        open(&mut base, true, 1, Body::Json(&replayed)).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(matches!(
            open(&mut base, true, 2, delta(d.clone())),
            Err(Unusable::Delta(_))
        ));
        // Without deltas asked for, nothing is kept.
        open(&mut base, false, 1, full(&a)).unwrap_or_else(|e| panic!("{e:?}"));
        assert!(base.is_none());
    }

    #[test]
    fn binary_payloads_are_bytes_and_may_be_a_base() {
        let a: Vec<u8> = (0..=255u8).cycle().take(2000).collect();
        let mut b = a.clone();
        b[1000] = 0;
        b[1500] = 0xff;
        let mut base = None;
        let first = Body::Full {
            bytes: Cow::Borrowed(&a),
            binary: true,
            base: true,
        };
        let data = open(&mut base, true, 1, first).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(data.binary(), Some(&a[..]));
        let d = Body::Delta {
            bytes: Cow::Owned(make(&a, &b)),
            binary: true,
        };
        let data = open(&mut base, true, 2, d).unwrap_or_else(|e| panic!("{e:?}"));
        assert_eq!(data, Data::Binary(Bytes::from(b)));
        assert_eq!(
            base64_decode("AP+A").unwrap_or_default(),
            vec![0x00, 0xff, 0x80]
        );
        assert!(base64_decode("not base64!").is_err());
        assert_eq!(
            Data::Binary(Bytes::from_static(&[0, 255])).to_string(),
            "\"AP8=\""
        );
    }

    #[test]
    fn a_corrupt_delta_is_refused_without_a_panic() {
        let (a, b) = (board(1), board(2));
        let good = make(&a, &b);
        assert_eq!(
            apply(a.as_bytes(), &good).ok(),
            Some(b.clone().into_bytes())
        );
        // Every truncation, and every byte changed to each command
        // character and to a digit: refused or (if it still reads) the
        // checksum decides; never a panic.
        for end in 0..good.len() {
            assert!(apply(a.as_bytes(), &good[..end]).is_err(), "cut at {end}");
        }
        for i in 0..good.len() {
            for c in [b'@', b':', b';', b',', b'\n', b'~', b'0', 0x80, 0xb0] {
                let mut bad = good.clone();
                bad[i] = c;
                let _ = apply(a.as_bytes(), &bad);
            }
        }
        for bad in [
            &b""[..],
            b"\n",
            b"~~~~~~\n0;",
            b"3\n3@0,0;",
            b"3\n3@zz,",
            b"3\n9:ab",
            b"1\n1:a",
            b"1\n1:a;",
            b"0\n0;x",
        ] {
            assert!(
                apply(b"abc", bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // A checksum that does not match.
        let mut wrong = good.clone();
        let at = wrong.len() - 2;
        wrong[at] = if wrong[at] == b'0' { b'1' } else { b'0' };
        assert!(apply(a.as_bytes(), &wrong).is_err());
    }
}
