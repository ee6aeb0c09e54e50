//! Frame scripts: a list of frames decoded from fuzz bytes, written out
//! as a client would (or would not) write them, and the model of what
//! RFC 6455 and Herald's rules say they give.

use bytes::Bytes;

use super::{FIN, OP_CLOSE, OP_CONTINUATION, OP_PING, OP_PONG, OP_TEXT, Outcome, Rng, close_error};
use crate::session::parser::{FrameError, Parsed};

/// The most payload bytes a script makes: enough for every length form and
/// for the reader's direct reads, few enough for thousands of runs a second.
const SCRIPT_BYTES: usize = 128 * 1024;

/// How a frame's length is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Form {
    /// As RFC 6455 asks: the fewest bytes.
    Shortest,
    /// In 16 bits if it fits (in 64 otherwise), whatever the length.
    Bits16,
    /// In 64 bits, whatever the length.
    Bits64,
    /// In 64 bits, with the most significant bit set, which is never valid.
    TopBit,
}

impl Form {
    /// The 7-bit length field of the second header byte.
    fn field(self, len: usize) -> u8 {
        match self {
            Form::Shortest if len < 126 => len as u8,
            Form::Shortest | Form::Bits16 if len <= 0xFFFF => 126,
            _ => 127,
        }
    }
}

/// A client frame: `first` is FIN, RSV and opcode.
pub(super) fn client_frame(first: u8, payload: &[u8], mask: [u8; 4], form: Form) -> Vec<u8> {
    frame_with(first, true, payload, mask, form)
}

fn frame_with(first: u8, masked: bool, payload: &[u8], mask: [u8; 4], form: Form) -> Vec<u8> {
    let len = payload.len();
    let field = form.field(len);
    let mut out = Vec::with_capacity(14 + len);
    out.push(first);
    out.push(field | if masked { 0x80 } else { 0 });
    match field {
        126 => out.extend_from_slice(&(len as u16).to_be_bytes()),
        127 => {
            let top = if form == Form::TopBit { 1 << 63 } else { 0 };
            out.extend_from_slice(&(len as u64 | top).to_be_bytes());
        }
        _ => {}
    }
    if masked {
        out.extend_from_slice(&mask);
        out.extend(payload.iter().zip(mask.iter().cycle()).map(|(b, m)| b ^ m));
    } else {
        out.extend_from_slice(payload);
    }
    out
}

/// A list of frames, decoded from fuzz bytes. Each frame is: its first byte
/// (FIN, RSV, opcode) as is; a byte of flags (`0x80`: unmasked, `0x60`: the
/// length [`Form`], `0x1F`: how the payload is made); the payload's
/// description; the mask. Payloads are a literal (a length byte, then the
/// bytes), a repeated byte (a 16-bit count times 1, 2, 5 or 17, within
/// [`SCRIPT_BYTES`] in all), text of a
/// few characters of each UTF-8 length, or a close code and a literal reason.
/// Missing bytes read as zero, so any input is a script.
pub(super) struct Script {
    pub(super) frames: Vec<ScriptFrame>,
}

pub(super) struct ScriptFrame {
    first: u8,
    masked: bool,
    form: Form,
    /// Unmasked.
    payload: Vec<u8>,
    mask: [u8; 4],
}

struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn byte(&mut self) -> u8 {
        let (&b, rest) = self.0.split_first().unwrap_or((&0, &[]));
        self.0 = rest;
        b
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let (now, later) = self.0.split_at(n.min(self.0.len()));
        self.0 = later;
        now.to_vec()
    }
}

impl Script {
    pub(super) fn decode(data: &[u8]) -> Self {
        let mut cursor = Cursor(data);
        let mut frames = Vec::new();
        let mut total = 0;
        while !cursor.0.is_empty() && frames.len() < 256 && total < SCRIPT_BYTES {
            let first = cursor.byte();
            let flags = cursor.byte();
            let form = [Form::Shortest, Form::Bits16, Form::Bits64, Form::TopBit]
                [usize::from(flags >> 5 & 3)];
            let payload = match flags & 0x1F {
                0..=15 => {
                    let n = cursor.byte();
                    cursor.take(usize::from(n))
                }
                16..=23 => {
                    let count = u16::from_le_bytes([cursor.byte(), cursor.byte()]);
                    let times = [1, 2, 5, 17][usize::from(flags & 3)];
                    let len = (usize::from(count) * times).min(SCRIPT_BYTES - total);
                    vec![cursor.byte(); len]
                }
                24..=29 => {
                    let count = usize::from(cursor.byte()) * 8;
                    let mut rng = Rng(u32::from(cursor.byte()) | 0x100);
                    let chars = ["a", "é", "€", "😀"];
                    (0..count)
                        .flat_map(|_| chars[rng.next() as usize % 4].bytes())
                        .collect()
                }
                _ => {
                    let mut payload = vec![cursor.byte(), cursor.byte()];
                    let n = cursor.byte();
                    payload.extend(cursor.take(usize::from(n)));
                    payload
                }
            };
            let mask = [cursor.byte(), cursor.byte(), cursor.byte(), cursor.byte()];
            total += payload.len();
            frames.push(ScriptFrame {
                first,
                masked: flags & 0x80 == 0,
                form,
                payload,
                mask,
            });
        }
        Self { frames }
    }

    /// What RFC 6455 and Herald's rules say the frames give, applied to the
    /// frames as written, in the order the parser promises to check them: a
    /// frame's header first (bits, opcode, mask, control frame rules, length),
    /// then its place in a message, then its payload.
    pub(super) fn model(&self, max: usize) -> Outcome {
        let mut events = Vec::new();
        let mut message: Option<Vec<u8>> = None;
        // The message's bytes before this are whole characters, checked.
        let mut checked = 0;
        for frame in &self.frames {
            let opcode = frame.first & 0x0F;
            let fin = frame.first & FIN != 0;
            let control = opcode & 0x8 != 0;
            let len = frame.payload.len();
            let payload = &frame.payload;
            let error = if frame.first & 0x70 != 0 {
                Some(FrameError::ReservedBits)
            } else if !matches!(opcode, 0x0..=0x2 | 0x8..=0xA) {
                Some(FrameError::ReservedOpcode(opcode))
            } else if !frame.masked {
                Some(FrameError::Unmasked)
            } else if control && !fin {
                Some(FrameError::FragmentedControl)
            } else if control && frame.form.field(len) > 125 {
                Some(FrameError::LongControl)
            } else if frame.form == Form::TopBit {
                Some(FrameError::LengthTopBit)
            } else if !control && len > max {
                Some(FrameError::TooBig)
            } else {
                None
            };
            if let Some(error) = error {
                return (events, Some(error));
            }
            let text = match opcode {
                OP_CLOSE => {
                    if let Some(error) = close_error(payload) {
                        return (events, Some(error));
                    }
                    events.push(Parsed::Close(Bytes::from(payload.clone())));
                    continue;
                }
                OP_PING => {
                    events.push(Parsed::Ping(Bytes::from(payload.clone())));
                    continue;
                }
                OP_PONG => {
                    events.push(Parsed::Pong(Bytes::from(payload.clone())));
                    continue;
                }
                OP_CONTINUATION => match message.as_mut() {
                    None => return (events, Some(FrameError::StrayContinuation)),
                    Some(text) if text.len() + len > max => {
                        return (events, Some(FrameError::TooBig));
                    }
                    Some(text) => {
                        text.extend_from_slice(payload);
                        text
                    }
                },
                _ if message.is_some() => return (events, Some(FrameError::Interleaved)),
                OP_TEXT => {
                    checked = 0;
                    message.insert(payload.clone())
                }
                _ => return (events, Some(FrameError::Binary)),
            };
            // Refused in the fragment that makes it invalid; a character cut
            // at a fragment's end is fine unless the message ends there.
            match std::str::from_utf8(&text[checked..]) {
                Ok(_) => checked = text.len(),
                Err(e) if e.error_len().is_none() && !fin => checked += e.valid_up_to(),
                Err(_) => return (events, Some(FrameError::InvalidUtf8)),
            }
            if fin {
                let text = message.take().unwrap_or_default();
                events.push(Parsed::Text(Bytes::from(text)));
            }
        }
        (events, None)
    }
}

impl ScriptFrame {
    pub(super) fn encode(&self) -> Vec<u8> {
        frame_with(self.first, self.masked, &self.payload, self.mask, self.form)
    }
}
