//! The per-frame work on the wire, without sockets: unmasking a client
//! payload, encoding the frames the server sends, decoding a client command.
//!
//! `cargo bench -p gateway --bench wire`. Every group sets a throughput, so
//! criterion prints a rate beside each time.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use gateway::frame::{self, Format};
use proto::{Command, ServerMessage};
use router::{Publication, Topic};

/// One large client payload: 1 MiB.
const PAYLOAD: usize = 1 << 20;
const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];

/// Unmasking 1 MiB in place: the routine the session reader uses
/// (fastwebsockets' `unmask`, word at a time), a byte loop, and a plain
/// copy of 1 MiB as the memory-speed reference.
fn unmask(c: &mut Criterion) {
    let mut buf = vec![0x5au8; PAYLOAD];
    let source = vec![0xa5u8; PAYLOAD];
    let mut group = c.benchmark_group("unmask_1MiB");
    group.throughput(Throughput::Bytes(PAYLOAD as u64));
    group.bench_function("reader_unmask", |b| {
        b.iter(|| fastwebsockets::unmask(black_box(&mut buf[..]), black_box(MASK)))
    });
    group.bench_function("byte_loop", |b| {
        b.iter(|| {
            let mask = black_box(MASK);
            for (i, byte) in black_box(&mut buf[..]).iter_mut().enumerate() {
                *byte ^= mask[i & 3];
            }
        })
    });
    group.bench_function("copy_from_slice", |b| {
        b.iter(|| black_box(&mut buf[..]).copy_from_slice(black_box(&source[..])))
    });
    group.finish();
}

/// Encoding the frames the server sends: a publication's `msg` (once per
/// publication, whatever the number of subscribers), a command's `ok` reply,
/// and a pong.
fn encode(c: &mut Criterion) {
    let topic = Topic::parse("chat:lobby").expect("a valid topic");
    // A 1 KiB JSON string as the publication's data.
    let publication = Publication {
        topic,
        epoch: Arc::from("a81f0c3e5d2b9a77"),
        seq: 123_456,
        data: Bytes::from(format!("\"{}\"", "x".repeat(1022))),
    };
    let msg_len =
        frame::publication(Format::WebSocket, &publication, frame::Body::Data).len() as u64;
    let ok = ServerMessage::Ok {
        id: 1,
        topic: Some("news"),
        seq: Some(41),
        epoch: Some("a81f0c3e5d2b9a77"),
        recovered: None,
        expires: None,
        data: None,
        delta: None,
    };
    let ok_len = frame::message(Format::WebSocket, &ok).len() as u64;
    let stamp = 1_234_567_890u64.to_be_bytes();

    let mut group = c.benchmark_group("encode_frame");
    group.throughput(Throughput::Bytes(msg_len));
    group.bench_function("msg_1KiB_publication", |b| {
        b.iter(|| {
            frame::publication(
                Format::WebSocket,
                black_box(&publication),
                frame::Body::Data,
            )
        })
    });
    group.throughput(Throughput::Bytes(ok_len));
    group.bench_function("ok_reply", |b| {
        b.iter(|| frame::message(Format::WebSocket, black_box(&ok)))
    });
    group.throughput(Throughput::Bytes(2 + stamp.len() as u64));
    group.bench_function("pong_8_bytes", |b| {
        b.iter(|| frame::encode(frame::OP_PONG, &[black_box(&stamp[..])]))
    });
    group.finish();
}

/// Decoding a client's `sub`, as docs/protocol.md shows it, plain and with
/// the resume fields.
fn decode(c: &mut Criterion) {
    let sub = r#"{"op":"sub","id":1,"topic":"news"}"#;
    let since = r#"{"op":"sub","id":1,"topic":"news","since":41,"epoch":"9f3c2a1b0d4e5f60"}"#;
    let mut group = c.benchmark_group("decode_command");
    for (name, text) in [("sub", sub), ("sub_since", since)] {
        assert!(matches!(Command::decode(text), Ok(Command::Sub { .. })));
        group.throughput(Throughput::Bytes(text.len() as u64));
        group.bench_function(name, |b| b.iter(|| Command::decode(black_box(text))));
    }
    group.finish();
}

criterion_group!(benches, unmask, encode, decode);
criterion_main!(benches);
