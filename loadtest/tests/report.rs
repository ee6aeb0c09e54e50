//! `herald-loadtest report`: BENCHMARKS.md rendered from a results
//! directory. The fixture holds a result file of every run `bench.sh`
//! makes (a failed one, the `BEFORE=` ones, perf profiles, criterion's
//! estimates); its expected page is what `scripts/benchmarks.py` rendered
//! from the same files before the renderer moved into the load tool, but
//! for one name: a run's first pod's log is named after the run now
//! (`idle-pods-cluster.log`, where `bench.sh` wrote `idle-cluster-pod-1.log`),
//! and for the `presence` section (issue #23), the `hooks` one (issue
//! #24), and the `streams` one and the `lag` part of the `slow` section
//! (issue #25), which came later: their result files (`presence.json`,
//! `presence-off.json`, `hooks.json`, `streams-*.json` (the 10-topic shape
//! in three rounds), `idle-sse.json`,
//! `sse-failover.json`, `lag.json`, `lag-baseline.json`) are made-up figures in the shape the
//! scenarios write; and for the `deflate` and `formats` sections (issue
//! #26), whose files are debug runs at CI size (`BUILD=debug CLIENTS=50`),
//! the fan-out's and idle's figures then scaled to 10,000 clients by hand.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::path::{Path, PathBuf};
use std::process::Command;

use loadtest::report::{Results, render};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The first line where two texts differ, for a readable failure.
fn first_difference(got: &str, want: &str) -> String {
    for (n, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        if g != w {
            return format!("line {}:\n  got:  {g}\n  want: {w}", n + 1);
        }
    }
    format!(
        "lengths: got {} lines, want {}",
        got.lines().count(),
        want.lines().count()
    )
}

#[test]
fn the_page_of_a_full_run_is_the_one_benchmarks_py_rendered() {
    let dir = fixtures().join("bench");
    let results = Results::read(&dir, &dir.join("criterion")).expect("the fixture reads");
    let got = render(&results);
    let want = std::fs::read_to_string(fixtures().join("BENCHMARKS.md")).expect("expected page");
    assert!(got == want, "{}", first_difference(&got, &want));
}

#[test]
fn the_page_keeps_the_before_columns_and_the_floor_comparisons() {
    let dir = fixtures().join("bench");
    let page = render(&Results::read(&dir, &dir.join("criterion")).expect("read"));
    for line in [
        "| last client, median | 35.0 ms | ≤ 1.0× floor (40.1 ms): 0.87×, met |",
        "| gateway CPU per round | 71.2 ms | ≤ 1.15× the floor writer's (68.1 ms): 1.05×, met |",
        "The build before (main at 1c94cff), measured right after in the same run: gateway CPU \
         per round 2.54× its floor writer's",
        "| an older build | 68% | 17% | 2% |",
        "The build before (main at 1c94cff), measured right after in the same run, single \
         publishes through one Redis: 11,000 publishes/s",
        "(**failed**: 3 publishes failed; first: 503)",
        "The build before (an older build), measured right after in the same run: 0 deliveries",
        "**failed**: no result (`idle-pods-cluster.log` in the results)",
        "this run's floor spent 6.8 µs of CPU per 1 KiB loopback",
        "| rolling restart: presence deliveries, whole room | 310,000 | ≤ 500,000: met | 100 million |",
        "| connect-proxy handshakes per second (backend 1 ms) | 6,250/s | ≥ 5,000/s: met |",
        "| server-sent events (`GET /sse`), 10 topics per client | 455,000 / 470,000 / 380,000 \
         deliveries per gateway CPU-second (280,000 / 290,000 / 230,000 per second); by round 0.87 \
         / 0.77 / 0.95×; lost / duplicated 0 / 0 | 0.87× (median of 3) | ≥ 0.8× the WebSocket's: \
         met |",
        "| server-sent events (`GET /sse`), 1 topic per client | 580,000 deliveries per gateway \
         CPU-second (330,000 per second); lost / duplicated 0 / 0 | 0.95× | ≥ 0.8× the WebSocket's: \
         met |",
        "| 10,000 idle SSE streams, 60 s, heartbeats read 120,000 | 5.20 KiB per stream; 0 \
         unexpected closes | ≤ 6 KiB, 0 closes: met |",
        "| publish proxy: pub→ok p99 added over the backend's own time | 0.50 ms (1.40 ms less the \
         backend, 0.90 ms without the proxy) | ≤ 2 ms: met |",
    ] {
        assert!(page.contains(line), "missing: {line}");
    }
}

#[test]
fn a_directory_without_results_says_what_was_not_run() {
    let dir = std::env::temp_dir().join(format!("herald-report-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("made");
    let results = Results::read(&dir, &dir.join("criterion"));
    let _ = std::fs::remove_dir(&dir);
    let page = render(&results.expect("read"));
    assert!(page.starts_with("# Herald benchmarks\n"));
    assert!(page.contains("Machine: ? cores, ?, Linux ?; run on "));
    // fanout, slow, storm, both chaos, presence, hooks, stall, throughput,
    // deflate, formats, wire.
    assert_eq!(page.matches("\n\nNot run.\n\n").count(), 12, "{page}");
    assert!(page.contains("Latency with presence on and off: not run."));
    assert!(page.contains("Not run (perf unavailable, or the part was not asked for)."));
    assert!(page.contains("| 19,000 on one gateway, 60 s, ping every 5 s | not run |"));
    assert!(page.contains("| one pod, memory broker | not run |"));
    assert!(page.contains("this run's floor spent (not measured) of CPU"));
}

#[test]
fn a_result_that_no_longer_matches_its_type_fails_the_report() {
    let dir = std::env::temp_dir().join(format!("herald-report-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("made");
    std::fs::write(
        dir.join("wire.json"),
        r#"{"scenario": "wire", "result": {}}"#,
    )
    .expect("written");
    let read = Results::read(&dir, &dir.join("criterion"));
    let _ = std::fs::remove_dir_all(&dir);
    let e = read.expect_err("a file that does not match");
    assert!(e.to_string().contains("wire.json"), "{e}");
}

#[test]
fn the_report_command_prints_the_page() {
    let dir = fixtures().join("bench");
    let out = Command::new(env!("CARGO_BIN_EXE_herald-loadtest"))
        .arg("report")
        .arg(&dir)
        .arg("--criterion")
        .arg(dir.join("criterion"))
        .output()
        .expect("herald-loadtest runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = std::fs::read_to_string(fixtures().join("BENCHMARKS.md")).expect("expected page");
    let got = String::from_utf8_lossy(&out.stdout);
    assert!(got == want, "{}", first_difference(&got, &want));
}
