//! The command line: `herald-loadtest <scenario> [--flag value]...`, one
//! subcommand per scenario (clap), each flag defaulting to the scenario's
//! `DEFAULT_*` constant; times are humantime's (`500ms`, `10s`, `2m`).
//! `report <dir>` renders BENCHMARKS.md from the result files (see
//! [`crate::report`]).
//!
//! Here, the program and its subcommands ([`Cli`], [`Command`]); each
//! family's flags, and how they make the scenario's `Options`, in a module
//! of their own:
//! - [`mod@fanout`]: the scenarios on fanout's engine and its floor: `pods`,
//!   `fanout`, `slow`, `floor` (and its readers' process), with the flags
//!   they share ([`Spread`], [`Rounds`]).
//! - [`capacity`]: how much a gateway takes: `publish`, `idle` (and its
//!   worker process), `throughput`, `wire`.
//! - [`faults`]: the scenarios that break something and check what the
//!   clients saw: `storm`, `sse-failover`, `chaos`, `stall`; and `proxy`,
//!   the bad network they go through.
//! - [`mod@presence`]: `presence`, a room of many members on pods it
//!   runs, drains and kills.
//! - [`mod@hooks`]: `hooks`, the backend hooks (connect and publish
//!   proxies, webhooks) against a backend of its own, on pods it runs.
//! - [`mod@run`]: `run`, one run of scripts/bench.sh.
//! - [`output`]: the flags every scenario's result takes ([`Out`],
//!   [`Watch`]).
//! - [`values`]: the values flags take: counts, bytes, rates.

mod capacity;
mod fanout;
mod faults;
mod hooks;
mod output;
mod presence;
mod run;
mod values;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::scenarios::{floor, idle};

pub use self::capacity::{
    FormatsArgs, IdleArgs, PublishArgs, ThroughputArgs, WireArgs, WorkerArgs,
};
pub use self::fanout::{FanoutArgs, FloorArgs, PodsArgs, ReadersArgs, Rounds, SlowArgs, Spread};
pub use self::faults::{ChaosArgs, ProxyArgs, SseFailoverArgs, StallArgs, StormArgs};
pub use self::hooks::HooksArgs;
pub use self::output::{Out, Watch};
pub use self::presence::PresenceArgs;
pub use self::run::RunArgs;

/// Exit code for a bad command line (EX_USAGE).
pub const EXIT_USAGE: u8 = 64;

const AFTER_HELP: &str = "\
Times take a unit: 500ms, 10s, 2m. Every target must be on this machine
(127.0.0.0/8, ::1 or localhost). Clients bind source addresses 127.0.0.2,
127.0.0.3, ... so that many connections do not run out of ports.

Exit status: 0 passed; 1 ran, but a figure that must be 0 was not (lost,
duplicated, errors); 2 could not run; 64 bad command line.";

/// Load and latency measurements against Herald gateways on this machine.
#[derive(Debug, Parser)]
#[command(
    name = "herald-loadtest",
    version,
    after_help = AFTER_HELP,
    arg_required_else_help = true
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// What the command line asks for: a scenario, a hidden helper process, or
/// a report.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Clients spread over the --gateway URLs, all on one topic; a paced
    /// publisher posts to --publish-to. Delivery latency per (message,
    /// client), messages lost and duplicated (both must be 0).
    Pods(PodsArgs),
    /// --clients on --topics topics (client i on topic i % n), spread over
    /// the --gateway URLs; --rounds rounds --interval apart, each one
    /// message per topic, stamped with the round's start.
    ///
    /// Per round p50/p99/max (its max: the last client); over the run the
    /// last client's median/p99/worst; each --gateway-pid/--watch-pid
    /// process's CPU and RSS per round. Lost/duplicated must be 0.
    Fanout(FanoutArgs),
    /// `fanout` in two phases on the same clients: --rounds rounds, then
    /// --slow clients that never read join (SO_RCVBUF --recv-buffer), and
    /// --rounds more.
    ///
    /// The healthy clients' p99 and last client without and with them; when
    /// the gateway closed each slow client (read from its /metrics every
    /// 100ms); RSS from the slow phase's round 5 on.
    Slow(SlowArgs),
    /// The kernel's cost: one thread writes the same frames (a gateway's
    /// msg, --size payload) to --clients plain loopback sockets.
    ///
    /// Blocking writes, no WebSocket library; the readers (a second
    /// herald-loadtest process) read them as fanout's clients do. Per round
    /// the last client, the time to write a round and the writer thread's
    /// CPU.
    Floor(FloorArgs),
    /// `floor`'s readers' process.
    #[command(name = floor::READERS_COMMAND, hide = true)]
    FloorReaders(ReadersArgs),
    /// Publish throughput: --concurrency keep-alive connections publish back
    /// to back to --topics topics for --duration.
    Publish(PublishArgs),
    /// Clients with sessions, subscribed and acking while a paced publisher
    /// runs; at --cut-at every connection is cut at once, or --kill-pid
    /// kills a gateway.
    ///
    /// Every client resumes (jittered backoff, or the server's reconnect
    /// advice) at a gateway picked at random. Time until all are resumed;
    /// lost and (application) duplicated messages must be 0, every session
    /// must resume.
    Storm(StormArgs),
    /// Server-sent event streams across a pod's death: --clients
    /// EventSource-style clients round-robin over the --gateway URLs (pods
    /// sharing a Redis), a paced publisher on a pod that survives; at
    /// --kill-at, --kill-pid is killed with SIGKILL (without it, the tool
    /// drops every stream).
    ///
    /// Each client whose stream ends comes back as EventSource does (after
    /// the server's retry:, with Last-Event-ID) at the next gateway. Per
    /// client, messages lost and duplicated (both must be 0), resets (must
    /// be 0), the time until every cut client reads again.
    #[command(name = "sse-failover")]
    SseFailover(SseFailoverArgs),
    /// A soak with its own cluster: a Redis master and replica, --pods
    /// herald pods (--herald) reaching Redis through a proxy of this tool,
    /// --clients clients with sessions resuming at random pods, --publishers
    /// posting to random pods; meanwhile a seeded schedule freezes Redis,
    /// delays it, fails over to a lagging replica, restarts it from an old
    /// dump and kills pods.
    ///
    /// Every client's stream is checked per topic: no seq lost or processed
    /// twice within an epoch, every message the publish acknowledged at its
    /// seq, and every reset after a fault that really lost writes (or a gap
    /// the history could not bridge). Needs redis-server and redis-cli.
    Chaos(ChaosArgs),
    /// A Redis-backed pod watches --connections x --topics-per-connection
    /// topics and a canary topic, published every --canary-interval and
    /// read on a connection of its own; Redis sits behind `herald-loadtest
    /// proxy`, whose --proxy-control sets --redis-delay once the setup is
    /// done.
    ///
    /// Three phases, each a fixed time: steady; a burst of --burst-topics
    /// new topics; the pod's pub/sub connection killed (CLIENT KILL TYPE
    /// pubsub, sent to --redis directly). Per phase the canary's p50/p99/max
    /// latency, the longest time with no canary delivery, and canary
    /// messages not delivered by the end; every canary seq must arrive once
    /// and in order. The pod needs HERALD_SESSION__MAX_SUBSCRIPTIONS at
    /// least --topics-per-connection (default 1000), and its budgets per
    /// address off (HERALD_SESSION__MAX_SUBSCRIPTIONS_PER_IP,
    /// __TOPICS_PER_MINUTE and __ANONYMOUS_MAX_TOPICS at 0): its thousands of
    /// topics are subscribed from this machine's few addresses.
    Stall(StallArgs),
    /// A room of --members members (each a user with a token and an `info`
    /// claim) on --pods pods of --herald sharing a redis-server it starts;
    /// messages flow while members leave and join again.
    ///
    /// Phases: join; flow (message latency, the diffs each subscriber is
    /// sent); quiet (the room's presence memory in Redis, Redis writes per
    /// member); queries (a page of --page-size members and the stats, timed
    /// by the client and by the pod); a rolling restart of every pod
    /// (presence frames per subscriber, sessions resumed); kill -9 of the
    /// pod with the most members (until they are gone from presence and
    /// every leave is sent). Needs redis-server and redis-cli.
    Presence(PresenceArgs),
    /// Issue #24's backend hooks on pods of --herald it runs, against a
    /// backend of its own on loopback answering each proxy call after
    /// --delay (timing itself) and counting webhooks.
    ///
    /// Handshakes: --handshakes clients (--concurrency at once) say `hello`
    /// without a token (the connect proxy, user by cookie), then as many
    /// with an HS256 token (no proxy): handshakes per second, latency,
    /// target >= 5,000/s through the proxy. Publishes: clients alternate
    /// `pub`s through the publish proxy and without it: pub->ok less the
    /// backend's own time, target <= 2 ms added at p99. Webhooks (a second
    /// pod): clients connect, publish and close; events per second
    /// delivered, batch sizes, every event accounted for. --quick: a run of
    /// well under a minute.
    Hooks(HooksArgs),
    /// A TCP proxy on this machine that adds a delay, loss or a partition
    /// between its clients and --upstream (Redis behind a bad network, where
    /// `tc netem` is not available), changed through --control: one command
    /// a line (`delay 200ms`, `loss 10`, `partition`, `heal`, `show`).
    /// Stops after --for, or when killed.
    Proxy(ProxyArgs),
    /// --clients connections spread over the --gateway URLs, each subscribed
    /// to one topic, held for --duration while the gateways ping them.
    ///
    /// Every ping is answered. Gateway RSS per connection (with
    /// --gateway-pid), unexpected closes (must be 0). --transport sse or
    /// stream: server-sent event or HTTP-streaming streams instead, their
    /// heartbeats read. Clients past what one
    /// process may open are held by worker processes (this program again),
    /// each with its own file-descriptor limit.
    ///
    /// The gateway needs HERALD_WEBSOCKET__MAX_CONNECTIONS above its share
    /// (default 10000; 19500 for 19,000), and for heartbeats within a short
    /// hold a short HERALD_WEBSOCKET__PING_INTERVAL (e.g. 5s). Measure memory
    /// on freshly started gateways: RSS rarely shrinks, so a second run on
    /// the same process shows little growth. Several pods:
    /// HERALD_BROKER=redis HERALD_REDIS__URL=redis://127.0.0.1:PORT, and on
    /// a busy machine HERALD_REDIS__COMMAND_TIMEOUT=5s (tens of thousands of
    /// subs at once; a sub answered `unavailable` fails the run).
    Idle(IdleArgs),
    /// `idle`'s worker process.
    #[command(name = idle::WORKER_COMMAND, hide = true)]
    IdleWorker(WorkerArgs),
    /// --clients clients each subscribe to --subscriptions of --topics
    /// topics; --concurrency keep-alive connections publish back to back
    /// round-robin over the topics for --duration.
    ///
    /// Deliveries per second and per gateway CPU-second (with
    /// --gateway-pid); lost, duplicated (both must be 0). --transport sse
    /// or stream: the same over server-sent events (the topics in GET
    /// /sse's query, at most the gateway's streams.max_topics) or
    /// HTTP-streaming (`POST /stream`, the subs by `POST /stream/<session>`).
    Throughput(ThroughputArgs),
    /// Bytes on the wire per message: each payload (a JSON string of that
    /// size) is published and its frame read off a raw socket, against a
    /// minimal HTTP/1.1 POST of the same payload.
    ///
    /// Herald's bytes: header + msg envelope + payload; the POST's: Host,
    /// Content-Type, Content-Length and the payload. Payloads over 64 KiB
    /// need the gateway started with HERALD_HTTP__MAX_BODY_BYTES=2097152
    /// HERALD_QUEUE__BYTES=4194304 (the publish body, and each client's
    /// queue, must hold one).
    Wire(WireArgs),
    /// Bytes on the wire and gateway CPU per delivery in each wire format
    /// (issue #26): JSON, protobuf (`herald.v1.protobuf`), each without and
    /// with permessage-deflate, and each of those with deltas; for a chat
    /// payload (~200 B) and a 2-4 KiB state that changes a little per update.
    ///
    /// One phase per payload and format: --clients clients subscribe to a
    /// fresh topic, --updates publications --interval apart; every payload
    /// is put back together and checked against the one published (a wrong
    /// delta fails the run). The delta formats need the topics' namespace
    /// with deltas on (HERALD_NAMESPACES__DEFAULT__DELTA=true).
    Formats(FormatsArgs),
    /// One run of scripts/bench.sh: starts what it needs (--pods herald
    /// pods of --herald, --redis, a proxy), runs the scenario after `--`
    /// against them, writes DIR/NAME.json and the pods' logs there, and
    /// stops them.
    ///
    /// The scenario gets the servers' flags besides its own: --gateway
    /// (each pod, or --clients-on's), --gateway-pid or --watch-pid (the pods
    /// and Redis), --publish-to (the first pod); stall also --redis and
    /// --proxy-control. With --before, the same again against that binary,
    /// as NAME-before (and NAME-before.label for the page).
    Run(RunArgs),
    /// Renders BENCHMARKS.md (Markdown, on stdout) from the JSON results
    /// (`--out`) in a directory, read through the types the scenarios write
    /// them with, and the other files scripts/bench.sh leaves there (perf
    /// profiles, BEFORE= labels, idle_memory's output, herald logs).
    Report {
        /// The directory (scripts/bench.sh's $OUT, target/bench).
        dir: PathBuf,
        /// Where criterion keeps its estimates (the micro-benchmarks').
        #[arg(long, value_name = "DIR", default_value = crate::report::results::DEFAULT_CRITERION)]
        criterion: PathBuf,
    },
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::CommandFactory;

    use super::*;

    pub(super) fn parse(line: &str) -> Result<Command, clap::Error> {
        parse_args(line.split_whitespace().map(str::to_owned))
    }

    pub(super) fn parse_args(
        args: impl IntoIterator<Item = String>,
    ) -> Result<Command, clap::Error> {
        let program = std::iter::once("herald-loadtest".to_owned());
        Cli::try_parse_from(program.chain(args)).map(|cli| cli.command)
    }

    /// Each line fails, and its message names what is wrong.
    pub(super) fn assert_named(cases: &[(&str, &str)]) {
        for (line, says) in cases {
            let e = parse(line).expect_err(line).to_string();
            assert!(e.contains(says), "{line}: {e}");
        }
    }

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
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
                "cannot be used multiple times",
            ),
            ("fanout", "--gateway"),
            ("slow --gateway ws://127.0.0.1:1 --floor", "--floor"),
            ("floor --gateway ws://127.0.0.1:1", "--gateway"),
            (
                "fanout --gateway ws://127.0.0.1:1 --interval 5",
                "--interval",
            ),
            ("storms", "storms"),
        ]);
    }

    #[test]
    fn report_takes_a_directory() {
        let Ok(Command::Report { dir, criterion }) = parse("report target/bench") else {
            panic!("parsed");
        };
        assert_eq!(dir, PathBuf::from("target/bench"));
        assert_eq!(criterion, PathBuf::from("target/criterion"));
        assert_named(&[("report", "<DIR>")]);
    }

    #[test]
    fn times_take_units() {
        let duration = |s: &str| {
            parse(&format!(
                "publish --publish-to http://127.0.0.1:1 --duration {s}"
            ))
            .map(|c| match c {
                Command::Publish(args) => args.options().duration,
                _ => panic!("publish"),
            })
            .ok()
        };
        assert_eq!(duration("500ms"), Some(Duration::from_millis(500)));
        assert_eq!(duration("2m"), Some(Duration::from_secs(120)));
        assert_eq!(duration("1s500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(duration("10"), None);
        assert_eq!(duration("10parsecs"), None);
    }
}
