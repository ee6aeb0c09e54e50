#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! `herald-cli` against a gateway: `pub` over the HTTP API, then `sub
//! --since 0` prints the message as a JSON line; `history` prints a page,
//! `presence` the members.

mod common;
#[path = "common/rooms.rs"]
mod rooms;

use serde_json::{Value, json};
use testkit::Gateway;

/// Runs herald-cli with `args` (off the runtime's threads); its stdout as JSON.
async fn cli_json(args: Vec<String>) -> Value {
    let output = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        testkit::process::run(
            CLI,
            &args,
            testkit::WAIT,
            "cargo builds herald-cli for this package's tests",
        )
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        testkit::process::show(&output)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

const CLI: &str = env!("CARGO_BIN_EXE_herald-cli");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pub_then_sub_since_0_prints_the_message_as_a_json_line() {
    let gateway = Gateway::start().await;
    let api = format!("http://{}", gateway.addr);
    let ws = gateway.ws_url();
    let published = tokio::task::spawn_blocking(move || {
        testkit::process::run(
            CLI,
            &["pub", "news", r#"{"price":42}"#, "--api", &api],
            testkit::WAIT,
            "cargo builds herald-cli for this package's tests",
        )
    })
    .await
    .unwrap();
    assert!(
        published.status.success(),
        "{}",
        testkit::process::show(&published)
    );
    let answer: Value = serde_json::from_slice(&published.stdout).unwrap();
    assert_eq!(answer["seq"], 1, "{answer}");

    let printed = tokio::task::spawn_blocking(move || {
        testkit::process::run(
            CLI,
            &["sub", "news", "--since", "0", "--count", "1", "--url", &ws],
            testkit::WAIT,
            "cargo builds herald-cli for this package's tests",
        )
    })
    .await
    .unwrap();
    assert!(
        printed.status.success(),
        "{}",
        testkit::process::show(&printed)
    );
    let stdout = String::from_utf8(printed.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{stdout}");
    assert_eq!(
        (&lines[0]["topic"], &lines[0]["seq"], &lines[0]["data"]),
        (&json!("news"), &json!(1), &json!({"price": 42})),
        "{stdout}"
    );
    assert_eq!(lines[0]["epoch"], answer["epoch"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_prints_a_page_as_one_json_object() {
    let gateway = Gateway::start().await;
    for i in 1..=3 {
        gateway.publish("news", json!({ "i": i })).await;
    }
    let args = [
        "history",
        "news",
        "--since",
        "3",
        "--reverse",
        "--limit",
        "2",
        "--url",
    ];
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    args.push(gateway.ws_url());
    let page = cli_json(args).await;
    assert_eq!(page["seq"], 3, "{page}");
    assert_eq!(
        page["publications"],
        json!([{"seq": 2, "data": {"i": 2}}, {"seq": 1, "data": {"i": 1}}]),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_prints_the_members_as_one_json_object() {
    let gateway = rooms::with_users().await;
    let (alice, mut events) = common::user(&gateway, "alice", json!({"info": {"name": "Alice"}}));
    alice.subscribe("quiet:1", None).unwrap();
    common::until(&mut events, |e| {
        matches!(e, herald_client::Event::Subscribed { .. }).then_some(())
    })
    .await;
    let token = common::token("bob", json!({}));
    let args = vec![
        "presence".to_owned(),
        "quiet:1".to_owned(),
        "--url".to_owned(),
        gateway.ws_url(),
        "--token".to_owned(),
        token,
    ];
    let room = cli_json(args).await;
    assert_eq!(
        (&room["users"], &room["members"]),
        (
            &json!(1),
            &json!([{"user": "alice", "info": {"name": "Alice"}}])
        ),
        "{room}"
    );
}

/// Runs herald-cli with `args`; its stdout's lines as JSON.
async fn cli_lines(args: Vec<String>) -> Vec<Value> {
    let output = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        testkit::process::run(
            CLI,
            &args,
            testkit::WAIT,
            "cargo builds herald-cli for this package's tests",
        )
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "{}",
        testkit::process::show(&output)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `herald-cli sub` and `history` print binary data as the JSON protocol
/// writes it (base64, `"binary":true`), in whichever encoding they speak.
async fn binary_data_is_printed_as_base64(protobuf: bool) {
    let gateway = Gateway::start().await;
    let headers = [("content-type", "application/octet-stream")];
    let (status, body) = testkit::http(
        gateway.addr,
        "POST",
        "/v1/publish?topic=files",
        &headers,
        b"\x00\xff\xc3\x28",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    gateway.publish("files", json!({"n": 2})).await;
    let mut args: Vec<String> = ["sub", "files", "--since", "0", "--count", "2", "--url"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.push(gateway.ws_url());
    let mut history: Vec<String> = ["history", "files", "--url"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    history.push(gateway.ws_url());
    if protobuf {
        args.push("--protobuf".to_owned());
        history.push("--protobuf".to_owned());
    }
    let lines = cli_lines(args).await;
    let printed: Vec<(&Value, &Value, &Value)> = lines
        .iter()
        .map(|l| (&l["seq"], &l["data"], &l["binary"]))
        .collect();
    assert_eq!(
        printed,
        [
            (&json!(1), &json!("AP/DKA=="), &json!(true)),
            (&json!(2), &json!({"n": 2}), &Value::Null)
        ],
        "{lines:?}"
    );
    let page = cli_json(history).await;
    assert_eq!(
        page["publications"],
        json!([{"seq": 1, "data": "AP/DKA==", "binary": true}, {"seq": 2, "data": {"n": 2}}]),
        "{page}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_data_is_printed_as_base64_in_json() {
    binary_data_is_printed_as_base64(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_data_is_printed_as_base64_in_protobuf() {
    binary_data_is_printed_as_base64(true).await;
}

/// `herald-cli sub --delta` on a state topic, in both encodings: the lines
/// are the states whole (deltas applied), stderr says deltas were granted,
/// and deltas were sent. States are published until it has printed its
/// count (for at most [`testkit::WAIT`]), so that it reads them live.
async fn sub_delta_prints_every_state_whole(protobuf: bool) {
    let mut config = Gateway::config();
    config.namespaces.insert(
        "game".to_owned(),
        router::NamespaceSettings {
            delta: true,
            ..Default::default()
        },
    );
    let gateway = Gateway::with(config).await;
    let state = |n: u64| {
        let scores: Vec<u64> = (0..50).map(|t| if t == n % 50 { n } else { t }).collect();
        json!({"round": n, "scores": scores})
    };
    let mut args: Vec<String> = ["sub", "game:1", "--count", "20", "--delta", "--url"]
        .iter()
        .map(|a| a.to_string())
        .collect();
    args.push(gateway.ws_url());
    if protobuf {
        args.push("--protobuf".to_owned());
    }
    let cli = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        testkit::process::run(
            CLI,
            &args,
            testkit::WAIT,
            "cargo builds herald-cli for this package's tests",
        )
    });
    let deadline = tokio::time::Instant::now() + testkit::WAIT;
    let mut n = 0;
    while !cli.is_finished() && tokio::time::Instant::now() < deadline {
        n += 1;
        assert_eq!(gateway.publish("game:1", state(n)).await, n);
    }
    let output = cli.await.unwrap();
    assert!(
        output.status.success(),
        "{}",
        testkit::process::show(&output)
    );
    let stdout = String::from_utf8(output.stdout).unwrap();
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20, "{stdout}");
    let first = lines[0]["seq"].as_u64().unwrap();
    for (seq, line) in (first..).zip(&lines) {
        assert_eq!(
            (&line["seq"], &line["data"]),
            (&json!(seq), &state(seq)),
            "{stdout}"
        );
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(", deltas"), "{stderr}");
    let deltas = gateway
        .metric("herald_delta_deliveries_total{sent=\"delta\"}")
        .await;
    assert!(deltas >= 19.0, "deltas sent: {deltas}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_delta_prints_every_state_whole_in_json() {
    sub_delta_prints_every_state_whole(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sub_delta_prints_every_state_whole_in_protobuf() {
    sub_delta_prints_every_state_whole(true).await;
}
