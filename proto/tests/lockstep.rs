//! The JSON protocol and `herald.proto` describe the same messages: for every
//! op, the JSON keys (besides `op`) are exactly the fields of the protobuf
//! message of that name, and the JSON form converts to a protobuf message that
//! survives an encode/decode round trip.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::collections::BTreeSet;

use prost::Message;
use proto::json::{PresenceMember, PresencePage};
use proto::{Command, ErrorCode, ServerMessage};
use serde_json::Value;
use serde_json::value::RawValue;

const PROTO: &str = include_str!("../proto/herald/v1/herald.proto");

/// Fields the JSON form spells its own way, checked where that form is
/// written: a `msg`'s `binary` and `delta` are written by the gateway's
/// encoder (`gateway/src/frame/msg.rs`: `"binary":true` beside base64
/// data, and `full`/`delta` strings in a delta subscription); HTTP says a
/// publish is binary with its content type.
const PROTO_ONLY: &[(&str, &str)] = &[
    ("Msg", "binary"),
    ("Msg", "delta"),
    ("PublishRequest", "binary"),
    // Until the JSON forms carry them (issue #26, in progress).
    ("Publication", "binary"),
];

/// Field names of `message <name> { ... }` in herald.proto.
fn proto_fields(name: &str) -> BTreeSet<String> {
    let start = PROTO
        .find(&format!("message {name} {{"))
        .unwrap_or_else(|| panic!("message {name} in herald.proto"));
    let body = &PROTO[start..];
    let body = &body[..body.find("\n}").expect("message end")];
    body.lines()
        .skip(1)
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && l.contains('='))
        .map(|l| {
            let decl = l.split('=').next().unwrap_or_default();
            decl.split_whitespace()
                .last()
                .unwrap_or_default()
                .to_owned()
        })
        .filter(|field| !PROTO_ONLY.contains(&(name, field.as_str())))
        .collect()
}

fn json_keys(json: &[u8]) -> (String, BTreeSet<String>) {
    let Value::Object(map) = serde_json::from_slice::<Value>(json).expect("JSON object") else {
        panic!("not an object")
    };
    let op = map["op"].as_str().expect("op").to_owned();
    (op, map.keys().filter(|k| *k != "op").cloned().collect())
}

/// An op or oneof case as its message is named: `presence_diff` ->
/// `PresenceDiff`.
fn capitalised(op: &str) -> String {
    op.split('_')
        .map(|part| {
            let mut c = part.chars();
            c.next()
                .map(|f| f.to_ascii_uppercase().to_string() + c.as_str())
                .unwrap_or_default()
        })
        .collect()
}

/// Every sample's JSON keys are fields of its op's message, and together the
/// samples of an op use every field.
fn assert_fields_covered(samples: &[(String, BTreeSet<String>)]) {
    let mut by_op: std::collections::BTreeMap<&str, BTreeSet<String>> = Default::default();
    for (op, keys) in samples {
        let fields = proto_fields(&capitalised(op));
        assert!(
            keys.is_subset(&fields),
            "keys of `{op}`: {keys:?} not in {fields:?}"
        );
        by_op.entry(op).or_default().extend(keys.iter().cloned());
    }
    for (op, keys) in by_op {
        assert_eq!(keys, proto_fields(&capitalised(op)), "fields of `{op}`");
    }
}

#[test]
fn every_command_matches_its_proto_message() {
    let commands = [
        r#"{"op":"hello","token":"t","resume":"s","data":{"device":"phone"}}"#,
        r#"{"op":"sub","id":1,"topic":"news","since":41,"epoch":"9f3c","data":{"invite":"x"},"delta":true}"#,
        r#"{"op":"unsub","id":2,"topic":"news"}"#,
        r#"{"op":"pub","id":3,"topic":"news","data":{"any":"json"}}"#,
        r#"{"op":"ack","topic":"news","seq":42,"epoch":"9f3c"}"#,
        r#"{"op":"refresh","id":4,"token":"t"}"#,
        r#"{"op":"ping","id":5}"#,
        r#"{"op":"history","id":6,"topic":"news","since":40,"epoch":"9f3c","limit":50,"reverse":true}"#,
        r#"{"op":"presence","id":6,"topic":"room:1","cursor":"YWxpY2U","limit":50}"#,
        r#"{"op":"rpc","id":7,"method":"rooms.create","data":{"name":"x"}}"#,
    ];
    let mut ops = BTreeSet::new();
    for text in commands {
        let (op, keys) = json_keys(text.as_bytes());
        assert_eq!(keys, proto_fields(&capitalised(&op)), "keys of `{op}`");
        let command = Command::decode(text).expect("decodes");
        let pb = command.to_proto();
        let back = proto::v1::ClientCommand::decode(pb.encode_to_vec().as_slice()).expect("pb");
        assert_eq!(pb, back, "`{op}` survives protobuf");
        ops.insert(capitalised(&op));
    }
    // And no case of the oneof is missing from the JSON form.
    let oneof: BTreeSet<String> = proto_fields("ClientCommand")
        .iter()
        .map(|f| capitalised(f))
        .collect();
    assert_eq!(ops, oneof);
}

#[test]
fn every_server_message_matches_its_proto_message() {
    let data = RawValue::from_string(r#"{"any":"json"}"#.to_owned()).expect("raw");
    let info = RawValue::from_string(r#"{"name":"Alice"}"#.to_owned()).expect("raw");
    let members = [
        PresenceMember {
            user: "alice",
            info: Some(&info),
        },
        PresenceMember {
            user: "bob",
            info: None,
        },
    ];
    let messages = [
        ServerMessage::Welcome {
            session: "s",
            ping_ms: 25_000,
            resumed: false,
            expires: Some(1_700_000_000),
            reason: Some("other_user"),
        },
        ServerMessage::Ok {
            id: 1,
            topic: Some("news"),
            seq: Some(41),
            epoch: Some("9f3c"),
            recovered: Some(true),
            expires: Some(1_700_000_000),
            data: Some(&data),
            delta: Some(true),
        },
        ServerMessage::Msg {
            topic: "news",
            seq: 42,
            data: &data,
        },
        ServerMessage::Err {
            id: Some(3),
            code: ErrorCode::Forbidden.as_str(),
            message: "no",
            topic: Some("news"),
        },
        ServerMessage::Reset {
            topic: "news",
            epoch: "77ab",
            seq: 130,
        },
        ServerMessage::Reconnect {
            after_ms: 1500,
            reason: "draining",
        },
        ServerMessage::Subscribed {
            topic: "news",
            seq: 41,
            epoch: "9f3c",
            recovered: Some(true),
            reason: "server",
        },
        ServerMessage::History {
            id: 6,
            topic: "news",
            epoch: "9f3c",
            seq: 42,
            publications: &[
                proto::json::HistoryItem {
                    seq: 41,
                    data: proto::json::ItemData::Binary(b"\x00\xff"),
                },
                proto::json::HistoryItem {
                    seq: 42,
                    data: proto::json::ItemData::Json(&data),
                },
            ],
        },
        ServerMessage::Unsubscribed {
            topic: "news",
            reason: "server",
        },
        ServerMessage::PresencePage {
            id: 6,
            page: PresencePage {
                topic: "room:1",
                position: 17,
                users: 2,
                connections: 3,
                members: &members,
                cursor: Some("Ym9i"),
            },
        },
        ServerMessage::PresenceDiff {
            topic: "room:1",
            from: 17,
            to: 19,
            joins: Some(&members[..1]),
            leaves: Some(&["bob"]),
            users: 2,
            connections: 2,
        },
    ];
    // Several forms of one op (`ok` answers `sub`, `history` and `presence`,
    // and comes unasked): each has only keys of the op's message, and
    // together all.
    let mut ops = BTreeSet::new();
    let mut samples = Vec::new();
    for message in &messages {
        let (op, keys) = json_keys(&message.to_json());
        samples.push((op.clone(), keys));
        let pb = message.to_proto();
        let back = proto::v1::ServerMessage::decode(pb.encode_to_vec().as_slice()).expect("pb");
        assert_eq!(pb, back, "`{op}` survives protobuf");
        ops.insert(capitalised(&op));
    }
    assert_fields_covered(&samples);
    // And no case of the oneof is missing from the JSON form.
    let oneof: BTreeSet<String> = proto_fields("ServerMessage")
        .iter()
        .map(|f| capitalised(f))
        .collect();
    assert_eq!(ops, oneof);
}

#[test]
fn publish_api_matches_its_proto_messages() {
    let body = br#"{"topic":"news","data":{"x":1},"idempotency_key":"order-17"}"#;
    let (_, keys) = {
        let Value::Object(map) = serde_json::from_slice::<Value>(body).expect("json") else {
            panic!()
        };
        ((), map.keys().cloned().collect::<BTreeSet<_>>())
    };
    assert_eq!(keys, proto_fields("PublishRequest"));
    let request = proto::json::PublishRequest::decode(body).expect("decodes");
    let pb = request.to_proto();
    assert_eq!(pb.idempotency_key.as_deref(), Some("order-17"));
    assert_eq!(pb.data, br#"{"x":1}"#);
    let back = proto::v1::PublishRequest::decode(pb.encode_to_vec().as_slice()).expect("pb");
    assert_eq!(pb, back, "the publish request survives protobuf");
    let answer = serde_json::to_vec(&proto::json::PublishResponse {
        seq: 42,
        epoch: "9f3c".into(),
    })
    .expect("json");
    let Value::Object(map) = serde_json::from_slice::<Value>(&answer).expect("json") else {
        panic!()
    };
    assert_eq!(
        map.keys().cloned().collect::<BTreeSet<_>>(),
        proto_fields("PublishResponse")
    );
}

#[test]
fn disconnect_api_matches_its_proto_message() {
    let body = br#"{"user":"alice"}"#;
    let Value::Object(map) = serde_json::from_slice::<Value>(body).expect("json") else {
        panic!()
    };
    assert_eq!(
        map.keys().cloned().collect::<BTreeSet<_>>(),
        proto_fields("DisconnectRequest")
    );
    let request = proto::json::DisconnectRequest::decode(body).expect("decodes");
    assert_eq!(request.user, "alice");
    let missing = proto::json::DisconnectRequest::decode(br#"{"who":"a"}"#).unwrap_err();
    assert_eq!(missing.code, ErrorCode::MissingField);
}

#[test]
fn presence_api_matches_its_proto_messages() {
    let info = RawValue::from_string(r#"{"name":"Alice"}"#.to_owned()).expect("raw");
    let members = [PresenceMember {
        user: "alice",
        info: Some(&info),
    }];
    let page = PresencePage {
        topic: "room:1",
        position: 3,
        users: 1,
        connections: 2,
        members: &members,
        cursor: Some("YWxpY2U"),
    };
    let json = serde_json::to_vec(&page).expect("json");
    let Value::Object(map) = serde_json::from_slice::<Value>(&json).expect("json") else {
        panic!()
    };
    assert_eq!(
        map.keys().cloned().collect::<BTreeSet<_>>(),
        proto_fields("PresenceResponse")
    );
    let pb = page.to_proto();
    assert_eq!(
        pb.members[0].info.as_deref(),
        Some(&br#"{"name":"Alice"}"#[..])
    );
    let stats = proto::json::PresenceStats {
        topic: "room:1".into(),
        position: 3,
        users: 1,
        connections: 2,
    };
    let Value::Object(map) = serde_json::to_value(&stats).expect("json") else {
        panic!()
    };
    assert_eq!(
        map.keys().cloned().collect::<BTreeSet<_>>(),
        proto_fields("PresenceStatsResponse")
    );
    assert_eq!(
        proto_fields("PresenceRequest"),
        ["cursor", "limit", "topic"].map(String::from).into()
    );
    assert_eq!(
        proto_fields("PresenceStatsRequest"),
        ["topic"].map(String::from).into()
    );
}
