//! The scenarios at CI size, against gateways in this process, so that the
//! tool cannot rot: every delivery once, every publish accepted. The
//! full-size runs are `scripts/bench-redis.sh`'s.

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use gateway::config::BrokerKind;
use gateway::{Config, Node};
use loadtest::Target;
use loadtest::report::{self, Outcome};
use loadtest::scenarios::{pods, publish};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// A gateway serving on a loopback port of this process until dropped.
struct Gateway {
    target: Target,
    _stop: oneshot::Sender<()>,
    _node: Arc<Node>,
}

impl Gateway {
    async fn start(config: Config) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let node = Node::start(config).await.expect("node");
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(gateway::serve(node.clone(), listener, async {
            let _ = stopped.await;
        }));
        Self {
            target: Target::at(addr).expect("loopback"),
            _stop: stop,
            _node: node,
        }
    }

    async fn memory() -> Self {
        Self::start(Config::default()).await
    }
}

/// A `redis-server` on a free loopback port, without persistence.
struct Redis {
    url: String,
    child: Child,
}

impl Redis {
    async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (scripts/test.sh installs it)");
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        // Owned from here on: a failure below kills it (Drop).
        let redis = Self {
            url: format!("redis://{addr}"),
            child,
        };
        for _ in 0..500 {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return redis;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("redis-server did not listen on {addr}");
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn small(options: &mut pods::Options) {
    options.clients = 50;
    options.rate = 50.0;
    options.duration = Duration::from_secs(2);
    options.warmup = 5;
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
    assert_eq!(outcome.latency.count, 100 * 50);
    assert_eq!(outcome.last_client.count, 100);
    assert!(outcome.latency.p50_us <= outcome.latency.max_us);

    // The JSON result says the same.
    let path = std::env::temp_dir().join(format!("herald-loadtest-{}.json", std::process::id()));
    report::write_json(&path, &outcome).expect("written");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("JSON");
    let _ = std::fs::remove_file(&path);
    assert_eq!(json["scenario"], "pods");
    assert_eq!(json["passed"], true);
    assert_eq!(json["result"]["lost"], 0);
    assert_eq!(json["result"]["latency"]["count"], 5000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_across_two_redis_pods_delivers_every_message_once() {
    let redis = Redis::start().await;
    let pod = || {
        let mut config = Config {
            broker: BrokerKind::Redis,
            ..Config::default()
        };
        config.redis.url = redis.url.clone();
        Gateway::start(config)
    };
    let (a, b) = (pod().await, pod().await);
    // Half the clients on the publisher's pod, half on the other.
    let mut options = pods::Options::new(a.target.clone());
    options.gateways.push(b.target.clone());
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

#[tokio::test]
async fn targets_off_this_machine_are_refused_before_any_connection() {
    let Err(e) = Target::websocket("ws://93.184.216.34:80/ws") else {
        panic!("refused");
    };
    assert!(e.to_string().contains("not loopback"), "{e}");
}
