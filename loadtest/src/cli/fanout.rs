//! The flags of the scenarios on fanout's engine (`pods`, `fanout`,
//! `slow`) and of its floor (`floor`, and its readers' process), with what
//! they share: the gateways and publisher ([`Spread`]), the rounds
//! ([`Rounds`]).

use std::net::SocketAddr;

use clap::Args;

use super::output::{Out, Watch};
use super::values::{bytes_u32, number, rate};
use crate::Target;
use crate::clients::Library;
use crate::scenarios::{DEFAULT_SIZE, fanout, floor, pods, slow};

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
    /// The clients are the load tool's own WebSocket client (which counts
    /// each frame's bytes), not tokio-tungstenite: `--compression`'s
    /// yardstick.
    #[arg(long)]
    pub raw: bool,
    /// The clients (the load tool's own) offer permessage-deflate as a
    /// browser does and inflate every compressed frame.
    #[arg(long)]
    pub compression: bool,
}

impl Rounds {
    fn options(&self) -> fanout::Options {
        let mut options = self.spread.fanout();
        options.clients = self.clients;
        options.topics = self.topics;
        options.rounds = self.rounds;
        options.interval = self.interval.into();
        options.warmup = self.warmup;
        options.library = match (self.compression, self.raw) {
            (true, _) => Library::Deflate,
            (false, true) => Library::Raw,
            (false, false) => Library::Tungstenite,
        };
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
    /// The slow clients stop reading for the slow phase only, then read
    /// again while N rounds more go out (issue #25: lagging clients caught
    /// up from history): disconnected, lost, duplicated, back live, RSS.
    #[arg(long, value_name = "N", value_parser = number, num_args = 0..=1,
          default_missing_value = "20")] // catch_up::DEFAULT_AFTER_ROUNDS
    pub catch_up: Option<usize>,
    /// With --catch-up: longest the slow clients may take to have every round.
    #[arg(long, value_name = "TIME", default_value_t = slow::DEFAULT_CATCH_UP_WAIT.into())]
    pub catch_up_wait: humantime::Duration,
}

impl SlowArgs {
    pub fn options(&self) -> slow::Options {
        let mut options = slow::Options::new(self.rounds.options());
        options.slow = self.slow;
        options.recv_buffer = self.recv_buffer;
        options.close_wait = self.close_wait.into();
        options.catch_up = self.catch_up;
        options.catch_up_wait = self.catch_up_wait.into();
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;
    use crate::cli::Command;
    use crate::cli::tests::{parse, parse_args};

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
        assert_eq!(options.catch_up, None);
        for (line, after) in [("--catch-up", 20), ("--catch-up 5", 5)] {
            let Ok(Command::Slow(args)) = parse(&format!(
                "slow --gateway ws://127.0.0.1:8080 --slow 100 {line} --catch-up-wait 30s"
            )) else {
                panic!("parsed");
            };
            let options = args.options();
            assert_eq!(options.catch_up, Some(after), "{line}");
            assert_eq!(options.catch_up_wait, Duration::from_secs(30));
        }
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
}
