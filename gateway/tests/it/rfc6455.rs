//! RFC 6455 conformance, seen from the wire.
//!
//! A hand-written client speaks raw bytes over TCP, so that it can do what a
//! library client never would: send unmasked frames, bad UTF-8, reserved
//! bits, stray continuations, oversized and endless fragmented messages. Each
//! test tells one rule of the protocol and checks the server's answer to the
//! byte: the close code it sends, and that it then really ends the TCP
//! connection. Every wait is bounded, so a server that hangs fails fast.

// A test that cannot go on should stop and say why.

use serde_json::json;
use testkit::Gateway;
use testkit::raw::{BINARY, CLOSE, CONTINUATION, FIN, PING, PONG, RSV1, RawClient, TEXT, encode};

/// The message size limit the size tests configure.
const LIMIT: usize = 1024;

/// A gateway whose messages are limited to [`LIMIT`] bytes.
async fn small_gateway() -> Gateway {
    let mut config = Gateway::config();
    config.websocket.max_message_bytes = LIMIT;
    Gateway::with(config).await
}

#[tokio::test]
async fn an_unmasked_client_frame_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // RFC 6455 5.1: a server MUST close the connection on an unmasked frame.
    client
        .send_frame(true, TEXT, br#"{"op":"hello"}"#, false)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn an_unmasked_close_frame_is_a_protocol_error_too() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // Not a clean close: the frame breaks 5.1 like any other unmasked frame.
    client
        .send_frame(true, CLOSE, &1000u16.to_be_bytes(), false)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn text_that_is_not_utf8_closes_with_1007() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(true, TEXT, &[0xff, 0xfe], true).await;
    client.expect_close(1007).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn bad_utf8_in_a_fragment_closes_with_1007_before_the_message_ends() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(false, TEXT, br#"{"op":"#, true).await;
    client
        .send_frame(false, CONTINUATION, b"\"h\xff", true)
        .await;
    // No final fragment: the server checks UTF-8 as fragments arrive.
    client.expect_close(1007).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_character_split_across_fragments_is_accepted() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_text(r#"{"op":"hello"}"#).await;
    assert_eq!(client.read_frame().await.json()["op"], "welcome");
    client
        .send_text(r#"{"op":"sub","id":1,"topic":"chat:lobby"}"#)
        .await;
    assert_eq!(client.read_frame().await.json()["op"], "ok");

    // "€" is E2 82 AC: the first fragment ends inside it.
    let command = r#"{"op":"pub","id":2,"topic":"chat:lobby","data":"5 €"}"#.as_bytes();
    let split = command
        .iter()
        .position(|&b| b == 0xe2)
        .expect("the euro sign")
        + 1;
    client
        .send_frame(false, TEXT, &command[..split], true)
        .await;
    client
        .send_frame(true, CONTINUATION, &command[split..], true)
        .await;

    // The publisher is subscribed too: its `ok` and the `msg`, in either order.
    let (mut ok, mut msg) = (None, None);
    for _ in 0..2 {
        let frame = client.read_frame().await;
        frame.assert_plain();
        let message = frame.json();
        match message["op"].as_str() {
            Some("ok") => ok = Some(message),
            Some("msg") => msg = Some(message),
            _ => panic!("unexpected {message}"),
        }
    }
    assert_eq!(ok.expect("the pub's ok")["id"], 2);
    assert_eq!(msg.expect("the msg")["data"], "5 €");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_frame_over_the_size_limit_closes_with_1009() {
    let gw = small_gateway().await;
    let mut client = RawClient::connect(gw.addr).await;

    // A command of exactly LIMIT bytes is fine.
    let head = r#"{"op":"pub","id":1,"topic":"chat:lobby","data":""#;
    let tail = r#""}"#;
    let at_limit = format!(
        "{head}{}{tail}",
        "x".repeat(LIMIT - head.len() - tail.len())
    );
    assert_eq!(at_limit.len(), LIMIT);
    client.send_text(&at_limit).await;
    assert_eq!(client.read_frame().await.json()["op"], "welcome");
    let ok = client.read_frame().await.json();
    assert_eq!(
        (ok["op"].as_str(), ok["id"].as_u64()),
        (Some("ok"), Some(1)),
        "{ok}"
    );

    // One byte more is not.
    client
        .send_frame(true, TEXT, &[b' '; LIMIT + 1], true)
        .await;
    client.expect_close(1009).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn many_small_fragments_over_the_size_limit_close_with_1009() {
    let gw = small_gateway().await;
    let mut client = RawClient::connect(gw.addr).await;
    // A message meant to be 100 fragments of 100 bytes (10x the limit). Each
    // fragment is small; only their sum is too big.
    let fragment = [b' '; 100];
    client.send_frame(false, TEXT, &fragment, true).await;
    let mut sent = fragment.len();
    while sent <= LIMIT {
        client
            .send_frame(false, CONTINUATION, &fragment, true)
            .await;
        sent += fragment.len();
    }
    assert!(sent < 100 * fragment.len());
    // The server counts as the fragments come: it closes while the message is
    // still open, without waiting for the other ~90 fragments.
    client.expect_close(1009).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_ping_between_fragments_is_answered_at_once() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(false, TEXT, br#"{"op""#, true).await;
    // RFC 6455 5.4: control frames may be injected in the middle of a message.
    client.send_frame(true, PING, b"mid-message", true).await;
    let pong = client.read_frame().await;
    pong.assert_plain();
    assert_eq!(pong.opcode, PONG);
    assert_eq!(pong.payload, b"mid-message");

    client
        .send_frame(false, CONTINUATION, br#":"hel"#, true)
        .await;
    client
        .send_frame(true, CONTINUATION, br#"lo"}"#, true)
        .await;
    let welcome = client.read_frame().await;
    welcome.assert_plain();
    assert_eq!(welcome.json()["op"], "welcome");
    gw.shutdown().await;
}

#[tokio::test]
async fn the_close_handshake_is_echoed_then_tcp_ends() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_text(r#"{"op":"hello"}"#).await;
    assert_eq!(client.read_frame().await.json()["op"], "welcome");

    let mut close = 1000u16.to_be_bytes().to_vec();
    close.extend_from_slice(b"bye");
    client.send_frame(true, CLOSE, &close, true).await;
    // RFC 6455 5.5.1: the server answers with a close frame, then (7.1.1) the
    // server is the one to close TCP.
    client.expect_close(1000).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_close_code_reserved_for_local_use_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // 1005 "no status" must never appear on the wire (RFC 6455 7.4.1).
    client
        .send_frame(true, CLOSE, &1005u16.to_be_bytes(), true)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_binary_frame_closes_with_1003() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client
        .send_frame(true, BINARY, br#"{"op":"hello"}"#, true)
        .await;
    client.expect_close(1003).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_continuation_without_a_start_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client
        .send_frame(true, CONTINUATION, br#"{"op":"hello"}"#, true)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_new_message_inside_a_fragmented_one_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_frame(false, TEXT, br#"{"op":"#, true).await;
    client
        .send_frame(true, TEXT, br#"{"op":"hello"}"#, true)
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_reserved_bit_without_an_extension_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // No extension was negotiated, so RSV1 must be 0 (RFC 6455 5.2).
    client
        .send_bytes(&encode(FIN | RSV1 | TEXT, br#"{"op":"hello"}"#, true))
        .await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn a_fragmented_control_frame_is_a_protocol_error() {
    let gw = Gateway::start().await;
    let mut client = RawClient::connect(gw.addr).await;
    // RFC 6455 5.5: control frames MUST NOT be fragmented.
    client.send_frame(false, PING, b"half", true).await;
    client.expect_close(1002).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn server_frames_are_final_and_unmasked() {
    const BIG: usize = 100_000;
    let mut config = Gateway::config();
    config.websocket.max_message_bytes = 2 * BIG;
    config.http.max_body_bytes = 2 * BIG;
    config.queue.bytes = 8 * BIG;
    let gw = Gateway::with(config).await;
    let mut client = RawClient::connect(gw.addr).await;

    client.send_text(r#"{"op":"hello"}"#).await;
    let welcome = client.read_frame().await;
    welcome.assert_plain();
    assert_eq!(welcome.json()["op"], "welcome");

    client
        .send_text(r#"{"op":"sub","id":1,"topic":"news"}"#)
        .await;
    let ok = client.read_frame().await;
    ok.assert_plain();
    assert_eq!(ok.json()["op"], "ok");

    // Over 65535 bytes: the 64-bit length form, still one frame.
    let data = "y".repeat(BIG);
    let body = json!({"topic": "news", "data": data}).to_string();
    let (status, answer) =
        testkit::http(gw.addr, "POST", "/v1/publish", &[], body.as_bytes()).await;
    assert_eq!(status, 200, "publish: {answer}");
    let msg = client.read_frame().await;
    msg.assert_plain();
    assert_eq!(
        msg.extended_len,
        8,
        "a {}-byte payload needs the 64-bit length",
        msg.payload.len()
    );
    assert!(msg.payload.len() > BIG);
    let msg = msg.json();
    assert_eq!(msg["op"], "msg");
    assert_eq!(msg["data"].as_str().map(str::len), Some(BIG));

    client.send_frame(true, PING, b"p", true).await;
    let pong = client.read_frame().await;
    pong.assert_plain();
    assert_eq!((pong.opcode, pong.payload.as_slice()), (PONG, &b"p"[..]));

    client
        .send_frame(true, CLOSE, &1000u16.to_be_bytes(), true)
        .await;
    // expect_close checks that the close frame is plain too.
    client.expect_close(1000).await;
    gw.shutdown().await;
}

/// The server asks to close (the tenth bad command), and the client's own
/// close is already in the same read: the server's close, still queued,
/// answers it (RFC 6455 5.5.1), after the replies queued before it.
///
/// The test's runtime has one thread, and the gateway runs on it: the
/// session's reader takes all the client's bytes in one go, before its
/// writer (in the same task) writes anything, so the client's close always
/// comes before the server's went out.
#[tokio::test]
async fn a_client_close_crossing_the_servers_is_answered() {
    let gw = Gateway::start().await;
    let bad = gw.node.config.websocket.max_bad_commands;
    let mut client = RawClient::connect(gw.addr).await;
    client.send_text(r#"{"op":"hello"}"#).await;
    assert_eq!(client.read_frame().await.json()["op"], "welcome");

    let mut bytes = Vec::new();
    for _ in 0..bad {
        bytes.extend(encode(FIN | TEXT, br#"{"op":"nonsense"}"#, true));
    }
    bytes.extend(encode(FIN | CLOSE, &1000u16.to_be_bytes(), true));
    client.send_bytes(&bytes).await;
    for _ in 0..bad {
        assert_eq!(client.read_frame().await.json()["op"], "err");
    }
    client.expect_close(4500).await;
    gw.shutdown().await;
}
