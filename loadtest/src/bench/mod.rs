//! `herald-loadtest run`: one run of `scripts/bench.sh`. It starts what the
//! run needs ([`servers`]: herald pods from `--herald`, Redis or a Redis
//! Cluster, a delaying proxy), runs the scenario against them (this program
//! again, with the scenario's flags and the servers' targets), and stops
//! them; with `--before`, the same again against an older herald binary,
//! its result beside (`<name>-before.json`) for the page's before/after.
//!
//! The scenario runs in a process of its own, as it did when `bench.sh`
//! started the servers: its CPU figures are its own, the servers' are the
//! watched processes'.

pub mod servers;

use std::io;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;

use servers::{Plan, Servers};

/// Longest `perf record` may take to write its data once told to stop.
const PERF_STOP: Duration = Duration::from_secs(60);

/// Why a bench run could not run (a run that ran and failed is a `false`).
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("starting the servers")]
    Rig(#[from] rig::Error),
    #[error("{0}")]
    Io(String, #[source] io::Error),
    #[error("the load tool starts no servers for scenario `{0}`")]
    Scenario(String),
    #[error("{0}")]
    Plan(String),
    #[error("no pods to point the scenario at (--pods 0)")]
    NoPods,
}

/// One bench run, as the command line gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct Run {
    /// Its result is `<dir>/<name>.json`, its first pod's log `<name>.log`.
    pub name: String,
    pub dir: PathBuf,
    pub plan: Plan,
    /// The build before, and how the page names it.
    pub before: Option<(PathBuf, String)>,
    /// Profile the first pod with `perf` into `<dir>/<name>.txt`.
    pub perf: bool,
    /// The scenario and its flags.
    pub scenario: Vec<String>,
}

/// Runs `run` (and its build before); whether every run passed.
pub async fn run(run: Run) -> Result<bool, BenchError> {
    std::fs::create_dir_all(&run.dir)
        .map_err(|e| BenchError::Io(format!("creating {}", run.dir.display()), e))?;
    let mut passed = once(&run, &run.plan, &run.name).await?;
    if let Some((before, label)) = &run.before {
        println!("\n== {}, again with the build before: {label}", run.name);
        let name = format!("{}-before", run.name);
        let label_file = run.dir.join(format!("{name}.label"));
        std::fs::write(&label_file, format!("{label}\n"))
            .map_err(|e| BenchError::Io(format!("writing {}", label_file.display()), e))?;
        let plan = Plan {
            herald: before.clone(),
            ..run.plan.clone()
        };
        passed &= once(&run, &plan, &name).await?;
    }
    Ok(passed)
}

/// One run against `plan`'s servers, its result named `name`.
async fn once(run: &Run, plan: &Plan, name: &str) -> Result<bool, BenchError> {
    let servers = Servers::start(plan, &run.dir, name).await?;
    let (scenario, flags) = run
        .scenario
        .split_first()
        .ok_or_else(|| BenchError::Plan("no scenario after `--`".into()))?;
    let exe =
        std::env::current_exe().map_err(|e| BenchError::Io("finding this program".into(), e))?;
    let out = run.dir.join(format!("{name}.json"));
    let mut command = Command::from(crate::process::command(exe));
    command
        .arg(scenario)
        .args(flags)
        .args(servers.flags(scenario)?)
        .arg("--out")
        .arg(&out)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    let profiler = match (run.perf, servers.first_pid()) {
        (true, Some(pid)) => Some(perf_record(&run.dir, name, pid)?),
        _ => None,
    };
    let status = command
        .status()
        .await
        .map_err(|e| BenchError::Io(format!("running {scenario}"), e))?;
    let mut passed = status.success();
    if let Some(profiler) = profiler {
        passed &= perf_report(profiler, &run.dir, name).await;
    }
    if scenario == "publish"
        && let Some(keys) = servers.keys_per_node()
    {
        let shown: Vec<String> = keys
            .iter()
            .map(|k| k.map_or_else(|| "?".to_owned(), |k| k.to_string()))
            .collect();
        println!("{name}: keys on each cluster node: {}", shown.join(" "));
        if keys.iter().any(|k| k.is_none_or(|k| k == 0)) {
            eprintln!("{name}: a cluster node holds no key: the publishes did not spread over it");
            passed = false;
        }
    }
    drop(servers);
    Ok(passed)
}

/// `perf record` of `pid` (cpu-clock, 999 Hz) into `<dir>/<name>.data`.
fn perf_record(dir: &Path, name: &str, pid: u32) -> Result<tokio::process::Child, BenchError> {
    let log = std::fs::File::create(dir.join(format!("{name}-perf.log")))
        .map_err(|e| BenchError::Io("the perf log".into(), e))?;
    Command::new("perf")
        .args(["record", "-e", "cpu-clock", "-F", "999", "-o"])
        .arg(dir.join(format!("{name}.data")))
        .args(["-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| BenchError::Io("running perf".into(), e))
}

/// Stops `perf record` and writes its report by shared object and symbol
/// to `<dir>/<name>.txt`; whether that worked.
async fn perf_report(mut perf: tokio::process::Child, dir: &Path, name: &str) -> bool {
    // SIGINT: perf writes its data and exits.
    if let Some(pid) = perf.id() {
        let _ = Command::new("kill")
            .args(["-INT", &pid.to_string()])
            .status()
            .await;
    }
    let _ = tokio::time::timeout(PERF_STOP, perf.wait()).await;
    let Ok(report) = std::fs::File::create(dir.join(format!("{name}.txt"))) else {
        return false;
    };
    Command::new("perf")
        .arg("report")
        .arg("-i")
        .arg(dir.join(format!("{name}.data")))
        .args([
            "--stdio",
            "--no-children",
            "--sort",
            "dso,sym",
            "--percent-limit",
            "0.2",
        ])
        .stdin(Stdio::null())
        .stdout(report)
        .stderr(Stdio::null())
        .status()
        .await
        .is_ok_and(|s| s.success())
}
