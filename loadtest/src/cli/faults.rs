//! The flags of the scenarios that break something and check what the
//! clients saw (`storm`, `chaos`, `stall`), and of `proxy`, the bad
//! network between a pod and Redis.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::output::{Out, Watch};
use super::values::{number, rate};
use crate::scenarios::chaos::faults::Kind;
use crate::scenarios::{DEFAULT_SIZE, chaos, sse_failover, stall, storm};
use crate::sessions::{Backoff, Cut};
use crate::{Target, target};

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
pub struct SseFailoverArgs {
    /// A gateway, http://127.0.0.1:PORT; repeat for several pods.
    #[arg(long, value_name = "URL", required = true, value_parser = Target::http)]
    pub gateway: Vec<Target>,
    /// Where the publisher posts, http://127.0.0.1:PORT [default: the first
    /// gateway not killed].
    #[arg(long, value_name = "URL", value_parser = Target::http)]
    pub publish_to: Option<Target>,
    /// SIGKILL this gateway process at --kill-at (it must listen on a
    /// --gateway port; needs broker = redis) [default: the tool drops every
    /// stream itself].
    #[arg(long, value_name = "PID")]
    pub kill_pid: Option<u32>,
    /// Clients, round-robin over the gateways.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = sse_failover::DEFAULT_CLIENTS)]
    pub clients: usize,
    /// Topics; client i on topic i % n.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = sse_failover::DEFAULT_TOPICS)]
    pub topics: usize,
    /// Messages per second, over all topics.
    #[arg(long, value_name = "MSGS_PER_S", value_parser = rate, default_value_t = sse_failover::DEFAULT_RATE)]
    pub rate: f64,
    /// How long the publisher runs.
    #[arg(long, value_name = "TIME", default_value_t = sse_failover::DEFAULT_DURATION.into())]
    pub duration: humantime::Duration,
    /// When the kill (or the cut) comes, from the first publish.
    #[arg(long, value_name = "TIME", default_value_t = sse_failover::DEFAULT_KILL_AT.into())]
    pub kill_at: humantime::Duration,
    /// After the last publish, wait for every client to have everything.
    #[arg(long, value_name = "TIME", default_value_t = sse_failover::DEFAULT_DRAIN.into())]
    pub drain: humantime::Duration,
    /// The reconnection time when the server sent no `retry:` (jittered,
    /// doubled per failed attempt).
    #[arg(long, value_name = "TIME", default_value_t = sse_failover::DEFAULT_RETRY.into())]
    pub retry: humantime::Duration,
    /// Publisher keep-alive connections.
    #[arg(long, value_name = "N", value_parser = number, default_value_t = sse_failover::DEFAULT_CONNECTIONS)]
    pub connections: usize,
    /// Payload bytes (the send-time stamp needs ~40).
    #[arg(long, value_name = "BYTES", value_parser = number, default_value_t = DEFAULT_SIZE)]
    pub size: usize,
    #[command(flatten)]
    pub watch: Watch,
    #[command(flatten)]
    pub out: Out,
}

impl SseFailoverArgs {
    pub fn options(&self) -> sse_failover::Options {
        let mut options = sse_failover::Options::new(self.gateway.clone());
        options.publish_to = self.publish_to.clone();
        options.kill_pid = self.kill_pid;
        options.clients = self.clients;
        options.topics = self.topics;
        options.rate = self.rate;
        options.duration = self.duration.into();
        options.kill_at = self.kill_at.into();
        options.drain = self.drain.into();
        options.retry = self.retry.into();
        options.connections = self.connections;
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cli::Command;
    use crate::cli::tests::{assert_named, parse};

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
}
