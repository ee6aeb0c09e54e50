//! permessage-deflate (RFC 7692) on `/ws`: negotiated on the upgrade, server
//! messages compressed (once per publication), client messages inflated under
//! a cap. Seen from a raw client (the bits on the wire, bombs) and from
//! Python's `websockets` against the real binary, which offers it by default.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress};
use serde_json::{Value, json};
use testkit::raw::{CONTINUATION, FIN, RSV1, RawClient, TEXT, encode};
use testkit::{Gateway, Herald, process};

use crate::pod::HERALD;

/// What browsers offer.
const OFFER: &str = "permessage-deflate; client_max_window_bits";

/// `data` as a client compresses it: raw deflate, sync flush, tail removed.
fn compress(data: &[u8]) -> Vec<u8> {
    let mut c = Compress::new(Compression::default(), false);
    let mut out = Vec::with_capacity(data.len() / 2 + 4096);
    loop {
        let done = c.total_in() as usize;
        c.compress_vec(&data[done..], &mut out, FlushCompress::Sync)
            .expect("deflate");
        if c.total_in() as usize == data.len() && out.len() < out.capacity() {
            break;
        }
        out.reserve(out.capacity());
    }
    assert!(out.ends_with(&[0, 0, 0xff, 0xff]));
    out.truncate(out.len() - 4);
    out
}

/// A server message's payload, inflated where it came with RSV1.
fn payload(frame: &testkit::raw::Frame) -> Vec<u8> {
    if frame.rsv & RSV1 == 0 {
        return frame.payload.clone();
    }
    let mut input = frame.payload.clone();
    input.extend_from_slice(&[0, 0, 0xff, 0xff]);
    let mut d = Decompress::new(false);
    let mut out = Vec::with_capacity(1 << 20);
    d.decompress_vec(&input, &mut out, FlushDecompress::Sync)
        .expect("the server's frame inflates");
    out
}

async fn connect(gw: &Gateway) -> RawClient {
    let (client, head) = RawClient::connect_offering(gw.addr, Some(OFFER)).await;
    let answer = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("sec-websocket-extensions")
                .then(|| value.trim().to_owned())
        })
        .unwrap_or_else(|| panic!("no extension answered:\n{head}"));
    assert_eq!(
        answer,
        "permessage-deflate; server_no_context_takeover; client_no_context_takeover"
    );
    client
}

async fn json_frame(client: &mut RawClient) -> (bool, Value) {
    let frame = client.next_frame().await.expect("a frame");
    assert!(
        frame.fin && !frame.masked && frame.opcode == TEXT,
        "{frame:?}"
    );
    let compressed = frame.rsv == RSV1;
    let value = serde_json::from_slice(&payload(&frame)).expect("JSON");
    (compressed, value)
}

#[tokio::test]
async fn a_compressed_session_gets_large_frames_compressed_and_small_ones_plain() {
    let gw = Gateway::start().await;
    let mut client = connect(&gw).await;
    // A compressed command, whole, then another in fragments (RSV1 on the
    // first only, a ping between them).
    let hello = compress(br#"{"op":"hello"}"#);
    client
        .send_bytes(&encode(FIN | RSV1 | TEXT, &hello, true))
        .await;
    let (compressed, welcome) = json_frame(&mut client).await;
    assert_eq!(welcome["op"], "welcome");
    assert!(!compressed, "a welcome is under min_bytes");
    let sub = compress(br#"{"op":"sub","id":1,"topic":"chat:zip"}"#);
    let (a, b) = sub.split_at(sub.len() / 2);
    client.send_bytes(&encode(RSV1 | TEXT, a, true)).await;
    client.send_bytes(&encode(FIN | 0x9, b"p", true)).await;
    client
        .send_bytes(&encode(FIN | CONTINUATION, b, true))
        .await;
    let pong = client.next_frame().await.expect("the pong");
    assert_eq!(
        (pong.opcode, pong.rsv),
        (0xA, 0),
        "control frames never compressed"
    );
    let (_, ok) = json_frame(&mut client).await;
    assert_eq!(
        (ok["op"].as_str(), ok["id"].as_u64()),
        (Some("ok"), Some(1))
    );

    let large = json!({"players": (0..60).map(|i| json!({"name": format!("player {i}"), "score": i * 37})).collect::<Vec<_>>()});
    gw.publish("chat:zip", large.clone()).await;
    gw.publish("chat:zip", json!({"n": 1})).await;
    let (compressed, msg) = json_frame(&mut client).await;
    assert!(compressed, "a large publication comes compressed");
    assert_eq!((msg["seq"].as_u64(), &msg["data"]), (Some(1), &large));
    let (compressed, msg) = json_frame(&mut client).await;
    assert!(!compressed, "a small one does not");
    assert_eq!(msg["data"], json!({"n": 1}));
    assert!(gw.metric("herald_deflate_compressions_total").await >= 1.0);
    gw.shutdown().await;
}

#[tokio::test]
async fn bombs_close_with_1009_and_misplaced_rsv1_with_1002() {
    let mut config = Gateway::config();
    config.websocket.max_message_bytes = 64 * 1024;
    let gw = Gateway::with(config).await;
    // 16 MiB of zeros in about 16 KiB: under the message limit on the wire.
    let bomb = compress(&vec![b' '; 16 << 20]);
    assert!(bomb.len() < 64 * 1024);

    // One frame.
    let mut client = connect(&gw).await;
    client
        .send_bytes(&encode(FIN | RSV1 | TEXT, &bomb, true))
        .await;
    client.expect_close(1009).await;
    // In fragments.
    let mut client = connect(&gw).await;
    let chunks: Vec<&[u8]> = bomb.chunks(512).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let first = if i == 0 { RSV1 | TEXT } else { CONTINUATION };
        let fin = if i + 1 == chunks.len() { FIN } else { 0 };
        client.send_bytes(&encode(fin | first, chunk, true)).await;
    }
    client.expect_close(1009).await;
    // Many small ones: each under the cap is a command (whitespace around
    // a hello); one past it closes.
    let mut client = connect(&gw).await;
    let mut padded = vec![b' '; 60 * 1024];
    padded.extend_from_slice(br#"{"op":"hello"}"#);
    let small = compress(&padded);
    client
        .send_bytes(&encode(FIN | RSV1 | TEXT, &small, true))
        .await;
    assert_eq!(json_frame(&mut client).await.1["op"], "welcome");
    for _ in 0..5 {
        let ping = br#"{"op":"ping"}"#;
        let mut padded = vec![b' '; 60 * 1024];
        padded.extend_from_slice(ping);
        client
            .send_bytes(&encode(FIN | RSV1 | TEXT, &compress(&padded), true))
            .await;
    }
    let over = compress(&vec![b' '; 64 * 1024 + 1]);
    client
        .send_bytes(&encode(FIN | RSV1 | TEXT, &over, true))
        .await;
    loop {
        let frame = client.next_frame().await.expect("frames, then the close");
        if frame.opcode == 0x8 {
            assert_eq!(frame.close_code(), 1009);
            break;
        }
    }
    assert!(
        gw.metric("herald_deflate_refused_total{reason=\"too_big\"}")
            .await
            >= 3.0
    );

    // RSV1 on a continuation, and on a control frame.
    let mut client = connect(&gw).await;
    client.send_bytes(&encode(TEXT, b"{", true)).await;
    client
        .send_bytes(&encode(FIN | RSV1 | CONTINUATION, &compress(b"}"), true))
        .await;
    client.expect_close(1002).await;
    let mut client = connect(&gw).await;
    client
        .send_bytes(&encode(FIN | RSV1 | 0x9, b"", true))
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn compression_off_answers_no_extension_and_rsv1_is_refused() {
    let mut config = Gateway::config();
    config.websocket.compression.enabled = false;
    let gw = Gateway::with(config).await;
    let (mut client, head) = RawClient::connect_offering(gw.addr, Some(OFFER)).await;
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("sec-websocket-extensions"),
        "{head}"
    );
    client
        .send_bytes(&encode(
            FIN | RSV1 | TEXT,
            &compress(br#"{"op":"hello"}"#),
            true,
        ))
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

/// Longest the script may run (its own waits are 10 s each).
const SCRIPT_WAIT: Duration = Duration::from_secs(60);

fn python(args: &[&str], timeout: Duration) -> Output {
    process::run(
        "python3",
        args,
        timeout,
        "the deflate test needs python3 with the `websockets` package; run the project's test script (scripts/test.sh), which installs them",
    )
}

#[tokio::test]
async fn python_websockets_negotiates_deflate_with_the_binary() {
    let herald = Herald::start(
        HERALD,
        &[("HERALD_NAMESPACES__CHAT__PUBLISH", "authenticated")],
        &[],
    )
    .await;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/deflate.py");
    let script = script.to_str().expect("a UTF-8 path").to_owned();
    let (ws_url, http_url) = (herald.ws_url(), herald.http_url());
    let output =
        tokio::task::spawn_blocking(move || python(&[&script, &ws_url, &http_url], SCRIPT_WAIT))
            .await
            .expect("script");
    assert!(
        output.status.success() && String::from_utf8_lossy(&output.stdout).contains("deflate: ok"),
        "deflate.py failed\n{}",
        process::show(&output)
    );
    drop(herald);
}
