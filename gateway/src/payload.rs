//! A publication's data: the publisher's JSON text, or bytes.
//!
//! The router keeps data opaque: a publication's `data` goes through Redis,
//! history and replay byte for byte. What kind of data it is travels with
//! it, in its first byte: binary data is stored behind one `0x00`, which no
//! JSON text starts with (the gateway validates JSON before it publishes
//! it, and JSON allows only whitespace before a value). So the kind needs no
//! field of its own in the broker's formats, and a history read or a replay
//! on any pod knows it. [`Payload`] is the only way in and out of that form.

use bytes::{BufMut, Bytes, BytesMut};

/// Marks binary data in its stored form.
const BINARY: u8 = 0x00;

/// A view of stored data: what a publisher sent, and of which kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// JSON text, validated when it was published.
    Json(&'a [u8]),
    /// Bytes, published as `application/octet-stream` or gRPC `binary`.
    Binary(&'a [u8]),
}

impl<'a> Payload<'a> {
    /// Reads stored data back.
    pub fn of(stored: &'a [u8]) -> Self {
        match stored.split_first() {
            Some((&BINARY, bytes)) => Payload::Binary(bytes),
            _ => Payload::Json(stored),
        }
    }

    /// The publisher's bytes, whatever their kind.
    pub fn bytes(self) -> &'a [u8] {
        match self {
            Payload::Json(bytes) | Payload::Binary(bytes) => bytes,
        }
    }

    pub fn is_binary(self) -> bool {
        matches!(self, Payload::Binary(_))
    }

    /// The stored form of JSON text the caller has validated: the text
    /// itself.
    pub fn json(text: Bytes) -> Bytes {
        text
    }

    /// The stored form of binary data: one copy, behind the marker.
    pub fn binary(bytes: &[u8]) -> Bytes {
        let mut out = BytesMut::with_capacity(1 + bytes.len());
        out.put_u8(BINARY);
        out.put_slice(bytes);
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_data_keeps_every_byte_and_json_is_stored_as_is() {
        for bytes in [&b""[..], b"\x00", b"\xff\xfe", b"{\"a\":1}", b"\x00\x00x"] {
            let stored = Payload::binary(bytes);
            assert_eq!(Payload::of(&stored), Payload::Binary(bytes));
        }
        let text = Bytes::from_static(b" {\"a\":1}");
        let stored = Payload::json(text.clone());
        assert_eq!(stored, text);
        assert_eq!(Payload::of(&stored), Payload::Json(&text[..]));
        assert!(!Payload::of(b"").is_binary());
    }
}
