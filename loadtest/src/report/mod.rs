//! What a run leaves behind, and what the runs add up to.
//!
//! A run: a table for people on stdout, and one JSON file for tools
//! (`--out`): the scenario's name, the machine it ran on, whether it passed
//! and why not, and every figure ([`Envelope`]).
//!
//! The runs: `herald-loadtest report <dir>` renders BENCHMARKS.md from a
//! directory of result files ([`page::render`]):
//! - [`results`]: the directory read back, each file through its scenario's
//!   type, and the other files the page uses (perf profiles, labels,
//!   criterion's estimates).
//! - [`markdown`]: cells (figures in their units, verdicts) and tables.
//! - [`page`]: the header, the sections in order, the notes at the end.
//! - One module per section, named for its scenario: [`fanout`],
//!   [`profile`], [`slow`], [`idle`], [`storm`], [`identity`], [`chaos`],
//!   [`presence`], [`hooks`], [`pods`], [`publish`], [`stall`], [`throughput`], [`streams`],
//!   [`deflate`], [`formats`], [`wire`], [`micro`].

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Error;

mod chaos;
mod deflate;
mod fanout;
mod formats;
mod hooks;
mod identity;
mod idle;
pub mod markdown;
mod micro;
pub mod page;
mod pods;
mod presence;
mod profile;
mod publish;
pub mod results;
mod slow;
mod stall;
mod storm;
mod streams;
mod throughput;
mod wire;

pub use page::render;
pub use results::Results;

/// A scenario's result, as the report shows it.
pub trait Outcome: Serialize {
    /// The scenario's name, as on the command line.
    const SCENARIO: &'static str;
    /// The table's lines, in order.
    fn rows(&self) -> Vec<Row>;
    /// What went wrong that must not (lost or duplicated messages, ...);
    /// empty when the run passed.
    fn failures(&self) -> Vec<String>;
}

/// The failures of a run whose clients count what they were owed: publishes
/// that failed, deliveries lost or duplicated, unexpected frames, clients
/// disconnected. `fanout` (so `pods` and `slow` too) and `throughput` check
/// the same.
pub(crate) fn delivery_failures(
    publish_errors: u64,
    first_publish_error: Option<&str>,
    lost: u64,
    duplicated: u64,
    unexpected: u64,
    disconnected: u64,
    disconnects: &[String],
) -> Vec<String> {
    let mut failures = Vec::new();
    if publish_errors > 0 {
        failures.push(format!(
            "{publish_errors} publishes failed; first: {}",
            first_publish_error.unwrap_or("?")
        ));
    }
    if lost > 0 {
        failures.push(format!("{lost} deliveries lost"));
    }
    if duplicated > 0 {
        failures.push(format!("{duplicated} deliveries duplicated"));
    }
    if unexpected > 0 {
        failures.push(format!("{unexpected} unexpected frames"));
    }
    if disconnected > 0 {
        failures.push(format!(
            "{disconnected} clients disconnected: {}",
            disconnects.join("; ")
        ));
    }
    failures
}

/// One line of the table.
#[derive(Debug, Clone)]
pub struct Row {
    pub figure: String,
    pub value: String,
}

impl Row {
    pub fn new(figure: impl Into<String>, value: impl ToString) -> Self {
        Self {
            figure: figure.into(),
            value: value.to_string(),
        }
    }
}

/// The machine a run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    pub cores: usize,
    pub cpu: String,
    pub kernel: String,
}

impl Machine {
    pub fn this() -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
            .unwrap_or_default();
        Self {
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            cpu,
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|k| k.trim().to_owned())
                .unwrap_or_default(),
        }
    }
}

/// The JSON result file: what `--out` writes (`R` = `&T`) and `report`
/// reads (`R` = `T`, see [`results`]).
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope<R> {
    /// [`Outcome::SCENARIO`].
    pub scenario: String,
    /// This tool's version.
    pub version: String,
    /// When the run ended, seconds since the UNIX epoch.
    pub finished_unix_s: u64,
    pub machine: Machine,
    pub passed: bool,
    pub failures: Vec<String>,
    pub result: R,
}

/// The human table, with a verdict line at the end.
pub fn table<T: Outcome>(outcome: &T) -> String {
    let rows = outcome.rows();
    let width = rows.iter().map(|r| r.figure.len()).max().unwrap_or(0);
    let mut out = format!("herald-loadtest {}\n", T::SCENARIO);
    for row in &rows {
        let _ = writeln!(out, "  {:<width$}  {}", row.figure, row.value);
    }
    match outcome.failures().as_slice() {
        [] => out.push_str("  PASSED\n"),
        failures => {
            for f in failures {
                let _ = writeln!(out, "  FAILED: {f}");
            }
        }
    }
    out
}

/// Writes the JSON result file (creating its directory).
pub fn write_json<T: Outcome>(path: &Path, outcome: &T) -> Result<(), Error> {
    let failures = outcome.failures();
    let envelope = Envelope {
        scenario: T::SCENARIO.to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        finished_unix_s: crate::latency::now_micros() / 1_000_000,
        machine: Machine::this(),
        passed: failures.is_empty(),
        failures,
        result: outcome,
    };
    let write_err = |source| Error::Write {
        path: path.display().to_string(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(write_err)?;
    }
    let mut json = serde_json::to_string_pretty(&envelope).map_err(|e| write_err(e.into()))?;
    json.push('\n');
    std::fs::write(path, json).map_err(write_err)
}
