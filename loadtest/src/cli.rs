//! The command line: `herald-loadtest <scenario> [--flag value]...`, one
//! subcommand per scenario (clap), each flag defaulting to the scenario's
//! `DEFAULT_*` constant; times are humantime's (`500ms`, `10s`, `2m`).
//! `report <dir>` renders BENCHMARKS.md from the result files (see
//! [`crate::report`]).

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::bench;
use crate::scenarios::chaos::faults::Kind;
use crate::scenarios::{
    DEFAULT_SIZE, chaos, fanout, floor, idle, pods, publish, slow, stall, storm, throughput, wire,
};
use crate::sessions::{Backoff, Cut};
use crate::{Target, target};

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
    /// --gateway-pid), unexpected closes (must be 0). Clients past what one
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
    /// --gateway-pid); lost, duplicated (both must be 0).
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

#[derive(Debug, Args)]
pub struct RunArgs {
    /// The run's name: its result DIR/NAME.json, its first pod's log
    /// NAME.log (the others NAME-2.log, ...).
    pub name: String,
    /// Where results and logs go (scripts/bench.sh's $OUT).
    #[arg(long, value_name = "DIR", default_value = "target/bench")]
    pub dir: PathBuf,
    /// The herald binary the pods run.
    #[arg(long, value_name = "PATH")]
    pub herald: PathBuf,
    /// An older herald binary: the run again against it.
    #[arg(long, value_name = "PATH")]
    pub before: Option<PathBuf>,
    /// How the page names the build before [default: its path].
    #[arg(long, value_name = "TEXT", requires = "before")]
    pub before_label: Option<String>,
    /// Herald pods.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = 1)]
    pub pods: usize,
    /// A Redis the pods share (HERALD_BROKER=redis): one redis-server, or a
    /// Redis Cluster of 3 masters without replicas.
    #[arg(long, value_enum)]
    pub redis: Option<bench::servers::RedisKind>,
    /// The pods reach Redis through a proxy whose delay the scenario sets
    /// (--proxy-control, for stall).
    #[arg(long, requires = "redis")]
    pub redis_proxy: bool,
    /// Connections to Redis subscribed to every publish's channel, reading
    /// all (standing for pods).
    #[arg(long, value_name = "N", value_parser = number, default_value_t = 0, requires = "redis")]
    pub redis_subscribers: usize,
    /// A setting for every pod, HERALD_KEY=value; repeat for several.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = key_value)]
    pub env: Vec<(String, String)>,
    /// The clients connect to this pod only (0 is the first, the one the
    /// publisher posts to) [default: spread over all].
    #[arg(long, value_name = "N", value_parser = number)]
    pub clients_on: Option<usize>,
    /// Profile the first pod with `perf record` during the run, its report
    /// by shared object and symbol in DIR/NAME.txt.
    #[arg(long)]
    pub perf: bool,
    /// The scenario and its flags.
    #[arg(last = true, required = true, value_name = "SCENARIO")]
    pub scenario: Vec<String>,
}

impl RunArgs {
    pub fn run(&self) -> bench::Run {
        bench::Run {
            name: self.name.clone(),
            dir: self.dir.clone(),
            plan: bench::servers::Plan {
                herald: self.herald.clone(),
                this_build: true,
                pods: self.pods,
                redis: self.redis,
                redis_proxy: self.redis_proxy,
                redis_subscribers: self.redis_subscribers,
                env: self.env.clone(),
                clients_on: self.clients_on,
            },
            before: self.before.clone().map(|before| {
                let label = self
                    .before_label
                    .clone()
                    .unwrap_or_else(|| before.display().to_string());
                (before, label)
            }),
            perf: self.perf,
            scenario: self.scenario.clone(),
        }
    }
}

/// `KEY=value`.
fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("`{s}`: expected KEY=value"))
}

/// Where the JSON result goes.
#[derive(Debug, Args)]
pub struct Out {
    /// Write the JSON result there.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// Local processes to watch.
#[derive(Debug, Args)]
pub struct Watch {
    /// A local process (gateway, redis) whose CPU time to report; repeat for
    /// several. The machine's busy cores and this tool's CPU are always
    /// reported.
    #[arg(long = "watch-pid", value_name = "PID")]
    pub watch_pid: Vec<u32>,
}

/// What `pods`, `fanout` and `slow` share: the gateways, the publisher,
/// drain, topic, payload and watched processes.
#[derive(Debug, Args)]
pub struct Spread {
    /// A gateway, ws://127.0.0.1:PORT[/ws]; repeat for several (client i on
    /// the i % n-th).
    #[arg(long, value_name = "URL", required = true, value_parser = Target::websocket)]
    pub gateway: Vec<Target>,
    /// Where the publisher posts, http://127.0.0.1:PORT [default: the first
    /// gateway].
    #[arg(long, value_name = "URL", value_parser = Target::http)]
    pub publish_to: Option<Target>,
    /// Publisher keep-alive connections.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_CONNECTIONS)]
    pub connections: usize,
    /// After the last publish, how long to wait for late deliveries.
    #[arg(long, value_name = "TIME", default_value_t = fanout::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// The topic (or the topics' prefix) [default: a fresh topic per run].
    #[arg(long, value_name = "NAME")]
    pub topic: Option<String>,
    /// Payload bytes (the send-time stamp needs ~40).
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = DEFAULT_SIZE)]
    pub size: usize,
    #[command(flatten)]
    pub watch: Watch,
    #[command(flatten)]
    pub out: Out,
}

impl Spread {
    /// `fanout`'s options with these, the rest at their defaults.
    fn fanout(&self) -> fanout::Options {
        let mut options = fanout::Options::new(self.gateway[0].clone());
        options.gateways = self.gateway.clone();
        if let Some(target) = &self.publish_to {
            options.publish_to = target.clone();
        }
        options.connections = self.connections;
        options.drain = self.drain.into();
        options.topic = self.topic.clone();
        options.size = self.size;
        options.watch = self.watch.watch_pid.clone();
        options
    }
}

#[derive(Debug, Args)]
pub struct PodsArgs {
    #[command(flatten)]
    pub spread: Spread,
    /// Clients, over all gateways.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = pods::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Messages per second.
    #[arg(long, value_name = "MSGS_PER_S", value_parser = rate, default_value_t = pods::DEFAULT_RATE)]
    pub rate: f64,
    /// How long the publisher publishes (after the warm-up).
    #[arg(long, value_name = "TIME", default_value_t = pods::DEFAULT_DURATION.into())]
    pub duration: humantime::Duration,
    /// Messages sent first, not timed.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = pods::DEFAULT_WARMUP)]
    pub warmup: usize,
}

impl PodsArgs {
    pub fn options(&self) -> pods::Options {
        let mut options = pods::Options::new(self.spread.gateway[0].clone());
        options.fanout = fanout::Options {
            clients: self.clients,
            warmup: self.warmup,
            ..self.spread.fanout()
        };
        options.rate = self.rate;
        options.duration = self.duration.into();
        options
    }
}

/// The rounds of `fanout` and `slow`.
#[derive(Debug, Args)]
pub struct Rounds {
    #[command(flatten)]
    pub spread: Spread,
    /// The gateway's process: its CPU and RSS per round (as --watch-pid,
    /// listed first).
    #[arg(long, value_name = "PID")]
    pub gateway_pid: Vec<u32>,
    /// Clients, over all gateways.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Topics the clients are spread over.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_TOPICS)]
    pub topics: usize,
    /// Measured rounds.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_ROUNDS)]
    pub rounds: usize,
    /// From one round's start to the next.
    #[arg(long, value_name = "TIME", default_value_t = fanout::DEFAULT_INTERVAL.into())]
    pub interval: humantime::Duration,
    /// Rounds first, not timed.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_WARMUP)]
    pub warmup: usize,
}

impl Rounds {
    fn options(&self) -> fanout::Options {
        let mut options = self.spread.fanout();
        options.clients = self.clients;
        options.topics = self.topics;
        options.rounds = self.rounds;
        options.interval = self.interval.into();
        options.warmup = self.warmup;
        // The gateway first: its figures lead the table.
        options.watch = [self.gateway_pid.as_slice(), &options.watch].concat();
        options
    }
}

#[derive(Debug, Args)]
pub struct FanoutArgs {
    #[command(flatten)]
    pub rounds: Rounds,
    /// Run `floor` first with the same clients, rounds, interval and size,
    /// and report the last client as multiples of the floor's.
    #[arg(long)]
    pub floor: bool,
}

impl FanoutArgs {
    /// `floor`: this program, which runs the floor's readers.
    pub fn options(&self) -> std::io::Result<fanout::Options> {
        let mut options = self.rounds.options();
        if self.floor {
            options.floor = Some(std::env::current_exe()?);
        }
        Ok(options)
    }
}

#[derive(Debug, Args)]
pub struct SlowArgs {
    #[command(flatten)]
    pub rounds: Rounds,
    /// Clients that never read.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = slow::DEFAULT_SLOW)]
    pub slow: usize,
    /// The slow clients' SO_RCVBUF.
    #[arg(long, value_name = "BYTES", value_parser = bytes_u32, default_value_t = slow::DEFAULT_RECV_BUFFER)]
    pub recv_buffer: u32,
    /// After the rounds, wait this long at most for the slow clients' closes.
    #[arg(long, value_name = "TIME", default_value_t = slow::DEFAULT_CLOSE_WAIT.into())]
    pub close_wait: humantime::Duration,
}

impl SlowArgs {
    pub fn options(&self) -> slow::Options {
        let mut options = slow::Options::new(self.rounds.options());
        options.slow = self.slow;
        options.recv_buffer = self.recv_buffer;
        options.close_wait = self.close_wait.into();
        options
    }
}

#[derive(Debug, Args)]
pub struct FloorArgs {
    /// Sockets written to.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Measured rounds.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_ROUNDS)]
    pub rounds: usize,
    /// From one round's start to the next.
    #[arg(long, value_name = "TIME", default_value_t = fanout::DEFAULT_INTERVAL.into())]
    pub interval: humantime::Duration,
    /// Rounds first, not timed.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = fanout::DEFAULT_WARMUP)]
    pub warmup: usize,
    /// After the last round, how long to wait for late deliveries.
    #[arg(long, value_name = "TIME", default_value_t = fanout::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// Payload bytes.
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = DEFAULT_SIZE)]
    pub size: usize,
    #[command(flatten)]
    pub out: Out,
}

impl FloorArgs {
    /// The readers run from this program.
    pub fn options(&self) -> std::io::Result<floor::Options> {
        let mut options = floor::Options::new(std::env::current_exe()?);
        options.clients = self.clients;
        options.rounds = self.rounds;
        options.interval = self.interval.into();
        options.warmup = self.warmup;
        options.drain = self.drain.into();
        options.size = self.size;
        Ok(options)
    }
}

/// [`floor::Readers::args`], read back.
#[derive(Debug, Args)]
pub struct ReadersArgs {
    #[arg(long)]
    pub connect: SocketAddr,
    #[arg(long, value_parser = number)]
    pub clients: usize,
    #[arg(long, value_parser = number)]
    pub rounds: usize,
    #[arg(long, value_parser = number)]
    pub warmup: usize,
    #[arg(long)]
    pub deadline: humantime::Duration,
}

impl ReadersArgs {
    pub fn readers(&self) -> floor::Readers {
        floor::Readers {
            connect: self.connect,
            clients: self.clients,
            rounds: self.rounds,
            warmup: self.warmup,
            deadline: self.deadline.into(),
        }
    }
}

#[derive(Debug, Args)]
pub struct PublishArgs {
    /// The gateway's HTTP API, http://127.0.0.1:PORT.
    #[arg(long, value_name = "URL", value_parser = Target::http)]
    pub publish_to: Target,
    /// Keep-alive connections publishing at once.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = publish::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// Topics published to, round-robin.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = publish::DEFAULT_TOPICS)]
    pub topics: usize,
    /// How long to publish.
    #[arg(long, value_name = "TIME", default_value_t = publish::DEFAULT_DURATION.into())]
    pub duration: humantime::Duration,
    /// Payload bytes.
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = DEFAULT_SIZE)]
    pub size: usize,
    /// Publishes per request: above 1, batches to /v1/publish/batch.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = 1)]
    pub batch: usize,
    #[command(flatten)]
    pub watch: Watch,
    #[command(flatten)]
    pub out: Out,
}

impl PublishArgs {
    pub fn options(&self) -> publish::Options {
        let mut options = publish::Options::new(self.publish_to.clone());
        options.concurrency = self.concurrency;
        options.topics = self.topics;
        options.duration = self.duration.into();
        options.size = self.size;
        options.batch = self.batch;
        options.watch = self.watch.watch_pid.clone();
        options
    }
}

#[derive(Debug, Args)]
pub struct StormArgs {
    /// A gateway, ws://127.0.0.1:PORT[/ws]; repeat for several pods.
    #[arg(long, value_name = "URL", required = true, value_parser = Target::websocket)]
    pub gateway: Vec<Target>,
    /// Where the publisher posts, http://127.0.0.1:PORT [default: the first
    /// gateway; with --kill-pid, the first not killed].
    #[arg(long, value_name = "URL", value_parser = Target::http)]
    pub publish_to: Option<Target>,
    /// Clients, over all gateways.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = storm::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Topics; client i on topic i % n.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = storm::DEFAULT_TOPICS)]
    pub topics: usize,
    /// Messages per second, over all topics.
    #[arg(long, value_name = "MSGS_PER_S", value_parser = rate, default_value_t = storm::DEFAULT_RATE)]
    pub rate: f64,
    /// How long the publisher runs.
    #[arg(long, value_name = "TIME", default_value_t = storm::DEFAULT_DURATION.into())]
    pub duration: humantime::Duration,
    /// When to cut, from the first publish.
    #[arg(long, value_name = "TIME", default_value_t = storm::DEFAULT_CUT_AT.into())]
    pub cut_at: humantime::Duration,
    /// After the last publish, wait for resumes and deliveries.
    #[arg(long, value_name = "TIME", default_value_t = storm::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// The first reconnect waits up to this.
    #[arg(long, value_name = "TIME", default_value_t = storm::DEFAULT_BACKOFF.into())]
    pub backoff: humantime::Duration,
    /// No reconnect waits longer.
    #[arg(long, value_name = "TIME", default_value_t = storm::DEFAULT_BACKOFF_CAP.into())]
    pub backoff_cap: humantime::Duration,
    /// Cumulative acks at most this often (0ms: every message).
    #[arg(long, value_name = "TIME", default_value_t = storm::DEFAULT_ACK_INTERVAL.into())]
    pub ack_interval: humantime::Duration,
    /// How the connections are cut.
    #[arg(long, value_enum, default_value_t = Cut::Reset)]
    pub cut: Cut,
    /// SIGKILL this gateway process instead of cutting the connections (it
    /// must listen on a --gateway port; needs broker = redis).
    #[arg(long, value_name = "PID")]
    pub kill_pid: Option<u32>,
    /// Publisher keep-alive connections.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = storm::DEFAULT_CONNECTIONS)]
    pub connections: usize,
    /// Every client's hello.token (a gateway that checks tokens verifies one
    /// per hello).
    #[arg(long, value_name = "JWT")]
    pub token: Option<String>,
    /// Payload bytes (the send-time stamp needs ~40).
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = DEFAULT_SIZE)]
    pub size: usize,
    #[command(flatten)]
    pub watch: Watch,
    #[command(flatten)]
    pub out: Out,
}

impl StormArgs {
    pub fn options(&self) -> storm::Options {
        let mut options = storm::Options::new(self.gateway[0].clone());
        options.gateways = self.gateway.clone();
        options.publish_to = self.publish_to.clone();
        options.clients = self.clients;
        options.topics = self.topics;
        options.rate = self.rate;
        options.duration = self.duration.into();
        options.cut_at = self.cut_at.into();
        options.drain = self.drain.into();
        options.backoff = Backoff {
            first: self.backoff.into(),
            cap: self.backoff_cap.into(),
        };
        options.ack_interval = self.ack_interval.into();
        options.cut = self.cut;
        options.kill_pid = self.kill_pid;
        options.connections = self.connections;
        options.token = self.token.clone();
        options.size = self.size;
        options.watch = self.watch.watch_pid.clone();
        options
    }
}

#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// The herald binary the pods run (target/release/herald).
    #[arg(long, value_name = "PATH")]
    pub herald: PathBuf,
    /// The Redis the pods use: one master and its replica behind a proxy,
    /// or a Redis Cluster of three masters with a replica each.
    #[arg(long, value_enum, default_value_t = chaos::Redis::One)]
    pub redis: chaos::Redis,
    /// Herald pods.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = chaos::DEFAULT_PODS)]
    pub pods: usize,
    /// Clients with sessions, over all pods.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = chaos::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Topics.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = chaos::DEFAULT_TOPICS)]
    pub topics: usize,
    /// Topics per client (client i: topics i, i+1, ... mod --topics).
    #[arg(long, value_name = "N", value_parser = number, default_value_t = chaos::DEFAULT_SUBSCRIPTIONS)]
    pub subscriptions: usize,
    /// Publishers, each posting to a random pod.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = chaos::DEFAULT_PUBLISHERS)]
    pub publishers: usize,
    /// Publishes per second, over all publishers.
    #[arg(long, value_name = "MSGS_PER_S", value_parser = rate, default_value_t = chaos::DEFAULT_RATE)]
    pub rate: f64,
    /// How long the publishers publish (faults come meanwhile).
    #[arg(long, value_name = "TIME", default_value_t = chaos::DEFAULT_DURATION.into())]
    pub duration: humantime::Duration,
    /// Mean time between a client's own cuts (0s: none).
    #[arg(long, value_name = "TIME", default_value_t = chaos::DEFAULT_CHURN.into())]
    pub churn: humantime::Duration,
    /// The faults, cycled through in this order [default: every one that
    /// fits --redis: freeze,delay,failover,restore,pod-kill for one;
    /// master-kill,migrate,lagging-failover,manual-failover,pod-kill for a
    /// cluster].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub faults: Vec<Kind>,
    /// From the first publish to the first fault.
    #[arg(long, value_name = "TIME", default_value_t = chaos::DEFAULT_WARMUP.into())]
    pub warmup: humantime::Duration,
    /// No fault in this last part of the run.
    #[arg(long, value_name = "TIME", default_value_t = chaos::DEFAULT_TAIL.into())]
    pub tail: humantime::Duration,
    /// The shortest pause between two faults.
    #[arg(long, value_name = "TIME", default_value_t = chaos::DEFAULT_GAP.0.into())]
    pub gap_min: humantime::Duration,
    /// The longest pause between two faults.
    #[arg(long, value_name = "TIME", default_value_t = chaos::DEFAULT_GAP.1.into())]
    pub gap_max: humantime::Duration,
    /// The fault schedule's seed [default: random; printed].
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// After the last publish, how long the clients have to catch up.
    #[arg(long, value_name = "TIME", default_value_t = chaos::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// Payload bytes.
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = chaos::DEFAULT_SIZE)]
    pub size: usize,
    /// Where logs and dumps go [default: a fresh temporary directory,
    /// removed after a run that passed].
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// The pods' log level (HERALD_LOG__LEVEL).
    #[arg(long, value_name = "FILTER", default_value = "warn")]
    pub log_level: String,
    #[command(flatten)]
    pub out: Out,
}

impl ChaosArgs {
    pub fn options(&self) -> chaos::Options {
        let mut options = chaos::Options::new(self.herald.clone());
        options.redis = self.redis;
        options.pods = self.pods;
        options.clients = self.clients;
        options.topics = self.topics;
        options.subscriptions = self.subscriptions;
        options.publishers = self.publishers;
        options.rate = self.rate;
        options.duration = self.duration.into();
        options.churn = self.churn.into();
        options.faults = if self.faults.is_empty() {
            self.redis.faults()
        } else {
            self.faults.clone()
        };
        options.warmup = self.warmup.into();
        options.tail = self.tail.into();
        options.gap = (self.gap_min.into(), self.gap_max.into());
        options.seed = self.seed;
        options.drain = self.drain.into();
        options.size = self.size;
        options.dir = self.dir.clone();
        options.log_level = self.log_level.clone();
        options
    }
}

#[derive(Debug, Args)]
pub struct StallArgs {
    /// The pod, ws://127.0.0.1:PORT[/ws] (publishes go to its HTTP API).
    #[arg(long, value_name = "URL", value_parser = Target::websocket)]
    pub gateway: Target,
    /// The pod's Redis itself, redis://127.0.0.1:PORT, not through the proxy.
    #[arg(long, value_name = "URL", value_parser = target::redis)]
    pub redis: SocketAddr,
    /// The control port of the proxy between the pod and Redis, 127.0.0.1:PORT.
    #[arg(long, value_name = "ADDR", value_parser = target::loopback)]
    pub proxy_control: Option<SocketAddr>,
    /// The delay the proxy adds to each Redis round trip during the phases.
    #[arg(long, value_name = "TIME", default_value_t = stall::DEFAULT_REDIS_DELAY.into())]
    pub redis_delay: humantime::Duration,
    /// Connections holding the watched topics.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = stall::DEFAULT_CONNECTIONS)]
    pub connections: usize,
    /// Fresh topics per connection.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = stall::DEFAULT_TOPICS_PER_CONNECTION)]
    pub topics_per_connection: usize,
    /// Fresh topics subscribed to in the burst phase.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = stall::DEFAULT_BURST_TOPICS)]
    pub burst_topics: usize,
    /// Between two canary messages.
    #[arg(long, value_name = "TIME", default_value_t = stall::DEFAULT_CANARY_INTERVAL.into())]
    pub canary_interval: humantime::Duration,
    /// The steady phase.
    #[arg(long, value_name = "TIME", default_value_t = stall::DEFAULT_STEADY.into())]
    pub steady: humantime::Duration,
    /// The burst and resync phases, each.
    #[arg(long, value_name = "TIME", default_value_t = stall::DEFAULT_PHASE.into())]
    pub phase: humantime::Duration,
    /// After the last canary, how long its deliveries may take.
    #[arg(long, value_name = "TIME", default_value_t = stall::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// Keep-alive connections publishing the canary.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = stall::DEFAULT_PUBLISHERS)]
    pub publishers: usize,
    #[command(flatten)]
    pub out: Out,
}

impl StallArgs {
    pub fn options(&self) -> stall::Options {
        let mut options = stall::Options::new(self.gateway.clone(), self.redis);
        options.proxy_control = self.proxy_control;
        options.redis_delay = self.redis_delay.into();
        options.connections = self.connections;
        options.topics_per_connection = self.topics_per_connection;
        options.burst_topics = self.burst_topics;
        options.canary_interval = self.canary_interval.into();
        options.steady = self.steady.into();
        options.phase = self.phase.into();
        options.drain = self.drain.into();
        options.publishers = self.publishers;
        options
    }
}

#[derive(Debug, Args)]
pub struct ProxyArgs {
    /// Where clients connect, 127.0.0.1:PORT.
    #[arg(long, value_name = "ADDR", value_parser = target::loopback)]
    pub listen: SocketAddr,
    /// Where the proxy connects, 127.0.0.1:PORT.
    #[arg(long, value_name = "ADDR", value_parser = target::loopback)]
    pub upstream: SocketAddr,
    /// The control port, 127.0.0.1:PORT.
    #[arg(long, value_name = "ADDR", value_parser = target::loopback)]
    pub control: SocketAddr,
    /// The delay added to each round trip at the start.
    #[arg(long, value_name = "TIME", default_value = "0ms")]
    pub delay: humantime::Duration,
    /// Stop after this long.
    #[arg(long = "for", value_name = "TIME", default_value = "1h")]
    pub run_for: humantime::Duration,
}

#[derive(Debug, Args)]
pub struct IdleArgs {
    /// A gateway, ws://127.0.0.1:PORT[/ws]; repeat for several pods.
    #[arg(long, value_name = "URL", required = true, value_parser = Target::websocket)]
    pub gateway: Vec<Target>,
    /// Each gateway's process, in --gateway order.
    #[arg(long, value_name = "PID")]
    pub gateway_pid: Vec<u32>,
    /// Connections, over all gateways.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = idle::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// The hold, once all are connected.
    #[arg(long, value_name = "TIME", default_value_t = idle::DEFAULT_DURATION.into())]
    pub duration: humantime::Duration,
    /// Processes holding the clients [default: as few as the hard
    /// file-descriptor limit allows].
    #[arg(long, value_name = "N", value_parser = number)]
    pub processes: Option<usize>,
    /// The topic [default: a fresh topic per run].
    #[arg(long, value_name = "NAME")]
    pub topic: Option<String>,
    #[command(flatten)]
    pub watch: Watch,
    #[command(flatten)]
    pub out: Out,
}

impl IdleArgs {
    pub fn options(&self) -> idle::Options {
        let mut options = idle::Options::new(self.gateway[0].clone());
        options.gateways = self.gateway.clone();
        options.gateway_pids = self.gateway_pid.clone();
        options.clients = self.clients;
        options.duration = self.duration.into();
        // 0: as few as the file-descriptor limit allows.
        options.processes = self.processes.unwrap_or(0);
        options.topic = self.topic.clone();
        options.watch = self.watch.watch_pid.clone();
        options
    }
}

/// [`idle::Worker::args`], read back.
#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[arg(long, value_parser = Target::websocket)]
    pub gateway: Vec<Target>,
    #[arg(long, value_parser = number)]
    pub first: usize,
    #[arg(long, value_parser = number)]
    pub clients: usize,
    #[arg(long)]
    pub topic: String,
    #[arg(long)]
    pub max_hold: humantime::Duration,
}

impl WorkerArgs {
    pub fn worker(&self) -> idle::Worker {
        idle::Worker {
            gateways: self.gateway.clone(),
            first: self.first,
            clients: self.clients,
            topic: self.topic.clone(),
            max_hold: self.max_hold.into(),
        }
    }
}

#[derive(Debug, Args)]
pub struct ThroughputArgs {
    /// The gateway, ws://127.0.0.1:PORT[/ws].
    #[arg(long, value_name = "URL", value_parser = Target::websocket)]
    pub gateway: Target,
    /// Where the publishers post, http://127.0.0.1:PORT [default: the gateway].
    #[arg(long, value_name = "URL", value_parser = Target::http)]
    pub publish_to: Option<Target>,
    /// The gateway's process, for its CPU time.
    #[arg(long, value_name = "PID")]
    pub gateway_pid: Option<u32>,
    /// Clients.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = throughput::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Topics.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = throughput::DEFAULT_TOPICS)]
    pub topics: usize,
    /// Topics per client.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = throughput::DEFAULT_SUBSCRIPTIONS)]
    pub subscriptions: usize,
    /// Keep-alive connections publishing at once.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = throughput::DEFAULT_CONCURRENCY)]
    pub concurrency: usize,
    /// How long to publish.
    #[arg(long, value_name = "TIME", default_value_t = throughput::DEFAULT_DURATION.into())]
    pub duration: humantime::Duration,
    /// After the last publish, how long to wait for late deliveries.
    #[arg(long, value_name = "TIME", default_value_t = throughput::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// Payload bytes.
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = throughput::DEFAULT_SIZE)]
    pub size: usize,
    #[command(flatten)]
    pub watch: Watch,
    #[command(flatten)]
    pub out: Out,
}

impl ThroughputArgs {
    pub fn options(&self) -> throughput::Options {
        let mut options = throughput::Options::new(self.gateway.clone());
        if let Some(target) = &self.publish_to {
            options.publish_to = target.clone();
        }
        options.gateway_pid = self.gateway_pid;
        options.clients = self.clients;
        options.topics = self.topics;
        options.subscriptions = self.subscriptions;
        options.concurrency = self.concurrency;
        options.duration = self.duration.into();
        options.drain = self.drain.into();
        options.size = self.size;
        options.watch = self.watch.watch_pid.clone();
        options
    }
}

#[derive(Debug, Args)]
pub struct WireArgs {
    /// The gateway, ws://127.0.0.1:PORT[/ws].
    #[arg(long, value_name = "URL", value_parser = Target::websocket)]
    pub gateway: Target,
    /// Where to publish, http://127.0.0.1:PORT [default: the gateway].
    #[arg(long, value_name = "URL", value_parser = Target::http)]
    pub publish_to: Option<Target>,
    /// Payload sizes in bytes, comma-separated (KiB, MiB taken).
    #[arg(
        long,
        value_name = "LIST",
        value_delimiter = ',',
        value_parser = bytes,
        default_values_t = wire::DEFAULT_SIZES
    )]
    pub sizes: Vec<usize>,
    /// The topic [default: a fresh 8-character one].
    #[arg(long, value_name = "NAME")]
    pub topic: Option<String>,
    #[command(flatten)]
    pub out: Out,
}

impl WireArgs {
    pub fn options(&self) -> wire::Options {
        let mut options = wire::Options::new(self.gateway.clone());
        if let Some(target) = &self.publish_to {
            options.publish_to = target.clone();
        }
        options.sizes = self.sizes.clone();
        options.topic = self.topic.clone();
        options
    }
}

/// A count; `_` may group digits (`10_000`).
fn number(s: &str) -> Result<usize, String> {
    s.replace('_', "")
        .parse()
        .map_err(|_| format!("`{s}` is not a number"))
}

/// Bytes: `1024`, `1KiB`, `64KiB`, `1MiB`.
fn bytes(s: &str) -> Result<usize, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(
        s.find(|c: char| !(c.is_ascii_digit() || c == '_'))
            .unwrap_or(s.len()),
    );
    let scale = match unit {
        "" | "B" => 1,
        "KiB" => 1024,
        "MiB" => 1024 * 1024,
        _ => return Err(format!("`{s}`: bytes take B, KiB or MiB")),
    };
    number(digits)?
        .checked_mul(scale)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// [`bytes()`], for a socket option.
fn bytes_u32(s: &str) -> Result<u32, String> {
    u32::try_from(bytes(s)?).map_err(|_| format!("`{s}` is too large"))
}

/// A finite rate.
fn rate(s: &str) -> Result<f64, String> {
    s.parse()
        .ok()
        .filter(|r: &f64| r.is_finite())
        .ok_or_else(|| format!("`{s}` is not a rate"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::CommandFactory;

    use super::*;

    fn parse(line: &str) -> Result<Command, clap::Error> {
        parse_args(line.split_whitespace().map(str::to_owned))
    }

    fn parse_args(args: impl IntoIterator<Item = String>) -> Result<Command, clap::Error> {
        let program = std::iter::once("herald-loadtest".to_owned());
        Cli::try_parse_from(program.chain(args)).map(|cli| cli.command)
    }

    /// Each line fails, and its message names what is wrong.
    fn assert_named(cases: &[(&str, &str)]) {
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
    fn pods_takes_several_gateways_and_publishes_to_the_first_by_default() {
        let Ok(Command::Pods(args)) = parse(
            "pods --gateway ws://127.0.0.1:8080 --gateway=ws://127.0.0.1:8081/ws \
             --clients 50 --rate 20.5 --duration 1500ms --size 1024 --out r.json",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!(options.fanout.gateways.len(), 2);
        assert_eq!(
            options.fanout.publish_to.http_url(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(options.fanout.clients, 50);
        assert_eq!(options.rate, 20.5);
        assert_eq!(options.duration, Duration::from_millis(1500));
        assert_eq!(options.fanout.size, 1024);
        assert_eq!(options.fanout.warmup, pods::DEFAULT_WARMUP);
        assert_eq!(args.spread.out.out, Some(PathBuf::from("r.json")));
    }

    #[test]
    fn stall_takes_the_pod_its_redis_and_the_proxy_on_this_machine() {
        let Ok(Command::Stall(args)) = parse(
            "stall --gateway ws://127.0.0.1:8080 --redis redis://127.0.0.1:6380 \
             --proxy-control 127.0.0.1:7002 --redis-delay 150ms",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!(options.redis.port(), 6380);
        assert_eq!(options.proxy_control.map(|a| a.port()), Some(7002));
        assert_eq!(options.redis_delay, Duration::from_millis(150));
        assert_eq!(options.connections * options.topics_per_connection, 20_000);
        assert_named(&[
            ("stall --gateway ws://127.0.0.1:1", "--redis"),
            (
                "stall --gateway ws://127.0.0.1:1 --redis redis://10.1.1.1:6379",
                "not loopback",
            ),
            (
                "proxy --listen 127.0.0.1:1 --upstream 10.0.0.1:6379 --control 127.0.0.1:2",
                "not loopback",
            ),
        ]);
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
    fn fanout_reads_rounds_topics_and_the_floor_switch() {
        let Ok(Command::Fanout(args)) = parse(
            "fanout --gateway ws://127.0.0.1:8080 --clients 10000 --topics 2 --rounds 40 \
             --interval 500ms --floor --size 1024 --gateway-pid 7 --watch-pid 8 --out f.json",
        ) else {
            panic!("parsed");
        };
        let options = args.options().expect("this program");
        assert_eq!(
            (options.clients, options.topics, options.rounds),
            (10_000, 2, 40)
        );
        assert_eq!(options.interval, Duration::from_millis(500));
        assert_eq!(options.size, 1024);
        assert_eq!(options.watch, vec![7, 8], "the gateway first");
        assert!(options.floor.is_some());
        assert_eq!(args.rounds.spread.out.out, Some(PathBuf::from("f.json")));
        let Ok(Command::Fanout(args)) = parse("fanout --gateway ws://127.0.0.1:1") else {
            panic!("parsed");
        };
        let options = args.options().expect("this program");
        assert_eq!(options.floor, None);
        assert_eq!(options.rounds, fanout::DEFAULT_ROUNDS);
        assert_eq!(options.interval, fanout::DEFAULT_INTERVAL);
        assert_eq!(options.size, DEFAULT_SIZE);
    }

    #[test]
    fn slow_and_floor_read_their_own() {
        let Ok(Command::Slow(args)) = parse(
            "slow --gateway ws://127.0.0.1:8080 --clients 500 --slow 3 --recv-buffer 2048 \
             --close-wait 10s",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!((options.fanout.clients, options.slow), (500, 3));
        assert_eq!(options.recv_buffer, 2048);
        assert_eq!(options.close_wait, Duration::from_secs(10));
        let Ok(Command::Floor(args)) =
            parse("floor --clients 10000 --rounds 40 --interval 500ms --size 1024")
        else {
            panic!("parsed");
        };
        let options = args.options().expect("this program");
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
        let Ok(Command::FloorReaders(back)) = parse_args(readers.args()) else {
            panic!("parsed");
        };
        assert_eq!(back.readers(), readers);
    }

    #[test]
    fn storm_reads_its_cut_backoff_kill_and_token() {
        let Ok(Command::Storm(args)) = parse(
            "storm --gateway ws://127.0.0.1:8080 --gateway ws://127.0.0.1:8081 \
             --clients 10_000 --topics 20 --rate 100 --duration 20s --cut-at 5s \
             --drain 15s --backoff 50ms --backoff-cap 1s --ack-interval 0ms \
             --cut half-open --kill-pid 4242 --publish-to http://127.0.0.1:8081 --watch-pid 4243 \
             --token a.b.c",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
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
        assert_eq!(options.token.as_deref(), Some("a.b.c"));
        assert_eq!(args.out.out, None);

        let Ok(Command::Storm(args)) = parse("storm --gateway ws://127.0.0.1:1") else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!(options.clients, storm::DEFAULT_CLIENTS);
        assert_eq!(options.cut_at, storm::DEFAULT_CUT_AT);
        assert_eq!(options.ack_interval, storm::DEFAULT_ACK_INTERVAL);
        assert_eq!(options.cut, Cut::Reset);
        assert_eq!(options.kill_pid, None);
        assert_eq!(options.publish_to, None);
        assert_eq!(options.token, None);

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
        let Ok(Command::Idle(args)) = parse(
            "idle --gateway ws://127.0.0.1:8080 --gateway ws://127.0.0.1:8081 \
             --gateway-pid 11 --gateway-pid 12 --clients 60_000 --duration 60s \
             --processes 4 --watch-pid 13",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!(options.gateways.len(), 2);
        assert_eq!(options.gateway_pids, vec![11, 12]);
        assert_eq!((options.clients, options.processes), (60_000, 4));
        assert_eq!(options.duration, Duration::from_secs(60));
        assert_eq!(options.watch, vec![13]);
        assert_eq!(args.out.out, None);
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
        let Ok(Command::IdleWorker(back)) = parse_args(worker.args()) else {
            panic!("parsed");
        };
        assert_eq!(back.worker(), worker);
    }

    #[test]
    fn throughput_and_wire_take_their_options() {
        let Ok(Command::Throughput(args)) = parse(
            "throughput --gateway ws://127.0.0.1:8080 --gateway-pid 7 --clients 200 \
             --topics 500 --subscriptions 50 --concurrency 12 --duration 5s",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
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
        let Ok(Command::Wire(args)) =
            parse("wire --gateway ws://127.0.0.1:8080 --sizes 10,125,1KiB,64KiB,1MiB")
        else {
            panic!("parsed");
        };
        assert_eq!(args.options().sizes, vec![10, 125, 1024, 65_536, 1_048_576]);
        let Ok(Command::Wire(args)) = parse("wire --gateway ws://127.0.0.1:8080") else {
            panic!("parsed");
        };
        assert_eq!(args.options().sizes, wire::DEFAULT_SIZES.to_vec());
        assert_named(&[
            ("throughput", "--gateway"),
            ("wire --gateway ws://127.0.0.1:1 --sizes 10,2GB", "--sizes"),
            ("wire --gateway ws://127.0.0.1:1 --size 10", "--sizes"),
        ]);
    }

    #[test]
    fn run_takes_the_servers_then_the_scenario_after_the_dashes() {
        let Ok(Command::Run(args)) = parse(
            "run pods-cross-pod --herald target/release/herald --pods 2 --redis one \
             --clients-on 1 --env HERALD_LOG__LEVEL=info --before old/herald \
             -- pods --clients 10 --rate 5",
        ) else {
            panic!("parsed");
        };
        let run = args.run();
        assert_eq!(run.name, "pods-cross-pod");
        assert_eq!(run.dir, PathBuf::from("target/bench"));
        assert_eq!(run.plan.pods, 2);
        assert_eq!(run.plan.redis, Some(bench::servers::RedisKind::One));
        assert_eq!(run.plan.clients_on, Some(1));
        assert!(run.plan.this_build);
        assert_eq!(
            run.plan.env,
            vec![("HERALD_LOG__LEVEL".to_owned(), "info".to_owned())]
        );
        // The page names the build before by its path unless told.
        assert_eq!(
            run.before,
            Some((PathBuf::from("old/herald"), "old/herald".to_owned()))
        );
        assert_eq!(run.scenario, ["pods", "--clients", "10", "--rate", "5"]);
        assert_named(&[
            ("run x -- fanout", "--herald"),
            ("run x --herald h", "SCENARIO"),
            ("run x --herald h --env NOEQUALS -- wire", "KEY=value"),
            ("run x --herald h --before-label y -- wire", "--before"),
            ("run x --herald h --redis-proxy -- stall", "--redis"),
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
