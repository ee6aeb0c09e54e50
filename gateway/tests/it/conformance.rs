//! Autobahn|Testsuite's cases against Herald's own frame reader, outgoing
//! queue and writer, through the echo server over them
//! (`gateway::session::echo`). The cases are Autobahn's own files, run by
//! `kosoku` (PyPI: a Python 3 runner of them; Autobahn's `wstest` needs
//! Python 2), which `scripts/test.sh` installs in the scripts' venv.
//!
//! Every case but the limits and performance ones (9.*, about a minute) and
//! compression (12.*, 13.*: no extension is negotiated) runs: framing, pings,
//! reserved bits and opcodes, fragmentation, UTF-8, closing. Each must pass
//! (OK, NON-STRICT or INFORMATIONAL), except where Herald differs on purpose
//! ([`DEVIATIONS`]). docs/conformance.md tells how to run the whole suite.

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

/// Cases Herald fails on purpose, by prefix of their id, and why.
const DEVIATIONS: &[(&str, &str)] = &[
    (
        "1.2.",
        "binary messages: the protocol is JSON text; they close with 1003",
    ),
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
    let dir = std::env::temp_dir().join(format!("herald-autobahn-{}", std::process::id()));
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
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let echo = tokio::spawn(Echo::new(&config).run(listener));

    let dir = report_dir();
    let out = dir.to_str().expect("a UTF-8 path").to_owned();
    let output = tokio::task::spawn_blocking(move || {
        let args = ["-p", "8", "-x", "9.*", "-x", "12.*", "-x", "13.*"];
        let args: Vec<&str> = args.into_iter().chain(["-o", &out, &address]).collect();
        kosoku(&args, KOSOKU_WAIT)
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
    assert!(cases.len() >= 240, "only {} cases ran", cases.len());
    let _ = std::fs::remove_dir_all(&dir);
}
