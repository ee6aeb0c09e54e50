//! Autobahn|Testsuite's cases against Herald's own frame reader, outgoing
//! queue and writer, through the echo server over them
//! (`gateway::session::echo`). The cases are Autobahn's own files, run by
//! `kosoku` (PyPI: a Python 3 runner of them; Autobahn's `wstest` needs
//! Python 2), which `scripts/test.sh` installs in the scripts' venv.
//!
//! Every case but the limits and performance ones (9.*, about a minute) runs:
//! framing, binary and text messages, pings, reserved bits and opcodes,
//! fragmentation, UTF-8, closing ([`herald_frames_pass_the_autobahn_cases`]),
//! and permessage-deflate (12.*, 13.*: [`compression_passes_the_autobahn_cases`],
//! a few minutes). Each must pass (OK, NON-STRICT or INFORMATIONAL), except
//! where Herald differs on purpose ([`DEVIATIONS`]). docs/conformance.md tells
//! how to run the whole suite.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use gateway::Config;
use gateway::session::echo::Echo;
use serde_json::Value;
use testkit::process;
use tokio::net::TcpListener;

/// The case runner, pinned in scripts/test.sh.
const KOSOKU: &str = "kosoku";
/// The selection takes 4 s with 8 cases at a time; its slowest case waits 2.
const KOSOKU_WAIT: Duration = Duration::from_secs(90);
/// 216 cases of 1,000 messages each (up to 128 KiB), compressed both ways:
/// a few minutes with 8 at a time (nextest ends the test at 8 minutes).
const KOSOKU_COMPRESSION_WAIT: Duration = Duration::from_secs(420);

/// Cases Herald fails on purpose, by prefix of their id, and why.
const DEVIATIONS: &[(&str, &str)] = &[
    (
        "2.10",
        "10 pings at once: only the newest unanswered ping gets its pong, as RFC 6455 5.5.3 allows",
    ),
    ("2.11", "the same, each ping sent in chunks"),
];

/// What a report may say of a case that passed.
const PASSED: &[&str] = &["OK", "NON-STRICT", "INFORMATIONAL"];

/// Runs kosoku to completion, killing it after `timeout`.
fn kosoku(args: &[&str], timeout: Duration) -> Output {
    process::run(
        KOSOKU,
        args,
        timeout,
        "the conformance test needs it; run the project's test script (scripts/test.sh), which installs it in target/venv and puts its bin/ first on PATH",
    )
}

/// A folder of this test's own, emptied.
fn report_dir() -> PathBuf {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("herald-autobahn-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn deviation(case: &str) -> Option<&'static str> {
    DEVIATIONS
        .iter()
        .find(|(prefix, _)| case == *prefix || case.starts_with(prefix))
        .map(|(_, why)| *why)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn herald_frames_pass_the_autobahn_cases() {
    let mut config = Config::default();
    // Case 1.1.8 and 10.1.1 send 64 KiB, Herald's default limit.
    config.websocket.max_message_bytes = 1 << 20;
    let selection = ["-x", "9.*", "-x", "12.*", "-x", "13.*"];
    run_cases(&config, &selection, KOSOKU_WAIT, 240).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_passes_the_autobahn_cases() {
    let mut config = Config::default();
    // 12.* and 13.* send up to 128 KiB, compressed and inflated.
    config.websocket.max_message_bytes = 1 << 20;
    // Every echo compressed, the smallest too: kosoku (0.1.0) hands a case
    // an uncompressed text echo on a compressed connection as a `str`, which
    // the case cannot hash (a runner's bug: RFC 7692 lets a sender leave any
    // message uncompressed, and Herald does below `min_bytes`).
    config.websocket.compression.min_bytes = 0;
    config.websocket.compression.enabled = true;
    let selection = ["-i", "12.*", "-i", "13.*"];
    run_cases(&config, &selection, KOSOKU_COMPRESSION_WAIT, 216).await;
}

/// Runs the `selection` of cases against an echo with `config`; each must
/// pass (but [`DEVIATIONS`]), and at least `at_least` must have run.
async fn run_cases(config: &Config, selection: &[&str], wait: Duration, at_least: usize) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let echo = tokio::spawn(Echo::new(config).run(listener));

    let dir = report_dir();
    let out = dir.to_str().expect("a UTF-8 path").to_owned();
    let selection: Vec<String> = selection.iter().map(|s| s.to_string()).collect();
    let output = tokio::task::spawn_blocking(move || {
        let args: Vec<&str> = ["-p", "8"]
            .into_iter()
            .chain(selection.iter().map(String::as_str))
            .chain(["-o", &out, &address])
            .collect();
        kosoku(&args, wait)
    })
    .await
    .expect("kosoku");
    echo.abort();

    let index = Path::new(&dir).join("index.json");
    let index: Value = match std::fs::read(&index) {
        Ok(json) => serde_json::from_slice(&json).expect("index.json is JSON"),
        Err(e) => panic!("no report ({e})\n{}", process::show(&output)),
    };
    // One agent: the echo, by its address.
    let cases = index
        .as_object()
        .and_then(|agents| agents.values().next())
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("no cases in the report\n{}", process::show(&output)));
    let mut failed = Vec::new();
    let mut deviated = 0;
    for (case, result) in cases {
        let behaviour = result["behavior"].as_str().unwrap_or("?");
        let close = result["behaviorClose"].as_str().unwrap_or("?");
        let passed = PASSED.contains(&behaviour) && PASSED.contains(&close);
        match deviation(case) {
            Some(_) => deviated += 1,
            None if !passed => failed.push(format!("{case}: {behaviour}, close {close}")),
            None => {}
        }
    }
    println!(
        "{} Autobahn cases: {} passed, {deviated} deviations by design",
        cases.len(),
        cases.len() - deviated - failed.len()
    );
    assert!(
        failed.is_empty(),
        "cases failed (reports in {dir:?}):\n{}\n{}",
        failed.join("\n"),
        process::show(&output)
    );
    // All of the selection ran: a runner that runs nothing must not pass.
    assert!(cases.len() >= at_least, "only {} cases ran", cases.len());
    let _ = std::fs::remove_dir_all(&dir);
}
