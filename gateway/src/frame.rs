//! Server frames, encoded once.
//!
//! A server frame is never masked and never fragmented, so its header is a
//! pure function of opcode and length. Encoding header and payload into one
//! [`Bytes`] lets a publication be written to every subscriber without a copy:
//! the fan-out clones a reference, the writer hands it to `writev`.

use bytes::Bytes;
use proto::ServerMessage;
use router::Publication;

const FIN: u8 = 0x80;
pub const OP_TEXT: u8 = 0x1;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Longest header of an unmasked frame.
const MAX_HEADER: usize = 10;

fn header(out: &mut Vec<u8>, opcode: u8, len: usize) {
    out.push(FIN | opcode);
    if len < 126 {
        out.push(len as u8);
    } else if let Ok(len) = u16::try_from(len) {
        out.push(126);
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        out.push(127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
}

/// One frame of `opcode` carrying the concatenation of `parts`.
pub fn encode(opcode: u8, parts: &[&[u8]]) -> Bytes {
    let len = parts.iter().map(|p| p.len()).sum();
    let mut out = Vec::with_capacity(MAX_HEADER + len);
    header(&mut out, opcode, len);
    for part in parts {
        out.extend_from_slice(part);
    }
    Bytes::from(out)
}

/// A text frame holding `message`.
pub fn message(message: &ServerMessage<'_>) -> Bytes {
    encode(OP_TEXT, &[&message.to_json()])
}

/// The `msg` frame of a publication: what every subscriber receives.
pub fn publication(p: &Publication) -> Bytes {
    let mut prefix = Vec::with_capacity(48 + p.topic.as_str().len());
    proto::json::encode_msg_prefix(&mut prefix, p.topic.as_str(), p.seq);
    encode(OP_TEXT, &[&prefix, &p.data, b"}"])
}

/// A close frame with `code` and `reason`.
pub fn close(code: u16, reason: &str) -> Bytes {
    encode(OP_CLOSE, &[&code.to_be_bytes(), reason.as_bytes()])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_use_the_shortest_length_form() {
        for (len, head) in [
            (0usize, vec![0x81, 0]),
            (125, vec![0x81, 125]),
            (126, vec![0x81, 126, 0, 126]),
            (65535, vec![0x81, 126, 0xff, 0xff]),
            (65536, vec![0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0]),
        ] {
            let frame = encode(OP_TEXT, &[&vec![b'x'; len]]);
            assert_eq!(&frame[..head.len()], &head[..], "len {len}");
            assert_eq!(frame.len(), head.len() + len);
        }
    }
}
