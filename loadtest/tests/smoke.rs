//! The scenarios at CI size, against gateways in this process, so that the
//! tool cannot rot: every delivery once, every publish accepted. The
//! full-size runs are `scripts/bench.sh`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a failed expectation is the failure

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gateway::Config;
use gateway::config::BrokerKind;
use loadtest::Target;
use loadtest::clients::Library;
use loadtest::codec::Format;
use loadtest::proxy::{self, Faults, Proxy};
use loadtest::report::{self, Outcome};
use loadtest::scenarios::formats::{self, Kind};
use loadtest::scenarios::{fanout, slow};
use loadtest::scenarios::{hooks, pods, presence, publish, sse_failover, stall, storm};
use loadtest::scenarios::{idle, throughput, wire};
use loadtest::streams::Transport;
use testkit::Redis;
use tokio::net::TcpListener;

/// A gateway of this process (the testkit's, on port 0) as a scenario's
/// target; it stops when dropped.
struct Gateway {
    target: Target,
    _gateway: testkit::Gateway,
}

impl Gateway {
    async fn start(config: Config) -> Self {
        let gateway = testkit::Gateway::with(config).await;
        Self {
            target: Target::at(gateway.addr).expect("loopback"),
            _gateway: gateway,
        }
    }

    async fn memory() -> Self {
        Self::start(Config::default()).await
    }
}

/// A gateway's configuration with the Redis broker at `url`.
fn redis_config(url: &str) -> Config {
    let mut config = Config {
        broker: BrokerKind::Redis,
        ..Config::default()
    };
    config.redis.url = url.to_owned();
    config
}

fn small(options: &mut pods::Options) {
    options.fanout.clients = 50;
    options.rate = 50.0;
    options.duration = Duration::from_secs(2);
    options.fanout.warmup = 5;
}

fn assert_passed<T: Outcome>(outcome: &T) {
    let table = report::table(outcome);
    println!("{table}");
    assert!(outcome.failures().is_empty(), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_one_gateway_delivers_every_message_once() {
    let gateway = Gateway::memory().await;
    let mut options = pods::Options::new(gateway.target.clone());
    small(&mut options);
    let outcome = pods::run(options).await.expect("pods runs");
    assert_passed(&outcome);
    assert_eq!((outcome.lost, outcome.duplicated), (0, 0));
    assert_eq!(outcome.published, 105);
    assert_eq!(outcome.deliveries, 105 * 50);
    // Every measured (message, client) pair has its latency.
    assert_eq!(outcome.stats.latency.count, 100 * 50);
    assert_eq!(outcome.stats.last_client.count, 100);
    assert!(outcome.stats.latency.p50_us <= outcome.stats.latency.max_us);

    // The JSON result says the same.
    let path = std::env::temp_dir().join(format!("herald-loadtest-{}.json", std::process::id()));
    report::write_json(&path, &outcome).expect("written");
    let text = std::fs::read_to_string(&path).expect("read");
    let _ = std::fs::remove_file(&path);
    let json: serde_json::Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(json["scenario"], "pods");
    assert_eq!(json["passed"], true);
    assert_eq!(json["result"]["lost"], 0);
    assert_eq!(json["result"]["latency"]["count"], 5000);
    // `herald-loadtest report` reads it back through the same types.
    let file = loadtest::report::results::File::parse(&text).expect("read back");
    let loadtest::report::results::Figures::Pods(read) = file.figures else {
        panic!("not a pods result: {}", file.scenario);
    };
    assert_eq!(read.lost, 0);
    assert_eq!(read.stats.latency, outcome.stats.latency);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_across_two_redis_pods_delivers_every_message_once() {
    let redis = Redis::start().await;
    let pod = || Gateway::start(redis_config(&redis.url()));
    let (a, b) = (pod().await, pod().await);
    // Half the clients on the publisher's pod, half on the other.
    let mut options = pods::Options::new(a.target.clone());
    options.fanout.gateways.push(b.target.clone());
    small(&mut options);
    let outcome = pods::run(options).await.expect("pods runs");
    assert_passed(&outcome);
    assert_eq!(outcome.deliveries, 105 * 50);
    assert_eq!(outcome.by_gateway.len(), 2);
    assert!(outcome.by_gateway.iter().all(|g| g.clients == 25));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publish_measures_accepted_publishes() {
    let gateway = Gateway::memory().await;
    let mut options = publish::Options::new(gateway.target.clone());
    options.concurrency = 4;
    options.topics = 8;
    options.duration = Duration::from_secs(1);
    let outcome = publish::run(options).await.expect("publish runs");
    assert_passed(&outcome);
    assert!(outcome.publishes > 0);
    assert_eq!(outcome.latency.count, outcome.publishes);
}

/// `clients` sessions on 10 topics, 50 messages a second for 3 s, the cut
/// after 1 s.
fn storm_at_ci_size(options: &mut storm::Options, clients: usize) {
    options.clients = clients;
    options.topics = 10;
    options.rate = 50.0;
    options.duration = Duration::from_secs(3);
    options.cut_at = Duration::from_secs(1);
    // A busy machine may take long to bring the clients back; the run ends
    // as soon as everything is in.
    options.drain = Duration::from_secs(30);
}

/// The storm at CI size: 300 sessions on 10 topics, every connection cut at
/// once while the publisher runs; every session resumes, nothing is lost,
/// nothing is processed twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_every_cut_session_resumes_and_misses_nothing() {
    let gateway = Gateway::memory().await;
    let mut options = storm::Options::new(gateway.target.clone());
    storm_at_ci_size(&mut options, 300);
    let outcome = storm::run(options).await.expect("storm runs");
    assert_passed(&outcome);
    assert_eq!(outcome.published, 150);
    assert_eq!((outcome.cut_clients, outcome.resumed), (300, 300));
    assert_eq!(outcome.failed_clients, 0);
    assert!(outcome.all_resumed_s.is_some());
    assert_eq!((outcome.lost, outcome.app_duplicates), (0, 0));
    assert_eq!(outcome.processed, 150 * 30);
    assert_eq!(outcome.resume_time.count, 300);
}

/// Turns [`child_gateway_process`] into a gateway: the Redis URL it uses.
const CHILD_GATEWAY_REDIS: &str = "HERALD_LOADTEST_CHILD_GATEWAY_REDIS";

/// Not a test of its own: started as a child process of this test binary by
/// [`ChildGateway`], it serves a Redis-backed gateway on a loopback port,
/// prints `listening <addr>`, and runs until it is killed (or its parent's
/// end of stdin closes). Without [`CHILD_GATEWAY_REDIS`] it does nothing.
#[test]
fn child_gateway_process() {
    let Ok(url) = std::env::var(CHILD_GATEWAY_REDIS) else {
        return;
    };
    // An orphan must not outlive its test: stdin closes when the parent goes.
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        println!("listening {}", listener.local_addr().expect("addr"));
        gateway::run(redis_config(&url), listener, std::future::pending())
            .await
            .expect("gateway");
    });
}

/// A gateway in a process of its own (this test binary, running
/// [`child_gateway_process`]), so that a scenario can SIGKILL it.
struct ChildGateway {
    target: Target,
    child: Child,
}

impl ChildGateway {
    async fn start(redis: &Redis) -> Self {
        let mut child = Command::new(std::env::current_exe().expect("this test binary"))
            .args(["child_gateway_process", "--exact", "--nocapture"])
            .env(CHILD_GATEWAY_REDIS, redis.url())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("a child gateway");
        let stdout = child.stdout.take().expect("its stdout");
        // Owned from here on: a failure below kills it (Drop).
        let mut gateway = Self {
            target: Target::websocket("ws://127.0.0.1:1").expect("placeholder"),
            child,
        };
        let reading = tokio::task::spawn_blocking(move || {
            use std::io::BufRead;
            std::io::BufReader::new(stdout)
                .lines()
                .map_while(Result::ok)
                .find_map(|l| l.strip_prefix("listening ").map(str::to_owned))
        });
        let addr = tokio::time::timeout(Duration::from_secs(30), reading)
            .await
            .expect("the child gateway listens in time")
            .expect("reader")
            .expect("the child gateway says where it listens");
        gateway.target = Target::at(addr.parse().expect("an address")).expect("loopback");
        gateway
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for ChildGateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The storm with a pod killed: two pods over a real Redis, one of them a
/// real process that gets SIGKILL while the publisher runs. Its clients
/// resume at the other pod; nothing is lost, nothing processed twice (acks
/// younger than the flush interval come again on the wire, by design).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storm_after_a_kill_9_every_session_resumes_at_the_other_pod() {
    let redis = Redis::start().await;
    let doomed = ChildGateway::start(&redis).await;
    let survivor = Gateway::start(redis_config(&redis.url())).await;
    let mut options = storm::Options::new(doomed.target.clone());
    options.gateways.push(survivor.target.clone());
    options.kill_pid = Some(doomed.pid());
    storm_at_ci_size(&mut options, 200);
    let outcome = storm::run(options).await.expect("storm runs");
    assert_passed(&outcome);
    assert!(outcome.cut.starts_with("kill -9"), "{}", outcome.cut);
    assert_eq!(outcome.publish_to, survivor.target.http_url());
    assert_eq!((outcome.cut_clients, outcome.resumed), (100, 100));
    assert_eq!(outcome.clients_by_gateway, vec![0, 200]);
    assert_eq!((outcome.lost, outcome.app_duplicates), (0, 0));
    assert_eq!(outcome.processed, 150 * 20);
}

/// `sse-failover` with a pod killed: two pods over a real Redis, one a
/// real process that gets SIGKILL while the publisher runs. Its SSE
/// clients come back at the other pod with `Last-Event-ID`: every message
/// once, no reset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_failover_after_a_kill_9_every_stream_comes_back_missing_nothing() {
    let redis = Redis::start().await;
    let doomed = ChildGateway::start(&redis).await;
    let survivor = Gateway::start(redis_config(&redis.url())).await;
    let mut options =
        sse_failover::Options::new(vec![doomed.target.clone(), survivor.target.clone()]);
    options.kill_pid = Some(doomed.pid());
    options.clients = 200;
    options.rate = 50.0;
    options.duration = Duration::from_secs(3);
    options.kill_at = Duration::from_secs(1);
    options.retry = Duration::from_millis(200);
    let outcome = sse_failover::run(options).await.expect("sse-failover runs");
    assert_passed(&outcome);
    assert!(outcome.cut.starts_with("kill -9"), "{}", outcome.cut);
    assert_eq!(outcome.publish_to, survivor.target.http_url());
    assert_eq!((outcome.cut_clients, outcome.reconnected), (100, 100));
    assert_eq!(
        (outcome.lost, outcome.duplicated, outcome.resets),
        (0, 0, 0)
    );
    assert_eq!(outcome.received, 150 * 20);
}

/// `sse-failover` without a kill, on one pod: the tool drops every stream
/// and each comes back by its last event id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_failover_every_dropped_stream_resumes_by_its_last_event_id() {
    let gateway = Gateway::memory().await;
    let mut options = sse_failover::Options::new(vec![gateway.target.clone()]);
    options.clients = 100;
    options.topics = 5;
    options.duration = Duration::from_secs(2);
    options.kill_at = Duration::from_millis(700);
    options.retry = Duration::from_millis(100);
    let outcome = sse_failover::run(options).await.expect("sse-failover runs");
    assert_passed(&outcome);
    assert_eq!(outcome.cut, "cut");
    assert_eq!((outcome.cut_clients, outcome.reconnected), (100, 100));
    assert_eq!(outcome.received, 100 * 20);
}

/// `stall` at CI size: a pod over a real Redis behind the tool's proxy,
/// 40 watched topics, 20 ms of Redis delay set through the proxy's control
/// port. Short phases; the pod catches up within the drain, so every canary
/// message arrives once and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_measures_the_canary_through_each_phase() {
    let redis = Redis::start().await;
    let redis_addr = std::net::SocketAddr::from(([127, 0, 0, 1], redis.port));
    let any = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let path = Proxy::start(any, redis_addr, Faults::default()).expect("a proxy");
    let control = TcpListener::bind(any).await.expect("a control port");
    let gateway = Gateway::start(redis_config(&format!("redis://{}", path.addr()))).await;
    let mut options = stall::Options::new(gateway.target.clone(), redis_addr);
    options.proxy_control = Some(control.local_addr().expect("its address"));
    options.redis_delay = Duration::from_millis(20);
    options.connections = 4;
    options.topics_per_connection = 10;
    options.burst_topics = 5;
    options.canary_interval = Duration::from_millis(20);
    options.steady = Duration::from_secs(1);
    options.phase = Duration::from_secs(2);
    options.drain = Duration::from_secs(10);
    options.publishers = 8;
    let outcome = tokio::select! {
        outcome = stall::run(options) => outcome.expect("stall runs"),
        served = proxy::control(control, &path) => panic!("the control port ended: {served:?}"),
    };
    assert_passed(&outcome);
    let names: Vec<&str> = outcome.phases.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["steady", "burst", "resync"]);
    assert_eq!(outcome.pubsub_killed, 1);
    assert_eq!(outcome.topics, 40);
    assert!(
        outcome.burst_confirmed_s.is_some(),
        "the burst was confirmed"
    );
    assert!(
        outcome
            .phases
            .iter()
            .all(|p| p.sent > 0 && p.delivered == p.sent)
    );
    assert_eq!(path.faults().delay, Duration::ZERO, "the delay is set back");
}

/// `idle` at CI size: 300 connections held for 3 s while the gateway pings
/// every second; every ping answered, none closed. The gateway runs in this
/// process, so its "RSS" is the test's own: reported, not judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_holds_every_connection_through_heartbeats() {
    let mut config = Config::default();
    config.websocket.ping_interval = Duration::from_secs(1);
    let gateway = Gateway::start(config).await;
    let mut options = idle::Options::new(gateway.target.clone());
    options.gateway_pids = vec![std::process::id()];
    options.clients = 300;
    options.duration = Duration::from_secs(3);
    let outcome = idle::run(options).await.expect("idle runs");
    assert_passed(&outcome);
    assert_eq!(outcome.processes, 1);
    assert_eq!(outcome.unexpected_closes, 0);
    assert_eq!(outcome.pods[0].connections, 300);
    assert!(outcome.pings_answered > 0, "heartbeats ran");
    assert!(outcome.rss_per_connection_bytes.is_some());
}

/// `idle --compression` measures connections that negotiated
/// permessage-deflate, or fails: a gateway with compression off declines the
/// offer, and the run says so rather than measure without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_with_compression_holds_only_compressed_connections() {
    for enabled in [true, false] {
        let mut config = Config::default();
        config.websocket.compression.enabled = enabled;
        let gateway = Gateway::start(config).await;
        let mut options = idle::Options::new(gateway.target.clone());
        options.clients = 20;
        options.duration = Duration::from_secs(1);
        options.compression = true;
        let outcome = idle::run(options).await;
        if enabled {
            assert_passed(&outcome.expect("idle runs"));
        } else {
            let e = outcome.expect_err("not negotiated").to_string();
            assert!(e.contains("not negotiated"), "{e}");
        }
    }
}

/// `idle` split over two worker processes (the real `herald-loadtest`
/// binary) and two gateways: each pod holds its half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_over_worker_processes_shares_the_pods() {
    let (a, b) = (Gateway::memory().await, Gateway::memory().await);
    let mut options = idle::Options::new(a.target.clone());
    options.gateways.push(b.target.clone());
    options.clients = 200;
    options.processes = 2;
    options.duration = Duration::from_secs(1);
    options.worker_program = Some(env!("CARGO_BIN_EXE_herald-loadtest").into());
    let outcome = idle::run(options).await.expect("idle runs");
    assert_passed(&outcome);
    assert_eq!(outcome.processes, 2);
    let per_pod: Vec<u64> = outcome.pods.iter().map(|p| p.connections).collect();
    assert_eq!(per_pod, vec![100, 100]);
}

/// A gateway that refuses connections fails the run with its answer, in
/// this process or in a worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_says_when_the_gateway_is_full() {
    let mut config = Config::default();
    config.websocket.max_connections = 10;
    let gateway = Gateway::start(config).await;
    for processes in [1, 2] {
        let mut options = idle::Options::new(gateway.target.clone());
        options.clients = 30;
        options.processes = processes;
        options.duration = Duration::from_secs(1);
        options.worker_program = Some(env!("CARGO_BIN_EXE_herald-loadtest").into());
        let e = idle::run(options).await.expect_err("refused").to_string();
        assert!(e.contains("MAX_CONNECTIONS"), "{processes}: {e}");
    }
}

/// `throughput` at CI size: every publish reaches each of its topic's
/// subscribers exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_delivers_every_publish_to_every_subscriber() {
    let gateway = Gateway::memory().await;
    let mut options = throughput::Options::new(gateway.target.clone());
    options.gateway_pid = Some(std::process::id());
    options.clients = 20;
    options.topics = 20;
    options.subscriptions = 5;
    options.concurrency = 2;
    options.duration = Duration::from_secs(2);
    options.drain = Duration::from_secs(20);
    let outcome = throughput::run(options).await.expect("throughput runs");
    assert_passed(&outcome);
    assert!(outcome.publishes > 0);
    assert_eq!(outcome.fanout, 5.0);
    assert_eq!(outcome.deliveries_expected, outcome.publishes * 5);
    assert_eq!(outcome.deliveries, outcome.deliveries_expected);
    assert!(outcome.deliveries_per_gateway_cpu_s.is_some());
}

/// `throughput` over SSE clients: the same counting, every publish to
/// every subscriber once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_over_sse_delivers_every_publish_to_every_subscriber() {
    let gateway = Gateway::memory().await;
    let mut options = throughput::Options::new(gateway.target.clone());
    options.transport = Transport::Sse;
    options.gateway_pid = Some(std::process::id());
    options.clients = 20;
    options.topics = 20;
    options.subscriptions = 5;
    options.concurrency = 2;
    options.duration = Duration::from_secs(2);
    options.drain = Duration::from_secs(20);
    let outcome = throughput::run(options).await.expect("throughput runs");
    assert_passed(&outcome);
    assert_eq!(outcome.transport, Transport::Sse);
    assert!(outcome.publishes > 0);
    assert_eq!(outcome.deliveries, outcome.publishes * 5);
}

/// `idle` over SSE streams: every stream held through its heartbeats
/// (comments, read and counted), none closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_holds_every_sse_stream_through_heartbeats() {
    let mut config = Config::default();
    config.websocket.ping_interval = Duration::from_secs(1);
    let gateway = Gateway::start(config).await;
    let mut options = idle::Options::new(gateway.target.clone());
    options.transport = Transport::Sse;
    options.gateway_pids = vec![std::process::id()];
    options.clients = 200;
    options.duration = Duration::from_secs(3);
    let outcome = idle::run(options).await.expect("idle runs");
    assert_passed(&outcome);
    assert_eq!(outcome.pods[0].connections, 200);
    assert!(
        outcome.pings_answered >= 200,
        "heartbeats read: {}",
        outcome.pings_answered
    );
}

/// `throughput --compression`: the clients negotiate permessage-deflate,
/// inflate every compressed `msg`, and count fewer bytes on the wire per
/// delivery than without (1 KiB JSON strings deflate well).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throughput_with_compression_inflates_every_delivery() {
    let gateway = Gateway::memory().await;
    let mut wire = Vec::new();
    for compression in [false, true] {
        let mut options = throughput::Options::new(gateway.target.clone());
        options.clients = 10;
        options.topics = 5;
        options.subscriptions = 2;
        options.concurrency = 2;
        options.size = 1024;
        options.duration = Duration::from_secs(1);
        options.drain = Duration::from_secs(20);
        options.compression = compression;
        let outcome = throughput::run(options).await.expect("throughput runs");
        assert_passed(&outcome);
        assert!(outcome.deliveries > 0);
        assert_eq!(outcome.deliveries, outcome.deliveries_expected);
        assert_eq!(outcome.compressed_clients, if compression { 10 } else { 0 });
        wire.push(outcome.wire_bytes_per_delivery);
    }
    assert!(wire[1] < wire[0] / 4.0, "wire bytes per delivery: {wire:?}");
}

/// `fanout --raw` and `--compression` at CI size: the load tool's own
/// clients get every round, those offering permessage-deflate inflate each
/// and read fewer bytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_with_compression_inflates_every_round() {
    let gateway = Gateway::memory().await;
    let mut wire = Vec::new();
    for library in [Library::Raw, Library::Deflate] {
        let mut options = fanout::Options::new(gateway.target.clone());
        options.clients = 50;
        options.rounds = 4;
        options.warmup = 1;
        options.interval = Duration::from_millis(100);
        options.size = 1024;
        options.library = library;
        let outcome = fanout::run(options).await.expect("fanout runs");
        assert_passed(&outcome);
        assert_eq!(outcome.deliveries, 5 * 50);
        let compressed = if library == Library::Deflate { 50 } else { 0 };
        assert_eq!(outcome.compressed_clients, compressed);
        wire.push(outcome.wire_bytes_per_delivery.expect("counted"));
    }
    assert!(wire[0] > 1024.0, "{wire:?}");
    assert!(wire[1] < wire[0] / 4.0, "wire bytes per delivery: {wire:?}");
}

/// `formats` at CI size, in the formats without deltas: every payload of
/// both series reaches every client and is checked; deflate takes bytes
/// off, most off the state payload; protobuf's envelope is smaller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formats_checks_every_payload_in_json_and_protobuf_with_and_without_deflate() {
    let gateway = Gateway::memory().await;
    let mut options = formats::Options::new(gateway.target.clone());
    options.clients = 20;
    options.updates = 30;
    options.interval = Duration::from_millis(2);
    options.formats = ["json", "json+deflate", "protobuf", "protobuf+deflate"]
        .map(|f| f.parse().expect("a format"))
        .to_vec();
    // The gateway runs in this process: its CPU is the test's own.
    options.gateway_pid = Some(std::process::id());
    let outcome = formats::run(options).await.expect("formats runs");
    assert_passed(&outcome);
    assert_eq!(outcome.phases.len(), 8);
    for p in &outcome.phases {
        assert_eq!((p.publishes, p.deliveries), (30, 30 * 20), "{p:?}");
        assert_eq!(p.delta_deliveries, 0);
        assert!(p.gateway_ns_per_delivery.is_some(), "{p:?}");
        let compressed = if p.format.deflate { 20 } else { 0 };
        assert_eq!(p.compressed_clients, compressed);
    }
    let bytes = |kind, format: &str| {
        let phase = outcome
            .phase(kind, format.parse::<Format>().expect("f"))
            .expect("run");
        phase.wire_bytes_per_delivery / phase.payload_bytes
    };
    // JSON: the payload, its envelope and the frame's header.
    assert!((1.0..1.5).contains(&bytes(Kind::Chat, "json")));
    assert!((1.0..1.1).contains(&bytes(Kind::State, "json")));
    assert!(bytes(Kind::State, "json+deflate") < 0.5);
    assert!(bytes(Kind::Chat, "json+deflate") < bytes(Kind::Chat, "json"));
    assert!(bytes(Kind::Chat, "protobuf") < bytes(Kind::Chat, "json"));
    assert!(bytes(Kind::State, "protobuf+deflate") < 0.5);
}

/// `formats` with deltas at CI size, the default namespace's `delta` on:
/// after the first full message every update comes as a delta (JSON and
/// protobuf, with and without deflate), each applied and checked against the
/// payload published; the state payload's deltas are a small share of JSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formats_applies_and_checks_every_delta() {
    let mut config = Config::default();
    config
        .namespaces
        .entry("default".to_owned())
        .or_default()
        .delta = true;
    let gateway = Gateway::start(config).await;
    let mut options = formats::Options::new(gateway.target.clone());
    options.clients = 20;
    options.updates = 30;
    options.interval = Duration::from_millis(2);
    options.formats = Format::ALL.into_iter().filter(|f| f.delta).collect();
    let outcome = formats::run(options).await.expect("formats runs");
    assert_passed(&outcome);
    assert_eq!(outcome.phases.len(), 8);
    for p in &outcome.phases {
        assert_eq!((p.deliveries, p.delta_clients), (30 * 20, 20), "{p:?}");
        if p.payload == Kind::State {
            // The first of each client's messages is full, then deltas.
            assert_eq!(p.delta_deliveries, 29 * 20, "{p:?}");
            let share = p.wire_bytes_per_delivery / p.payload_bytes;
            assert!(share < 0.15, "{} {}: {share:.3}", p.payload, p.format);
        }
    }
}

/// `wire` counts every byte: header, envelope and payload of Herald's frame
/// and of the POST, up to 1 MiB on a gateway started with larger limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wire_counts_frame_and_post_bytes() {
    let mut config = Config::default();
    config.http.max_body_bytes = 2 * 1024 * 1024;
    config.queue.bytes = 4 * 1024 * 1024;
    let gateway = Gateway::start(config).await;
    let options = wire::Options::new(gateway.target.clone());
    let outcome = wire::run(options).await.expect("wire runs");
    assert_passed(&outcome);
    let topic = outcome.topic.len();
    assert_eq!(topic, 8);
    for (m, header) in outcome.sizes.iter().zip([2, 4, 4, 4, 10, 10]) {
        let size = m.payload_bytes;
        // {"op":"msg","topic":"…","seq":N,"data":…} with a one-digit seq.
        let envelope = r#"{"op":"msg","topic":"","seq":1,"data":}"#.len() + topic;
        assert_eq!(m.envelope_bytes, Some(envelope), "{size}");
        assert_eq!(m.header_bytes, Some(header), "{size}");
        assert_eq!(m.herald_bytes, Some(header + envelope + size), "{size}");
        let post = format!(
            "POST / HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {size}\r\n\r\n",
            "127.0.0.1:PORT"
        );
        // The listener's port has 1 to 5 digits; the rest is exact.
        let m_post = m.http_post_bytes.expect("POST counted");
        let base = post.len() - "PORT".len() + size;
        assert!((base + 1..=base + 5).contains(&m_post), "{size}: {m_post}");
    }

    // On a gateway with the default limits, 1 MiB fails with advice.
    let gateway = Gateway::memory().await;
    let mut options = wire::Options::new(gateway.target.clone());
    options.sizes = vec![10, 1_048_576];
    let outcome = wire::run(options).await.expect("wire runs");
    assert_eq!(outcome.sizes[0].error, None);
    let failures = outcome.failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(
        failures[0].contains("HERALD_HTTP__MAX_BODY_BYTES"),
        "{failures:?}"
    );
}

/// `fanout --floor` at CI size: 300 clients on 3 topics, 6 rounds 100 ms
/// apart; every client gets every round once, through the gateway and
/// through the floor (its readers in a second `herald-loadtest` process).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fanout_and_its_floor_deliver_every_round_to_every_client_once() {
    let gateway = Gateway::memory().await;
    let mut options = fanout::Options::new(gateway.target.clone());
    options.clients = 300;
    options.topics = 3;
    options.rounds = 5;
    options.warmup = 1;
    options.interval = Duration::from_millis(100);
    options.size = 1024;
    // The gateway runs in this process: its CPU and RSS are the test's own.
    options.watch = vec![std::process::id()];
    options.floor = Some(env!("CARGO_BIN_EXE_herald-loadtest").into());
    let outcome = fanout::run(options).await.expect("fanout runs");
    assert_passed(&outcome);
    assert_eq!(outcome.published, 6 * 3);
    assert_eq!(outcome.deliveries, 6 * 300);
    assert_eq!((outcome.lost, outcome.duplicated), (0, 0));
    assert_eq!(outcome.stats.latency.count, 5 * 300);
    assert_eq!(outcome.stats.last_client.count, 5);
    assert_eq!(outcome.per_round.len(), 6);
    assert!(
        outcome
            .per_round
            .iter()
            .all(|r| r.clients == 300 && r.missing == 0)
    );
    let process = &outcome.processes[0];
    assert!(
        process.cpu_per_round_s.is_some_and(|s| s > 0.0),
        "{process:?}"
    );
    assert_eq!(process.rss_bytes.len(), 7);

    let floor = outcome.floor.as_ref().expect("the floor ran");
    assert_eq!((floor.deliveries, floor.lost), (6 * 300, 0));
    assert_eq!(floor.stats.last_client.count, 5);
    assert_eq!(floor.per_round.len(), 6);
    assert!(floor.writer_cpu_per_round_s > 0.0);
    let vs = outcome.vs_floor.expect("compared");
    assert!(vs.last_client_p50_x > 0.0);
}

/// `slow` at CI size: one client that never reads joins 5 healthy ones.
/// The kernel takes some MB for a loopback socket that is not read (up to
/// `tcp_wmem`'s maximum), so the frames are large, there are enough of them
/// to fill that and the queue, and the gateway's queue and write timeout are
/// small: the gateway must close the slow client, and the healthy ones miss
/// nothing. Paced gently (3 MB/s per client) so that on a busy machine the
/// healthy clients of this debug build keep up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_client_is_closed_and_the_others_get_every_round() {
    const SIZE: usize = 60 * 1024;
    const QUEUE_BYTES: usize = 256 * 1024;
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|w| w.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(4 << 20);
    let rounds = (wmem_max + QUEUE_BYTES) / SIZE + 10;
    let mut config = Config::default();
    config.queue.bytes = QUEUE_BYTES;
    config.websocket.write_timeout = Duration::from_secs(2);
    // Where history is kept, a lagging client is caught up from it by
    // default (the next test); without, the queue's overflow rule closes it.
    let namespace = config.namespaces.entry("default".to_owned()).or_default();
    namespace.history_size = 0;
    let gateway = Gateway::start(config).await;
    let mut fanout = fanout::Options::new(gateway.target.clone());
    fanout.clients = 5;
    fanout.rounds = rounds;
    fanout.warmup = 1;
    fanout.interval = Duration::from_millis(50);
    fanout.size = SIZE;
    fanout.watch = vec![std::process::id()];
    let mut options = slow::Options::new(fanout);
    options.close_wait = Duration::from_secs(15);
    let outcome = slow::run(options).await.expect("slow runs");
    assert_passed(&outcome);
    assert_eq!(outcome.run.deliveries, (1 + 2 * rounds as u64) * 5);
    assert_eq!(outcome.without.last_client.count, rounds as u64);
    assert_eq!(outcome.with.last_client.count, rounds as u64);
    let client = &outcome.slow_clients[0];
    assert!(client.closed, "{client:?}");
    assert!(
        client
            .reason
            .as_deref()
            .is_some_and(|r| slow::SLOW_REASONS.contains(&r)),
        "{client:?} {:?}",
        outcome.closes
    );
    assert!(client.closed_after_s.is_some() && client.blocked_for_s.is_some());
    assert!(client.rounds_received < client.rounds_sent, "{client:?}");
    assert!(outcome.rss[0].from_bytes.is_some());
}

/// `slow --catch-up` at CI size (issue #25): the same slow client, in a
/// namespace that catches lagging clients up from history (the default
/// where history is kept), reads again after the slow phase: it is not
/// disconnected, gets every round once, and is back live for the last ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_that_reads_again_is_caught_up_and_back_live() {
    const SIZE: usize = 60 * 1024;
    const QUEUE_BYTES: usize = 256 * 1024;
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem")
        .ok()
        .and_then(|w| w.split_whitespace().nth(2)?.parse().ok())
        .unwrap_or(4 << 20);
    let rounds = (wmem_max + QUEUE_BYTES) / SIZE + 10;
    let mut config = Config::default();
    config.queue.bytes = QUEUE_BYTES;
    config.websocket.write_timeout = Duration::from_secs(60);
    let namespace = config.namespaces.entry("default".to_owned()).or_default();
    namespace.history_size = 4 * rounds;
    let gateway = Gateway::start(config).await;
    let mut fanout = fanout::Options::new(gateway.target.clone());
    fanout.clients = 5;
    fanout.rounds = rounds;
    fanout.warmup = 1;
    fanout.interval = Duration::from_millis(50);
    fanout.size = SIZE;
    fanout.watch = vec![std::process::id()];
    let mut options = slow::Options::new(fanout);
    options.catch_up = Some(5);
    options.catch_up_wait = Duration::from_secs(60);
    let outcome = slow::run(options).await.expect("slow runs");
    assert_passed(&outcome);
    let caught = outcome.catch_up.as_ref().expect("catch-up figures");
    assert_eq!(
        (
            caught.disconnected,
            caught.lost,
            caught.duplicated,
            caught.back_live
        ),
        (0, 0, 0, 1),
        "{caught:?}"
    );
    let lags = caught.lag_metrics["herald_lag_events_total{policy=\"catch_up\"}"];
    assert!(lags >= 1, "the slow client lagged: {caught:?}");
    assert!(caught.caught_up_s.is_some() && caught.rss[0].after_bytes.is_some());
}

/// The `herald` binary beside this test's (`target/<profile>/herald`):
/// `presence` runs pods as processes, to drain, restart and kill them.
fn herald_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("this test binary");
    // target/<profile>/deps/smoke-<hash>
    let profile = exe.parent().and_then(Path::parent).expect("the target dir");
    let herald = profile.join("herald");
    assert!(
        herald.exists(),
        "{} is missing: `cargo build -p gateway --bin herald` first",
        herald.display()
    );
    herald
}

/// `presence` at CI size: 150 members on 3 pods over a real Redis, each
/// with a token and an `info` claim; every phase, short. Every member joins
/// and is counted, the pages list them all once, every drained member
/// resumes its session elsewhere (no fresh session), and a killed pod's
/// members are gone from presence with their leaves sent to everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presence_counts_a_room_through_a_rolling_restart_and_a_kill() {
    let mut options = presence::Options::new(herald_binary());
    options.pods = 3;
    options.members = 150;
    options.churn = 15;
    options.rate = 10.0;
    options.flow = Duration::from_secs(3);
    options.quiet = Duration::from_secs(2);
    options.queries = 20;
    options.page_size = 40;
    options.settle = Duration::from_secs(60);
    options.kill_wait = Duration::from_secs(40);
    // Drained members come back within this (their `reconnect` advice):
    // a short rolling restart.
    options.env = vec![("HERALD_SHUTDOWN__DRAIN_TIMEOUT".to_owned(), "2s".to_owned())];
    let outcome = presence::run(options).await.expect("presence runs");
    assert_passed(&outcome);
    assert_eq!(outcome.join.members_by_pod, vec![50, 50, 50]);
    assert!(outcome.flow.messages > 0, "messages flowed");
    let quiet = outcome.quiet.as_ref().expect("the quiet window");
    assert!(
        quiet.memory.room_bytes > 0,
        "the room's presence is in Redis"
    );
    let queries = outcome.queries.as_ref().expect("the queries");
    assert_eq!((queries.page_members, queries.users), (40, 150));
    assert_eq!((queries.walked_members, queries.walked_pages), (150, 4));
    let restart = outcome.restart.as_ref().expect("the rolling restart");
    assert!(restart.all_back && restart.resumed >= 150, "{restart:?}");
    let kill = outcome.kill.as_ref().expect("the kill");
    assert!(
        kill.members > 0 && kill.gone_s.is_some() && kill.leaves_s.is_some(),
        "{kill:?}"
    );

    // `herald-loadtest report` reads the result back through its type.
    let path = std::env::temp_dir().join(format!("herald-presence-{}.json", std::process::id()));
    report::write_json(&path, &outcome).expect("written");
    let text = std::fs::read_to_string(&path).expect("read");
    let _ = std::fs::remove_file(&path);
    let file = loadtest::report::results::File::parse(&text).expect("read back");
    assert_eq!(file.scenario, "presence");
}

/// `hooks` at CI size against pods of the `herald` binary it runs and a
/// backend of its own: every handshake through the connect proxy (each one
/// a call the backend answered) and with a token gets its `welcome`, every
/// `pub` through the publish proxy and without it its `ok`, each proxied
/// one timed by the backend too, and every webhook event the clients caused
/// arrives, of each type as many as caused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_measures_proxied_handshakes_publishes_and_webhooks() {
    let mut options = hooks::Options::new(herald_binary());
    options.handshakes = 100;
    options.concurrency = 8;
    options.publish_clients = 10;
    options.publish_rate = 100.0;
    options.publish_duration = Duration::from_secs(2);
    options.webhook_clients = 10;
    options.webhook_publishes = 20;
    let outcome = hooks::run(options).await.expect("hooks runs");
    assert_passed(&outcome);
    for auth in ["proxy", "token"] {
        let batch = outcome.batch(auth).expect(auth);
        assert_eq!((batch.handshakes, batch.failed), (100, 0), "{auth}");
        assert!(batch.per_s > 0.0 && batch.latency.count == 100, "{auth}");
    }
    let proxy = outcome.batch("proxy").expect("proxy");
    assert_eq!(proxy.backend.count, 100, "the backend answered each");
    assert_eq!(proxy.backend_cookies, 100, "named by the forwarded cookie");
    assert!(proxy.backend.p50_us >= 1000, "after its 1 ms delay");
    let publish = outcome.publish.as_ref().expect("the publishes");
    assert!(publish.plain.count > 0 && publish.proxied.count > 0);
    assert_eq!(publish.proxied_net.count, publish.proxied.count);
    assert_eq!(publish.unmatched, 0);
    let webhooks = outcome.webhooks.as_ref().expect("the webhooks");
    assert_eq!(webhooks.expected, 10 * (20 + 4));
    assert_eq!(webhooks.distinct, webhooks.expected);
    assert_eq!(webhooks.by_type, webhooks.expected_by_type);
    assert!(webhooks.batches > 0 && webhooks.batch_max >= 1);

    // `herald-loadtest report` reads the result back through its type.
    let path = std::env::temp_dir().join(format!("herald-hooks-{}.json", std::process::id()));
    report::write_json(&path, &outcome).expect("written");
    let text = std::fs::read_to_string(&path).expect("read");
    let _ = std::fs::remove_file(&path);
    let file = loadtest::report::results::File::parse(&text).expect("read back");
    assert_eq!(file.scenario, "hooks");
}

#[tokio::test]
async fn targets_off_this_machine_are_refused_before_any_connection() {
    let Err(e) = Target::websocket("ws://93.184.216.34:80/ws") else {
        panic!("refused");
    };
    assert!(e.to_string().contains("not loopback"), "{e}");
}
