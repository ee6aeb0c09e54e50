//! What several stories ask of a pod under test alike: its binary, a
//! publish over its HTTP API, a session's id and its copy in Redis, its
//! memory. (How to start one is testkit's: `Herald`, `Gateway`.)

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::{Value, json};
use testkit::{Client, Redis, WAIT, eventually};

/// The binary under test (Cargo builds it for this package's tests).
pub(crate) const HERALD: &str = env!("CARGO_BIN_EXE_herald");

/// Longest one run of the binary to its end may take ([`run`]): `herald
/// status`'s own timeout and then some.
pub(crate) const RUN_WAIT: Duration = Duration::from_secs(20);

/// A path as a pod's setting takes it.
pub(crate) fn path(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

/// Publishes `data` to `topic` over HTTP; the status and the answer.
pub(crate) async fn publish(
    addr: SocketAddr,
    topic: &str,
    data: Value,
    key: Option<&str>,
) -> (u16, Value) {
    let body = json!({"topic": topic, "data": data}).to_string();
    let headers: Vec<(&str, &str)> = key.map(|k| ("idempotency-key", k)).into_iter().collect();
    let (status, body) =
        testkit::http(addr, "POST", "/v1/publish", &headers, body.as_bytes()).await;
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// `hello`, and the session id of its `welcome`.
pub(crate) async fn hello(client: &mut Client) -> String {
    let welcome = client.hello(None).await;
    welcome["session"].as_str().expect("session").to_owned()
}

/// Waits until the store holds session `id` with `text` in it (the pod
/// saves an open connection's changed session every
/// `session.flush_interval`).
pub(crate) async fn saved(redis: &Redis, id: &str, text: &str) {
    let key = format!("herald:session:{id}");
    eventually(WAIT, || async {
        let value = redis.cli(&["GET", &key]);
        if value.contains(text) {
            Ok(())
        } else {
            Err(format!("{key} is {value:?}, without {text:?}"))
        }
    })
    .await;
}

/// The resident memory of process `pid`, in bytes (`VmRSS`).
pub(crate) fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .expect("VmRSS in kB");
    kib * 1024
}

/// Runs the binary with `args` and, of the `HERALD_*` variables, only
/// `vars`, to its end: killed if it overruns [`RUN_WAIT`]. Blocking.
pub(crate) fn run(args: &[&str], vars: &[(&str, &str)]) -> Output {
    // Killed with the test process too, were it killed first.
    let mut command = testkit::process::command(HERALD);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("HERALD_") {
            command.env_remove(key);
        }
    }
    command
        .args(args)
        .envs(vars.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = testkit::process::spawn(command).expect("spawn herald");
    wait_output(child, RUN_WAIT)
}

/// The output of `child`, which must exit within `timeout` (it is killed otherwise).
fn wait_output(child: std::process::Child, timeout: Duration) -> Output {
    let pid = child.id();
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = done.send(child.wait_with_output());
    });
    match finished.recv_timeout(timeout) {
        Ok(output) => output.expect("herald's output"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("herald did not exit within {timeout:?}");
        }
    }
}
