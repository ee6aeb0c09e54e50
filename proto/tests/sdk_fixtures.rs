//! Fixtures for the TypeScript SDK's unit tests (`clients/js/test/fixtures/`),
//! made by the Rust side so that the SDK's hand-written codec and delta
//! decoder are held to what the gateway really sends:
//! - `protobuf.json`: commands and server frames encoded by prost (the
//!   gateway's types), each beside the frame the SDK reads or writes for it;
//! - `fossil.json`: Fossil deltas made by the `fossil-delta` crate (the one
//!   the gateway makes its deltas with), with their source and target.
//!
//! This test writes them with `HERALD_BLESS=1` and otherwise fails on any
//! difference (the messages changed: regenerate, and the SDK's tests say
//! whether it still reads them).

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::path::PathBuf;

use prost::Message;
use proto::v1::{self, client_command::Op as C, server_message::Op as S};
use serde_json::{Value, json};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes in a fixture's frame: `{"$bytes": "<hex>"}` (the SDK's `Uint8Array`).
fn bytes(b: &[u8]) -> Value {
    json!({ "$bytes": hex(b) })
}

fn command(name: &str, op: C, frame: Value) -> Value {
    let encoded = v1::ClientCommand { op: Some(op) }.encode_to_vec();
    json!({ "name": name, "frame": frame, "hex": hex(&encoded) })
}

fn server(name: &str, op: S, frame: Value) -> Value {
    let encoded = v1::ServerMessage { op: Some(op) }.encode_to_vec();
    json!({ "name": name, "frame": frame, "hex": hex(&encoded) })
}

fn commands() -> Vec<Value> {
    vec![
        command(
            "an empty hello",
            C::Hello(v1::Hello::default()),
            json!({ "op": "hello" }),
        ),
        command(
            "a hello with a token, a resume and data",
            C::Hello(v1::Hello {
                token: Some("eyJ.a.b".into()),
                resume: Some("s-1".into()),
                data: Some(br#"{"csrf":"x"}"#.to_vec()),
            }),
            json!({ "op": "hello", "token": "eyJ.a.b", "resume": "s-1", "data": { "csrf": "x" } }),
        ),
        command(
            "a sub",
            C::Sub(v1::Sub {
                id: 1,
                topic: "news".into(),
                ..Default::default()
            }),
            json!({ "op": "sub", "id": 1, "topic": "news" }),
        ),
        command(
            "a sub with since 0, an epoch, data and deltas",
            C::Sub(v1::Sub {
                id: 300,
                topic: "scores:ü".into(),
                since: Some(0),
                epoch: Some("9f3c".into()),
                data: Some(br#"[1,"two",null]"#.to_vec()),
                delta: Some(true),
            }),
            json!({ "op": "sub", "id": 300, "topic": "scores:ü", "since": 0, "epoch": "9f3c", "data": [1, "two", null], "delta": true }),
        ),
        command(
            "an unsub",
            C::Unsub(v1::Unsub {
                id: 2,
                topic: "news".into(),
            }),
            json!({ "op": "unsub", "id": 2, "topic": "news" }),
        ),
        command(
            "a pub",
            C::Pub(v1::Pub {
                id: 3,
                topic: "chat:1".into(),
                data: br#"{"text":"hi"}"#.to_vec(),
            }),
            json!({ "op": "pub", "id": 3, "topic": "chat:1", "data": { "text": "hi" } }),
        ),
        command(
            "an ack with a seq past 2^32 and an epoch",
            C::Ack(v1::Ack {
                topic: "news".into(),
                seq: (1 << 40) + 5,
                epoch: Some("e".into()),
            }),
            json!({ "op": "ack", "topic": "news", "seq": (1u64 << 40) + 5, "epoch": "e" }),
        ),
        command(
            "a refresh",
            C::Refresh(v1::Refresh {
                id: 4,
                token: "t".into(),
            }),
            json!({ "op": "refresh", "id": 4, "token": "t" }),
        ),
        command(
            "a ping of id 0",
            C::Ping(v1::Ping { id: 0 }),
            json!({ "op": "ping", "id": 0 }),
        ),
        command(
            "a presence page",
            C::Presence(v1::Presence {
                id: 5,
                topic: "room:1".into(),
                cursor: Some("c".into()),
                limit: Some(50),
            }),
            json!({ "op": "presence", "id": 5, "topic": "room:1", "cursor": "c", "limit": 50 }),
        ),
        command(
            "a history with every field, reverse false",
            C::History(v1::History {
                id: 6,
                topic: "news".into(),
                since: Some(40),
                epoch: Some("9f3c".into()),
                limit: Some(0),
                reverse: Some(false),
            }),
            json!({ "op": "history", "id": 6, "topic": "news", "since": 40, "epoch": "9f3c", "limit": 0, "reverse": false }),
        ),
        command(
            "an rpc",
            C::Rpc(v1::Rpc {
                id: 7,
                method: "cart.add".into(),
                data: Some(br#"{"sku":"A-1"}"#.to_vec()),
            }),
            json!({ "op": "rpc", "id": 7, "method": "cart.add", "data": { "sku": "A-1" } }),
        ),
        command(
            "an rpc without data",
            C::Rpc(v1::Rpc {
                id: 8,
                method: "ping".into(),
                data: None,
            }),
            json!({ "op": "rpc", "id": 8, "method": "ping" }),
        ),
    ]
}

fn servers() -> Vec<Value> {
    let member = |user: &str, info: Option<&[u8]>| v1::PresenceMember {
        user: user.into(),
        info: info.map(<[u8]>::to_vec),
    };
    vec![
        server(
            "a welcome",
            S::Welcome(v1::Welcome {
                session: "s-1".into(),
                ping_ms: 25_000,
                resumed: false,
                expires: Some(1_700_000_000),
                reason: Some("not_found".into()),
            }),
            json!({ "op": "welcome", "session": "s-1", "ping_ms": 25000, "resumed": false, "expires": 1_700_000_000u64, "reason": "not_found" }),
        ),
        server(
            "the ok of a sub with deltas granted",
            S::Ok(v1::Ok {
                id: 1,
                topic: Some("scores".into()),
                seq: Some(0),
                epoch: Some("9f3c".into()),
                recovered: Some(false),
                delta: Some(true),
                ..Default::default()
            }),
            json!({ "op": "ok", "id": 1, "topic": "scores", "seq": 0, "epoch": "9f3c", "recovered": false, "delta": true }),
        ),
        server(
            "an ok the client did not ask for (id 0)",
            S::Ok(v1::Ok {
                id: 0,
                topic: Some("news".into()),
                seq: Some(42),
                epoch: Some("9f3c".into()),
                reason: Some("server".into()),
                ..Default::default()
            }),
            json!({ "op": "ok", "topic": "news", "seq": 42, "epoch": "9f3c", "reason": "server" }),
        ),
        server(
            "a presence page",
            S::Ok(v1::Ok {
                id: 4,
                topic: Some("room:1".into()),
                position: Some(17),
                users: Some(2),
                connections: Some(3),
                members: vec![
                    member("alice", Some(br#"{"name":"Alice"}"#)),
                    member("bob", None),
                ],
                cursor: Some("c".into()),
                ..Default::default()
            }),
            json!({
                "op": "ok", "id": 4, "topic": "room:1", "position": 17, "users": 2, "connections": 3,
                "members": [{ "user": "alice", "info": { "name": "Alice" } }, { "user": "bob" }], "cursor": "c"
            }),
        ),
        server(
            "a history page with JSON and binary data",
            S::Ok(v1::Ok {
                id: 5,
                topic: Some("news".into()),
                seq: Some(42),
                epoch: Some("9f3c".into()),
                publications: vec![
                    v1::Publication {
                        seq: 41,
                        data: b"1".to_vec(),
                        binary: false,
                    },
                    v1::Publication {
                        seq: 42,
                        data: vec![0x00, 0xff, 0xc3, 0x28],
                        binary: true,
                    },
                ],
                ..Default::default()
            }),
            json!({
                "op": "ok", "id": 5, "topic": "news", "seq": 42, "epoch": "9f3c",
                "publications": [{ "seq": 41, "data": 1 }, { "seq": 42, "data": bytes(&[0x00, 0xff, 0xc3, 0x28]), "binary": true }]
            }),
        ),
        server(
            "the ok of an rpc",
            S::Ok(v1::Ok {
                id: 6,
                data: Some(br#"{"cart":["A-1"]}"#.to_vec()),
                ..Default::default()
            }),
            json!({ "op": "ok", "id": 6, "data": { "cart": ["A-1"] } }),
        ),
        server(
            "a msg",
            S::Msg(v1::Msg {
                topic: "news".into(),
                seq: 42,
                data: br#"{"headline":"h"}"#.to_vec(),
                delta: false,
                binary: false,
            }),
            json!({ "op": "msg", "topic": "news", "seq": 42, "bytes": bytes(br#"{"headline":"h"}"#) }),
        ),
        server(
            "a msg that is a delta, at seq 2^21",
            S::Msg(v1::Msg {
                topic: "scores".into(),
                seq: 1 << 21,
                data: b"5\n3@0,2:xy1Q;".to_vec(),
                delta: true,
                binary: false,
            }),
            json!({ "op": "msg", "topic": "scores", "seq": 1u64 << 21, "bytes": bytes(b"5\n3@0,2:xy1Q;"), "delta": true }),
        ),
        server(
            "a msg with binary data",
            S::Msg(v1::Msg {
                topic: "frames".into(),
                seq: 7,
                data: vec![0x00, 0xff, 0x80, 0x0a],
                delta: false,
                binary: true,
            }),
            json!({ "op": "msg", "topic": "frames", "seq": 7, "bytes": bytes(&[0x00, 0xff, 0x80, 0x0a]), "binary": true }),
        ),
        server(
            "an err with an id",
            S::Err(v1::Err {
                id: Some(3),
                code: "forbidden".into(),
                message: "no".into(),
                topic: Some("news".into()),
            }),
            json!({ "op": "err", "id": 3, "code": "forbidden", "message": "no", "topic": "news" }),
        ),
        server(
            "an err without an id",
            S::Err(v1::Err {
                id: None,
                code: "malformed".into(),
                message: "bad".into(),
                topic: None,
            }),
            json!({ "op": "err", "code": "malformed", "message": "bad" }),
        ),
        server(
            "a reset to seq 0",
            S::Reset(v1::Reset {
                topic: "news".into(),
                epoch: "77ab".into(),
                seq: 0,
            }),
            json!({ "op": "reset", "topic": "news", "epoch": "77ab", "seq": 0 }),
        ),
        server(
            "a reconnect",
            S::Reconnect(v1::Reconnect {
                after_ms: 1500,
                reason: "draining".into(),
            }),
            json!({ "op": "reconnect", "after_ms": 1500, "reason": "draining" }),
        ),
        server(
            "a presence diff",
            S::PresenceDiff(v1::PresenceDiff {
                topic: "room:1".into(),
                from: 17,
                to: 19,
                joins: vec![member("carol", None)],
                leaves: vec!["bob".into(), "dave".into()],
                users: 2,
                connections: 2,
            }),
            json!({
                "op": "presence_diff", "topic": "room:1", "from": 17, "to": 19,
                "joins": [{ "user": "carol" }], "leaves": ["bob", "dave"], "users": 2, "connections": 2
            }),
        ),
        server(
            "a presence diff with counts only, from 0",
            S::PresenceDiff(v1::PresenceDiff {
                topic: "room:1".into(),
                from: 0,
                to: 1,
                users: 20_001,
                connections: 20_400,
                ..Default::default()
            }),
            json!({ "op": "presence_diff", "topic": "room:1", "from": 0, "to": 1, "users": 20001, "connections": 20400 }),
        ),
        server(
            "an unsubscribed",
            S::Unsubscribed(v1::Unsubscribed {
                topic: "news".into(),
                reason: "server".into(),
            }),
            json!({ "op": "unsubscribed", "topic": "news", "reason": "server" }),
        ),
    ]
}

/// A 2-4 KiB JSON scoreboard (as the benchmark's state payload), update `n`: a few fields change each time.
fn scoreboard(n: u64) -> Vec<u8> {
    let players: Vec<Value> = (0..50)
        .map(|i| json!({ "name": format!("player {i}"), "score": i * 37 + if i <= n { i * n } else { 0 }, "online": i != n }))
        .collect();
    serde_json::to_vec(&json!({ "round": n, "clock": format!("{}:{:02}", 12 - n / 60, 59 - n % 60), "players": players })).unwrap()
}

/// Bytes of every value, from a fixed seed (xorshift): binary data as a publisher may send it.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

fn fossil() -> Vec<Value> {
    let mut pairs: Vec<(String, Vec<u8>, Vec<u8>)> = Vec::new();
    for n in 1..=6 {
        pairs.push((
            format!("scoreboard update {n}"),
            scoreboard(n - 1),
            scoreboard(n),
        ));
    }
    let a = noise(7, 3001);
    let mut b = a.clone();
    b[100] ^= 0xff;
    b.splice(2000..2010, noise(8, 3));
    b.extend_from_slice(&[0, 0xff, 0]);
    pairs.push((
        "binary, a byte changed, a range replaced, a tail".into(),
        a.clone(),
        b,
    ));
    pairs.push((
        "binary, nothing in common".into(),
        noise(9, 517),
        noise(10, 1030),
    ));
    pairs.push(("from nothing".into(), Vec::new(), br#"{"a":1}"#.to_vec()));
    pairs.push(("to nothing".into(), br#"{"a":1}"#.to_vec(), Vec::new()));
    pairs.push(("the same".into(), scoreboard(3), scoreboard(3)));
    for len in 1..=3 {
        pairs.push((
            format!("a target of {len} byte(s)"),
            b"abcdefgh".to_vec(),
            b"xyz"[..len].to_vec(),
        ));
    }
    pairs
        .into_iter()
        .map(|(name, source, target)| {
            let delta = fossil_delta::delta(&target, &source);
            assert_eq!(fossil_delta::apply(&source, &delta).unwrap(), target, "{name}: the crate applies its own delta");
            json!({ "name": name, "source": hex(&source), "target": hex(&target), "delta": hex(&delta) })
        })
        .collect()
}

#[test]
fn the_sdk_fixtures_are_what_prost_and_fossil_delta_make() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/js/test/fixtures");
    let files = [
        (
            "protobuf.json",
            json!({ "commands": commands(), "frames": servers() }),
        ),
        ("fossil.json", json!({ "vectors": fossil() })),
    ];
    let bless = std::env::var_os("HERALD_BLESS").is_some();
    for (name, value) in files {
        let text = serde_json::to_string_pretty(&value).unwrap() + "\n";
        let path = dir.join(name);
        if bless {
            std::fs::write(&path, &text).unwrap();
            continue;
        }
        let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            checked_in == text,
            "clients/js/test/fixtures/{name} is stale: run `HERALD_BLESS=1 cargo test -p herald-proto --test sdk_fixtures`"
        );
    }
}
