//! What a test starts does not outlive it, however the test ends: a test
//! process killed outright (SIGKILL: a runner's timeout, the OOM killer,
//! `cargo test` interrupted) runs no destructor, and used to leave its
//! `herald` and `redis-server` running, holding ports and keeping a runner
//! that waits on their output from finishing. The kernel now kills them
//! with the test process (testkit's `process` module).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use testkit::{Herald, Redis, WAIT, eventually};

use crate::pod::HERALD;

/// Set for the copy of this test that starts the processes and is killed.
const VICTIM: &str = "TESTKIT_LEFTOVERS_VICTIM";
/// This test's name in the binary: its module, then its function.
const TEST: &str =
    "leftovers::a_test_process_killed_with_sigkill_leaves_no_herald_or_redis_running";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_test_process_killed_with_sigkill_leaves_no_herald_or_redis_running() {
    if std::env::var_os(VICTIM).is_some() {
        return victim().await;
    }
    // This very test, run again as the victim.
    let mut victim = Victim(
        Command::new(std::env::current_exe().expect("this test binary"))
            .args(["--exact", TEST, "--nocapture"])
            .env(VICTIM, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run the victim"),
    );
    let stdout = victim.0.stdout.take().expect("its stdout");
    let (found, pids) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            // (The harness may print the test's name on the same line first.)
            if let Some((_, pids)) = line.split_once("started: ") {
                let pids: Vec<u32> = pids.split(' ').filter_map(|p| p.parse().ok()).collect();
                let _ = found.send(pids);
                return;
            }
        }
    });
    let pids = pids
        .recv_timeout(WAIT * 3)
        .expect("the victim started its redis-server and herald");
    let _leftovers = Leftovers(pids.clone());
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert!(pids.iter().all(|&pid| running(pid)), "{pids:?} run");

    victim.kill9(); // no destructor runs
    eventually(WAIT, || async {
        let left: Vec<u32> = pids.iter().copied().filter(|&pid| running(pid)).collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "still running after the test process died: {left:?}"
            ))
        }
    })
    .await;
}

/// Starts a Redis and a pod, says their pids, and waits to be killed.
async fn victim() {
    let redis = Redis::start().await;
    let herald = Herald::pod(HERALD, &redis.url(), &[]).await;
    println!(
        "started: {} {}",
        redis.pid().expect("redis pid"),
        herald.pid()
    );
    // The scenario, not a wait for an event: the parent kills this process
    // long before.
    tokio::time::sleep(WAIT * 6).await;
}

/// Whether `pid` is a live process (a zombie is dead: it only waits for
/// its new parent to reap it).
fn running(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // `pid (comm) state ...`; comm may hold spaces, the state follows its `)`.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// The victim's process, killed (SIGKILL) when the test is done with it,
/// passed or failed.
struct Victim(std::process::Child);

impl Victim {
    fn kill9(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Victim {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Kills what the victim left, should the test fail: a failed run must not
/// leave them either.
struct Leftovers(Vec<u32>);

impl Drop for Leftovers {
    fn drop(&mut self) {
        for pid in self.0.iter().filter(|&&pid| running(pid)) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
}
