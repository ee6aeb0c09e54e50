//! Where the CPU went during a measurement, from `/proc`: the whole
//! machine's busy time (so a run that shared its cores with something else
//! says so), this load generator's own, and that of the local processes
//! named with `--watch-pid` (the gateways, redis). Latency measured on a
//! saturated machine is queueing, not Herald; these figures tell which.

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Clock ticks per second in `/proc/*/stat` (`USER_HZ`): 100 on every
/// Linux architecture this tool runs on.
const TICKS_PER_SECOND: f64 = 100.0;

/// CPU seconds used by process `pid` so far (user + system), if it exists.
pub fn process_seconds(pid: u32) -> Option<f64> {
    process_split(pid).map(|(user, system)| user + system)
}

/// CPU seconds used by process `pid` so far, split: (user space, kernel).
/// The kernel's share of a fan-out is the sends themselves; the user-space
/// share is what the gateway adds to them.
pub fn process_split(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count fields after its `)`.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // Fields 3.. follow; utime and stime are fields 14 and 15.
    let utime: f64 = fields.nth(11)?.parse().ok()?;
    let stime: f64 = fields.next()?.parse().ok()?;
    Some((utime / TICKS_PER_SECOND, stime / TICKS_PER_SECOND))
}

/// CPU seconds the calling thread has run so far, to the nanosecond
/// (`/proc/thread-self/schedstat`; `stat`'s ticks are 10 ms, too coarse for
/// one round of writes).
pub fn thread_seconds() -> Option<f64> {
    let schedstat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let ns: f64 = schedstat.split_whitespace().next()?.parse().ok()?;
    Some(ns / 1e9)
}

/// (busy, total) CPU seconds of the whole machine so far, all cores.
fn machine_seconds() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()?
        .strip_prefix("cpu ")?
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let total: f64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4).unwrap_or(&0.0);
    Some(((total - idle) / TICKS_PER_SECOND, total / TICKS_PER_SECOND))
}

/// The process's name (`/proc/<pid>/comm`).
pub fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned())
}

/// CPU readings taken at the start of a measurement.
#[derive(Debug)]
pub struct Meter {
    started: Instant,
    machine: Option<(f64, f64)>,
    own: Option<f64>,
    watched: Vec<(u32, Option<(f64, f64)>)>,
}

/// The CPU spent between [`Meter::start`] and [`Meter::stop`].
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Usage {
    pub wall_s: f64,
    /// Cores the machine kept busy on average, all processes (0 to `cores`).
    pub machine_busy_cores: f64,
    pub cores: usize,
    /// This load generator's CPU seconds.
    pub loadtest_cpu_s: f64,
    pub watched: Vec<Watched>,
    /// CPU seconds of everything else on the machine: the machine's busy
    /// time less this tool's and the watched processes'. Well above zero
    /// means the run shared its cores with other work.
    pub other_cpu_s: f64,
}

/// One `--watch-pid` process.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Watched {
    pub pid: u32,
    pub name: String,
    /// CPU seconds in the window (absent if the process was gone).
    pub cpu_s: Option<f64>,
    /// The user-space part of `cpu_s`.
    #[serde(default)]
    pub user_s: Option<f64>,
    /// The kernel's part of `cpu_s`.
    #[serde(default)]
    pub system_s: Option<f64>,
}

impl Meter {
    pub fn start(watch: &[u32]) -> Self {
        Self {
            started: Instant::now(),
            machine: machine_seconds(),
            own: process_seconds(std::process::id()),
            watched: watch.iter().map(|&p| (p, process_split(p))).collect(),
        }
    }

    pub fn stop(&self) -> Usage {
        let wall = self.started.elapsed();
        let delta = |before: Option<f64>, after: Option<f64>| Some(after? - before?);
        let machine_busy_cores = match (self.machine, machine_seconds()) {
            (Some((busy0, total0)), Some((busy1, total1))) if total1 > total0 => {
                let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
                (busy1 - busy0) / (total1 - total0) * cores as f64
            }
            _ => 0.0,
        };
        let loadtest_cpu_s = delta(self.own, process_seconds(std::process::id())).unwrap_or(0.0);
        let watched: Vec<Watched> = self
            .watched
            .iter()
            .map(|&(pid, before)| {
                let split = match (before, process_split(pid)) {
                    (Some((u0, s0)), Some((u1, s1))) => Some((u1 - u0, s1 - s0)),
                    _ => None,
                };
                Watched {
                    pid,
                    name: process_name(pid),
                    cpu_s: split.map(|(user, system)| user + system),
                    user_s: split.map(|(user, _)| user),
                    system_s: split.map(|(_, system)| system),
                }
            })
            .collect();
        let ours = loadtest_cpu_s + watched.iter().filter_map(|w| w.cpu_s).sum::<f64>();
        Usage {
            wall_s: wall.as_secs_f64(),
            machine_busy_cores,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            loadtest_cpu_s,
            watched,
            other_cpu_s: (machine_busy_cores * wall.as_secs_f64() - ours).max(0.0),
        }
    }
}

impl Usage {
    /// One line for a table: machine busy, then each process's share.
    pub fn brief(&self) -> String {
        let mut line = format!(
            "machine {:.2} of {} cores busy over {:.1} s; loadtest {:.2} s",
            self.machine_busy_cores, self.cores, self.wall_s, self.loadtest_cpu_s
        );
        for w in &self.watched {
            match w.cpu_s {
                Some(s) => line.push_str(&format!(", {} ({}) {s:.2} s", w.name, w.pid)),
                None => line.push_str(&format!(", pid {} gone", w.pid)),
            }
        }
        line.push_str(&format!(", others {:.2} s", self.other_cpu_s));
        line
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn this_thread_burning_cpu_shows() {
        let before = thread_seconds().expect("schedstat");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while thread_seconds().expect("schedstat") - before < 0.01 {
            assert!(std::time::Instant::now() < deadline, "no CPU time counted");
            for i in 0..10_000u64 {
                std::hint::black_box(i);
            }
        }
    }

    #[tokio::test]
    async fn this_process_burning_cpu_shows() {
        let meter = Meter::start(&[std::process::id(), u32::MAX]);
        // Burn until the kernel has counted 0.2 s (however busy the machine).
        let before = process_seconds(std::process::id()).expect("own stat");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while process_seconds(std::process::id()).expect("own stat") - before < 0.2 {
            assert!(std::time::Instant::now() < deadline, "no CPU time counted");
            for i in 0..100_000u64 {
                std::hint::black_box(i);
            }
        }
        let usage = meter.stop();
        assert!(usage.loadtest_cpu_s >= 0.2, "{usage:?}");
        assert!(usage.machine_busy_cores > 0.0, "{usage:?}");
        assert!(
            usage.watched[0].cpu_s.is_some_and(|s| s >= 0.2),
            "{usage:?}"
        );
        let burnt = &usage.watched[0];
        assert!(burnt.user_s.is_some_and(|s| s >= 0.1), "{usage:?}");
        assert!(burnt.system_s.is_some(), "{usage:?}");
        assert_eq!(usage.watched[1].cpu_s, None, "no such process");
        assert!(usage.brief().contains("gone"), "{}", usage.brief());
    }
}
