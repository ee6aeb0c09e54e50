//! A results directory (`scripts/bench.sh`'s `$OUT`) read back: every
//! `*.json` result file through the type its scenario wrote it with, and the
//! other files the page uses (perf profiles, `BEFORE=` labels, the idle
//! memory example's output, the runs' herald logs, criterion's estimates).
//!
//! Each file is read as an [`Envelope`] of its scenario's result type, and
//! the page takes each figure by field access, so a result field renamed or
//! removed fails to compile rather than showing as "n/a" in BENCHMARKS.md;
//! a result file that no longer matches its type fails the report.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::report::{Envelope, Machine, Outcome};
use crate::scenarios::chaos::Chaos;
use crate::scenarios::fanout::Fanout;
use crate::scenarios::floor::Floor;
use crate::scenarios::formats::Formats;
use crate::scenarios::hooks::Hooks;
use crate::scenarios::idle::Idle;
use crate::scenarios::pods::Pods;
use crate::scenarios::presence::Presence;
use crate::scenarios::publish::Publish;
use crate::scenarios::slow::Slow;
use crate::scenarios::sse_failover::SseFailover;
use crate::scenarios::stall::Stall;
use crate::scenarios::storm::Storm;
use crate::scenarios::throughput::Throughput;
use crate::scenarios::wire::Wire;

/// Where criterion keeps its estimates, from the workspace's root.
pub const DEFAULT_CRITERION: &str = "target/criterion";

/// Why a results directory could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("reading {path}: it does not match its scenario's result type")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("reading {path}: unknown scenario `{scenario}`")]
    Scenario { path: PathBuf, scenario: String },
}

/// A scenario's result, of whichever scenario wrote the file.
// A few dozen per page, each read once: their sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
pub enum Figures {
    Fanout(Fanout),
    Pods(Pods),
    Slow(Slow),
    Floor(Floor),
    Idle(Idle),
    Storm(Storm),
    Stall(Stall),
    Publish(Publish),
    Throughput(Throughput),
    Wire(Wire),
    Formats(Formats),
    Chaos(Chaos),
    Presence(Presence),
    Hooks(Hooks),
    SseFailover(SseFailover),
}

/// One result file: its envelope, and its scenario's result.
#[derive(Debug, Clone)]
pub struct File {
    pub scenario: String,
    pub finished_unix_s: u64,
    pub machine: Machine,
    pub passed: bool,
    pub failures: Vec<String>,
    pub figures: Figures,
}

/// A results directory, read.
#[derive(Debug, Clone)]
pub struct Results {
    dir: PathBuf,
    criterion: PathBuf,
    /// By file name without `.json`.
    files: BTreeMap<String, File>,
}

impl Results {
    /// Every `*.json` file in `dir` (none if `dir` does not exist), and
    /// criterion's estimates under `criterion`.
    pub fn read(dir: &Path, criterion: &Path) -> Result<Self, ReadError> {
        let mut results = Self {
            dir: dir.to_owned(),
            criterion: criterion.to_owned(),
            files: BTreeMap::new(),
        };
        if !dir.is_dir() {
            return Ok(results);
        }
        let read_err = |source| ReadError::Read {
            path: dir.to_owned(),
            source,
        };
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .map_err(read_err)?
            .map(|e| e.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(read_err)?;
        paths.retain(|p| p.extension().is_some_and(|e| e == "json"));
        paths.sort();
        for path in paths {
            let name = path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default();
            let text = std::fs::read_to_string(&path).map_err(|source| ReadError::Read {
                path: path.clone(),
                source,
            })?;
            let file = File::parse(&text).map_err(|e| match e {
                FileError::Parse(source) => ReadError::Parse {
                    path: path.clone(),
                    source,
                },
                FileError::Scenario(scenario) => ReadError::Scenario {
                    path: path.clone(),
                    scenario,
                },
            })?;
            results.files.insert(name, file);
        }
        Ok(results)
    }

    /// The result file `name` (without `.json`).
    pub fn file(&self, name: &str) -> Option<&File> {
        self.files.get(name)
    }

    /// `name`'s result if it is a `fanout` or a `pods` run.
    pub fn fanout(&self, name: &str) -> Option<&Fanout> {
        match &self.file(name)?.figures {
            Figures::Fanout(r) => Some(r),
            Figures::Pods(r) => Some(r),
            _ => None,
        }
    }

    pub fn slow(&self, name: &str) -> Option<&Slow> {
        match &self.file(name)?.figures {
            Figures::Slow(r) => Some(r),
            _ => None,
        }
    }

    pub fn idle(&self, name: &str) -> Option<&Idle> {
        match &self.file(name)?.figures {
            Figures::Idle(r) => Some(r),
            _ => None,
        }
    }

    pub fn storm(&self, name: &str) -> Option<&Storm> {
        match &self.file(name)?.figures {
            Figures::Storm(r) => Some(r),
            _ => None,
        }
    }

    pub fn stall(&self, name: &str) -> Option<&Stall> {
        match &self.file(name)?.figures {
            Figures::Stall(r) => Some(r),
            _ => None,
        }
    }

    /// A `publish` run's result, with whether it passed and why not.
    pub fn publish(&self, name: &str) -> Option<(&Publish, &File)> {
        let file = self.file(name)?;
        match &file.figures {
            Figures::Publish(r) => Some((r, file)),
            _ => None,
        }
    }

    pub fn throughput(&self, name: &str) -> Option<&Throughput> {
        match &self.file(name)?.figures {
            Figures::Throughput(r) => Some(r),
            _ => None,
        }
    }

    pub fn wire(&self, name: &str) -> Option<&Wire> {
        match &self.file(name)?.figures {
            Figures::Wire(r) => Some(r),
            _ => None,
        }
    }

    pub fn formats(&self, name: &str) -> Option<&Formats> {
        match &self.file(name)?.figures {
            Figures::Formats(r) => Some(r),
            _ => None,
        }
    }

    pub fn chaos(&self, name: &str) -> Option<&Chaos> {
        match &self.file(name)?.figures {
            Figures::Chaos(r) => Some(r),
            _ => None,
        }
    }

    pub fn presence(&self, name: &str) -> Option<&Presence> {
        match &self.file(name)?.figures {
            Figures::Presence(r) => Some(r),
            _ => None,
        }
    }

    pub fn hooks(&self, name: &str) -> Option<&Hooks> {
        match &self.file(name)?.figures {
            Figures::Hooks(r) => Some(r),
            _ => None,
        }
    }

    pub fn sse_failover(&self, name: &str) -> Option<&SseFailover> {
        match &self.file(name)?.figures {
            Figures::SseFailover(r) => Some(r),
            _ => None,
        }
    }

    /// A file of the directory, other than a result: its text, if there.
    pub fn text(&self, file: &str) -> Option<String> {
        std::fs::read(self.dir.join(file))
            .ok()
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Whether the directory holds `file` (a run's herald log: there and no
    /// result means the run failed).
    pub fn has(&self, file: &str) -> bool {
        self.dir.join(file).exists()
    }

    /// What the `BEFORE=` build of result `name` was (`BEFORE_LABEL`, or
    /// its path), as `bench.sh` noted it.
    pub fn before_label(&self, name: &str) -> String {
        [
            format!("{name}-before.label"),
            "before-label.txt".to_owned(),
        ]
        .iter()
        .find_map(|file| self.text(file))
        .map_or_else(|| "an older build".to_owned(), |l| l.trim().to_owned())
    }

    /// Criterion's mean estimate of `group/bench`, in nanoseconds.
    pub fn criterion(&self, group: &str, bench: &str) -> Option<f64> {
        #[derive(Deserialize)]
        struct Estimates {
            mean: Estimate,
        }
        #[derive(Deserialize)]
        struct Estimate {
            point_estimate: f64,
        }
        let path = self
            .criterion
            .join(group)
            .join(bench)
            .join("new")
            .join("estimates.json");
        let text = std::fs::read_to_string(path).ok()?;
        let estimates: Estimates = serde_json::from_str(&text).ok()?;
        Some(estimates.mean.point_estimate)
    }
}

/// Why one result file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error(transparent)]
    Parse(#[from] serde_json::Error),
    #[error("unknown scenario `{0}`")]
    Scenario(String),
}

impl File {
    /// One result file's text, read through its scenario's type.
    pub fn parse(text: &str) -> Result<Self, FileError> {
        /// Just the name, to pick the type.
        #[derive(Deserialize)]
        struct Scenario {
            scenario: String,
        }
        let Scenario { scenario } = serde_json::from_str(text)?;
        Ok(match scenario.as_str() {
            Fanout::SCENARIO => typed(text, Figures::Fanout)?,
            Pods::SCENARIO => typed(text, Figures::Pods)?,
            Slow::SCENARIO => typed(text, Figures::Slow)?,
            Floor::SCENARIO => typed(text, Figures::Floor)?,
            Idle::SCENARIO => typed(text, Figures::Idle)?,
            Storm::SCENARIO => typed(text, Figures::Storm)?,
            Stall::SCENARIO => typed(text, Figures::Stall)?,
            Publish::SCENARIO => typed(text, Figures::Publish)?,
            Throughput::SCENARIO => typed(text, Figures::Throughput)?,
            Wire::SCENARIO => typed(text, Figures::Wire)?,
            Formats::SCENARIO => typed(text, Figures::Formats)?,
            Chaos::SCENARIO => typed(text, Figures::Chaos)?,
            Presence::SCENARIO => typed(text, Figures::Presence)?,
            Hooks::SCENARIO => typed(text, Figures::Hooks)?,
            SseFailover::SCENARIO => typed(text, Figures::SseFailover)?,
            _ => return Err(FileError::Scenario(scenario)),
        })
    }
}

/// The file read as an envelope of `T`.
fn typed<T: DeserializeOwned>(
    text: &str,
    figures: impl FnOnce(T) -> Figures,
) -> Result<File, serde_json::Error> {
    let file: Envelope<T> = serde_json::from_str(text)?;
    Ok(File {
        scenario: file.scenario,
        finished_unix_s: file.finished_unix_s,
        machine: file.machine,
        passed: file.passed,
        failures: file.failures,
        figures: figures(file.result),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::write_json;
    use crate::scenarios::wire::Measured;

    #[test]
    fn a_result_file_reads_back_through_its_type() {
        let wire = Wire {
            gateway: "ws://127.0.0.1:1/ws".to_owned(),
            topic: "abcdefgh".to_owned(),
            sizes: vec![Measured {
                payload_bytes: 10,
                herald_bytes: Some(62),
                header_bytes: Some(2),
                envelope_bytes: Some(50),
                http_post_bytes: Some(120),
                error: None,
            }],
        };
        let dir = std::env::temp_dir().join(format!("herald-results-{}", std::process::id()));
        write_json(&dir.join("wire.json"), &wire).expect("written");
        std::fs::write(dir.join("notes.txt"), "not a result").expect("written");
        let results = Results::read(&dir, &dir.join("criterion"));
        let _ = std::fs::remove_dir_all(&dir);
        let results = results.expect("read");
        let file = results.file("wire").expect("the wire run");
        assert_eq!(file.scenario, "wire");
        assert!(file.passed);
        let read = results.wire("wire").expect("a wire result");
        assert_eq!(read.sizes[0].herald_bytes, Some(62));
        assert!(results.fanout("wire").is_none());
        assert_eq!(results.files.len(), 1);
    }

    #[test]
    fn a_file_that_no_longer_matches_its_type_fails() {
        let e = File::parse(r#"{"scenario": "wire", "result": {"sizes": []}}"#)
            .expect_err("no machine")
            .to_string();
        assert!(e.contains("missing field"), "{e}");
        let e = File::parse(r#"{"scenario": "warp"}"#)
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("warp"), "{e}");
    }
}
