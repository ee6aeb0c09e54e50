//! The flags of the scenarios that measure how much a gateway takes:
//! `publish` (publish throughput), `idle` (memory per held connection, and
//! its worker process), `throughput` (deliveries per second), `wire`
//! (bytes per message), `formats` (bytes and CPU per delivery in each wire
//! format).

use clap::Args;

use super::output::{Out, Watch};
use super::values::{bytes, number};
use crate::Target;
use crate::codec::Format;
use crate::scenarios::formats::{self, Kind};
use crate::scenarios::{DEFAULT_SIZE, idle, publish, throughput, wire};
use crate::streams::Transport;

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
    /// The clients' transport: WebSocket, server-sent events (`GET /sse`)
    /// or HTTP-streaming (`POST /stream`).
    #[arg(long, value_enum, default_value_t = Transport::Ws)]
    pub transport: Transport,
    /// Offer permessage-deflate, as a browser does.
    #[arg(long)]
    pub compression: bool,
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
        options.transport = self.transport;
        options.compression = self.compression;
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
    #[arg(long, value_enum, default_value_t = Transport::Ws)]
    pub transport: Transport,
    #[arg(long)]
    pub compression: bool,
}

impl WorkerArgs {
    pub fn worker(&self) -> idle::Worker {
        idle::Worker {
            gateways: self.gateway.clone(),
            first: self.first,
            clients: self.clients,
            topic: self.topic.clone(),
            max_hold: self.max_hold.into(),
            transport: self.transport,
            compression: self.compression,
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
    /// The clients' transport: WebSocket, server-sent events (`GET /sse`)
    /// or HTTP-streaming (`POST /stream`).
    #[arg(long, value_enum, default_value_t = Transport::Ws)]
    pub transport: Transport,
    /// Offer permessage-deflate, as a browser does; inflate what comes and
    /// report the bytes per delivery on the wire.
    #[arg(long)]
    pub compression: bool,
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
        options.transport = self.transport;
        options.compression = self.compression;
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

#[derive(Debug, Args)]
pub struct FormatsArgs {
    /// The gateway, ws://127.0.0.1:PORT[/ws].
    #[arg(long, value_name = "URL", value_parser = Target::websocket)]
    pub gateway: Target,
    /// Where to publish, http://127.0.0.1:PORT [default: the gateway].
    #[arg(long, value_name = "URL", value_parser = Target::http)]
    pub publish_to: Option<Target>,
    /// The gateway's process, for its CPU time.
    #[arg(long, value_name = "PID")]
    pub gateway_pid: Option<u32>,
    /// Subscribers per phase.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = formats::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Publications per phase.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = formats::DEFAULT_UPDATES)]
    pub updates: usize,
    /// Between two publications.
    #[arg(long, value_name = "TIME", default_value_t = formats::DEFAULT_INTERVAL.into())]
    pub interval: humantime::Duration,
    /// After the last publish, how long to wait for late deliveries.
    #[arg(long, value_name = "TIME", default_value_t = formats::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// The payloads, comma-separated: chat, state [default: both].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub payloads: Vec<Kind>,
    /// The formats, comma-separated: json, json+deflate, protobuf,
    /// protobuf+deflate, and each with a `delta-` prefix [default: all].
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub formats: Vec<Format>,
    #[command(flatten)]
    pub out: Out,
}

impl FormatsArgs {
    pub fn options(&self) -> formats::Options {
        let mut options = formats::Options::new(self.gateway.clone());
        if let Some(target) = &self.publish_to {
            options.publish_to = target.clone();
        }
        options.gateway_pid = self.gateway_pid;
        options.clients = self.clients;
        options.updates = self.updates;
        options.interval = self.interval.into();
        options.drain = self.drain.into();
        if !self.payloads.is_empty() {
            options.payloads = self.payloads.clone();
        }
        if !self.formats.is_empty() {
            options.formats = self.formats.clone();
        }
        options
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cli::Command;
    use crate::cli::tests::{assert_named, parse, parse_args};

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
            transport: Transport::Sse,
            compression: true,
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
             --topics 500 --subscriptions 50 --concurrency 12 --duration 5s --transport sse",
        ) else {
            panic!("parsed");
        };
        let options = args.options();
        assert_eq!(options.publish_to.http_url(), "http://127.0.0.1:8080");
        assert_eq!(options.gateway_pid, Some(7));
        assert_eq!(options.transport, Transport::Sse);
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
}
