//! The command line: `herald-loadtest <scenario> [--flag value]...`, read
//! into the scenario's `Options`. Hand-written, like `herald`'s own.

use std::path::PathBuf;
use std::time::Duration;

use crate::scenarios::{DEFAULT_SIZE, pods, publish};
use crate::{Error, Target};

/// Exit code for a bad command line (EX_USAGE).
pub const EXIT_USAGE: u8 = 64;

pub const USAGE: &str = "\
herald-loadtest: load and latency measurements against Herald gateways on this machine

Usage: herald-loadtest <scenario> [options]

Scenarios:
  pods      clients spread over the --gateway URLs, all on one topic; a paced
            publisher posts to --publish-to. Delivery latency per (message,
            client), messages lost and duplicated (both must be 0).
              --gateway <ws://127.0.0.1:PORT[/ws]>  repeat for several pods (required)
              --publish-to <http://127.0.0.1:PORT>  default: the first gateway
              --clients <n>       default 1000
              --rate <msgs/s>     default 100
              --duration <time>   default 10s
              --warmup <n>        messages sent first, not timed; default 10
              --connections <n>   publisher keep-alive connections; default 4
              --drain <time>      wait for late deliveries; default 5s
              --topic <name>      default: a fresh topic per run
  publish   publish throughput: --concurrency keep-alive connections publish
            back to back to --topics topics for --duration.
              --publish-to <http://127.0.0.1:PORT>  (required)
              --concurrency <n>   default 16
              --topics <n>        default 100
              --duration <time>   default 10s

Common options:
  --size <bytes>       payload size (the send-time stamp needs ~40); default 256
  --watch-pid <pid>    a local process (gateway, redis) whose CPU time to
                       report; repeat for several. The machine's busy cores
                       and this tool's CPU are always reported.
  --out <file>         write the JSON result there
  -h, --help           print this help

Times take a unit: 500ms, 10s, 2m. Every target must be on this machine
(127.0.0.0/8, ::1 or localhost). Clients bind source addresses 127.0.0.2,
127.0.0.3, ... so that many connections do not run out of ports.

Exit status: 0 passed; 1 ran, but a figure that must be 0 was not (lost,
duplicated, errors); 2 could not run; 64 bad command line.";

/// What the command line asks for.
#[derive(Debug)]
pub enum Command {
    Help,
    Pods {
        options: pods::Options,
        out: Option<PathBuf>,
    },
    Publish {
        options: publish::Options,
        out: Option<PathBuf>,
    },
}

/// A command line that cannot be run; the message names the flag.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    #[error("{0}")]
    Bad(String),
    #[error(transparent)]
    Target(#[from] Error),
}

fn bad<T>(message: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError::Bad(message.into()))
}

/// Reads the arguments (without the program name).
pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Command, UsageError> {
    let args: Vec<String> = args.into_iter().collect();
    if args.is_empty() || args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(Command::Help);
    }
    let mut flags = Flags::read(&args[1..])?;
    let out = flags.one("out")?.map(PathBuf::from);
    let size = flags.parsed("size", parse_number)?.unwrap_or(DEFAULT_SIZE);
    let command = match args[0].as_str() {
        "pods" => {
            let gateways = flags
                .all("gateway")
                .iter()
                .map(|g| Target::websocket(g))
                .collect::<Result<Vec<_>, _>>()?;
            let Some(first) = gateways.first().cloned() else {
                return bad("pods needs at least one --gateway ws://127.0.0.1:PORT");
            };
            let mut options = pods::Options::new(first);
            options.gateways = gateways;
            if let Some(url) = flags.one("publish-to")? {
                options.publish_to = Target::http(&url)?;
            }
            options.size = size;
            flags.set(&mut options.clients, "clients", parse_number)?;
            flags.set(&mut options.rate, "rate", parse_rate)?;
            flags.set(&mut options.duration, "duration", parse_duration)?;
            flags.set(&mut options.warmup, "warmup", parse_number)?;
            flags.set(&mut options.connections, "connections", parse_number)?;
            flags.set(&mut options.drain, "drain", parse_duration)?;
            options.topic = flags.one("topic")?;
            options.watch = flags.pids()?;
            Command::Pods { options, out }
        }
        "publish" => {
            let Some(url) = flags.one("publish-to")? else {
                return bad("publish needs --publish-to http://127.0.0.1:PORT");
            };
            let mut options = publish::Options::new(Target::http(&url)?);
            options.size = size;
            flags.set(&mut options.concurrency, "concurrency", parse_number)?;
            flags.set(&mut options.topics, "topics", parse_number)?;
            options.watch = flags.pids()?;
            flags.set(&mut options.duration, "duration", parse_duration)?;
            Command::Publish { options, out }
        }
        other => return bad(format!("unknown scenario `{other}` (pods, publish)")),
    };
    flags.finish()?;
    Ok(command)
}

/// `--name value` and `--name=value` pairs, in order; each taken at most once.
struct Flags(Vec<(String, String)>);

impl Flags {
    fn read(args: &[String]) -> Result<Self, UsageError> {
        let mut pairs = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let Some(flag) = arg.strip_prefix("--") else {
                return bad(format!("unexpected argument `{arg}`"));
            };
            let (name, value) = match flag.split_once('=') {
                Some((name, value)) => (name.to_owned(), value.to_owned()),
                None => match it.next() {
                    Some(value) => (flag.to_owned(), value.clone()),
                    None => return bad(format!("--{flag} needs a value")),
                },
            };
            pairs.push((name, value));
        }
        Ok(Self(pairs))
    }

    /// Every value of a repeatable flag.
    fn all(&mut self, name: &str) -> Vec<String> {
        let (taken, rest) = std::mem::take(&mut self.0)
            .into_iter()
            .partition(|(n, _)| n == name);
        self.0 = rest;
        taken.into_iter().map(|(_, v)| v).collect()
    }

    /// Every `--watch-pid`.
    fn pids(&mut self) -> Result<Vec<u32>, UsageError> {
        self.all("watch-pid")
            .iter()
            .map(|p| match p.parse() {
                Ok(pid) => Ok(pid),
                Err(_) => bad(format!("--watch-pid: `{p}` is not a process id")),
            })
            .collect()
    }

    /// The value of a flag given at most once.
    fn one(&mut self, name: &str) -> Result<Option<String>, UsageError> {
        let mut values = self.all(name);
        match values.len() {
            0 | 1 => Ok(values.pop()),
            _ => bad(format!("--{name} given more than once")),
        }
    }

    fn parsed<T>(
        &mut self,
        name: &str,
        parse: fn(&str) -> Option<T>,
    ) -> Result<Option<T>, UsageError> {
        match self.one(name)? {
            None => Ok(None),
            Some(v) => match parse(&v) {
                Some(value) => Ok(Some(value)),
                None => bad(format!("--{name}: cannot read `{v}`")),
            },
        }
    }

    /// Sets `field` from the flag, when given.
    fn set<T>(
        &mut self,
        field: &mut T,
        name: &str,
        parse: fn(&str) -> Option<T>,
    ) -> Result<(), UsageError> {
        if let Some(value) = self.parsed(name, parse)? {
            *field = value;
        }
        Ok(())
    }

    /// Fails on any flag nobody took.
    fn finish(self) -> Result<(), UsageError> {
        match self.0.first() {
            None => Ok(()),
            Some((name, _)) => bad(format!("unknown option --{name} for this scenario")),
        }
    }
}

fn parse_number(s: &str) -> Option<usize> {
    s.replace('_', "").parse().ok()
}

fn parse_rate(s: &str) -> Option<f64> {
    s.parse().ok().filter(|r: &f64| r.is_finite())
}

/// `500ms`, `10s`, `1.5s`, `2m`.
pub fn parse_duration(s: &str) -> Option<Duration> {
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (number, unit) = s.split_at(split);
    let number: f64 = number.parse().ok()?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        _ => return None,
    };
    Duration::try_from_secs_f64(seconds).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn pods_takes_several_gateways_and_publishes_to_the_first_by_default() {
        let Ok(Command::Pods { options, out }) = parse(args(
            "pods --gateway ws://127.0.0.1:8080 --gateway=ws://127.0.0.1:8081/ws \
             --clients 50 --rate 20.5 --duration 1500ms --size 1024 --out r.json",
        )) else {
            panic!("parsed");
        };
        assert_eq!(options.gateways.len(), 2);
        assert_eq!(options.publish_to.http_url(), "http://127.0.0.1:8080");
        assert_eq!(options.clients, 50);
        assert_eq!(options.rate, 20.5);
        assert_eq!(options.duration, Duration::from_millis(1500));
        assert_eq!(options.size, 1024);
        assert_eq!(out, Some(PathBuf::from("r.json")));
    }

    #[test]
    fn mistakes_are_named() {
        for (line, says) in [
            ("pods", "--gateway"),
            ("pods --gateway ws://127.0.0.1:1 --clientz 5", "--clientz"),
            (
                "pods --gateway ws://127.0.0.1:1 --duration 10",
                "--duration",
            ),
            ("pods --gateway ws://10.1.2.3:80", "not loopback"),
            (
                "publish --publish-to http://127.0.0.1:1 --gateway ws://127.0.0.1:1",
                "--gateway",
            ),
            (
                "publish --publish-to http://127.0.0.1:1 --topics 1 --topics 2",
                "more than once",
            ),
            ("fanout", "unknown scenario"),
        ] {
            let e = parse(args(line)).expect_err(line).to_string();
            assert!(e.contains(says), "{line}: {e}");
        }
    }

    #[test]
    fn durations_take_units() {
        assert_eq!(parse_duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_duration("10"), None);
        assert_eq!(parse_duration("10h"), None);
    }
}
