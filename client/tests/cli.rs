#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed unwrap is a failed test

//! `herald-cli` against a gateway: `pub` over the HTTP API, then `sub
//! --since 0` prints the message as a JSON line.

use serde_json::{Value, json};
use testkit::Gateway;

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
