//! The JSON form of the protocol: one object per WebSocket text frame.
//!
//! Commands are decoded borrowing from the frame, and `data` stays the client's
//! JSON text ([`RawValue`]): it is validated once and never re-serialised.
//!
//! One module a noun, each re-exported here (the paths are
//! `json::Command`, `json::PublishRequest`, ...): `command` what a client
//! sends, `message` what it is sent, `history` and `presence` the
//! pages of a topic's reads (which the WebSocket reply, the HTTP answer and
//! the gRPC one share), `api` the HTTP API's request and answer bodies.
//! The decoding helpers they share stay here.

mod api;
mod command;
mod history;
mod message;
mod presence;

pub use api::{
    DisconnectRequest, PublishBatchRequest, PublishBatchResponse, PublishError, PublishRequest,
    PublishResponse, PublishResult, SubscriptionRequest,
};
pub use command::{AppCode, Command, CommandError, ErrorCode, MAX_METHOD_BYTES, valid_method};
pub use history::{HistoryItem, HistoryResponse, ItemData};
pub use message::{ServerMessage, encode_msg_head, encode_msg_prefix};
pub use presence::{PresenceMember, PresencePage, PresenceStats};

use serde::Deserialize;
use serde_json::value::RawValue;

/// A JSON value as protobuf carries it: its text, as bytes.
fn json_bytes(value: &RawValue) -> Vec<u8> {
    value.get().as_bytes().to_vec()
}

/// `Some` for any value that is present, `null` included (a plain
/// `Option<&RawValue>` reads `null` as absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// Deserializes a JSON object. serde would also fill a struct from an array
/// of its fields in order (`["sub",1,"news"]`); the protocol speaks objects.
fn from_object<'a, T: Deserialize<'a>>(json: &'a [u8]) -> Result<T, CommandError> {
    let malformed = |message: String| CommandError::new(None, ErrorCode::Malformed, message);
    if json.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(malformed("expected a JSON object".to_owned()));
    }
    serde_json::from_slice(json).map_err(|e| malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_reports_what_is_wrong() {
        let err = Command::decode(r#"{"op":"sub","topic":"a"}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MissingField);
        let err = Command::decode(r#"{"op":"nope","id":7}"#).unwrap_err();
        assert_eq!((err.code, err.id), (ErrorCode::UnknownOp, Some(7)));
        let err = Command::decode("[1,2]").unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let err = Command::decode(r#"{"op":"pub","id":1,"topic":"a"}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MissingField);
        // A struct would also deserialize from an array of its fields.
        let err = Command::decode(r#"["sub",1,"news"]"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let err = PublishRequest::decode(br#" ["news",1]"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let err = PublishRequest::decode(br#"{"topic":"news"}"#).unwrap_err();
        assert_eq!(err.code, ErrorCode::MissingField);
        // null is a value like any other.
        let err = PublishRequest::decode(br#"{"topic":"news","data":1,"idempotency_key":7}"#)
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::Malformed);
        let ok = PublishRequest::decode(br#"{"topic":"news","data":null}"#);
        assert_eq!(
            ok.map(|r| r.data.get().to_owned()).ok().as_deref(),
            Some("null")
        );
        assert!(Command::decode(r#"{"op":"pub","id":1,"topic":"a","data":null}"#).is_ok());
    }
}
