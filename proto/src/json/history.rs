//! The pages of a topic's history: [`HistoryItem`] (with its [`ItemData`],
//! JSON text or bytes) and the HTTP and gRPC [`HistoryResponse`]. Its own
//! module because the `history` reply, `GET /v1/history` and the gRPC
//! `History` answer all carry these items, and a binary item's base64 form is
//! theirs alone.

use serde::Serialize;
use serde_json::value::RawValue;

use crate::v1;

/// One message of a history page, as the `history` reply and the HTTP
/// answer carry it: `{"seq":5,"data":<the JSON text>}`, or for binary data
/// `{"seq":5,"data":"<base64>","binary":true}`.
#[derive(Debug, Clone, Copy)]
pub struct HistoryItem<'a> {
    pub seq: u64,
    pub data: ItemData<'a>,
}

/// A kept message's data, of the kind it was published as.
#[derive(Debug, Clone, Copy)]
pub enum ItemData<'a> {
    /// JSON text, spliced verbatim.
    Json(&'a RawValue),
    /// Bytes (an `application/octet-stream` or gRPC `binary` publish): in
    /// JSON a base64 string (standard alphabet, padded), as the JSON
    /// protocol's `msg` has them; in protobuf the bytes themselves.
    Binary(&'a [u8]),
}

impl Serialize for HistoryItem<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let binary = matches!(self.data, ItemData::Binary(_));
        let mut item = s.serialize_struct("HistoryItem", 2 + usize::from(binary))?;
        item.serialize_field("seq", &self.seq)?;
        match self.data {
            ItemData::Json(data) => item.serialize_field("data", data)?,
            ItemData::Binary(bytes) => {
                item.serialize_field("data", &Base64(bytes))?;
                item.serialize_field("binary", &true)?;
            }
        }
        item.end()
    }
}

/// Bytes serialized as a base64 string, written straight into the output
/// (no `String` of it first).
struct Base64<'a>(&'a [u8]);

impl Serialize for Base64<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use base64::display::Base64Display;
        use base64::engine::general_purpose::STANDARD;
        s.collect_str(&Base64Display::new(self.0, &STANDARD))
    }
}

/// The HTTP history answer (`GET /v1/history`): the `history` reply's
/// keys without `op` and `id`.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryResponse<'a> {
    pub topic: &'a str,
    pub epoch: &'a str,
    pub seq: u64,
    pub publications: &'a [HistoryItem<'a>],
}

impl HistoryResponse<'_> {
    /// The protobuf form (the gRPC `History` answer).
    pub fn to_proto(&self) -> v1::HistoryResponse {
        v1::HistoryResponse {
            topic: self.topic.to_owned(),
            epoch: self.epoch.to_owned(),
            seq: self.seq,
            publications: self
                .publications
                .iter()
                .map(HistoryItem::to_proto)
                .collect(),
        }
    }
}

impl HistoryItem<'_> {
    /// The protobuf form.
    pub fn to_proto(&self) -> v1::Publication {
        let (data, binary) = match self.data {
            ItemData::Json(data) => (data.get().as_bytes(), false),
            ItemData::Binary(bytes) => (bytes, true),
        };
        v1::Publication {
            seq: self.seq,
            data: data.to_vec(),
            binary,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binary_history_item_is_base64_in_json_and_bytes_in_protobuf() {
        let json = RawValue::from_string(r#"{"a": 1}"#.to_owned()).unwrap();
        let bytes = b"\x00\xff\xfeA";
        let items = [
            HistoryItem {
                seq: 4,
                data: ItemData::Json(&json),
            },
            HistoryItem {
                seq: 5,
                data: ItemData::Binary(bytes),
            },
        ];
        assert_eq!(
            serde_json::to_string(&items).unwrap(),
            r#"[{"seq":4,"data":{"a": 1}},{"seq":5,"data":"AP/+QQ==","binary":true}]"#
        );
        let pb = items[1].to_proto();
        assert_eq!((pb.seq, &pb.data[..]), (5, &bytes[..]));
        assert!(pb.binary && !items[0].to_proto().binary);
    }
}
