//! The command line: `herald-loadtest <scenario> [--flag value]...`, read
//! into the scenario's `Options`. Hand-written, like `herald`'s own.

use std::path::PathBuf;
use std::time::Duration;

use crate::scenarios::{
    DEFAULT_SIZE, fanout, floor, idle, pods, publish, slow, storm, throughput, wire,
};
use crate::sessions::Cut;
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
  fanout    --clients on --topics topics (client i on topic i % n), spread over
            the --gateway URLs; --rounds rounds --interval apart, each one
            message per topic, stamped with the round's start. Per round
            p50/p99/max (its max: the last client); over the run the last
            client's median/p99/worst; each --gateway-pid/--watch-pid
            process's CPU and RSS per round. Lost/duplicated must be 0.
              --gateway <ws://127.0.0.1:PORT[/ws]>  repeat for several (required)
              --publish-to <http://127.0.0.1:PORT>  default: the first gateway
              --clients <n>       default 1000
              --topics <n>        default 1
              --rounds <n>        measured rounds; default 40
              --interval <time>   default 500ms
              --warmup <n>        rounds first, not timed; default 2
              --connections <n>   publisher keep-alive connections; default 4
              --drain <time>      wait for late deliveries; default 5s
              --topic <name>      the topic (or prefix); default: fresh
              --gateway-pid <pid> the gateway (its CPU and RSS per round;
                                  same as --watch-pid, listed first)
              --floor             run `floor` first with the same clients,
                                  rounds, interval and size, and report the
                                  last client as multiples of the floor's
  slow      `fanout` in two phases on the same clients: --rounds rounds, then
            --slow clients that never read join (SO_RCVBUF --recv-buffer),
            and --rounds more. The healthy clients' p99 and last client
            without and with them; when the gateway closed each slow client
            (read from its /metrics every 100ms); RSS from the slow phase's
            round 5 on. Takes fanout's options (not --floor), and:
              --slow <n>          default 1
              --recv-buffer <bytes> default 4096
              --close-wait <time> after the rounds, wait this long at most
                                  for the slow clients' closes; default 7s
  floor     the kernel's cost: one thread writes the same frames (a
            gateway's msg, --size payload) to --clients plain loopback
            sockets, blocking writes, no WebSocket library; the readers (a
            second herald-loadtest process) read them as fanout's clients
            do. Per round the last client, the time to write a round and the
            writer thread's CPU.
              --clients <n>  --rounds <n>  --interval <time>  --warmup <n>
              --drain <time>      as for fanout
  publish   publish throughput: --concurrency keep-alive connections publish
            back to back to --topics topics for --duration.
              --publish-to <http://127.0.0.1:PORT>  (required)
              --concurrency <n>   default 16
              --topics <n>        default 100
              --duration <time>   default 10s
  storm     clients with sessions, subscribed and acking while a paced
            publisher runs; at --cut-at every connection is cut at once
            (abortive close), or --kill-pid kills a gateway with SIGKILL;
            every client resumes (jittered backoff, or the server's
            reconnect advice) at a gateway picked at random. Time until all
            are resumed; lost and (application) duplicated messages must be 0,
            every session must resume.
              --gateway <ws://127.0.0.1:PORT[/ws]>  repeat for several pods (required)
              --publish-to <http://127.0.0.1:PORT>  default: the first gateway
                                  (with --kill-pid: the first not killed)
              --clients <n>       default 1000
              --topics <n>        client i on topic i % n; default 10
              --rate <msgs/s>     over all topics; default 50
              --duration <time>   how long the publisher runs; default 10s
              --cut-at <time>     from the first publish; default 3s
              --drain <time>      after the last publish, wait for resumes
                                  and deliveries; default 10s
              --backoff <time>    first reconnect waits up to this; default 100ms
              --backoff-cap <time> no reconnect waits longer; default 2s
              --ack-interval <time> cumulative acks at most this often
                                  (0ms: every message); default 20ms
              --cut <how>         reset: abortive close, the gateway sees a
                                  reset (default); half-open: old connections
                                  left open and silent, the resume takes over
              --kill-pid <pid>    SIGKILL this gateway process (it must listen
                                  on a --gateway port; needs broker = redis)
                                  instead of cutting the connections
              --connections <n>   publisher keep-alive connections; default 4
              --token <jwt>       every client's hello.token (a gateway that
                                  checks tokens verifies one per hello)
  idle      --clients connections spread over the --gateway URLs, each
            subscribed to one topic, held for --duration while the gateways
            ping them (every ping is answered). Gateway RSS per connection
            (with --gateway-pid), unexpected closes (must be 0). Clients past
            what one process may open are held by worker processes (this
            program again), each with its own file-descriptor limit.
              --gateway <ws://127.0.0.1:PORT[/ws]>  repeat for several pods (required)
              --gateway-pid <pid> each gateway's process, in --gateway order
              --clients <n>       default 1000
              --duration <time>   the hold, once all are connected; default 60s
              --processes <n>     processes holding the clients; default: as few
                                  as the hard file-descriptor limit allows
              --topic <name>      default: a fresh topic per run
            The gateway needs HERALD_WEBSOCKET__MAX_CONNECTIONS above its
            share (default 10000; 19500 for 19,000), and for heartbeats within
            a short hold a short HERALD_WEBSOCKET__PING_INTERVAL (e.g. 5s).
            Measure memory on freshly started gateways: RSS rarely shrinks,
            so a second run on the same process shows little growth.
            Several pods: HERALD_BROKER=redis HERALD_REDIS__URL=redis://127.0.0.1:PORT,
            and on a busy machine HERALD_REDIS__COMMAND_TIMEOUT=5s (tens of
            thousands of subs at once; a sub answered `unavailable` fails the run).
  throughput
            --clients clients each subscribe to --subscriptions of --topics
            topics; --concurrency keep-alive connections publish back to back
            round-robin over the topics for --duration. Deliveries per second
            and per gateway CPU-second (with --gateway-pid); lost, duplicated
            (both must be 0).
              --gateway <ws://127.0.0.1:PORT[/ws]>  (required)
              --publish-to <http://127.0.0.1:PORT>  default: the gateway
              --gateway-pid <pid> the gateway's process, for its CPU time
              --clients <n>       default 200
              --topics <n>        default 100
              --subscriptions <n> topics per client; default 50
              --concurrency <n>   default 8
              --duration <time>   default 10s
              --drain <time>      wait for late deliveries; default 5s
              --size <bytes>      here: default 64
  wire      bytes on the wire per message: each payload (a JSON string of
            that size) is published and its frame read off a raw socket
            (header + msg envelope + payload), against a minimal HTTP/1.1
            POST (Host, Content-Type, Content-Length) of the same payload.
              --gateway <ws://127.0.0.1:PORT[/ws]>  (required)
              --publish-to <http://127.0.0.1:PORT>  default: the gateway
              --sizes <list>      bytes, comma-separated (KiB, MiB taken);
                                  default 10,125,126,1KiB,64KiB,1MiB
              --topic <name>      default: a fresh 8-character one
            Payloads over 64 KiB need the gateway started with
            HERALD_HTTP__MAX_BODY_BYTES=2097152 HERALD_QUEUE__BYTES=4194304
            (the publish body, and each client's queue, must hold one).

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
    Fanout {
        options: fanout::Options,
        out: Option<PathBuf>,
    },
    Slow {
        options: slow::Options,
        out: Option<PathBuf>,
    },
    Floor {
        options: floor::Options,
        out: Option<PathBuf>,
    },
    /// `floor`'s hidden readers' process.
    FloorReaders(floor::Readers),
    Storm {
        options: storm::Options,
        out: Option<PathBuf>,
    },
    Idle {
        options: idle::Options,
        out: Option<PathBuf>,
    },
    /// `idle`'s hidden worker process.
    IdleWorker(idle::Worker),
    Throughput {
        options: throughput::Options,
        out: Option<PathBuf>,
    },
    Wire {
        options: wire::Options,
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
    let size_given = flags.parsed("size", parse_number)?;
    let size = size_given.unwrap_or(DEFAULT_SIZE);
    let command = match args[0].as_str() {
        "pods" => {
            let (first, gateways) = flags.gateways_for("pods")?;
            let mut options = pods::Options::new(first);
            flags.fanout(&mut options.fanout, gateways, size)?;
            flags.set(&mut options.rate, "rate", parse_rate)?;
            flags.set(&mut options.duration, "duration", parse_duration)?;
            Command::Pods { options, out }
        }
        "fanout" | "slow" => {
            let (first, gateways) = flags.gateways_for(&args[0])?;
            let mut options = fanout::Options::new(first);
            flags.fanout(&mut options, gateways, size)?;
            flags.set(&mut options.topics, "topics", parse_number)?;
            flags.set(&mut options.rounds, "rounds", parse_number)?;
            flags.set(&mut options.interval, "interval", parse_duration)?;
            // The gateway first: its figures lead the table.
            let mut watch = flags.pid_list("gateway-pid")?;
            watch.append(&mut options.watch);
            options.watch = watch;
            if args[0] == "fanout" {
                if flags.one(FLOOR_SWITCH)?.is_some() {
                    options.floor = Some(this_executable()?);
                }
                Command::Fanout { options, out }
            } else {
                let mut options = slow::Options::new(options);
                flags.set(&mut options.slow, "slow", parse_number)?;
                flags.set(&mut options.recv_buffer, "recv-buffer", |s| {
                    parse_number(s).and_then(|n| u32::try_from(n).ok())
                })?;
                flags.set(&mut options.close_wait, "close-wait", parse_duration)?;
                Command::Slow { options, out }
            }
        }
        "floor" => {
            let mut options = floor::Options::new(this_executable()?);
            options.size = size;
            flags.set(&mut options.clients, "clients", parse_number)?;
            flags.set(&mut options.rounds, "rounds", parse_number)?;
            flags.set(&mut options.interval, "interval", parse_duration)?;
            flags.set(&mut options.warmup, "warmup", parse_number)?;
            flags.set(&mut options.drain, "drain", parse_duration)?;
            Command::Floor { options, out }
        }
        floor::READERS_COMMAND => {
            let (Some(connect), Some(clients), Some(rounds), Some(warmup), Some(deadline)) = (
                flags.parsed("connect", |s| s.parse().ok())?,
                flags.parsed("clients", parse_number)?,
                flags.parsed("rounds", parse_number)?,
                flags.parsed("warmup", parse_number)?,
                flags.parsed("deadline", parse_duration)?,
            ) else {
                return bad(
                    "the floor's readers need --connect, --clients, --rounds, --warmup and --deadline",
                );
            };
            Command::FloorReaders(floor::Readers {
                connect,
                clients,
                rounds,
                warmup,
                deadline,
            })
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
        "storm" => {
            let (first, gateways) = flags.gateways_for("storm")?;
            let mut options = storm::Options::new(first);
            options.gateways = gateways;
            options.publish_to = flags.publish_to()?;
            options.size = size;
            flags.set(&mut options.clients, "clients", parse_number)?;
            flags.set(&mut options.topics, "topics", parse_number)?;
            flags.set(&mut options.rate, "rate", parse_rate)?;
            flags.set(&mut options.duration, "duration", parse_duration)?;
            flags.set(&mut options.cut_at, "cut-at", parse_duration)?;
            flags.set(&mut options.drain, "drain", parse_duration)?;
            flags.set(&mut options.backoff.first, "backoff", parse_duration)?;
            flags.set(&mut options.backoff.cap, "backoff-cap", parse_duration)?;
            flags.set(&mut options.ack_interval, "ack-interval", parse_duration)?;
            flags.set(&mut options.cut, "cut", |c| match c {
                "reset" => Some(Cut::Reset),
                "half-open" => Some(Cut::HalfOpen),
                _ => None,
            })?;
            flags.set(&mut options.connections, "connections", parse_number)?;
            options.kill_pid = flags.parsed("kill-pid", |p| p.parse().ok())?;
            options.token = flags.parsed("token", |t| Some(t.to_owned()))?;
            options.watch = flags.pids()?;
            Command::Storm { options, out }
        }
        "idle" => {
            let (first, gateways) = flags.gateways_for("idle")?;
            if size_given.is_some() {
                return bad("idle publishes nothing: no --size");
            }
            let mut options = idle::Options::new(first);
            options.gateways = gateways;
            options.gateway_pids = flags.pid_list("gateway-pid")?;
            flags.set(&mut options.clients, "clients", parse_number)?;
            flags.set(&mut options.duration, "duration", parse_duration)?;
            flags.set(&mut options.processes, "processes", parse_number)?;
            options.topic = flags.one("topic")?;
            options.watch = flags.pids()?;
            Command::Idle { options, out }
        }
        idle::WORKER_COMMAND => {
            let gateways = flags.gateways()?;
            let (Some(first), Some(clients), Some(topic), Some(max_hold)) = (
                flags.parsed("first", parse_number)?,
                flags.parsed("clients", parse_number)?,
                flags.one("topic")?,
                flags.parsed("max-hold", parse_duration)?,
            ) else {
                return bad("the worker needs --first, --clients, --topic and --max-hold");
            };
            Command::IdleWorker(idle::Worker {
                gateways,
                first,
                clients,
                topic,
                max_hold,
            })
        }
        "throughput" => {
            let mut options = throughput::Options::new(flags.gateway_for("throughput")?);
            if let Some(target) = flags.publish_to()? {
                options.publish_to = target;
            }
            options.gateway_pid = flags.pid_list("gateway-pid")?.pop();
            options.size = size_given.unwrap_or(throughput::DEFAULT_SIZE);
            flags.set(&mut options.clients, "clients", parse_number)?;
            flags.set(&mut options.topics, "topics", parse_number)?;
            flags.set(&mut options.subscriptions, "subscriptions", parse_number)?;
            flags.set(&mut options.concurrency, "concurrency", parse_number)?;
            flags.set(&mut options.duration, "duration", parse_duration)?;
            flags.set(&mut options.drain, "drain", parse_duration)?;
            options.watch = flags.pids()?;
            Command::Throughput { options, out }
        }
        "wire" => {
            let gateway = flags.gateway_for("wire")?;
            if size_given.is_some() {
                return bad("wire takes --sizes, not --size");
            }
            let mut options = wire::Options::new(gateway);
            if let Some(target) = flags.publish_to()? {
                options.publish_to = target;
            }
            flags.set(&mut options.sizes, "sizes", parse_sizes)?;
            options.topic = flags.one("topic")?;
            Command::Wire { options, out }
        }
        other => {
            return bad(format!(
                "unknown scenario `{other}` (fanout, slow, floor, pods, publish, storm, idle, throughput, wire)"
            ));
        }
    };
    flags.finish()?;
    Ok(command)
}

/// `fanout --floor`: the one flag without a value.
const FLOOR_SWITCH: &str = "floor";

/// This program, to start `floor`'s readers with.
fn this_executable() -> Result<PathBuf, UsageError> {
    std::env::current_exe()
        .or_else(|_| bad("cannot find this program's path to start the floor's readers"))
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
                None if flag == FLOOR_SWITCH => (flag.to_owned(), "yes".to_owned()),
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

    /// Every `--gateway`, as WebSocket targets.
    fn gateways(&mut self) -> Result<Vec<Target>, UsageError> {
        Ok(self
            .all("gateway")
            .iter()
            .map(|g| Target::websocket(g))
            .collect::<Result<Vec<_>, _>>()?)
    }

    /// Every `--gateway` of a scenario that needs at least one: the first,
    /// which the scenario's options start from, and all of them.
    fn gateways_for(&mut self, scenario: &str) -> Result<(Target, Vec<Target>), UsageError> {
        let gateways = self.gateways()?;
        match gateways.first().cloned() {
            Some(first) => Ok((first, gateways)),
            None => bad(format!(
                "{scenario} needs at least one --gateway ws://127.0.0.1:PORT"
            )),
        }
    }

    /// The one `--gateway` of a scenario that needs exactly one.
    fn gateway_for(&mut self, scenario: &str) -> Result<Target, UsageError> {
        match self.one("gateway")? {
            Some(url) => Ok(Target::websocket(&url)?),
            None => bad(format!("{scenario} needs --gateway ws://127.0.0.1:PORT")),
        }
    }

    /// What `pods`, `fanout` and `slow` share: the gateways, the publisher,
    /// clients, payload, warm-up, drain, topic and watched processes.
    fn fanout(
        &mut self,
        options: &mut fanout::Options,
        gateways: Vec<Target>,
        size: usize,
    ) -> Result<(), UsageError> {
        options.gateways = gateways;
        if let Some(target) = self.publish_to()? {
            options.publish_to = target;
        }
        options.size = size;
        self.set(&mut options.clients, "clients", parse_number)?;
        self.set(&mut options.warmup, "warmup", parse_number)?;
        self.set(&mut options.connections, "connections", parse_number)?;
        self.set(&mut options.drain, "drain", parse_duration)?;
        options.topic = self.one("topic")?;
        options.watch = self.pids()?;
        Ok(())
    }

    /// `--publish-to`, when given.
    fn publish_to(&mut self) -> Result<Option<Target>, UsageError> {
        Ok(self
            .one("publish-to")?
            .map(|url| Target::http(&url))
            .transpose()?)
    }

    /// Every value of a repeatable process-id flag.
    fn pid_list(&mut self, name: &str) -> Result<Vec<u32>, UsageError> {
        self.all(name)
            .iter()
            .map(|p| match p.parse() {
                Ok(pid) => Ok(pid),
                Err(_) => bad(format!("--{name}: `{p}` is not a process id")),
            })
            .collect()
    }

    /// Every `--watch-pid`.
    fn pids(&mut self) -> Result<Vec<u32>, UsageError> {
        self.pid_list("watch-pid")
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

/// Bytes: `1024`, `1KiB`, `64KiB`, `1MiB`.
fn parse_bytes(s: &str) -> Option<usize> {
    let (number, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '_')) {
        Some(at) => s.split_at(at),
        None => (s, ""),
    };
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => return None,
    };
    parse_number(number)?.checked_mul(scale)
}

/// A comma-separated list of [`parse_bytes`].
fn parse_sizes(s: &str) -> Option<Vec<usize>> {
    s.split(',').map(|p| parse_bytes(p.trim())).collect()
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

    /// Each line fails, and its message names what is wrong.
    fn assert_named(cases: &[(&str, &str)]) {
        for (line, says) in cases {
            let e = parse(args(line)).expect_err(line).to_string();
            assert!(e.contains(says), "{line}: {e}");
        }
    }

    #[test]
    fn pods_takes_several_gateways_and_publishes_to_the_first_by_default() {
        let Ok(Command::Pods { options, out }) = parse(args(
            "pods --gateway ws://127.0.0.1:8080 --gateway=ws://127.0.0.1:8081/ws \
             --clients 50 --rate 20.5 --duration 1500ms --size 1024 --out r.json",
        )) else {
            panic!("parsed");
        };
        assert_eq!(options.fanout.gateways.len(), 2);
        assert_eq!(
            options.fanout.publish_to.http_url(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(options.fanout.clients, 50);
        assert_eq!(options.rate, 20.5);
        assert_eq!(options.duration, Duration::from_millis(1500));
        assert_eq!(options.fanout.size, 1024);
        assert_eq!(out, Some(PathBuf::from("r.json")));
    }

    #[test]
    fn mistakes_are_named() {
        assert_named(&[
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
            ("fanout", "--gateway"),
            ("slow --gateway ws://127.0.0.1:1 --floor", "--floor"),
            ("floor --gateway ws://127.0.0.1:1", "--gateway"),
            (
                "fanout --gateway ws://127.0.0.1:1 --interval 5",
                "--interval",
            ),
            ("storms", "unknown scenario"),
        ]);
    }

    #[test]
    fn fanout_reads_rounds_topics_and_the_floor_switch() {
        let Ok(Command::Fanout { options, out }) = parse(args(
            "fanout --gateway ws://127.0.0.1:8080 --clients 10000 --topics 2 --rounds 40 \
             --interval 500ms --floor --size 1024 --gateway-pid 7 --watch-pid 8 --out f.json",
        )) else {
            panic!("parsed");
        };
        assert_eq!(
            (options.clients, options.topics, options.rounds),
            (10_000, 2, 40)
        );
        assert_eq!(options.interval, Duration::from_millis(500));
        assert_eq!(options.size, 1024);
        assert_eq!(options.watch, vec![7, 8], "the gateway first");
        assert!(options.floor.is_some());
        assert_eq!(out, Some(PathBuf::from("f.json")));
        let Ok(Command::Fanout { options, .. }) = parse(args("fanout --gateway ws://127.0.0.1:1"))
        else {
            panic!("parsed");
        };
        assert_eq!(options.floor, None);
        assert_eq!(options.rounds, fanout::DEFAULT_ROUNDS);
    }

    #[test]
    fn slow_and_floor_read_their_own() {
        let Ok(Command::Slow { options, .. }) = parse(args(
            "slow --gateway ws://127.0.0.1:8080 --clients 500 --slow 3 --recv-buffer 2048 \
             --close-wait 10s",
        )) else {
            panic!("parsed");
        };
        assert_eq!((options.fanout.clients, options.slow), (500, 3));
        assert_eq!(options.recv_buffer, 2048);
        assert_eq!(options.close_wait, Duration::from_secs(10));
        let Ok(Command::Floor { options, .. }) = parse(args(
            "floor --clients 10000 --rounds 40 --interval 500ms --size 1024",
        )) else {
            panic!("parsed");
        };
        assert_eq!(
            (options.clients, options.rounds, options.size),
            (10_000, 40, 1024)
        );
        // The readers' command line reads back as it was written.
        let readers = floor::Readers {
            connect: "127.0.0.1:4000".parse().expect("addr"),
            clients: 10,
            rounds: 42,
            warmup: 2,
            deadline: Duration::from_millis(1500),
        };
        let Ok(Command::FloorReaders(back)) = parse(readers.args()) else {
            panic!("parsed");
        };
        assert_eq!(back, readers);
    }

    #[test]
    fn storm_reads_its_cut_backoff_and_kill() {
        let Ok(Command::Storm { options, out }) = parse(args(
            "storm --gateway ws://127.0.0.1:8080 --gateway ws://127.0.0.1:8081 \
             --clients 10_000 --topics 20 --rate 100 --duration 20s --cut-at 5s \
             --drain 15s --backoff 50ms --backoff-cap 1s --ack-interval 0ms \
             --cut half-open --kill-pid 4242 --publish-to http://127.0.0.1:8081 --watch-pid 4243",
        )) else {
            panic!("parsed");
        };
        assert_eq!(options.gateways.len(), 2);
        assert_eq!(
            options.publish_to.map(|t| t.http_url()).as_deref(),
            Some("http://127.0.0.1:8081")
        );
        assert_eq!((options.clients, options.topics), (10_000, 20));
        assert_eq!(options.rate, 100.0);
        assert_eq!(options.duration, Duration::from_secs(20));
        assert_eq!(options.cut_at, Duration::from_secs(5));
        assert_eq!(options.drain, Duration::from_secs(15));
        assert_eq!(options.backoff.first, Duration::from_millis(50));
        assert_eq!(options.backoff.cap, Duration::from_secs(1));
        assert_eq!(options.ack_interval, Duration::ZERO);
        assert_eq!(options.cut, Cut::HalfOpen);
        assert_eq!(options.kill_pid, Some(4242));
        assert_eq!(options.watch, vec![4243]);
        assert_eq!(out, None);

        let Ok(Command::Storm { options, .. }) = parse(args("storm --gateway ws://127.0.0.1:1"))
        else {
            panic!("parsed");
        };
        assert_eq!(options.clients, storm::DEFAULT_CLIENTS);
        assert_eq!(options.cut_at, storm::DEFAULT_CUT_AT);
        assert_eq!(options.kill_pid, None);
        assert_eq!(options.publish_to, None);

        assert_named(&[
            ("storm", "--gateway"),
            (
                "storm --gateway ws://127.0.0.1:1 --kill-pid me",
                "--kill-pid",
            ),
            ("storm --gateway ws://127.0.0.1:1 --cut-at 3", "--cut-at"),
            ("storm --gateway ws://127.0.0.1:1 --cut sideways", "--cut"),
            (
                "storm --gateway ws://127.0.0.1:1 --concurrency 3",
                "--concurrency",
            ),
        ]);
    }

    #[test]
    fn idle_takes_gateways_with_their_pids() {
        let Ok(Command::Idle { options, out }) = parse(args(
            "idle --gateway ws://127.0.0.1:8080 --gateway ws://127.0.0.1:8081 \
             --gateway-pid 11 --gateway-pid 12 --clients 60_000 --duration 60s \
             --processes 4 --watch-pid 13",
        )) else {
            panic!("parsed");
        };
        assert_eq!(options.gateways.len(), 2);
        assert_eq!(options.gateway_pids, vec![11, 12]);
        assert_eq!((options.clients, options.processes), (60_000, 4));
        assert_eq!(options.duration, Duration::from_secs(60));
        assert_eq!(options.watch, vec![13]);
        assert_eq!(out, None);
        assert_named(&[
            ("idle", "--gateway"),
            (
                "idle --gateway ws://127.0.0.1:1 --gateway-pid x",
                "--gateway-pid",
            ),
            ("idle --gateway ws://127.0.0.1:1 --size 10", "--size"),
        ]);
    }

    #[test]
    fn the_idle_worker_reads_back_what_it_is_given() {
        let worker = idle::Worker {
            gateways: vec![
                Target::websocket("ws://127.0.0.1:8080/ws").expect("t"),
                Target::websocket("ws://127.0.0.1:8081/ws").expect("t"),
            ],
            first: 19_000,
            clients: 19_000,
            topic: "loadtest.idle.1.2".to_owned(),
            max_hold: Duration::from_millis(120_500),
        };
        let Ok(Command::IdleWorker(back)) = parse(worker.args()) else {
            panic!("parsed");
        };
        assert_eq!(back, worker);
    }

    #[test]
    fn throughput_and_wire_take_their_options() {
        let Ok(Command::Throughput { options, .. }) = parse(args(
            "throughput --gateway ws://127.0.0.1:8080 --gateway-pid 7 --clients 200 \
             --topics 500 --subscriptions 50 --concurrency 12 --duration 5s",
        )) else {
            panic!("parsed");
        };
        assert_eq!(options.publish_to.http_url(), "http://127.0.0.1:8080");
        assert_eq!(options.gateway_pid, Some(7));
        assert_eq!(options.size, throughput::DEFAULT_SIZE);
        assert_eq!(
            (
                options.clients,
                options.topics,
                options.subscriptions,
                options.concurrency
            ),
            (200, 500, 50, 12)
        );
        let Ok(Command::Wire { options, .. }) = parse(args(
            "wire --gateway ws://127.0.0.1:8080 --sizes 10,125,1KiB,64KiB,1MiB",
        )) else {
            panic!("parsed");
        };
        assert_eq!(options.sizes, vec![10, 125, 1024, 65_536, 1_048_576]);
        let Ok(Command::Wire { options, .. }) = parse(args("wire --gateway ws://127.0.0.1:8080"))
        else {
            panic!("parsed");
        };
        assert_eq!(options.sizes, wire::DEFAULT_SIZES.to_vec());
        assert_named(&[
            ("throughput", "--gateway"),
            ("wire --gateway ws://127.0.0.1:1 --sizes 10,2GB", "--sizes"),
            ("wire --gateway ws://127.0.0.1:1 --size 10", "--sizes"),
        ]);
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
